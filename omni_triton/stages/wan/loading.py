"""Loading a Wan2.2 pipeline folder."""
from __future__ import annotations

from pathlib import Path

import torch


def load_pipeline(path: Path | str):
    """``DiffusionPipeline.from_pretrained`` on a prepared Wan folder (float32, CPU), progress
    bars off. Returns a ``WanPipeline`` or ``WanImageToVideoPipeline``.

    ``WanTransformer3DModel`` declares ``_keep_in_fp32_modules``, which diffusers 0.42 only
    honours with ``low_cpu_mem_usage`` (it needs ``accelerate``, not installed here). Loading in
    float32 keeps every module in float32 anyway, so the declaration is lifted for the load.
    """
    from diffusers import DiffusionPipeline, WanTransformer3DModel

    keep = WanTransformer3DModel._keep_in_fp32_modules
    WanTransformer3DModel._keep_in_fp32_modules = None
    try:
        pipe = DiffusionPipeline.from_pretrained(str(path), dtype=torch.float32)
    finally:
        WanTransformer3DModel._keep_in_fp32_modules = keep
    pipe.set_progress_bar_config(disable=True)
    return pipe


def size_multiple(pipe) -> int:
    """Height/width must be multiples of this: the VAE's spatial factor (8) times the DiT's
    spatial patch (2) = 16 (the pipeline would silently round other sizes down)."""
    patch = (pipe.transformer or pipe.transformer_2).config.patch_size
    return pipe.vae_scale_factor_spatial * int(patch[1])


def frame_multiple(pipe) -> int:
    """``num_frames - 1`` must be a multiple of this (the VAE's temporal factor, 4)."""
    return int(pipe.vae_scale_factor_temporal)
