"""``omni_triton.adapters.triton_io.batched_execute`` with a stand-in ``triton_python_backend_utils``:
one bad item of a dynamic batch is answered alone, the good ones still get their outputs."""

from __future__ import annotations

import sys
import types

import pytest

from omni_triton.adapters import triton_io
from omni_triton.contracts.tensors import InputError


class _Error:
    INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

    def __init__(self, message, code="INTERNAL"):
        self.message, self.code = message, code


class _Response:
    def __init__(self, output_tensors=None, error=None):
        self.outputs, self.error = output_tensors, error


@pytest.fixture
def pb(monkeypatch):
    module = types.SimpleNamespace(TritonError=_Error, InferenceResponse=_Response)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    return module


def run_batch(items, bad=(), invalid=()):
    """``run`` fails on a batch containing any of ``bad`` (RuntimeError) or ``invalid``
    (InvalidInput), as a batched encoder does when one image cannot be encoded."""
    calls = []

    def run(batch):
        calls.append(list(batch))
        if any(x in invalid for x in batch):
            raise InputError("cannot encode")
        if any(x in bad for x in batch):
            raise RuntimeError("boom")
        return [x * 10 for x in batch]

    responses = triton_io.batched_execute(items, "stage", lambda r: r, run, lambda r: [r])
    return responses, calls


def test_good_batch_is_one_call(pb):
    responses, calls = run_batch([1, 2, 3])
    assert calls == [[1, 2, 3]] and [r.outputs for r in responses] == [[10], [20], [30]]


@pytest.mark.parametrize("invalid", [False, True])
def test_one_bad_item_fails_alone(pb, invalid):
    items = list(range(12))
    responses, calls = run_batch(items, **({"invalid": {7}} if invalid else {"bad": {7}}))
    assert calls[0] == items and len(calls) == 13  # the batch, then each item alone
    for i, r in enumerate(responses):
        if i == 7:
            assert r.outputs is None and r.error.code == ("INVALID_ARG" if invalid else "INTERNAL")
        else:
            assert r.error is None and r.outputs == [i * 10]


def test_parse_errors_are_per_item(pb):
    def parse(r):
        if r == 2:
            raise ValueError("bad size")
        return r

    responses = triton_io.batched_execute([1, 2, 3], "stage", parse, lambda b: b, lambda r: [r])
    assert responses[1].error.code == "INVALID_ARG" and "bad size" in responses[1].error.message
    assert responses[0].outputs == [1] and responses[2].outputs == [3]
