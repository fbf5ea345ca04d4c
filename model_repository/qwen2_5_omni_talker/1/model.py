"""Triton binding: Qwen2.5-Omni talker (decoupled): codec ids.
Adapter: omni_triton.adapters.qwen2_5_omni.Qwen25OmniTalkerStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen2_5_omni import Qwen25OmniTalkerStage as TritonPythonModel  # noqa: E402,F401
