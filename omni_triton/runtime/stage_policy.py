"""Execution policies of a stage, read from its ``config.pbtxt`` parameters (torch-free, no Triton).

The stage bases (``omni_triton.adapters.stream``, ``omni_triton.adapters.batched``) compose these:

- :class:`ExecutionPolicy`: where a decoupled stage runs its requests (``execute``, a worker pool
  or the deadline scheduler), with the BLS one-thread rule, pacing and instance balance, all
  checked at load;
- :class:`PlaybackPolicy`: the deadline model (``deadline_unit``) of one request and how much of
  its playback one output adds;
- :func:`due_in_s`: a batched stage's "due" input (ms) as seconds.

Every rule and error message here was inline in ``DecoupledStage.initialize`` before; see
``docs/scheduling.md`` for the measurements behind them.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_triton.contracts.tensors import AUDIO, SAMPLE_RATE
from omni_triton.runtime import scheduling

_BLS = "see omni_triton/adapters/bls.py"


@dataclass(frozen=True)
class ExecutionPolicy:
    """How a decoupled stage runs its requests.

    Attributes:
        pool_workers: threads of a worker pool (0: each request runs inside ``execute``).
        scheduler_workers: threads of the deadline :class:`~omni_triton.runtime.scheduling.StepScheduler`,
            or 0 (no scheduler: FIFO in ``execute`` or on the pool).
        max_lead_s: seconds a paced request may be computed ahead of its deadline (``None``: no
            pacing); only used with the scheduler.
        balance_max_wait_s: the instance balance's longest wait in ``execute`` (s), or ``None``
            (no instance balance).
    """

    pool_workers: int = 0
    scheduler_workers: int = 0
    max_lead_s: float | None = None
    balance_max_wait_s: float | None = None

    @classmethod
    def from_params(cls, model: str, params: Mapping[str, str], *, default_workers: int = 0,
                    reads_bls_streams: bool = False, bls_threads_unchecked: bool = False,
                    own_dispatch: bool = False, warn: Callable[[str], None] | None = None) -> ExecutionPolicy:
        """The policy of ``model`` from its config parameters ``workers`` (else ``default_workers``),
        ``scheduling`` (and ``OMNI_TRITON_SCHEDULING``), ``scheduler_workers`` (default: the pool's
        size, else 1), ``max_lead_ms``, ``balance_instances`` and ``balance_max_wait_ms`` (default
        30000).

        Args:
            reads_bls_streams: the stage reads decoupled BLS streams, so one thread must read them
                all (``omni_triton/adapters/bls.py``, "One thread").
            bls_threads_unchecked: ``OMNI_TRITON_BLS_THREADS=any`` (reproductions only) lifts the
                one-thread rule.
            own_dispatch: the stage dispatches its jobs itself (``llm``): ``scheduling=deadline``
                is ignored (``warn`` is told).
            warn: called with a message when a setting is ignored.

        Raises:
            RuntimeError: a pool or more than one scheduler worker for a stage that reads BLS
                streams, or ``balance_instances`` for one.
            ValueError: a negative ``max_lead_ms`` or ``balance_max_wait_ms``, non-numeric values.
        """
        one_thread = reads_bls_streams and not bls_threads_unchecked
        n = int(params.get("workers", default_workers))
        if n > 0 and one_thread:
            raise RuntimeError(f"{model}: workers = {n}, but a stage that reads decoupled BLS "
                               "streams must run them on one thread (workers 0; raise the instance count "
                               f"instead): {_BLS}")
        if scheduling.scheduling_policy(params) is not scheduling.Policy.DEADLINE:
            return cls(pool_workers=n)
        if own_dispatch:
            if warn is not None:
                warn(f"{model}: scheduling=deadline ignored (the stage dispatches itself)")
            return cls(pool_workers=n)
        workers = int(params.get("scheduler_workers", n if n > 0 else 1))
        if one_thread and workers != 1:
            raise RuntimeError(
                f"{model}: scheduler_workers = {workers}, but a stage that reads decoupled BLS "
                "streams must read them on one thread: scheduler_workers 1 (raise the instance count "
                f"instead); {_BLS}")
        lead = max_lead_s(model, params)
        wait = None
        if params.get("balance_instances", "false").lower() == "true":
            if reads_bls_streams:
                raise RuntimeError(
                    f"{model}: balance_instances holds execute's thread, which a stage that "
                    "reads decoupled BLS streams needs: on qwen3_omni_talker it made first audio slower even "
                    "at concurrency 1 (docs/scheduling.md, \"Instance balance\")")
            wait = float(params.get("balance_max_wait_ms", "30000")) / 1000.0
            if wait < 0:
                raise ValueError(f"{model}: balance_max_wait_ms must be >= 0")
        return cls(pool_workers=0, scheduler_workers=workers, max_lead_s=lead, balance_max_wait_s=wait)

    @property
    def scheduled(self) -> bool:
        """Whether requests run on the deadline scheduler."""
        return self.scheduler_workers > 0

    @property
    def queued(self) -> bool:
        """Whether ``execute`` hands requests to other threads (pool or scheduler): they wait
        there before they run (the ``omni_stage_requests_waiting`` gauge)."""
        return self.pool_workers > 0 or self.scheduled

    def step_scheduler(self, name: str) -> scheduling.StepScheduler | None:
        """A new deadline scheduler of this policy (its threads start), or ``None``."""
        if not self.scheduled:
            return None
        return scheduling.StepScheduler(self.scheduler_workers, scheduling.Policy.DEADLINE, name=name,
                                        max_lead_s=self.max_lead_s)


def max_lead_s(model: str, params: Mapping[str, str]) -> float | None:
    """Seconds a paced request may be computed ahead of its playback deadline: the config parameter
    ``max_lead_ms`` / 1000; ``None`` (no pacing) when absent or 0.

    Raises:
        ValueError: a negative or non-numeric ``max_lead_ms``.
    """
    ms = float(params.get("max_lead_ms", "0"))
    if ms < 0:
        raise ValueError(f"{model}: max_lead_ms must be >= 0, not {ms:g}")
    return ms / 1000.0 if ms > 0 else None


@dataclass(frozen=True)
class PlaybackPolicy:
    """The playback-deadline model of a stage's requests (config ``deadline_unit``).

    Attributes:
        model: the model's name (messages).
        params: its config parameters.
        frames_output: the output tensor whose rows are codec frames (``deadline_unit: frames``),
            set by the family adapter (e.g. ``CODES``); ``None`` when the stage emits no frames.
    """

    model: str
    params: Mapping[str, str]
    frames_output: str | None = None

    @property
    def unit(self) -> str:
        """``audio``, ``frames`` or ``tokens`` (default ``audio``)."""
        return self.params.get("deadline_unit", "audio")

    def deadline(self, arrival: float, paced: bool = False,
                 first_chunk_frames: int | None = None) -> scheduling.Deadline:
        """The deadline model of one request arriving at ``arrival`` (scheduler clock, s), from
        ``deadline_unit``, ``first_audio_budget_ms``, ``deadline_guard_ms`` and, for frames and
        tokens, ``first_chunk_frames``, ``chunk_frames``, ``frame_rate_hz``, ``low_water_ms``
        (the consumer's chunk schedule), for tokens also ``lead_tokens`` (default 1).

        ``paced`` (the request's ``PACED``) with ``low_water_ms`` > 0: the consumer cuts a chunk
        of at least ``first_chunk_frames`` frames whenever its listener runs low
        (:class:`~omni_triton.stages.chunking.ChunkSchedule`), so the frames after the first
        chunk are due in groups of ``first_chunk_frames``, each when the audio before it ends,
        not 25 at once (docs/scheduling.md, "Chunks that keep the listener fed").
        ``first_chunk_frames``: this request's first chunk (the consumer's dynamic first chunk,
        docs/scheduling.md "The first chunk"), instead of the config's.

        Raises:
            ValueError: an unknown ``deadline_unit``, ``frames`` without a ``frames_output``, or
                invalid numbers.
        """
        p = self.params
        budget = float(p.get("first_audio_budget_ms", "0")) / 1000.0
        guard = float(p.get("deadline_guard_ms", "0")) / 1000.0
        unit = self.unit
        if unit in ("frames", "tokens"):
            if unit == "frames" and self.frames_output is None:
                raise ValueError(f"{self.model}: deadline_unit frames, but the stage names no frames output")
            first = int(p.get("first_chunk_frames", "5")) if first_chunk_frames is None else int(first_chunk_frames)
            low_water = float(p.get("low_water_ms", "0")) > 0
            chunks = (first, first if paced and low_water else int(p.get("chunk_frames", "25")),
                      float(p.get("frame_rate_hz", "12.5")))
            if unit == "tokens":
                return scheduling.TokenDeadline(arrival, *chunks, int(p.get("lead_tokens", "1")), budget, guard)
            return scheduling.FrameDeadline(arrival, *chunks, budget, guard)
        if unit != "audio":
            raise ValueError(f"{self.model}: deadline_unit must be audio, frames or tokens, not {unit!r}")
        return scheduling.AudioDeadline(arrival, budget, guard)

    def amount(self, outputs: Mapping[str, Any] | None, final: bool = False) -> float:
        """What one step's output adds to its stream's deadline: codec frames (rows of
        ``frames_output``), seconds of audio (AUDIO samples / SAMPLE_RATE Hz), or for ``tokens``
        one token per step except the last (``final``: a paced thinker computes one token per
        step and its final step none); 0 for anything else (``None``: nothing sent)."""
        unit = self.unit
        if unit == "tokens":
            return 0.0 if final else 1.0
        if outputs is None:
            return 0.0
        if unit == "frames":
            frames = outputs.get(self.frames_output) if self.frames_output is not None else None
            return float(len(frames)) if frames is not None else 0.0
        audio, rate = outputs.get(AUDIO), outputs.get(SAMPLE_RATE)
        if audio is None or rate is None:
            return 0.0
        rate = int(np.asarray(rate).reshape(-1)[0])
        return float(np.asarray(audio).size) / rate if rate > 0 else 0.0


def due_in_s(value: Any, name: str) -> float:
    """Seconds until a batched request's result is due, from its optional due input ``name``
    (FP32 milliseconds, ``value`` its first element or ``None`` when absent; negative: overdue);
    0 when absent (now: arrival order among such requests).

    Raises:
        ValueError: the value is not finite.
    """
    if value is None:
        return 0.0
    due = float(value) / 1000.0
    if not math.isfinite(due):
        raise ValueError(f"{name} must be finite")
    return due
