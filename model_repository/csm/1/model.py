"""Triton binding: codec TTS BLS (decoupled): csm_talker -> chunked csm_code2wav, streamed PCM.
Adapter: omni_triton.adapters.speech.CsmPipeline; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.speech import CsmPipeline as TritonPythonModel  # noqa: E402,F401
