"""Triton binding: Qwen3-Omni BLS (decoupled): thinker -> talker -> code2wav, text and PCM.
Adapter: omni_triton.adapters.qwen3_omni.Qwen3OmniPipeline; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_omni import Qwen3OmniPipeline as TritonPythonModel  # noqa: E402,F401
