"""Triton binding: Qwen3-TTS BLS (decoupled): form routing -> qwen3_tts_talker -> chunked qwen3_tts_code2wav,
streamed PCM.
Adapter: omni_triton.adapters.qwen3_tts.Qwen3TtsPipeline; contract: omni_triton.contracts.qwen3_tts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_tts import Qwen3TtsPipeline as TritonPythonModel  # noqa: E402,F401
