"""Triton binding: Qwen2.5-Omni BLS (decoupled): thinker -> talker -> token2wav, text and PCM.
Adapter: omni_triton.adapters.qwen2_5_omni.Qwen25OmniPipeline; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen2_5_omni import Qwen25OmniPipeline as TritonPythonModel  # noqa: E402,F401
