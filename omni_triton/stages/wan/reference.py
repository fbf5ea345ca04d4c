"""The plain diffusers call and the stage split run in-process (what parity tests compare)."""
from __future__ import annotations

import numpy as np
import torch

from omni_triton.stages.wan.denoiser import VideoDenoiseItem, denoise
from omni_triton.stages.wan.text_encoder import encode_prompts
from omni_triton.stages.wan.vae import to_uint8, vae_decode


def reference_frames(pipe, prompt: str, *, height: int, width: int, num_frames: int, steps: int, seed: int,
                     negative_prompt: str = "", guidance_scale: float = 5.0, guidance_scale_2: float | None = None,
                     boundary_ratio: float | None = None, flow_shift: float | None = None) -> np.ndarray:
    """``WanPipeline.__call__`` (``output_type="np"``) as ``uint8 [F, H, W, 3]``; ``boundary_ratio``
    / ``flow_shift`` set on the pipeline config / scheduler as a user of diffusers would."""
    item = VideoDenoiseItem(np.zeros((0, 1), np.float32), height, width, num_frames, steps, seed,
                            boundary_ratio=boundary_ratio, flow_shift=flow_shift)
    from omni_triton.stages.wan.denoiser import _call_config

    with torch.no_grad(), _call_config(pipe, item):
        frames = pipe(prompt=prompt, negative_prompt=negative_prompt, height=height, width=width,
                      num_frames=num_frames, num_inference_steps=steps, guidance_scale=guidance_scale,
                      guidance_scale_2=guidance_scale_2, generator=torch.Generator().manual_seed(seed),
                      output_type="np").frames[0]
    return to_uint8(frames)


def staged_frames(pipe, prompt: str, *, height: int, width: int, num_frames: int, steps: int, seed: int,
                  negative_prompt: str = "", guidance_scale: float = 5.0, guidance_scale_2: float | None = None,
                  boundary_ratio: float | None = None, flow_shift: float | None = None) -> np.ndarray:
    """The Triton stage split in-process for one request: encode -> denoise -> decode."""
    embeds, neg = encode_prompts(pipe, [prompt, negative_prompt])
    item = VideoDenoiseItem(embeds, height, width, num_frames, steps, seed, neg, guidance_scale,
                            guidance_scale_2, boundary_ratio, flow_shift)
    return vae_decode(pipe, [denoise(pipe, [item])[0].latents])[0]


def reference_i2v_frames(pipe, image, prompt: str, *, height: int, width: int, num_frames: int, steps: int,
                         seed: int, negative_prompt: str = "", guidance_scale: float = 5.0,
                         guidance_scale_2: float | None = None, boundary_ratio: float | None = None,
                         flow_shift: float | None = None) -> np.ndarray:
    """``WanImageToVideoPipeline.__call__(image=image, output_type="np")`` as ``uint8 [F, H, W, 3]``
    (``image``: PIL RGB; the pipeline resizes it to ``width x height`` itself)."""
    item = VideoDenoiseItem(np.zeros((0, 1), np.float32), height, width, num_frames, steps, seed,
                            boundary_ratio=boundary_ratio, flow_shift=flow_shift)
    from omni_triton.stages.wan.denoiser import _call_config

    with torch.no_grad(), _call_config(pipe, item):
        frames = pipe(image=image, prompt=prompt, negative_prompt=negative_prompt, height=height, width=width,
                      num_frames=num_frames, num_inference_steps=steps, guidance_scale=guidance_scale,
                      guidance_scale_2=guidance_scale_2, generator=torch.Generator().manual_seed(seed),
                      output_type="np").frames[0]
    return to_uint8(frames)


def staged_i2v_frames(pipe, image, prompt: str, *, height: int, width: int, num_frames: int, steps: int, seed: int,
                      negative_prompt: str = "", guidance_scale: float = 5.0, guidance_scale_2: float | None = None,
                      boundary_ratio: float | None = None, flow_shift: float | None = None,
                      t2v_pipe=None) -> np.ndarray:
    """The ``wan_i2v`` stage split in-process for one request: encode the prompts (with
    ``t2v_pipe``, the T2V pipeline whose text encoder and VAE decoder ``wan_i2v`` reuses; default ``pipe``),
    VAE-encode the condition, denoise, decode. ``image`` must already be ``width x height``."""
    from omni_triton.stages.wan.vae import vae_encode_condition

    embeds, neg = encode_prompts(t2v_pipe or pipe, [prompt, negative_prompt])
    condition = vae_encode_condition(pipe, [image], num_frames)[0]
    item = VideoDenoiseItem(embeds, height, width, num_frames, steps, seed, neg, guidance_scale,
                            guidance_scale_2, boundary_ratio, flow_shift, condition)
    return vae_decode(t2v_pipe or pipe, [denoise(pipe, [item])[0].latents])[0]
