"""The real ``TritonEngine`` sending the Qwen3-TTS inputs (``omni_triton.contracts.qwen3_tts``) to
an in-process gRPC stand-in for tritonserver: the voice-prompt call and the speech extras, with
the tensor names, datatypes and shapes on the wire."""
from __future__ import annotations

import struct

import grpc
import numpy as np
import pytest
from test_engine import FakeTriton, speech_config
from tritonclient.grpc import service_pb2 as pb

from openai_frontend.engine import InvalidRequestError, SpeechOptions, TritonEngine
from tests.helpers.fake_triton import fake_triton

pytestmark = pytest.mark.anyio

QWEN_INPUTS = ("TEXT", "TASK", "VOICE", "INSTRUCTIONS", "LANGUAGE", "VOICE_PROMPT", "REF_AUDIO",
               "REF_SAMPLE_RATE", "REF_TEXT", "X_VECTOR_ONLY", "MAX_FRAMES")


@pytest.fixture
def anyio_backend():
    return "asyncio"


class QwenTriton(FakeTriton):
    def __init__(self):
        super().__init__()
        cfg = speech_config("qwen3_tts", voices="vivian,ryan", sample_rate="24000")
        del cfg.input[:]
        for name in QWEN_INPUTS:
            cfg.input.add(name=name)
        prompter = speech_config("qwen3_tts_voice_prompt")
        prompter.model_transaction_policy.decoupled = False
        del prompter.input[:], prompter.output[:]
        for name in ("REF_AUDIO", "REF_SAMPLE_RATE", "REF_TEXT", "X_VECTOR_ONLY"):
            prompter.input.add(name=name)
        for name in ("VOICE_PROMPT", "REF_SECONDS"):
            prompter.output.add(name=name)
        self.configs.update({"qwen3_tts": cfg, "qwen3_tts_voice_prompt": prompter})
        self.states.update({"qwen3_tts": "READY", "qwen3_tts_voice_prompt": "READY"})
        self.unary: list[pb.ModelInferRequest] = []
        self.reject = False

    async def ModelInfer(self, request, context):
        self.unary.append(request)
        if self.reject:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid input: REF_AUDIO is silent")
        r = pb.ModelInferResponse(model_name=request.model_name)
        r.outputs.add(name="VOICE_PROMPT", datatype="BYTES", shape=[1])
        r.outputs.add(name="REF_SECONDS", datatype="FP32", shape=[1])
        blob = b"\x00npz-archive\xff"
        r.raw_output_contents.append(struct.pack("<I", len(blob)) + blob)
        r.raw_output_contents.append(np.array([2.5], "<f4").tobytes())
        return r


@pytest.fixture
async def triton():
    async with fake_triton(QwenTriton()) as fake:
        yield fake


def wire(req) -> dict[str, tuple[str, list[int], bytes]]:
    return {t.name: (t.datatype, list(t.shape), req.raw_input_contents[i]) for i, t in enumerate(req.inputs)}


async def test_voice_prompt_on_the_wire(triton):
    engine = TritonEngine(triton.url)
    try:
        audio = np.linspace(-0.5, 0.5, 4800, dtype=np.float32)
        prompt, seconds = await engine.voice_prompt("qwen3_tts_voice_prompt", audio, 24000, "the words", False)
        assert (prompt, seconds) == (b"\x00npz-archive\xff", 2.5)
        sent = wire(triton.unary[0])
        assert sent["REF_AUDIO"][:2] == ("FP32", [4800]) and np.frombuffer(sent["REF_AUDIO"][2],
                                                                           "<f4").tolist() == audio.tolist()
        assert sent["REF_SAMPLE_RATE"] == ("INT32", [1], np.array([24000], "<i4").tobytes())
        assert sent["X_VECTOR_ONLY"][:2] == ("BOOL", [1]) and sent["X_VECTOR_ONLY"][2] == b"\x00"
        assert sent["REF_TEXT"] == ("BYTES", [1], struct.pack("<I", 9) + b"the words")
        triton.reject = True
        with pytest.raises(InvalidRequestError, match="REF_AUDIO is silent"):
            await engine.voice_prompt("qwen3_tts_voice_prompt", audio, 24000, None, True)
        assert "REF_TEXT" not in wire(triton.unary[1])
    finally:
        await engine.close()


async def test_speech_extras_on_the_wire_only_where_declared(triton):
    engine = TritonEngine(triton.url)
    try:
        await engine.get_model("qwen3_tts")
        await engine.get_model("piper_tts")
        opts = SpeechOptions(task="base", voice_prompt=b"\x00blob", instructions="calm", language="English")
        chunks = [c async for c in engine.synthesize("qwen3_tts", "Hello.", None, None, options=opts)]
        assert len(chunks) == 3
        sent = wire(triton.requests[0])
        assert sent["TASK"] == ("BYTES", [1], struct.pack("<I", 4) + b"base")
        assert sent["VOICE_PROMPT"] == ("BYTES", [1], struct.pack("<I", 5) + b"\x00blob")
        assert sent["INSTRUCTIONS"][2].endswith(b"calm") and sent["LANGUAGE"][2].endswith(b"English")
        assert "VOICE" not in sent and "REF_AUDIO" not in sent
        [c async for c in engine.synthesize("piper_tts", "Hello.", "joe", None, options=opts)]
        assert set(wire(triton.requests[1])) == {"TEXT", "VOICE"}
    finally:
        await engine.close()
