"""Triton binding: codec TTS BLS (decoupled): tts_talker -> chunked tts_code2wav, streamed PCM.
Adapter: omni_triton.adapters.speech.TtsPipeline; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.speech import TtsPipeline as TritonPythonModel  # noqa: E402,F401
