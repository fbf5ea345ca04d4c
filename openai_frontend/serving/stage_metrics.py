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

Images (the ensembles, :func:`image_stages`): each step's ``STAGE_COMPUTE_MS`` comes back as
an ensemble output of its own; a step's wall time per request cannot be measured there.
Triton's global statistics (before/after deltas of every stage's cumulative counters, which mixed
concurrent requests) are no longer used for ``return_stage_metrics``: every number here is the
request's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..engine import ModelInfo
from ..engine.protocol import GeneratedImage, GenerationChunk


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
        choice = self.choices.get(index)
        if choice is None:  # not setdefault: that would build a _Choice on every chunk
            choice = self.choices[index] = _Choice()
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
        ``wall_ms``, ``compute_ms`` (None if not reported) and ``stage_gen_time_ms`` (its exclusive
        share, see the module docstring); a stage that a called stage called (``called_by``: the
        qwen3_omni thinker under the talker) takes its wall time out of its caller's share, so the
        sum stays the same (at most the caller's share moves: the split assumes the inner wait
        fell inside the outer one)."""
        top = self.info.name
        bls = any(c.stage_metrics is not None for c in self.choices.values())
        totals: dict[str, dict[str, Any]] = {}

        def entry(name: str) -> dict[str, Any]:
            if name not in totals:
                totals[name] = {"calls": 0, "wall_ms": 0.0, "compute_ms": None, "called_by": None}
            return totals[name]

        for name in self.info.stage_models:
            entry(name)
        own: float | None = None
        for choice in self.choices.values():
            called = entry(top)
            called["calls"] += 1
            called["wall_ms"] += (choice.end or self.start) - self.start
            if choice.compute_ms is not None:
                called["compute_ms"] = (called["compute_ms"] or 0.0) + choice.compute_ms
            report = choice.stage_metrics or {}
            if isinstance(report.get("own_compute_ms"), (int, float)):
                own = (own or 0.0) + float(report["own_compute_ms"])
            for stage in report.get("stages") or []:
                if not isinstance(stage, dict) or not isinstance(stage.get("stage"), str):
                    continue
                s = entry(stage["stage"])
                if isinstance(stage.get("called_by"), str):
                    s["called_by"] = stage["called_by"]
                s["calls"] += int(stage.get("calls") or 0)
                s["wall_ms"] += float(stage.get("wall_ms") or 0.0) / 1000.0
                if isinstance(stage.get("compute_ms"), (int, float)):
                    s["compute_ms"] = (s["compute_ms"] or 0.0) + float(stage["compute_ms"])
        gens: dict[str, float] = {}
        for name, t in totals.items():
            if name == top and bls:
                gens[name] = (own if own is not None else t["compute_ms"]) or 0.0  # the BLS's own work
            else:
                gens[name] = t["wall_ms"] * 1000.0  # seconds were summed (frontend clock, BLS ms / 1000)
        for name, t in totals.items():  # a stage called by a called stage: its wait moves out of its caller's
            caller = t["called_by"]
            if caller in gens and caller != name:
                moved = min(gens[name], gens[caller])
                gens[name], gens[caller] = moved, gens[caller] - moved
        out: dict[str, dict[str, Any]] = {}
        for i, (name, t) in enumerate(totals.items()):
            compute = own if name == top and bls and own is not None else t["compute_ms"]
            e: dict[str, Any] = {"stage_id": i, "stage_name": name, "calls": t["calls"],
                                 "wall_ms": _r(t["wall_ms"] * 1000.0),
                                 "compute_ms": _r(compute) if compute is not None else None,
                                 "stage_gen_time_ms": _r(gens[name])}
            if t["called_by"]:
                e["called_by"] = t["called_by"]
            out[str(i)] = e
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


def image_stages(info: ModelInfo, images: list[GeneratedImage]) -> dict[str, Any]:
    """The ``metrics`` object of an image request on an ensemble (``info.ensemble_steps``): one
    ensemble request per image, each step's ``STAGE_COMPUTE_MS`` mapped to an ensemble output
    (``engine.GeneratedImage.stage_compute_ms``), summed over the images per step.

    Triton runs an ensemble's steps itself: the per-request compute of each step is all there is.
    A step's wall or queue time for one request cannot be measured (no code of ours runs between
    the steps; Triton 2.51 has no per-response timestamps), so entries have ``wall_ms`` None and
    ``stage_gen_time_ms`` = ``compute_ms``. The steps of one image run one after another (a
    chain), and a batched step gives each request its share of the batch's time, so the steps add
    up to no more than the image's wall time (``request_wall_ms``: the slowest image's ensemble
    request, from the frontend)."""
    stages: dict[str, dict[str, Any]] = {}
    for i, step in enumerate(info.ensemble_steps):
        values = [im.stage_compute_ms[step] for im in images if step in im.stage_compute_ms]
        compute = _r(sum(values)) if values else None
        stages[str(i)] = {"stage_id": i, "stage_name": step, "calls": len(images), "wall_ms": None,
                          "compute_ms": compute, "stage_gen_time_ms": compute or 0.0}
    return {"stage_metrics": stages, "stage_durations": durations(stages),
            "stage_total_ms": _r(sum(e["stage_gen_time_ms"] for e in stages.values())),
            "request_wall_ms": _r(max((im.wall_s for im in images), default=0.0) * 1000.0), "source": "pipeline"}
