"""Triton binding: Stable Audio T5 text encoder (dynamic batching).
Adapter: omni_triton.adapters.stable_audio.StableAudioTextEncoder; contract: omni_triton.contracts.stable_audio."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.stable_audio import StableAudioTextEncoder as TritonPythonModel  # noqa: E402,F401
