"""Triton binding: Qwen-Image inpaint VAE encoder, image (+ mask check) -> the image's VAE posterior.
Dynamic batching; logic in omni_triton.stages.qwen_image.image_posteriors.
Adapter: omni_triton.adapters.qwen_image.QwenImageInpaintVaeEncoder; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen_image import QwenImageInpaintVaeEncoder as TritonPythonModel  # noqa: E402,F401
