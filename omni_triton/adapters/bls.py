"""BLS helpers: call a stage once, stream a decoupled stage with cancel + drain to FINAL.

Both build ``pb_utils.InferenceRequest`` from contract ``(name, array)`` pairs and hand back
plain ``{name: array}`` dicts. BLS ``exec`` and the iteration of a decoupled response iterator
block until the stage answers, so they run outside the call lock of
``omni_triton.adapters.triton_io`` (holding it would stall every other thread of the stub).

Version switch, detected by feature so one repository serves 2.51 and an NGC container: where
the decoupled response iterator has ``cancel()`` (python_backend 2.57+, r25.04), a cancelled
stream is cancelled through it (the stage sees ``request.is_cancelled()``); on older servers the
stage's cancel flag for the REQUEST_ID this helper sent is raised instead
(``omni_triton.runtime.cancel_flags``). Either way the stream is drained to its FINAL.

Who frees a finished stream (the 2.51 heap corruption of issue 9). Before python_backend r25.01
(PR #390, "Hold GIL when deleting numpy array"; 2.51 is r24.10) a ``PbTensor`` drops its numpy
array without holding the GIL. The stub keeps each decoupled BLS response iterator in a map that
its stub->parent utility thread erases when it sends the iterator's cleanup message (queued when
the FINAL arrives). When the Python side has already let go of the iterator, that erase destroys
it, and with it every response tensor's numpy array (BYTES ones are object arrays of ``bytes``),
on a thread without the GIL, racing the model's Python threads: pymalloc / numpy allocator
corruption (``malloc(): unaligned fastbin chunk detected`` in ``llm_tts``). So
:func:`stream_stage` makes sure Python frees the iterator: after the FINAL it makes a blocking
round trip through the same FIFO queue (``request.is_cancelled()`` of the caller's still-open
request, :meth:`ResponseStream.barrier`), which returns only after the cleanup has been
processed, and then drops the last reference itself, under the GIL. Where no open request is at
hand it keeps the iterator for :data:`GRAVEYARD_S` seconds and drops it from a timer thread
(which holds the GIL). ``OMNI_TRITON_BLS_BARRIER=0`` turns this off (experiments only:
``clients/repro_crash.py --model probe_bls``).

One thread (the 2.51 hang of issue 9; python_backend main still has the same code). In the stub,
``exec(decoupled=True)`` ends in ``Stub::GetResponseIterator``, which locks the iterator map
while its caller holds the GIL; the thread that receives BLS responses
(``ParentToStubMQMonitor``) holds that map lock while it pushes a response into an iterator,
which needs the iterator's mutex; and ``ResponseIterator::Next`` re-takes the GIL while holding
that mutex when it wakes up. One thread opening a stream while another wakes on a response
that is followed by a second one deadlocks all three (gdb on a hung ``probe_bls`` stub showed
exactly these frames); every later response for that stub then blocks in the server, and the
callee stage (``piper``) stops answering anyone. So a stub reads all its decoupled BLS
streams on one thread: :func:`stream_stage` raises ``RuntimeError`` when a second thread of the
process calls it (``OMNI_TRITON_BLS_THREADS=any`` lifts this for the reproduction), and the
stages that read streams run their requests in ``execute`` and scale by instance count
(``DecoupledStage.reads_bls_streams``).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from omni_triton.adapters.telemetry import nbytes
from omni_triton.adapters.triton_io import response_outputs, tensors, triton_lock
from omni_triton.contracts.tensors import (
    INVALID_INPUT_PREFIX,
    REPORTS_STAGE_METRICS,
    REQUEST_ID,
    STAGE_COMPUTE_MS,
    STAGE_METRICS,
    first_float,
    first_value,
    utf8_array,
)

LOGGER = logging.getLogger("omni_triton.bls")

#: Seconds a finished response iterator is kept when no open request can serve as the barrier
#: (the stub's utility thread processes a cleanup message in well under a millisecond).
GRAVEYARD_S = 5.0
BARRIER = os.environ.get("OMNI_TRITON_BLS_BARRIER", "1") != "0"

_TELEMETRY: list = []  # the calling stage's Telemetry (one model instance per stub process)


def report_to(telemetry) -> None:
    """Count this process's BLS calls, bytes and waiting time in ``telemetry``
    (``omni_triton.adapters.telemetry.Telemetry``: omni_bls_* metrics); ``None`` stops it."""
    _TELEMETRY[:] = [] if telemetry is None else [telemetry]


def _account(target: str, sent: int, received: int, waited_s: float) -> None:
    """One BLS call's totals into the omni_bls_* metrics (once per call or stream, not per
    response: each metric update is an IPC round trip)."""
    if not _TELEMETRY:
        return
    t = _TELEMETRY[0]
    try:
        t.count("omni_bls_calls_total", 1, target=target)
        t.count("omni_bls_transfer_bytes_total", sent, target=target, direction="sent")
        t.count("omni_bls_transfer_bytes_total", received, target=target, direction="received")
        t.count("omni_bls_transfer_seconds_total", waited_s, target=target)
    except Exception:
        LOGGER.exception("bls metrics")


def _payload(pairs) -> int:
    return sum(nbytes(a) for _, a in pairs)


# --------------------------------------------------------------------------- per-request stage timing
@dataclass
class StageTiming:
    """One called stage's share of one request, as the BLS that called it measured it.

    Attributes:
        compute_ms: the stage's own ``STAGE_COMPUTE_MS`` for this request, summed over the calls
            (the last response of each call carries that call's total); 0 when it reports none.
        wall_ms: milliseconds the caller waited on the stage (``exec`` of a call; opening a
            stream plus the wait for each of its responses), summed over the calls.
        calls: BLS requests sent to the stage for this request.
        reported: whether the stage reported any ``STAGE_COMPUTE_MS``.
        called_by: the stage that called it, when the caller did not call it itself but a stage
            it called did and reported it in its own ``STAGE_METRICS`` (``qwen3_omni_talker``
            streaming ``qwen3_omni_thinker``); its ``wall_ms`` is then its caller's wait on it.
    """

    compute_ms: float = 0.0
    wall_ms: float = 0.0
    calls: int = 0
    reported: bool = False
    called_by: str | None = None


@dataclass
class StageLedger:
    """The stages one request called, in first-call order (``{model: StageTiming}``), and the
    caller's own compute (its step time minus its waits on stages), in milliseconds.

    A stage base makes a request's ledger current on the thread that runs each of its steps
    (:func:`active`), so :func:`call_stage` and :func:`stream_stage` add to the request being
    stepped and never to another one, also when one thread interleaves several requests (the
    deadline scheduler) or several threads run requests at once.
    """

    stages: dict[str, StageTiming] = field(default_factory=dict)
    own_compute_ms: float = 0.0

    def timing(self, model: str) -> StageTiming:
        """The entry of ``model`` (created, in call order)."""
        entry = self.stages.get(model)
        if entry is None:
            entry = self.stages[model] = StageTiming()
        return entry

    @property
    def waited_ms(self) -> float:
        """Milliseconds this caller waited on the stages it called itself so far."""
        return sum(t.wall_ms for t in self.stages.values() if t.called_by is None)

    def merge(self, report: dict, caller: str) -> None:
        """Add a called stage's own ``STAGE_METRICS`` ``report`` (the stages *it* called), as
        stages called by ``caller``. Malformed entries are skipped."""
        for stage in report.get("stages") or []:
            if not isinstance(stage, dict) or not isinstance(stage.get("stage"), str):
                continue
            entry = self.stages.get(stage["stage"])
            if entry is None:
                entry = self.timing(stage["stage"])
                entry.called_by = stage.get("called_by") or caller
            elif entry.called_by is None:
                continue  # this caller calls it itself: its own timing counts
            entry.calls += int(stage.get("calls") or 0)
            entry.wall_ms += float(stage.get("wall_ms") or 0.0)
            if isinstance(stage.get("compute_ms"), (int, float)):
                entry.compute_ms += float(stage["compute_ms"])
                entry.reported = True

    def as_json(self) -> str:
        """The ``STAGE_METRICS`` payload: ``{"stages": [{"stage", "compute_ms", "wall_ms",
        "calls"[, "called_by"]}, ...], "own_compute_ms"}`` (ms rounded to 0.001; ``compute_ms`` is
        null for a stage that reported none)."""
        return json.dumps({"stages": [
            {"stage": name, "compute_ms": round(t.compute_ms, 3) if t.reported else None,
             "wall_ms": round(t.wall_ms, 3), "calls": t.calls, **({"called_by": t.called_by} if t.called_by else {})}
            for name, t in self.stages.items()],
            "own_compute_ms": round(self.own_compute_ms, 3)}, separators=(",", ":"))


_CURRENT = threading.local()


class active:
    """``with active(ledger):`` makes ``ledger`` the calling thread's current one (``None``: no
    timing) and restores the previous one on exit."""

    def __init__(self, ledger: StageLedger | None):
        self.ledger = ledger

    def __enter__(self) -> StageLedger | None:
        self.previous = getattr(_CURRENT, "ledger", None)
        _CURRENT.ledger = self.ledger
        return self.ledger

    def __exit__(self, *exc) -> None:
        _CURRENT.ledger = self.previous


def current() -> StageLedger | None:
    """The calling thread's current :class:`StageLedger` (``None`` outside a stage step)."""
    return getattr(_CURRENT, "ledger", None)


_ASK_METRICS: list[bool] = [False]  # this process's model declares STAGE_COMPUTE_MS (its callees do too)


def ask_stage_metrics(enabled: bool) -> None:
    """Whether this process's BLS calls request the callees' per-request metric outputs: set by
    the stage base from its own config (a model that declares ``STAGE_COMPUTE_MS`` belongs to
    this repository, whose every Python model declares it; the diagnostic models of
    ``clients/probe_repository`` do not, and are never asked)."""
    _ASK_METRICS[0] = enabled


def metric_outputs(model: str) -> list[str]:
    """The metric outputs requested from callee ``model``: ``STAGE_COMPUTE_MS``, plus
    ``STAGE_METRICS`` when it calls stages itself (``REPORTS_STAGE_METRICS``); none when this
    process does not ask (:func:`ask_stage_metrics`)."""
    if not _ASK_METRICS[0]:
        return []
    return [STAGE_COMPUTE_MS, STAGE_METRICS] if model in REPORTS_STAGE_METRICS else [STAGE_COMPUTE_MS]


def _take_compute(out: dict) -> float | None:
    """Remove ``STAGE_COMPUTE_MS`` from a response's outputs; its value (ms) or None."""
    value = out.pop(STAGE_COMPUTE_MS, None)
    return first_float(value) if value is not None else None


def _take_report(out: dict) -> dict | None:
    """Remove a called stage's own ``STAGE_METRICS`` from a response's outputs; the parsed JSON
    object, or None (absent or unreadable: logged, never fatal)."""
    value = out.pop(STAGE_METRICS, None)
    if value is None:
        return None
    try:
        text = first_value(value)
        report = json.loads(text.decode("utf-8") if isinstance(text, bytes) else str(text))
    except (TypeError, ValueError):
        LOGGER.warning("unreadable %s from a stage", STAGE_METRICS)
        return None
    return report if isinstance(report, dict) else None


def _with_outputs(model: str, outputs: Iterable[str]) -> list[str]:
    """``outputs`` plus :func:`metric_outputs` of ``model`` (requested, so Triton returns them)."""
    names = list(outputs)
    return names + [n for n in metric_outputs(model) if n not in names]


_STREAM_THREAD: list[int] = []  # the one thread of this process that reads BLS streams
_THREAD_LOCK = threading.Lock()


def bls_threads_unchecked() -> bool:
    """Whether ``OMNI_TRITON_BLS_THREADS=any`` lifts the one-thread rule (reproductions only)."""
    return os.environ.get("OMNI_TRITON_BLS_THREADS", "one") == "any"


def check_stream_thread() -> None:
    """Raise unless the calling thread is the first (and so the only) one of this process to read
    decoupled BLS streams (see "One thread" in the module docstring).

    Raises:
        RuntimeError: a second thread reads BLS streams.
    """
    if bls_threads_unchecked():
        return
    me = threading.get_ident()
    with _THREAD_LOCK:
        if not _STREAM_THREAD:
            _STREAM_THREAD.append(me)
        elif _STREAM_THREAD[0] != me:
            raise RuntimeError("decoupled BLS streams read from two threads of one stub deadlock "
                               "python_backend (omni_triton/adapters/bls.py): run them on one thread")


def release_iterator(holder: list, parent) -> str:
    """Drop the finished response iterator in ``holder`` (a one-element list, emptied) so that
    the last reference goes away on a Python thread holding the GIL (see the module docstring).

    Args:
        holder: ``[iterator]``; the caller keeps no other reference to the iterator.
        parent: the caller's :class:`~omni_triton.adapters.stream.ResponseStream` or ``None``.

    Returns:
        ``"barrier"`` (freed here after the queue round trip), ``"graveyard"`` (freed later by a
        timer thread) or ``"off"`` (``OMNI_TRITON_BLS_BARRIER=0``: dropped at once).
    """
    if not BARRIER:
        holder.clear()
        return "off"
    if parent is not None and parent.barrier():
        holder.clear()  # the stub's map no longer holds it: this is the last reference
        return "barrier"
    timer = threading.Timer(GRAVEYARD_S, holder.clear)
    timer.daemon = True
    timer.start()
    return "graveyard"


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


class StageError(Exception):
    """A stage answered with an error response; ``invalid`` when it was INVALID_ARG (by code, or
    by the message prefix: 2.51 delivers a BLS stage's INVALID_ARG as INTERNAL)."""

    def __init__(self, model: str, error):
        super().__init__(f"{model}: {error.message()}")
        code = getattr(error, "code", None)
        code = code() if callable(code) else None
        self.invalid = (code is not None and code == _pb().TritonError.INVALID_ARG) or INVALID_INPUT_PREFIX in str(self)


def _request(model: str, inputs: Iterable[tuple[str, np.ndarray]], outputs: Iterable[str]):
    with triton_lock("send"):  # building a request writes it to shared memory: a stub call too
        return _pb().InferenceRequest(model_name=model, requested_output_names=list(outputs),
                                      inputs=tensors(inputs))


def call_stage(model: str, inputs: Iterable[tuple[str, np.ndarray]], outputs: Iterable[str]) -> dict[str, np.ndarray]:
    """One non-decoupled BLS call. Timed into the current :class:`StageLedger` (one call, its
    wait, the stage's ``STAGE_COMPUTE_MS``, which is requested when its contract declares it and
    taken out of the returned outputs).

    Raises:
        StageError: the stage answered with an error.
    """
    inputs = list(inputs)
    ledger = current()
    start = time.monotonic()
    response = _request(model, inputs, _with_outputs(model, outputs)).exec()
    waited = time.monotonic() - start
    if ledger is not None:
        entry = ledger.timing(model)
        entry.calls += 1
        entry.wall_ms += waited * 1000.0
    if response.has_error():
        _account(model, _payload(inputs), 0, waited)
        raise StageError(model, response.error())
    out = response_outputs(response)
    compute, report = _take_compute(out), _take_report(out)
    if ledger is not None and compute is not None:
        entry.compute_ms += compute
        entry.reported = True
    if ledger is not None and report is not None:
        ledger.merge(report, model)
    _account(model, _payload(inputs), _payload(out.items()), waited)
    return out


def can_cancel(iterator) -> bool:
    """Whether this Triton's decoupled BLS response iterator has ``cancel()`` (2.57+)."""
    return callable(getattr(iterator, "cancel", None))


def stream_stage(model: str, inputs: Iterable[tuple[str, np.ndarray]], outputs: Iterable[str],
                 should_cancel: Callable[[], bool], flags=None, request_id: str | None = None,
                 parent=None, batched: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Stream a decoupled stage's responses as ``{name: array}`` dicts.

    After each yielded response ``should_cancel()`` is polled; when it is True (or the caller
    closes this generator early) the stage is cancelled (iterator ``cancel()`` where Triton has
    it, else the cancel flag of ``request_id``, which is then sent as the stage's REQUEST_ID
    input, ``[1, 1]`` when the stage is dynamically batched: ``batched``) and its stream is
    drained to the FINAL, yielding nothing more. The finished iterator is released by
    :func:`release_iterator` with ``parent`` (the caller's
    :class:`~omni_triton.adapters.stream.ResponseStream`, the request this stream works for).

    Timed into the :class:`StageLedger` current when it is called (one call; the wait to open it
    and for each response, also while draining; the stage's ``STAGE_COMPUTE_MS``, requested as
    :func:`metric_outputs` says, taken out of every response: the last value counts, as it is
    cumulative; and its own ``STAGE_METRICS`` when it calls stages too, merged as stages it
    called: :meth:`StageLedger.merge`). A response left empty by that is not yielded.

    Raises:
        StageError: the stage answered with an error (raised after the stream is drained).
        RuntimeError: called from a second thread of this process (:func:`check_stream_thread`).
    """
    check_stream_thread()
    inputs = list(inputs)
    if request_id is not None:
        rid = utf8_array(request_id)
        inputs.append((REQUEST_ID, rid[None] if batched else rid))
    ledger = current()
    entry = ledger.timing(model) if ledger is not None else StageTiming()
    entry.calls += 1
    compute = None  # this call's STAGE_COMPUTE_MS (cumulative: the latest response's)
    report = None  # the stage's own STAGE_METRICS (on its last response), if it calls stages too
    sent, received, start = _payload(inputs), 0, time.monotonic()
    # The only reference this generator keeps: emptied by release_iterator.
    holder = [_request(model, inputs, _with_outputs(model, outputs)).exec(decoupled=True)]
    waited = time.monotonic() - start
    entry.wall_ms += waited * 1000.0

    def cancel():
        if can_cancel(holder[0]):
            holder[0].cancel()
        elif flags is not None and request_id is not None:
            flags.cancel(request_id)

    error, stopped = None, False
    try:
        responses = iter(holder[0])
        while True:
            t = time.monotonic()
            response = next(responses, None)
            dt = time.monotonic() - t
            waited += dt
            entry.wall_ms += dt * 1000.0
            if response is None:
                break
            if error is not None or stopped:
                continue  # drain to the FINAL
            if response.has_error():
                error = StageError(model, response.error())
                continue
            out = response_outputs(response)
            value, nested = _take_compute(out), _take_report(out)
            if value is not None:
                compute = value
            if nested is not None:
                report = nested
            received += _payload(out.items())
            if out:  # an empty FINAL response carries no outputs
                yield out
            if should_cancel():
                stopped = True
                cancel()
    except GeneratorExit:  # the caller stopped early (its own failure or cancel): stop and drain
        cancel()
        for _ in holder[0]:
            pass
        raise
    finally:
        response = responses = None
        if flags is not None and request_id is not None:
            flags.discard(request_id)
        release_iterator(holder, parent)
        _account(model, sent, received, waited)
        if compute is not None:
            entry.compute_ms += compute
            entry.reported = True
        if report is not None and ledger is not None:
            ledger.merge(report, model)
    if error is not None:
        raise error
