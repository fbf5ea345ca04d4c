"""A fake Triton gRPC server for unit tests: a ``GRPCInferenceServiceServicer`` subclass (only the
RPCs a test needs) served on a free loopback port, in-process (grpc.aio)."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

S = TypeVar("S", bound=pbg.GRPCInferenceServiceServicer)


class StatefulTriton(pbg.GRPCInferenceServiceServicer):
    """A live fake Triton whose model readiness is ``states`` (model -> Triton state, ``READY``
    ready); subclasses set ``states`` and add the RPCs their tests need."""

    states: dict[str, str]

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=self.states.get(request.name) == "READY")


@contextlib.asynccontextmanager
async def fake_triton(servicer: S) -> AsyncIterator[S]:
    """Serve ``servicer`` on ``127.0.0.1:<free port>`` until the context ends.

    Yields the servicer with ``url`` (``"127.0.0.1:<port>"``, what ``TritonEngine`` takes) set on
    it; the server stops at once (no grace) on exit, ending any open stream.
    """
    server = grpc.aio.server()
    pbg.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    servicer.url = f"127.0.0.1:{port}"
    try:
        yield servicer
    finally:
        await server.stop(None)
