"""Denoiser stage: ``WanPipeline.__call__``'s own loop (``output_type="latent"``) for compatible
requests batched into one call, each with its own seed, reporting every finished step and
stopping at the next step boundary when the whole call is cancelled. The same function runs
``WanImageToVideoPipeline.__call__`` for image-to-video items (those with a ``condition``).
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from omni_triton.stages.wan.text_encoder import MAX_SEQUENCE_LENGTH, pad_embeds

#: ``on_step(indices, step, total) -> stop``: called after each finished step of one pipeline
#: call with the indices (into ``items``) of its requests, the steps finished (1-based) and the
#: call's total; returning True interrupts the call at this step boundary.
StepHook = Callable[[list[int], int, int], bool]


@dataclass
class VideoDenoiseItem:
    """One video to denoise (one Triton request).

    Attributes:
        prompt_embeds: ``float32 [L, D]`` (unpadded, :func:`~omni_triton.stages.wan.encode_prompts`).
        negative_prompt_embeds: ``float32 [L', D]``; used when ``guidance_scale > 1``.
        height, width: pixels (multiples of :func:`~omni_triton.stages.wan.size_multiple`).
        num_frames: ``4 k + 1``.
        steps: denoising steps.
        seed: seed of this item's own ``torch.Generator`` (initial noise).
        guidance_scale: CFG scale of the high-noise expert (``> 1``: CFG on).
        guidance_scale_2: CFG scale of the low-noise expert (``None``: ``guidance_scale``).
        boundary_ratio: expert switch point as a fraction of the training timesteps (``None``:
            the pipeline's own ``boundary_ratio``).
        flow_shift: the scheduler's flow shift (``None``: the pipeline's scheduler config).
        condition: image-to-video only: the reference frame's VAE latents ``float32 [z, f, h, w]``
            (:func:`~omni_triton.stages.wan.vae_encode_condition`; ``f = (num_frames - 1) / 4 + 1``).
    """

    prompt_embeds: np.ndarray
    height: int
    width: int
    num_frames: int
    steps: int
    seed: int
    negative_prompt_embeds: np.ndarray | None = None
    guidance_scale: float = 5.0
    guidance_scale_2: float | None = None
    boundary_ratio: float | None = None
    flow_shift: float | None = None
    condition: np.ndarray | None = None

    @property
    def cfg(self) -> bool:
        return self.guidance_scale > 1.0


@dataclass
class VideoDenoiseResult:
    """Latents ``float32 [z, f, h, w]`` of one item, the steps its call finished (fewer than
    asked when it was interrupted), whether it was interrupted, and the call's wall time (s)."""

    latents: np.ndarray
    steps: int
    interrupted: bool
    seconds: float


def denoise_key(item: VideoDenoiseItem) -> tuple:
    """Items with equal keys can share one pipeline call."""
    return (item.height, item.width, item.num_frames, item.steps, item.cfg, float(item.guidance_scale),
            item.guidance_scale_2, item.boundary_ratio, item.flow_shift, item.condition is not None)


class _Steps:
    """``callback_on_step_end``: counts finished steps, calls the hook, sets ``pipe._interrupt``."""

    def __init__(self, indices: list[int], total: int, hook: StepHook | None):
        self.indices, self.total, self.hook = indices, total, hook
        self.done = 0
        self.interrupted = False

    def __call__(self, pipe, i, t, kwargs):
        self.done = i + 1
        if self.hook is not None and self.hook(self.indices, self.done, self.total) and self.done < self.total:
            pipe._interrupt = True  # the loop skips every later step (`if self.interrupt: continue`)
            self.interrupted = True
        return {}


def denoise(pipe, items: Sequence[VideoDenoiseItem], on_step: StepHook | None = None) -> list[VideoDenoiseResult]:
    """Run the Wan loop for ``items``: one ``pipe(...)`` call per compatible group.

    Each call is ``WanPipeline.__call__`` with ``prompt_embeds`` / ``negative_prompt_embeds``
    (zero-padded to 512 rows as the pipeline pads), ``generator=[one per item]``,
    ``guidance_scale(_2)`` and ``output_type="latent"``; a request's ``boundary_ratio`` and
    ``flow_shift`` are applied to the pipeline's config / scheduler for its call and restored.

    Image-to-video items (``condition`` set; ``pipe`` a ``WanImageToVideoPipeline``): the call
    also gets ``image`` and the items' precomputed condition latents replace the pipeline's own
    ``vae.encode`` inside ``prepare_latents`` (:class:`_precomputed_condition`), which still
    builds the noise from each generator, normalises the condition and adds the first-frame mask.

    Raises:
        ValueError: an item's condition does not fit its size / frames.

    Returns:
        one :class:`VideoDenoiseResult` per item, in order.
    """
    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(denoise_key(item), []).append(i)
    results: list[VideoDenoiseResult | None] = [None] * len(items)
    for idx in groups.values():
        group = [items[i] for i in idx]
        first = group[0]
        kwargs = dict(prompt_embeds=pad_embeds([g.prompt_embeds for g in group]), height=first.height,
                      width=first.width, num_frames=first.num_frames, num_inference_steps=first.steps,
                      guidance_scale=first.guidance_scale, guidance_scale_2=first.guidance_scale_2,
                      generator=[torch.Generator().manual_seed(int(g.seed)) for g in group],
                      output_type="latent", max_sequence_length=MAX_SEQUENCE_LENGTH)
        if first.cfg:
            kwargs["negative_prompt_embeds"] = pad_embeds([_negative(g) for g in group])
        steps = _Steps(idx, first.steps, on_step)
        kwargs["callback_on_step_end"] = steps
        start = time.perf_counter()
        conditions = None
        if first.condition is not None:
            conditions = [_condition(g) for g in group]
            # __call__ needs an ``image`` (one PIL image per call); only the VAE encode inside
            # prepare_latents reads it, and that encode is the conditioning stage's.
            kwargs["image"] = _placeholder_image(first.width, first.height)
        with _pipe_lock(pipe), torch.no_grad(), _call_config(pipe, first), _precomputed_condition(pipe, conditions):
            latents = pipe(**kwargs).frames
        seconds = time.perf_counter() - start
        for j, i in enumerate(idx):
            results[i] = VideoDenoiseResult(latents[j].float().numpy(), steps.done, steps.interrupted, seconds)
    return results  # type: ignore[return-value]


def _condition(item: VideoDenoiseItem) -> torch.Tensor:
    c = item.condition
    want = ((item.num_frames - 1) // 4 + 1, item.height // 8, item.width // 8)
    if c.ndim != 4 or tuple(c.shape[1:]) != want:
        raise ValueError(f"condition latents {list(c.shape)}: must be [z, {want[0]}, {want[1]}, {want[2]}] for "
                         f"{item.num_frames} frames of {item.width}x{item.height}")
    return torch.from_numpy(np.ascontiguousarray(c, dtype=np.float32))[None]


def _placeholder_image(width: int, height: int):
    from PIL import Image

    return Image.new("RGB", (width, height))


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _pipe_lock(pipe) -> threading.Lock:
    """One pipeline call at a time per pipeline object: a diffusers pipeline keeps per-call state
    (scheduler timesteps, ``_interrupt``, guidance, this module's config overrides), so two
    overlapping calls on one object would corrupt each other."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(pipe)
        if lock is None:
            lock = _LOCKS[pipe] = threading.Lock()
        return lock


_LOCAL = threading.local()  # this thread's pending condition latents (a list), or None


class _precomputed_condition:
    """Context manager: while it is active on this thread, ``pipe.vae.encode`` answers its k-th
    call with the k-th precomputed condition (``WanImageToVideoPipeline.prepare_latents``
    encodes once per generator, one generator per item), as the posterior the VAE would return
    (its mode is the latents exactly). Outside it (or with ``conditions`` None) the VAE encodes
    as usual. The VAE gets one permanent dispatching ``encode`` (installed at the first use,
    never removed), and the pending conditions are thread-local, so no call adds or deletes an
    attribute of the shared VAE while another may be reading it.

    Raises (on exit):
        RuntimeError: the pipeline encoded fewer condition videos than there are items.
    """

    def __init__(self, pipe, conditions: list[torch.Tensor] | None):
        self.vae, self.conditions = pipe.vae, conditions

    def __enter__(self):
        if self.conditions is not None:
            _install_condition_hook(self.vae)
            self.saved = getattr(_LOCAL, "pending", None)
            _LOCAL.pending = list(self.conditions)
        return self

    def __exit__(self, exc_type, *exc):
        if self.conditions is None:
            return False
        left = _LOCAL.pending
        _LOCAL.pending = self.saved
        if exc_type is None and left:
            raise RuntimeError(f"the pipeline encoded {len(self.conditions) - len(left)} condition videos for "
                               f"{len(self.conditions)} items")
        return False


def _install_condition_hook(vae) -> None:
    if "encode" in vars(vae):
        return
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
    from diffusers.models.modeling_outputs import AutoencoderKLOutput

    own = type(vae).encode

    def encode(x, return_dict=True):
        pending = getattr(_LOCAL, "pending", None)
        if pending is None:
            return own(vae, x, return_dict=return_dict)
        if not pending:
            raise RuntimeError("the pipeline encoded more condition videos than there are items")
        c = pending.pop(0).to(x.device, x.dtype)
        dist = DiagonalGaussianDistribution(torch.cat([c, torch.zeros_like(c)], dim=1))
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)

    vae.encode = encode  # on this VAE instance only; outside a call it is the class's own encode


def _negative(item: VideoDenoiseItem) -> np.ndarray:
    neg = item.negative_prompt_embeds
    if neg is None or neg.shape[0] == 0:
        raise ValueError("guidance_scale > 1 needs negative prompt embeddings")
    return neg


class _call_config:
    """Context manager: the item's ``boundary_ratio`` / ``flow_shift`` for one call."""

    def __init__(self, pipe, item: VideoDenoiseItem):
        self.pipe, self.item = pipe, item

    def __enter__(self):
        pipe, item = self.pipe, self.item
        self.saved = (pipe.config.boundary_ratio, pipe.scheduler)
        if item.boundary_ratio is not None:
            pipe.register_to_config(boundary_ratio=float(item.boundary_ratio))
        if item.flow_shift is not None:
            pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, flow_shift=float(item.flow_shift))
        return self

    def __exit__(self, *exc):
        ratio, scheduler = self.saved
        self.pipe.register_to_config(boundary_ratio=ratio)
        self.pipe.scheduler = scheduler
        return False
