"""Denoiser stage: the diffusers pipeline's own loop (``output_type="latent"``), compatible
requests batched into one call, each with its own seed (and, per call, one LoRA adapter at one
scale or none: ``omni_triton.stages.qwen_image.lora``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from omni_triton.stages.qwen_image.inpaint import masked_image_placeholder, precomputed_posteriors
from omni_triton.stages.qwen_image.lora import LoraCache, LoraLoadError, LoraSpec

LOGGER = logging.getLogger("omni_triton.diffusion")


# --------------------------------------------------------------------------- denoiser
@dataclass
class DenoiseItem:
    """One image to denoise (one Triton request).

    Attributes:
        prompt_embeds: ``float32 [L, D]``.
        negative_prompt_embeds: ``float32 [L', D]``; ``None``/empty disables true CFG.
        height, width: output size in pixels (multiples of :func:`size_multiple`).
        steps: number of denoising steps.
        seed: seed of this item's ``torch.Generator`` (initial noise).
        true_cfg_scale: CFG scale ``w`` (``noise = neg + w * (cond - neg)``, renormalised as in
            the pipeline); used only with negative embeddings and ``w > 1``.
        guidance_scale: guidance-distilled models only (``None`` otherwise).
        image: edit only: the condition image (PIL) as the client sent it.
        image_latents: edit only: its :func:`vae_encode` latents ``[z, 1, h, w]``.
        mask: inpaint only: PIL ``L`` mask of ``image``'s size, diffusers' convention (white =
            repaint); ``image`` is then the image to inpaint.
        strength: inpaint only: how far the image is noised, in (0, 1]; the pipeline runs the
            last ``steps * strength`` of its ``steps`` timesteps.
        image_moments: inpaint only: the VAE-encode stage's posterior of the image ``float32
            [2z, 1, h, w]`` (``image_posteriors``).
        image: edit only: the condition image (PIL) as the client sent it; for a multi-image
            pipeline (``QwenImageEditPlusPipeline``) the list of condition images, in order.
        image_latents: edit only: its :func:`vae_encode` latents ``[z, 1, h, w]``; multi-image:
            the list of each image's latents, in the same order.
        cancelled: ``() -> bool``, polled after every step (the Triton request's cancellation);
            when it is True for every item of a pipeline call, the call stops at that step
            boundary (``pipe._interrupt``) instead of running to its end for clients that left.
        lora: the LoRA adapter and scale of this item (``None``: no adapter); items with another
            adapter or scale never share a pipeline call.
    """

    prompt_embeds: np.ndarray
    height: int
    width: int
    steps: int
    seed: int
    negative_prompt_embeds: np.ndarray | None = None
    true_cfg_scale: float = 4.0
    guidance_scale: float | None = None
    image: object | None = None
    image_latents: np.ndarray | None = None
    cancelled: Callable[[], bool] | None = None
    lora: LoraSpec | None = None
    mask: object | None = None
    strength: float | None = None
    image_moments: np.ndarray | None = None

    @property
    def cfg(self) -> bool:
        neg = self.negative_prompt_embeds
        return neg is not None and neg.shape[0] > 0 and self.true_cfg_scale > 1


@dataclass
class DenoiseResult:
    """Latents ``float32 [S, C]`` of one item, the steps it ran, the wall time (seconds) of the
    pipeline call it was part of (shared by its batch), and whether that call was interrupted
    (every item cancelled: the latents are unfinished)."""

    latents: np.ndarray
    steps: int
    seconds: float
    interrupted: bool = False


def denoise_key(item: DenoiseItem) -> tuple:
    """Items with equal keys can share one pipeline call (one batch): same size, steps, CFG and
    scale, guidance, condition size, and the same LoRA adapter at the same scale (or none)."""
    cond = None
    if isinstance(item.image, list):
        cond = tuple(im.size for im in item.image)
    elif item.image is not None:
        cond = item.image.size
    lora = (item.lora.id, float(item.lora.scale)) if item.lora is not None else None
    return (item.height, item.width, item.steps, item.cfg,
            item.true_cfg_scale if item.cfg else None, item.guidance_scale, cond, lora,
            item.mask is not None, item.strength)


def _pad(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``[L_i, D]`` arrays to ``[B, max L, D]`` plus the ``[B, max L]`` int64 mask."""
    longest = max(a.shape[0] for a in arrays)
    dim = arrays[0].shape[1]
    embeds = torch.zeros(len(arrays), longest, dim, dtype=torch.float32)
    mask = torch.zeros(len(arrays), longest, dtype=torch.int64)
    for i, a in enumerate(arrays):
        embeds[i, : a.shape[0]] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        mask[i, : a.shape[0]] = 1
    return embeds, mask


class _ProgressLog:
    """``callback_on_step_end`` that logs per-step progress of long generations.

    Every step is logged at DEBUG; at INFO when at least ``interval_s`` passed since the last
    INFO line (so a 50-step generation shows progress, a 2-step one stays quiet) and at the end.
    """

    def __init__(self, label: str, total: int, interval_s: float = 2.0,
                 cancelled: Sequence[Callable[[], bool] | None] = ()):
        self.label, self.total, self.interval_s = label, total, interval_s
        self.start = self.last = time.perf_counter()
        self.steps = 0
        self.cancelled = list(cancelled)
        self.interrupted = False

    def __call__(self, pipe, i, t, kwargs):
        self.steps = i + 1
        if (self.cancelled and all(c is not None for c in self.cancelled) and self.steps < self.total
                and all(c() for c in self.cancelled)):
            pipe._interrupt = True  # the loop skips every later step (`if self.interrupt: continue`)
            self.interrupted = True
            LOGGER.info("%s: every request cancelled, stopped at step %d/%d", self.label, self.steps, self.total)
            return {}
        now = time.perf_counter()
        msg = "%s: step %d/%d (%.2f s)"
        args = (self.label, i + 1, self.total, now - self.start)
        if now - self.last >= self.interval_s or (i + 1 == self.total and now - self.start >= self.interval_s):
            LOGGER.info(msg, *args)
            self.last = now
        else:
            LOGGER.debug(msg, *args)
        return {}


def denoise(pipe, items: Sequence[DenoiseItem], label: str = "denoise",
            progress_interval_s: float = 2.0,
            loras: LoraCache | None = None) -> list[DenoiseResult | LoraLoadError]:
    """Run the diffusion loop for ``items``: one ``pipe(...)`` call per compatible group (groups
    split to the pipeline's :func:`max_prompts_per_call`: one item per call for
    ``QwenImageEditPlusPipeline``).

    Each call is the pipeline's own ``__call__`` with ``prompt_embeds`` (+ mask),
    ``negative_prompt_embeds`` (true CFG), ``generator=[torch.Generator().manual_seed(seed_i)]``
    and ``output_type="latent"``; for edits ``image`` is the condition images and the
    VAE-encode stage's latents replace the pipeline's own ``_encode_vae_image`` call (the only
    hook: diffusers has no ``image_latents`` argument); for inpainting (items with a ``mask``)
    ``image``/``mask_image``/``strength`` go in, ``masked_image_latents`` is an unused placeholder
    and ``vae.encode`` answers from the VAE-encode stage's posteriors
    (:func:`~omni_triton.stages.qwen_image.inpaint.precomputed_posteriors`).

    LoRA: before each call ``loras.activate(first.lora)`` makes that group's adapter the only
    active one at its scale, or switches adapters off (``None``); a group whose adapter cannot be
    loaded gets the :class:`LoraLoadError` in place of its results, the other groups still run.

    Returns:
        one :class:`DenoiseResult` (or ``LoraLoadError``) per item, in order.
    """
    from omni_triton.stages.qwen_image.loading import max_prompts_per_call

    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(denoise_key(item), []).append(i)
    limit = max_prompts_per_call(pipe) or len(items)
    calls = [idx[k:k + limit] for idx in groups.values() for k in range(0, len(idx), limit)]
    results: list[DenoiseResult | LoraLoadError | None] = [None] * len(items)
    for idx in calls:
        group = [items[i] for i in idx]
        first = group[0]
        if loras is not None:
            try:
                loras.activate(first.lora)
            except LoraLoadError as exc:
                LOGGER.warning("%s: %s (%d request(s) refused)", label, exc, len(group))
                for i in idx:
                    results[i] = exc
                continue
        elif first.lora is not None:
            raise ValueError("an item names a LoRA adapter but this denoiser has no LoRA cache")
        embeds, mask = _pad([g.prompt_embeds for g in group])
        kwargs = dict(prompt_embeds=embeds, prompt_embeds_mask=mask,
                      height=first.height, width=first.width, num_inference_steps=first.steps,
                      guidance_scale=first.guidance_scale, output_type="latent",
                      generator=[torch.Generator().manual_seed(int(g.seed)) for g in group])
        if first.cfg:
            neg, neg_mask = _pad([g.negative_prompt_embeds for g in group])
            kwargs.update(negative_prompt_embeds=neg, negative_prompt_embeds_mask=neg_mask,
                          true_cfg_scale=first.true_cfg_scale)
        else:
            kwargs.update(true_cfg_scale=1.0)
        progress = _ProgressLog(f"{label} batch of {len(group)} ({first.width}x{first.height})",
                                first.steps, progress_interval_s, [g.cancelled for g in group])
        kwargs["callback_on_step_end"] = progress
        start = time.perf_counter()
        with torch.no_grad():
            if first.mask is not None:  # inpaint: the VAE-encode stage's posteriors, sampled here
                moments = [g.image_moments for g in group]
                kwargs.update(image=[g.image for g in group], mask_image=[g.mask for g in group],
                              strength=first.strength, masked_image_latents=masked_image_placeholder(moments))
                with precomputed_posteriors(pipe, moments):
                    latents = pipe(**kwargs).images
            elif isinstance(first.image, list):  # one item (max_prompts_per_call), its images in order
                kwargs["image"] = list(first.image)
                latents = _with_image_latents(pipe, [[lat] for lat in first.image_latents], kwargs)
            elif first.image is not None:
                kwargs["image"] = [g.image for g in group]
                latents = _with_image_latents(pipe, [[g.image_latents for g in group]], kwargs)
            else:
                latents = pipe(**kwargs).images
        seconds = time.perf_counter() - start
        for j, i in enumerate(idx):
            results[i] = DenoiseResult(latents[j].float().numpy(), progress.steps, seconds, progress.interrupted)
    return results  # type: ignore[return-value]


def _with_image_latents(pipe, per_call: list[list[np.ndarray]], kwargs: dict):
    """Call the edit pipeline with the VAE-encode stage's latents in place of its own VAE encode.

    ``per_call[k]`` answers the pipeline's ``k``-th ``_encode_vae_image`` call (one latent
    ``[z, 1, h, w]`` per batch row): ``QwenImageEditPipeline`` calls it once for the whole batch,
    ``QwenImageEditPlusPipeline`` once per condition image, in image order. Each answer must
    match the call's image count and latent size (``h, w`` = the image tensor's / 8), so latents
    given in another order or count than the images fail loudly instead of conditioning wrongly.
    """
    answers = [torch.from_numpy(np.stack(lats).astype(np.float32)) for lats in per_call]
    calls = iter(answers)
    vsf = pipe.vae_scale_factor

    def precomputed(image, generator):
        stacked = next(calls, None)
        if stacked is None:
            raise ValueError(f"more condition images than the {len(answers)} image latents given")
        want = (image.shape[0], image.shape[-2] // vsf, image.shape[-1] // vsf)
        got = (stacked.shape[0], *stacked.shape[-2:])
        if want != got:
            raise ValueError(f"condition image {list(image.shape)} needs latents [n, h, w] = {list(want)}, "
                             f"got {list(got)}")
        return stacked

    pipe._encode_vae_image = precomputed
    try:
        return pipe(**kwargs).images
    finally:
        del pipe._encode_vae_image
