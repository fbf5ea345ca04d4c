"""Triton binding: Qwen3-TTS 12 Hz codec decoder (dynamic batching, Qwen3-TTS env): frames -> 24 kHz PCM.
Adapter: omni_triton.adapters.qwen3_tts.Qwen3TtsCode2WavStage; contract: omni_triton.contracts.qwen3_tts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_tts import Qwen3TtsCode2WavStage as TritonPythonModel  # noqa: E402,F401
