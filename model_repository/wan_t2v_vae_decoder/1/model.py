"""Triton binding: Wan2.2 VAE decoder (dynamic batching).
Adapter: omni_triton.adapters.wan.WanVaeDecoder; contract: omni_triton.contracts.wan."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.wan import WanVaeDecoder as TritonPythonModel  # noqa: E402,F401
