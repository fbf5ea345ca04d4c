"""The stage metrics every model reports on Triton's metrics endpoint (python_backend custom
metrics), after vLLM-Omni's metric design: per stage, per audio stream, per BLS transfer.

:data:`METRICS` is the one table of names, kinds, units and label sets; ``docs/metrics.md``
documents each (a unit test keeps the two in step). The adapter bases feed :class:`Telemetry`:
``DecoupledStage`` (requests, duration, finish reason, and the audio of every response that
carries AUDIO + SAMPLE_RATE), ``BatchedStage`` (duration, batch size), ``adapters.bls``
(bytes and time of the tensors passed between stages). Every metric carries the labels ``model``
and ``instance`` (several instances of a model are several stub processes, each with its own
series); updates go through the stub's call lock (``LockedMetric``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from omni_triton.adapters.triton_io import LockedMetric, triton_lock
from omni_triton.contracts.tensors import AUDIO, FINISH_REASON, SAMPLE_RATE, first_int, first_value
from omni_triton.runtime.playback import PlaybackClock

#: Seconds: request durations, TTFP, stage step times.
LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
#: Real-time factor (processing seconds per audio second).
RTF_BUCKETS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
#: Seconds of audio per stream.
AUDIO_BUCKETS = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 300.0]
#: Requests per executed batch.
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64]


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: ``kind`` counter|gauge|histogram, ``unit`` for the docs, the extra
    labels besides ``model`` and ``instance``, histogram ``buckets``."""

    kind: str
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


METRICS: dict[str, MetricSpec] = {
    # every stage
    "omni_stage_requests_running": MetricSpec("gauge", "requests", "Requests being processed by the stage now"),
    "omni_stage_requests_waiting": MetricSpec(
        "gauge", "requests", "Requests accepted by the stage's execute and waiting for a worker thread (Triton's "
        "nv_inference_pending_request_count counts those still in Triton's queue)"),
    "omni_stage_request_duration_seconds": MetricSpec(
        "histogram", "seconds", "End-to-end time of a request in the stage, from execute to its last response",
        buckets=tuple(LATENCY_BUCKETS)),
    "omni_stage_requests_finished_total": MetricSpec(
        "counter", "requests", "Requests finished, by reason: stop (done), length (a token/frame cap), abort "
        "(cancelled), invalid (INVALID_ARG), error (INTERNAL)", ("reason",)),
    "omni_stage_batch_size": MetricSpec("histogram", "requests", "Requests per executed batch (batched stages; "
                                        "the diffusion denoisers: requests per pipeline call)",
                                        buckets=tuple(BATCH_BUCKETS)),
    # audio streams (every stage whose responses carry AUDIO + SAMPLE_RATE)
    "omni_audio_ttfp_seconds": MetricSpec("histogram", "seconds", "Time to first audio packet: request start to "
                                          "the first non-empty AUDIO response", buckets=tuple(LATENCY_BUCKETS)),
    "omni_audio_rtf": MetricSpec("histogram", "ratio", "Real-time factor of a finished stream: processing "
                                 "seconds / audio seconds", buckets=tuple(RTF_BUCKETS)),
    "omni_audio_duration_seconds": MetricSpec("histogram", "seconds", "Seconds of audio per finished stream",
                                              buckets=tuple(AUDIO_BUCKETS)),
    "omni_audio_underrun_seconds_total": MetricSpec(
        "counter", "seconds", "Seconds a client playing each stream in real time from its first chunk would "
        "have stalled (omni_triton/runtime/playback.py)"),
    "omni_audio_streams_total": MetricSpec(
        "counter", "streams", "Finished audio streams, by continuity: continuous=false when a real-time player "
        "would have stalled for more than 100 ms at once", ("continuous",)),
    # diffusion denoisers (image and video): one pipeline call runs a batch of compatible requests
    "omni_diffusion_steps_total": MetricSpec("counter", "steps", "Denoising steps run (a pipeline call's step "
                                             "counts once, whatever its batch size)"),
    "omni_diffusion_step_seconds": MetricSpec("histogram", "seconds", "Wall time of one denoising step of a "
                                              "pipeline call (its whole batch)", buckets=tuple(LATENCY_BUCKETS)),
    # BLS transfers (the caller's view; target = the stage called)
    "omni_bls_calls_total": MetricSpec("counter", "calls", "BLS requests sent to another stage", ("target",)),
    "omni_bls_transfer_bytes_total": MetricSpec(
        "counter", "bytes", "Bytes of tensors passed to (direction=sent) and from (direction=received) another "
        "stage by BLS", ("target", "direction")),
    "omni_bls_transfer_seconds_total": MetricSpec(
        "counter", "seconds", "Seconds the caller waited on BLS calls and stream responses of another stage",
        ("target",)),
}


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


def nbytes(array) -> int:
    """Bytes of a tensor's payload: ``nbytes`` for numeric arrays, the summed lengths of the
    elements of BYTES (object) arrays."""
    array = np.asarray(array)
    if array.dtype == np.object_:
        return int(sum(len(x) if isinstance(x, (bytes, str)) else 0 for x in array.reshape(-1)))
    return int(array.nbytes)


class Telemetry:
    """The :data:`METRICS` of one model instance, created on first use (per label set).

    Args:
        model: the model's name (label ``model``).
        instance: the instance's name (label ``instance``).
    """

    def __init__(self, model: str, instance: str):
        self.labels = {"model": model, "instance": instance}
        self._families: dict = {}
        self._metrics: dict = {}
        self._gauges: dict[str, float] = {}
        self._lock = threading.Lock()

    def _metric(self, name: str, extra: dict[str, str]) -> LockedMetric:
        key = (name, tuple(sorted(extra.items())))
        metric = self._metrics.get(key)
        if metric is not None:
            return metric
        spec = METRICS[name]
        if set(extra) != set(spec.labels):
            raise ValueError(f"{name} takes labels {spec.labels}, got {tuple(extra)}")
        pb = _pb()
        with self._lock, triton_lock("metrics"):
            metric = self._metrics.get(key)
            if metric is None:
                family = self._families.get(name)
                if family is None:
                    kind = {"counter": pb.MetricFamily.COUNTER, "gauge": pb.MetricFamily.GAUGE,
                            "histogram": pb.MetricFamily.HISTOGRAM}[spec.kind]
                    family = self._families[name] = pb.MetricFamily(name, spec.description, kind)
                labels = {**self.labels, **extra}
                raw = family.Metric(labels=labels, buckets=list(spec.buckets)) if spec.buckets else \
                    family.Metric(labels=labels)
                metric = self._metrics[key] = LockedMetric(raw)
        return metric

    def count(self, name: str, value: float = 1, **labels: str) -> None:
        """Add ``value`` to counter ``name`` (created even when ``value`` is 0, so a counter that
        stays at 0, e.g. no underrun yet, is on the endpoint as 0 rather than absent)."""
        metric = self._metric(name, labels)
        if value:
            metric.increment(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        """One observation of histogram ``name``."""
        self._metric(name, labels).observe(value)

    def add(self, name: str, delta: float) -> None:
        """Move gauge ``name`` by ``delta`` (Triton gauges are set: the value is kept here)."""
        with self._lock:
            value = self._gauges[name] = self._gauges.get(name, 0) + delta
        self._metric(name, {}).set(value)

    def close(self) -> None:
        """Drop the families (before the stub's shared memory goes; see ``StageMetrics``)."""
        self._metrics.clear()
        self._families.clear()


class RequestTelemetry:
    """One request's view: start time, audio playback clock, finish reason.

    Args:
        telemetry: the instance's :class:`Telemetry`, or ``None`` (metrics off).
        start: when the request reached ``execute`` (``time.monotonic()`` seconds).
    """

    def __init__(self, telemetry: Telemetry | None, start: float | None = None):
        self.telemetry = telemetry
        self.start = time.monotonic() if start is None else start
        self.playback = PlaybackClock(self.start)
        self.finish_reason: str | None = None

    def on_outputs(self, outputs) -> None:
        """Look at one response's outputs: AUDIO (float PCM) with SAMPLE_RATE feeds the clock;
        FINISH_REASON (``"length"``, ``"abort"`` ...) is remembered."""
        audio, rate = outputs.get(AUDIO), outputs.get(SAMPLE_RATE)
        if audio is not None and rate is not None and getattr(audio, "size", 0):
            self.playback.add(time.monotonic(), int(audio.size), first_int(rate))
        reason = outputs.get(FINISH_REASON)
        if reason is not None:
            text = reason if isinstance(reason, str) else (first_value(reason) or "")
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            if text:
                self.finish_reason = text

    def finish(self, reason: str) -> None:
        """The request ended: ``reason`` (stop, abort, invalid, error; a stream's own
        FINISH_REASON such as ``length`` wins over ``stop``). Records duration, reason and, for an
        audio stream, TTFP, RTF, duration, underrun and continuity."""
        t = self.telemetry
        if t is None:
            return
        end = time.monotonic()
        if reason == "stop" and self.finish_reason in ("length", "abort"):
            reason = self.finish_reason
        t.observe("omni_stage_request_duration_seconds", end - self.start)
        t.count("omni_stage_requests_finished_total", 1, reason=reason)
        clock = self.playback
        if clock.first_audio is not None:
            t.observe("omni_audio_ttfp_seconds", clock.ttfp_s)
            t.observe("omni_audio_rtf", clock.rtf(end))
            t.observe("omni_audio_duration_seconds", clock.audio_s)
            t.count("omni_audio_underrun_seconds_total", clock.underrun_s)
            t.count("omni_audio_streams_total", 1, continuous="true" if clock.continuous else "false")
