"""``middleware.SendTimeout`` on the real uvicorn: a client that asks for a streamed speech
response and then stops reading must not hold its admission slot (nor its Triton stream) for
longer than ``--send-timeout-s``; other clients are then served again."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import numpy as np
import pytest
from engine_stub import EngineStub

from openai_frontend.app import Settings, create_app
from openai_frontend.engine import ModelInfo
from tests.helpers.frontend import serve_in_thread

TIMEOUT_S = 1.0
SLOTS = 2
MODEL = ModelInfo(name="piper_tts", inputs=frozenset({"TEXT", "VOICE", "SPEED"}),
                  outputs=frozenset({"AUDIO", "SAMPLE_RATE"}), decoupled=True, voices=("joe",),
                  default_voice="joe", sample_rate=22050)


class EndlessSpeech(EngineStub):
    """Speech that never ends: 1 s chunks of noise (44 KB of PCM each) until cancelled."""

    def __init__(self):
        self.open_streams = 0

    async def list_models(self):
        return [MODEL]

    async def get_model(self, name):
        if name != MODEL.name:
            return await super().get_model(name)
        return MODEL

    async def synthesize(self, model, text, voice=None, speed=None, options=None, paced=False):
        self.open_streams += 1
        chunk = np.random.default_rng(0).uniform(-0.5, 0.5, 22050).astype(np.float32)
        try:
            while True:
                await asyncio.sleep(0.001)
                yield chunk, 22050
        finally:
            self.open_streams -= 1


def _serve(app):
    """uvicorn on a free loopback port, in a thread (tests/helpers/frontend.py)."""
    return serve_in_thread(app, log_level="warning")


def _stalled_reader(port: int, stream_format: str) -> socket.socket:
    """A client that sends a streamed PCM speech request (raw bytes or SSE), reads the status
    line, then stops reading."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"model": "piper_tts", "input": "a" * 4000, "response_format": "pcm",
                       "stream": True, "stream_format": stream_format}).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head = sock.recv(256)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_client_that_stops_reading_releases_its_slot(stream_format):
    engine = EndlessSpeech()
    app = create_app(engine, Settings(max_inflight=SLOTS, send_timeout_s=TIMEOUT_S), close_engine=False)
    server, thread, port = _serve(app)
    socks = []
    try:
        socks = [_stalled_reader(port, stream_format) for _ in range(SLOTS)]
        admission = app.state.admission
        assert admission.inflight == SLOTS
        # the slots are full: another client is refused meanwhile
        r = httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", timeout=10,
                       json={"model": "piper_tts", "input": "hi", "response_format": "pcm"})
        assert r.status_code == 429
        deadline = time.monotonic() + TIMEOUT_S + 5  # fill the socket buffers, then the timeout, then slack
        while admission.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert admission.inflight == 0, "a client that stopped reading still holds its admission slot"
        assert engine.open_streams == 0, "the Triton stream of an abandoned response was not cancelled"
        # the server dropped the stalled connections (uvicorn forgets a connection once it is lost)
        while server.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.server_state.connections, "the stalled connections are still open"
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert f"omni_frontend_send_timeouts_total {float(SLOTS)}" in metrics
        # a normal client is served again
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/audio/speech", timeout=10,
                          json={"model": "piper_tts", "input": "hi", "response_format": "pcm",
                                "stream": True}) as r:
            assert r.status_code == 200
            assert len(next(r.iter_bytes())) > 0
    finally:
        for sock in socks:
            sock.close()
        server.should_exit = True
        thread.join(10)


def test_a_reading_client_is_not_cut():
    """A client that reads a long stream (slower than the timeout in total) keeps it."""
    engine = EndlessSpeech()
    app = create_app(engine, Settings(max_inflight=SLOTS, send_timeout_s=TIMEOUT_S), close_engine=False)
    server, thread, port = _serve(app)
    try:
        received = 0
        start = time.monotonic()
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/audio/speech", timeout=10,
                          json={"model": "piper_tts", "input": "hi", "response_format": "pcm",
                                "stream": True}) as r:
            for data in r.iter_bytes():
                received += len(data)
                if time.monotonic() - start > 2 * TIMEOUT_S:
                    break
                time.sleep(0.01)
        assert received > 44100
        assert "omni_frontend_send_timeouts_total 0.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.should_exit = True
        thread.join(10)
