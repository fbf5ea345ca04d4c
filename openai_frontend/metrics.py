"""Prometheus metrics of the frontend (one registry per app, so tests can build many apps)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class ReplicaView(Protocol):
    """What the replica metrics read of one Triton replica (``engine.replicas.Replica``)."""

    address: str
    healthy: bool
    outstanding: int
    requests: int
    errors: int


class ReplicaCollector(Collector):
    """Per-replica metrics of the frontend's Triton replicas (label ``replica`` = ``host:port``),
    read from the replica set at each scrape (no bookkeeping of their own; a replica that left a
    DNS name is listed until its last request ended):

    * ``omni_frontend_triton_replica_requests_total``: Triton calls (unary calls, streams)
      started on the replica;
    * ``omni_frontend_triton_replica_errors_total``: those that ended with an error;
    * ``omni_frontend_triton_replica_in_flight``: calls on it now;
    * ``omni_frontend_triton_replica_up``: 1 while it takes new requests, 0 while drained.

    Args:
        replicas: ``() -> the replicas`` (``ReplicaSet.all_known``).
    """

    def __init__(self, replicas: Callable[[], Sequence[ReplicaView]]):
        self._replicas = replicas

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily("omni_frontend_triton_replica_requests",
                                       "Triton calls (unary calls and streams) started on each replica",
                                       labels=["replica"])
        errors = CounterMetricFamily("omni_frontend_triton_replica_errors",
                                     "Triton calls on each replica that ended with an error", labels=["replica"])
        in_flight = GaugeMetricFamily("omni_frontend_triton_replica_in_flight",
                                      "Triton calls in flight on each replica", labels=["replica"])
        up = GaugeMetricFamily("omni_frontend_triton_replica_up",
                               "1 while the replica takes new requests, 0 while it is drained (unready, "
                               "unreachable)", labels=["replica"])
        for r in self._replicas():
            requests.add_metric([r.address], r.requests)
            errors.add_metric([r.address], r.errors)
            in_flight.add_metric([r.address], r.outstanding)
            up.add_metric([r.address], 1.0 if r.healthy else 0.0)
        return [requests, errors, in_flight, up]


class FrontendMetrics:
    def __init__(self, admission: Any = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "omni_frontend_speech_requests",
            "Speech requests by model, mode and outcome",
            ["model", "mode", "outcome"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "omni_frontend_rejected_requests",
            "Requests rejected by admission control (429)",
            registry=self.registry,
        )
        self.ttfa = Histogram(
            "omni_frontend_time_to_first_audio_seconds",
            "Time from request admission to the first audio chunk from Triton",
            ["model"],
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "omni_frontend_audio_seconds",
            "Seconds of audio produced",
            ["model"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "omni_frontend_inflight_requests",
            "Requests (speech, chat, completions) holding an admission slot",
            registry=self.registry,
        )
        self.send_timeouts = Counter(
            "omni_frontend_send_timeouts",
            "HTTP responses abandoned because the client stopped reading (--send-timeout-s)",
            registry=self.registry,
        )
        self.generation_requests = Counter(
            "omni_frontend_generation_requests",
            "Chat / completion requests by model, endpoint (chat|completions), mode and outcome",
            ["model", "endpoint", "mode", "outcome"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "omni_frontend_time_to_first_token_seconds",
            "Time from request admission to the first text from Triton (TTFT)",
            ["model"],
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.itl = Histogram(
            "omni_frontend_inter_token_latency_seconds",
            "Time between successive text chunks of one choice from Triton (ITL; single-choice requests)",
            ["model"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.tpot = Histogram(
            "omni_frontend_time_per_output_token_seconds",
            "Time per output token after the first: (last text - first text) / (completion tokens - 1) "
            "(TPOT; single-choice requests with at least 2 tokens)",
            ["model"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=self.registry,
        )
        self.realtime_sessions = Gauge(
            "omni_frontend_realtime_sessions",
            "WS /v1/realtime sessions open",
            registry=self.registry,
        )
        self.realtime_commit_to_first_audio = Histogram(
            "omni_frontend_realtime_commit_to_first_audio_seconds",
            "Realtime: input_audio_buffer.commit received -> first audio delta of the response after it sent",
            ["model"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.realtime_speech_stop_to_first_audio = Histogram(
            "omni_frontend_realtime_speech_stop_to_first_audio_seconds",
            "Realtime server VAD: speech stop detected -> first audio delta of the response it created sent",
            ["model"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.realtime_barge_in = Histogram(
            "omni_frontend_realtime_barge_in_seconds",
            "Realtime barge-in: the user's first voiced audio reaching the server (server VAD; its detection "
            "takes ~150 ms of speech) or response.cancel received -> the last audio delta of the cancelled "
            "response sent (0: none after it)",
            ["model", "reason"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.completion_tokens = Counter(
            "omni_frontend_completion_tokens",
            "Completion tokens generated (as reported by the stage)",
            ["model"],
            registry=self.registry,
        )
        self.transcription_requests = Counter(
            "omni_frontend_transcription_requests",
            "Transcription / translation requests by model, API (transcriptions|translations), mode "
            "(whole|stream) and outcome",
            ["model", "api", "mode", "outcome"],
            registry=self.registry,
        )
        self.transcribed_audio_seconds = Counter(
            "omni_frontend_transcribed_audio_seconds",
            "Seconds of uploaded audio transcribed or translated (requests that succeeded)",
            ["model"],
            registry=self.registry,
        )
        self.image_requests = Counter(
            "omni_frontend_image_requests",
            "Image requests by model, API (generations/edits) and outcome",
            ["model", "api", "outcome"],
            registry=self.registry,
        )
        self.images = Counter(
            "omni_frontend_images",
            "Images generated",
            ["model"],
            registry=self.registry,
        )
        self.video_requests = Counter(
            "omni_frontend_video_requests",
            "Video requests by model, API (jobs/sync) and outcome",
            ["model", "api", "outcome"],
            registry=self.registry,
        )
        self.video_jobs = Counter(
            "omni_frontend_video_jobs",
            "Video jobs that ended, by outcome (completed, failed, expired)",
            ["outcome"],
            registry=self.registry,
        )
        self.video_store_errors = Counter(
            "omni_frontend_video_store_errors",
            "Database errors the video job runner survived (retried with backoff), by operation "
            "(dispatch, progress, complete, fail, requeue, check, sweep)",
            ["operation"],
            registry=self.registry,
        )
        self.video_store_failing = Gauge(
            "omni_frontend_video_store_failing",
            "1 while the video job runner retries a failing database (queued jobs wait), else 0",
            registry=self.registry,
        )
        # on-demand models (omni_triton.serve.on_demand; docs/metrics.md "On-demand models")
        self.model_loads = Counter(
            "omni_frontend_model_loads",
            "Loads of on-demand pipelines by model and outcome (ok|failed)",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.model_unloads = Counter(
            "omni_frontend_model_unloads",
            "Unloads of on-demand pipelines by model and reason (keep_alive|evicted)",
            ["model", "reason"],
            registry=self.registry,
        )
        self.model_load_seconds = Histogram(
            "omni_frontend_model_load_seconds",
            "Time to load an on-demand pipeline (its closure's models not yet READY), ok or failed",
            ["model"],
            buckets=(0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=self.registry,
        )
        self.model_state = Gauge(
            "omni_frontend_model_state",
            "1 for the state (loaded|loading|unloaded|failed) each pipeline is in, 0 for the others",
            ["model", "state"],
            registry=self.registry,
        )
        self.models_pss_mib = Gauge(
            "omni_frontend_models_pss_mib",
            "Sum of pss_mib (config parameter: measured PSS, MiB) of the models the loaded pipelines hold",
            registry=self.registry,
        )
        if admission is not None:
            self.inflight.set_function(lambda: admission.inflight)

    def watch_replicas(self, replicas: Callable[[], Sequence[ReplicaView]]) -> None:
        """Export the per-replica metrics of ``replicas`` (:class:`ReplicaCollector`); once."""
        self.registry.register(ReplicaCollector(replicas))

    def loaded(self, pipeline: str, outcome: str, seconds: float) -> None:
        """``omni_triton.serve.on_demand.Events``: a load ended (``ok`` or ``failed``)."""
        self.model_loads.labels(pipeline, outcome).inc()
        self.model_load_seconds.labels(pipeline).observe(seconds)

    def unloaded(self, pipeline: str, reason: str) -> None:
        """``Events``: an unload (``keep_alive`` or ``evicted``)."""
        self.model_unloads.labels(pipeline, reason).inc()

    def state(self, pipeline: str, state: str) -> None:
        """``Events``: ``pipeline`` entered ``state`` (an ``on_demand.State``, a ``str``)."""
        for s in ("loaded", "loading", "unloaded", "failed"):
            self.model_state.labels(pipeline, s).set(1.0 if s == str(getattr(state, "value", state)) else 0.0)
