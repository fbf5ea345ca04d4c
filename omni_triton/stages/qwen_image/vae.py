"""VAE stages: condition image -> image latents (edit), packed latents -> uint8 RGB image.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omni_triton.stages.diffusion_pipeline import denormalize_latents
from omni_triton.stages.qwen_image.loading import edit_condition_size, is_multi_image_pipeline, vae_condition_size


# --------------------------------------------------------------------------- VAE encode (edit)
def condition_image(pipe, image) -> tuple:
    """PIL image -> (resized PIL image for the text encoder, ``float32 [3, 1, h, w]`` VAE input),
    both exactly as the pipeline's ``__call__`` prepares them: ``QwenImageEditPipeline`` resizes
    to ~1 MP once and preprocesses the resized image; ``QwenImageEditPlusPipeline`` resizes to
    ~384x384 for the text encoder and preprocesses the original image at ~1 MP for the VAE
    (:func:`edit_condition_size`, :func:`vae_condition_size`)."""
    w, h = edit_condition_size(pipe, image.size)
    resized = pipe.image_processor.resize(image, h, w)
    if is_multi_image_pipeline(pipe):
        vw, vh = vae_condition_size(pipe, image.size)
        return resized, pipe.image_processor.preprocess(image, vh, vw).unsqueeze(2)[0]
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


def pack_image_latents(pipe, latents: Sequence[np.ndarray]) -> np.ndarray:
    """The latents of one request's condition images (``float32 [z, 1, h_k, w_k]`` each, from
    :func:`vae_encode`) -> ``float32 [S_c, 4z]``: each packed into 2x2 patches by the pipeline's
    ``_pack_latents`` and concatenated in image order, as ``QwenImageEditPlusPipeline.prepare_latents``
    concatenates them (the condition tokens the DiT reads after the noise tokens)."""
    packed = []
    for lat in latents:
        z, _, h, w = lat.shape
        x = torch.from_numpy(np.ascontiguousarray(lat, dtype=np.float32))[None]
        packed.append(pipe._pack_latents(x, 1, z, h, w)[0])
    return torch.cat(packed, dim=0).numpy()


def unpack_image_latents(pipe, packed: np.ndarray, image_sizes: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    """Inverse of :func:`pack_image_latents` for condition images of ``image_sizes`` (w, h as
    PIL gives them): one ``float32 [z, 1, h_k, w_k]`` per image, at :func:`vae_condition_size`.

    Raises:
        ValueError: ``packed`` is not ``[S_c, 4z]`` with ``S_c`` the sum of the images' patch counts.
    """
    vsf = pipe.vae_scale_factor
    sizes = [vae_condition_size(pipe, s) for s in image_sizes]
    counts = [(h // (vsf * 2)) * (w // (vsf * 2)) for w, h in sizes]
    z = pipe.vae.config.z_dim
    if packed.ndim != 2 or packed.shape != (sum(counts), 4 * z):
        raise ValueError(f"IMAGE_LATENTS {list(packed.shape)}: expected {[sum(counts), 4 * z]} for "
                         f"condition images {list(image_sizes)}")
    out, start = [], 0
    x = torch.from_numpy(np.ascontiguousarray(packed, dtype=np.float32))
    for (w, h), count in zip(sizes, counts, strict=True):
        out.append(pipe._unpack_latents(x[start:start + count][None], h, w, vsf)[0].numpy())
        start += count
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
