"""``return_stage_metrics`` (vLLM-Omni's extension): per-stage timings of one request in
vLLM-Omni's ``metrics`` shape. docs/metrics.md "Per-request stage metrics",
docs/vllm_omni_compat.md.

Measured inside the pipeline, per request (:class:`RequestStages`, chat and chat-with-audio):

- every stage reports its own compute for the request (``STAGE_COMPUTE_MS``, cumulative, on its
  responses: ``omni_triton.adapters.stream`` / ``batched`` / ``batched_stream``);
- a BLS model times each stage call it makes for the request (wall ms it waited, calls, and the
  callee's compute: ``omni_triton.adapters.bls.StageLedger``) and sends that as ``STAGE_METRICS``
  (JSON) on its last response, with its own compute;
- the frontend measures the called model's wall time (request sent to last response).

Shape (``metrics``)::

    {"stage_metrics": {"0": {"stage_id": 0, "stage_name": "qwen3_omni", "calls": 1,
                             "wall_ms": 812.0, "compute_ms": 3.1, "stage_gen_time_ms": 3.1},
                       "1": {"stage_id": 1, "stage_name": "qwen3_omni_thinker", "calls": 1,
                             "wall_ms": 300.2, "compute_ms": 296.0, "stage_gen_time_ms": 300.2}, ...},
     "stage_durations": {"stage_0_gen_ms": 3.1, "qwen3_omni_ms": 3.1, "stage_1_gen_ms": 300.2, ...},
     "stage_total_ms": 700.5, "request_wall_ms": 812.0, "source": "pipeline",
     "final_output_type": ..., "num_tokens_in": ..., "num_tokens_out": ...}

``stage_gen_time_ms`` (vLLM-Omni's per-stage time, what its client prints and sums) is each
stage's *exclusive* share of the request's timeline, so the stages add up to no more than the
request's wall time (and so its E2EL): a called stage's ``wall_ms`` as its BLS waited on it, the
BLS's own ``compute_ms``, a single model's whole ``wall_ms``. ``compute_ms`` is the stage's own
compute (null when it reports none: ``llm`` runs every request in vLLM's engine loop); stages of
a streaming pipeline compute at once, so computes may add up to more than the wall time.

Triton's global statistics (:class:`StageClock`, before/after snapshots of every stage: means over
every request a stage finished meanwhile) remain only for the image ensembles, whose steps Triton
runs itself: an ensemble has no code that could time a step per request. Their entries say
``"source": "triton_statistics"``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..engine import Engine, ModelInfo, StageStatistics
from ..engine.protocol import GenerationChunk


def _ms(ns: int, count: int) -> float:
    return round(ns / count / 1e6, 3) if count > 0 else 0.0


def _r(value: float) -> float:
    return round(value, 3)


def durations(stages: dict[str, dict[str, Any]]) -> dict[str, float]:
    """vLLM-Omni's ``stage_durations`` from ``stage_metrics`` entries: ``stage_<i>_gen_ms`` and
    ``<stage name>_ms``, both the entry's ``stage_gen_time_ms`` (every key ends in ``_ms``: the
    client prints a key without that suffix as seconds)."""
    out: dict[str, float] = {}
    for i, entry in stages.items():
        out[f"stage_{i}_gen_ms"] = entry["stage_gen_time_ms"]
        out[f"{entry['stage_name']}_ms"] = entry["stage_gen_time_ms"]
    return out


@dataclass
class _Choice:
    """What one Triton request (one choice) reported."""

    end: float | None = None  # time.monotonic() of its last response
    compute_ms: float | None = None  # its STAGE_COMPUTE_MS (latest: cumulative)
    stage_metrics: dict[str, Any] | None = None  # its STAGE_METRICS


@dataclass
class RequestStages:
    """Per-request stage metrics of one HTTP request (its ``n`` choices are ``n`` Triton requests
    to ``info``: their numbers are summed per stage). ``observe`` each chunk as it arrives, then
    :meth:`metrics`. ``enabled`` False: records nothing, :meth:`metrics` returns None."""

    info: ModelInfo
    enabled: bool = True
    start: float = field(default_factory=time.monotonic)
    choices: dict[int, _Choice] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget what was observed and restart the clock (the request is tried again)."""
        self.choices.clear()
        self.start = time.monotonic()

    def observe(self, index: int, chunk: GenerationChunk | None) -> None:
        """Record choice ``index``'s chunk (``None``: its end)."""
        if not self.enabled:
            return
        choice = self.choices.setdefault(index, _Choice())
        choice.end = time.monotonic()
        if chunk is None:
            return
        if chunk.stage_compute_ms is not None:
            choice.compute_ms = chunk.stage_compute_ms
        if chunk.stage_metrics is not None:
            choice.stage_metrics = chunk.stage_metrics

    def stages(self) -> dict[str, dict[str, Any]]:
        """The ``stage_metrics`` entries ``{"0": {...}, ...}``: the called model first, then every
        stage its BLS called (those ``ModelInfo.stage_models`` names first, in that order; one
        never called has ``calls`` 0), each with ``stage_id``, ``stage_name``, ``calls``,
        ``wall_ms``, ``compute_ms`` (None if not reported) and ``stage_gen_time_ms``."""
        top = self.info.name
        bls = any(c.stage_metrics is not None for c in self.choices.values())
        totals: dict[str, dict[str, Any]] = {}

        def entry(name: str) -> dict[str, Any]:
            if name not in totals:
                totals[name] = {"calls": 0, "wall_ms": 0.0, "compute_ms": None}
            return totals[name]

        for name in self.info.stage_models:
            entry(name)
        own: float | None = None
        for choice in self.choices.values():
            e = entry(top)
            e["calls"] += 1
            e["wall_ms"] += (choice.end or self.start) - self.start
            if choice.compute_ms is not None:
                e["compute_ms"] = (e["compute_ms"] or 0.0) + choice.compute_ms
            report = choice.stage_metrics or {}
            if isinstance(report.get("own_compute_ms"), (int, float)):
                own = (own or 0.0) + float(report["own_compute_ms"])
            for stage in report.get("stages") or []:
                if not isinstance(stage, dict) or not isinstance(stage.get("stage"), str):
                    continue
                s = entry(stage["stage"])
                s["calls"] += int(stage.get("calls") or 0)
                s["wall_ms"] += float(stage.get("wall_ms") or 0.0) / 1000.0
                if isinstance(stage.get("compute_ms"), (int, float)):
                    s["compute_ms"] = (s["compute_ms"] or 0.0) + float(stage["compute_ms"])
        out: dict[str, dict[str, Any]] = {}
        for i, (name, t) in enumerate(totals.items()):
            wall_ms = t["wall_ms"] * 1000.0  # seconds were summed (frontend clock and BLS ms / 1000)
            compute = t["compute_ms"]
            if name == top and bls:
                compute = own if own is not None else compute
                gen = compute or 0.0  # the BLS's exclusive part: its own work
            else:
                gen = wall_ms
            out[str(i)] = {"stage_id": i, "stage_name": name, "calls": t["calls"], "wall_ms": _r(wall_ms),
                           "compute_ms": _r(compute) if compute is not None else None,
                           "stage_gen_time_ms": _r(gen)}
        return out

    def metrics(self, summary: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The ``metrics`` object (see the module docstring); ``summary``: the request's output
        fields (``final_output_type``, token counts ...), added at its top level. None when
        disabled."""
        if not self.enabled:
            return None
        stages = self.stages()
        ends = [c.end for c in self.choices.values() if c.end is not None]
        return {"stage_metrics": stages, "stage_durations": durations(stages),
                "stage_total_ms": _r(sum(e["stage_gen_time_ms"] for e in stages.values())),
                "request_wall_ms": _r(((max(ends) if ends else self.start) - self.start) * 1000.0),
                "source": "pipeline", **(summary or {})}


def stage_deltas(stages: tuple[str, ...], before: dict[str, StageStatistics],
                 after: dict[str, StageStatistics]) -> dict[str, dict[str, Any]]:
    """``stage_metrics`` entries ``{"0": {...}, "1": {...}}`` (pipeline order) from two snapshots
    of Triton's global statistics (the ensembles only).

    Each entry: ``stage_id``, ``stage_name`` (the Triton model), ``requests`` (completed between
    the snapshots: this request's and any other's), ``queue_time_ms`` / ``compute_time_ms`` (mean
    per request, milliseconds), ``stage_gen_time_ms`` (= ``compute_time_ms``, vLLM-Omni's name)
    and ``source: "triton_statistics"``. A stage without statistics after the request gets zeros."""
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(stages):
        # no statistics before: the stage had none yet (counted from zero)
        a, b = before.get(name) or StageStatistics(), after.get(name)
        if b is None:
            done = queue = compute = 0
        else:
            done, queue, compute = b.success - a.success, b.queue_ns - a.queue_ns, b.compute_ns - a.compute_ns
        compute_ms = _ms(compute, done)
        out[str(i)] = {"stage_id": i, "stage_name": name, "requests": max(done, 0),
                       "queue_time_ms": _ms(queue, done), "compute_time_ms": compute_ms,
                       "stage_gen_time_ms": compute_ms, "source": "triton_statistics"}
    return out


@dataclass
class StageClock:
    """Statistics snapshots around one request (``await StageClock.start(engine, info)``, then
    ``await clock.metrics(...)`` once it is done): the ensembles' path (see the module
    docstring). ``enabled`` False: does nothing, returns None."""

    engine: Engine
    stages: tuple[str, ...]
    before: dict[str, StageStatistics]
    enabled: bool = True

    @classmethod
    async def start(cls, engine: Engine, info: ModelInfo, enabled: bool = True) -> StageClock:
        stages = info.stage_models
        before = await engine.stage_statistics(list(stages)) if enabled else {}
        return cls(engine, stages, before, enabled)

    async def metrics(self) -> dict[str, Any] | None:
        """The ``metrics`` object: ``stage_metrics`` (per stage) and ``stage_durations``
        (:func:`durations`). None when disabled."""
        if not self.enabled:
            return None
        after = await self.engine.stage_statistics(list(self.stages))
        stages = stage_deltas(self.stages, self.before, after)
        return {"stage_metrics": stages, "stage_durations": durations(stages), "source": "triton_statistics"}
