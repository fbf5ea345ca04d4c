"""The decoupled-and-batched stage skeleton: a decoupled model with dynamic batching, whose
``execute`` gets a batch of requests and answers each through its own response stream (progress
responses while the batch runs, then FINAL), e.g. the Wan denoisers (one STEP response per
finished step to every request of a pipeline call)."""
from __future__ import annotations

import logging
import time
from typing import Any

from omni_triton.adapters.stream import DecoupledStage, ResponseStream


class BatchedDecoupledStage(DecoupledStage):
    """Base ``TritonPythonModel`` of a decoupled stage with dynamic batching.

    Everything of :class:`~omni_triton.adapters.stream.DecoupledStage` but the dispatch: each
    request of Triton's batch is parsed alone (``parse(request) -> job`` on the stub's main
    thread; an invalid request is answered alone, INVALID_ARG, and the others still run), then the
    valid ones run together in one ``run_batch(jobs, streams)`` call inside ``execute``. It sends
    each request's responses through its :class:`ResponseStream` (``stream.send(outputs)``;
    its last one with ``final=True``), polls ``stream.cancelled()`` at its step boundaries and
    returns. The base then ends every stream exactly once: FINAL for a stream still open, or,
    when ``run_batch`` raised, the error response for each (INVALID_ARG for the input error,
    INTERNAL otherwise); and keeps the same counters, cancel flags and ``omni_stage_*`` telemetry
    as every stage, plus ``omni_stage_batch_size`` (requests per ``run_batch`` call).

    ``STAGE_COMPUTE_MS`` (when declared): each request's equal share of its batch's wall time so
    far (elapsed since ``run_batch`` began / requests in the batch): a pipeline call runs the
    batch's latents together, one step for all, so no request costs more than another, and the
    shares of a batch add up to its time (docs/metrics.md "Per-request stage metrics").

    The stage dispatches itself: the ``scheduling``, ``workers`` and instance-balance settings of
    ``DecoupledStage`` do not apply (a ``scheduling: deadline`` is logged and ignored).
    """

    workers = 0

    def run_batch(self, jobs: list, streams: list[ResponseStream]) -> None:
        """Run ``jobs`` (one per request, in order) as one batch; answer through ``streams``.

        Raises:
            Exception: any failure: every request of the batch is answered with it.
        """
        raise NotImplementedError

    def _own_dispatch(self) -> bool:
        return True

    def execute(self, requests):
        accepted = [a for a in map(self.accept, requests) if a is not None]
        if not accepted:
            return None
        jobs, streams = [a.job for a in accepted], [a.stream for a in accepted]
        try:
            self.telemetry.observe("omni_stage_batch_size", len(accepted))
        except Exception:
            logging.getLogger(self.stage).exception("%s metrics", self.stage)
        if self.reports_compute:  # each request's compute: its share of the batch's time so far
            start = time.perf_counter()
            for stream in streams:
                stream.ledger, stream.batch_share = None, (start, len(streams))
                stream.compute_shape = (1, 1)  # with the batch dimension, as every output here
        error: BaseException | None = None
        try:
            self.run_batch(jobs, streams)
        except Exception as exc:
            error = exc
        for job, stream in zip(jobs, streams, strict=False):
            self.finish(job, stream, error)
        return None

    def dispatch(self, job: Any, stream: ResponseStream) -> None:
        """Not used: ``execute`` runs the whole batch (see :meth:`run_batch`)."""
        raise RuntimeError(f"{self.stage}: a batched decoupled stage runs its requests in run_batch")
