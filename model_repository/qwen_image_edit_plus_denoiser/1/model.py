"""Triton adapter: Qwen-Image-Edit-Plus denoiser (condition image latents from the VAE encoder)
(the diffusers pipeline's loop, output_type="latent").
Dynamic batching; compatible requests share one pipeline call, each with its own seed.
Logic in omni_triton.stages.qwen_image.denoise."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen_image import QwenImageDenoiser as TritonPythonModel  # noqa: E402,F401
