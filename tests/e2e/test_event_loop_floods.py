"""End-to-end (issue 23, item 1): no request freezes the frontend's event loop.

A probe in its own process polls ``GET /health`` every 20 ms while the test floods one heavy path
at a time from 3 client threads (2 for the WebSocket); ``/health``'s p99 latency must stay <= 100 ms at rest and under
every flood. The floods hit the frontend's own work, not Triton's: each request does the heavy
decode/validation and is then refused or answered cheaply, so a 2-core CI box measures the
frontend, not a busy model.

* ``ws_punctuation``: WebSocket sessions each sending one ``input.text`` of 60,000 adversarial
  characters (30,000 ``.``, a run of spaces, ``!?`` pairs, ``."`` pairs), then closing (the
  session's synthesis is cancelled). The quadratic splitter of ``ade82ef`` froze the loop 9 s.
* ``tokenize_at_cap``: ``/tokenize`` with a prompt of ``--max-prompt-chars`` characters (~60k tokens).
* ``image_edit_largest``: ``/v1/images/edits`` with the largest image an upload may be (16.4 MP,
  ~6 MB of PNG) whose 101:1 aspect ratio is refused after it was decoded (400).
* ``i2v_largest``: ``/v1/videos`` with a 4096x4096 (the model's pixel cap), ~8 MB ``input_reference``
  and an out-of-range ``num_inference_steps``, refused after the decode (400).
* ``voice_clip_largest``: ``/v1/audio/voices`` with a 29.9 s 48 kHz stereo WAV (decoded and
  resampled), refused because this frontend serves no voice-prompt model (400).
* ``ref_audio``: WebSocket ``session.config`` with a 60 s ``ref_audio`` for ``qwen3_tts`` (decoded
  once per config), then closed; only when the stack serves ``qwen3_tts``.

Models: ``piper`` is required; the floods of ``llm``, ``qwen_image_edit``, ``wan_i2v`` and
``qwen3_tts`` run when the stack serves them (CI serves all). The figures are printed (``-s``)
and saved to ``<tmp>/floods.json``. /health itself calls Triton (``is_live``, ``list_models``):
its p99 at rest is the baseline the table starts with.
"""
from __future__ import annotations

import base64
import io
import json
import math
import os
import secrets
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.e2e.test_voices_served import Frontend

pytestmark = pytest.mark.e2e

P99_LIMIT_S = 0.100
FLOOD_S = 6.0
REST_S = 4.0
FLOODERS = 3
PROBE_INTERVAL_S = 0.02
MAX_PROMPT_CHARS = 1 << 18  # the frontend's default --max-prompt-chars

#: the /health poller: its own process (its own GIL), one keep-alive connection; on SIGTERM it
#: writes [(wall start, latency s, status), ...] as JSON
PROBE = r"""
import json, signal, sys, time
import httpx
url, out, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
samples, stop = [], []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
with httpx.Client(timeout=120) as client:
    while not stop:
        t0, p0 = time.time(), time.perf_counter()
        try:
            status = client.get(url).status_code
        except httpx.HTTPError:
            status = 0
        latency = time.perf_counter() - p0
        samples.append((t0, latency, status))
        time.sleep(max(0.0, interval - latency))
json.dump(samples, open(out, "w"))
"""


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


# --------------------------------------------------------------------------- payloads
def adversarial_text() -> str:
    return "." * 30000 + " " * 10000 + "!?" * 5000 + '."' * 5000  # 60,000 characters, under the 65,536 cap


def tokenize_prompt() -> str:
    words = ("omni triton frontend event loop bounded linear tokenizer speech video image audio "
             "the a of and to in is that it for on with as").split()
    rng = np.random.default_rng(0)
    text = " ".join(words[i] for i in rng.integers(0, len(words), MAX_PROMPT_CHARS // 3))
    return text[:MAX_PROMPT_CHARS]


def png_rows(width: int, height: int, noisy_rows: int) -> bytes:
    """A PNG of ``width x height``: ``noisy_rows`` rows of noise (incompressible bytes), the rest
    repeating the last of them (the decoder still inflates and unfilters every pixel)."""
    from PIL import Image

    rng = np.random.default_rng(1)
    pixels = np.empty((height, width, 3), np.uint8)
    pixels[:noisy_rows] = rng.integers(0, 256, (noisy_rows, width, 3), dtype=np.uint8)
    pixels[noisy_rows:] = pixels[noisy_rows - 1]
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def wav_bytes(seconds: float, rate: int, channels: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.repeat(tone[:, None], channels, axis=1), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def served(stack) -> set[str]:
    index = httpx.post(f"{stack.triton_http_url}/v2/repository/index", json={}, timeout=10,
                       headers=stack.admin_headers).json()  # a restricted API: the admin key
    return {m["name"] for m in index if m.get("state") == "READY"}


OPTIONAL = ("llm", "qwen_image_edit", "wan_i2v", "qwen3_tts")


@pytest.fixture(scope="module")
def frontend(stack, served, tmp_path_factory):
    """A frontend of this test's own on the stack's Triton (default limits, its own voice store,
    no voice-prompt model, so a voice upload is refused after its decode)."""
    if "piper" not in served:
        pytest.skip("needs piper_tts served")
    models = ["piper"] + [m for m in OPTIONAL if m in served]
    store = tmp_path_factory.mktemp("floods")
    fe = Frontend(stack.triton_grpc_url, store, store / "frontend.log", models, stack.admin_key)
    fe.cmd = [sys.executable, "-m", "openai_frontend", "--triton-url", stack.triton_grpc_url, "--port", str(fe.port),
              "--models", ",".join(models), "--voice-storage-dir", str(store / "voices"),
              "--video-storage-dir", str(store / "videos"), "--log-level", "warning"]
    fe.start()
    yield fe
    fe.stop()


# --------------------------------------------------------------------------- floods
def _flood(one, seconds: float = FLOOD_S, clients: int = FLOODERS) -> list:
    """Run ``one()`` back to back from ``clients`` threads for ``seconds``; their results."""
    results, errors, deadline = [], [], time.monotonic() + seconds

    def client():
        while time.monotonic() < deadline:
            try:
                results.append(one())
            except Exception as exc:
                errors.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    return results


def _floods(frontend, served) -> dict:
    """name -> (one request, what each result must be, client threads)."""
    url = frontend.url
    floods = {}

    text = adversarial_text()

    def ws_punctuation():
        with ws_connect(frontend.ws_url, max_size=None) as ws:
            ws.send(json.dumps({"type": "session.config", "model": "piper_tts", "response_format": "pcm"}))
            ws.send(json.dumps({"type": "input.text", "text": text}))
        return "sent"  # closed at once: the session's synthesis is cancelled

    # 2 clients: each session also starts (and cancels) one Triton request for its first sentence,
    # ~270 sessions/s from 3 clients, which loads Triton (/health asks it) more than the frontend
    floods["ws_punctuation"] = (ws_punctuation, "sent", 2)

    if "llm" in served:
        prompt = tokenize_prompt()

        def tokenize():
            r = httpx.post(f"{url}/tokenize", json={"model": "llm", "prompt": prompt}, timeout=120)
            return r.status_code if r.status_code != 200 or r.json()["count"] > 10000 else "few tokens"

        floods["tokenize_at_cap"] = (tokenize, 200, FLOODERS)

    if "qwen_image_edit" in served:
        wide = png_rows(40905, 405, 50)  # 101:1 (over the 100:1 limit), 16.57 MP (cap 16.78 MP), ~6 MB

        def image_edit():
            r = httpx.post(f"{url}/v1/images/edits", data={"model": "qwen_image_edit", "prompt": "a cat"},
                           files={"image": ("wide.png", wide, "image/png")}, timeout=120)
            return r.status_code, r.json()["error"]["param"]

        floods["image_edit_largest"] = (image_edit, (400, "image"), FLOODERS)

    if "wan_i2v" in served:
        square = png_rows(4096, 4096, 650)  # the model's 16,777,216-pixel cap, ~8 MB (cap 10 MiB)

        def i2v():
            r = httpx.post(f"{url}/v1/videos",
                           data={"model": "wan_i2v", "prompt": "a cat", "num_inference_steps": "100000"},
                           files={"input_reference": ("ref.png", square, "image/png")}, timeout=120)
            return r.status_code, r.json()["error"]["param"]

        floods["i2v_largest"] = (i2v, (400, "num_inference_steps"), FLOODERS)

    clip = wav_bytes(29.9, 48000, 2)  # --voice-max-seconds 30, 5.7 MB (cap 10 MiB)
    consent = httpx.post(f"{url}/v1/audio/voice_consents", data={"name": "speaker", "language": "en-US"},
                         files={"recording": ("c.wav", wav_bytes(2.0, 16000, 1), "audio/wav")}, timeout=60)
    assert consent.status_code == 200, consent.text
    consent_id = consent.json()["id"]

    def voice_clip():
        r = httpx.post(f"{url}/v1/audio/voices", data={"name": "v" + secrets.token_hex(6), "consent": consent_id},
                       files={"audio_sample": ("clip.wav", clip, "audio/wav")}, timeout=120)
        return r.status_code, r.json()["error"]["code"]

    floods["voice_clip_largest"] = (voice_clip, (400, "voice_cloning_unavailable"), FLOODERS)

    if "qwen3_tts" in served:
        ref = "data:audio/wav;base64," + base64.b64encode(wav_bytes(59.9, 24000, 1)).decode()

        def ref_audio():
            with ws_connect(frontend.ws_url, max_size=None) as ws:
                ws.send(json.dumps({"type": "session.config", "model": "qwen3_tts", "ref_audio": ref,
                                    "ref_text": "hello", "response_format": "pcm"}))
                ws.send(json.dumps({"type": "session.close"}))  # nothing buffered: closes at once
                try:
                    while True:
                        msg = ws.recv(timeout=60)
                        if isinstance(msg, str) and json.loads(msg).get("type") == "error":
                            return json.loads(msg).get("code")
                except ConnectionClosed:
                    return "closed"

        floods["ref_audio"] = (ref_audio, "closed", FLOODERS)
    return floods


#: dev knob: a comma-separated subset of the floods (default: all)
ONLY = [f for f in os.environ.get("OMNI_TRITON_FLOODS", "").split(",") if f]


def test_health_p99_stays_under_100ms_under_every_flood(frontend, served, tmp_path):
    floods = {k: v for k, v in _floods(frontend, served).items() if not ONLY or k in ONLY}
    out = tmp_path / "probe.json"
    probe = subprocess.Popen([sys.executable, "-c", PROBE, f"{frontend.url}/health", str(out), str(PROBE_INTERVAL_S)])
    windows: dict[str, tuple[float, float]] = {}
    counts: dict[str, int] = {}
    try:
        time.sleep(0.5)  # the probe's first connection
        t0 = time.time()
        time.sleep(REST_S)
        windows["at_rest"] = (t0, time.time())
        for name, (one, expected, clients) in floods.items():
            t0 = time.time()
            results = _flood(one, clients=clients)
            windows[name] = (t0, time.time())
            counts[name] = len(results)
            assert results and all(r == expected for r in results), (name, sorted(set(map(str, results))))
            time.sleep(0.5)  # let the last requests' probes land in this window
    finally:
        probe.terminate()
        probe.wait(timeout=150)
    samples = json.loads(out.read_text())
    report = {}
    for name, (start, end) in windows.items():
        lat = [lat for (t, lat, status) in samples if start <= t <= end]
        bad = [status for (t, _, status) in samples if start <= t <= end and status != 200]
        assert lat and not bad, (name, len(lat), bad[:5])
        report[name] = {"p99_ms": round(1000 * p99(lat), 1), "max_ms": round(1000 * max(lat), 1),
                        "probes": len(lat), "requests": counts.get(name)}
    (tmp_path / "floods.json").write_text(json.dumps(report, indent=1))
    print("\n/health latency per flood:\n" + "\n".join(f"  {k:20s} {v}" for k, v in report.items()))
    slow = {k: v for k, v in report.items() if v["p99_ms"] > 1000 * P99_LIMIT_S}
    assert not slow, f"/health p99 over {1000 * P99_LIMIT_S:g} ms: {slow} (all: {report})"
