"""In-process references: the diffusers ``__call__`` and the same stages chained in-process.
"""
from __future__ import annotations

import numpy as np
import torch

from omni_triton.stages.qwen_image.denoiser import DenoiseItem, denoise
from omni_triton.stages.qwen_image.inpaint import image_posteriors
from omni_triton.stages.qwen_image.lora import LoraCache, LoraSpec
from omni_triton.stages.qwen_image.text_encoder import encode_prompts
from omni_triton.stages.qwen_image.vae import (
    condition_image,
    pack_image_latents,
    unpack_image_latents,
    vae_decode,
    vae_encode,
)


# --------------------------------------------------------------------------- reference
def reference_images(pipe, prompt: str, *, height: int, width: int, steps: int, seed: int,
                     negative_prompt: str | None = None, true_cfg_scale: float = 4.0,
                     guidance_scale: float | None = None, image=None, mask=None,
                     strength: float | None = None) -> np.ndarray:
    """The plain diffusers ``__call__`` (what the Triton stages must equal): ``uint8 [H, W, 3]``.

    ``image``: the edit's condition image, or with ``mask`` (PIL ``L``, white = repaint) the
    image an inpaint pipeline repaints; ``strength`` None: the pipeline's default."""
    kwargs = dict(prompt=prompt, height=height, width=width, num_inference_steps=steps,
                  negative_prompt=negative_prompt, true_cfg_scale=true_cfg_scale,
                  guidance_scale=guidance_scale, generator=torch.Generator().manual_seed(seed),
                  output_type="pil")
    if image is not None:
        kwargs["image"] = image
    if mask is not None:
        kwargs["mask_image"] = mask
    if strength is not None:
        kwargs["strength"] = strength
    with torch.no_grad():
        return np.asarray(pipe(**kwargs).images[0], dtype=np.uint8)


def staged_images(pipe, prompt: str, *, height: int, width: int, steps: int, seed: int,
                  negative_prompt: str | None = None, true_cfg_scale: float = 4.0,
                  guidance_scale: float | None = None, image=None, lora: LoraSpec | None = None,
                  loras: LoraCache | None = None, mask=None, strength: float | None = None) -> np.ndarray:
    """The Triton stage split run in-process for one request (same order as the ensemble).
    ``image``: the edit's PIL condition image, or a list of them for a multi-image pipeline (whose
    latents then go through the packed ``IMAGE_LATENTS`` form the Triton stages exchange), or with
    ``mask`` the image to inpaint; ``lora`` (with the denoiser's ``loras`` cache) selects an
    adapter and scale."""
    if mask is not None:
        return staged_inpaint(pipe, [prompt], height=height, width=width, steps=steps, seeds=[seed],
                              negative_prompt=negative_prompt, true_cfg_scale=true_cfg_scale,
                              guidance_scale=guidance_scale, images=[image], masks=[mask],
                              strength=strength, lora=lora, loras=loras)[0]
    cond = None
    multi = isinstance(image, list)
    if image is not None:
        resized = [condition_image(pipe, im)[0] for im in (image if multi else [image])]
        cond = [resized] if multi else resized
    embeds = encode_prompts(pipe, [prompt], cond)[0]
    cfg = negative_prompt is not None and true_cfg_scale > 1
    neg = encode_prompts(pipe, [negative_prompt], cond)[0] if cfg else None
    item = DenoiseItem(embeds, height, width, steps, seed, neg, true_cfg_scale, guidance_scale, lora=lora)
    if multi:
        item.image = list(image)
        packed = pack_image_latents(pipe, vae_encode(pipe, image))
        item.image_latents = unpack_image_latents(pipe, packed, [im.size for im in image])
    elif image is not None:
        item.image = image
        item.image_latents = vae_encode(pipe, [image])[0]
    result = denoise(pipe, [item], loras=loras)[0]
    if isinstance(result, Exception):
        raise result
    return vae_decode(pipe, [result.latents], [(height, width)])[0]


def staged_inpaint(pipe, prompts: list[str], *, height: int, width: int, steps: int, seeds: list[int],
                   images: list, masks: list, negative_prompt: str | None = None, true_cfg_scale: float = 4.0,
                   guidance_scale: float | None = None, strength: float | None = None,
                   lora: LoraSpec | None = None, loras: LoraCache | None = None) -> list[np.ndarray]:
    """The inpaint ensemble's stages in-process (VAE encode, text encode, denoise, VAE decode),
    the ``len(prompts)`` requests batched together in every stage: ``uint8 [H, W, 3]`` each.
    ``strength`` None: the pipeline's ``__call__`` default; ``lora`` (with the denoiser's
    ``loras`` cache): every request's adapter and scale. Raises the denoiser's ``LoraLoadError``."""
    import inspect

    if strength is None:
        strength = inspect.signature(type(pipe).__call__).parameters["strength"].default
    posteriors = image_posteriors(pipe, images, [(height, width)] * len(images))
    embeds = encode_prompts(pipe, prompts)
    cfg = negative_prompt is not None and true_cfg_scale > 1
    negs = encode_prompts(pipe, [negative_prompt] * len(prompts)) if cfg else [None] * len(prompts)
    items = [DenoiseItem(e, height, width, steps, seed, n, true_cfg_scale, guidance_scale, image=im, mask=m,
                         strength=strength, image_moments=p, lora=lora)
             for e, n, seed, im, m, p in zip(embeds, negs, seeds, images, masks, posteriors, strict=True)]
    results = denoise(pipe, items, loras=loras)
    for r in results:
        if isinstance(r, Exception):
            raise r
    return vae_decode(pipe, [r.latents for r in results], [(height, width)] * len(items))
