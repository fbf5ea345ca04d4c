"""Triton binding: spoken answers BLS (decoupled): llm -> sentences -> piper_tts.
Adapter: omni_triton.adapters.chat.LlmTtsPipeline; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.chat import LlmTtsPipeline as TritonPythonModel  # noqa: E402,F401
