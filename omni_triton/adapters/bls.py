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
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Iterator

import numpy as np

from omni_triton.adapters.triton_io import response_outputs, tensors, triton_lock
from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX, REQUEST_ID, utf8_array

LOGGER = logging.getLogger("omni_triton.bls")


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
    """One non-decoupled BLS call.

    Raises:
        StageError: the stage answered with an error.
    """
    response = _request(model, inputs, outputs).exec()
    if response.has_error():
        raise StageError(model, response.error())
    return response_outputs(response)


def can_cancel(iterator) -> bool:
    """Whether this Triton's decoupled BLS response iterator has ``cancel()`` (2.57+)."""
    return callable(getattr(iterator, "cancel", None))


def stream_stage(model: str, inputs: Iterable[tuple[str, np.ndarray]], outputs: Iterable[str],
                 should_cancel: Callable[[], bool], flags=None, request_id: str | None = None,
                 batched: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Stream a decoupled stage's responses as ``{name: array}`` dicts.

    After each yielded response ``should_cancel()`` is polled; when it is True (or the caller
    closes this generator early) the stage is cancelled (iterator ``cancel()`` where Triton has
    it, else the cancel flag of ``request_id``, which is then sent as the stage's REQUEST_ID
    input, ``[1, 1]`` when the stage is dynamically batched: ``batched``) and its stream is
    drained to the FINAL, yielding nothing more.

    Raises:
        StageError: the stage answered with an error (raised after the stream is drained).
    """
    inputs = list(inputs)
    if request_id is not None:
        rid = utf8_array(request_id)
        inputs.append((REQUEST_ID, rid[None] if batched else rid))
    iterator = _request(model, inputs, outputs).exec(decoupled=True)

    def cancel():
        if can_cancel(iterator):
            iterator.cancel()
        elif flags is not None and request_id is not None:
            flags.cancel(request_id)

    error, stopped = None, False
    try:
        for response in iterator:
            if error is not None or stopped:
                continue  # drain to the FINAL
            if response.has_error():
                error = StageError(model, response.error())
                continue
            out = response_outputs(response)
            if out:  # an empty FINAL response carries no outputs
                yield out
            if should_cancel():
                stopped = True
                cancel()
    except GeneratorExit:  # the caller stopped early (its own failure or cancel): stop and drain
        cancel()
        for _ in iterator:
            pass
        raise
    finally:
        if flags is not None and request_id is not None:
            flags.discard(request_id)
    if error is not None:
        raise error
