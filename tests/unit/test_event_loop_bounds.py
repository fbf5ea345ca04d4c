"""The event loop never does work that grows with a request (issue 23, item 1), without Triton:

* sentence splitting (the speech WebSocket's ``split_sentences``, ``llm_tts``'s
  ``SentenceSegmenter``) scales linearly on adversarial text (runs of ``.``, spaces, ``!?``,
  quotes, rejected abbreviations): measured as the growth of CPU time from n to 16 n characters
  (a ratio, never an absolute time; a quadratic splitter grows ~256x, a linear one ~16x);
* every text field has a cap checked before any work (400 naming the field; 413 for JSON bodies
  with too many values), and the speech WebSocket bounds its unspoken text (error event, close 1009);
* request-sized work (tokenize, I2V reference decode + fit, image-edit decode, speech ``plan`` with
  its ``ref_audio`` decode) runs on a worker thread, not the loop's, and ``ref_audio`` is decoded
  once per WebSocket session;
* a stored clip is hashed once per file version, not on every ``GET /v1/audio/voices``; a video
  job's progress is committed off the loop and only when the percentage rises.

The /health latency under floods of the real server is tests/e2e/test_event_loop_floods.py.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omni_triton.stages.llm.sentences import SentenceSegmenter
from openai_frontend import voice_store as voice_store_module
from openai_frontend.app import Settings, create_app
from openai_frontend.schemas import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_NEGATIVE_PROMPT_CHARS,
    MAX_REF_TEXT_CHARS,
    MAX_VOICE_PROMPT_CHARS,
)
from openai_frontend.serving import voices
from openai_frontend.serving.speech_stream import split_sentences
from openai_frontend.voice_store import VoiceSettings, VoiceStore
from tests.unit.test_vllm_omni_compat import AllFake
from tests.unit.test_voices import FakeEngine

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


# --------------------------------------------------------------------------- linear splitting
#: adversarial texts: one unit, repeated to the wanted length
ADVERSARIAL = {
    "dots": ".", "spaces": " ", "bang-question": "!?", "dot-space": ". ", "dot-letter": ".a",
    "dot-quote": '."', "quotes-after-dot": '."""""""""', "initials": "a. ", "newlines": "\n",
    "mixed": ". !?…\"'  )].\n\t;", "cjk": "。！？", "run-on": "x",
}


def _cpu_seconds(fn, text: str, repeats: int = 5) -> float:
    """The least CPU time (this process) of ``repeats`` calls of ``fn(text)``."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn(text)
        best = min(best, time.process_time() - t0)
    return best


def _growth(fn, unit: str, n: int = 2000, factor: int = 16) -> float:
    """CPU time of ``fn`` on ``factor * n`` characters over that on ``n`` (floored at 1 ms each:
    a ratio of two tiny times is noise)."""
    small = (unit * (n // len(unit) + 1))[:n]
    large = (unit * (factor * n // len(unit) + 1))[:factor * n]
    return max(_cpu_seconds(fn, large), 1e-3) / max(_cpu_seconds(fn, small), 1e-3)


def _segment(text: str) -> None:
    seg = SentenceSegmenter()
    seg.push(text)
    seg.flush()


@pytest.mark.parametrize("unit", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
@pytest.mark.parametrize("fn", [split_sentences, _segment], ids=["speech_stream", "llm_tts"])
def test_sentence_splitting_grows_linearly(fn, unit):
    # 16x the text: linear ~16x (allowing 4x for noise), quadratic ~256x
    assert _growth(fn, unit) < 64


def test_split_sentences_keeps_its_sentences():
    assert split_sentences("Hi there. How are") == (["Hi there."], "How are")
    assert split_sentences('He said "stop." Then "go!" Next') == (['He said "stop."', 'Then "go!"'], "Next")
    sentences, rest = split_sentences("." * 30000)  # cut hard at MAX_SENTENCE_CHARS
    assert [len(s) for s in sentences] == [400] * 74 and rest == "." * 400
    assert split_sentences(" " * 100000) == ([], "")


# --------------------------------------------------------------------------- WebSocket bounds
def test_ws_unspoken_text_is_bounded():
    engine = FakeEngine()
    engine.block = True  # nothing is ever spoken: the queued sentences stay pending
    with TestClient(create_app(engine, Settings(speech_stream_max_pending_chars=1000))) as tc:
        with tc.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json({"type": "session.config", "model": "piper_tts"})
            ws.send_json({"type": "input.text", "text": "One sentence. " * 50})  # 650 queued (stripped): fits
            ws.send_json({"type": "input.text", "text": "x" * 351})  # 1001 unspoken: over
            ws.send_json({"type": "bogus"})  # answered only by a session that went on (no hang if broken)
            event = ws.receive_json()
            assert event["type"] == "error" and event["code"] == "text_too_long", event
            assert event["status_code"] == 413 and event["param"] == "text"
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            assert closed.value.code == 1009


def test_ws_message_with_too_many_json_values_is_refused_before_parsing():
    with TestClient(create_app(FakeEngine(), Settings(max_json_values=100))) as tc:
        with tc.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_text('{"type": "input.text", "text": "hi", "pad": [' + "1," * 200 + "1]}")
            event = ws.receive_json()
            assert event["code"] == "message_too_large" and event["status_code"] == 413
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            assert closed.value.code == 1009


def _wav_data_url(seconds: float = 1.0, rate: int = 24000) -> str:
    buf = io.BytesIO()
    sf.write(buf, (0.1 * np.sin(np.arange(int(seconds * rate)) / 5)).astype(np.float32), rate, format="WAV")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def test_ws_ref_audio_is_decoded_once_per_session_off_the_loop(monkeypatch):
    decodes: list[int] = []
    real = voices.decode_audio

    def counting(*args, **kwargs):
        decodes.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(voices, "decode_audio", counting)
    engine = FakeEngine()
    with TestClient(create_app(engine, Settings())) as tc, tc.websocket_connect("/v1/audio/speech/stream") as ws:
        loop_thread = tc.portal.call(lambda: threading.get_ident())
        ws.send_json({"type": "session.config", "model": "qwen3_tts", "ref_audio": _wav_data_url(),
                      "ref_text": "hello", "response_format": "wav"})
        ws.send_json({"type": "input.text", "text": "One. Two. Three. "})
        ws.send_json({"type": "input.done"})
        done = 0
        while done < 3:
            message = ws.receive()
            if message.get("text") and '"audio.done"' in message["text"]:
                done += 1
    assert len(engine.calls) == 3
    assert len(decodes) == 1, "ref_audio decoded once per session.config, not once per sentence"
    assert decodes[0] != loop_thread


# --------------------------------------------------------------------------- text caps
async def _post(engine, path, payload, **settings) -> httpx.Response:
    app = create_app(engine, Settings(**settings))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        return await c.post(path, json=payload)


def _error(r: httpx.Response, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("path,payload,param", [
    ("/v1/audio/speech", {"model": "qwen3_tts", "input": "hi", "instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)},
     "instructions"),
    ("/v1/audio/speech", {"model": "qwen3_tts", "input": "hi", "ref_audio": "AAAA",
                          "ref_text": "x" * (MAX_REF_TEXT_CHARS + 1)}, "ref_text"),
    ("/v1/images/generations", {"model": "qwen_image", "prompt": "a cat",
                                "negative_prompt": "x" * (MAX_NEGATIVE_PROMPT_CHARS + 1)}, "negative_prompt"),
    ("/v1/chat/completions", {"model": "llm", "messages": [{"role": "user", "content": "x"}],
                              "stop": ["a"] * 65}, "stop"),
    ("/v1/audio/speech", {"model": "m" * 257, "input": "hi"}, "model"),
])
async def test_text_field_over_its_cap_is_400_naming_it(path, payload, param):
    engine = AllFake()
    r = await _post(engine, path, payload)
    _error(r, 400, param)
    # (a union such as stop's names its first member's error: "should be a valid string")
    assert "at most" in r.json()["error"]["message"] or param == "stop"
    assert engine.requests == []


@pytest.mark.parametrize("path,payload,param", [
    ("/v1/chat/completions", {"model": "llm", "messages": [{"role": "user", "content": "x" * 60},
                                                             {"role": "user", "content": [{"type": "text",
                                                                                           "text": "y" * 41}]}]},
     "messages"),
    ("/v1/completions", {"model": "llm", "prompt": ["x" * 60, "y" * 41]}, "prompt"),
    ("/tokenize", {"model": "llm", "prompt": "x" * 101}, "prompt"),
    ("/tokenize", {"model": "llm", "messages": [{"role": "user", "content": "x" * 101}]}, "messages"),
])
async def test_prompt_over_max_prompt_chars_is_400_before_any_work(path, payload, param):
    engine = AllFake()
    asked: list[str] = []
    real_get = engine.get_model

    async def get_model(name):
        asked.append(name)
        return await real_get(name)

    engine.get_model = get_model
    r = await _post(engine, path, payload, max_prompt_chars=100)
    assert _error(r, 400, param)["code"] == "prompt_too_long"
    assert asked == [] and engine.requests == []  # refused before the model was even looked up


async def test_json_body_with_too_many_values_is_413_before_parsing():
    engine = AllFake()
    many = {"model": "llm", "messages": [{"role": "user", "content": "a"}] * 40000}
    r = await _post(engine, "/v1/chat/completions", many)
    _error(r, 413, None)
    assert "values" in r.json()["error"]["message"] and engine.requests == []
    r = await _post(engine, "/detokenize", {"model": "llm", "tokens": [1] * 70000})
    _error(r, 413, None)
    r = await _post(engine, "/detokenize", {"model": "llm", "tokens": [1] * 70000}, max_json_values=1 << 20)
    _error(r, 400, "tokens")  # the schema's own cap (MAX_DETOKENIZE_TOKENS)


async def test_designed_voice_prompt_is_capped(tmp_path):
    settings = Settings(voices=VoiceSettings(storage_dir=tmp_path))
    app = create_app(FakeEngine(), settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        r = await c.post("/v1/audio/voices", data={"name": "n", "type": "prompt",
                                                   "prompt": "x" * (MAX_VOICE_PROMPT_CHARS + 1)})
    assert _error(r, 400, "prompt")["code"] == "prompt_too_long"
    assert app.state.voice_store.count() == 0


# --------------------------------------------------------------------------- off the loop
def _record_thread(monkeypatch, module, name: str) -> list[int]:
    """Patch ``module.name`` to record the thread each call runs on."""
    seen: list[int] = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        seen.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


async def test_tokenize_encodes_off_the_loop(monkeypatch):
    from omni_triton.paths import model_dir
    from openai_frontend.serving import tokenize

    if not (model_dir("smollm2") / "tokenizer.json").exists():
        pytest.skip("smollm2 not prepared")
    engine = AllFake()
    engine.models["llm"] = dataclasses.replace(engine.models["llm"], assets=("smollm2",))
    seen = _record_thread(monkeypatch, tokenize.ChatTokenizer, "encode")
    r = await _post(engine, "/tokenize", {"model": "llm", "prompt": "The capital of France is"})
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 0
    assert seen and seen[0] != threading.get_ident()  # the test's loop runs the app here


async def test_speech_plan_runs_off_the_loop(monkeypatch):
    from openai_frontend.serving import speech

    seen = _record_thread(monkeypatch, voices, "decode_audio")
    r = await _post(FakeEngine(), "/v1/audio/speech", {"model": "qwen3_tts", "input": "Hello.",
                                                        "ref_audio": _wav_data_url(), "response_format": "wav"})
    assert r.status_code == 200, r.text
    assert len(seen) == 1 and seen[0] != threading.get_ident()
    assert speech.plan  # the function the frontend runs through offload.off_loop


async def test_i2v_reference_is_decoded_and_fitted_off_the_loop(monkeypatch, tmp_path):
    from openai_frontend.serving import videos
    from tests.unit.test_videos_frontend import Server
    from tests.unit.test_videos_i2v_frontend import FakeVideoEngines, png, ref

    decoded = _record_thread(monkeypatch, videos, "decode_image")
    fitted = _record_thread(monkeypatch, videos, "fit_image")
    async with Server(FakeVideoEngines(), tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", "size": "32x32", "num_frames": "5"},
                         files=ref(png(48, 32)))
        assert r.status_code == 200, r.text
    loop_thread = threading.get_ident()
    assert decoded and fitted and loop_thread not in decoded + fitted


async def test_image_edit_decode_runs_off_the_loop(monkeypatch):
    from openai_frontend.serving import images
    from tests.unit.test_videos_i2v_frontend import png

    seen = _record_thread(monkeypatch, images, "decode_image")
    app = create_app(AllFake(), Settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        r = await c.post("/v1/images/edits", data={"model": "qwen_image_edit", "prompt": "p"},
                         files={"image": ("a.png", png(64, 64), "image/png")})
    assert r.status_code == 200, r.text
    assert seen and seen[0] != threading.get_ident()


# --------------------------------------------------------------------------- voice store hashing
def test_a_stored_clip_is_hashed_once_per_file_version(tmp_path, monkeypatch):
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path))
    clip = np.zeros(24000, np.float32)
    voice = store.add_clip("v", clip, 24000, b"prompt-bytes", None, None, 1.0)
    hashed: list[int] = []
    real = voice_store_module._sha256
    monkeypatch.setattr(voice_store_module, "_sha256", lambda data: hashed.append(len(data)) or real(data))
    assert [v.error for v in store.list_voices()] == [None]
    first = len(hashed)
    assert first == 2  # the prompt and the clip, once
    for _ in range(3):
        assert [v.error for v in store.list_voices()] == [None]
    assert len(hashed) == first, "an unchanged clip is not hashed again"
    clip_file = tmp_path / "voices" / voice.id / voice_store_module.CLIP_FILE
    clip_file.write_bytes(clip_file.read_bytes()[:-2] + b"xx")  # altered: a new version
    assert "checksum" in store.list_voices()[0].error
    store.close()


# --------------------------------------------------------------------------- video progress
async def test_video_progress_is_committed_off_the_loop_only_when_it_rises(monkeypatch, tmp_path):
    from openai_frontend.video_jobs import SqliteJobStore
    from tests.unit.test_videos_frontend import FakeVideoEngine, Server, wait_status

    class Chatty(FakeVideoEngine):
        """Every step reported 20 times (a stage that reports often)."""

        async def generate_video(self, model, job, request_id=""):
            async for event in super().generate_video(model, job, request_id):
                for _ in range(1 if event.frames is not None else 20):
                    yield event

    seen = _record_thread(monkeypatch, SqliteJobStore, "progress")
    async with Server(Chatty(step_s=0), tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", "num_inference_steps": "10"})
        assert r.status_code == 200, r.text
        body, _ = await wait_status(c, r.json()["id"])
        assert body["status"] == "completed"
    assert 0 < len(seen) <= 10, "one commit per rise of the percentage, not one per event (200 here)"
    assert threading.get_ident() not in seen


# --------------------------------------------------------------------------- store reads and writes
async def test_job_and_voice_store_calls_of_the_api_run_off_the_loop(monkeypatch, tmp_path):
    """Polls, lists, deletes and the voice/consent lookups call the store in a worker thread:
    with ``--database-url`` each is a PostgreSQL round trip (and waits for a pooled connection
    while the database is away), which must not stall the event loop."""
    from openai_frontend.video_jobs import SqliteJobStore
    from openai_frontend.voice_store import SqliteVoiceMeta
    from tests.unit.test_videos_frontend import FakeVideoEngine, Server, wait_status

    seen = {name: _record_thread(monkeypatch, SqliteJobStore, name) for name in ("get", "list", "delete")}
    seen |= {name: _record_thread(monkeypatch, SqliteVoiceMeta, name)
             for name in ("name_taken", "usage", "consent", "consents")}
    server = Server(FakeVideoEngine(), tmp_path / "videos")
    server.app.state.voice_store = VoiceStore(VoiceSettings(storage_dir=tmp_path / "voices"))
    async with server as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        await wait_status(c, vid)
        assert (await c.get("/v1/videos")).status_code == 200
        assert (await c.delete(f"/v1/videos/{vid}")).status_code == 200
        r = await c.post("/v1/audio/voices", data={"name": "calm", "type": "prompt", "prompt": "a calm voice"})
        assert r.status_code == 200, r.text
        assert (await c.get("/v1/audio/voice_consents/cons_0")).status_code == 404
        assert (await c.get("/v1/audio/voice_consents")).status_code == 200
    server.app.state.voice_store.close()
    assert all(seen.values()), {name: len(threads) for name, threads in seen.items()}
    on_loop = {name for name, threads in seen.items() if threading.get_ident() in threads}
    assert not on_loop, f"store calls on the event loop: {sorted(on_loop)}"
