"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` against an in-process fake
engine (the other side of the ``Engine`` interface), driven by httpx and by the official OpenAI
SDK over an ASGI transport. The real engine and tritonserver are covered by
``tests/e2e/test_chat.py``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from engine_stub import EngineStub

from omni_triton.media.audio import float_to_pcm16
from openai_frontend.app import Settings, create_app
from openai_frontend.engine import (
    Engine,
    GenerationChunk,
    InferenceError,
    InvalidRequestError,
    ModelInfo,
    ModelNotFoundError,
    ModelNotReadyError,
)
from tests.helpers.frontend import frontend_client

pytestmark = pytest.mark.anyio

CHAT_INPUTS = frozenset({"PROMPT", "MESSAGES", "SAMPLING_PARAMETERS"})
TEXT_OUTPUTS = frozenset({"TEXT_DELTA", "FINISH_REASON", "PROMPT_TOKENS", "COMPLETION_TOKENS"})
SR = 22050

LLM = ModelInfo(name="llm", inputs=CHAT_INPUTS, outputs=TEXT_OUTPUTS, decoupled=True,
                modalities=("text",), max_model_len=2048)
LLM_TTS = ModelInfo(name="llm_tts", inputs=CHAT_INPUTS | {"MODALITIES", "VOICE"},
                    outputs=TEXT_OUTPUTS | {"AUDIO", "SAMPLE_RATE"}, decoupled=True,
                    modalities=("text", "audio"), speaks_for="llm", voices=("joe",),
                    default_voice="joe", sample_rate=SR, max_model_len=2048)
MUTE = ModelInfo(name="mute", inputs=CHAT_INPUTS, outputs=TEXT_OUTPUTS, decoupled=True,
                 served_model_name="mute-1")
PIPER = ModelInfo(name="piper_tts", inputs=frozenset({"TEXT", "VOICE"}),
                  outputs=frozenset({"AUDIO", "SAMPLE_RATE"}), decoupled=True, voices=("joe",),
                  default_voice="joe", sample_rate=SR)
TALKER = ModelInfo(name="csm_talker", inputs=frozenset({"TEXT"}), outputs=frozenset({"CODES"}))

ANSWER = ["The", " capital", " of", " France", " is", " Paris", "."]
MAX_PROMPT_CHARS = 500  # the fake's "context": longer input -> INVALID_ARG, as the stage does


def pcm(i: int, n: int = 300) -> np.ndarray:
    return np.random.default_rng(i).uniform(-0.5, 0.5, n).astype(np.float32)


class ChatFakeEngine(EngineStub):
    """Scriptable chat-contract ``Engine``: one token of ``ANSWER`` per response; speech
    models add one PCM chunk per two tokens. Records every request and how each stream ended."""

    def __init__(self, models=(LLM, LLM_TTS, MUTE, PIPER, TALKER)):
        self.models = {m.name: m for m in models}
        self.answer = list(ANSWER)
        self.requests: list[tuple[str, object]] = []
        self.completed = 0
        self.cancelled = 0
        self.fail_at: int | None = None
        self.block_at: int | None = None
        self.reached_block = asyncio.Event()
        self.stats: dict = {}
        #: end each stream with a BLS's per-request report (STAGE_COMPUTE_MS + STAGE_METRICS),
        #: every number proportional to the request's tokens (test_vllm_omni_compat)
        self.report_stages = False

    async def stage_statistics(self, models):
        return {m: self.stats[m] for m in models if m in self.stats}

    async def is_live(self):
        return True

    async def list_models(self):
        return list(self.models.values())

    async def get_model(self, name):
        if name not in self.models:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        m = self.models[name]
        if not m.ready:
            raise ModelNotReadyError(f"The model '{name}' is not ready", param="model")
        return m

    async def synthesize(self, model, text, voice=None, speed=None, paced=False):
        raise InferenceError("not a speech fake")
        yield  # pragma: no cover

    def audio_chunks(self, model: str, request) -> bool:
        return self.models[model].can_speak and "audio" in (request.modalities or ())

    async def generate_images(self, model, job):  # pragma: no cover - chat-only fake
        raise InferenceError(f"{model}: this fake serves no image models")

    async def generate(self, model, request):
        self.requests.append((model, request))
        source = json.dumps(request.messages) if request.messages is not None else request.prompt
        if len(source) > MAX_PROMPT_CHARS:
            raise InvalidRequestError(f"prompt has {len(source)} tokens; the context is {MAX_PROMPT_CHARS}")
        limit = request.sampling.get("max_tokens", len(self.answer))
        tokens = self.answer[:limit]
        done = False
        try:
            for i, tok in enumerate(tokens):
                await asyncio.sleep(0)
                if self.fail_at == i:
                    raise InferenceError(f"{model}: boom at token {i}")
                if self.block_at == i:
                    self.reached_block.set()
                    await asyncio.Event().wait()
                last = i == len(tokens) - 1
                reason = ("stop" if limit >= len(self.answer) else "length") if last else None
                yield GenerationChunk(text=tok, finish_reason=reason, prompt_tokens=len(source) // 4,
                                      completion_tokens=i + 1)
                if self.audio_chunks(model, request) and (i % 2 == 1 or last):
                    yield GenerationChunk(audio=pcm(i), sample_rate=SR, prompt_tokens=len(source) // 4,
                                          completion_tokens=i + 1)
            if self.report_stages:  # what a BLS sends on its last response, 1 ms per token and stage
                n = len(tokens)
                yield GenerationChunk(stage_compute_ms=0.1 * n, stage_metrics={"stages": [
                    {"stage": "llm", "compute_ms": 0.9 * n, "wall_ms": 1.0 * n, "calls": 1},
                    {"stage": "piper", "compute_ms": None, "wall_ms": 0.5 * n, "calls": n}], "own_compute_ms": 0.1 * n})
            done = True
            self.completed += 1
            from test_images_frontend import count_stage

            for name in self.models[model].stage_models:  # every stage: 3 ms queued, 20 ms computing
                count_stage(self.stats, name, 1, 3.0, 20.0)
        finally:
            if not done:
                self.cancelled += 1

    def expected_audio(self, n_tokens: int = len(ANSWER)) -> np.ndarray:
        idx = [i for i in range(n_tokens) if i % 2 == 1 or i == n_tokens - 1]
        return np.concatenate([pcm(i) for i in idx])

    async def close(self):
        pass


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return ChatFakeEngine()


client = frontend_client


def sdk(engine, **settings) -> openai.AsyncOpenAI:
    http = frontend_client(engine, **settings)
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)


async def chat(engine, payload, path="/v1/chat/completions", **settings):
    async with client(engine, **settings) as c:
        if isinstance(payload, (str, bytes)):
            return await c.post(path, content=payload, headers={"content-type": "application/json"})
        return await c.post(path, json=payload)


def sse_data(text: str) -> list[str]:
    """``data:`` payloads of an SSE body, in order (comments and blank lines skipped)."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [ln[5:].lstrip() for ln in block.split("\n") if ln.startswith("data:")]
        if lines:
            out.append("\n".join(lines))
    return out


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


USER = [{"role": "user", "content": "What is the capital of France?"}]


# ------------------------------------------------------------------ chat, text
def test_fake_implements_protocol(engine):
    assert isinstance(engine, Engine)


async def test_chat_whole_response_shape(engine):
    r = await chat(engine, {"model": "llm", "messages": USER, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "llm" and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "".join(ANSWER)
    assert choice["message"].get("audio") is None
    prompt_tokens = len(json.dumps(USER)) // 4
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": len(ANSWER),
                             "total_tokens": prompt_tokens + len(ANSWER)}
    model, req = engine.requests[0]
    assert model == "llm" and req.messages == USER and req.prompt is None
    assert req.sampling == {"temperature": 0.0}
    assert req.modalities is None and req.voice is None  # llm declares neither input


async def test_chat_sampling_parameters_passed(engine):
    r = await chat(engine, {"model": "llm", "messages": USER, "temperature": 0.7, "top_p": 0.9,
                            "max_tokens": 100, "max_completion_tokens": 3, "stop": "\n", "seed": 5,
                            "top_k": 20, "presence_penalty": 0})
    assert r.status_code == 200, r.text
    assert engine.requests[0][1].sampling == {"temperature": 0.7, "top_p": 0.9, "top_k": 20,
                                              "max_tokens": 3, "stop": ["\n"], "seed": 5}
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "".join(ANSWER[:3])
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


async def test_chat_developer_role_and_text_parts(engine):
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ann"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Capital?"}]
    r = await chat(engine, {"model": "llm", "messages": messages})
    assert r.status_code == 200, r.text
    sent = engine.requests[0][1].messages
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sent[1] == {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ann"}
    assert sent[2:] == messages[2:]


async def test_chat_n_choices_with_seed(engine):
    r = await chat(engine, {"model": "llm", "messages": USER, "n": 3, "seed": 10, "max_tokens": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == "".join(ANSWER[:4]) for c in body["choices"])
    assert sorted(req.sampling["seed"] for _, req in engine.requests) == [10, 11, 12]
    assert len({req.request_id for _, req in engine.requests}) == 3
    prompt_tokens = len(json.dumps(USER)) // 4  # counted once, as OpenAI does
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                             "total_tokens": prompt_tokens + 12}


async def test_chat_ids_unique(engine):
    async with client(engine) as c:
        rs = await asyncio.gather(*[c.post("/v1/chat/completions", json={"model": "llm", "messages": USER})
                                    for _ in range(8)])
    ids = [r.json()["id"] for r in rs]
    assert len(set(ids)) == 8


async def test_chat_served_model_name_alias(engine):
    r = await chat(engine, {"model": "mute-1", "messages": USER})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "mute-1" and engine.requests[0][0] == "mute"


# ------------------------------------------------------------------ chat, stream framing
async def test_chat_stream_sse_framing(engine):
    r = await chat(engine, {"model": "llm", "messages": USER, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "llm" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    middle = chunks[1:-1]
    assert [c["choices"][0]["delta"]["content"] for c in middle] == ANSWER
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "stop" and last["delta"] == {}
    assert all("usage" not in c for c in chunks)  # no include_usage: no usage anywhere


async def test_chat_stream_usage_chunk(engine):
    r = await chat(engine, {"model": "llm", "messages": USER, "stream": True, "n": 2,
                            "stream_options": {"include_usage": True}})
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    usage_chunk = json.loads(data[-2])
    assert usage_chunk["choices"] == []
    p = len(json.dumps(USER)) // 4
    assert usage_chunk["usage"] == {"prompt_tokens": p, "completion_tokens": 2 * len(ANSWER),
                                    "total_tokens": p + 2 * len(ANSWER)}
    chunks = [json.loads(d) for d in data[:-2]]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["delta"].get("content", "") for c in mine) == "".join(ANSWER)
        assert mine[-1]["finish_reason"] == "stop"


async def test_chat_stream_error_before_first_token_is_json_400(engine):
    long = [{"role": "user", "content": "x" * (MAX_PROMPT_CHARS + 1)}]
    for stream in (False, True):
        r = await chat(engine, {"model": "llm", "messages": long, "stream": stream})
        assert_error(r, 400, code="invalid_value")
        assert "context" in r.json()["error"]["message"]


async def test_chat_stream_error_mid_stream(engine):
    engine.fail_at = 3
    r = await chat(engine, {"model": "llm", "messages": USER, "stream": True})
    assert r.status_code == 200
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    err = json.loads(data[-2])
    assert set(err) == {"error"} and "boom" in err["error"]["message"]
    # and the OpenAI SDK turns it into an exception
    stream = await sdk(engine).chat.completions.create(model="llm", messages=USER, stream=True)
    with pytest.raises(openai.APIError, match="boom"):
        async for _ in stream:
            pass


# ------------------------------------------------------------------ OpenAI SDK
async def test_sdk_chat_non_stream_and_stream(engine):
    c = sdk(engine)
    resp = await c.chat.completions.create(model="llm", messages=USER, temperature=0, max_tokens=50)
    assert resp.choices[0].message.content == "".join(ANSWER)
    assert resp.usage.completion_tokens == len(ANSWER)
    stream = await c.chat.completions.create(model="llm", messages=USER, stream=True,
                                             stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    async for ch in stream:
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == "".join(ANSWER) and finish == "stop" and usage.completion_tokens == len(ANSWER)


async def test_sdk_completions(engine):
    c = sdk(engine)
    resp = await c.completions.create(model="llm", prompt="The capital of France is", max_tokens=5)
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.choices[0].text == "".join(ANSWER[:5]) and resp.choices[0].finish_reason == "length"
    assert engine.requests[0][1].prompt == "The capital of France is"
    stream = await c.completions.create(model="llm", prompt="Paris is", stream=True)
    text = ""
    async for ch in stream:
        text += "".join(choice.text for choice in ch.choices)
    assert text == "".join(ANSWER)


# ------------------------------------------------------------------ audio
async def test_chat_audio_routed_to_speech_twin(engine):
    r = await chat(engine, {"model": "llm", "messages": USER, "modalities": ["text", "audio"],
                            "audio": {"format": "wav", "voice": "joe"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "llm"
    model, req = engine.requests[0]
    assert model == "llm_tts" and req.modalities == ("text", "audio") and req.voice == "joe"
    message = body["choices"][0]["message"]
    assert message["content"] == "".join(ANSWER)
    audio = message["audio"]
    assert set(audio) == {"id", "data", "expires_at", "transcript"}
    assert audio["id"].startswith("audio_") and audio["transcript"] == message["content"]
    assert isinstance(audio["expires_at"], int)
    y, sr = sf.read(io.BytesIO(base64.b64decode(audio["data"])), dtype="int16")
    assert sr == SR and y.tobytes() == float_to_pcm16(engine.expected_audio())


async def test_only_a_streamed_answer_with_audio_that_asks_for_realtime_is_paced(engine):
    """PACED (real-time pacing, docs/scheduling.md "Pacing") is asked only for a streamed answer
    with audio whose request says ``stream_pacing: "realtime"``; a streamed answer with audio
    is unpaced by default (issue 29), and a whole answer or a text-only stream never is (the
    field is accepted and ignored there). Red when every streamed answer with audio is paced."""
    audio = {"modalities": ["text", "audio"], "audio": {"format": "pcm16", "voice": "joe"}}
    wav = {**audio, "audio": {"format": "wav", "voice": "joe"}}
    realtime = {"stream_pacing": "realtime"}
    for payload in ({"stream": True, **audio}, {"stream": True, **audio, "stream_pacing": "none"},
                    {"stream": True, **audio, **realtime}, {**wav, **realtime},
                    {"stream": True, "modalities": ["text"], **realtime}):
        r = await chat(engine, {"model": "llm_tts", "messages": USER, **payload})
        assert r.status_code == 200, r.text
    assert [req.paced for _, req in engine.requests] == [False, False, True, False, False]


async def test_an_unknown_stream_pacing_is_an_openai_400(engine):
    r = await chat(engine, {"model": "llm_tts", "messages": USER, "stream": True, "modalities": ["text", "audio"],
                            "stream_pacing": "slow"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"]) == ("invalid_request_error", "stream_pacing")
    assert "realtime" in err["message"]
    assert engine.requests == []


async def test_chat_audio_only_modality_and_default_voice(engine):
    r = await chat(engine, {"model": "llm_tts", "messages": USER, "modalities": ["audio"]})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] is None and message["audio"]["transcript"] == "".join(ANSWER)
    assert engine.requests[0][1].voice == "joe"


async def test_chat_text_to_speech_model_sends_text_modality(engine):
    r = await chat(engine, {"model": "llm_tts", "messages": USER, "modalities": ["text"]})
    assert r.status_code == 200
    assert engine.requests[0][1].modalities == ("text",)
    assert r.json()["choices"][0]["message"].get("audio") is None


async def test_chat_default_modalities_are_the_models(engine):
    """``modalities`` omitted: all the model's output modalities (vLLM-Omni): a spoken model
    speaks (wav, its default voice), a text model writes."""
    r = await chat(engine, {"model": "llm_tts", "messages": USER})
    assert r.status_code == 200, r.text
    assert engine.requests[0][1].modalities == ("text", "audio") and engine.requests[0][1].voice == "joe"
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "".join(ANSWER)
    y, sr = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])), dtype="int16")
    assert sr == SR and y.tobytes() == float_to_pcm16(engine.expected_audio())
    r = await chat(engine, {"model": "llm", "messages": USER})
    assert r.json()["choices"][0]["message"]["audio"] is None and engine.requests[1][0] == "llm"


@pytest.mark.parametrize("fmt", ["pcm16", "flac"])
async def test_chat_audio_other_formats(engine, fmt):
    r = await chat(engine, {"model": "llm", "messages": USER, "modalities": ["text", "audio"],
                            "audio": {"format": fmt, "voice": "joe"}})
    assert r.status_code == 200, r.text
    data = base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"])
    expected = float_to_pcm16(engine.expected_audio())
    if fmt == "pcm16":
        assert data == expected
    else:
        y, sr = sf.read(io.BytesIO(data), dtype="int16")
        assert sr == SR and y.tobytes() == expected


@pytest.mark.parametrize("fmt", ["wav", "pcm16"])
async def test_chat_audio_stream_interleaves_deltas(engine, fmt):
    r = await chat(engine, {"model": "llm", "messages": USER, "stream": True, "modalities": ["text", "audio"],
                            "audio": {"format": fmt, "voice": "joe"}})
    assert r.status_code == 200, r.text
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d)["choices"][0] for d in data[:-1]]
    first_delta = chunks[0]["delta"]
    audio_id = first_delta["audio"]["id"]
    assert first_delta["role"] == "assistant" and audio_id.startswith("audio_")
    kinds = ["audio" if "data" in c["delta"].get("audio", {}) else "text"
             for c in chunks[1:-1]]
    assert "audio" in kinds and kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("text")  # interleaved
    text = "".join(c["delta"].get("content") or "" for c in chunks)
    assert text == "".join(ANSWER)
    deltas = [base64.b64decode(c["delta"]["audio"]["data"]) for c in chunks
              if "data" in c["delta"].get("audio", {})]
    expected = float_to_pcm16(engine.expected_audio())
    if fmt == "wav":  # vLLM-Omni's convention: every delta is a complete WAV file
        pcm_parts = []
        for d in deltas:
            y, sr = sf.read(io.BytesIO(d), dtype="int16")
            assert sr == SR
            pcm_parts.append(y.tobytes())
        assert b"".join(pcm_parts) == expected
    else:  # OpenAI's pcm16: raw PCM deltas
        assert b"".join(deltas) == expected
    last = chunks[-1]
    assert last["finish_reason"] == "stop"
    assert last["delta"]["audio"]["id"] == audio_id and last["delta"]["audio"]["transcript"] == text
    assert isinstance(last["delta"]["audio"]["expires_at"], int)


async def test_sdk_chat_audio(engine):
    c = sdk(engine)
    resp = await c.chat.completions.create(model="llm", messages=USER, modalities=["text", "audio"],
                                           audio={"format": "wav", "voice": "joe"})
    audio = resp.choices[0].message.audio
    assert audio.transcript == resp.choices[0].message.content == "".join(ANSWER)
    y, sr = sf.read(io.BytesIO(base64.b64decode(audio.data)))
    assert sr == SR and len(y) == len(engine.expected_audio())


@pytest.mark.parametrize(
    "payload, status, param, code",
    [
        ({"model": "mute", "modalities": ["text", "audio"]}, 400, "modalities", "unsupported_modality"),
        ({"model": "llm", "modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "no-such-voice"}},
         400, "audio.voice", "invalid_voice"),
        ({"model": "llm", "modalities": ["text", "audio"], "audio": {"format": "aac", "voice": "joe"}},
         400, "audio.format", "unsupported_format"),
        ({"model": "llm", "modalities": ["text", "audio"], "audio": {"format": "opus", "voice": "joe"}},
         400, "audio.format", "unsupported_format"),  # 22050 Hz: no Opus without resampling
        ({"model": "llm", "modalities": ["text", "audio"], "audio": {"format": "flac", "voice": "joe"},
          "stream": True}, 400, "audio.format", "unsupported_format"),
        ({"model": "llm", "audio": {"format": "wav", "voice": "joe"}}, 400, "audio", "invalid_value"),
        ({"model": "llm", "modalities": ["video"]}, 400, "modalities", "invalid_value"),
    ],
)
async def test_chat_audio_errors(engine, payload, status, param, code):
    r = await chat(engine, {"messages": USER, **payload})
    assert_error(r, status, param=param, code=code)
    assert engine.requests == []


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "payload, param",
    [
        ({"model": "llm", "messages": []}, "messages"),
        ({"model": "llm"}, "messages"),
        ({"model": "llm", "messages": [{"role": "robot", "content": "hi"}]}, "messages"),
        ({"model": "llm", "messages": [{"role": "tool", "content": "hi"}]}, "messages"),
        ({"model": "llm", "messages": [{"role": "user"}]}, "messages.0.content"),
        ({"model": "llm",
          "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages.0.content.0"),  # a text-only model names the part it cannot take
        ({"model": "llm", "messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"model": "llm", "messages": USER, "max_tokens": -5}, "max_tokens"),
        ({"model": "llm", "messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"model": "llm", "messages": USER, "max_tokens": 4096}, "max_tokens"),  # > max_model_len
        ({"model": "llm", "messages": USER, "temperature": 2.5}, "temperature"),
        ({"model": "llm", "messages": USER, "temperature": -0.1}, "temperature"),
        ({"model": "llm", "messages": USER, "temperature": "hot"}, "temperature"),
        ({"model": "llm", "messages": USER, "top_p": 0}, "top_p"),
        ({"model": "llm", "messages": USER, "n": 0}, "n"),
        ({"model": "llm", "messages": USER, "stop": 3}, "stop"),
        ({"model": "llm", "messages": USER, "logprobs": True}, "logprobs"),
        ({"model": "llm", "messages": USER, "presence_penalty": 1.0}, "presence_penalty"),
        ({"messages": USER}, "model"),
        ({"model": "piper_tts", "messages": USER}, "model"),
    ],
)
async def test_chat_bad_input_400(engine, payload, param):
    r = await chat(engine, payload)
    err = assert_error(r, 400, param=param)
    assert err["type"] == "invalid_request_error"
    assert engine.requests == []


async def test_chat_unknown_model_404_and_malformed_json(engine):
    assert_error(await chat(engine, {"model": "gpt-9", "messages": USER}), 404, param="model",
                 code="model_not_found")
    assert_error(await chat(engine, '{"model": "llm", "messages": ['), 400, code="invalid_json")
    assert_error(await chat(engine, '{"model": "llm", "prompt": ', "/v1/completions"), 400,
                 code="invalid_json")
    # the app still answers
    assert (await chat(engine, {"model": "llm", "messages": USER})).status_code == 200


async def test_chat_model_not_ready_503(engine):
    engine.models["llm"] = ModelInfo(name="llm", state="UNAVAILABLE", inputs=CHAT_INPUTS, outputs=TEXT_OUTPUTS)
    r = await chat(engine, {"model": "llm", "messages": USER})
    assert_error(r, 503, code="model_not_ready")
    assert r.headers["retry-after"] == "1"


async def test_chat_engine_error_500(engine):
    engine.fail_at = 0
    assert_error(await chat(engine, {"model": "llm", "messages": USER}), 500, code="inference_error")


@pytest.mark.parametrize(
    "payload, param",
    [
        ({"model": "llm", "prompt": ""}, "prompt"),
        ({"model": "llm", "prompt": []}, "prompt"),
        ({"model": "llm", "prompt": [1, 2, 3]}, "prompt"),
        ({"model": "llm", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "llm", "prompt": "x", "echo": True}, "echo"),
        ({"model": "piper_tts", "prompt": "x"}, "model"),
    ],
)
async def test_completions_bad_input_400(engine, payload, param):
    assert_error(await chat(engine, payload, "/v1/completions"), 400, param=param)
    assert engine.requests == []


# ------------------------------------------------------------------ completions
async def test_completions_default_max_tokens_and_usage(engine):
    r = await chat(engine, {"model": "llm", "prompt": "Paris is"}, "/v1/completions")
    assert r.status_code == 200, r.text
    assert engine.requests[0][1].sampling == {"max_tokens": 16}  # OpenAI's default
    body = r.json()
    assert body["choices"][0]["text"] == "".join(ANSWER)
    p = len("Paris is") // 4
    assert body["usage"] == {"prompt_tokens": p, "completion_tokens": len(ANSWER), "total_tokens": p + len(ANSWER)}


async def test_completions_prompt_list_with_n(engine):
    r = await chat(engine, {"model": "llm", "prompt": ["aaaaaaaa", "bbbbbbbbbbbbbbbb"], "n": 2, "max_tokens": 2,
                            "seed": 1}, "/v1/completions")
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [req.prompt for _, req in engine.requests] == ["aaaaaaaa"] * 2 + ["bbbbbbbbbbbbbbbb"] * 2
    assert [req.sampling["seed"] for _, req in engine.requests] == [1, 2, 1, 2]
    assert body["usage"]["prompt_tokens"] == 2 + 4  # each prompt once
    assert body["usage"]["completion_tokens"] == 8


async def test_completions_stream(engine):
    r = await chat(engine, {"model": "llm", "prompt": "x", "stream": True, "max_tokens": 3,
                            "stream_options": {"include_usage": True}}, "/v1/completions")
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "".join(ANSWER[:3])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


# ------------------------------------------------------------------ models
async def test_models_list_modalities(engine):
    async with client(engine) as c:
        body = (await c.get("/v1/models")).json()
        one = (await c.get("/v1/models/mute-1")).json()
    cards = {m["id"]: m for m in body["data"]}
    assert cards["llm"]["modalities"] == ["text"] and cards["llm"]["max_model_len"] == 2048
    assert cards["llm_tts"]["modalities"] == ["text", "audio"]
    assert cards["piper_tts"]["modalities"] == ["audio"]
    assert "mute-1" in cards and "mute" not in cards and cards["mute-1"]["modalities"] == ["text"]
    assert "modalities" not in cards["csm_talker"]  # internal stage: no answer modality
    assert one["id"] == "mute-1"


# ------------------------------------------------------------------ cancellation / admission
async def drive_until_disconnect(app, path: str, payload: dict, engine: ChatFakeEngine):
    """Send the request by hand, then report ``http.disconnect`` once the engine is parked."""
    body = json.dumps(payload).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": b"", "client": ("test", 1), "server": ("test", 80),
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    sent: list[dict] = []
    request_sent = False

    async def receive():
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await engine.reached_block.wait()
        await asyncio.sleep(0.05)  # let the already generated deltas go out first
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return sent


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("path, extra", [("/v1/chat/completions", {"messages": USER}),
                                         ("/v1/completions", {"prompt": "x"})])
async def test_client_disconnect_cancels_every_choice(engine, stream, path, extra):
    engine.block_at = 3
    app = create_app(engine, Settings(max_inflight=1))
    sent = await drive_until_disconnect(app, path, {"model": "llm", "n": 2, "stream": stream, **extra}, engine)
    if stream:
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    for _ in range(100):  # cancellation of the fake's tasks completes within a few loop turns
        if engine.cancelled == 2:
            break
        await asyncio.sleep(0.01)
    assert engine.cancelled == 2 and engine.completed == 0
    assert app.state.admission.inflight == 0


async def test_admission_429(engine):
    engine.block_at = 1
    app = create_app(engine, Settings(max_inflight=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        first = asyncio.create_task(c.post("/v1/chat/completions", json={"model": "llm", "messages": USER}))
        await asyncio.wait_for(engine.reached_block.wait(), 5)
        r = await c.post("/v1/completions", json={"model": "llm", "prompt": "x"})
        assert_error(r, 429, code="rate_limit_exceeded")
        assert r.headers["retry-after"] == "1"
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert engine.cancelled == 1


async def test_metrics_count_chat_requests(engine):
    async with client(engine) as c:
        await c.post("/v1/chat/completions", json={"model": "llm", "messages": USER, "stream": True})
        await c.post("/v1/completions", json={"model": "llm", "prompt": "x"})
        text = (await c.get("/metrics")).text
    assert 'omni_frontend_generation_requests_total{endpoint="chat",mode="stream",model="llm",outcome="ok"} 1.0' in text
    assert ('omni_frontend_generation_requests_total{endpoint="completions",mode="whole",model="llm",outcome="ok"} 1.0'
            in text)
    assert 'omni_frontend_completion_tokens_total{model="llm"} 14.0' in text


async def test_metrics_itl_and_tpot_per_single_choice_request(engine):
    """ITL: one observation per text chunk after the first; TPOT: one per request with >= 2
    tokens; none for n > 1 (chunks of several choices interleave)."""
    n = len(engine.answer)
    async with client(engine) as c:
        await c.post("/v1/chat/completions", json={"model": "llm", "messages": USER, "stream": True})
        await c.post("/v1/chat/completions", json={"model": "llm", "messages": USER, "n": 2})
        text = (await c.get("/metrics")).text
    assert f'omni_frontend_inter_token_latency_seconds_count{{model="llm"}} {float(n - 1)}' in text
    assert 'omni_frontend_time_per_output_token_seconds_count{model="llm"} 1.0' in text


async def test_chat_audio_openai_voice_name_maps_to_the_models_voice(engine):
    """OpenAI's voice names speak with the model's own voice (docs/voices.md), not a 400."""
    r = await chat(engine, {"model": "llm", "messages": USER, "modalities": ["text", "audio"],
                            "audio": {"format": "wav", "voice": "alloy"}})
    assert r.status_code == 200, r.text
    assert engine.requests[0][1].voice == "joe"
