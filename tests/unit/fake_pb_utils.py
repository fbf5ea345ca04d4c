"""A stand-in for ``triton_python_backend_utils`` (which exists only inside the Triton stub), so
the adapter bases run in unit tests. Every object that stands for a stub -> server call (response
sender, ``is_cancelled``, metrics, Logger) records the call and whether the stub's one call lock
was held, so a test fails when any path calls into Triton outside the lock."""
from __future__ import annotations

import threading

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
CALLS: list[tuple[str, bool]] = []  # (what, lock held?)
_CALLS_LOCK = threading.Lock()


def _lock_held() -> bool:
    from omni_triton.adapters import triton_io

    return triton_io._CALL_LOCK._is_owned()


def record(what: str) -> None:
    with _CALLS_LOCK:
        CALLS.append((what, _lock_held()))


class TritonError:
    INTERNAL, INVALID_ARG, UNAVAILABLE = 13, 3, 14

    def __init__(self, message, code=INTERNAL):
        self._message, self._code = message, code

    def message(self):
        return self._message

    def code(self):
        return self._code


class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self._tensors, self._error = list(output_tensors or []), error

    def output_tensors(self):
        return self._tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class ResponseSender:
    def __init__(self):
        self.sent: list[tuple[InferenceResponse | None, int]] = []

    def send(self, response=None, flags=0):
        record("send")
        if self.sent and self.sent[-1][1] & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise AssertionError("send after FINAL")
        self.sent.append((response, flags))

    @property
    def finals(self) -> int:
        return sum(1 for _, f in self.sent if f & TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def outputs(self) -> list[dict]:
        return [{t.name(): t.as_numpy() for t in r.output_tensors()} for r, _ in self.sent
                if r is not None and not r.has_error()]

    def errors(self) -> list[TritonError]:
        return [r.error() for r, _ in self.sent if r is not None and r.has_error()]


class FakeRequest:
    """A decoupled request: ``inputs`` {name: array}; ``cancel_after`` is_cancelled() calls
    answer False before it turns True (None: never)."""

    def __init__(self, inputs: dict, cancel_after: int | None = None):
        self.inputs = {k: Tensor(k, v) for k, v in inputs.items()}
        self.sender = ResponseSender()
        self.cancel_after = cancel_after
        self.polls = 0

    def get_response_sender(self):
        return self.sender

    def is_cancelled(self):
        record("is_cancelled")
        self.polls += 1
        return self.cancel_after is not None and self.polls > self.cancel_after


def get_input_tensor_by_name(request, name):
    return request.inputs.get(name)


def get_output_tensor_by_name(response, name):
    return next((t for t in response.output_tensors() if t.name() == name), None)


class _Metric:
    def __init__(self, labels=None, buckets=None):
        self.total = 0.0
        self.labels, self.buckets, self.observed = dict(labels or {}), buckets, []

    def observe(self, value):
        record("metric")
        self.observed.append(value)

    def increment(self, value):
        record("metric")
        self.total += value

    def set(self, value):
        record("metric")
        self.total = value

    def value(self):
        return self.total


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    created: dict[str, _Metric] = {}  # name -> the last metric created in that family
    every: list[tuple[str, str, _Metric]] = []  # (name, kind, metric) of every metric created

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels=None, buckets=None):
        record("metric")
        if (buckets is not None) != (self.kind == MetricFamily.HISTOGRAM):
            raise ValueError("buckets are required for histograms and only for them")
        metric = _Metric(labels, buckets)
        MetricFamily.created[self.name] = metric
        MetricFamily.every.append((self.name, self.kind, metric))
        return metric

    @classmethod
    def find(cls, name, **labels) -> list[_Metric]:
        """The metrics of family ``name`` whose labels include ``labels``."""
        return [m for n, _, m in cls.every if n == name and all(m.labels.get(k) == v for k, v in labels.items())]


class Logger:
    @staticmethod
    def log_info(message):
        record("log")

    log_warn = log_error = log_verbose = log_info


class InferenceRequest:
    """BLS request; ``InferenceRequest.handler(model, inputs)`` (set by a test) answers:
    ``exec()`` -> one response, ``exec(decoupled=True)`` -> an iterator of responses."""

    handler = None

    def __init__(self, model_name, requested_output_names, inputs):
        self.model_name, self.outputs = model_name, requested_output_names
        self.inputs = {t.name(): t.as_numpy() for t in inputs}

    def exec(self, decoupled=False):
        return InferenceRequest.handler(self, decoupled)
