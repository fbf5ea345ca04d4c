"""Triton binding: Wan2.2 image-to-video BLS (decoupled): text encoder + VAE encoder -> streamed denoiser ->
VAE decoder.
Adapter: omni_triton.adapters.wan.WanI2VPipeline; contract: omni_triton.contracts.wan."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.wan import WanI2VPipeline as TritonPythonModel  # noqa: E402,F401
