"""VAE decode stage: denoised latents -> uint8 RGB frames."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omni_triton.stages.diffusion_pipeline import denormalize_latents


def vae_decode(pipe, latents: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Latents ``float32 [z, f, h, w]`` -> ``uint8 [F, H, W, 3]`` frames (``F = 4 (f - 1) + 1``,
    ``H = 8 h``, ``W = 8 w``).

    The tail of ``WanPipeline.__call__`` after the loop: ``x / (1 / latents_std) + latents_mean``,
    ``vae.decode``, ``video_processor.postprocess_video(output_type="np")``, then
    ``round(x * 255)``. Each video is decoded alone (the Wan VAE decodes frame by frame with a
    causal cache; a batch would only change float rounding, not speed on CPU).
    """
    vae = pipe.vae
    out = []
    with torch.no_grad():
        for lat in latents:
            x = torch.from_numpy(np.ascontiguousarray(lat, dtype=np.float32))[None].to(vae.dtype)
            x = denormalize_latents(vae, x)
            video = vae.decode(x, return_dict=False)[0]
            frames = pipe.video_processor.postprocess_video(video, output_type="np")[0]
            out.append(to_uint8(frames))
    return out


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] -> ``uint8`` (``round(x * 255)``, as ``numpy_to_pil`` does)."""
    return (np.asarray(frames, dtype=np.float32) * 255).round().clip(0, 255).astype(np.uint8)


def vae_encode_condition(pipe, images: Sequence, num_frames: int) -> list[np.ndarray]:
    """Image-to-video condition: each reference image -> the VAE latents of the video
    ``[image, num_frames - 1 black frames]``, ``float32 [z, (num_frames - 1) / 4 + 1, H / 8, W / 8]``.

    What ``WanImageToVideoPipeline.prepare_latents`` encodes (Wan2.2 A14B form,
    ``expand_timesteps=False``, no ``last_image``): ``video_processor.preprocess`` of the image at
    its own size (``H x W``, values in [-1, 1]), the zero frames appended on the time axis,
    ``vae.encode`` and the posterior's mode (``retrieve_latents(..., sample_mode="argmax")``).
    The result is unnormalised: the pipeline's own call normalises it
    (:func:`~omni_triton.stages.wan.denoise`). Each image is encoded alone (the Wan VAE's causal
    cache runs frame chunk by chunk; a batch would only change float rounding).

    Args:
        images: PIL RGB images or ``uint8 [H, W, 3]`` arrays (any size multiple of 8).
        num_frames: frames of the video to generate (``4 k + 1``).
    """
    from diffusers.pipelines.wan.pipeline_wan_i2v import retrieve_latents
    from PIL import Image

    out = []
    with torch.no_grad():
        for image in images:
            if isinstance(image, np.ndarray):
                image = Image.fromarray(image, "RGB")
            w, h = image.size
            pixels = pipe.video_processor.preprocess(image, height=h, width=w).to(torch.float32)[:, :, None]
            video = torch.cat([pixels, pixels.new_zeros(1, pixels.shape[1], num_frames - 1, h, w)], dim=2)
            latents = retrieve_latents(pipe.vae.encode(video.to(pipe.vae.dtype)), sample_mode="argmax")
            out.append(latents[0].float().numpy())
    return out
