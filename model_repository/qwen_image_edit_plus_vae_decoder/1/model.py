"""Triton adapter: Qwen-Image-Edit-Plus VAE decoder, packed latents -> uint8 RGB image.
Dynamic batching; logic in omni_triton.stages.qwen_image.vae_decode."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen_image import QwenImageVaeDecoder as TritonPythonModel  # noqa: E402,F401
