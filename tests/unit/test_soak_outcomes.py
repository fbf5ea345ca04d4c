"""How the soak client (clients/soak.py) classifies answers: a 503 is its own outcome (never a
success), a 429/503 without ``Retry-After`` or the OpenAI error body is a failure, and a 200
event stream that fails in-band (an SSE error event, an error chunk, a chat stream without
``[DONE]``) is a failure."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from clients.soak import FAILURES, Soak

ERROR = {"error": {"message": "Triton is unavailable", "type": "server_error", "param": None, "code": None}}


def _outcomes(handler, kind: str) -> dict:
    """Send one request of ``kind`` through the soak client to ``handler``; its outcome counts."""
    soak = Soak("http://soak.test", {"piper_tts", "llm"}, timeout_s=5, seed=0)

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await soak.one(client, kind)

    asyncio.run(run())
    return dict(soak.counts[kind])


def _sse(*lines: str):
    return lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                          content="".join(f"{ln}\n\n" for ln in lines).encode())


@pytest.mark.parametrize("kind", ["speech_wav", "chat_stream", "speech_sse"])
def test_a_well_formed_503_is_counted_as_503_not_as_success(kind):
    outcomes = _outcomes(lambda r: httpx.Response(503, headers={"Retry-After": "1"}, json=ERROR), kind)
    assert outcomes == {"503": 1}
    assert "503" not in FAILURES  # bounded by the caller (tests/e2e/test_soak.py: MAX_503)


@pytest.mark.parametrize("status", [429, 503])
def test_a_refusal_without_retry_after_or_the_error_body_is_a_failure(status):
    assert _outcomes(lambda r: httpx.Response(status, json=ERROR), "speech_wav") == {"bad_refusal": 1}
    assert _outcomes(lambda r: httpx.Response(status, headers={"Retry-After": "1"}, text="busy"),
                     "speech_wav") == {"bad_refusal": 1}
    assert _outcomes(lambda r: httpx.Response(status, headers={"Retry-After": "1"}, json={"error": {"message": ""}}),
                     "speech_wav") == {"bad_refusal": 1}
    assert _outcomes(lambda r: httpx.Response(status, headers={"Retry-After": "1"}, json=ERROR),
                     "speech_wav") == {str(status): 1}


def test_chat_stream_outcomes():
    chunk = json.dumps({"choices": [{"delta": {"content": "Paris"}}]})
    assert _outcomes(_sse(f"data: {chunk}", "data: [DONE]"), "chat_stream") == {"2xx": 1}
    assert _outcomes(_sse(f"data: {chunk}", f"data: {json.dumps(ERROR)}"), "chat_stream") == {"stream_error": 1}
    assert _outcomes(_sse(f"data: {chunk}"), "chat_stream") == {"stream_error": 1}  # ended without [DONE]


def test_speech_sse_outcomes():
    delta = 'data: {"type": "speech.audio.delta", "audio": "AAAA"}'
    done = 'data: {"type": "speech.audio.done", "usage": {}}'
    err = 'data: {"type": "speech.audio.error", "error": {"message": "stage died"}}'
    assert _outcomes(_sse("event: speech.audio.delta", delta, "event: speech.audio.done", done),
                     "speech_sse") == {"2xx": 1}
    assert _outcomes(_sse("event: speech.audio.delta", delta, "event: speech.audio.error", err),
                     "speech_sse") == {"stream_error": 1}


def test_soak_cli_fails_on_every_failure_class():
    assert set(FAILURES) >= {"5xx", "hang", "transport", "bad_refusal", "stream_error"}
