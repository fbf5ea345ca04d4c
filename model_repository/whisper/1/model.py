"""Triton binding: Whisper ASR BLS (decoupled): whisper_encoder -> whisper_decoder, streamed text deltas.
Adapter: omni_triton.adapters.whisper.WhisperPipeline; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.whisper import WhisperPipeline as TritonPythonModel  # noqa: E402,F401
