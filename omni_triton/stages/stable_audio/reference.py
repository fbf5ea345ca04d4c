"""The plain diffusers call and the stage split run in-process (what parity tests compare)."""
from __future__ import annotations

import numpy as np
import torch

from omni_triton.stages.stable_audio.denoiser import AudioDenoiseItem, denoise
from omni_triton.stages.stable_audio.text_encoder import encode_prompts
from omni_triton.stages.stable_audio.vae import vae_decode


def reference_audio(pipe, prompt: str, *, audio_start_s: float = 0.0, audio_end_s: float, steps: int, seed: int,
                    negative_prompt: str | None = None, guidance_scale: float = 7.0) -> np.ndarray:
    """``StableAudioPipeline.__call__(output_type="np")`` for one prompt: ``float32 [channels, samples]``."""
    with torch.no_grad():
        return pipe(prompt, negative_prompt=negative_prompt, audio_start_in_s=audio_start_s,
                    audio_end_in_s=audio_end_s, num_inference_steps=steps, guidance_scale=guidance_scale,
                    generator=torch.Generator().manual_seed(seed), output_type="np").audios[0]


def staged_item(pipe, prompt: str, *, audio_start_s: float = 0.0, audio_end_s: float, steps: int, seed: int,
                negative_prompt: str | None = None, guidance_scale: float = 7.0) -> AudioDenoiseItem:
    """The text-encoder stage's output for one request, as the denoiser's item."""
    texts, neg = [prompt], [False]
    if negative_prompt is not None and guidance_scale > 1.0:
        texts, neg = [prompt, negative_prompt], [False, True]
    enc = encode_prompts(pipe, texts, neg)
    item = AudioDenoiseItem(enc[0][0], enc[0][1], audio_start_s, audio_end_s, steps, seed, guidance_scale)
    if len(enc) == 2:
        item.negative_prompt_embeds, item.negative_attention_mask = enc[1]
    return item


def staged_audio(pipe, prompt: str, **kwargs) -> np.ndarray:
    """The Triton stage split in-process for one request: encode -> denoise -> decode."""
    item = staged_item(pipe, prompt, **kwargs)
    latents = denoise(pipe, [item])[0].latents
    return vae_decode(pipe, [latents], [(item.audio_start_s, item.audio_end_s)])[0]
