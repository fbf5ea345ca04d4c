"""Triton binding: Qwen3-Omni code2wav (dynamic batching, ragged CODES).
Adapter: omni_triton.adapters.qwen3_omni.Qwen3OmniCode2WavStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.qwen3_omni import Qwen3OmniCode2WavStage as TritonPythonModel  # noqa: E402,F401
