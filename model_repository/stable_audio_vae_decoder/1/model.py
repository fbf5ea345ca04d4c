"""Triton binding: Stable Audio Oobleck VAE decoder (dynamic batching).
Adapter: omni_triton.adapters.stable_audio.StableAudioVaeDecoder; contract: omni_triton.contracts.stable_audio."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.stable_audio import StableAudioVaeDecoder as TritonPythonModel  # noqa: E402,F401
