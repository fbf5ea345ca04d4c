"""Triton binding: Stable Audio text-to-audio BLS (decoupled): text encoder -> streamed denoiser -> VAE decoder.
Adapter: omni_triton.adapters.stable_audio.StableAudioPipeline; contract: omni_triton.contracts.stable_audio."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.stable_audio import StableAudioPipeline as TritonPythonModel  # noqa: E402,F401
