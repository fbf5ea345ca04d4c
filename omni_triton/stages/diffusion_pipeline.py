"""What both diffusers-based families (``stages/qwen_image``, ``stages/wan``) do the same way to a
pipeline: load it as float32 on the CPU with progress bars off, and undo the VAE latent
normalisation before decoding (the formula of both pipelines' ``__call__``, kept verbatim so the
staged outputs stay bit-identical to them)."""
from __future__ import annotations

from pathlib import Path

import torch


def load_float32_pipeline(path: Path | str, pipeline_class: str | None = None, **kwargs):
    """``DiffusionPipeline.from_pretrained(path, dtype=torch.float32, **kwargs)`` with the
    progress bar disabled. Returns whatever pipeline class ``model_index.json`` names, or
    ``pipeline_class`` (a diffusers class name, e.g. ``QwenImageInpaintPipeline``) loaded from the
    same folder: the way diffusers documents running one checkpoint with another pipeline of its
    family (``QwenImageInpaintPipeline.from_pretrained("Qwen/Qwen-Image")``).

    Raises:
        ValueError: ``pipeline_class`` is not a diffusers pipeline class.
    """
    import diffusers

    cls = diffusers.DiffusionPipeline
    if pipeline_class:
        cls = getattr(diffusers, pipeline_class, None)
        if not (isinstance(cls, type) and issubclass(cls, diffusers.DiffusionPipeline)):
            raise ValueError(f"{pipeline_class!r} is not a diffusers pipeline class")
    pipe = cls.from_pretrained(str(path), dtype=torch.float32, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def denormalize_latents(vae, x: torch.Tensor) -> torch.Tensor:
    """``x / (1 / latents_std) + latents_mean`` per latent channel, as the pipelines do before
    ``vae.decode``.

    Args:
        vae: a diffusers VAE whose config has ``z_dim``, ``latents_mean`` and ``latents_std``
            (``AutoencoderKLQwenImage``, ``AutoencoderKLWan``).
        x: ``[B, z_dim, f, h, w]`` latents in the VAE's dtype.

    Returns:
        a new tensor of ``x``'s shape and dtype.
    """
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1)
    return x / inv_std.to(x.dtype) + mean.to(x.dtype)
