"""Triton binding: spoken answers BLS (decoupled): llm -> sentences -> piper.
Adapter: omni_triton.adapters.llm.LlmTtsPipeline; contract: omni_triton.contracts.llm."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.llm import LlmTtsPipeline as TritonPythonModel  # noqa: E402,F401
