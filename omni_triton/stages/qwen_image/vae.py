"""VAE stages: condition image -> image latents (edit), packed latents -> uint8 RGB image.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omni_triton.stages.diffusion_pipeline import denormalize_latents
from omni_triton.stages.qwen_image.loading import edit_condition_size


# --------------------------------------------------------------------------- VAE encode (edit)
def condition_image(pipe, image) -> tuple:
    """PIL image -> (resized PIL image for the text encoder, ``float32 [3, 1, h, w]`` VAE input),
    both exactly as ``QwenImageEditPipeline.__call__`` prepares them."""
    w, h = edit_condition_size(pipe, image.size)
    resized = pipe.image_processor.resize(image, h, w)
    tensor = pipe.image_processor.preprocess(resized, h, w).unsqueeze(2)[0]
    return resized, tensor


def vae_encode(pipe, images: Sequence) -> list[np.ndarray]:
    """Condition-image latents for edits: ``float32 [z_dim, 1, h/8, w/8]`` per PIL image.

    Uses the pipeline's ``_encode_vae_image`` (``sample_mode="argmax"``: the posterior's mode,
    so no randomness) one image at a time, as the pipeline itself does when given a list of
    generators (one per request), so each latent is exactly what ``__call__`` computes.
    """
    out = []
    with torch.no_grad():
        for image in images:
            _, tensor = condition_image(pipe, image)
            latents = pipe._encode_vae_image(image=tensor[None], generator=None)
            out.append(latents[0].float().numpy())
    return out


# --------------------------------------------------------------------------- VAE decode
def vae_decode(pipe, latents: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    """Packed latents ``[S, C]`` + (height, width) -> ``uint8 [H, W, 3]`` images.

    The tail of ``__call__`` after the loop: ``_unpack_latents``, ``x / (1 / latents_std) +
    latents_mean``, ``vae.decode``, ``image_processor.postprocess(output_type="np")`` and
    ``numpy_to_pil``'s ``(x * 255).round()``. Items of equal size are decoded in one batch.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(sizes):
        groups.setdefault(tuple(s), []).append(i)
    out: list[np.ndarray | None] = [None] * len(latents)
    vae = pipe.vae
    with torch.no_grad():
        for (height, width), idx in groups.items():
            x = torch.from_numpy(np.stack([latents[i] for i in idx]).astype(np.float32))
            x = pipe._unpack_latents(x, height, width, pipe.vae_scale_factor).to(vae.dtype)
            x = denormalize_latents(vae, x)
            image = vae.decode(x, return_dict=False)[0][:, :, 0]
            arr = pipe.image_processor.postprocess(image, output_type="np")
            for j, i in enumerate(idx):
                out[i] = (arr[j] * 255).round().astype(np.uint8)
    return out  # type: ignore[return-value]
