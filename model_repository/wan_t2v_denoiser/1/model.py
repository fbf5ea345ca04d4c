"""Triton binding: Wan2.2 denoiser (decoupled + dynamic batching; STEP responses, step-boundary cancel).
Adapter: omni_triton.adapters.wan.WanDenoiser; contract: omni_triton.contracts.wan."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.wan import WanDenoiser as TritonPythonModel  # noqa: E402,F401
