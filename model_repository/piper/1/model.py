"""Triton binding: Piper TTS stage (decoupled): text -> one PCM response per sentence.
Adapter: omni_triton.adapters.speech.PiperStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.speech import PiperStage as TritonPythonModel  # noqa: E402,F401
