"""Triton binding: Wan2.2 image-to-video conditioning: VAE encode of the reference frame (dynamic batching).
Adapter: omni_triton.adapters.wan.WanVaeEncoder; contract: omni_triton.contracts.wan."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.wan import WanVaeEncoder as TritonPythonModel  # noqa: E402,F401
