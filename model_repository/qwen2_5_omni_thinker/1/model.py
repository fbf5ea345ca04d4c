"""Triton binding: Qwen2.5-Omni thinker (decoupled): text deltas + the talker's inputs.
Adapter: omni_triton.adapters.qwen2_5_omni.Qwen25OmniThinkerStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen2_5_omni import Qwen25OmniThinkerStage as TritonPythonModel  # noqa: E402,F401
