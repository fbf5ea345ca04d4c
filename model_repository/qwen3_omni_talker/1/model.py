"""Triton binding: Qwen3-Omni talker + code predictor (decoupled): codec frames.
Adapter: omni_triton.adapters.qwen3_omni.Qwen3OmniTalkerStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_omni import Qwen3OmniTalkerStage as TritonPythonModel  # noqa: E402,F401
