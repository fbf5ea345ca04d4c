"""Triton binding: Whisper decoder (decoupled, continuous batching): encoder states -> tokens + text deltas.
Adapter: omni_triton.adapters.whisper.WhisperDecoderStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.whisper import WhisperDecoderStage as TritonPythonModel  # noqa: E402,F401
