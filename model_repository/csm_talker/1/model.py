"""Triton binding: CSM talker (decoupled): text -> codec frames as generated.
Adapter: omni_triton.adapters.speech.CsmTalkerStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.speech import CsmTalkerStage as TritonPythonModel  # noqa: E402,F401
