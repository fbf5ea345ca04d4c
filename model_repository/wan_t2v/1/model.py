"""Triton binding: Wan2.2 text-to-video BLS (decoupled): text encoder -> streamed denoiser -> VAE decoder.
Adapter: omni_triton.adapters.wan.WanT2VPipeline; contract: omni_triton.contracts.wan."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.wan import WanT2VPipeline as TritonPythonModel  # noqa: E402,F401
