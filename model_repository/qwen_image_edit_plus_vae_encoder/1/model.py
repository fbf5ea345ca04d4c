"""Triton binding: Qwen-Image-Edit-Plus VAE encoder, condition image -> image latents.
Dynamic batching; logic in omni_triton.stages.qwen_image.vae_encode.
Adapter: omni_triton.adapters.qwen_image.QwenImageVaeEncoder; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen_image import QwenImageVaeEncoder as TritonPythonModel  # noqa: E402,F401
