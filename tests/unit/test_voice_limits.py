"""The voice store's limits (openai_frontend.voice_store, docs/voices.md "Limits"): counts of
voices and consent recordings, stored bytes and the designed-voice prompt length, each a 400 in
the OpenAI error shape checked before anything is written, on a real SQLite file; a store
written by an older frontend (no ``bytes`` column) is migrated and keeps its rows."""
from __future__ import annotations

import sqlite3
import threading

import numpy as np
import pytest
from test_voices import FakeEngine, client, clone, consent, err, wav_bytes

from openai_frontend.app import Settings
from openai_frontend.voice_store import QuotaExceededError, VoiceSettings, VoiceStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                  and p.name not in ("voices.sqlite", "voices.sqlite-wal", "voices.sqlite-shm", "frontend.lock"))


def _settings(tmp_path, **limits):
    return Settings(voices=VoiceSettings(storage_dir=tmp_path / "voices", min_seconds=1.0, max_seconds=5.0,
                                         max_upload_bytes=600_000, **limits))


async def test_consent_count_limit_is_a_400_and_writes_nothing(tmp_path):
    settings = _settings(tmp_path, max_consents=2)
    async with client(FakeEngine(), settings) as c:
        ids = [await consent(c), await consent(c)]
        before = _files(settings.voices.storage_dir)
        r = await c.post("/v1/audio/voice_consents", data={"name": "me", "language": "en-US"},
                         files={"recording": ("c.wav", wav_bytes(1.5), "audio/wav")})
        e = err(r, 400, "quota_exceeded")
        assert "2 consent recordings" in e["message"] and e["type"] == "invalid_request_error"
        assert _files(settings.voices.storage_dir) == before
        assert (await c.delete(f"/v1/audio/voice_consents/{ids[0]}")).status_code == 200
        await consent(c)  # room again after a delete


async def test_voice_count_limit(tmp_path):
    settings = _settings(tmp_path, max_voices=1)
    engine = FakeEngine()
    async with client(engine, settings) as c:
        designed = await c.post("/v1/audio/voices", data={"name": "a", "type": "prompt", "prompt": "calm"})
        assert designed.status_code == 200
        r = await clone(c, name="b", consent_id=await consent(c))
        err(r, 400, "quota_exceeded")
        assert not engine.prompt_calls  # refused before the clip was decoded or sent to the model
        err(await c.post("/v1/audio/voices", data={"name": "c", "type": "prompt", "prompt": "calm"}), 400,
            "quota_exceeded")
        assert [v["name"] for v in (await c.get("/v1/audio/voices")).json()["uploaded_voices"]] == ["a"]


async def test_designed_voice_prompt_length_is_capped(tmp_path):
    settings = _settings(tmp_path, max_prompt_chars=100)
    async with client(FakeEngine(), settings) as c:
        ok = await c.post("/v1/audio/voices", data={"name": "a", "type": "prompt", "prompt": "x" * 100})
        assert ok.status_code == 200, ok.text
        e = err(await c.post("/v1/audio/voices", data={"name": "b", "type": "prompt", "prompt": "x" * 101}),
                400, "prompt_too_long")
        assert e["param"] == "prompt" and "100" in e["message"]
        assert [v["name"] for v in (await c.get("/v1/audio/voices")).json()["uploaded_voices"]] == ["a"]


async def test_stored_bytes_limit_counts_clips_prompts_and_recordings(tmp_path):
    # one consent recording (1.5 s PCM16 at 16 kHz: ~48 kB) fits; a 2 s clip stored as float32
    # at 24 kHz (~192 kB) does not fit in 150 kB on top of it
    settings = _settings(tmp_path, max_stored_bytes=150_000)
    engine = FakeEngine()
    async with client(engine, settings) as c:
        cid = await consent(c)
        before = _files(settings.voices.storage_dir)
        e = err(await clone(c, consent_id=cid), 400, "quota_exceeded")
        assert "150000" in e["message"]
        assert _files(settings.voices.storage_dir) == before  # no clip, no folder, no temp folder
        err(await c.post("/v1/audio/voice_consents", data={"name": "me", "language": "en"},
                         files={"recording": ("c.wav", wav_bytes(3.5), "audio/wav")}), 400, "quota_exceeded")
        assert _files(settings.voices.storage_dir) == before


def test_concurrent_inserts_cannot_pass_a_limit_together(tmp_path):
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path, max_consents=3))
    results = []

    def add(i):
        try:
            results.append(store.add_consent(f"c{i}", "en", b"RIFF" * 10, "wav").id)
        except QuotaExceededError as exc:
            results.append(exc.limit)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r for r in results if r == "max_consents") == ["max_consents"] * 5
    assert len(store.list_consents(limit=100)[0]) == 3
    assert len(list((tmp_path / "consents").iterdir())) == 3  # the refused ones left no file
    store.close()


def test_limits_hold_across_a_restart_and_an_old_store_is_migrated(tmp_path, monkeypatch):
    # a store written before the bytes column existed
    db = sqlite3.connect(tmp_path / "voices.sqlite")
    db.executescript("""
        CREATE TABLE voices (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
            name TEXT UNIQUE NOT NULL, type TEXT NOT NULL, created_at INTEGER NOT NULL, prompt TEXT,
            ref_text TEXT, consent TEXT, sample_rate INTEGER, seconds REAL, prompt_sha256 TEXT, clip_sha256 TEXT);
        CREATE TABLE consents (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, name TEXT NOT NULL,
            language TEXT NOT NULL, created_at INTEGER NOT NULL, file TEXT NOT NULL, sha256 TEXT NOT NULL);
        INSERT INTO voices (id, name, type, created_at, prompt)
            VALUES ('voice_old', 'old', 'prompt', 1, 'a warm voice');
    """)
    db.commit()
    db.close()
    cfg = VoiceSettings(storage_dir=tmp_path, max_voices=2, max_stored_bytes=10_000)
    store = VoiceStore(cfg)
    assert store.get("old").prompt == "a warm voice" and store.get("old").error is None
    store.add_clip("new", np.zeros(1000, np.float32), 24000, b"p" * 100, None, None)
    store.close()
    store = VoiceStore(cfg)  # restart: nothing lost, the limit still counts both
    assert [v.name for v in store.list_voices()] == ["old", "new"]
    with pytest.raises(QuotaExceededError) as info:
        store.add_design("third", "calm")
    assert info.value.limit == "max_voices"
    store.delete("old")

    def no_write(*_a, **_k):
        raise AssertionError("a file was written although the limit was reached")

    monkeypatch.setattr(store.media, "put", no_write)  # checked before any write
    with pytest.raises(QuotaExceededError):
        store.add_consent("c", "en", b"x" * 6000, "wav")
    with pytest.raises(QuotaExceededError) as info:  # ~4.2 kB in use: a ~6 kB clip passes 10 kB
        store.add_clip("big", np.zeros(1500, np.float32), 24000, b"p", None, None)
    assert info.value.limit == "max_stored_bytes"
    assert sorted(p.name for p in (tmp_path / "voices").iterdir()) == [store.get("new").id]
    store.close()
