"""Denoiser stage: ``StableAudioPipeline.__call__``'s own loop (``output_type="latent"``) for
compatible requests batched into one call, each with its own seed, reporting every finished step
and stopping at the next step boundary when the whole call is cancelled.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

#: ``on_step(indices, step, total) -> stop``: called after each finished step of one pipeline
#: call with the indices (into ``items``) of its requests, the steps finished (1-based) and the
#: call's total; returning True stops the call at this step boundary.
StepHook = Callable[[list[int], int, int], bool]


@dataclass
class AudioDenoiseItem:
    """One clip to denoise (one Triton request).

    Attributes:
        prompt_embeds: ``float32 [L, D]`` T5 states (:func:`~omni_triton.stages.stable_audio.encode_prompts`).
        attention_mask: ``int64 [L]``.
        audio_start_s, audio_end_s: the seconds conditioning (``audio_start_in_s`` /
            ``audio_end_in_s`` of ``__call__``).
        steps: denoising steps.
        seed: seed of this item's own ``torch.Generator`` (initial noise and SDE noise).
        guidance_scale: CFG scale (``> 1``: CFG on).
        negative_prompt_embeds, negative_attention_mask: the negative prompt's (``None``: the
            pipeline's zero unconditional embeddings when CFG is on).
    """

    prompt_embeds: np.ndarray
    attention_mask: np.ndarray
    audio_start_s: float
    audio_end_s: float
    steps: int
    seed: int
    guidance_scale: float = 7.0
    negative_prompt_embeds: np.ndarray | None = None
    negative_attention_mask: np.ndarray | None = None

    @property
    def cfg(self) -> bool:
        return self.guidance_scale > 1.0

    @property
    def has_negative(self) -> bool:
        return self.cfg and self.negative_prompt_embeds is not None


@dataclass
class AudioDenoiseResult:
    """Latents ``float32 [C, T]`` of one item, the steps its call finished (fewer than asked when
    it was interrupted; then ``latents`` is None), whether it was interrupted, and the call's
    wall time (s)."""

    latents: np.ndarray | None
    steps: int
    interrupted: bool
    seconds: float


def denoise_key(item: AudioDenoiseItem) -> tuple:
    """Items with equal keys can share one pipeline call (``__call__`` takes one step count,
    scale and seconds span per call, and a negative prompt for all items or none)."""
    return (item.steps, float(item.guidance_scale), item.has_negative, float(item.audio_start_s),
            float(item.audio_end_s), item.prompt_embeds.shape)


class _Interrupted(Exception):
    """Raised from the step callback to leave ``__call__`` at a step boundary (the pipeline's
    legacy ``callback`` has no ``_interrupt`` flag; the scheduler is reset by the next call's
    ``set_timesteps``)."""


class _Steps:
    """The pipeline's ``callback(step, t, latents)``: counts finished steps, calls the hook."""

    def __init__(self, indices: list[int], total: int, hook: StepHook | None):
        self.indices, self.total, self.hook = indices, total, hook
        self.done = 0

    def __call__(self, step, t, latents):
        self.done = step + 1
        if self.hook is not None and self.hook(self.indices, self.done, self.total) and self.done < self.total:
            raise _Interrupted


def denoise(pipe, items: Sequence[AudioDenoiseItem], on_step: StepHook | None = None) -> list[AudioDenoiseResult]:
    """Run the Stable Audio loop for ``items``: one ``pipe(...)`` call per compatible group.

    Each call is ``StableAudioPipeline.__call__`` with ``prompt_embeds`` / ``attention_mask``
    (and ``negative_prompt_embeds`` / ``negative_attention_mask`` when the items have them),
    ``audio_start_in_s`` / ``audio_end_in_s``, ``num_inference_steps``, ``guidance_scale``,
    ``generator`` (one per item: a list when the group has several, diffusers then seeds one
    Brownian tree per item), ``callback`` every step and ``output_type="latent"``.

    Raises:
        ValueError: embeddings / masks of mismatched shapes (diffusers' own checks).

    Returns:
        one :class:`AudioDenoiseResult` per item, in order.
    """
    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(denoise_key(item), []).append(i)
    results: list[AudioDenoiseResult | None] = [None] * len(items)
    for idx in groups.values():
        group = [items[i] for i in idx]
        first = group[0]
        gens = [torch.Generator().manual_seed(int(g.seed)) for g in group]
        kwargs = dict(prompt_embeds=_stack([g.prompt_embeds for g in group], torch.float32),
                      attention_mask=_stack([g.attention_mask for g in group], torch.int64),
                      audio_start_in_s=float(first.audio_start_s), audio_end_in_s=float(first.audio_end_s),
                      num_inference_steps=first.steps, guidance_scale=first.guidance_scale,
                      generator=gens[0] if len(gens) == 1 else gens, output_type="latent")
        if first.has_negative:
            kwargs["negative_prompt_embeds"] = _stack([g.negative_prompt_embeds for g in group], torch.float32)
            kwargs["negative_attention_mask"] = _stack([g.negative_attention_mask for g in group], torch.int64)
        steps = _Steps(idx, first.steps, on_step)
        start = time.perf_counter()
        latents, interrupted = None, False
        with _pipe_lock(pipe), torch.no_grad():
            try:
                latents = pipe(**kwargs, callback=steps, callback_steps=1).audios
            except _Interrupted:
                interrupted = True
        seconds = time.perf_counter() - start
        for j, i in enumerate(idx):
            lat = None if latents is None else latents[j].float().numpy()
            results[i] = AudioDenoiseResult(lat, steps.done, interrupted, seconds)
    return results  # type: ignore[return-value]


def _stack(arrays: Sequence[np.ndarray | None], dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([torch.from_numpy(np.ascontiguousarray(a)).to(dtype) for a in arrays])


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _pipe_lock(pipe) -> threading.Lock:
    """One pipeline call at a time per pipeline object (the scheduler keeps per-call state:
    timesteps, step index, the Brownian noise sampler)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(pipe)
        if lock is None:
            lock = _LOCKS[pipe] = threading.Lock()
        return lock
