"""vLLM-Omni's client conventions (issue 14: a drop-in for its benchmark client) against the
in-process fakes: SSE framing, extension fields, ``modality`` on chat chunks, one complete WAV per
streamed audio chunk, default output modalities, image chat streams, stage metrics, /tokenize and
the speech ``sample_rate``. docs/vllm_omni_compat.md has the table these tests guard.
"""

from __future__ import annotations

import base64
import io
import json
import wave

import httpx
import numpy as np
import pytest
import soundfile as sf

from openai_frontend.app import Settings, create_app
from test_chat_frontend import ANSWER, SR, USER, assert_error
from test_frontend_bad_input import AllFake

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return AllFake()


def client(engine, **settings) -> httpx.AsyncClient:
    app = create_app(engine, Settings(**settings))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def post(engine, path, payload, **settings) -> httpx.Response:
    async with client(engine, **settings) as c:
        return await c.post(path, json=payload)


def vllm_messages(body: bytes) -> list[str]:
    """The SSE messages as vLLM's benchmark parser sees them (``StreamedResponseHandler``:
    split on ``\\n\\n``, each message stripped), without ``data: `` prefixes."""
    messages = [m.strip() for m in body.decode("utf-8").split("\n\n") if m.strip()]
    out = []
    for m in messages:
        assert m.startswith("data: ") or m.startswith("event: ") or m.startswith(":"), m
        out.append(m)
    return out


def data_payloads(body: bytes) -> list[str]:
    """``data:`` payloads (one line each: every event here is one line of JSON)."""
    out = []
    for m in vllm_messages(body):
        lines = [ln for ln in m.split("\n") if ln.startswith("data: ")]
        assert len(lines) == 1, m
        out.append(lines[0][len("data: "):])
    return out


def chunks_of(r: httpx.Response) -> list[dict]:
    payloads = data_payloads(r.content)
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


# ------------------------------------------------------------------ 1. SSE framing
@pytest.mark.parametrize("path, payload", [
    ("/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True}),
    ("/v1/completions", {"model": "llm", "prompt": "Paris is", "stream": True}),
    ("/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "stream_format": "sse"}),
])
async def test_sse_events_end_in_lf_lf(engine, path, payload):
    r = await post(engine, path, payload)
    assert r.status_code == 200, r.text
    assert b"\r" not in r.content  # sse-starlette's default separator is \r\n
    payloads = data_payloads(r.content)
    assert len(payloads) >= 2
    if path != "/v1/audio/speech":
        assert payloads[-1] == "[DONE]"
        assert all(json.loads(p) for p in payloads[:-1])
    else:
        assert [json.loads(p)["type"] for p in payloads][-1] == "speech.audio.done"


# ------------------------------------------------------------------ 2. unknown and extension fields
UNKNOWN = [
    ("/v1/chat/completions", {"model": "llm", "messages": [{**USER[0], "tool_calls": []}], "tools": [],
                              "stream_options": {"include_usage": True, "foo": 1}},
     ["tools", "stream_options.foo", "messages.0.tool_calls"]),
    ("/v1/completions", {"model": "llm", "prompt": "Paris is", "best_of": 2}, ["best_of"]),
    ("/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "response_format": "wav",
                          "task_type": "CustomVoice"}, ["task_type"]),
    ("/v1/images/generations", {"model": "qwen_image", "prompt": "a fox", "colour": "red"}, ["colour"]),
]


@pytest.mark.parametrize("path, payload, names", UNKNOWN)
async def test_unknown_fields_ignored_and_named_by_default(engine, path, payload, names, caplog):
    r = await post(engine, path, payload)
    assert r.status_code == 200, r.text
    assert r.headers["x-ignored-fields"] == ", ".join(names)
    assert all(n in caplog.text for n in names)


@pytest.mark.parametrize("path, payload, names", UNKNOWN)
async def test_unknown_fields_400_with_strict_params(engine, path, payload, names):
    r = await post(engine, path, payload, strict_params=True)
    err = assert_error(r, 400, param=names[0].split(".")[0], code="unknown_parameter")
    assert "Unrecognized request argument" in err["message"] and names[0] in err["message"]


async def test_unknown_edit_form_field_ignored_or_400(engine):
    from test_images_frontend import png_bytes

    for strict in (False, True):
        async with client(engine, strict_params=strict) as c:
            r = await c.post("/v1/images/edits", files={"image": ("a.png", png_bytes(), "image/png")},
                             data={"prompt": "x", "bogus": "1"})
        if strict:
            assert_error(r, 400, param="bogus", code="unknown_parameter")
        else:
            assert r.status_code == 200 and r.headers["x-ignored-fields"] == "bogus"


async def test_known_fields_have_no_header_and_types_stay_strict(engine):
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER})
    assert r.status_code == 200 and "x-ignored-fields" not in r.headers
    # issue 9's strict types are unchanged: only unknown *names* are lenient
    for bad in ({"max_tokens": True}, {"n": "2"}, {"stream_options": {"continuous_usage_stats": "yes"}}):
        r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, **bad})
        assert_error(r, 400)
    r = await post(engine, "/v1/audio/speech", {"model": "piper_tts", "input": "x", "ignore_eos": 1})
    assert_error(r, 400, param="ignore_eos")


async def test_vllm_extension_fields_accepted(engine):
    r = await post(engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "ignore_eos": True,
                                                "response_format": "wav"})
    assert r.status_code == 200 and "x-ignored-fields" not in r.headers
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "ignore_eos": True})
    assert r.status_code == 200 and engine.requests[-1][1].sampling["ignore_eos"] is True


async def test_continuous_usage_stats_on_every_chunk(engine):
    r = await post(engine, "/v1/chat/completions", {
        "model": "llm", "messages": USER, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    chunks = chunks_of(r)
    *per_choice, final = chunks
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == len(ANSWER)
    assert all("usage" in c for c in per_choice)
    counts = [c["usage"]["completion_tokens"] for c in per_choice]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == len(ANSWER)
    text_chunks = [c for c in per_choice if c["choices"][0]["delta"].get("content")]
    assert [c["usage"]["completion_tokens"] for c in text_chunks] == list(range(1, len(ANSWER) + 1))
    prompt = final["usage"]["prompt_tokens"]
    assert all(c["usage"]["prompt_tokens"] == prompt for c in per_choice[1:])
    assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in per_choice)
    # without continuous_usage_stats: usage only on the last chunk (OpenAI)
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    assert [("usage" in c) for c in chunks_of(r)] == [False] * (len(chunks_of(r)) - 1) + [True]


async def test_continuous_usage_stats_completions(engine):
    r = await post(engine, "/v1/completions", {
        "model": "llm", "prompt": "Paris is", "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    chunks = chunks_of(r)
    texts = [c for c in chunks[:-1] if c["choices"][0]["text"]]
    assert [c["usage"]["completion_tokens"] for c in texts] == list(range(1, len(ANSWER) + 1))


# ------------------------------------------------------------------ 3. + 4. modality, audio chunks
def client_audio_seconds(chunks: list[dict]) -> float:
    """What vLLM-Omni's benchmark client counts: ``modality == "audio"`` chunks, each data
    opened with ``wave.open``, frames summed over the first chunk's rate."""
    frames, rate = 0, None
    for c in chunks:
        if c.get("modality") != "audio":
            continue
        data = (c["choices"][0]["delta"].get("audio") or {}).get("data")
        if data:
            with wave.open(io.BytesIO(base64.b64decode(data)), "rb") as w:
                rate = rate or w.getframerate()
                frames += w.getnframes()
    return frames / rate if rate else 0.0


async def test_every_chunk_has_its_modality(engine):
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True,
                                                    "modalities": ["text", "audio"]})
    chunks = chunks_of(r)
    assert all(c["modality"] in ("text", "audio") for c in chunks)
    for c in chunks[1:-1]:
        delta = c["choices"][0]["delta"]
        assert ("content" in delta) == (c["modality"] == "text")
        assert ("data" in delta.get("audio", {})) == (c["modality"] == "audio")
    assert chunks[0]["modality"] == "text" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"


async def test_streamed_wav_audio_counts_like_vllm_omni(engine):
    """audio.format wav (or none): each chunk a complete WAV, so the client counts all of it."""
    expected = len(engine.expected_audio()) / SR
    for audio in ({"format": "wav", "voice": "joe"}, None):
        payload = {"model": "llm", "messages": USER, "stream": True, "modalities": ["text", "audio"]}
        if audio:
            payload["audio"] = audio
        r = await post(engine, "/v1/chat/completions", payload)
        assert client_audio_seconds(chunks_of(r)) == pytest.approx(expected)


async def test_streamed_pcm16_audio_stays_raw(engine):
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True,
                                                    "modalities": ["text", "audio"],
                                                    "audio": {"format": "pcm16", "voice": "joe"}})
    audio = [base64.b64decode(c["choices"][0]["delta"]["audio"]["data"]) for c in chunks_of(r)
             if c["modality"] == "audio" and "data" in c["choices"][0]["delta"].get("audio", {})]
    assert audio and not any(a.startswith(b"RIFF") for a in audio)
    assert sum(len(a) for a in audio) == 2 * len(engine.expected_audio())
