"""``POST /v1/audio/generate`` against an in-process fake engine: the real app, router, request
checks, encoding and SSE framing; the fake answers a step event per step and a stereo waveform
derived from the seed, and counts the steps it really ran (a client leaving stops it)."""
from __future__ import annotations

import asyncio
import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf
from engine_stub import EngineStub

from omni_triton.media.audio import float_to_pcm16
from openai_frontend.app import Settings, create_app
from openai_frontend.engine import AudioGenerateEvent, InvalidRequestError, ModelInfo, ModelNotFoundError

pytestmark = pytest.mark.anyio

PARAMS = {"task": "text-to-audio", "max_seconds": "4.096", "min_seconds": "0", "max_seconds_value": "8",
          "default_steps": "4", "max_steps": "20", "default_guidance_scale": "7.0", "sample_rate": "16000"}
MODEL = ModelInfo(name="stable_audio", inputs=frozenset({"PROMPT", "NEGATIVE_PROMPT", "AUDIO_START_S", "AUDIO_END_S",
                                                         "NUM_INFERENCE_STEPS", "GUIDANCE_SCALE", "SEED"}),
                  outputs=frozenset({"STEP", "TOTAL_STEPS", "AUDIO", "SAMPLE_RATE", "NUM_STEPS", "DENOISE_SECONDS"}),
                  decoupled=True, parameters=PARAMS)


def waveform(job):
    n = int(job.audio_end_s * 16000) - int(job.audio_start_s * 16000)
    return np.random.default_rng(job.seed).uniform(-0.9, 0.9, (2, n)).astype(np.float32)


class FakeAudioEngine(EngineStub):
    def __init__(self, step_s=0.0, fail: Exception | None = None):
        self.step_s, self.fail = step_s, fail
        self.jobs, self.steps_run = [], 0

    async def list_models(self):
        return [MODEL]

    async def get_model(self, name):
        if name != MODEL.name:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        return MODEL

    async def generate_audio(self, model, job):
        self.jobs.append(job)
        if self.fail is not None:
            raise self.fail
        for step in range(1, job.steps + 1):
            await asyncio.sleep(self.step_s)
            self.steps_run += 1
            yield AudioGenerateEvent(step=step, total=job.steps)
        yield AudioGenerateEvent(audio=waveform(job), sample_rate=16000, num_steps=job.steps, denoise_seconds=0.01)


@pytest.fixture
def engine():
    return FakeAudioEngine()


@pytest.fixture
async def client(engine):
    app = create_app(engine, Settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


async def test_wav_clip_with_vllm_omni_fields(client, engine):
    r = await client.post("/v1/audio/generate", json={"input": "a cat purring", "audio_length": 2.0, "seed": 7,
                                                      "negative_prompt": "noise", "guidance_scale": 5.0,
                                                      "num_inference_steps": 3})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/wav" and r.headers["x-channels"] == "2"
    job = engine.jobs[-1]
    assert (job.audio_start_s, job.audio_end_s, job.steps, job.seed, job.guidance_scale, job.negative_prompt) == \
        (0.0, 2.0, 3, 7, 5.0, "noise")
    got, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    want = np.frombuffer(float_to_pcm16(waveform(job).T), "<i2").reshape(-1, 2)
    assert sr == 16000 and np.array_equal(got, want)


async def test_diffusion_names_defaults_and_formats(client, engine):
    r = await client.post("/v1/audio/generate", json={"input": "rain", "audio_start_in_s": 1.0, "audio_end_in_s": 2.5,
                                                      "response_format": "flac"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/flac"
    job = engine.jobs[-1]
    assert (job.audio_start_s, job.audio_end_s, job.steps, job.guidance_scale, job.negative_prompt) == \
        (1.0, 2.5, 4, 7.0, None)
    assert sf.info(io.BytesIO(r.content)).frames == 24000
    r = await client.post("/v1/audio/generate", json={"input": "rain"})  # default: the model's longest clip
    assert r.status_code == 200 and engine.jobs[-1].audio_end_s == pytest.approx(4.096)
    r = await client.post("/v1/audio/generate", json={"input": "rain", "audio_length": 1.0, "response_format": "pcm"})
    assert r.status_code == 200 and len(r.content) == 16000 * 2 * 2


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": "   "}, "input"),
    ({"input": "x", "audio_length": 5.0}, "audio_length"),
    ({"input": "x", "audio_start": 7.5, "audio_length": 1.0}, "audio_length"),
    ({"input": "x", "audio_start_in_s": 2.0, "audio_end_in_s": 1.0}, "audio_end_in_s"),
    ({"input": "x", "audio_length": 1.0, "audio_end_in_s": 3.0}, "audio_length"),
    ({"input": "x", "audio_length": -1}, "audio_length"),
    ({"input": "x", "num_inference_steps": 21}, "num_inference_steps"),
    ({"input": "x", "num_inference_steps": 1}, "num_inference_steps"),
    ({"input": "x", "guidance_scale": 101}, "guidance_scale"),
    ({"input": "x", "seed": -1}, "seed"),
    ({"input": "x", "response_format": "aac"}, "response_format"),
    ({"input": "x", "speed": 2.0}, "speed"),
    ({"input": "x" * 5000}, "input"),
    ({"input": "x", "model": "nope"}, "model"),
])
async def test_bad_input_is_a_400_before_any_work(client, engine, body, param):
    r = await client.post("/v1/audio/generate", json=body)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["message"] and err.get("param") in (param, f"body.{param}", None) or param in err["message"]
    assert engine.jobs == []
    ok = await client.post("/v1/audio/generate", json={"input": "still serving", "audio_length": 0.5})
    assert ok.status_code == 200


async def test_engine_refusal_keeps_its_400(engine):
    engine.fail = InvalidRequestError("PROMPT has 90 tokens; the text encoder takes at most 64")
    app = create_app(engine, Settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        for stream in (False, True):
            r = await c.post("/v1/audio/generate", json={"input": "x", "audio_length": 1.0, "stream": stream})
            assert r.status_code == 400 and "tokens" in r.json()["error"]["message"]


async def test_sse_progress_then_the_clip(client, engine):
    r = await client.post("/v1/audio/generate", json={"input": "birds", "audio_length": 1.0, "seed": 3,
                                                      "num_inference_steps": 5, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    progress = [e for e in events if e["type"] == "audio.generate.progress"]
    assert [(e["step"], e["total_steps"]) for e in progress] == [(s, 5) for s in range(1, 6)]
    assert [e["progress"] for e in progress] == [20, 40, 60, 80, 100]
    done = events[-1]
    assert done["type"] == "audio.generate.done" and done["channels"] == 2 and done["sample_rate"] == 16000
    assert done["audio_seconds"] == 1.0 and done["num_inference_steps"] == 5
    got, _ = sf.read(io.BytesIO(base64.b64decode(done["audio"])), dtype="int16")
    assert got.shape == (16000, 2)


async def _disconnect_after(app, payload: dict, engine, steps: int, path: str = "/v1/audio/generate") -> list[dict]:
    """Drive the ASGI app by hand: send the request to ``path``, disconnect once ``steps`` steps ran."""
    body = json.dumps(payload).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "client": ("test", 1), "server": ("test", 80),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    sent: list[dict] = []
    request_sent = False

    async def receive():
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        while engine.steps_run < steps:
            await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return sent


@pytest.mark.parametrize("stream", [False, True], ids=["clip", "sse"])
async def test_a_client_that_leaves_stops_the_generation(stream):
    engine = FakeAudioEngine(step_s=0.02)
    app = create_app(engine, Settings(max_inflight=1))
    await _disconnect_after(app, {"input": "x", "audio_length": 1.0, "num_inference_steps": 20, "stream": stream},
                            engine, 2)
    ran = engine.steps_run
    await asyncio.sleep(0.2)
    assert ran == engine.steps_run and ran < 20  # the engine stream was closed: no more steps
    assert app.state.admission.inflight == 0  # the admission slot came back
