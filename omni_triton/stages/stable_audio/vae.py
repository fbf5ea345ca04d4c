"""VAE decode stage (AutoencoderOobleck): latents -> the requested stretch of waveform."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def vae_decode(pipe, latents: Sequence[np.ndarray], spans: Sequence[tuple[float, float]]) -> list[np.ndarray]:
    """Latents ``float32 [C, T]`` -> ``float32 [channels, samples]``.

    The tail of ``StableAudioPipeline.__call__`` after the loop: ``vae.decode(latents).sample``,
    then ``audio[:, :, int(start * sr):int(end * sr)]`` with ``sr = vae.config.sampling_rate``
    (``spans``: per item ``(audio_start_in_s, audio_end_in_s)``, float seconds). Each clip is
    decoded alone (batch 1, bit-identical to the pipeline's own call).
    """
    sr = pipe.vae.config.sampling_rate
    out = []
    with torch.no_grad():
        for lat, (start, end) in zip(latents, spans, strict=True):
            x = torch.from_numpy(np.ascontiguousarray(lat, dtype=np.float32))[None].to(pipe.vae.dtype)
            audio = pipe.vae.decode(x).sample
            out.append(audio[0, :, int(start * sr):int(end * sr)].float().numpy())
    return out
