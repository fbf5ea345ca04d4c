"""Triton adapter: Qwen-Image-Edit-Plus text encoder (Qwen2.5-VL with its vision tower)
-> prompt (+ negative) embeddings.
Dynamic batching; logic in omni_triton.stages.qwen_image.encode_prompts (edit: also the image)."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen_image import QwenImageTextEncoder as TritonPythonModel  # noqa: E402,F401
