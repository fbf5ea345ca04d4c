"""The decoupled-stage skeleton: one :class:`ResponseStream` per request and the
:class:`DecoupledStage` base every streaming ``TritonPythonModel`` binds.

A stage subclass says what it is (``stage``, ``input_error``, ``metric_specs``), how to load
(``setup``), how to turn a request into a job (``parse``, on the stub's main thread inside
``execute``) and how to produce responses (``generate``, a generator of output dicts). The base
does the rest, the same way for every stage: INVALID_ARG for the pipeline's input error, a
failure response for anything else, FINAL exactly once (never a send after it), cancellation
through ``ResponseStream.cancelled()`` (Triton's flag, and the cancel flag of a ``REQUEST_ID`` on
2.51 where a BLS caller cannot cancel), the requests/invalid/cancelled counters and the
``omni_stage_*`` telemetry, the execution policies of ``omni_triton.runtime.stage_policy`` (worker
pool, deadline scheduler, instance balance), ``finalize``. Every call into Triton goes through
``omni_triton.adapters.triton_io``.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_triton.adapters import bls
from omni_triton.adapters.bls import bls_threads_unchecked
from omni_triton.adapters.telemetry import RequestTelemetry, Telemetry
from omni_triton.adapters.triton_io import (
    StageMetrics,
    error_response,
    is_cancelled,
    model_parameters,
    optional_input,
    optional_str_input,
    send,
    tensors,
)
from omni_triton.contracts.tensors import PACED, REQUEST_ID, STAGE_COMPUTE_MS, STAGE_METRICS, InputError
from omni_triton.paths import server_run_dir
from omni_triton.runtime import scheduling
from omni_triton.runtime.cancel_flags import CancelFlags
from omni_triton.runtime.instance_balance import InstanceBalance
from omni_triton.runtime.stage_policy import ExecutionPolicy, PlaybackPolicy, max_lead_s


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


def declared_outputs(args: Mapping[str, Any]) -> frozenset[str]:
    """The output names of the model's config (``args["model_config"]``, Triton's JSON); empty
    when it is absent (tests that build a stage without a config)."""
    config = args.get("model_config")
    if not config:
        return frozenset()
    return frozenset(o["name"] for o in json.loads(config).get("output", []))


class Final(dict):
    """Outputs ``{name: array}`` of a stream's last response: sent with the FINAL flag."""


class ResponseStream:
    """The response side of one decoupled request.

    Sends go through the call lock; after FINAL every send is dropped (and logged), so a late
    callback can never send after the end. ``cancelled()`` polls Triton's cancellation (and the
    cancel flag of ``request_id``) and remembers a positive answer in ``cancel_seen``.

    Args:
        request: the ``pb_utils.InferenceRequest``.
        stage: name for logs and error messages.
        flags: ``CancelFlags`` of the server, or ``None``.
        request_id: the request's REQUEST_ID input (the id a BLS caller cancels), or ``None``.
        on_cancel: called once, when ``cancelled()`` first answers True (the stage's counter).
    """

    def __init__(self, request, stage: str, flags=None, request_id: str | None = None, on_cancel=None):
        self.request = request
        self.sender = request.get_response_sender()
        self.stage = stage
        self.flags = flags
        self.request_id = request_id
        self.final_sent = False
        self.cancel_seen = False
        self._on_cancel = on_cancel
        self._lock = threading.Lock()
        self.telemetry: RequestTelemetry | None = None  # set by the stage base
        self.paced = False  # set by the stage base: PACED (the realtime opt-in) and a deadline scheduler
        self.balanced = False  # counted in the instance balance (set by the stage base)
        #: this request's own compute and the stages it called (set by the stage base when the
        #: model declares STAGE_COMPUTE_MS; docs/metrics.md "Per-request stage metrics")
        self.ledger: bls.StageLedger | None = None
        #: a batched decoupled stage's share of its batch: (``time.perf_counter()`` at the batch's
        #: start, requests in it); its compute so far is the elapsed time / requests
        self.batch_share: tuple[float, int] | None = None
        #: shape of STAGE_COMPUTE_MS: [1], or [1, 1] with the batch dimension (a batched model)
        self.compute_shape: tuple[int, ...] = (1,)

    def cancelled(self) -> bool:
        """Whether the client (or the BLS caller, through the REQUEST_ID flag) cancelled."""
        if not self.cancel_seen:
            self.cancel_seen = is_cancelled(self.request) or bool(
                self.flags is not None and self.flags.is_cancelled(self.request_id))
            if self.cancel_seen and self._on_cancel is not None:
                self._on_cancel()
        return self.cancel_seen

    def barrier(self) -> bool:
        """One blocking round trip through the stub's stub->server utility queue
        (``request.is_cancelled()``), made only while this request is still open (no FINAL sent;
        the FINAL waits for it): when it returns, every message queued before it, e.g. a BLS
        response iterator's cleanup, has been processed (``omni_triton.adapters.bls``).

        Returns:
            True if the round trip was made; False when the FINAL was already sent (asking a
            closed request would touch a freed response factory in the server).
        """
        with self._lock:
            if self.final_sent:
                return False
            if is_cancelled(self.request) and not self.cancel_seen:
                self.cancel_seen = True
                if self._on_cancel is not None:
                    self._on_cancel()
            return True

    def _send(self, response, final: bool) -> bool:
        with self._lock:
            if self.final_sent:
                logging.getLogger(self.stage).warning("%s: response after FINAL dropped", self.stage)
                return False
            self.final_sent = final
        send(self.sender, response, flags=_pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        return True

    def send(self, outputs: Mapping[str, Any], final: bool = False) -> bool:
        """Send one response holding ``outputs`` (``{name: array or str}``); False if dropped.
        Audio in it (AUDIO + SAMPLE_RATE) is timed for the omni_audio_* metrics; the request's
        compute so far (:meth:`compute_ms`) is added as ``STAGE_COMPUTE_MS`` when known."""
        compute_ms = self.compute_ms()
        if compute_ms is not None:
            outputs = {**outputs, STAGE_COMPUTE_MS: np.full(self.compute_shape, compute_ms, dtype=np.float32)}
        sent = self._send(_pb().InferenceResponse(output_tensors=tensors(outputs)), final)
        if sent and self.telemetry is not None:
            self.telemetry.on_outputs(outputs)
        return sent

    def compute_ms(self) -> float | None:
        """This request's own compute so far, ms: the ledger's (its steps' time minus their waits
        on other stages) or its share of the running batch; None when not measured (the model
        does not declare ``STAGE_COMPUTE_MS``, or runs its requests in its own engine: ``llm``)."""
        if self.batch_share is not None:
            start, n = self.batch_share
            return (time.perf_counter() - start) * 1000.0 / max(n, 1)
        return self.ledger.own_compute_ms if self.ledger is not None else None

    def close(self) -> bool:
        """Send the FINAL flag alone (nothing if already sent)."""
        if self.final_sent:
            return False
        return self._send(None, True)

    def invalid(self, message: str) -> bool:
        """End with an INVALID_ARG error (HTTP 400 in the frontend)."""
        return self._send(error_response(message, invalid=True), True)

    def fail(self, exc: BaseException) -> bool:
        """End with an INTERNAL error for an unexpected exception (logged)."""
        logging.getLogger(self.stage).error("%s failed", self.stage, exc_info=exc)
        return self._send(error_response(f"{self.stage} failed: {exc}", invalid=False), True)


@dataclass(frozen=True)
class Accepted:
    """A parsed request: the stage's ``job`` and the request's ``stream``."""

    job: Any
    stream: ResponseStream


class DecoupledStage:
    """Base ``TritonPythonModel`` of a decoupled (streaming) stage.

    Subclasses set ``stage`` (name in messages), ``input_error`` (the pipeline's input-error
    class), ``metric_specs`` (``StageMetrics`` specs; ``requests``, ``invalid``, ``cancelled``
    are counted by the base when present; requests in progress are the
    ``omni_stage_requests_running`` and ``_waiting`` gauges of every stage), ``cancel_flags``
    (listen to the REQUEST_ID cancel flag), ``per_instance_metrics`` (label ``instance`` too),
    ``frames_output`` (the family's codec-frame output, for ``deadline_unit: frames``), and
    implement:

    - ``setup(args, params)``: load the model (``params``: config.pbtxt parameters);
    - ``parse(request) -> job``: read and validate the inputs (main thread; raise the input error);
    - ``generate(job, stream) -> Iterator[dict | Final]``: output dicts, one per response;
      poll ``stream.cancelled()`` at step boundaries and stop when it is True.

    ``workers`` (config parameter ``workers``, else the class default): 0 runs each request
    inside ``execute`` (talkers: the instance count is the concurrency); > 0 runs them on a pool
    (piper). ``dispatch`` may be overridden by stages with their own engine loop (``llm``), which
    then call ``finish`` when the job ends.

    ``reads_bls_streams``: the stage reads decoupled BLS streams (``llm_tts``, ``csm``, ``qwen3_omni``).
    Such a stage runs every request inside ``execute``, on the stub's one main thread, and gets
    its concurrency from its instance count (one stub process each): two threads of one stub
    reading decoupled BLS streams deadlock python_backend (``omni_triton/adapters/bls.py``, "One
    thread"). A ``workers`` > 0 for it is refused at load (``RuntimeError``).

    Playback-deadline scheduling (``omni_triton.runtime.scheduling``, docs/scheduling.md): when
    the config parameter ``scheduling`` is ``"deadline"`` (and ``OMNI_TRITON_SCHEDULING`` is not
    ``fifo``), ``execute`` hands each job to a :class:`~omni_triton.runtime.scheduling.StepScheduler`
    of ``scheduler_workers`` threads (default ``workers``, else 1) that steps the generators of
    all open requests one output at a time, earliest playback deadline first, so a new request's
    first chunk does not wait for other requests' later chunks. The deadline model comes from
    :meth:`playback_deadline` (config ``deadline_unit``: ``audio`` for AUDIO/SAMPLE_RATE outputs,
    ``frames`` for codec-frame outputs (the rows of the tensor the family names in
    ``frames_output``, e.g. CODES) decoded in ``first_chunk_frames``/``chunk_frames`` chunks at
    ``frame_rate_hz``, ``tokens`` for a thinker feeding a talker one token per frame:
    :class:`~omni_triton.runtime.scheduling.TokenDeadline`). Not for stages that have their own
    ``dispatch`` (logged, FIFO kept). A stage that reads BLS streams may be scheduled with
    ``scheduler_workers`` 1 only (else a load error): that one worker thread then opens and reads
    all its streams (``execute`` only parses), which keeps the one-thread rule.

    ``generate`` may yield ``None`` under the scheduler: a unit of work done with nothing to send
    (e.g. a thinker token whose text is held back); it is not sent and counts
    :meth:`playback_amount` ``(None)``.

    Pacing (opt-in per request): with the config parameter ``max_lead_ms`` > 0, a request whose
    optional ``PACED`` input is true (the frontend's ``stream_pacing: "realtime"``) is not
    computed more than that far ahead of its playback deadline (``StepScheduler``'s
    ``max_lead_s``). Every other request is work-conserving: stepped whenever nothing more
    urgent is queued, each output sent as soon as it is made.

    Instance balance: with the config parameter ``balance_instances`` ``"true"`` (under the
    scheduler), ``execute`` returns only once this instance is the least loaded of its siblings
    (fewest open streams, ties to the lowest instance name; never while it has none open, never
    longer than ``balance_max_wait_ms``, default 30000:
    :class:`~omni_triton.runtime.instance_balance.InstanceBalance`), so Triton hands the next
    request to a sibling instead of stacking streams on whichever instance's execute thread
    happened to be free. A negative or non-numeric ``balance_max_wait_ms`` is a load error, and so
    is ``balance_instances`` on a stage that ``reads_bls_streams`` (measured slower on qwen3_omni_talker).
    """

    stage = "stage"
    input_error: type[Exception] = InputError
    metric_specs: dict[str, tuple[str, str, str]] = {}
    per_instance_metrics = False
    cancel_flags = False
    workers = 0
    reads_bls_streams = False
    frames_output: str | None = None  # the output whose rows are codec frames (deadline_unit frames)

    def initialize(self, args):
        self.model_name = args["model_name"]
        instance = args.get("model_instance_name", self.model_name)
        self.params = model_parameters(args)
        declared = declared_outputs(args)
        self.reports_compute = STAGE_COMPUTE_MS in declared
        self.reports_stage_metrics = STAGE_METRICS in declared
        bls.ask_stage_metrics(self.reports_compute)
        self.setup(args, self.params)
        labels = {"model": self.model_name}
        if self.per_instance_metrics:
            labels["instance"] = args["model_instance_name"]
        self.metrics = StageMetrics(labels, **self.metric_specs)
        self.telemetry = Telemetry(self.model_name, instance)
        bls.report_to(self.telemetry)
        self.flags = CancelFlags.for_server() if self.cancel_flags else None
        self.policy = ExecutionPolicy.from_params(
            self.model_name, self.params, default_workers=self.workers, reads_bls_streams=self.reads_bls_streams,
            bls_threads_unchecked=bls_threads_unchecked(), own_dispatch=self._own_dispatch(),
            warn=logging.getLogger(self.stage).warning)
        self.playback = PlaybackPolicy(self.model_name, self.params, self.frames_output)
        if self.policy.scheduled:
            self.playback_deadline(0.0)  # validates the deadline parameters at load
        self.step_scheduler = self.policy.step_scheduler(self.stage)
        n = self.policy.pool_workers
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix=self.stage) if n > 0 else None
        self.balance = None
        if self.policy.balance_max_wait_s is not None:
            self.balance_max_wait_s = self.policy.balance_max_wait_s
            self.balance = InstanceBalance(server_run_dir(os.getppid()) / "load" / self.model_name, instance)

    def _own_dispatch(self) -> bool:
        """Whether the subclass dispatches its jobs itself (``llm``: its own engine loop)."""
        return type(self).dispatch is not DecoupledStage.dispatch

    def setup(self, args: dict, params: dict[str, str]) -> None:
        """Load the model; ``params`` are the config.pbtxt parameters."""

    def max_lead_s(self) -> float | None:
        """Seconds a paced request may be computed ahead of its playback deadline
        (:func:`~omni_triton.runtime.stage_policy.max_lead_s`).

        Raises:
            ValueError: a negative or non-numeric ``max_lead_ms``.
        """
        return max_lead_s(self.model_name, self.params)

    @staticmethod
    def paced(request) -> bool:
        """The request's optional ``PACED`` input (BOOL [1]); False when absent."""
        value = optional_input(request, PACED)
        return bool(value) if value is not None else False

    def parse(self, request) -> Any:
        raise NotImplementedError

    def generate(self, job, stream: ResponseStream) -> Iterator[Mapping[str, Any]]:
        raise NotImplementedError

    def execute(self, requests):
        for request in requests:
            accepted = self.accept(request)
            if accepted is not None:
                self.dispatch(accepted.job, accepted.stream)
        if self.balance is not None:
            # the next request goes to a less loaded sibling meanwhile; at most this long (a
            # stream that never ends must not hold this instance's execute for good)
            self.balance.wait_turn(timeout_s=self.balance_max_wait_s)
        return None

    def accept(self, request) -> Accepted | None:
        """Open ``request``'s :class:`ResponseStream` and parse it (on ``execute``'s thread).

        Returns:
            the job and its stream, counted as started (requests counter, the running or waiting
            gauge, the instance balance); ``None`` when the request was answered already: an
            INVALID_ARG for the input error (or ``UnicodeDecodeError``), an INTERNAL error for
            any other failure of ``parse``.
        """
        try:
            request_id = optional_str_input(request, REQUEST_ID) if self.cancel_flags else None
        except UnicodeDecodeError:
            request_id = None
        stream = ResponseStream(request, self.stage, self.flags, request_id,
                                on_cancel=lambda: self.metrics.count("cancelled"))
        stream.telemetry = RequestTelemetry(self.telemetry)
        if self.reports_compute and not self._own_dispatch():
            stream.ledger = bls.StageLedger()
        try:
            job = self.parse(request)
        except (self.input_error, InputError, UnicodeDecodeError) as exc:
            self.metrics.count("invalid")
            stream.invalid(str(exc))
            self._discard_flag(stream)
            stream.telemetry.finish("invalid")
            return None
        except Exception as exc:  # a stage reports failures as error responses, never raises
            stream.fail(exc)
            self._discard_flag(stream)
            stream.telemetry.finish("error")
            return None
        self.metrics.count("requests")
        queued = self.policy.queued and not self._own_dispatch()
        self.telemetry.add("omni_stage_requests_waiting" if queued else "omni_stage_requests_running", 1)
        stream.paced = self.step_scheduler is not None and self.paced(request)
        if self.balance is not None:
            self.balance.opened()
            stream.balanced = True
        return Accepted(job, stream)

    def dispatch(self, job, stream: ResponseStream) -> None:
        """Run ``job`` in execute, on the pool, or on the deadline scheduler."""
        if self.step_scheduler is not None:
            self._schedule(job, stream)
        elif self.pool is None:
            self.run(job, stream)
        else:
            self.pool.submit(self._run_queued, job, stream)

    def playback_deadline(self, arrival: float, job=None, paced: bool = False) -> scheduling.Deadline:
        """The deadline model of one request (``job``, None at load) arriving at ``arrival``
        (scheduler clock, s): :meth:`PlaybackPolicy.deadline
        <omni_triton.runtime.stage_policy.PlaybackPolicy.deadline>` of the config parameters
        (``deadline_unit`` and the consumer's chunk schedule). A family overrides this to shape
        one request's deadline from its job (``omni_thinker``).

        Raises:
            ValueError: an unknown ``deadline_unit``, ``frames`` on a stage without
                ``frames_output``, or invalid numbers.
        """
        return self.playback.deadline(arrival, paced)

    def playback_amount(self, outputs: Mapping[str, Any] | None) -> float:
        """What one step's output adds to its stream's deadline (:meth:`PlaybackPolicy.amount
        <omni_triton.runtime.stage_policy.PlaybackPolicy.amount>`): rows of ``frames_output``,
        seconds of AUDIO, or one token per step except the ``Final`` one."""
        return self.playback.amount(outputs, final=isinstance(outputs, Final))

    def _schedule(self, job, stream: ResponseStream) -> None:
        def on_start():
            self.telemetry.add("omni_stage_requests_waiting", -1)
            self.telemetry.add("omni_stage_requests_running", 1)

        def on_output(outputs):
            if outputs is not None:
                stream.send(outputs, final=isinstance(outputs, Final))
            return self.playback_amount(outputs)

        paced = getattr(stream, "paced", False)
        self.step_scheduler.submit(self.timed_generate(job, stream),
                                   self.playback_deadline(self.step_scheduler.clock(), job, paced),
                                   on_output, lambda error: self.finish(job, stream, error), on_start,
                                   paced=paced)

    def _run_queued(self, job, stream: ResponseStream) -> None:
        self.telemetry.add("omni_stage_requests_waiting", -1)
        self.telemetry.add("omni_stage_requests_running", 1)
        self.run(job, stream)

    def run(self, job, stream: ResponseStream) -> None:
        """Drive ``generate`` to the end: send each output, then FINAL; errors as responses."""
        error = None
        try:
            for outputs in self.timed_generate(job, stream):
                if outputs is not None:
                    stream.send(outputs, final=isinstance(outputs, Final))
        except Exception as exc:
            error = exc
        self.finish(job, stream, error)

    def timed_generate(self, job, stream: ResponseStream) -> Iterator[Mapping[str, Any] | None]:
        """``generate(job, stream)``, each step timed into ``stream.ledger`` (when set): the step's
        wall time minus what it waited on other stages is the request's own compute
        (``STAGE_COMPUTE_MS`` on its responses), and the ledger is current on the stepping thread
        while the step runs, so the BLS calls it makes are timed for this request
        (``omni_triton.adapters.bls.StageLedger``). A model that declares ``STAGE_METRICS`` (a BLS)
        adds the ledger's JSON to its ``Final`` output, or, when ``generate`` ends without one, in
        one more ``Final`` response of its own."""
        ledger = stream.ledger
        inner = self.generate(job, stream)
        if ledger is None:
            yield from inner
            return
        final_sent = False
        try:
            while True:
                start, waited = time.perf_counter(), ledger.waited_ms
                try:
                    with bls.active(ledger):
                        outputs = next(inner)
                except StopIteration:
                    break
                finally:
                    ledger.own_compute_ms += (time.perf_counter() - start) * 1000.0 - (ledger.waited_ms - waited)
                if isinstance(outputs, Final):
                    final_sent = True
                    if self.reports_stage_metrics:
                        outputs = Final({**outputs, STAGE_METRICS: ledger.as_json()})
                yield outputs
        finally:
            inner.close()
        if self.reports_stage_metrics and not final_sent:
            yield Final({STAGE_METRICS: ledger.as_json()})

    def finish(self, job, stream: ResponseStream, error: BaseException | None = None) -> None:
        """End a job: the error response or FINAL (exactly once), the running gauge, the cancel
        flag lowered."""
        reason = "abort" if stream.cancel_seen else "stop"
        try:
            if error is None:
                stream.close()
            elif isinstance(error, (self.input_error, InputError)) or getattr(error, "invalid", False):
                self.metrics.count("invalid")
                reason = "invalid"
                stream.invalid(str(error))
            else:
                reason = "error"
                stream.fail(error)
        except Exception:  # the client is gone: nothing left to tell it
            logging.getLogger(self.stage).exception("%s could not end its response stream", self.stage)
        finally:
            self._discard_flag(stream)
            if self.balance is not None and getattr(stream, "balanced", False):
                self.balance.closed()
            try:
                self.telemetry.add("omni_stage_requests_running", -1)
                if stream.telemetry is not None:
                    stream.telemetry.finish(reason)
            except Exception:
                logging.getLogger(self.stage).exception("%s metrics", self.stage)

    def _discard_flag(self, stream: ResponseStream) -> None:
        if self.flags is not None:
            self.flags.discard(stream.request_id)

    def finalize(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.step_scheduler is not None:
            self.step_scheduler.close()
        if self.balance is not None:
            self.balance.close()
        self.metrics = None  # metric families go before the stub's shared memory does
        bls.report_to(None)
        self.telemetry.close()
