"""Masked inpainting (diffusers ``QwenImageInpaintPipeline``): the VAE-encode stage and the
denoiser's hook that hands its result to the pipeline.

``QwenImageInpaintPipeline.__call__`` (diffusers 0.42.1) VAE-encodes through its
``_encode_vae_image`` (``retrieve_latents(vae.encode(x), generator)``: a *sample* of the VAE
posterior, drawn from the request's generator):

1. ``prepare_latents``: the image (``image_processor.preprocess(image, height, width)``), then
   the initial noise, from the same generator;
2. ``prepare_mask_latents``: the mask (``mask_processor.preprocess``: resized, binarised at 0.5,
   white = repaint; interpolated to the latent grid and packed) and the masked image
   ``image * (mask < 0.5)``, VAE-encoded unless ``masked_image_latents`` is given.

The denoising loop reads the image latents, the noise and the mask (``latents = (1 - mask) *
noised_image_latents + mask * latents`` after every step); it never reads
``masked_image_latents`` (only a 64-channel inpainting transformer would: diffusers' own comment
"for 64 channel transformer only"; ``tests/unit/test_inpaint.py`` checks that the output does not
depend on it). So the split is:

- VAE-encode stage: ``vae.encode`` of the image (:func:`image_posteriors`: the posterior's
  *parameters*, mean and log-variance; no randomness), the expensive part;
- denoiser: the pipeline's own ``__call__`` with ``image``, ``mask_image``, ``strength``, a
  zero placeholder for ``masked_image_latents`` (the masked image is not encoded: half the VAE
  work) and ``vae.encode`` answering from the stage's parameters
  (:func:`precomputed_posteriors`), so the pipeline's own ``_encode_vae_image`` samples them with
  the request's generator in its own order (image sample, then noise).
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import torch


def mask_from_array(array: np.ndarray):
    """``uint8 [H, W]`` mask in diffusers' convention (255 = repaint, 0 = keep; see
    ``omni_triton.contracts.image.diffusers_mask_from_alpha``) -> PIL ``L`` image.

    Raises:
        ValueError: any other shape or dtype.
    """
    from PIL import Image

    if array.dtype != np.uint8 or array.ndim != 2 or min(array.shape) < 1:
        raise ValueError(f"MASK must be uint8 [H, W], got {array.dtype} {list(array.shape)}")
    return Image.fromarray(np.ascontiguousarray(array), "L")


def check_mask(image, mask) -> None:
    """Raise ``ValueError`` unless the PIL ``mask`` has the PIL ``image``'s size (OpenAI: the
    mask must have the same dimensions as the image)."""
    if mask.size != image.size:
        raise ValueError(f"mask {mask.size[0]}x{mask.size[1]} must have the image's size "
                         f"{image.size[0]}x{image.size[1]}")


def image_posteriors(pipe, images: Sequence, sizes: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    """VAE posteriors of the images to inpaint, as ``__call__``'s ``prepare_latents`` encodes them.

    Args:
        pipe: a ``QwenImageInpaintPipeline``.
        images: PIL RGB images (any size: resized to ``sizes[i]`` as ``__call__`` does).
        sizes: ``(height, width)`` of each output, pixels (multiples of ``size_multiple``).

    Returns:
        per image ``float32 [2 * z_dim, 1, height / 8, width / 8]``:
        ``vae.encode(x).latent_dist.parameters`` (mean, then log-variance, along dim 0). Images
        are encoded one at a time, as ``__call__`` does with a list of generators (one per
        request), so each equals the pipeline's own encoding.
    """
    out = []
    with torch.no_grad():
        for image, (height, width) in zip(images, sizes, strict=True):
            x = pipe.image_processor.preprocess(image, height=height, width=width).to(torch.float32)
            out.append(pipe.vae.encode(x.unsqueeze(2).to(pipe.vae.dtype)).latent_dist.parameters[0].float().numpy())
    return out


def masked_image_placeholder(moments: Sequence[np.ndarray]) -> torch.Tensor:
    """``masked_image_latents`` for ``__call__``: zeros ``float32 [B, z, 1, h, w]`` (the shape
    ``prepare_mask_latents`` packs; the loop never reads them, see the module docstring), so the
    pipeline does not VAE-encode the masked image."""
    z = moments[0].shape[0] // 2
    return torch.zeros(len(moments), z, *moments[0].shape[1:], dtype=torch.float32)


@contextmanager
def precomputed_posteriors(pipe, image_moments: Sequence[np.ndarray]):
    """While inside, ``pipe.vae.encode`` answers the calls of one inpaint ``__call__`` from the
    VAE-encode stage's posteriors instead of running the VAE encoder.

    ``__call__`` with ``B`` generators (and ``masked_image_latents`` given) calls ``vae.encode``
    ``B`` times, one image each (``prepare_latents``); call ``k`` gets the posterior
    ``DiagonalGaussianDistribution`` of ``image_moments[k]``, and the pipeline's own
    ``_encode_vae_image`` samples it with generator ``k`` and normalises it.

    Raises (from ``vae.encode``):
        ValueError: a call whose input is not one image of the posterior's size, or more calls
            than posteriors (a diffusers version that encodes differently).
    """
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
    from diffusers.models.modeling_outputs import AutoencoderKLOutput

    queue = [torch.from_numpy(np.ascontiguousarray(m, dtype=np.float32))[None] for m in image_moments]
    scale = pipe.vae_scale_factor
    calls = iter(range(len(queue)))

    def encode(x: torch.Tensor, return_dict: bool = True):
        k = next(calls, None)
        if k is None:
            raise ValueError(f"vae.encode called more than {len(queue)} times for {len(queue)} inpaint images")
        params = queue[k]
        want = (1, params.shape[2], params.shape[3] * scale, params.shape[4] * scale)
        got = (x.shape[0], x.shape[2], x.shape[3], x.shape[4])
        if got != want:
            raise ValueError(f"vae.encode call {k}: input {list(x.shape)} does not match the precomputed "
                             f"posterior {list(params.shape)}")
        posterior = DiagonalGaussianDistribution(params.to(x.dtype))
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    pipe.vae.encode = encode
    try:
        yield
    finally:
        del pipe.vae.encode
