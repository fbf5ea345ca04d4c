"""Triton binding: Wan2.2 image-to-video denoiser (decoupled + dynamic batching; STEP responses, step-boundary cancel).
Adapter: omni_triton.adapters.wan.WanI2VDenoiser; contract: omni_triton.contracts.wan."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.wan import WanI2VDenoiser as TritonPythonModel  # noqa: E402,F401
