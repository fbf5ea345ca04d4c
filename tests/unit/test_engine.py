"""The real ``TritonEngine`` against an in-process gRPC server speaking Triton's KServe v2 protocol.

The server is a stand-in for tritonserver (no model runs): it answers the metadata RPCs and
streams scripted ``ModelStreamInfer`` responses, and records whether the client cancelled the
stream, which is exactly what tritonserver turns into ``request.is_cancelled()``.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from openai_frontend.engine import (
    InferenceError,
    InvalidRequestError,
    ModelNotFoundError,
    ModelNotReadyError,
    TritonEngine,
    TritonUnavailableError,
)
from tests.helpers.fake_triton import StatefulTriton, fake_triton

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def speech_config(name: str, **params: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    cfg.model_transaction_policy.decoupled = True
    for inp in ("TEXT", "VOICE", "SPEED"):
        cfg.input.add(name=inp)
    for out in ("AUDIO", "SAMPLE_RATE"):
        cfg.output.add(name=out)
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    return cfg


def audio_response(samples: np.ndarray, rate: int, final: bool) -> pb.ModelStreamInferResponse:
    r = pb.ModelStreamInferResponse()
    ir = r.infer_response
    ir.model_name = "piper_tts"
    ir.outputs.add(name="AUDIO", datatype="FP32", shape=[len(samples)])
    ir.outputs.add(name="SAMPLE_RATE", datatype="INT32", shape=[1])
    ir.raw_output_contents.append(samples.astype("<f4").tobytes())
    ir.raw_output_contents.append(np.array([rate], dtype="<i4").tobytes())
    ir.parameters["triton_final_response"].bool_param = final
    return r


class FakeTriton(StatefulTriton):
    def __init__(self):
        self.configs = {
            "piper_tts": speech_config(
                "piper_tts", voices="joe, amy", sample_rate="22050", supports_speed="true", max_input_chars="500"
            ),
            "tts": speech_config("tts", voices="0,1,2", sample_rate="24000", supports_speed="false"),
        }
        self.states = {"piper_tts": "READY", "tts": "READY", "broken": "UNAVAILABLE"}
        self.chunks = [np.full(100, 0.1 * (i + 1), np.float32) for i in range(3)]
        self.mode = "ok"  # ok | error | endless
        self.requests: list[pb.ModelInferRequest] = []
        self.cancelled = asyncio.Event()
        self.streaming = asyncio.Event()

    async def RepositoryIndex(self, request, context):
        resp = pb.RepositoryIndexResponse()
        for name, state in self.states.items():
            resp.models.add(name=name, version="1", state=state, reason="" if state == "READY" else "failed")
        return resp

    async def ModelConfig(self, request, context):
        if self.states.get(request.name) != "READY":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"Request for unknown model: '{request.name}'")
        return pb.ModelConfigResponse(config=self.configs[request.name])

    async def ModelStreamInfer(self, request_iterator, context):
        if self.mode.startswith("watch"):
            async for r in self._watch(request_iterator):
                yield r
            return
        try:
            async for req in request_iterator:
                self.requests.append(req)
                self.streaming.set()
                if self.mode == "error":
                    yield pb.ModelStreamInferResponse(error_message="model raised: boom")
                    continue
                n = len(self.chunks)
                i = 0
                while self.mode == "endless" or i < n:
                    c = self.chunks[i % n]
                    yield audio_response(c, 22050, final=(self.mode != "endless" and i == n - 1))
                    i += 1
                    await asyncio.sleep(0.01 if self.mode == "endless" else 0)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


    async def _watch(self, request_iterator):
        """Answer one request and record, just before its final response, whether the client had
        already half-closed (``half_closed_early``), as tritonserver 2.51 must not see it."""
        it = request_iterator.__aiter__()
        req = await it.__anext__()
        self.requests.append(req)
        rest = asyncio.ensure_future(it.__anext__())  # ends (StopAsyncIteration) at the half-close
        await asyncio.sleep(0.05)
        self.half_closed_early = rest.done()
        if self.mode == "watch_error":
            yield pb.ModelStreamInferResponse(error_message="invalid input: prompt too long")
        else:
            yield audio_response(self.chunks[0], 22050, final=False)
            empty = pb.ModelStreamInferResponse()  # a FINAL flag without data
            empty.infer_response.parameters["triton_final_response"].bool_param = True
            yield empty
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(rest, 5)  # the client half-closes after the final response


@pytest.fixture
async def triton():
    async with fake_triton(FakeTriton()) as fake:
        yield fake


async def test_metadata_from_config_parameters(triton):
    engine = TritonEngine(triton.url)
    try:
        assert await engine.is_live()
        models = {m.name: m for m in await engine.list_models()}
        assert set(models) == {"piper_tts", "tts", "broken"}
        p = models["piper_tts"]
        assert p.ready and p.is_speech and p.decoupled
        assert p.voices == ("joe", "amy") and p.default_voice == "joe"
        assert p.sample_rate == 22050 and p.supports_speed and p.max_input_chars == 500
        assert models["tts"].supports_speed is False and models["tts"].max_input_chars is None
        assert not models["broken"].ready and models["broken"].state == "UNAVAILABLE"
        with pytest.raises(ModelNotReadyError):
            await engine.get_model("broken")
        with pytest.raises(ModelNotFoundError):
            await engine.get_model("nope")
    finally:
        await engine.close()


async def test_served_list_restricts_and_reports_missing(triton):
    engine = TritonEngine(triton.url, models=["piper_tts", "ghost"])
    try:
        models = {m.name: m for m in await engine.list_models()}
        assert set(models) == {"piper_tts", "ghost"} and models["ghost"].state == "MISSING"
        with pytest.raises(ModelNotFoundError):
            await engine.get_model("tts")
        with pytest.raises(ModelNotReadyError):
            await engine.get_model("ghost")
    finally:
        await engine.close()


async def test_synthesize_streams_all_chunks_and_sends_inputs(triton):
    engine = TritonEngine(triton.url)
    try:
        await engine.get_model("piper_tts")
        got = [c async for c in engine.synthesize("piper_tts", "Hello there.", "amy", 1.5)]
        assert [sr for _, sr in got] == [22050] * 3
        for (a, _), b in zip(got, triton.chunks, strict=True):
            assert a.dtype == np.float32 and np.array_equal(a, b)
        req = triton.requests[0]
        names = [i.name for i in req.inputs]
        assert names == ["TEXT", "VOICE", "SPEED"]
        assert req.model_name == "piper_tts" and req.id
        assert not triton.cancelled.is_set()
    finally:
        await engine.close()


async def test_synthesize_error_response_raises_typed_error(triton):
    triton.mode = "error"
    engine = TritonEngine(triton.url)
    try:
        with pytest.raises(InferenceError, match="boom"):
            async for _ in engine.synthesize("piper_tts", "x"):
                pass
    finally:
        await engine.close()


async def test_closing_the_iterator_cancels_the_grpc_stream(triton):
    triton.mode = "endless"
    engine = TritonEngine(triton.url)
    try:
        gen = engine.synthesize("piper_tts", "x")
        await gen.__anext__()
        await gen.__anext__()
        await gen.aclose()
        await asyncio.wait_for(triton.cancelled.wait(), 5)
    finally:
        await engine.close()


async def test_cancelling_the_consumer_task_cancels_the_grpc_stream(triton):
    triton.mode = "endless"
    engine = TritonEngine(triton.url)
    received = 0

    async def consume():
        nonlocal received
        async for _ in engine.synthesize("piper_tts", "x"):
            received += 1

    try:
        task = asyncio.create_task(consume())
        await asyncio.wait_for(triton.streaming.wait(), 5)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(triton.cancelled.wait(), 5)
        assert received >= 1
    finally:
        await engine.close()


async def test_unreachable_triton_is_unavailable():
    engine = TritonEngine("127.0.0.1:1", rpc_timeout_s=2)
    try:
        assert not await engine.is_live()
        with pytest.raises(TritonUnavailableError):
            await engine.list_models()
        with pytest.raises(TritonUnavailableError):
            await engine.get_model("piper_tts")
        with pytest.raises(TritonUnavailableError):
            async for _ in engine.synthesize("piper_tts", "x"):
                pass
    finally:
        await engine.close()


@pytest.mark.parametrize("mode", ["watch_ok", "watch_error"])
async def test_the_stream_half_closes_only_after_the_final_response(triton, mode):
    """tritonserver 2.51 crashed when a client's half-close met a response completing on the
    same stream (issue 9): the engine keeps writing open until the final response (data, empty
    FINAL, or in-band error) is in, then half-closes; the empty final response is not yielded."""
    triton.mode = mode
    engine = TritonEngine(triton.url)
    try:
        got = []
        if mode == "watch_error":
            with pytest.raises(InvalidRequestError, match="prompt too long"):
                async for c in engine.synthesize("piper_tts", "x"):
                    got.append(c)
        else:
            got = [c async for c in engine.synthesize("piper_tts", "x")]
            assert len(got) == 1 and np.array_equal(got[0][0], triton.chunks[0])
        assert triton.half_closed_early is False
        assert triton.requests[0].parameters["triton_enable_empty_final_response"].bool_param
        assert not triton.cancelled.is_set()
    finally:
        await engine.close()


async def test_paced_streams_above_max_paced_streams_are_served_unpaced(triton):
    """A BLS pipeline holds one instance per stream for the stream's whole life, a paced one for
    its playback (docs/scheduling.md "What a paced stream holds"): with ``max_paced_streams`` 1,
    a second paced request while the first is open goes without ``PACED`` (it gets its audio
    sooner and frees its instance after generation), and once the first has ended the next one
    is paced again. Red when the engine sends PACED regardless of the open count."""
    cfg = speech_config("tts", voices="0", sample_rate="24000", max_paced_streams="1")
    cfg.input.add(name="PACED")
    triton.configs["tts"] = cfg
    triton.mode = "endless"
    engine = TritonEngine(triton.url)

    def paced_sent(i: int) -> bool:
        return "PACED" in [x.name for x in triton.requests[i].inputs]

    try:
        assert (await engine.get_model("tts")).max_paced_streams == 1
        first = engine.synthesize("tts", "a long answer", paced=True)
        await first.__anext__()  # open, holding the one paced slot
        assert paced_sent(0) and engine.paced_slots.open_count("tts") == 1
        second = engine.synthesize("tts", "another", paced=True)
        await second.__anext__()
        assert not paced_sent(1) and engine.paced_slots.open_count("tts") == 1
        await second.aclose()
        await first.aclose()
        assert engine.paced_slots.open_count("tts") == 0
        third = engine.synthesize("tts", "later", paced=True)
        await third.__anext__()
        assert paced_sent(2)
        await third.aclose()
        assert engine.paced_slots.open_count("tts") == 0
    finally:
        await engine.close()


def test_paced_slots_without_a_bound_or_without_pacing():
    """No ``max_paced_streams`` (piper: its own scheduler interleaves every open request): every
    paced request is paced; an unpaced one takes no slot."""
    from openai_frontend.engine.paced_slots import PacedSlots

    slots = PacedSlots()
    with slots.take("piper", True, None) as a, slots.take("piper", True, None) as b:
        assert a and b and slots.open_count("piper") == 2
    with slots.take("tts", False, 1) as c:
        assert not c and slots.open_count("tts") == 0
    with slots.take("tts", True, 0) as d:
        assert not d
