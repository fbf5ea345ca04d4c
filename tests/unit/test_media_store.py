"""The media store (openai_frontend.media_store, ``--media-url``): atomic writes, key checks,
streamed reads, sweeps that leave other frontends' writes alone, and the video / voice stores
and ``GET /v1/videos/{id}/content`` over it, on a local folder, on fsspec's in-memory file
system (the code path of an object store: no local path, no temporary files) and on S3 (s3fs
against moto's S3 server, ``scripts/setup_s3.sh``; those cases skip where s3fs is not installed,
as s3:// is then not served).
"""
from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from test_videos_frontend import FakeVideoEngine, wait_status

from openai_frontend.app import Settings, create_app
from openai_frontend.media_store import (
    SHARED_SWEEP_GRACE_S,
    InvalidMediaKey,
    MediaStore,
    MediaUrlError,
    check_key,
    open_media_url,
)
from openai_frontend.video_jobs import JobSettings, VideoJobs
from openai_frontend.voice_store import CLIP_FILE, PROMPT_FILE, VoiceSettings, VoiceStore
from tests.helpers.frontend import running_frontend

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


S3_BUCKET = "omni-media-test"


def memory_url() -> str:
    """A fresh folder of fsspec's process-wide in-memory file system."""
    return f"memory://media-{secrets.token_hex(6)}"


def s3_venv() -> Path:
    """The venv of ``scripts/setup_s3.sh`` (``OMNI_TRITON_S3_VENV`` or ``<cache>/s3-venv``)."""
    if os.environ.get("OMNI_TRITON_S3_VENV"):
        return Path(os.environ["OMNI_TRITON_S3_VENV"])
    return Path(os.environ.get("OMNI_TRITON_CACHE", Path.home() / ".cache" / "omni-triton")) / "s3-venv"


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on a free port, with a bucket, and the AWS variables s3fs (botocore)
    reads pointing at it; skips without s3fs (s3:// is not served then) or without the server."""
    s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed: s3:// media is not served by this install")
    server = s3_venv() / "bin" / "moto_server"
    if not server.exists():
        pytest.skip(f"no {server}: run scripts/setup_s3.sh")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_ENDPOINT_URL")}
    try:
        end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < end, "moto_server did not start"
                time.sleep(0.1)
        os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir(S3_BUCKET)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if "s3fs" in sys.modules:
            sys.modules["s3fs"].S3FileSystem.clear_instance_cache()


def _url(request, kind: str) -> str:
    if kind == "s3":
        request.getfixturevalue("s3_endpoint")
        return f"s3://{S3_BUCKET}/media-{secrets.token_hex(6)}"
    return memory_url()


@pytest.fixture(params=["memory", "s3"])
def remote_url(request):
    """A fresh folder on a store without local paths: fsspec's memory file system, or S3 (moto)."""
    return _url(request, request.param)


@pytest.fixture(params=["local", "memory", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return MediaStore(tmp_path / "media")
    return MediaStore(_url(request, request.param))


def files_under(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


# --------------------------------------------------------------------------- the store itself
def test_put_get_open_info_delete(store):
    assert store.put("videos/video_1.mp4", b"0123456789") == 10
    assert store.get("videos/video_1.mp4") == b"0123456789"
    assert store.exists("videos/video_1.mp4") and store.size("videos/video_1.mp4") == 10
    info = store.info("videos/video_1.mp4")
    assert info.key == "videos/video_1.mp4" and info.size == 10 and not info.is_dir
    assert info.mtime is not None and abs(info.mtime - time.time()) < 60
    with store.open("videos/video_1.mp4") as f:  # streamed and seekable: what a Range read does
        f.seek(3)
        assert f.read(4) == b"3456"
    store.put("videos/video_1.mp4", b"new")  # replaced whole
    assert store.get("videos/video_1.mp4") == b"new"
    assert store.info("videos") is None  # a folder is no file
    assert store.info("videos/none.mp4") is None and store.size("videos/none.mp4") is None
    with pytest.raises(FileNotFoundError):
        store.get("videos/none.mp4")
    assert store.delete("videos/video_1.mp4") and not store.delete("videos/video_1.mp4")
    assert not store.exists("videos/video_1.mp4")


def test_delete_prefix_and_list(store):
    store.put("voices/voice_a/clip.wav", b"c")
    store.put("voices/voice_a/voice_prompt.bin", b"p")
    store.put("voices/voice_b/clip.wav", b"c")
    assert sorted((e.name, e.is_dir) for e in store.list("voices")) == [("voice_a", True), ("voice_b", True)]
    assert sorted(e.name for e in store.list("voices/voice_a")) == ["clip.wav", "voice_prompt.bin"]
    assert store.delete_prefix("voices/voice_a") == 2
    assert [e.name for e in store.list("voices")] == ["voice_b"]
    assert store.delete_prefix("voices/voice_none") == 0
    assert store.list("nothing") == []


def test_local_put_is_atomic_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    store = MediaStore(tmp_path)
    store.put("videos/a.mp4", b"first")
    assert os.listdir(tmp_path / "videos") == ["a.mp4"]

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        store.put("videos/a.mp4", b"second")
    assert store.get("videos/a.mp4") == b"first" and os.listdir(tmp_path / "videos") == ["a.mp4"]


def test_local_put_fsyncs_the_file_and_its_folder(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.path.isdir(f"/proc/self/fd/{fd}")) or real(fd))
    MediaStore(tmp_path).put("consents/cons_1.wav", b"x")
    assert synced == [False, True]  # the data, then the rename (the folder)


@pytest.mark.parametrize("key", ["", "/etc/passwd", "../x", "videos/../../x", "videos/..", "a//b", "videos/",
                                 ".hidden", "videos/.video_1.mp4.abc.tmp", "a\\b", "video_*", "[x]", "%2e%2e",
                                 "videos/a..mp4", "a/b/c/d/e", "x" * 300, "v\x00", "voices/ voice"])
def test_bad_keys_are_refused_before_any_file_use(tmp_path, key):
    store = MediaStore(tmp_path / "media")
    (tmp_path / "x").write_bytes(b"outside")
    for call in (lambda: store.put(key, b"x"), lambda: store.get(key), lambda: store.open(key),
                 lambda: store.info(key), lambda: store.delete(key), lambda: store.delete_prefix(key)):
        with pytest.raises(InvalidMediaKey):
            call()
    assert files_under(tmp_path) == ["x"]


def test_the_keys_the_stores_make_are_accepted():
    for key in ("videos/video_0123456789abcdef01234567.mp4", "voices/voice_0123456789abcdef01234567/clip.wav",
                "voices/voice_0123456789abcdef01234567/voice_prompt.bin", "consents/cons_0123456789abcdef01234567.wav",
                "videos/video_old.mp4"):
        assert check_key(key) == key


def test_shared_sweep_leaves_young_temporary_files(tmp_path):
    shared = MediaStore(tmp_path, shared=True)
    assert shared.sweep_grace_s == SHARED_SWEEP_GRACE_S
    shared.put("videos/a.mp4", b"x")
    young, old = tmp_path / "videos" / ".b.mp4.young.tmp", tmp_path / "videos" / ".c.mp4.old.tmp"
    young.write_bytes(b"being written")
    old.write_bytes(b"left by a crash")
    past = time.time() - SHARED_SWEEP_GRACE_S - 1
    os.utime(old, (past, past))
    entries = {e.name: e for e in shared.list("videos")}
    assert entries[young.name].temporary and not shared.stale(entries[young.name])
    assert shared.stale(entries[old.name])
    assert all(MediaStore(tmp_path).stale(e) for e in entries.values())  # one frontend: no grace


def test_media_url_forms(tmp_path):
    assert open_media_url(f"file://{tmp_path}/m").local and (tmp_path / "m").is_dir()
    assert open_media_url(str(tmp_path / "p")).root == str(tmp_path / "p")
    assert not open_media_url(memory_url()).local
    with pytest.raises(MediaUrlError, match="nope://x"):
        open_media_url("nope://x")


def test_media_url_flag_reaches_the_settings(tmp_path, monkeypatch):
    from openai_frontend import __main__ as main

    class NeverServes:
        def __init__(self, config):
            pass

        def run(self):
            raise SystemExit("the frontend would have served")

    monkeypatch.setattr(main, "QuietServer", NeverServes)
    assert main.parse_args([]).media_url is None
    assert main.parse_args(["--media-url", "file:///shared/media"]).media_url == "file:///shared/media"
    with pytest.raises(SystemExit, match="not starting: --media-url nope://bucket: Protocol not known"):
        main.main(["--media-url", "nope://bucket", "--video-storage-dir", str(tmp_path / "v"),
                   "--voice-storage-dir", str(tmp_path / "w"), "--port", "1"])
    with pytest.raises(MediaUrlError):
        create_app(FakeVideoEngine(), Settings(media_url="nope://bucket"))


# --------------------------------------------------------------------------- video jobs over the store
def media_server(engine, storage, media_url, voices=False, **job_settings):
    """``running_frontend`` (tests/helpers/frontend.py) with video jobs on ``storage`` and the media
    at ``media_url`` (voices too with ``voices``): ``async with`` it for the open client."""
    job_settings.setdefault("sweep_interval_s", 3600)
    return running_frontend(engine, Settings(video=JobSettings(storage_dir=storage, **job_settings),
                                             voices=VoiceSettings(storage_dir=storage / "voices") if voices
                                             else None, media_url=media_url))


async def test_video_content_streams_from_an_object_store_with_ranges(tmp_path, remote_url):
    url = remote_url
    async with media_server(FakeVideoEngine(), tmp_path, url) as c:
        jobs = c._transport.app.state.video_jobs
        vid = (await c.post("/v1/videos", data={"prompt": "a fox"})).json()["id"]
        await wait_status(c, vid)
        assert not (tmp_path / "videos").exists()  # nothing in the storage folder: the MP4 is in the store
        mp4 = jobs.media.get(f"videos/{vid}.mp4")
        assert open_media_url(url).get(f"videos/{vid}.mp4") == mp4  # another frontend sees it
        r = await c.get(f"/v1/videos/{vid}/content")
        assert r.status_code == 200 and r.content == mp4 and r.headers["content-type"] == "video/mp4"
        assert r.headers["accept-ranges"] == "bytes" and int(r.headers["content-length"]) == len(mp4)
        r = await c.get(f"/v1/videos/{vid}/content", headers={"range": "bytes=4-11"})
        assert r.status_code == 206 and r.content == mp4[4:12]
        assert r.headers["content-range"] == f"bytes 4-11/{len(mp4)}"
        r = await c.get(f"/v1/videos/{vid}/content", headers={"range": "bytes=-5"})
        assert r.status_code == 206 and r.content == mp4[-5:]
        r = await c.get(f"/v1/videos/{vid}/content", headers={"range": "bytes=0-1,10-12"})
        assert r.status_code == 206 and r.headers["content-type"].startswith("multipart/byteranges")
        assert mp4[0:2] in r.content and mp4[10:13] in r.content
        for bad, status in (("bytes=5-1", 400), ("items=0-1", 400), (f"bytes={len(mp4)}-", 416)):
            r = await c.get(f"/v1/videos/{vid}/content", headers={"range": bad})
            assert r.status_code == status and r.json()["error"]["code"] in ("invalid_range", "range_not_satisfiable")
        jobs.media.delete(f"videos/{vid}.mp4")  # gone from the store (another frontend's purge)
        r = await c.get(f"/v1/videos/{vid}/content")
        assert r.status_code == 410 and r.json()["error"]["code"] == "video_expired"
        assert (await c.delete(f"/v1/videos/{vid}")).status_code == 200


async def test_a_restart_on_the_same_object_store_keeps_the_videos(tmp_path, remote_url):
    url = remote_url
    async with media_server(FakeVideoEngine(), tmp_path, url) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a fox"})).json()["id"]
        await wait_status(c, vid)
        first = (await c.get(f"/v1/videos/{vid}/content")).content
    assert open_media_url(url).get(f"videos/{vid}.mp4") == first and not (tmp_path / "videos").exists()
    async with media_server(FakeVideoEngine(), tmp_path, url) as c:
        assert (await c.get(f"/v1/videos/{vid}/content")).content == first
        assert (await c.delete(f"/v1/videos/{vid}")).status_code == 200
    assert open_media_url(url).list("videos") == []


async def test_video_media_calls_run_off_the_event_loop(tmp_path, monkeypatch, remote_url):
    loop_thread = threading.get_ident()
    threads = []
    for name in ("put", "info", "open", "delete"):
        real = getattr(MediaStore, name)

        def spy(self, *a, _real=real, _name=name, **k):
            threads.append((_name, threading.get_ident()))
            return _real(self, *a, **k)

        monkeypatch.setattr(MediaStore, name, spy)
    async with media_server(FakeVideoEngine(), tmp_path, remote_url) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a fox"})).json()["id"]
        await wait_status(c, vid)
        assert (await c.get(f"/v1/videos/{vid}/content", headers={"range": "bytes=0-3"})).status_code == 206
        assert (await c.delete(f"/v1/videos/{vid}")).status_code == 200
    assert {n for n, _ in threads} == {"put", "info", "open", "delete"}
    assert all(t != loop_thread for _, t in threads), threads


def _other_frontend_makes_a_job(jobs):
    """What another frontend on the shared store does: a job row, then its MP4."""
    from test_video_store import _request

    rec = jobs.store.insert(_request())
    jobs.media.put(f"videos/{rec.id}.mp4", b"another frontend's video")
    jobs.store.complete(rec.id, f"videos/{rec.id}.mp4", None, file_bytes=24)
    return rec.id


def test_stray_sweep_lists_before_it_reads_the_rows(tmp_path, remote_url):
    """A job created (row, then MP4) by another frontend while the sweep runs is never taken for
    an orphan: the folder is listed first, so its file is either not listed or has its row."""
    media = MediaStore(remote_url, shared=True)
    jobs = VideoJobs(None, JobSettings(storage_dir=tmp_path), media=media)
    created = []
    real_list, real_statuses = media.list, jobs.store.statuses

    def between(fn):
        def wrapped(*a, **k):
            out = fn(*a, **k)
            if not created:  # right after the sweep's first read, whichever it is
                created.append(_other_frontend_makes_a_job(jobs))
            return out
        return wrapped

    media.list, jobs.store.statuses = between(real_list), between(real_statuses)
    jobs.media.put("videos/video_gone.mp4", b"orphan")  # no row: removed
    assert jobs.remove_stray_files() == 1
    assert media.exists(f"videos/{created[0]}.mp4") and not media.exists("videos/video_gone.mp4")
    jobs.store.close()


def test_stray_sweep_on_a_shared_folder_leaves_others_temporary_files(tmp_path):
    media_dir = tmp_path / "media"
    jobs = VideoJobs(None, JobSettings(storage_dir=tmp_path / "a"), media=MediaStore(media_dir, shared=True))
    done = _other_frontend_makes_a_job(jobs)
    videos = media_dir / "videos"
    writing = videos / f".{done}.mp4.abcd1234.tmp"  # being written right now by another frontend
    crashed = videos / ".video_x.mp4.dead.tmp"  # left by a frontend that died 20 minutes ago
    orphan = videos / "video_gone.mp4"
    for f in (writing, crashed, orphan):
        f.write_bytes(b"x")
    past = time.time() - SHARED_SWEEP_GRACE_S - 60
    os.utime(crashed, (past, past))
    assert jobs.remove_stray_files() == 2
    assert sorted(p.name for p in videos.iterdir()) == sorted([f"{done}.mp4", writing.name])
    # an hour later the frontend still writing it would have renamed it; if not, it is left over
    assert jobs.remove_stray_files(now=time.time() + 3600) == 1
    assert [p.name for p in videos.iterdir()] == [f"{done}.mp4"]
    jobs.store.close()


async def test_a_shared_store_is_swept_for_strays_while_running(tmp_path, remote_url):
    """Frontends on a shared store may run for weeks: the periodic sweep also removes what a dead
    frontend left (here at once: a grace of 0), not only the start."""
    media = MediaStore(remote_url, shared=True, sweep_grace_s=0)
    server = media_server(FakeVideoEngine(), tmp_path, remote_url, sweep_interval_s=0.05)
    async with server as c:
        jobs = c._transport.app.state.video_jobs
        jobs.media = media
        vid = (await c.post("/v1/videos", data={"prompt": "a fox"})).json()["id"]
        await wait_status(c, vid)
        media.put("videos/video_left_by_a_dead_frontend.mp4", b"orphan")
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while media.exists("videos/video_left_by_a_dead_frontend.mp4"):
            assert loop.time() < end, "the periodic sweep never removed the orphan"
            await asyncio.sleep(0.05)
        assert media.exists(f"videos/{vid}.mp4")


def test_a_local_store_on_an_explicit_media_folder_owns_it(tmp_path):
    """Orphans are judged by the store's rows: two frontends with their own SQLite files cannot
    share one media folder (each would remove the other's MP4s); the second refuses to start."""
    import subprocess
    import sys

    media_dir = tmp_path / "shared-media"
    first = VideoJobs(None, JobSettings(storage_dir=tmp_path / "a"), media=MediaStore(media_dir, shared=True))
    code = ("from openai_frontend.video_jobs import JobSettings, VideoJobs\n"
            "from openai_frontend.media_store import MediaStore\n"
            f"VideoJobs(None, JobSettings(storage_dir={str(tmp_path / 'b')!r}), "
            f"media=MediaStore({str(media_dir)!r}, shared=True))\n")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    finally:
        asyncio.run(first.stop())
    assert r.returncode != 0 and "StorageLockedError" in r.stderr and str(media_dir) in r.stderr, r.stderr[-800:]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]  # free again once the first one stopped


# --------------------------------------------------------------------------- voices over the store
def test_voice_files_and_consents_live_in_the_media_store(tmp_path, remote_url):
    url = remote_url
    media = open_media_url(url)
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path), media=media)
    clip = np.zeros(24000, np.float32)
    voice = store.add_clip("v", clip, 24000, b"prompt-bytes", None, None, 1.0)
    consent = store.add_consent("c", "en", b"RIFF recording", "wav")
    assert media.get(f"voices/{voice.id}/{PROMPT_FILE}") == b"prompt-bytes"
    assert media.exists(f"voices/{voice.id}/{CLIP_FILE}") and media.exists(f"consents/{consent.id}.wav")
    assert not (tmp_path / "voices").exists() or not list((tmp_path / "voices").iterdir())
    assert [v.error for v in store.list_voices()] == [None]
    assert store.voice_prompt(store.get("v")) == b"prompt-bytes"
    media.put(f"voices/{voice.id}/{PROMPT_FILE}", b"tampered")
    assert "checksum" in store.list_voices()[0].error
    media.delete(f"voices/{voice.id}/{CLIP_FILE}")
    assert store.get("v").error in (f"{CLIP_FILE} is missing", f"{PROMPT_FILE} does not match its checksum")
    store.close()
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path), media=open_media_url(url))  # a restart keeps them
    assert [v.name for v in store.list_voices()] == ["v"] and store.get_consent(consent.id) is not None
    assert store.delete("v") is not None and media.list(f"voices/{voice.id}") == []
    assert store.delete_consent(consent.id) and media.list("consents") == []
    store.close()


def test_voice_sweep_on_a_shared_store_leaves_uploads_in_flight(tmp_path, remote_url):
    """A voice's files are written before its row: on a shared store a folder without a row may
    be another frontend's upload, removed only once older than the grace."""
    media = MediaStore(remote_url, shared=True)
    media.put("voices/voice_inflight/clip.wav", b"c")  # another frontend, mid-upload
    media.put("consents/cons_inflight.wav", b"r")
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path), media=media)
    assert media.exists("voices/voice_inflight/clip.wav") and media.exists("consents/cons_inflight.wav")
    store._sweep(now=time.time() + SHARED_SWEEP_GRACE_S + 1)  # the upload never got its row: a crash
    assert media.list("voices") == [] and media.list("consents") == []
    store.close()


def test_voice_sweep_on_an_own_folder_removes_orphans_at_once(tmp_path):
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path))
    voice = store.add_clip("v", np.zeros(24000, np.float32), 24000, b"p", None, None, 1.0)
    store.close()
    (tmp_path / "voices" / "voice_orphan").mkdir()
    (tmp_path / "voices" / "voice_orphan" / CLIP_FILE).write_bytes(b"c")
    (tmp_path / "voices" / voice.id / f".{CLIP_FILE}.x.tmp").write_bytes(b"c")  # inside a live voice: kept
    (tmp_path / "consents" / "cons_orphan.wav").write_bytes(b"r")
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path))
    assert sorted(p.name for p in (tmp_path / "voices").iterdir()) == [voice.id]
    assert list((tmp_path / "consents").iterdir()) == []
    assert store.get("v").error is None
    store.close()


async def test_voice_upload_failure_leaves_no_file_in_the_store(tmp_path, monkeypatch, remote_url):
    media = MediaStore(remote_url, shared=True)
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path), media=media)
    real = media.put

    def second_put_fails(key, data):
        if key.endswith(PROMPT_FILE):
            raise OSError("bucket unreachable")
        return real(key, data)

    monkeypatch.setattr(media, "put", second_put_fails)
    with pytest.raises(OSError, match="unreachable"):
        store.add_clip("v", np.zeros(24000, np.float32), 24000, b"p", None, None, 1.0)
    assert media.list("voices") == [] and store.count() == 0
    monkeypatch.undo()
    store.add_clip("v", np.zeros(24000, np.float32), 24000, b"p", None, None, 1.0)
    with pytest.raises(Exception, match="v"):  # the name is taken: the second upload's files go again
        store.add_clip("v", np.zeros(24000, np.float32), 24000, b"p", None, None, 1.0)
    assert len(media.list("voices")) == 1
    store.close()


def test_sqlite_is_still_written_to_the_storage_folder(tmp_path):
    store = VoiceStore(VoiceSettings(storage_dir=tmp_path), media=MediaStore(memory_url(), shared=True))
    store.add_design("d", "calm")
    store.close()
    assert sqlite3.connect(tmp_path / "voices.sqlite").execute("SELECT name FROM voices").fetchall() == [("d",)]


async def test_one_media_url_holds_videos_voices_and_consents(tmp_path, remote_url):
    url = remote_url
    async with media_server(FakeVideoEngine(), tmp_path, url, voices=True) as c:
        app = c._transport.app
        vid = (await c.post("/v1/videos", data={"prompt": "a fox"})).json()["id"]
        await wait_status(c, vid)
        await asyncio.to_thread(app.state.voice_store.add_consent, "c", "en", b"rec", "wav")
    assert sorted(e.name for e in open_media_url(url).list("")) == ["consents", "videos"]
    assert not (tmp_path / "videos").exists() and not (tmp_path / "voices" / "consents").exists()
