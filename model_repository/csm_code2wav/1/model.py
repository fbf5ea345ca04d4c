"""Triton binding: Mimi codec decoder (dynamic batching, ragged CODES with left context).
Adapter: omni_triton.adapters.speech.CsmCode2WavStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.speech import CsmCode2WavStage as TritonPythonModel  # noqa: E402,F401
