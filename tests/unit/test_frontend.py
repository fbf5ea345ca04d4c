"""Routers, schemas and errors of openai_frontend against an in-process fake engine.

The fake implements the same ``Engine`` protocol as ``TritonEngine`` (unit tests only; the
end-to-end tests drive the real engine against tritonserver).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys

import httpx
import numpy as np
import pytest
import soundfile as sf
from engine_stub import EngineStub

from omni_triton.media.audio import float_to_pcm16, streaming_wav_header
from openai_frontend.app import Settings, create_app
from openai_frontend.engine import (
    Engine,
    InferenceError,
    ModelInfo,
    ModelNotFoundError,
    ModelNotReadyError,
    TritonUnavailableError,
)
from tests.helpers.frontend import frontend_client

SR = 22050

PIPER = ModelInfo(
    name="piper_tts",
    inputs=frozenset({"TEXT", "VOICE", "SPEED"}),
    outputs=frozenset({"AUDIO", "SAMPLE_RATE"}),
    decoupled=True,
    voices=("joe", "amy"),
    default_voice="joe",
    sample_rate=SR,
    supports_speed=True,
    max_input_chars=100,
)
CSM = ModelInfo(
    name="tts",
    inputs=frozenset({"TEXT", "VOICE", "SPEED", "MAX_FRAMES"}),
    outputs=frozenset({"AUDIO", "SAMPLE_RATE"}),
    decoupled=True,
    voices=("0", "1"),
    default_voice="0",
    sample_rate=24000,
    supports_speed=False,
)
TALKER = ModelInfo(name="csm_talker", inputs=frozenset({"TEXT"}), outputs=frozenset({"CODES"}))


def chunk(i: int, n: int = 441) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.uniform(-0.9, 0.9, n).astype(np.float32)


class FakeEngine(EngineStub):
    """Scriptable ``Engine``: yields ``chunks``; can fail, block, or be down."""

    def __init__(self, models=(PIPER, CSM, TALKER), chunks=None):
        self.models = {m.name: m for m in models}
        self.live = True
        self.chunks = chunks if chunks is not None else [chunk(0), chunk(1), chunk(2)]
        self.fail_at: int | None = None  # raise InferenceError before chunk i
        self.block_at: int | None = None  # wait forever before chunk i
        self.calls: list[dict] = []
        self.paced: list[bool] = []
        self.started = 0
        self.completed = 0
        self.cancelled = 0
        self.reached_block = asyncio.Event()

    async def is_live(self):
        return self.live

    async def list_models(self):
        if not self.live:
            raise TritonUnavailableError("Triton is unavailable (repository index): refused")
        return list(self.models.values())

    async def get_model(self, name):
        if not self.live:
            raise TritonUnavailableError("Triton is unavailable: refused")
        if name not in self.models:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        m = self.models[name]
        if not m.ready:
            raise ModelNotReadyError(f"The model '{name}' is not ready", param="model")
        return m

    async def synthesize(self, model, text, voice=None, speed=None, paced=False):
        self.calls.append({"model": model, "text": text, "voice": voice, "speed": speed})
        self.paced.append(paced)
        self.started += 1
        done = False
        try:
            for i, c in enumerate(self.chunks):
                await asyncio.sleep(0)
                if self.fail_at == i:
                    raise InferenceError(f"{model}: boom at chunk {i}")
                if self.block_at == i:
                    self.reached_block.set()
                    await asyncio.Event().wait()
                yield c, self.models[model].sample_rate
            done = True
            self.completed += 1
        finally:
            if not done:
                self.cancelled += 1

    async def generate_images(self, model, job):
        raise InferenceError(f"{model}: this fake serves no image models")

    async def stage_statistics(self, models):
        return {}

    async def generate(self, model, request):
        """Speech-only fake; the chat fake is in test_chat_frontend.py."""
        raise InferenceError(f"{model}: this fake serves no chat model")
        yield  # pragma: no cover - makes this an async generator

    async def close(self):
        pass


@pytest.fixture
def engine():
    return FakeEngine()


make_client = frontend_client


async def post(engine, payload, **settings):
    async with make_client(engine, **settings) as c:
        if isinstance(payload, (bytes, str)):
            return await c.post(
                "/v1/audio/speech", content=payload, headers={"content-type": "application/json"}
            )
        return await c.post("/v1/audio/speech", json=payload)


def assert_error(r, status, param=None, code=None, type_=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    if type_ is not None:
        assert err["type"] == type_, err
    return err


def expected_pcm(engine) -> bytes:
    return b"".join(float_to_pcm16(c) for c in engine.chunks)


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


# ------------------------------------------------------------------ protocol / imports
def test_fake_engine_implements_protocol(engine):
    assert isinstance(engine, Engine)


def test_frontend_does_not_import_torch():
    import subprocess

    code = "import sys, openai_frontend.app, openai_frontend.__main__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ whole clip
@pytest.mark.parametrize("fmt", ["wav", "flac"])
async def test_speech_clip_lossless_formats(engine, fmt):
    r = await post(engine, {"model": "piper_tts", "input": "Hello.", "voice": "amy", "response_format": fmt})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == f"audio/{fmt}"
    assert r.headers["x-sample-rate"] == str(SR)
    y, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    assert sr == SR and y.tobytes() == expected_pcm(engine)
    assert engine.calls == [{"model": "piper_tts", "text": "Hello.", "voice": "amy", "speed": None}]
    assert engine.completed == 1 and engine.cancelled == 0


async def test_speech_clip_pcm_headers(engine):
    r = await post(engine, {"model": "piper_tts", "input": "Hi", "voice": "joe", "response_format": "pcm"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "audio/pcm"
    assert r.headers["x-sample-rate"] == str(SR)
    assert r.headers["x-sample-format"] == "s16le"
    assert r.content == expected_pcm(engine)


async def test_speech_default_format_is_mp3_and_default_voice(engine):
    r = await post(engine, {"model": "piper_tts", "input": "Hi"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "audio/mpeg"
    assert engine.calls[0]["voice"] == "joe"
    y, sr = sf.read(io.BytesIO(r.content))
    assert sr == SR and len(y) > 0


async def test_speech_voice_object_and_speed_passed(engine):
    r = await post(
        engine,
        {"model": "piper_tts", "input": "Hi", "voice": {"id": "amy"}, "speed": 1.5, "response_format": "pcm"},
    )
    assert r.status_code == 200
    assert engine.calls[0]["voice"] == "amy" and engine.calls[0]["speed"] == 1.5


async def test_speech_model_optional_only_with_single_speech_model():
    single = FakeEngine(models=(PIPER, TALKER))
    r = await post(single, {"input": "Hi", "response_format": "pcm"})
    assert r.status_code == 200 and single.calls[0]["model"] == "piper_tts"
    r = await post(FakeEngine(), {"input": "Hi", "response_format": "pcm"})
    assert_error(r, 400, param="model")


async def test_opus_with_incompatible_rate_is_400_but_ok_at_24k(engine):
    from omni_triton.media.audio import SUPPORTED_FORMATS

    if "opus" not in SUPPORTED_FORMATS:
        pytest.skip("no opus")
    r = await post(engine, {"model": "piper_tts", "input": "Hi", "response_format": "opus"})
    assert_error(r, 400, param="response_format")
    r = await post(engine, {"model": "tts", "input": "Hi", "response_format": "opus"})
    assert r.status_code == 200 and r.content[:4] == b"OggS"


# ------------------------------------------------------------------ request errors
@pytest.mark.parametrize(
    "payload,param",
    [
        ({"model": "piper_tts"}, "input"),
        ({"model": "piper_tts", "input": 123}, "input"),
        ({"model": "piper_tts", "input": "x", "speed": 5.0}, "speed"),
        ({"model": "piper_tts", "input": "x", "speed": 0.1}, "speed"),
        ({"model": "piper_tts", "input": "x", "speed": "fast"}, "speed"),
        ({"model": "piper_tts", "input": "x", "stream": "maybe"}, "stream"),
        ({"model": "piper_tts", "input": "x", "stream_format": "ws"}, "stream_format"),
        ({"model": "piper_tts", "input": "x", "stream": True, "stream_pacing": "fast"}, "stream_pacing"),
        ({"model": "piper_tts", "input": "x", "stream": True, "stream_pacing": True}, "stream_pacing"),
        ({"model": 7, "input": "x"}, "model"),
    ],
)
async def test_validation_errors_are_openai_400(engine, payload, param):
    r = await post(engine, payload)
    assert_error(r, 400, param=param, type_="invalid_request_error")
    assert engine.started == 0


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"just a string"', b"\xff\xfe"])
async def test_malformed_json_is_400(engine, raw):
    r = await post(engine, raw)
    assert_error(r, 400, type_="invalid_request_error")


async def test_unknown_model_404(engine):
    r = await post(engine, {"model": "nope", "input": "x"})
    assert_error(r, 404, param="model", code="model_not_found")


async def test_non_speech_model_400(engine):
    r = await post(engine, {"model": "csm_talker", "input": "x"})
    assert_error(r, 400, param="model")


async def test_unknown_voice_400_lists_voices(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x", "voice": "no-such-voice"})
    err = assert_error(r, 400, param="voice")
    assert "joe" in err["message"] and "amy" in err["message"]


@pytest.mark.parametrize("text", ["", "   \n"])
async def test_empty_input_400(engine, text):
    r = await post(engine, {"model": "piper_tts", "input": text})
    assert_error(r, 400, param="input")


async def test_input_longer_than_model_limit_400(engine):
    r = await post(engine, {"model": "piper_tts", "input": "a" * 101, "response_format": "pcm"})
    assert_error(r, 400, param="input", code="input_too_long")
    r = await post(engine, {"model": "piper_tts", "input": "a" * 100, "response_format": "pcm"})
    assert r.status_code == 200
    # model without max_input_chars: the frontend default applies
    r = await post(engine, {"model": "tts", "input": "a" * 51}, default_max_input_chars=50)
    assert_error(r, 400, param="input")


async def test_speed_rejected_when_model_does_not_support_it(engine):
    r = await post(engine, {"model": "tts", "input": "x", "speed": 1.25})
    assert_error(r, 400, param="speed")
    r = await post(engine, {"model": "tts", "input": "x", "speed": 1.0, "response_format": "pcm"})
    assert r.status_code == 200


async def test_instructions_rejected_when_non_empty(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x", "instructions": "whisper"})
    assert_error(r, 400, param="instructions")
    r = await post(engine, {"model": "piper_tts", "input": "x", "instructions": "", "response_format": "pcm"})
    assert r.status_code == 200


async def test_unsupported_format_names_supported(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x", "response_format": "aac"})
    err = assert_error(r, 400, param="response_format")
    for name in ("wav", "pcm", "flac"):
        assert name in err["message"]


async def test_stream_only_pcm_or_wav(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x", "stream": True, "response_format": "flac"})
    assert_error(r, 400, param="response_format")


async def test_triton_unavailable_503(engine):
    engine.live = False
    r = await post(engine, {"model": "piper_tts", "input": "x"})
    assert_error(r, 503, code="triton_unavailable")
    assert r.headers.get("retry-after")


async def test_model_not_ready_503(engine):
    engine.models["piper_tts"] = ModelInfo(name="piper_tts", state="UNAVAILABLE")
    r = await post(engine, {"model": "piper_tts", "input": "x"})
    assert_error(r, 503, code="model_not_ready")


async def test_triton_error_before_audio_is_500(engine):
    engine.fail_at = 0
    for payload in (
        {"model": "piper_tts", "input": "x"},
        {"model": "piper_tts", "input": "x", "stream": True},
        {"model": "piper_tts", "input": "x", "stream_format": "sse"},
    ):
        r = await post(engine, payload)
        assert_error(r, 500, type_="server_error", code="inference_error")


async def test_triton_error_mid_clip_is_500(engine):
    engine.fail_at = 2
    r = await post(engine, {"model": "piper_tts", "input": "x", "response_format": "wav"})
    assert_error(r, 500)


async def test_oversize_body_413(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x" * 5000}, max_body_bytes=1000)
    assert_error(r, 413, code="payload_too_large")


async def test_unknown_route_and_method_are_openai_errors(engine):
    async with make_client(engine) as c:
        assert_error(await c.get("/v1/nothing"), 404)
        assert_error(await c.get("/v1/audio/speech"), 405)


async def test_server_keeps_serving_after_bad_requests(engine):
    async with make_client(engine) as c:
        for bad in (b"{", b"null", b'{"input": []}'):
            r = await c.post("/v1/audio/speech", content=bad, headers={"content-type": "application/json"})
            assert r.status_code == 400
        engine.fail_at = 1
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x"})
        assert r.status_code == 500
        engine.fail_at = None
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x", "response_format": "pcm"})
        assert r.status_code == 200 and r.content == expected_pcm(engine)


# ------------------------------------------------------------------ streaming
async def test_stream_pcm_bytes(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x", "stream": True, "response_format": "pcm"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "audio/pcm"
    assert r.headers["x-sample-rate"] == str(SR)
    assert r.content == expected_pcm(engine)


async def test_speech_is_paced_only_when_a_stream_asks_for_realtime(engine):
    """Streams run as fast as the stages make them by default (issue 29): the engine is asked to
    pace (PACED) only for ``stream_pacing: "realtime"`` on a stream (raw audio or SSE); never for
    the default, ``"none"``, or a whole clip (the field is accepted and ignored there). Red when
    the frontend paces every stream again (the first three would be True)."""
    stream = {"model": "piper_tts", "input": "x", "stream": True, "response_format": "pcm"}
    sse = {"model": "piper_tts", "input": "x", "stream_format": "sse"}
    clip = {"model": "piper_tts", "input": "x", "response_format": "wav"}
    for payload in (stream, sse, {**stream, "stream_pacing": "none"},
                    {**stream, "stream_pacing": "realtime"}, {**sse, "stream_pacing": "realtime"},
                    clip, {**clip, "stream_pacing": "realtime"}):
        r = await post(engine, payload)
        assert r.status_code == 200, r.text
    assert engine.paced == [False, False, False, True, True, False, False]


async def test_stream_default_format_is_pcm(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x", "stream": True})
    assert r.headers["content-type"] == "audio/pcm" and r.content == expected_pcm(engine)


async def test_stream_wav_header_then_pcm(engine):
    r = await post(engine, {"model": "piper_tts", "input": "x", "stream": True, "response_format": "wav"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
    assert r.content == streaming_wav_header(SR) + expected_pcm(engine)
    y, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    assert sr == SR and y.tobytes() == expected_pcm(engine)


def parse_sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            events.append((name, json.loads("\n".join(data))))
    return events


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
async def test_sse_events(engine, fmt):
    r = await post(
        engine, {"model": "piper_tts", "input": "Hello", "stream_format": "sse", "response_format": fmt}
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    deltas = [d for n, d in events if n == "speech.audio.delta"]
    assert all(d["type"] == "speech.audio.delta" for d in deltas)
    audio = b"".join(base64.b64decode(d["audio"]) for d in deltas)
    expected = expected_pcm(engine)
    assert audio == (streaming_wav_header(SR) + expected if fmt == "wav" else expected)
    name, done = events[-1]
    assert name == "speech.audio.done" and done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] == 5 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["audio_samples"] == sum(len(c) for c in engine.chunks)
    assert usage["sample_rate"] == SR
    assert engine.completed == 1


async def test_sse_error_event_mid_stream(engine):
    engine.fail_at = 2
    r = await post(engine, {"model": "piper_tts", "input": "x", "stream_format": "sse"})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert [n for n, _ in events] == ["speech.audio.delta", "speech.audio.delta", "speech.audio.error"]
    err = events[-1][1]
    assert err["type"] == "speech.audio.error"
    assert set(err["error"]) == {"message", "type", "param", "code"} and "boom" in err["error"]["message"]


async def test_raw_stream_error_mid_stream_aborts(engine):
    engine.fail_at = 2
    from openai_frontend.routers.audio import StreamAborted

    with pytest.raises(StreamAborted, match="boom"):
        await post(engine, {"model": "piper_tts", "input": "x", "stream": True})
    assert engine.cancelled == 1


def test_an_aborted_raw_stream_logs_no_asgi_traceback():
    """The abort is deliberate: uvicorn's "Exception in ASGI application" record of a
    StreamAborted (bare or in an exception group) is dropped; any other exception's record and
    plain records pass. Red when the filter passes everything."""
    import logging
    import sys

    from openai_frontend.serving.speech import QuietStreamAborted, StreamAborted

    def record(exc):
        try:
            raise exc
        except BaseException:
            info = sys.exc_info()
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application",
                                 None, info)

    quiet = QuietStreamAborted()
    assert not quiet.filter(record(StreamAborted("stage restarted")))
    if sys.version_info >= (3, 11):
        assert not quiet.filter(record(ExceptionGroup("g", [StreamAborted("x")])))  # noqa: F821
        assert quiet.filter(record(ExceptionGroup("g", [StreamAborted("x"), ValueError("y")])))  # noqa: F821
    assert quiet.filter(record(ValueError("a real bug")))
    assert quiet.filter(logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started", None, None))


# ------------------------------------------------------------------ cancellation
async def run_until_disconnect(app, payload: dict, engine: FakeEngine):
    """Drive the ASGI app by hand: send the request, then disconnect after the first body chunk."""
    body = json.dumps(payload).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/audio/speech",
        "raw_path": b"/v1/audio/speech",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("test", 1),
        "server": ("test", 80),
    }
    sent: list[dict] = []
    got_body = asyncio.Event()
    request_sent = False

    async def receive():
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await got_body.wait()
        await engine.reached_block.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            got_body.set()

    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return sent


@pytest.mark.parametrize(
    "extra",
    [
        {"stream": True, "response_format": "pcm"},
        {"stream": True, "response_format": "wav"},
        {"stream_format": "sse"},
    ],
)
async def test_client_disconnect_cancels_engine_stream(engine, extra):
    engine.block_at = 2  # two chunks flow, then the model "keeps generating"
    app = create_app(engine, Settings(max_inflight=1))
    sent = await run_until_disconnect(app, {"model": "piper_tts", "input": "x", **extra}, engine)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert engine.started == 1 and engine.cancelled == 1 and engine.completed == 0
    # the admission slot came back
    assert app.state.admission.inflight == 0


async def test_generator_close_propagates_to_engine(engine):
    """Closing the response body iterator (what Starlette does on disconnect) closes the engine stream."""
    engine.block_at = 5
    engine.chunks = [chunk(i) for i in range(10)]
    app = create_app(engine, Settings())
    from fastapi.responses import StreamingResponse

    from openai_frontend.routers.audio import create_speech
    from openai_frontend.schemas import SpeechRequest

    class Req:  # minimal stand-in for fastapi.Request
        def __init__(self, app):
            self.app = app

    resp = await create_speech(
        SpeechRequest(model="piper_tts", input="x", stream=True, response_format="pcm"), Req(app)
    )
    assert isinstance(resp, StreamingResponse)
    it = resp.body_iterator
    first = await it.__anext__()
    assert first == float_to_pcm16(engine.chunks[0])
    assert app.state.admission.inflight == 1
    await it.aclose()
    assert engine.cancelled == 1 and engine.completed == 0
    assert app.state.admission.inflight == 0


# ------------------------------------------------------------------ admission control
async def test_admission_control_429_with_retry_after(engine):
    engine.block_at = 1
    app = create_app(engine, Settings(max_inflight=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        first = asyncio.create_task(
            c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x", "response_format": "pcm"})
        )
        await asyncio.wait_for(engine.reached_block.wait(), 5)
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "y"})
        assert_error(r, 429, code="rate_limit_exceeded")
        assert r.headers["retry-after"] == "1"
        # bad requests are rejected before admission: still a 400, not a 429
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": ""})
        assert r.status_code == 400
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    await asyncio.sleep(0)
    assert engine.cancelled == 1
    assert app.state.admission.inflight == 0
    engine.block_at = None
    async with make_client(engine) as c:
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x", "response_format": "pcm"})
        assert r.status_code == 200


# ------------------------------------------------------------------ models / voices / health / metrics
async def test_models_lists_every_served_model_with_its_state(engine):
    """Issue 28: every served model is listed, READY or not, with ``state`` (and ``reason``)."""
    engine.models["tts"] = ModelInfo(name="tts", state="LOADING")
    engine.models["broken"] = ModelInfo(name="broken", state="UNAVAILABLE", reason="failed to load: boom")
    engine.models["later"] = ModelInfo(name="later", state="UNLOADED", on_demand=True)
    async with make_client(engine) as c:
        r = await c.get("/v1/models")
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "list"
        states = {m["id"]: m["state"] for m in body["data"]}
        assert states == {"piper_tts": "loaded", "csm_talker": "loaded", "tts": "loading",
                          "broken": "failed", "later": "unloaded"}
        assert all(m["object"] == "model" and "created" in m and "owned_by" in m for m in body["data"])
        assert (await c.get("/v1/models/piper_tts")).json()["id"] == "piper_tts"
        assert (await c.get("/v1/models/broken")).json()["reason"] == "failed to load: boom"
        assert "reason" not in (await c.get("/v1/models/piper_tts")).json()
        assert_error(await c.get("/v1/models/nope"), 404, code="model_not_found")


async def test_models_503_when_triton_down(engine):
    engine.live = False
    async with make_client(engine) as c:
        assert_error(await c.get("/v1/models"), 503)


async def test_voices_per_model(engine):
    async with make_client(engine) as c:
        body = (await c.get("/v1/audio/voices")).json()
        by_model = {d["model"]: d for d in body["data"]}
        assert set(by_model) == {"piper_tts", "tts"}
        assert by_model["piper_tts"]["voices"] == ["joe", "amy"]
        assert by_model["piper_tts"]["default_voice"] == "joe"
        assert by_model["piper_tts"]["sample_rate"] == SR
        assert by_model["tts"]["supports_speed"] is False
        assert body["voices"] == sorted({"joe", "amy", "0", "1"})
        one = (await c.get("/v1/audio/voices", params={"model": "tts"})).json()
        assert [d["model"] for d in one["data"]] == ["tts"]
        assert_error(await c.get("/v1/audio/voices", params={"model": "x"}), 404)


async def test_health(engine):
    async with make_client(engine) as c:
        r = await c.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        engine.models["tts"] = ModelInfo(name="tts", state="UNAVAILABLE", reason="load failed")
        r = await c.get("/health")
        assert r.status_code == 503
        body = r.json()
        assert body["not_ready"] == ["tts"] and "tts" in body["message"]
        engine.live = False
        r = await c.get("/health")
        assert r.status_code == 503 and r.json()["triton_live"] is False


async def test_metrics_exposed(engine):
    async with make_client(engine) as c:
        await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x", "response_format": "pcm"})
        text = (await c.get("/metrics")).text
        assert 'omni_frontend_speech_requests_total{mode="clip",model="piper_tts",outcome="ok"} 1.0' in text
        assert "omni_frontend_time_to_first_audio_seconds_bucket" in text
        assert "omni_frontend_inflight_requests 0.0" in text


async def test_metrics_and_errors_name_a_renamed_model_as_clients_call_it(engine):
    """A model served under another Triton name (the family rename: Triton ``piper``,
    ``served_model_name`` ``piper_tts``) keeps its OpenAI name in the frontend's metric labels and
    error messages, not the Triton name."""
    import dataclasses

    engine.models["piper"] = dataclasses.replace(engine.models.pop("piper_tts"), name="piper",
                                                 served_model_name="piper_tts")
    async with make_client(engine) as c:
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x", "response_format": "pcm"})
        assert r.status_code == 200, r.text
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x" * 5000})
        assert r.status_code == 400 and "'piper_tts'" in r.json()["error"]["message"], r.text
        text = (await c.get("/metrics")).text
        assert 'omni_frontend_speech_requests_total{mode="clip",model="piper_tts",outcome="ok"} 1.0' in text
        assert 'model="piper"' not in text
