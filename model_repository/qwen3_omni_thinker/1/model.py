"""Triton binding: Qwen3-Omni thinker (decoupled): text deltas + the talker's inputs.
Adapter: omni_triton.adapters.qwen3_omni.Qwen3OmniThinkerStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_omni import Qwen3OmniThinkerStage as TritonPythonModel  # noqa: E402,F401
