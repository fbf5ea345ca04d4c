"""vLLM-Omni's diffusion chat form on the text-to-audio model: ``POST /v1/chat/completions`` with
``audio_end_in_s`` & co (top level or ``extra_args``) runs the same plan and engine call as
``/v1/audio/generate`` (same job, same bytes, same 400s, a disconnect stops the steps), answered
as ``choices[0].message.audio``. Against the in-process fake engine of the generate tests."""
from __future__ import annotations

import asyncio
import base64
import io

import httpx
import pytest
import soundfile as sf
from test_audio_generate_frontend import FakeAudioEngine, _disconnect_after

from openai_frontend.app import Settings, create_app

pytestmark = pytest.mark.anyio

FIELDS = {"audio_end_in_s": 2.0, "seed": 7, "negative_prompt": "noise", "guidance_scale": 5.0,
          "num_inference_steps": 3}


def chat(text="a cat purring", **extra):
    return {"model": "stable_audio", "messages": [{"role": "user", "content": text}], **extra}


@pytest.fixture
def engine():
    return FakeAudioEngine()


@pytest.fixture
async def client(engine):
    app = create_app(engine, Settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


def clip_of(r):
    audio = r.json()["choices"][0]["message"]["audio"]
    return base64.b64decode(audio["data"])


@pytest.mark.parametrize("where", ["top", "extra_args"])
async def test_chat_clip_equals_the_generate_clip(client, engine, where):
    body = chat(**FIELDS) if where == "top" else chat(extra_args=FIELDS)
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"] is None
    assert out["usage"]["num_inference_steps"] == 3
    g = await client.post("/v1/audio/generate", json={"input": "a cat purring", **FIELDS})
    assert g.status_code == 200
    assert clip_of(r) == g.content  # same job, same WAV bytes
    assert engine.jobs[0] == engine.jobs[1]
    job = engine.jobs[0]
    assert (job.audio_start_s, job.audio_end_s, job.steps, job.seed, job.guidance_scale, job.negative_prompt) == \
        (0.0, 2.0, 3, 7, 5.0, "noise")


async def test_duration_follows_audio_end_in_s_and_format(client):
    for start, end in ((0.0, 1.5), (0.5, 2.0)):
        r = await client.post("/v1/chat/completions", json=chat(audio_start_in_s=start, audio_end_in_s=end, seed=1))
        data, rate = sf.read(io.BytesIO(clip_of(r)), dtype="int16")
        assert sf.info(io.BytesIO(clip_of(r))).format == "WAV"  # the default
        assert data.shape == (int(end * rate) - int(start * rate), 2)
    r = await client.post("/v1/chat/completions", json=chat(audio_end_in_s=1.0, audio={"format": "flac"}))
    assert sf.info(io.BytesIO(clip_of(r))).format == "FLAC"


@pytest.mark.parametrize("extra, param", [
    ({"audio_end_in_s": 5.0}, "audio_end_in_s"),  # longer than max_seconds 4.096
    ({"audio_start_in_s": 2.0, "audio_end_in_s": 1.0}, "audio_end_in_s"),
    ({"num_inference_steps": 21}, "num_inference_steps"),
    ({"seed": -1}, "seed"),
    ({"extra_args": {"audio_end_in_s": 9.0}}, "audio_end_in_s"),
    ({"extra_args": {"bogus": 1}}, "extra_args.bogus"),
    ({"audio_end_in_s": 1.0, "extra_args": {"audio_end_in_s": 2.0}}, "extra_args.audio_end_in_s"),
    ({"extra_args": {"audio_end_in_s": "long"}}, "extra_args.audio_end_in_s"),
    ({"size": "64x64"}, "size"),
    ({"n": 2}, "n"),
    ({"modalities": ["text"]}, "modalities"),
    ({"audio": {"format": "aac"}}, "audio.format"),
    ({"stream": True}, "stream"),
])
async def test_bad_input_is_the_same_400_before_any_work(client, engine, extra, param):
    r = await client.post("/v1/chat/completions", json=chat(**extra))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param
    assert engine.jobs == []
    ok = await client.post("/v1/chat/completions", json=chat(audio_end_in_s=0.5))
    assert ok.status_code == 200


async def test_no_user_text_is_a_400(client, engine):
    r = await client.post("/v1/chat/completions", json={"model": "stable_audio",
                                                        "messages": [{"role": "system", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and engine.jobs == []


async def test_a_client_that_leaves_stops_the_denoiser():
    engine = FakeAudioEngine(step_s=0.02)
    app = create_app(engine, Settings(max_inflight=1))
    await _disconnect_after(app, chat(audio_end_in_s=1.0, num_inference_steps=20), engine, 2,
                            path="/v1/chat/completions")
    ran = engine.steps_run
    await asyncio.sleep(0.2)
    assert ran == engine.steps_run and ran < 20
    assert app.state.admission.inflight == 0
