"""On-demand models against the real stack (issue 28 item 2): its own ``omni-triton serve`` with
``piper`` pinned and ``csm`` (OpenAI ``tts``), ``qwen_image`` and ``broken`` on demand. ``broken`` is
a config in a temporary repository the frontend reads (``--model-repository``) but tritonserver's
repositories lack, so Triton fails its load. The budget is computed from the configs' ``pss_mib``
so that ``piper`` + ``csm`` and ``piper`` + ``qwen_image`` fit and all three do not.

Run alone, under the server lock: ``flock /tmp/omni-server.lock .venv/bin/python -m pytest -q
tests/e2e/test_on_demand_served.py``. The policy's unit tests: tests/unit/test_on_demand.py,
tests/unit/test_on_demand_frontend.py."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from clients.bench_common import metric_total
from omni_triton.paths import model_repositories
from omni_triton.serve.on_demand import PipelineGraph
from omni_triton.serve.process import free_port
from tests.helpers.serve_process import wait_healthy

pytestmark = pytest.mark.e2e

KEEP_ALIVE_S = 6.0
READY_TIMEOUT_S = 600


def _budget_mib() -> int:
    g = PipelineGraph.from_repositories(["piper"], ["csm", "qwen_image"])
    size = {name: sum(g.pss_mib[m] for m in p.models) for name, p in g.pipelines.items()}
    fits_one = size["piper"] + max(size["csm"], size["qwen_image"])
    assert fits_one < size["piper"] + size["csm"] + size["qwen_image"]
    return int(fits_one) + 1


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``omni-triton serve`` with on-demand models; yields ``(frontend URL, serve log path)``."""
    tmp = tmp_path_factory.mktemp("on_demand")
    broken = tmp / "repo" / "broken"
    broken.mkdir(parents=True)  # piper's config under another name: Triton has no such model
    piper_cfg = (model_repositories()[0] / "piper" / "config.pbtxt").read_text()
    (broken / "config.pbtxt").write_text(piper_cfg.replace('name: "piper"', 'name: "broken"').replace(
        'string_value: "piper_tts"', 'string_value: "broken"'))
    port = free_port()
    log_path = tmp / "serve.log"
    cmd = [sys.executable, "-m", "omni_triton", "serve", "--models", "piper", "--on-demand", "csm,qwen_image",
           "--keep-alive", str(KEEP_ALIVE_S), "--memory-budget", f"{_budget_mib()}MiB", "--load-timeout", "120",
           "--port", str(port), "--triton-http-port", str(free_port()), "--triton-grpc-port", str(free_port()),
           "--triton-metrics-port", str(free_port()), "--ready-timeout", str(READY_TIMEOUT_S),
           "--frontend-arg=--on-demand=csm,qwen_image,broken",
           f"--frontend-arg=--model-repository={tmp / 'repo'}",
           f"--frontend-arg=--video-storage-dir={tmp / 'videos'}",
           f"--frontend-arg=--voice-storage-dir={tmp / 'voices'}"]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log_path, READY_TIMEOUT_S + 60)
        yield url, log_path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def _state(url: str, model: str) -> str:
    return httpx.get(f"{url}/v1/models/{model}", timeout=30).json()["state"]


def _metric(url: str, name: str, **labels: str) -> float:
    return metric_total(httpx.get(f"{url}/metrics", timeout=30).text, name, **labels)


def test_concurrent_first_requests_through_the_sdk_trigger_one_load(served):
    url, _ = served
    states = {m["id"]: m["state"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
    assert states == {"piper_tts": "loaded", "tts": "unloaded", "qwen_image": "unloaded",
                      "broken": "unloaded"}
    sdk = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)

    def speak(_: int) -> int:
        return len(sdk.audio.speech.create(model="tts", input="Hello there.", voice="alloy",
                                           response_format="pcm").content)

    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(speak, range(4)))
    assert all(n > 0 for n in sizes)
    assert _state(url, "tts") == "loaded"
    assert _metric(url, "omni_frontend_model_loads_total", model="csm", outcome="ok") == 1
    assert _metric(url, "omni_frontend_model_load_seconds_count", model="csm") == 1


def test_a_failed_load_gives_503_and_leaves_the_others_serving(served):
    url, _ = served
    r = httpx.post(f"{url}/v1/audio/speech", json={"model": "broken", "input": "hi", "response_format": "pcm"},
                   timeout=120)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "model_load_failed", r.text
    card = httpx.get(f"{url}/v1/models/broken", timeout=30).json()
    assert card["state"] == "failed" and card["reason"], card
    for model in ("piper_tts", "tts"):
        ok = httpx.post(f"{url}/v1/audio/speech", json={"model": model, "input": "Still here.",
                                                       "response_format": "pcm"}, timeout=120)
        assert ok.status_code == 200, (model, ok.text)
    assert _metric(url, "omni_frontend_model_loads_total", model="broken", outcome="failed") == 1


def _slow_stream(url: str, hold_s: float) -> tuple[bytes, int]:
    """A streamed speech request, paced to real time (``stream_pacing: "realtime"``: since issue 29
    an unpaced stream is generated in a few seconds and fits the socket buffers), of about 22 s of
    audio (112 characters x 2.5 frames / 12.5 Hz), read by a client with a tiny receive buffer that
    stops reading for ``hold_s`` after the first bytes: its Triton stream stays in flight for about
    its playback less ``max_lead_ms`` (3 s), well past ``hold_s``. Returns (status line, body bytes)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "tts", "input": "A sentence to speak slowly, " * 4, "response_format": "pcm",
                       "stream": True, "stream_pacing": "realtime"}).encode()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        s.connect((host, int(port)))
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (host.encode(), len(body), body))
        first = s.recv(512)
        time.sleep(hold_s)
        total = len(first)
        while chunk := s.recv(65536):
            total += len(chunk)
    return first.split(b"\r\n", 1)[0], total


def test_keep_alive_unloads_when_idle_but_not_while_a_stream_is_in_flight(served):
    url, _ = served
    assert _state(url, "tts") == "loaded"
    # (an earlier test may have unloaded csm already: the broken model's load evicts it under the budget)
    before = _metric(url, "omni_frontend_model_unloads_total", model="csm")
    kept_alive_before = _metric(url, "omni_frontend_model_unloads_total", model="csm", reason="keep_alive")
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_slow_stream, url, KEEP_ALIVE_S * 2)
        time.sleep(KEEP_ALIVE_S * 1.5)  # past the keep-alive, the stream still open
        assert _state(url, "tts") == "loaded"
        assert _metric(url, "omni_frontend_model_unloads_total", model="csm") == before
        status, size = stream.result(timeout=300)
    assert b" 200 " in status and size > 50_000, (status, size)
    deadline = time.monotonic() + KEEP_ALIVE_S + 60
    while _state(url, "tts") == "loaded" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _state(url, "tts") == "unloaded"
    assert _metric(url, "omni_frontend_model_unloads_total", model="csm", reason="keep_alive") == kept_alive_before + 1


def test_eviction_under_the_budget_unloads_the_idle_pipeline(served):
    url, _ = served
    sdk = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    evicted_before = _metric(url, "omni_frontend_model_unloads_total", model="csm", reason="evicted")
    assert sdk.audio.speech.create(model="tts", input="Load me.", voice="alloy", response_format="pcm").content
    assert _state(url, "tts") == "loaded"
    # at once (well within the keep-alive): only eviction can make room for qwen_image. Its four
    # torch stages may load for longer than --load-timeout on a busy box (first run: a 503
    # model_loading after 120 s): retry on that 503, as a client told Retry-After would.
    deadline = time.monotonic() + 600
    while True:
        r = httpx.post(f"{url}/v1/images/generations", timeout=300,
                       json={"model": "qwen_image", "prompt": "a red fox", "size": "32x32", "n": 1})
        if r.status_code != 503 or time.monotonic() > deadline:
            break
        assert r.json()["error"]["code"] == "model_loading", r.text
        assert _state(url, "tts") == "unloaded"  # evicted before the load began
        time.sleep(float(r.headers["Retry-After"]))
    assert r.status_code == 200, r.text
    assert r.json()["data"][0]["b64_json"]
    assert _state(url, "qwen_image") == "loaded" and _state(url, "tts") == "unloaded"
    assert _metric(url, "omni_frontend_model_unloads_total", model="csm", reason="evicted") == evicted_before + 1
    assert _state(url, "piper_tts") == "loaded"  # pinned: never evicted
