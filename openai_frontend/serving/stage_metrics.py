"""``return_stage_metrics`` (vLLM-Omni's extension): per-stage timings of one request, read from
Triton's model statistics API, in vLLM-Omni's ``metrics`` shape.

Triton keeps cumulative statistics per model (``Engine.stage_statistics``). A :class:`StageClock`
takes a snapshot of every stage of the called model (``ModelInfo.stage_models``: an ensemble's
steps, a BLS model and its stages) before the request and another after it; the difference gives
per stage the requests it completed meanwhile and their mean queue and compute times. Alone on the
server these are the request's own times; under concurrency they are the means over every request
the stage finished in that window (``requests`` says how many). docs/vllm_omni_compat.md.

Shape (``metrics``)::

    {"stage_metrics": {"0": {"stage": "qwen_image_text_encoder", "requests": 1,
                             "queue_time_ms": 0.2, "compute_time_ms": 31.0, "stage_gen_time_ms": 31.0},
                       "1": {...}, ...,
                       "pipeline": {...summary: final_output_type, output_unit_type/count, ...}},
     "stage_durations": {"stage_0_gen_ms": 31.0, ..., "qwen_image_text_encoder": 31.0, ...}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine import Engine, ModelInfo, StageStatistics


def _ms(ns: int, count: int) -> float:
    return round(ns / count / 1e6, 3) if count > 0 else 0.0


def stage_deltas(stages: tuple[str, ...], before: dict[str, StageStatistics],
                 after: dict[str, StageStatistics]) -> dict[str, dict[str, Any]]:
    """``stage_metrics`` entries ``{"0": {...}, "1": {...}}`` (pipeline order) from two snapshots.

    Each entry: ``stage`` (the Triton model), ``requests`` (completed between the snapshots),
    ``queue_time_ms`` / ``compute_time_ms`` (mean per request, milliseconds) and
    ``stage_gen_time_ms`` (= ``compute_time_ms``, vLLM-Omni's name). A stage without statistics
    after the request gets zeros."""
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(stages):
        # no statistics before: the stage had none yet (counted from zero)
        a, b = before.get(name) or StageStatistics(), after.get(name)
        if b is None:
            done = queue = compute = 0
        else:
            done, queue, compute = b.success - a.success, b.queue_ns - a.queue_ns, b.compute_ns - a.compute_ns
        compute_ms = _ms(compute, done)
        out[str(i)] = {"stage": name, "requests": max(done, 0), "queue_time_ms": _ms(queue, done),
                       "compute_time_ms": compute_ms, "stage_gen_time_ms": compute_ms}
    return out


@dataclass
class StageClock:
    """Statistics snapshots around one request (``await StageClock.start(engine, info)``, then
    ``await clock.metrics(...)`` once it is done). ``enabled`` False: does nothing, returns None."""

    engine: Engine
    stages: tuple[str, ...]
    before: dict[str, StageStatistics]
    enabled: bool = True

    @classmethod
    async def start(cls, engine: Engine, info: ModelInfo, enabled: bool = True) -> StageClock:
        stages = info.stage_models
        before = await engine.stage_statistics(list(stages)) if enabled else {}
        return cls(engine, stages, before, enabled)

    async def metrics(self, pipeline: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The ``metrics`` object: ``stage_metrics`` (per stage, plus ``pipeline``, the request's
        summary, when given) and ``stage_durations`` (``stage_<i>_gen_ms`` and the Triton stage's
        name -> its mean compute milliseconds). None when disabled."""
        if not self.enabled:
            return None
        after = await self.engine.stage_statistics(list(self.stages))
        stages = stage_deltas(self.stages, self.before, after)
        # vLLM-Omni's stage_durations: stage_<i>_gen_ms (its stage clock) and one entry per named
        # pipeline part (its profiler's; here each Triton stage's mean compute time)
        durations = {f"stage_{i}_gen_ms": entry["stage_gen_time_ms"] for i, entry in stages.items()}
        durations.update({entry["stage"]: entry["compute_time_ms"] for entry in stages.values()})
        if pipeline is not None:
            stages["pipeline"] = pipeline
        return {"stage_metrics": stages, "stage_durations": durations}
