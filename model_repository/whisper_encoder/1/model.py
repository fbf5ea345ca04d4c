"""Triton binding: Whisper encoder (dynamic batching): 16 kHz AUDIO -> log-mel -> encoder states.
Adapter: omni_triton.adapters.whisper.WhisperEncoderStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.whisper import WhisperEncoderStage as TritonPythonModel  # noqa: E402,F401
