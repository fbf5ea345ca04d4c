"""VAE decode stage: denoised latents -> uint8 RGB frames."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def vae_decode(pipe, latents: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Latents ``float32 [z, f, h, w]`` -> ``uint8 [F, H, W, 3]`` frames (``F = 4 (f - 1) + 1``,
    ``H = 8 h``, ``W = 8 w``).

    The tail of ``WanPipeline.__call__`` after the loop: ``x / (1 / latents_std) + latents_mean``,
    ``vae.decode``, ``video_processor.postprocess_video(output_type="np")``, then
    ``round(x * 255)``. Each video is decoded alone (the Wan VAE decodes frame by frame with a
    causal cache; a batch would only change float rounding, not speed on CPU).
    """
    vae = pipe.vae
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1)
    out = []
    with torch.no_grad():
        for lat in latents:
            x = torch.from_numpy(np.ascontiguousarray(lat, dtype=np.float32))[None].to(vae.dtype)
            x = x / inv_std.to(x.dtype) + mean.to(x.dtype)
            video = vae.decode(x, return_dict=False)[0]
            frames = pipe.video_processor.postprocess_video(video, output_type="np")[0]
            out.append(to_uint8(frames))
    return out


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] -> ``uint8`` (``round(x * 255)``, as ``numpy_to_pil`` does)."""
    return (np.asarray(frames, dtype=np.float32) * 255).round().clip(0, 255).astype(np.uint8)
