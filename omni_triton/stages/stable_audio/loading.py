"""Loading a Stable Audio pipeline folder and reading its limits from its configs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omni_triton.stages.diffusion_pipeline import load_float32_pipeline


def load_pipeline(path: Path | str):
    """``DiffusionPipeline.from_pretrained`` on a prepared Stable Audio folder (float32, CPU),
    progress bars off. Returns a ``StableAudioPipeline``."""
    return load_float32_pipeline(path)


@dataclass(frozen=True)
class Limits:
    """What one Stable Audio checkpoint can make, from its configs (the checks of
    ``StableAudioPipeline.__call__`` / ``check_inputs``, stated before any work).

    Attributes:
        max_seconds: longest clip, ``transformer.config.sample_size * vae.hop_length /
            vae.config.sampling_rate`` (stable-audio-open-1.0: 47.55 s).
        min_value, max_value: range of ``audio_start_in_s`` / ``audio_end_in_s``
            (``projection_model.config``; stable-audio-open-1.0: [0, 512]).
        sample_rate: Hz of the output (``vae.config.sampling_rate``).
        channels: output channels (``vae.config.audio_channels``).
        max_tokens: the tokenizer's ``model_max_length`` (longer prompts are truncated by diffusers).
    """

    max_seconds: float
    min_value: float
    max_value: float
    sample_rate: int
    channels: int
    max_tokens: int


def limits(pipe) -> Limits:
    """The :class:`Limits` of a loaded ``StableAudioPipeline``."""
    sr = int(pipe.vae.config.sampling_rate)
    return Limits(max_seconds=pipe.transformer.config.sample_size * pipe.vae.hop_length / sr,
                  min_value=float(pipe.projection_model.config.min_value),
                  max_value=float(pipe.projection_model.config.max_value), sample_rate=sr,
                  channels=int(pipe.vae.config.audio_channels), max_tokens=int(pipe.tokenizer.model_max_length))


def check_config_limits(pipe, max_seconds: float, min_value: float, max_value: float) -> None:
    """The served limits (config.pbtxt ``max_seconds``, ``min_seconds``, ``max_seconds_value``)
    must lie within what the checkpoint can do (:func:`limits`).

    Raises:
        ValueError: naming the parameter that promises more than the checkpoint.
    """
    have = limits(pipe)
    if max_seconds > have.max_seconds + 1e-6:
        raise ValueError(f"max_seconds={max_seconds:g}: the checkpoint makes at most {have.max_seconds:g} s "
                         "(transformer sample_size * VAE hop / sampling rate)")
    if min_value < have.min_value or max_value > have.max_value:
        raise ValueError(f"seconds range [{min_value:g}, {max_value:g}]: the checkpoint's projection model takes "
                         f"[{have.min_value:g}, {have.max_value:g}]")
