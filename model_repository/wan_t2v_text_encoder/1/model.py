"""Triton binding: Wan2.2 UMT5 text encoder (dynamic batching).
Adapter: omni_triton.adapters.wan.WanTextEncoder; contract: omni_triton.contracts.wan."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.wan import WanTextEncoder as TritonPythonModel  # noqa: E402,F401
