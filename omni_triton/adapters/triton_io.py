"""Every call from a stub into Triton goes through this module (run inside the Triton Python stub).

THE THREADING DISCIPLINE (issue 9). One process-wide lock guards every stub -> server call:
``sender.send`` (:func:`send`, :class:`~omni_triton.adapters.stream.ResponseStream`),
``request.is_cancelled()`` (:func:`is_cancelled`), custom-metric ``increment``/``set``
(:class:`LockedMetric`, which :class:`StageMetrics` hands out) and ``pb_utils.Logger``
(:func:`log`, :class:`TritonLogHandler`), from any thread, the main ``execute`` thread included.
Compute (torch, onnxruntime, vLLM) never runs under it, and it is never held while blocking on a
BLS response (BLS ``exec``/``async_exec`` and iterating a decoupled BLS response iterator happen
outside it, see ``omni_triton.adapters.bls``). Changing the policy means changing this module only.

Root cause of the 2.51 SIGSEGVs in libtriton_python.so (``scripts/repro_crash.py``):
``pb_utils.Metric.increment/set`` is not thread-safe. The stub's ``Metric::SendIncrementRequest``
(python_backend src/metric.cc) stores the value in the Metric object and calls
``SaveToSharedMemory``, which replaces (frees) the object's previous shared-memory block before
sending the new handle; two threads updating one Metric free the block the server is still
reading. Measured (piper, 8 clients, 3 x 60 s): metrics + send locked: 0 crashes; send +
is_cancelled locked, metrics not: 2 crashes. Responses, ``is_cancelled()`` and logging are IPC
round trips of the same kind and share the lock (each call is a short shared-memory exchange).

``OMNI_TRITON_STUB_CALLS`` (experiments only): comma separated subset of send, cancel, metrics,
log that are locked; "all" (default).

``triton_python_backend_utils`` only exists inside the stub, so it is imported lazily.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from omni_triton.contracts.tensors import (
    INVALID_INPUT_PREFIX,
    InputError,
    bounded_str,
    first_str,
    first_value,
    utf8_array,
)


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


# ------------------------------------------------------------------------- the one call lock

_LOCKED = os.environ.get("OMNI_TRITON_STUB_CALLS", "all")
_LOCKED = {"send", "cancel", "metrics", "log"} if _LOCKED == "all" else set(_LOCKED.split(","))
_CALL_LOCK = threading.RLock()
_NO_LOCK = contextlib.nullcontext()


def triton_lock(kind: str):
    """The lock guarding stub -> server calls of ``kind`` (send, cancel, metrics, log), or a no-op
    context when an experiment unlocked that kind."""
    return _CALL_LOCK if kind in _LOCKED else _NO_LOCK


def is_cancelled(request) -> bool:
    """``request.is_cancelled()`` under the call lock (an IPC round trip: poll it at
    step/sentence/frame boundaries, not in tight loops)."""
    with triton_lock("cancel"):
        return request.is_cancelled()


def send(sender, response=None, flags: int = 0) -> None:
    """``sender.send(response, flags)`` under the call lock (Triton's vllm_backend likewise sends
    every response from one thread). Prefer :class:`~omni_triton.adapters.stream.ResponseStream`,
    which also never sends after FINAL."""
    with triton_lock("send"):
        sender.send(response, flags=flags)


def log(level: str, message: str) -> None:
    """``pb_utils.Logger.log_<level>(message)`` (info, warn, error, verbose) under the call lock."""
    with triton_lock("log"):
        getattr(_pb().Logger, f"log_{level}")(message)


class LockedMetric:
    """A ``pb_utils.Metric`` whose updates go through the call lock."""

    def __init__(self, metric):
        self._metric = metric

    def increment(self, value) -> None:
        with triton_lock("metrics"):
            self._metric.increment(value)

    def set(self, value) -> None:
        with triton_lock("metrics"):
            self._metric.set(value)

    def observe(self, value) -> None:
        """One observation of a histogram metric."""
        with triton_lock("metrics"):
            self._metric.observe(value)

    def value(self):
        with triton_lock("metrics"):
            return self._metric.value()


class StageMetrics:
    """Custom Prometheus metrics of one model instance, on Triton's metrics endpoint.

    Keeps the ``pb_utils.MetricFamily`` objects alive: Triton invalidates a family's metrics when
    the family is garbage collected ("Invalid metric operation as the corresponding
    'MetricFamily' has been deleted"). Every metric is a :class:`LockedMetric`.

    Args:
        labels: labels of every metric, e.g. ``{"model": "piper"}``.
        specs: attribute name -> (metric name, description, ``"counter"`` or ``"gauge"``);
            each becomes an attribute holding the metric.
    """

    def __init__(self, labels: dict[str, str], **specs: tuple[str, str, str]):
        pb = _pb()
        kinds = {"counter": pb.MetricFamily.COUNTER, "gauge": pb.MetricFamily.GAUGE}
        self._families = []
        with triton_lock("metrics"):
            for attr, (name, description, kind) in specs.items():
                family = pb.MetricFamily(name, description, kinds[kind])
                self._families.append(family)
                setattr(self, attr, LockedMetric(family.Metric(labels=labels)))

    def has(self, attr: str) -> bool:
        return isinstance(getattr(self, attr, None), LockedMetric)

    def count(self, attr: str, value: float = 1) -> None:
        """Increment counter ``attr`` by ``value`` if this stage has it."""
        if value and self.has(attr):
            getattr(self, attr).increment(value)


# ------------------------------------------------------------------------------------ tensors

def model_parameters(args: dict) -> dict[str, str]:
    """The ``parameters`` of the model's ``config.pbtxt`` as plain strings, from ``initialize``'s
    ``args["model_config"]`` (JSON)."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def optional_input(request, name: str) -> Any:
    """First element of an optional input tensor, or ``None`` when the client did not send it."""
    tensor = _pb().get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return first_value(tensor.as_numpy())


def optional_str_input(request, name: str, max_chars: int | None = None, error: type[Exception] = InputError,
                       limit: str = "max_chars") -> str | None:
    """First element of an optional BYTES input decoded as UTF-8, or ``None`` when absent; with
    ``max_chars``, refused (``error``) over that many characters (bytes bounded before decoding,
    :func:`~omni_triton.contracts.tensors.bounded_str`).

    Raises:
        UnicodeDecodeError: not UTF-8 (the stage bases answer it as INVALID_ARG).
        error: over ``max_chars``.
    """
    tensor = _pb().get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    if max_chars is None:
        return first_str(tensor.as_numpy())
    return bounded_str(tensor.as_numpy(), name, max_chars, error, limit)


def input_array(request, name: str, required: bool = True):
    """The numpy array of input ``name`` without its batch dimension (non-decoupled, dynamically
    batched models get each request's own ``[1, ...]`` tensor); ``None`` when absent and optional.

    Raises:
        InputError: a required input is missing.
    """
    tensor = _pb().get_input_tensor_by_name(request, name)
    if tensor is None:
        if required:
            raise InputError(f"missing input {name}")
        return None
    array = tensor.as_numpy()
    return array[0] if array.ndim and array.shape[0] == 1 else array


def optional_array(request, name: str) -> np.ndarray | None:
    """The whole array of optional input ``name`` of a decoupled (unbatched) model, or ``None``
    when the client did not send it."""
    tensor = _pb().get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def present_arrays(request, names) -> dict[str, np.ndarray]:
    """The whole arrays of the inputs ``names`` the client sent (absent ones left out), e.g. for
    a hand-off's ``from_tensors``."""
    arrays = {name: optional_array(request, name) for name in names}
    return {name: array for name, array in arrays.items() if array is not None}


def required_array(request, name: str) -> np.ndarray:
    """The whole array of required input ``name`` of a decoupled (unbatched) model.

    Raises:
        InputError: missing.
    """
    tensor = _pb().get_input_tensor_by_name(request, name)
    if tensor is None:
        raise InputError(f"missing input {name}")
    return tensor.as_numpy()


def scalar_input(request, name: str, kind=float, required: bool = True):
    """First element of input ``name`` as ``kind`` (``int``/``float``/``str``), ``None`` if absent.

    Raises:
        InputError: missing (when required) or empty.
    """
    array = input_array(request, name, required)
    if array is None:
        return None
    value = first_value(array)
    if value is None:
        raise InputError(f"input {name} is empty")
    if kind is str:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return kind(value)


def tensors(outputs: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]) -> list:
    """``pb_utils.Tensor`` list of ``{name: array}`` or ``(name, array)`` pairs; ``str`` values
    become UTF-8 BYTES tensors."""
    items = outputs.items() if isinstance(outputs, Mapping) else outputs
    pb = _pb()
    return [pb.Tensor(name, utf8_array(a) if isinstance(a, str) else a) for name, a in items]


def response_outputs(response) -> dict[str, np.ndarray]:
    """The output tensors of a BLS ``InferenceResponse`` as ``{name: array}``."""
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


# ---------------------------------------------------------------------------------- responses

def error_response(message: str, invalid: bool):
    """An error ``InferenceResponse``: INVALID_ARG (message prefixed with
    ``INVALID_INPUT_PREFIX`` unless already) or INTERNAL."""
    pb = _pb()
    if invalid:
        if INVALID_INPUT_PREFIX not in message:
            message = INVALID_INPUT_PREFIX + message
        return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message, pb.TritonError.INVALID_ARG))
    return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message))


def batched_execute(requests, stage: str, parse, run, outputs) -> list:
    """The body of a dynamically batched (non-decoupled) ``execute``.

    Args:
        requests: the batch Triton hands to ``execute``.
        stage: name used in error messages and logs.
        parse: ``request -> item``; an :class:`InputError` (or ``ValueError``,
            ``UnicodeDecodeError``) becomes that request's INVALID_ARG error response, the others
            still run.
        run: ``list[item] -> list[result]`` for the valid items (one batched call); a result that
            is an ``Exception`` answers its item alone with that error (:func:`batch_responses`).
        outputs: ``result -> list[pb_utils.Tensor]`` (or ``{name: array}``).

    Returns:
        one ``InferenceResponse`` per request, never an exception out of ``execute``. When ``run``
        fails on a batch, each item is run again alone, so only the items that fail by themselves
        get an error response (INVALID_ARG for an :class:`InputError`, INTERNAL otherwise, logged).
    """
    pb = _pb()
    responses = [None] * len(requests)
    items, idx = [], []
    for i, request in enumerate(requests):
        try:
            items.append(parse(request))
            idx.append(i)
        except (InputError, ValueError, UnicodeDecodeError) as exc:
            responses[i] = pb.InferenceResponse(
                error=pb.TritonError(f"{stage}: {exc}", pb.TritonError.INVALID_ARG))
    for i, response in zip(idx, batch_responses(items, stage, run, outputs), strict=False):
        responses[i] = response
    return responses


def batch_responses(items: list, stage: str, run, outputs) -> list:
    """One ``InferenceResponse`` per parsed item: ``run(items)`` once, and when that fails each
    item again alone, so only the items that fail by themselves get an error response
    (INVALID_ARG for an :class:`InputError`, INTERNAL otherwise, logged). Never raises."""
    pb = _pb()
    responses: list = [None] * len(items)
    # A batch that fails is run again item by item, so one bad item answers alone instead of
    # failing the good requests batched with it (one 4096x4 edit upload once failed 11 others).
    groups = [(list(items), list(range(len(items))))]
    while groups:
        group_items, group_idx = groups.pop(0)
        if not group_items:
            continue
        try:
            results = run(group_items)
            done = []
            for result in results:
                if isinstance(result, Exception):  # run answered this item alone with an error
                    done.append(pb.InferenceResponse(error=_item_error(pb, stage, result)))
                    continue
                out = outputs(result)
                done.append(pb.InferenceResponse(
                    output_tensors=tensors(out) if isinstance(out, Mapping) else out))
            for i, response in zip(group_idx, done, strict=False):
                responses[i] = response
        except Exception as exc:
            if len(group_items) > 1:
                logging.getLogger(stage).warning("%s: batch of %d failed (%s); running its items alone",
                                                 stage, len(group_items), exc)
                groups += [([item], [i]) for item, i in zip(group_items, group_idx, strict=False)]
                continue
            if isinstance(exc, InputError):
                error = pb.TritonError(f"{stage}: {exc}", pb.TritonError.INVALID_ARG)
            else:
                logging.getLogger(stage).exception("%s failed", stage)
                error = pb.TritonError(f"{stage} failed: {exc}")
            responses[group_idx[0]] = pb.InferenceResponse(error=error)
    return responses


def _item_error(pb, stage: str, exc: Exception):
    """The error of one item that ``run`` returned as an exception instead of a result (e.g. the
    denoiser's ``LoraLoadError``: the other items of the batch still get their results):
    INVALID_ARG for an input error or ``ValueError``, INTERNAL otherwise."""
    if isinstance(exc, (InputError, ValueError)):
        return pb.TritonError(f"{stage}: {exc}", pb.TritonError.INVALID_ARG)
    return pb.TritonError(f"{stage} failed: {exc}")


# ------------------------------------------------------------------------------------ logging

class TritonLogHandler(logging.Handler):
    """Forwards Python ``logging`` records to Triton's own log (``pb_utils.Logger``, under the
    call lock), so library messages (e.g. the denoiser's per-step progress) appear in the server
    log with Triton's timestamps: INFO -> ``log_info``, WARNING -> ``log_warn``, ERROR and above
    -> ``log_error``, DEBUG -> ``log_verbose`` (shown with ``--log-verbose=1``)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = f"{record.name}: {self.format(record)}"
            if record.levelno >= logging.ERROR:
                level = "error"
            elif record.levelno >= logging.WARNING:
                level = "warn"
            elif record.levelno >= logging.INFO:
                level = "info"
            else:
                level = "verbose"
            log(level, message)
        except Exception:
            self.handleError(record)


def forward_logs_to_triton(name: str, level: int = logging.INFO) -> logging.Logger:
    """Attach one :class:`TritonLogHandler` to logger ``name`` (idempotent) at ``level``."""
    logger = logging.getLogger(name)
    if not any(isinstance(h, TritonLogHandler) for h in logger.handlers):
        logger.addHandler(TritonLogHandler())
    logger.setLevel(level)
    logger.propagate = False
    return logger
