"""Triton binding: Stable Audio denoiser (decoupled + dynamic batching, STEP progress).
Adapter: omni_triton.adapters.stable_audio.StableAudioDenoiser; contract: omni_triton.contracts.stable_audio."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.stable_audio import StableAudioDenoiser as TritonPythonModel  # noqa: E402,F401
