"""Triton binding: Qwen3-TTS clone prompt (Qwen3-TTS env): reference clip -> VOICE_PROMPT bytes.
Adapter: omni_triton.adapters.qwen3_tts.Qwen3TtsVoicePromptStage; contract: omni_triton.contracts.qwen3_tts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_tts import Qwen3TtsVoicePromptStage as TritonPythonModel  # noqa: E402,F401
