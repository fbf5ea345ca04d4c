"""Chaos: kill -9 one stage's stub, and separately tritonserver itself, while requests are in
flight. Only the killed stage's requests may fail, each must end promptly (no hang, no admission
slot kept), and the stage / server must serve again. Recovery times are printed for the notes.

The stub test uses the session stack (``kills_stub("piper")``: serve reloading the piper stage is expected).
The tritonserver test starts its own ``omni-triton serve`` (piper_tts only, restarts in seconds),
so the session server's no-crash checks stay meaningful.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
from conftest import wait_for_stub_death_report
from prometheus_client.parser import text_string_to_metric_families

from clients.soak import refusal_problem
from omni_triton.serve.process import free_port
from tests.helpers.stubs import stub_processes

pytestmark = pytest.mark.e2e

LONG_TEXT = " ".join(f"This is sentence number {i} of a long text." for i in range(60))


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        t0 = time.monotonic()
        try:
            out["result"] = fn()
        except Exception as exc:
            out["error"] = repr(exc)
        out["ended_s"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _sse_speech(url: str, events: list | None = None) -> list[str]:
    """Event names of a streamed (SSE) speech request for LONG_TEXT (appended to ``events`` as
    they arrive, when given). Paced to real time (``stream_pacing``), so it is still running
    when its stage is killed; unpaced it would end within a second or two."""
    events = [] if events is None else events
    with httpx.stream("POST", f"{url}/v1/audio/speech", timeout=300, json={
            "model": "piper_tts", "voice": "joe", "input": LONG_TEXT, "stream_format": "sse",
            "stream_pacing": "realtime"}) as r:
        for line in r.iter_lines():
            if line.startswith("event:"):
                events.append(line.split(":", 1)[1].strip())
    return events


@pytest.mark.kills_stub("piper")
def test_killing_a_stage_fails_only_its_requests_and_they_end_promptly(stack):
    url = stack.frontend_url
    chat_body = {"model": "llm", "messages": [{"role": "user", "content": "What is the capital of Japan?"}],
                 "max_tokens": 24, "temperature": 0}
    live_events: list[str] = []
    streamed, streamed_out = _in_thread(lambda: _sse_speech(url, live_events))
    whole, whole_out = _in_thread(lambda: httpx.post(f"{url}/v1/audio/speech", timeout=300, json={
        "model": "piper_tts", "voice": "joe", "input": LONG_TEXT, "response_format": "wav"}))
    chat, chat_out = _in_thread(lambda: httpx.post(f"{url}/v1/chat/completions", json=chat_body,
                                                   timeout=300).status_code)
    # all three are running, and the stream has started (a stage that dies before the first chunk
    # is a 503 before any event: CI12 once killed it 1.5 s in, before the first audio)
    deadline = time.monotonic() + 60
    while "speech.audio.delta" not in live_events and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    (stub,) = stub_processes("piper", stack.triton_pid)
    log_from = os.path.getsize(stack.log_path)
    killed_at = time.monotonic()
    os.kill(stub.pid, signal.SIGKILL)
    for t in (streamed, whole, chat):
        t.join(timeout=240)
    assert not streamed.is_alive() and not whole.is_alive() and not chat.is_alive(), "a request hangs"
    ended = time.monotonic() - killed_at
    # The stream ends with an error event instead of hanging (Triton 2.51 never finishes it).
    assert "speech.audio.error" in streamed_out.get("result", []), streamed_out
    # Speech has no side effects: the whole-clip request is retried on the reloaded stage (200),
    # or, if the reload takes too long, a clear 503.
    whole_r = whole_out.get("result")
    assert whole_r is not None and whole_r.status_code in (200, 503), whole_out
    assert whole_r.status_code == 200 or refusal_problem(503, whole_r.headers, whole_r.content) is None, whole_r.text
    assert chat_out.get("result") == 200, chat_out  # another stage's request is untouched
    back = time.monotonic()
    while httpx.post(f"{url}/v1/audio/speech", timeout=120, json={
            "model": "piper_tts", "voice": "joe", "input": "Back.", "response_format": "wav"}).status_code != 200:
        assert time.monotonic() - back < 120, "piper_tts did not come back"
        time.sleep(0.5)
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["serve"]["stub_reloads"].get("piper", 0) >= 1, health
    wait_for_stub_death_report(stack, "piper", log_from)  # this test's report, not the next one's
    print(json.dumps({"stub_kill": {"requests_ended_s": round(ended, 1),
                                    "stream_ended_s": round(streamed_out["ended_s"], 1),
                                    "whole": whole_r.status_code,
                                    "serving_again_s": round(time.monotonic() - killed_at, 1)}}))
    # no admission slot leaked: every request above released its slot
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    inflight = [s for f in text_string_to_metric_families(metrics) for s in f.samples
                if s.name.startswith("omni_frontend_inflight")]
    assert inflight and all(s.value == 0 for s in inflight), inflight


def test_killing_tritonserver_ends_requests_with_503_and_serve_brings_it_back(tmp_path):
    ports = {k: free_port() for k in ("http", "grpc", "metrics", "frontend")}
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_triton", "serve", "--models", "piper", "--skip-prepare",
         "--port", str(ports["frontend"]), "--triton-http-port", str(ports["http"]),
         "--triton-grpc-port", str(ports["grpc"]), "--triton-metrics-port", str(ports["metrics"])],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{ports['frontend']}"
    try:
        deadline = time.monotonic() + 300
        while "serving; Ctrl-C" not in (tmp_path / "serve.log").read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        (triton,) = [p for p in psutil.Process(proc.pid).children() if p.name() == "tritonserver"]
        streamed, streamed_out = _in_thread(lambda: _sse_speech(url))
        time.sleep(1.0)
        killed_at = time.monotonic()
        triton.kill()
        streamed.join(timeout=120)
        assert not streamed.is_alive(), "the stream hangs after tritonserver died"
        events = streamed_out.get("result")
        assert events is None or "speech.audio.done" not in events, streamed_out  # it did not "succeed"
        # Meanwhile: 503 with Retry-After (never a hang or a connection refused).
        r = httpx.post(f"{url}/v1/audio/speech", timeout=60, json={
            "model": "piper_tts", "voice": "joe", "input": "Hello.", "response_format": "wav"})
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert refusal_problem(503, r.headers, r.content) is None, r.text
        while True:
            r = httpx.post(f"{url}/v1/audio/speech", timeout=60, json={
                "model": "piper_tts", "voice": "joe", "input": "Hello.", "response_format": "wav"})
            if r.status_code == 200:
                break
            assert time.monotonic() - killed_at < 180, r.text
            time.sleep(0.2)
        recovered = time.monotonic() - killed_at
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["serve"]["restarts"] == 1 and health["serve"]["last_crash"]["reason"], health
        print(json.dumps({"triton_kill": {"stream_ended_s": round(streamed_out["ended_s"], 1),
                                          "serving_again_s": round(recovered, 1)}}))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
