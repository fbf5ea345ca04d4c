"""``TritonEngine.generate`` (the chat contract) against an in-process gRPC server speaking
Triton's KServe v2 protocol: inputs as sent, outputs as parsed, the ``triton_grpc_error`` mode
(INVALID_ARG -> ``InvalidRequestError``), and cancellation of the gRPC stream.

The server stands in for tritonserver (no model runs); ``tests/e2e/test_chat.py`` drives the real one.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX
from openai_frontend.engine import (
    GenerationRequest,
    InferenceError,
    InvalidRequestError,
    ModelNotReadyError,
    TritonEngine,
)
from openai_frontend.engine.errors import StageRestartedError
from tests.helpers.fake_triton import fake_triton

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def chat_config(name: str, speech: bool, **params: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    cfg.model_transaction_policy.decoupled = True
    inputs = ["PROMPT", "MESSAGES", "SAMPLING_PARAMETERS"] + (["MODALITIES", "VOICE"] if speech else [])
    outputs = ["TEXT_DELTA", "FINISH_REASON", "PROMPT_TOKENS", "COMPLETION_TOKENS"] + (
        ["AUDIO", "SAMPLE_RATE"] if speech else [])
    for i in inputs:
        cfg.input.add(name=i)
    for o in outputs:
        cfg.output.add(name=o)
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    return cfg


def _bytes(s: str) -> bytes:
    b = s.encode()
    return len(b).to_bytes(4, "little") + b  # KServe v2 BYTES: 4-byte length prefix


def chat_response(text: str, reason: str, prompt: int, done: int, audio=None, final=False):
    r = pb.ModelStreamInferResponse()
    ir = r.infer_response
    ir.model_name = "llm"
    for name, dtype, raw in (
        ("TEXT_DELTA", "BYTES", _bytes(text)),
        ("FINISH_REASON", "BYTES", _bytes(reason)),
        ("PROMPT_TOKENS", "INT32", np.array([prompt], "<i4").tobytes()),
        ("COMPLETION_TOKENS", "INT32", np.array([done], "<i4").tobytes()),
    ):
        ir.outputs.add(name=name, datatype=dtype, shape=[1])
        ir.raw_output_contents.append(raw)
    if audio is not None:
        ir.outputs.add(name="AUDIO", datatype="FP32", shape=[len(audio)])
        ir.raw_output_contents.append(audio.astype("<f4").tobytes())
        ir.outputs.add(name="SAMPLE_RATE", datatype="INT32", shape=[1])
        ir.raw_output_contents.append(np.array([22050], "<i4").tobytes())
    ir.parameters["triton_final_response"].bool_param = final
    return r


def decode_bytes_input(req: pb.ModelInferRequest, name: str) -> str | None:
    for i, t in enumerate(req.inputs):
        if t.name == name:
            raw = req.raw_input_contents[i]
            n = int.from_bytes(raw[:4], "little")
            return raw[4:4 + n].decode()
    return None


class FakeChatTriton(pbg.GRPCInferenceServiceServicer):
    def __init__(self):
        self.configs = {
            "llm": chat_config("llm", False, modalities="text", max_model_len="2048",
                               served_model_name="smollm2"),
            "llm_tts": chat_config("llm_tts", True, modalities="text,audio", speaks_for="llm",
                                   voices="joe", sample_rate="22050", depends_on="llm"),
        }
        self.mode = "ok"  # ok | invalid | endless | crash
        self.requests: list[pb.ModelInferRequest] = []
        self.metadata: list[dict] = []
        self.cancelled = asyncio.Event()
        self.streaming = asyncio.Event()

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name in self.configs)

    async def RepositoryIndex(self, request, context):
        resp = pb.RepositoryIndexResponse()
        for name in self.configs:
            resp.models.add(name=name, version="1", state="READY")
        return resp

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=self.configs[request.name])

    async def ModelStreamInfer(self, request_iterator, context):
        self.metadata.append(dict(context.invocation_metadata()))
        try:
            async for req in request_iterator:
                self.requests.append(req)
                self.streaming.set()
                if self.mode == "invalid":  # a stage's INVALID_ARG as tritonserver sends it (in-band)
                    yield pb.ModelStreamInferResponse(
                        error_message=INVALID_INPUT_PREFIX + "prompt is 9000 tokens; max 2048")
                    return
                if self.mode == "inband":  # what tritonserver does without triton_grpc_error
                    yield pb.ModelStreamInferResponse(error_message="the prompt has 9000 tokens")
                    return
                if self.mode == "crash":
                    await context.abort(grpc.StatusCode.INTERNAL, "engine died")
                words = ["Paris", " is", " the", " capital", "."]
                i = 0
                while self.mode == "endless" or i < len(words):
                    last = self.mode != "endless" and i == len(words) - 1
                    audio = np.full(10, 0.25, np.float32) if req.model_name == "llm_tts" and i == 1 else None
                    yield chat_response(words[i % len(words)], "stop" if last else "", 12, i + 1, audio, final=last)
                    i += 1
                    await asyncio.sleep(0.01 if self.mode == "endless" else 0)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@pytest.fixture
async def triton():
    async with fake_triton(FakeChatTriton()) as fake:
        yield fake


MESSAGES = [{"role": "user", "content": "Capital of France? Réponds."}]


async def test_chat_metadata_parameters(triton):
    engine = TritonEngine(triton.url)
    try:
        models = {m.name: m for m in await engine.list_models()}
        llm, tts = models["llm"], models["llm_tts"]
        assert llm.is_chat and llm.is_completion and not llm.can_speak and not llm.is_speech
        assert llm.output_modalities == ("text",) and llm.max_model_len == 2048
        assert llm.public_name == "smollm2"
        assert tts.can_speak and tts.speaks_for == "llm" and tts.output_modalities == ("text", "audio")
        assert tts.voices == ("joe",) and tts.sample_rate == 22050
    finally:
        await engine.close()


async def test_generate_sends_contract_inputs_and_parses_outputs(triton):
    engine = TritonEngine(triton.url)
    try:
        await engine.get_model("llm")
        req = GenerationRequest(messages=MESSAGES, sampling={"temperature": 0, "max_tokens": 8},
                                modalities=("text", "audio"), voice="joe", request_id="chatcmpl-x-0")
        chunks = [c async for c in engine.generate("llm", req)]
        sent = triton.requests[0]
        assert sent.model_name == "llm" and sent.id == "chatcmpl-x-0"
        # llm declares neither MODALITIES nor VOICE: they are not sent
        assert [i.name for i in sent.inputs] == ["MESSAGES", "SAMPLING_PARAMETERS"]
        assert json.loads(decode_bytes_input(sent, "MESSAGES")) == MESSAGES
        assert json.loads(decode_bytes_input(sent, "SAMPLING_PARAMETERS")) == {"temperature": 0, "max_tokens": 8}
        assert "triton_grpc_error" not in triton.metadata[0]  # in-band errors (2.51 crashes)
        assert "".join(c.text for c in chunks) == "Paris is the capital."
        assert [c.finish_reason for c in chunks] == [None] * 4 + ["stop"]
        assert [c.completion_tokens for c in chunks] == [1, 2, 3, 4, 5]
        assert all(c.prompt_tokens == 12 and c.audio is None for c in chunks)
    finally:
        await engine.close()


async def test_generate_speech_model_gets_modalities_voice_and_audio(triton):
    engine = TritonEngine(triton.url)
    try:
        await engine.get_model("llm_tts")
        req = GenerationRequest(prompt="Say hi", modalities=("text", "audio"), voice="joe")
        chunks = [c async for c in engine.generate("llm_tts", req)]
        sent = triton.requests[0]
        assert [i.name for i in sent.inputs] == ["PROMPT", "MODALITIES", "VOICE"]
        assert decode_bytes_input(sent, "PROMPT") == "Say hi"
        assert json.loads(decode_bytes_input(sent, "MODALITIES")) == ["text", "audio"]
        assert decode_bytes_input(sent, "VOICE") == "joe"
        audio = [c for c in chunks if c.audio is not None]
        assert len(audio) == 1 and audio[0].sample_rate == 22050
        assert audio[0].audio.dtype == np.float32 and np.allclose(audio[0].audio, 0.25)
    finally:
        await engine.close()


async def test_invalid_arg_becomes_invalid_request_error(triton):
    triton.mode = "invalid"
    engine = TritonEngine(triton.url)
    try:
        with pytest.raises(InvalidRequestError, match="9000 tokens") as info:
            async for _ in engine.generate("llm", GenerationRequest(prompt="x" * 100)):
                pass
        assert info.value.status_code == 400
        triton.mode = "crash"
        with pytest.raises(InferenceError, match="engine died"):
            async for _ in engine.generate("llm", GenerationRequest(prompt="x")):
                pass
    finally:
        await engine.close()


async def test_stub_down_is_model_not_ready():
    from openai_frontend.engine.triton import _stream_error

    err = _stream_error("llm", "Failed to process the request(s) for model 'llm', message: Stub process "
                        "'llm_0_0' is not healthy.", grpc.StatusCode.INTERNAL)
    # stage_restarted: side-effect-free requests retry once when it is READY again (the issue-26
    # trial's transcription got a 503 at once)
    assert isinstance(err, StageRestartedError) and err.status_code == 503 and err.code == "stage_restarted"


async def test_a_model_triton_has_no_version_of_is_model_not_ready():
    """A request that reaches Triton while the model reloads (a killed stub; the newcomer trial
    saw it on the WebSocket's queued sentences) is a 503 model_not_ready, in-band or as the RPC's
    UNAVAILABLE status, not a 500 inference_error nor a Triton outage. Red without the
    ``_MODEL_UNAVAILABLE`` case in ``_stream_error``."""
    from openai_frontend.engine.triton import _stream_error

    message = "Request for unknown model: 'piper' has no available versions"
    for code in (None, grpc.StatusCode.UNAVAILABLE):
        err = _stream_error("piper", message, code)
        assert isinstance(err, ModelNotReadyError) and err.status_code == 503 and err.code == "model_not_ready"


async def test_a_bls_stage_being_restarted_is_model_not_ready():
    """A BLS whose stage stub was killed answers "Model 'whisper_decoder' is not ready." in-band
    until serve has reloaded it (the issue-26 trial: a transcription got 500 inference_error): a
    503 stage_restarted, which ``retry_after_stage_restart`` retries once the model is READY again.
    Red without the ``_STAGE_NOT_READY`` case."""
    from openai_frontend.engine.triton import _stream_error

    message = "Failed for execute the inference request. Model 'whisper_decoder' is not ready."
    err = _stream_error("whisper", message, None)
    assert isinstance(err, StageRestartedError) and err.status_code == 503 and err.code == "stage_restarted"


async def test_closing_generate_cancels_the_grpc_stream(triton):
    triton.mode = "endless"
    engine = TritonEngine(triton.url)
    try:
        gen = engine.generate("llm", GenerationRequest(messages=MESSAGES))
        await gen.__anext__()
        await gen.__anext__()
        await gen.aclose()
        await asyncio.wait_for(triton.cancelled.wait(), 5)
    finally:
        await engine.close()


def test_exactly_one_of_prompt_and_messages():
    from openai_frontend.engine import chat_inputs

    with pytest.raises(ValueError):
        chat_inputs(GenerationRequest(), frozenset())
    with pytest.raises(ValueError):
        chat_inputs(GenerationRequest(prompt="a", messages=[]), frozenset())


async def test_streams_never_use_grpc_error_mode(triton):
    """tritonserver 2.51 crashed on error responses in triton_grpc_error mode (BLS and
    single-stage models alike): every stream gets in-band errors, without a code."""
    engine = TritonEngine(triton.url)
    try:
        for model in ("llm_tts", "llm"):
            await engine.get_model(model)
            triton.mode = "ok"
            chunks = [c async for c in engine.generate(model, GenerationRequest(prompt="hi"))]
            assert chunks and "triton_grpc_error" not in triton.metadata[-1]
            triton.mode = "inband"
            with pytest.raises(InferenceError, match="9000 tokens") as info:
                async for _ in engine.generate(model, GenerationRequest(prompt="x")):
                    pass
            assert info.value.status_code == 500  # no "invalid input: " prefix: a server error
    finally:
        await engine.close()


def test_in_band_stage_invalid_input_is_a_client_error():
    """A stage's INVALID_ARG that arrives in-band (code lost on 2.51) is still a 400."""
    from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX
    from openai_frontend.engine import InferenceError, InvalidRequestError
    from openai_frontend.engine.triton import _stream_error

    err = _stream_error("llm_tts", INVALID_INPUT_PREFIX + "prompt has 4001 tokens; the context is 2048", None)
    assert isinstance(err, InvalidRequestError) and err.status_code == 400
    assert err.message == "prompt has 4001 tokens; the context is 2048"
    assert isinstance(_stream_error("llm_tts", "llm failed: engine died", None), InferenceError)
