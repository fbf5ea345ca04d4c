"""Triton binding: llm stage (decoupled): vLLM AsyncLLM on its own event-loop thread.
Adapter: omni_triton.adapters.llm.LlmStage; contract: omni_triton.contracts.llm."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.llm import LlmStage as TritonPythonModel  # noqa: E402,F401
