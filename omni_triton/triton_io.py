"""Small helpers shared by the ``model.py`` adapters (run inside the Triton Python stub).

``triton_python_backend_utils`` only exists inside the stub, so it is imported lazily.
"""
from __future__ import annotations

import contextlib
import json
import os
import logging
import threading
from typing import Any


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


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
    array = tensor.as_numpy().reshape(-1)
    return array[0] if array.size else None


#: One lock per stub process for its calls into the server. Root cause of the 2.51 SIGSEGVs in
#: libtriton_python.so (scripts/repro_crash.py): ``pb_utils.Metric.increment/set`` is not
#: thread-safe. The stub's ``Metric::SendIncrementRequest`` (python_backend src/metric.cc) stores
#: the value in the Metric object and calls ``SaveToSharedMemory``, which replaces (frees) the
#: object's previous shared-memory block before sending the new handle; two threads updating one
#: Metric free the block the server is still reading. Measured (piper_tts, 8 clients, 3 x 60 s):
#: metrics + send locked: 0 crashes; send + is_cancelled locked, metrics not: 2 crashes. Responses,
#: ``is_cancelled()`` and logging are IPC round trips of the same kind and share the lock (cheap:
#: each call is a short shared-memory exchange; compute never runs under it).
#: ``OMNI_TRITON_STUB_CALLS`` (experiments only): comma separated subset of
#: send, cancel, metrics, log that are locked; "all" (default).
_LOCKED = os.environ.get("OMNI_TRITON_STUB_CALLS", "all")
_LOCKED = {"send", "cancel", "metrics", "log"} if _LOCKED == "all" else set(_LOCKED.split(","))
_SEND_LOCK = threading.RLock()
_NO_LOCK = contextlib.nullcontext()


def triton_lock(kind: str):
    """The lock guarding stub -> server calls of ``kind`` (or a no-op context)."""
    return _SEND_LOCK if kind in _LOCKED else _NO_LOCK


def is_cancelled(request) -> bool:
    """``request.is_cancelled()`` under the stub's call lock (it is an IPC round trip)."""
    with triton_lock("cancel"):
        return request.is_cancelled()


class LockedMetric:
    """A ``pb_utils.Metric`` whose updates go through the stub's call lock."""

    def __init__(self, metric):
        self._metric = metric

    def increment(self, value) -> None:
        with triton_lock("metrics"):
            self._metric.increment(value)

    def set(self, value) -> None:
        with triton_lock("metrics"):
            self._metric.set(value)

    def value(self):
        with triton_lock("metrics"):
            return self._metric.value()


def send(sender, response=None, flags: int = 0) -> None:
    """Send on a decoupled request's response sender under the stub's call lock (see
    ``_SEND_LOCK``; Triton's vllm_backend likewise sends every response from one thread)."""
    with triton_lock("send"):
        sender.send(response, flags=flags)


def optional_str_input(request, name: str) -> str | None:
    """First element of an optional BYTES input decoded as UTF-8, or ``None`` when absent."""
    value = optional_input(request, name)
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def send_final(sender) -> None:
    """Close a decoupled response stream with an empty response carrying the FINAL flag."""
    send(sender, flags=_pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL)


#: Start of every INVALID_ARG message a stage sends. Triton 2.51 delivers a streamed error without
#: its code (in-band ``error_message``; the ``triton_grpc_error`` mode that keeps the code crashed
#: tritonserver 2.51 on BLS error responses, server#7368) and turns a BLS stage's INVALID_ARG into
#: INTERNAL, so the OpenAI frontend recognises a client error by this prefix (HTTP 400).
INVALID_INPUT_PREFIX = "invalid input: "


def send_error(sender, message: str, code=None) -> None:
    """Send an error response with the FINAL flag (2.51 has no ``sender.send(error=...)`` shortcut).

    Args:
        sender: the request's ``InferenceResponseSender``.
        message: human readable reason; the frontend shows it to the client. With ``INVALID_ARG``
            it is prefixed with ``INVALID_INPUT_PREFIX`` (unless already).
        code: a ``pb_utils.TritonError`` code (e.g. ``INVALID_ARG``); ``None`` means INTERNAL.
    """
    pb = _pb()
    if code == pb.TritonError.INVALID_ARG and INVALID_INPUT_PREFIX not in message:
        message = INVALID_INPUT_PREFIX + message
    error = pb.TritonError(message) if code is None else pb.TritonError(message, code)
    send(sender, pb.InferenceResponse(output_tensors=[], error=error),
         flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class StageMetrics:
    """Custom Prometheus metrics of one model instance, on Triton's metrics endpoint.

    Keeps the ``pb_utils.MetricFamily`` objects alive: Triton invalidates a family's metrics when
    the family is garbage collected ("Invalid metric operation as the corresponding
    'MetricFamily' has been deleted").

    Args:
        labels: labels of every metric, e.g. ``{"model": "piper_tts"}``.
        specs: attribute name -> (metric name, description, ``"counter"`` or ``"gauge"``);
            each becomes an attribute holding the ``pb_utils.Metric``.
    """

    def __init__(self, labels: dict[str, str], **specs: tuple[str, str, str]):
        pb = _pb()
        kinds = {"counter": pb.MetricFamily.COUNTER, "gauge": pb.MetricFamily.GAUGE}
        self._families = []
        for attr, (name, description, kind) in specs.items():
            family = pb.MetricFamily(name, description, kinds[kind])
            self._families.append(family)
            setattr(self, attr, LockedMetric(family.Metric(labels=labels)))


def send_failure(sender, stage: str, exc: BaseException) -> None:
    """Report an unexpected exception of ``stage`` as a FINAL error response and log it.

    A stage never lets an exception escape a decoupled ``execute`` (the client would wait
    forever); if even the error response cannot be sent (the client is gone), that is logged too.
    """
    logger = logging.getLogger(stage)
    logger.error("%s failed", stage, exc_info=exc)
    try:
        send_error(sender, f"{stage} failed: {exc}")
    except Exception:
        logger.exception("%s could not send its error response", stage)


class InvalidInput(ValueError):
    """A request's inputs are wrong: reported to the client as INVALID_ARG (a 4xx), not INTERNAL."""


def input_array(request, name: str, required: bool = True):
    """The numpy array of input ``name`` without its batch dimension (non-decoupled, dynamically
    batched models get each request's own ``[1, ...]`` tensor); ``None`` when absent and optional.

    Raises:
        InvalidInput: a required input is missing.
    """
    tensor = _pb().get_input_tensor_by_name(request, name)
    if tensor is None:
        if required:
            raise InvalidInput(f"missing input {name}")
        return None
    array = tensor.as_numpy()
    return array[0] if array.ndim and array.shape[0] == 1 else array


def scalar_input(request, name: str, kind=float, required: bool = True):
    """First element of input ``name`` as ``kind`` (``int``/``float``/``str``), ``None`` if absent."""
    array = input_array(request, name, required)
    if array is None:
        return None
    value = array.reshape(-1)[0] if array.size else None
    if value is None:
        raise InvalidInput(f"input {name} is empty")
    if kind is str:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return kind(value)


def batched_execute(requests, stage: str, parse, run, outputs) -> list:
    """The body of a dynamically batched (non-decoupled) ``execute``.

    Args:
        requests: the batch Triton hands to ``execute``.
        stage: name used in error messages and logs.
        parse: ``request -> item``; an :class:`InvalidInput` (or ``ValueError``) becomes that
            request's INVALID_ARG error response, the others still run.
        run: ``list[item] -> list[result]`` for the valid items (one batched call).
        outputs: ``result -> list[pb_utils.Tensor]``.

    Returns:
        one ``InferenceResponse`` per request; a failure of ``run`` is an INTERNAL error response
        for each of its items (logged), never an exception out of ``execute``.
    """
    pb = _pb()
    responses = [None] * len(requests)
    items, idx = [], []
    for i, request in enumerate(requests):
        try:
            items.append(parse(request))
            idx.append(i)
        except (InvalidInput, ValueError, UnicodeDecodeError) as exc:
            responses[i] = pb.InferenceResponse(
                error=pb.TritonError(f"{stage}: {exc}", pb.TritonError.INVALID_ARG))
    if items:
        try:
            results = run(items)
            for i, result in zip(idx, results):
                responses[i] = pb.InferenceResponse(output_tensors=outputs(result))
        except InvalidInput as exc:
            for i in idx:
                responses[i] = pb.InferenceResponse(
                    error=pb.TritonError(f"{stage}: {exc}", pb.TritonError.INVALID_ARG))
        except Exception as exc:  # noqa: BLE001 - reported as error responses
            logging.getLogger(stage).exception("%s failed", stage)
            for i in idx:
                responses[i] = pb.InferenceResponse(error=pb.TritonError(f"{stage} failed: {exc}"))
    return responses


class TritonLogHandler(logging.Handler):
    """Forwards Python ``logging`` records to Triton's own log (``pb_utils.Logger``), so library
    messages (e.g. the denoiser's per-step progress) appear in the server log with Triton's
    timestamps: INFO -> ``log_info``, WARNING -> ``log_warn``, ERROR and above -> ``log_error``,
    DEBUG -> ``log_verbose`` (shown with ``--log-verbose=1``)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = f"{record.name}: {self.format(record)}"
            logger = _pb().Logger
            if record.levelno >= logging.ERROR:
                log = logger.log_error
            elif record.levelno >= logging.WARNING:
                log = logger.log_warn
            elif record.levelno >= logging.INFO:
                log = logger.log_info
            else:
                log = logger.log_verbose
            with triton_lock("log"):
                log(message)
        except Exception:  # noqa: BLE001 - logging must never break a request
            self.handleError(record)


def forward_logs_to_triton(name: str, level: int = logging.INFO) -> logging.Logger:
    """Attach one :class:`TritonLogHandler` to logger ``name`` (idempotent) at ``level``."""
    logger = logging.getLogger(name)
    if not any(isinstance(h, TritonLogHandler) for h in logger.handlers):
        logger.addHandler(TritonLogHandler())
    logger.setLevel(level)
    logger.propagate = False
    return logger
