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
