"""Triton binding: Qwen3-TTS talker (decoupled, Qwen3-TTS env): codec frames as generated, batched across requests.
Adapter: omni_triton.adapters.qwen3_tts.Qwen3TtsTalkerStage; contract: omni_triton.contracts.qwen3_tts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_tts import Qwen3TtsTalkerStage as TritonPythonModel  # noqa: E402,F401
