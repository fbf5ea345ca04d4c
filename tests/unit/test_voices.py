"""Custom voices, OpenAI voice names, the Qwen3-TTS request extras, batches and the speech
WebSocket (openai_frontend.voice_store, serving.voices, serving.speech_stream) against a fake
engine: no Triton."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from engine_stub import EngineStub
from starlette.testclient import TestClient

from openai_frontend.app import Settings, create_app
from openai_frontend.engine import InvalidRequestError, ModelInfo, SpeechOptions
from openai_frontend.engine.model_info import OPENAI_VOICES, _voice_aliases
from openai_frontend.engine.triton import qwen3_speech_inputs
from openai_frontend.serving.speech_stream import split_sentences
from openai_frontend.voice_store import DuplicateVoiceName, VoiceCorruptError, VoiceSettings, VoiceStore
from tests.helpers.frontend import frontend_client

SPEECH_OUT = frozenset({"AUDIO", "SAMPLE_RATE"})
PIPER = ModelInfo(name="piper_tts", inputs=frozenset({"TEXT", "VOICE", "SPEED"}), outputs=SPEECH_OUT,
                  decoupled=True, voices=("joe",), default_voice="joe", sample_rate=22050, supports_speed=True)
QWEN = ModelInfo(name="qwen3_tts", inputs=frozenset({"TEXT", "TASK", "VOICE", "INSTRUCTIONS", "LANGUAGE",
                                                     "VOICE_PROMPT", "REF_AUDIO", "REF_SAMPLE_RATE", "REF_TEXT",
                                                     "X_VECTOR_ONLY"}),
                 outputs=SPEECH_OUT, decoupled=True, voices=("vivian", "ryan"), default_voice="vivian",
                 sample_rate=24000, voice_aliases=(("echo", "ryan"),))
PROMPTER = ModelInfo(name="qwen3_tts_voice_prompt",
                     inputs=frozenset({"REF_AUDIO", "REF_SAMPLE_RATE", "REF_TEXT", "X_VECTOR_ONLY"}),
                     outputs=frozenset({"VOICE_PROMPT", "REF_SECONDS"}))
OMNI = ModelInfo(name="omni", inputs=frozenset({"MESSAGES", "MODALITIES", "VOICE"}),
                 outputs=frozenset({"TEXT_DELTA", "AUDIO", "SAMPLE_RATE"}), decoupled=True,
                 voices=("Ethan", "Chelsie"), default_voice="Ethan", sample_rate=24000, modalities=("text", "audio"))


class FakeEngine(EngineStub):
    """Speech models that answer ``chunks`` (0.1 s of noise each); records every call."""

    def __init__(self, models=(PIPER, QWEN, PROMPTER, OMNI)):
        self.models = {m.name: m for m in models}
        self.calls: list[dict] = []
        self.prompt_calls: list[dict] = []
        self.n_chunks = 3
        self.block = False  # wait forever before the first chunk
        self.reached_block = 0
        self.cancelled = 0
        self.completed = 0
        self.fail_prompt = False

    async def is_live(self):
        return True

    async def list_models(self):
        return list(self.models.values())

    async def get_model(self, name):
        from openai_frontend.engine import ModelNotFoundError
        if name not in self.models:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        return self.models[name]

    async def synthesize(self, model, text, voice=None, speed=None, options=None, paced=False):
        self.calls.append({"model": model, "text": text, "voice": voice, "speed": speed, "options": options,
                           "paced": paced})
        rate = self.models[model].sample_rate
        done = False
        try:
            for i in range(self.n_chunks):
                await asyncio.sleep(0)
                if self.block:
                    self.reached_block += 1
                    await asyncio.Event().wait()
                yield np.random.default_rng(i).uniform(-0.5, 0.5, rate // 10).astype(np.float32), rate
            done = True
            self.completed += 1
        finally:
            if not done:
                self.cancelled += 1

    async def voice_prompt(self, model, audio, sample_rate, ref_text, x_vector_only):
        self.prompt_calls.append({"model": model, "audio": audio, "sample_rate": sample_rate,
                                  "ref_text": ref_text, "x_vector_only": x_vector_only})
        if self.fail_prompt:
            raise InvalidRequestError("clip rejected by the stage")
        return b"PROMPT%d:" % len(audio) + np.asarray(audio, np.float32).tobytes()[:64], len(audio) / sample_rate

    async def generate_images(self, model, job):
        raise NotImplementedError

    def generate(self, model, request):
        raise NotImplementedError

    async def stage_statistics(self, models):
        return {}

    async def close(self):
        pass


def wav_bytes(seconds: float, rate: int = 16000, channels: int = 1, fmt: str = "WAV") -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    data = np.stack([tone] * channels, axis=1) if channels > 1 else tone
    buf = io.BytesIO()
    sf.write(buf, data, rate, format=fmt)
    return buf.getvalue()


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def settings(tmp_path):
    return Settings(voices=VoiceSettings(storage_dir=tmp_path / "voices", min_seconds=1.0, max_seconds=5.0,
                                         max_upload_bytes=600_000))


client = frontend_client


async def consent(c) -> str:
    r = await c.post("/v1/audio/voice_consents", data={"name": "me", "language": "en-US"},
                     files={"recording": ("c.wav", wav_bytes(1.5), "audio/wav")})
    assert r.status_code == 200, r.text
    return r.json()["id"]


async def clone(c, name="mine", seconds=2.0, rate=16000, channels=1, consent_id=None, ref_text="hello there",
                **extra) -> httpx.Response:
    data = {"name": name, **({"ref_text": ref_text} if ref_text else {}), **extra}
    if consent_id is not None:
        data["consent"] = consent_id
    return await c.post("/v1/audio/voices", data=data,
                        files={"audio_sample": ("v.wav", wav_bytes(seconds, rate, channels), "audio/wav")})


def err(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    if code is not None:
        assert e["code"] == code, e
    return e


# --------------------------------------------------------------------------- store
def test_store_persists_across_reopen_and_reports_corruption(tmp_path):
    cfg = VoiceSettings(storage_dir=tmp_path)
    store = VoiceStore(cfg)
    v = store.add_clip("a", np.zeros(24000, np.float32), 24000, b"prompt-bytes", "txt", "cons_1")
    d = store.add_design("b", "a calm low voice")
    store.close()
    store = VoiceStore(cfg)
    assert [x.id for x in store.list_voices()] == [v.id, d.id]
    assert store.get("a").id == v.id and store.get(v.id).name == "a"
    assert store.voice_prompt(store.get(v.id)) == b"prompt-bytes"
    assert store.get("b").prompt == "a calm low voice" and store.get("b").error is None
    # a changed prompt file, then a missing clip: reported, never a crash
    (tmp_path / "voices" / v.id / "voice_prompt.bin").write_bytes(b"tampered")
    assert "checksum" in store.get(v.id).error
    with pytest.raises(VoiceCorruptError):
        store.voice_prompt(store.get(v.id))
    (tmp_path / "voices" / v.id / "clip.wav").unlink()
    (tmp_path / "voices" / v.id / "voice_prompt.bin").write_bytes(b"prompt-bytes")
    assert "missing" in store.get(v.id).error
    assert store.delete(v.id).id == v.id and store.get(v.id) is None and store.delete(v.id) is None


def test_store_leaves_nothing_half_written(tmp_path, monkeypatch):
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path))
    store.add_clip("a", np.zeros(100, np.float32), 24000, b"p", None, None)
    with pytest.raises(DuplicateVoiceName):
        store.add_clip("a", np.zeros(100, np.float32), 24000, b"q", None, None)
    assert len(list((tmp_path / "voices").iterdir())) == 1  # the duplicate's folder was removed

    def crash(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(store, "_insert", crash)
    with pytest.raises(OSError):
        store.add_clip("b", np.zeros(100, np.float32), 24000, b"p", None, None)
    assert len(list((tmp_path / "voices").iterdir())) == 1
    monkeypatch.undo()
    # a crash between the rename and the commit, and an unfinished temp folder: swept at start
    (tmp_path / "voices" / "voice_orphan").mkdir()
    (tmp_path / "voices" / ".tmp-voice_x").mkdir()
    store.close()
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path))
    assert sorted(p.name for p in (tmp_path / "voices").iterdir()) == [store.get("a").id]


def test_consent_pages(tmp_path):
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path))
    ids = [store.add_consent(f"c{i}", "en-US", b"RIFF", "wav").id for i in range(5)]
    page, more = store.list_consents(limit=2)
    assert [c.id for c in page] == ids[:2] and more
    page, more = store.list_consents(after=ids[3], limit=2)
    assert [c.id for c in page] == ids[4:] and not more


# --------------------------------------------------------------------------- voice names
def test_openai_voice_table():
    assert PIPER.resolve_voice("alloy") == "joe" and PIPER.resolve_voice("joe") == "joe"
    assert QWEN.resolve_voice("echo") == "ryan" and QWEN.resolve_voice("nova") == "vivian"
    assert PIPER.resolve_voice("nobody") is None
    assert set(QWEN.openai_voice_table) == set(OPENAI_VOICES) and QWEN.openai_voice_table["echo"] == "ryan"
    assert _voice_aliases("m", "alloy=joe, echo = joe,bad,nova=ghost", ("joe",)) == (("alloy", "joe"), ("echo", "joe"))


async def test_openai_names_reach_the_model_voice(engine, settings):
    async with client(engine, settings) as c:
        for name in ("alloy", "cedar"):
            r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "hi", "voice": name})
            assert r.status_code == 200, r.text
        r = await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "voice": "echo"})
        assert r.status_code == 200
        err(await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "hi", "voice": "nobody"}),
            400, "invalid_voice")
    assert [x["voice"] for x in engine.calls] == ["joe", "joe", "ryan"]


# --------------------------------------------------------------------------- voices API
async def test_clone_speak_delete_404(engine, settings):
    async with client(engine, settings) as c:
        cid = await consent(c)
        r = await clone(c, consent_id=cid, rate=44100, channels=2)
        assert r.status_code == 200, r.text
        voice = r.json()
        assert voice["object"] == "audio.voice" and voice["type"] == "audio_sample" and voice["id"].startswith("voice_")
        (call,) = engine.prompt_calls
        assert call["model"] == "qwen3_tts_voice_prompt" and call["sample_rate"] == 24000
        assert call["audio"].shape == (48000,) and call["ref_text"] == "hello there" and not call["x_vector_only"]
        r = await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "voice": {"id": voice["id"]}})
        assert r.status_code == 200, r.text
        opts = engine.calls[-1]["options"]
        assert opts.task == "base" and opts.voice_prompt.startswith(b"PROMPT") and engine.calls[-1]["voice"] is None
        r = await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "voice": "mine"})  # by name
        assert r.status_code == 200 and engine.calls[-1]["options"].voice_prompt == opts.voice_prompt
        assert len(engine.prompt_calls) == 1  # the prompt was computed once, at upload
        err(await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "hi", "voice": {"id": voice["id"]}}),
            400, "unsupported_voice")
        listed = (await c.get("/v1/audio/voices")).json()
        assert [v["id"] for v in listed["uploaded_voices"]] == [voice["id"]]
        qwen = next(d for d in listed["data"] if d["model"] == "qwen3_tts")
        assert qwen["custom_voices"] == [voice["id"]] and "mine" in listed["voices"]
        assert {d["model"] for d in listed["data"]} == {"piper_tts", "qwen3_tts", "omni"}
        d = await c.delete(f"/v1/audio/voices/{voice['id']}")
        assert d.json() == {"id": voice["id"], "object": "audio.voice.deleted", "deleted": True}
        err(await c.delete(f"/v1/audio/voices/{voice['id']}"), 404, "voice_not_found")
        err(await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "voice": {"id": voice["id"]}}),
            400, "invalid_voice")
    assert not list((settings.voices.storage_dir / "voices").iterdir())


async def test_designed_voice_and_instructions(engine, settings):
    async with client(engine, settings) as c:
        r = await c.post("/v1/audio/voices", data={"name": "calm", "type": "prompt", "prompt": "a calm low voice"})
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "prompt" and r.json()["prompt"] == "a calm low voice"
        assert (await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi",
                                                       "voice": {"id": r.json()["id"]}})).status_code == 200
        opts = engine.calls[-1]["options"]
        assert (opts.task, opts.instructions, engine.calls[-1]["voice"]) == ("voice_design", "a calm low voice", None)
        # CustomVoice with instructions, language, task_type
        assert (await c.post("/v1/audio/speech", json={
            "model": "qwen3_tts", "input": "hi", "voice": "ryan", "instructions": "cheerful",
            "language": "English", "task_type": "CustomVoice"})).status_code == 200
        call = engine.calls[-1]
        assert call["voice"] == "ryan" and (call["options"].task, call["options"].instructions,
                                            call["options"].language) == ("custom_voice", "cheerful", "English")
        err(await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "hi", "instructions": "x"}),
            400, "unsupported_instructions")
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "hi", "language": "English",
                                                   "task_type": "CustomVoice"})
        assert r.status_code == 200 and r.headers["x-ignored-fields"] == "task_type, language"
        assert engine.calls[-1]["options"] is None
        err(await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "task_type": "Sing"}),
            400, "invalid_value")
        err(await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "task_type": "VoiceDesign"}),
            400, "invalid_value")


async def test_per_request_ref_audio(engine, settings):
    url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(1.0, 8000)).decode()
    async with client(engine, settings) as c:
        r = await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "ref_audio": url,
                                                   "ref_text": "ref words"})
        assert r.status_code == 200, r.text
        opts = engine.calls[-1]["options"]
        assert opts.task == "base" and opts.ref_sample_rate == 24000 and opts.ref_audio.shape == (24000,)
        assert opts.ref_text == "ref words" and opts.voice_prompt is None
        err(await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "hi", "ref_audio": url}),
            400, "unsupported_ref_audio")
        err(await c.post("/v1/audio/speech",
                         json={"model": "qwen3_tts", "input": "hi", "ref_audio": "data:audio/wav;base64,@@"}),
            400, "invalid_audio")
        err(await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "ref_audio": "https://x/y.wav"}),
            400, "invalid_audio")
        err(await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "ref_text": "t"}),
            400, "invalid_value")


def test_qwen3_inputs_only_declared():
    opts = SpeechOptions(task="base", voice_prompt=b"x", instructions="i", ref_audio=np.zeros(3, np.float32),
                         ref_sample_rate=24000)
    names = [n for n, _ in qwen3_speech_inputs(opts, QWEN.inputs)]
    assert names == ["TASK", "INSTRUCTIONS", "VOICE_PROMPT", "REF_AUDIO", "REF_SAMPLE_RATE"]
    assert qwen3_speech_inputs(opts, PIPER.inputs) == []


@pytest.mark.parametrize("case, status, code", [
    ("no_consent", 400, "consent_required"),
    ("unknown_consent", 400, "invalid_consent"),
    ("too_short", 400, "audio_too_short"),
    ("too_long", 400, "audio_too_long"),
    ("not_audio", 400, "invalid_audio"),
    ("too_big", 413, "file_too_large"),
    ("duplicate", 409, "duplicate_name"),
    ("no_name", 400, "missing_required_parameter"),
    ("no_file", 400, "missing_required_parameter"),
    ("stage_rejects", 400, None),
    ("no_prompt_model", 400, "voice_cloning_unavailable"),
    ("empty_prompt", 400, "missing_required_parameter"),
])
async def test_bad_uploads_store_nothing(engine, settings, case, status, code):
    async with client(engine, settings) as c:
        cid = await consent(c)
        if case == "duplicate":
            assert (await clone(c, consent_id=cid)).status_code == 200
        before = sorted(p.name for p in (settings.voices.storage_dir / "voices").iterdir())
        files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
        if case == "no_consent":
            r = await clone(c)
        elif case == "unknown_consent":
            r = await clone(c, consent_id="cons_nope")
        elif case == "too_short":
            r = await clone(c, consent_id=cid, seconds=0.3)
        elif case == "too_long":
            r = await clone(c, consent_id=cid, seconds=5.5, rate=8000)
        elif case == "not_audio":
            r = await c.post("/v1/audio/voices", data={"name": "x", "consent": cid},
                             files={"audio_sample": ("v.wav", b"this is not audio" * 50, "audio/wav")})
        elif case == "too_big":
            r = await clone(c, consent_id=cid, seconds=4.9, rate=96000)  # ~940 kB (PCM16) > 600 kB
        elif case == "duplicate":
            r = await clone(c, consent_id=cid)
        elif case == "no_name":
            r = await c.post("/v1/audio/voices", data={"consent": cid}, files=files)
        elif case == "no_file":
            r = await c.post("/v1/audio/voices", data={"name": "x", "consent": cid})
        elif case == "stage_rejects":
            engine.fail_prompt = True
            r = await clone(c, consent_id=cid)
        elif case == "no_prompt_model":
            del engine.models["qwen3_tts_voice_prompt"]
            r = await clone(c, consent_id=cid)
        else:
            r = await c.post("/v1/audio/voices", data={"name": "x", "type": "prompt", "prompt": "  "})
        err(r, status, code)
        assert sorted(p.name for p in (settings.voices.storage_dir / "voices").iterdir()) == before
        assert len((await c.get("/v1/audio/voices")).json()["uploaded_voices"]) == (case == "duplicate")


async def test_corrupt_voice_listed_and_409_on_use(engine, settings):
    async with client(engine, settings) as c:
        vid = (await clone(c, consent_id=await consent(c))).json()["id"]
        (settings.voices.storage_dir / "voices" / vid / "voice_prompt.bin").write_bytes(b"garbage")
        listed = (await c.get("/v1/audio/voices")).json()
        assert "checksum" in listed["uploaded_voices"][0]["error"]
        err(await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "voice": {"id": vid}}),
            409, "voice_corrupt")
        assert (await c.delete(f"/v1/audio/voices/{vid}")).status_code == 200  # still deletable


async def test_voices_survive_a_restart(engine, settings):
    async with client(engine, settings) as c:
        vid = (await clone(c, consent_id=await consent(c))).json()["id"]
    async with client(FakeEngine(), settings) as c:  # a new app on the same folder
        listed = (await c.get("/v1/audio/voices")).json()
        assert [v["id"] for v in listed["uploaded_voices"]] == [vid]
        assert (await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi",
                                                       "voice": {"id": vid}})).status_code == 200


async def test_consents_api(engine, settings):
    async with client(engine, settings) as c:
        cid = await consent(c)
        assert (await c.get(f"/v1/audio/voice_consents/{cid}")).json()["name"] == "me"
        assert (await c.post(f"/v1/audio/voice_consents/{cid}", json={"name": "renamed"})).json()["name"] == "renamed"
        page = (await c.get("/v1/audio/voice_consents")).json()
        assert page["object"] == "list" and [x["id"] for x in page["data"]] == [cid] and not page["has_more"]
        r = await c.post("/v1/audio/voice_consents", data={"name": "x", "language": "en"},
                         files={"recording": ("c.wav", b"nope" * 100, "audio/wav")})
        err(r, 400, "invalid_audio")
        for seconds, channels, code in [(5.5, 1, "audio_too_long"), (0.5, 1, "audio_too_short"),
                                        (1.5, 9, "invalid_audio")]:
            r = await c.post("/v1/audio/voice_consents", data={"name": "x", "language": "en"},
                             files={"recording": ("c.wav", wav_bytes(seconds, channels=channels), "audio/wav")})
            assert err(r, 400, code)["param"] == "recording"  # a consent has a voice clip's limits
        assert len((await c.get("/v1/audio/voice_consents")).json()["data"]) == 1
        assert (await c.delete(f"/v1/audio/voice_consents/{cid}")).json()["deleted"] is True
        err(await c.get(f"/v1/audio/voice_consents/{cid}"), 404, "consent_not_found")



async def test_consent_deleted_while_renamed_is_a_404_not_a_500(engine, settings, monkeypatch):
    """update_consent checks the consent, then renames it: a delete in between (another request)
    made rename_consent return None, and ``.to_openai()`` on it was an AttributeError (500)."""
    from openai_frontend.voice_store import VoiceStore

    rename = VoiceStore.rename_consent

    def deleted_first(self, cid, name):
        self.delete_consent(cid)
        return rename(self, cid, name)

    async with client(engine, settings) as c:
        cid = await consent(c)
        monkeypatch.setattr(VoiceStore, "rename_consent", deleted_first)
        err(await c.post(f"/v1/audio/voice_consents/{cid}", json={"name": "renamed"}), 404, "consent_not_found")

async def test_voices_disabled_without_store(engine):
    async with client(engine, Settings()) as c:
        err(await c.post("/v1/audio/voices", data={"name": "x", "type": "prompt", "prompt": "p"}), 404,
            "voices_disabled")
        assert (await c.get("/v1/audio/voices")).json()["uploaded_voices"] == []


# --------------------------------------------------------------------------- batch
async def test_batch_one_bad_item(engine, settings):
    async with client(engine, settings) as c:
        r = await c.post("/v1/audio/speech/batch", json={
            "model": "piper_tts", "voice": "alloy",
            "items": [{"input": "one"}, {"input": ""}, {"input": "three", "response_format": "flac"},
                      {"input": "four", "voice": "nobody"}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["total"], body["succeeded"], body["failed"]) == (4, 2, 2)
        ok0, bad1, ok2, bad3 = body["results"]
        assert ok0["status"] == "success" and ok0["media_type"] == "audio/wav"
        y, sr = sf.read(io.BytesIO(base64.b64decode(ok0["audio_data"])))
        assert sr == 22050 and len(y) == 3 * 2205
        assert ok2["media_type"] == "audio/flac"
        assert bad1["status"] == "error" and bad1["param"] == "input" and bad1["status_code"] == 400
        assert bad3["code"] == "invalid_voice"
        for n in (0, 33):
            err(await c.post("/v1/audio/speech/batch", json={"model": "piper_tts", "items": [{"input": "x"}] * n}), 400)


# --------------------------------------------------------------------------- WebSocket
def test_split_sentences():
    assert split_sentences("Hi there. How are") == (["Hi there."], "How are")
    assert split_sentences("Pi is 3.14 and") == ([], "Pi is 3.14 and")
    assert split_sentences("Wait... really?! Yes\nNo") == (["Wait...", "really?!", "Yes"], "No")
    assert split_sentences("你好。再见") == (["你好。"], "再见")
    long = "word " * 100
    sentences, rest = split_sentences(long)
    assert all(len(s) <= 400 for s in sentences) and len(rest) <= 400 and sentences


def ws_client(engine, settings):
    return TestClient(create_app(engine, settings))


def test_ws_audio_before_the_last_text(engine, settings):
    with ws_client(engine, settings) as tc, tc.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "model": "piper_tts", "voice": "alloy", "response_format": "wav"})
        ws.send_json({"type": "input.text", "text": "Hello there. This is"})
        deadline = time.monotonic() + 10  # (a bound, not a timing assertion: receive has no timeout)
        while not engine.calls:
            assert time.monotonic() < deadline, "no synthesis before the last text was sent"
            time.sleep(0.01)
        start = ws.receive_json()  # arrives while the second sentence is still incomplete
        assert start["type"] == "audio.start" and start["sentence_text"] == "Hello there."
        assert (start["sentence_index"], start["utterance_index"], start["sample_rate"]) == (0, 0, 22050)
        data = ws.receive_bytes()
        y, sr = sf.read(io.BytesIO(data))
        assert sr == 22050 and len(y) == 3 * 2205
        assert ws.receive_json() == {"type": "audio.done", "utterance_index": 0, "sentence_index": 0,
                                     "total_bytes": len(data), "error": False}
        ws.send_json({"type": "input.text", "text": " the end"})
        ws.send_json({"type": "input.done"})
        start2 = ws.receive_json()
        assert start2["sentence_text"] == "This is the end" and start2["sentence_index"] == 1
        ws.receive_bytes()
        assert ws.receive_json()["type"] == "audio.done"
        assert ws.receive_json() == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
        # the config is sticky: a second utterance, streamed PCM this time after a new config
        ws.send_json({"type": "session.config", "model": "piper_tts", "stream_audio": True})
        ws.send_json({"type": "input.text", "text": "Again"})
        ws.send_json({"type": "input.done"})
        s3 = ws.receive_json()
        assert (s3["utterance_index"], s3["format"]) == (1, "pcm")
        sizes = [len(ws.receive_bytes()) for _ in range(3)]
        assert sizes == [2 * 2205] * 3
        done = ws.receive_json()
        assert done["total_bytes"] == sum(sizes) and not done["error"]
        assert ws.receive_json()["type"] == "session.done"
        ws.send_json({"type": "session.close"})
    assert [c["text"] for c in engine.calls] == ["Hello there.", "This is the end", "Again"]
    assert [c["voice"] for c in engine.calls] == ["joe"] * 3
    # streamed PCM is as fast as it is made unless the config asks for real time (below)
    assert [c["paced"] for c in engine.calls] == [False, False, False]


def test_ws_streamed_audio_is_paced_only_when_the_config_asks_for_realtime(engine, settings):
    """The session's ``stream_pacing`` (issue 29): ``realtime`` with ``stream_audio`` sends PACED;
    the default, ``none``, and a whole-clip session (field accepted, ignored) do not; an unknown
    value is a non-fatal error naming the field, and the session keeps its previous config."""
    def speak(text):
        ws.send_json({"type": "input.text", "text": text})
        ws.send_json({"type": "input.done"})
        while True:
            frame = ws.receive()
            if frame.get("text") is None:
                continue  # the audio
            msg = json.loads(frame["text"])
            assert msg["type"] != "error", msg
            if msg["type"] == "session.done":
                return

    with ws_client(engine, settings) as tc, tc.websocket_connect("/v1/audio/speech/stream") as ws:
        pcm = {"type": "session.config", "model": "piper_tts", "stream_audio": True}
        ws.send_json({**pcm, "stream_pacing": "realtime"})
        speak("One.")
        ws.send_json({**pcm, "stream_pacing": "none"})
        speak("Two.")
        ws.send_json({**pcm, "stream_pacing": "fast"})
        err = ws.receive_json()
        assert err["type"] == "error" and "stream_pacing" in err["message"], err
        speak("Three.")  # still the "none" config
        ws.send_json({"type": "session.config", "model": "piper_tts", "response_format": "wav",
                      "stream_pacing": "realtime"})
        speak("Four.")
        ws.send_json({"type": "session.close"})
    assert [c["text"] for c in engine.calls] == ["One.", "Two.", "Three.", "Four."]
    assert [c["paced"] for c in engine.calls] == [True, False, False, False]


def test_ws_errors_are_not_fatal(engine, settings):
    with ws_client(engine, settings) as tc, tc.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "input.text", "text": "x"})
        assert ws.receive_json()["code"] == "not_configured"
        ws.send_text("not json")
        assert ws.receive_json()["code"] == "invalid_json"
        ws.send_json({"type": "session.config", "model": "piper_tts", "voice": "nobody"})
        assert ws.receive_json()["code"] == "invalid_voice"
        ws.send_json({"type": "session.config", "model": "piper_tts", "stream_audio": True, "response_format": "wav"})
        assert ws.receive_json()["code"] == "unsupported_format"
        ws.send_json({"type": "bogus"})
        assert ws.receive_json()["code"] == "invalid_message"
        ws.send_json({"type": "session.config", "model": "piper_tts"})
        ws.send_json({"type": "input.text", "text": "half"})
        ws.send_json({"type": "session.config", "model": "piper_tts"})
        assert ws.receive_json()["code"] == "text_pending"
        ws.send_json({"type": "input.done"})
        assert ws.receive_json()["type"] == "audio.start"


def test_ws_closed_socket_cancels_the_pipeline(engine, settings):
    engine.block = True
    with ws_client(engine, settings) as tc:
        with tc.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json({"type": "session.config", "model": "piper_tts"})
            ws.send_json({"type": "input.text", "text": "A sentence that never ends. "})
            deadline = time.monotonic() + 10
            while not engine.reached_block:
                assert time.monotonic() < deadline, "synthesis never started"
                time.sleep(0.01)
            # the client goes away; checked while the app still runs (leaving the TestClient
            # cancels every task of the app, which would hide a handler that does not cancel)
            ws.close(1000)
            deadline = time.monotonic() + 10
            while not engine.cancelled:
                assert time.monotonic() < deadline, "closing the socket did not cancel synthesis"
                time.sleep(0.01)
    assert engine.completed == 0


def test_ws_needs_the_api_key(engine, settings):
    settings.api_key = "k"
    with ws_client(engine, settings) as tc:
        from starlette.websockets import WebSocketDisconnect
        with pytest.raises(WebSocketDisconnect):
            with tc.websocket_connect("/v1/audio/speech/stream") as ws:
                ws.receive_json()
        with tc.websocket_connect("/v1/audio/speech/stream", headers={"Authorization": "Bearer k"}) as ws:
            ws.send_json({"type": "session.config", "model": "piper_tts"})
            ws.send_json({"type": "input.done"})
            assert ws.receive_json() == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}


def _receive_within(ws, seconds: float = 10.0) -> dict:
    """The next message of ``ws``, or a failure after ``seconds`` (TestClient's receive has no
    timeout: a server that never answers would hang the test)."""
    import threading

    box: list = []
    t = threading.Thread(target=lambda: box.append(ws.receive()), daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"nothing from the server within {seconds} s"
    return box[0]


def _closed_with(ws) -> int:
    """The close code of the next message, which must be the close."""
    msg = _receive_within(ws)
    assert msg["type"] == "websocket.close", msg
    return msg["code"]


def test_ws_sessions_are_capped_and_slots_come_back(engine, settings):
    """The N+1-th session is refused (error too_many_sessions, 429, close 1013) while N are open;
    a slot is free again once one of them ends."""
    from contextlib import ExitStack

    settings.speech_stream_max_sessions = 2
    app = create_app(engine, settings)
    with TestClient(app) as tc, ExitStack() as stack:
        first, _second = (stack.enter_context(tc.websocket_connect("/v1/audio/speech/stream")) for _ in range(2))
        with tc.websocket_connect("/v1/audio/speech/stream") as third:
            event = json.loads(_receive_within(third)["text"])
            assert (event["type"], event["code"], event["status_code"]) == ("error", "too_many_sessions", 429)
            assert _closed_with(third) == 1013
        first.close(1000)  # one ends: its slot comes back (counted down in the handler's finally)
        deadline = time.monotonic() + 10
        while app.state.speech_stream_sessions != 1:
            assert time.monotonic() < deadline, "the closed session's slot never came back"
            time.sleep(0.01)
        with tc.websocket_connect("/v1/audio/speech/stream") as again:
            again.send_json({"type": "session.config", "model": "piper_tts"})
            again.send_json({"type": "input.done"})
            assert json.loads(_receive_within(again)["text"])["type"] == "session.done"
    assert app.state.speech_stream_sessions == 0  # every path gave its slot back


def test_ws_silent_sessions_are_closed(engine, settings):
    """No session.config after the handshake, or no message (nothing to speak) after one: closed
    with an idle_timeout error and 1008."""
    settings.speech_stream_idle_timeout_s = 0.3
    with ws_client(engine, settings) as tc:
        with tc.websocket_connect("/v1/audio/speech/stream") as ws:  # sends nothing at all
            event = json.loads(_receive_within(ws)["text"])
            assert (event["type"], event["code"]) == ("error", "idle_timeout")
            assert _closed_with(ws) == 1008
        with tc.websocket_connect("/v1/audio/speech/stream") as ws:  # configured, then silent
            ws.send_json({"type": "session.config", "model": "piper_tts"})
            ws.send_json({"type": "input.text", "text": "half a sentence"})  # buffered, not queued
            event = json.loads(_receive_within(ws)["text"])
            assert (event["type"], event["code"]) == ("error", "idle_timeout")
            assert _closed_with(ws) == 1008
        assert tc.app.state.speech_stream_sessions == 0


class _SlowEngine(FakeEngine):
    """Each chunk takes ``delay`` seconds to make."""

    delay = 0.5

    async def synthesize(self, model, text, voice=None, speed=None, options=None, paced=False):
        async for chunk, rate in super().synthesize(model, text, voice, speed, options, paced):
            await asyncio.sleep(self.delay)
            yield chunk, rate


def test_ws_speaking_session_is_not_idle():
    """A session whose sentence takes 5x the idle timeout to synthesise gets its audio (no
    idle_timeout while it is spoken); once done and silent, the idle clock runs again."""
    engine = _SlowEngine()
    settings = Settings(speech_stream_idle_timeout_s=0.3)
    with ws_client(engine, settings) as tc, tc.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "model": "piper_tts", "response_format": "wav"})
        ws.send_json({"type": "input.text", "text": "A slow sentence. "})  # then silence: 1.5 s of synthesis
        start = json.loads(_receive_within(ws)["text"])
        assert start["type"] == "audio.start", start
        assert _receive_within(ws).get("bytes")
        done = json.loads(_receive_within(ws)["text"])
        assert done["type"] == "audio.done" and not done["error"]
        event = json.loads(_receive_within(ws)["text"])
        assert (event["type"], event["code"]) == ("error", "idle_timeout")
        assert _closed_with(ws) == 1008
    assert engine.completed == 1 and engine.cancelled == 0


@pytest.mark.parametrize("model, expect", [("piper", {"nova": "joe"}), ("llm_tts", {"alloy": "joe"}),
                                           ("csm", {"nova": "3", "alloy": "0"}),
                                           ("qwen3_omni", {"nova": "Chelsie", "onyx": "Aiden"})])
def test_every_speech_config_maps_every_openai_name(model, expect):
    """The table is read from each model's config.pbtxt (parameter openai_voices) through ModelInfo."""
    from pathlib import Path

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from openai_frontend.engine import model_info_from_config

    root = Path(__file__).resolve().parents[2]
    config = text_format.Parse((root / "model_repository" / model / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    info = model_info_from_config(config)
    assert dict(info.voice_aliases).keys() == set(OPENAI_VOICES)
    assert {n: info.resolve_voice(n) for n in expect} == expect


async def test_damaged_row_and_damaged_database_are_reported_not_a_crash(engine, settings):
    import sqlite3

    async with client(engine, settings) as c:
        vid = (await clone(c, consent_id=await consent(c))).json()["id"]
    db = settings.voices.storage_dir / "voices.sqlite"
    with sqlite3.connect(db) as conn:  # a row damaged outside the frontend
        conn.execute("UPDATE voices SET created_at = 'yesterday', seconds = 'long' WHERE id = ?", (vid,))
    async with client(engine, settings) as c:
        (listed,) = (await c.get("/v1/audio/voices")).json()["uploaded_voices"]
        assert listed["id"] == vid and "unreadable" in listed["error"]
        err(await c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": "hi", "voice": vid}), 409,
            "voice_corrupt")
    for suffix in ("", "-wal", "-shm"):
        p = db.with_name(db.name + suffix)
        if p.exists():
            p.write_bytes(b"this is not a database" * 100)
    async with client(engine, settings) as c:  # the frontend still starts and serves speech
        body = (await c.get("/v1/audio/voices")).json()
        assert body["uploaded_voices"] == [] and "DatabaseError" in body["voice_store_error"]
        err(await c.post("/v1/audio/voices", data={"name": "x", "type": "prompt", "prompt": "p"}), 503,
            "voice_store_unavailable")
        assert (await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "hi"})).status_code == 200
    assert (settings.voices.storage_dir / "voices" / vid).is_dir()  # nothing on disk was touched


def test_ws_stream_audio_resampled_like_a_whole_clip(engine, settings):
    """stream_audio with sample_rate: the PCM chunks, joined, equal resampling the whole sentence."""
    from omni_triton.media.audio import float_to_pcm16, resample

    with ws_client(engine, settings) as tc, tc.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "model": "piper_tts", "stream_audio": True, "sample_rate": 16000})
        ws.send_json({"type": "input.done", "text": ""})
        ws.receive_json()
        ws.send_json({"type": "input.text", "text": "One sentence"})
        ws.send_json({"type": "input.done"})
        assert ws.receive_json()["sample_rate"] == 16000
        data = b""
        while isinstance(msg := ws.receive(), dict) and msg.get("bytes") is not None:
            data += msg["bytes"]
    clip = np.concatenate([np.random.default_rng(i).uniform(-0.5, 0.5, 2205).astype(np.float32) for i in range(3)])
    assert data == float_to_pcm16(resample(clip, 22050, 16000))


async def test_concurrent_requests_keep_their_own_voice(engine, settings):
    """Two stored voices spoken at once (and in one batch): each request carries its own prompt
    (the known vLLM-Omni failure leaked one request's voice into another)."""
    async with client(engine, settings) as c:
        cid = await consent(c)
        a = (await clone(c, name="a", consent_id=cid, seconds=2.0)).json()["id"]
        b = (await clone(c, name="b", consent_id=cid, seconds=3.0)).json()["id"]
        prompts = {v: engine.prompt_calls[i]["audio"] for i, v in enumerate((a, b))}
        engine.calls.clear()
        rs = await asyncio.gather(*(c.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": f"text {v}",
                                                                       "voice": {"id": v}}) for v in (a, b, a, b)))
        assert all(r.status_code == 200 for r in rs)
        r = await c.post("/v1/audio/speech/batch", json={"model": "qwen3_tts", "items": [
            {"input": f"text {a}", "voice": {"id": a}}, {"input": f"text {b}", "voice": {"id": b}}]})
        assert r.json()["succeeded"] == 2
    assert len(engine.calls) == 6
    for call in engine.calls:
        vid = call["text"].split()[1]
        assert call["options"].voice_prompt == b"PROMPT%d:" % len(prompts[vid]) + prompts[vid].tobytes()[:64]


async def test_speech_as_multipart_with_an_uploaded_ref_audio(engine, settings):
    """Per-request cloning with an uploaded clip: the form becomes the same JSON request."""
    async with client(engine, settings) as c:
        r = await c.post("/v1/audio/speech", data={"model": "qwen3_tts", "input": "hi", "ref_text": "ref words",
                                                   "response_format": "wav", "speed": "1.0",
                                                   "x_vector_only_mode": "false"},
                         files={"ref_audio": ("ref.wav", wav_bytes(1.0, 16000), "audio/wav")})
        assert r.status_code == 200, r.text
        opts = engine.calls[-1]["options"]
        assert opts.task == "base" and opts.ref_audio.shape == (24000,) and opts.ref_text == "ref words"
        assert opts.x_vector_only is False
        r = await c.post("/v1/audio/speech", data={"model": "piper_tts", "input": "hi", "voice": '{"id": "joe"}'})
        assert r.status_code == 200 and engine.calls[-1]["voice"] == "joe", r.text
        err(await c.post("/v1/audio/speech", data={"model": "piper_tts", "input": "hi", "speed": "fast"}), 400)
        err(await c.post("/v1/audio/speech", content=b"--x\r\nbroken",
                         headers={"content-type": "multipart/form-data; boundary=x"}), 400)
        err(await c.post("/v1/audio/speech", data={"model": "piper_tts", "input": "hi"},
                         files={"ref_audio": ("ref.wav", b"not audio at all" * 10, "audio/wav")}), 400,
                         "unsupported_ref_audio")
