"""Every use of tritonclient's private API in the frontend, in one place.

``TritonEngine`` streams with a request parameter tritonclient's public ``stream_infer``
refuses, so this module builds and sends the gRPC request itself. It touches, in the
tritonclient version pinned in requirements.lock (2.x, ``tritonclient[grpc]``):

* ``tritonclient.grpc._utils._get_inference_request``: builds the ``ModelInferRequest``
  protobuf exactly as ``stream_infer`` does (inputs, request id, parameters), so the request
  on the wire is tritonclient's own; we then set the reserved parameter
  ``triton_enable_empty_final_response``, which ``stream_infer`` rejects (only the sync client's
  ``async_stream_infer`` sets it). Without it Triton sends no final response when a stage ends
  with a FINAL flag and no data, and the stream could not be half-closed at the right time.
* ``InferenceServerClient._client_stub``: the generated ``GRPCInferenceService`` stub, to call
  ``ModelStreamInfer`` with our own request iterator, which half-closes only once the request's
  final response is in (half-closing at once, as ``stream_infer`` does, was the frontend's way
  before issue 9's last fix; ``clients/repro_crash.py`` replays both).
* ``InferenceServerClient._get_metadata``: the client's headers for that call (same as its
  public calls send).
* ``InferResult(<ModelInferResponse>)``: wraps a raw response message in tritonclient's result
  class (public class, constructed as tritonclient's own iterator does).

A tritonclient upgrade that changes any of these breaks here only; the engine unit tests
(``tests/unit/test_engine*.py``) run these functions against a fake gRPC server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferInput
from tritonclient.grpc._utils import _get_inference_request


def infer_result(response: Any) -> grpcclient.InferResult:
    """tritonclient's ``InferResult`` of one ``ModelStreamInferResponse`` (its ``infer_response``)."""
    return grpcclient.InferResult(response.infer_response)


def open_stream(client: grpcclient.InferenceServerClient, model: str, inputs: list[InferInput],
                 request_id: str, final: asyncio.Event) -> grpc.aio.StreamStreamCall:
    """Open a ``ModelStreamInfer`` RPC that sends one request and half-closes only once
    ``final`` is set (see ``TritonEngine._stream``); returns the gRPC call, whose responses are
    ``ModelStreamInferResponse`` messages.

    tritonclient's ``stream_infer`` cannot do this: it refuses the reserved request parameter
    ``triton_enable_empty_final_response`` (only its sync ``async_stream_infer`` sets it), so the
    request is built with the same ``_get_inference_request`` and sent on the client's own stub
    (module docstring).
    """
    request = _get_inference_request(
        model_name=model, inputs=inputs, model_version="", request_id=request_id, outputs=None,
        sequence_id=0, sequence_start=False, sequence_end=False, priority=0, timeout=None, parameters=None)
    request.parameters["triton_enable_empty_final_response"].bool_param = True

    async def requests() -> AsyncIterator[Any]:
        yield request
        await final.wait()

    return client._client_stub.ModelStreamInfer(requests(), metadata=client._get_metadata(None))
