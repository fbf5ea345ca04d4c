"""Triton binding: Qwen2.5-Omni token2wav (DiT + BigVGAN, whole utterance).
Adapter: omni_triton.adapters.qwen2_5_omni.Qwen25OmniToken2WavStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen2_5_omni import Qwen25OmniToken2WavStage as TritonPythonModel  # noqa: E402,F401
