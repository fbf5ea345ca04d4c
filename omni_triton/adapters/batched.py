"""The batched-stage skeleton: dynamically batched (non-decoupled) stages over
:func:`~omni_triton.adapters.triton_io.batched_execute` (per-item parse errors answer only that
item; one batched ``run`` for the valid ones), or, with ``scheduling: "deadline"``, over a
:class:`~omni_triton.runtime.scheduling.DueBatchQueue` (most urgent work first, each batch
answered as soon as it is done)."""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_triton.adapters import bls
from omni_triton.adapters.stream import declared_outputs
from omni_triton.adapters.telemetry import Telemetry
from omni_triton.adapters.triton_io import (
    InputError,
    batch_responses,
    batched_execute,
    model_parameters,
    optional_input,
    send,
)
from omni_triton.contracts.tensors import STAGE_COMPUTE_MS
from omni_triton.runtime.scheduling import DueBatchQueue, Policy, scheduling_policy
from omni_triton.runtime.stage_policy import due_in_s


@dataclass(frozen=True)
class QueuedItem:
    """A parsed request waiting in the deadline queue: the stage's ``item``, the request's
    response ``sender`` and when it ``arrived`` in ``execute`` (``time.monotonic()`` s)."""

    item: Any
    sender: Any
    arrived: float


class BatchedStage:
    """Base ``TritonPythonModel`` of a dynamically batched stage.

    Subclasses implement ``setup(args, params)``, ``parse(request) -> item`` (raise the
    pipeline's input error, or ``ValueError``, for that request only), ``run(items) -> results``
    (one call for the batch) and ``outputs(result) -> {name: array}``. The base reports the
    omni_stage_* metrics (``omni_triton.adapters.telemetry``): batch size, duration and finish
    reason of every request.

    ``scheduling: "deadline"`` (config parameter; ``OMNI_TRITON_SCHEDULING=fifo`` turns it off):
    ``execute`` parses and queues its requests and returns ``None``; one worker thread takes
    batches from a :class:`~omni_triton.runtime.scheduling.DueBatchQueue` (the most urgent item,
    by the request's optional :attr:`due_input`, e.g. ``DUE_MS``, and the queued items of the same
    :meth:`batch_key`, at most ``max_batch_size``), runs them and answers each request through
    its response sender (one response, FINAL: python_backend's response sender in the default
    mode). So a batch is answered when *its* work is done, not when every other length's pass of
    Triton's batch is, and urgent work (a first chunk) waits for at most the batch that is running.

    ``STAGE_COMPUTE_MS`` (when the config declares it): each request of a batch gets an equal
    share of the batch's ``run`` wall time (time / requests in the batch). A batch runs as one
    padded pass (codec decoders pad ragged chunks to the longest; diffusion stages run equal
    shapes), so each request costs the same, and the shares add up to the stage's busy time: the
    per-request numbers of a stage sum to what it spent, never to more. A batch that failed and
    was run again item by item is attributed per run the same way. A stage whose ``run`` does
    unequal work per item says so in :meth:`item_compute_ms` (the image denoisers).
    """

    #: The optional input (FP32 ms until due) that orders the deadline queue, named by the family
    #: adapter (``qwen3_tts_code2wav``: DUE_MS); ``None``: every request is due on arrival.
    due_input: str | None = None

    def initialize(self, args):
        self.name = args["model_name"]
        self.params = model_parameters(args)
        self.reports_compute = STAGE_COMPUTE_MS in declared_outputs(args)
        self.setup(args, self.params)
        self.telemetry = Telemetry(self.name, args.get("model_instance_name", self.name))
        bls.report_to(self.telemetry)
        self._queue = None
        if scheduling_policy(self.params) is Policy.DEADLINE:
            self.max_batch = max(1, int(json.loads(args["model_config"]).get("max_batch_size") or 1))
            self._queue = DueBatchQueue(Policy.DEADLINE)
            self._worker = threading.Thread(target=self._work, name=f"{self.name}-queue", daemon=True)
            self._worker.start()

    def batch_key(self, item) -> Any:
        """Items with equal keys may share one :meth:`run` under ``scheduling: "deadline"``
        (default: all; a codec decoder keys by chunk length: one forward pass per length)."""
        return None

    def due_in_s(self, request) -> float:
        """Seconds from now until ``request``'s result is due: its optional :attr:`due_input`
        (FP32, ms; negative: overdue), else 0 (now: arrival order among such requests; also
        when the family names no due input).

        Raises:
            ValueError: the due input is not finite.
        """
        if self.due_input is None:
            return 0.0
        return due_in_s(optional_input(request, self.due_input), self.due_input)

    def setup(self, args: dict, params: dict[str, str]) -> None:
        """Load the model; ``params`` are the config.pbtxt parameters."""

    def parse(self, request) -> Any:
        raise NotImplementedError

    def run(self, items: list) -> list:
        raise NotImplementedError

    def outputs(self, result) -> Mapping[str, Any]:
        raise NotImplementedError

    def execute(self, requests):
        if self._queue is not None:
            return self._enqueue(requests)
        start = time.monotonic()
        self.telemetry.add("omni_stage_requests_running", len(requests))
        try:
            responses = batched_execute(requests, self.name, self.parse, *self.timed())
        finally:
            self.telemetry.add("omni_stage_requests_running", -len(requests))
        try:
            self._report(responses, [time.monotonic() - start] * len(responses))
        except Exception:
            logging.getLogger(self.name).exception("%s metrics", self.name)
        return responses

    def timed(self):
        """``(run, outputs)`` for one ``execute`` or queue batch: ``run`` timed, and ``outputs``
        adding each request's share of that run's time as ``STAGE_COMPUTE_MS`` (FP32 ``[1, 1]``:
        with the batch dimension) when the model declares it."""
        if not getattr(self, "reports_compute", False):
            return self.run, self.outputs
        shares: dict[int, float] = {}  # id(result) -> its compute, ms

        def run(items: list) -> list:
            start = time.perf_counter()
            results = self.run(items)
            equal = (time.perf_counter() - start) * 1000.0 / max(len(items), 1)
            own = self.item_compute_ms(results)
            for i, result in enumerate(results):
                shares[id(result)] = own[i] if own is not None else equal
            return results

        def outputs(result):
            out = self.outputs(result)
            if isinstance(out, Mapping) and id(result) in shares:
                out = {**out, STAGE_COMPUTE_MS: np.array([[shares[id(result)]]], dtype=np.float32)}
            return out

        return run, outputs

    def item_compute_ms(self, results: list) -> list[float] | None:
        """Each result's own compute (ms) when the stage knows better than an equal share of the
        batch (the image denoisers: ``run`` makes one pipeline call per group of compatible
        requests, and a request's share is its call's time / the call's requests); None (the
        default): the batch's time split equally."""
        return None

    def _enqueue(self, requests):
        """``execute`` under ``scheduling: "deadline"``: parse and queue each request, answer the
        ones that cannot be queued at once (never raises: a request already answered through its
        sender must not get the batch's error too)."""
        pb = _pb()
        now = time.monotonic()
        for request in requests:
            sender = request.get_response_sender()
            try:
                item = self.parse(request)
                due = now + self.due_in_s(request)
            except (InputError, ValueError, UnicodeDecodeError) as exc:
                self._answer(sender, pb.InferenceResponse(
                    error=pb.TritonError(f"{self.name}: {exc}", pb.TritonError.INVALID_ARG)))
                continue
            except Exception as exc:
                logging.getLogger(self.name).exception("%s: parsing a request", self.name)
                self._answer(sender, pb.InferenceResponse(error=pb.TritonError(f"{self.name} failed: {exc}")))
                continue
            try:
                self._queue.put(QueuedItem(item, sender, now), due, self.batch_key(item))
            except RuntimeError as exc:  # the queue is closed: the model is unloading
                self._answer(sender, pb.InferenceResponse(
                    error=pb.TritonError(f"{self.name}: {exc}", pb.TritonError.UNAVAILABLE)))
                continue
            self.telemetry.add("omni_stage_requests_running", 1)
        return None

    @staticmethod
    def _answer(sender, response) -> None:
        try:
            send(sender, response, _pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            logging.getLogger("omni_triton.batched").exception("sending a batched response")

    def _work(self) -> None:
        """The queue's worker: batches in :class:`DueBatchQueue` order, each answered at once."""
        while True:
            batch = self._queue.take(self.max_batch, timeout=1.0)
            if not batch:
                if self._queue.closed:
                    return
                continue
            responses = batch_responses([queued.item for queued in batch], self.name, *self.timed())
            end = time.monotonic()
            for queued, response in zip(batch, responses, strict=False):
                self._answer(queued.sender, response)
            self.telemetry.add("omni_stage_requests_running", -len(batch))
            try:
                self._report(responses, [end - queued.arrived for queued in batch])
            except Exception:
                logging.getLogger(self.name).exception("%s metrics", self.name)

    def _report(self, responses, seconds: list[float]) -> None:
        """Batch size, each request's duration (``seconds``, one per response) and finish reasons."""
        t = self.telemetry
        t.observe("omni_stage_batch_size", len(responses))
        reasons: dict[str, int] = {}
        for response, duration in zip(responses, seconds, strict=False):
            reason = "stop"
            if response.has_error():
                code = getattr(response.error(), "code", None)
                invalid = callable(code) and code() == _pb().TritonError.INVALID_ARG
                reason = "invalid" if invalid else "error"
            reasons[reason] = reasons.get(reason, 0) + 1
            t.observe("omni_stage_request_duration_seconds", duration)
        for reason, n in reasons.items():
            t.count("omni_stage_requests_finished_total", n, reason=reason)

    def finalize(self):
        if self._queue is not None:
            left = self._queue.close()
            self._worker.join(timeout=10.0)
            pb = _pb()
            for queued in left:  # queued when the model unloads: answered, not dropped
                self._answer(queued.sender, pb.InferenceResponse(
                    error=pb.TritonError(f"{self.name}: stage unloading", pb.TritonError.UNAVAILABLE)))
        bls.report_to(None)
        self.telemetry.close()


def set_torch_threads() -> None:
    """One torch thread per stub process (oversubscription made runs 10-25x slower on 2 cores)."""
    import torch

    torch.set_num_threads(1)


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils
