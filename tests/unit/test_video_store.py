"""The video job store's limits, retention purge and database-error survival
(openai_frontend.video_jobs; docs/video_contracts.md "Limits and retention"), on real SQLite files
with the fake engine of ``test_videos_frontend.py``. Database errors are injected at the SQL level:
the store's connection is wrapped so that chosen statements raise ``sqlite3.OperationalError``."""
from __future__ import annotations

import asyncio
import base64
import sqlite3
import time

import pytest

from clients.bench_common import metric_total

pytest.importorskip("av")

from test_videos_frontend import FakeVideoEngine, Server, assert_error, wait_status

from openai_frontend.engine import InvalidRequestError, VideoJob
from openai_frontend.video_jobs import JobQuotaError, SqliteJobStore, VideoRequest

pytestmark = pytest.mark.anyio

FAST_RETRY = {"db_retry_initial_s": 0.01, "db_retry_max_s": 0.05}


@pytest.fixture
def anyio_backend():
    return "asyncio"


class FlakyConnection:
    """An sqlite3 connection whose statements starting with one of ``failing`` raise
    ``sqlite3.OperationalError("disk I/O error")`` while ``failing`` is set; counts the failures."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db
        self.failing: tuple[str, ...] = ()
        self.failures = 0

    def execute(self, sql, *args):
        if self.failing and sql.lstrip().startswith(self.failing):
            self.failures += 1
            raise sqlite3.OperationalError("disk I/O error")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def flaky(app) -> FlakyConnection:
    store = app.state.video_jobs.store
    store._db = FlakyConnection(store._db)
    return store._db


def metric(app, name: str, **labels: str) -> float:
    from prometheus_client import generate_latest

    return metric_total(generate_latest(app.state.metrics.registry).decode(), name, **labels)


# --------------------------------------------------------------------------- database errors
async def test_dispatcher_survives_database_errors_and_says_so(tmp_path):
    server = Server(FakeVideoEngine(), tmp_path, **FAST_RETRY)
    async with server as c:
        db = flaky(server.app)
        db.failing = ("UPDATE jobs SET status",)  # next_queued's claim of the job
        r = await c.post("/v1/videos", data={"prompt": "a cat"})
        assert r.status_code == 200, r.text
        vid = r.json()["id"]
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while db.failures < 3:  # retried with backoff, not given up after the first error
            assert loop.time() < end
            await asyncio.sleep(0.01)
        body = (await c.get(f"/v1/videos/{vid}")).json()
        assert body["status"] == "queued" and body["error"]["code"] == "job_store_unavailable", body
        assert "disk I/O error" in body["error"]["message"]
        listed = (await c.get("/v1/videos")).json()["data"][0]
        assert listed["error"]["code"] == "job_store_unavailable"
        assert metric(server.app, "omni_frontend_video_store_failing") == 1
        assert metric(server.app, "omni_frontend_video_store_errors_total", operation="dispatch") >= 3
        db.failing = ()  # the database recovers: the job runs, nothing was lost
        body, _ = await wait_status(c, vid, timeout=10)
        assert body["status"] == "completed" and body["error"] is None
        assert metric(server.app, "omni_frontend_video_store_failing") == 0
        assert (await c.get(f"/v1/videos/{vid}/content")).status_code == 200


async def test_a_failing_completion_is_retried_not_lost(tmp_path):
    server = Server(FakeVideoEngine(), tmp_path, **FAST_RETRY)
    async with server as c:
        db = flaky(server.app)
        db.failing = ("UPDATE jobs SET progress", "UPDATE jobs SET status = ?, progress = 100")
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while db.failures < 6:  # progress updates skipped, the completion retried
            assert loop.time() < end
            await asyncio.sleep(0.01)
        assert (await c.get(f"/v1/videos/{vid}")).json()["status"] == "in_progress"
        db.failing = ()
        body, _ = await wait_status(c, vid, timeout=10)
        assert body["status"] == "completed" and body["progress"] == 100
        assert metric(server.app, "omni_frontend_video_store_errors_total", operation="complete") >= 1


async def test_a_failing_failure_is_retried_not_lost(tmp_path):
    engine = FakeVideoEngine(fail=InvalidRequestError("bad embeddings"))
    server = Server(engine, tmp_path, **FAST_RETRY)
    async with server as c:
        db = flaky(server.app)
        db.failing = ("UPDATE jobs SET status = ?, completed_at",)  # JobStore.fail
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while db.failures < 3:
            assert loop.time() < end
            await asyncio.sleep(0.01)
        db.failing = ()
        body, _ = await wait_status(c, vid, timeout=10)
        assert body["status"] == "failed" and body["error"]["code"] == "invalid_request"


# --------------------------------------------------------------------------- retention
def _request(prompt="a cat", reference: str | None = None) -> VideoRequest:
    job = VideoJob(prompt=prompt, width=32, height=32, num_frames=5, steps=2, seed=1, input_reference=reference)
    return VideoRequest(model="wan_t2v", job=job, fps=8, keep_frames=5)


async def test_failed_and_expired_jobs_are_purged_with_their_files(tmp_path):
    engine = FakeVideoEngine()
    server = Server(engine, tmp_path, retention_s=None, purge_after_s=1000)  # MP4s kept unless expires_at is set
    async with server as c:
        jobs = server.app.state.video_jobs
        done = (await c.post("/v1/videos", data={"prompt": "kept"})).json()["id"]
        expired = (await c.post("/v1/videos", data={"prompt": "expires"})).json()["id"]
        for vid in (done, expired):
            await wait_status(c, vid)
        engine.fail = InvalidRequestError("bad embeddings")
        failed = (await c.post("/v1/videos", data={"prompt": "fails"})).json()["id"]
        body, _ = await wait_status(c, failed)
        assert body["status"] == "failed" and body["expires_at"] >= body["completed_at"] + 1000
        stray = tmp_path / "videos" / f".{failed}.mp4.abc.tmp"
        stray.write_bytes(b"half")
        now = int(time.time())
        jobs.store._write("UPDATE jobs SET expires_at = ? WHERE id = ?", (now - 1, expired))
        assert jobs.sweep(now) == 1  # the MP4's retention: expired, answered as such
        assert (await c.get(f"/v1/videos/{expired}")).json()["status"] == "expired"
        assert_error(await c.get(f"/v1/videos/{expired}/content"), 410, code="video_expired")
        jobs.sweep(now + 998)  # not yet past purge_after_s: all rows stay
        assert {(await c.get(f"/v1/videos/{v}")).status_code for v in (done, expired, failed)} == {200}
        jobs.sweep(now + 1000)  # the failed and the expired job go, with their files
        assert (await c.get(f"/v1/videos/{failed}")).status_code == 404
        assert (await c.get(f"/v1/videos/{expired}")).status_code == 404
        assert (await c.get(f"/v1/videos/{done}")).json()["status"] == "completed"
        assert not stray.exists()
        assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == [f"{done}.mp4"]


async def test_the_periodic_sweep_purges_a_failed_job(tmp_path):
    engine = FakeVideoEngine(fail=InvalidRequestError("bad embeddings"))
    async with Server(engine, tmp_path, purge_after_s=0, sweep_interval_s=0.05) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "fails"})).json()["id"]
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while (await c.get(f"/v1/videos/{vid}")).status_code != 404:  # failed, then purged by the loop
            assert loop.time() < end, "the periodic sweep never purged the failed job"
            await asyncio.sleep(0.02)


async def test_restart_purges_and_sweeps_stray_files_but_loses_nothing(tmp_path):
    engine = FakeVideoEngine()
    async with Server(engine, tmp_path, purge_after_s=1000) as c:
        done = (await c.post("/v1/videos", data={"prompt": "done"})).json()["id"]
        await wait_status(c, done)
        engine.gate = asyncio.Event()  # the next job never gets past its first step
        running = (await c.post("/v1/videos", data={"prompt": "running"})).json()["id"]
        queued = [(await c.post("/v1/videos", data={"prompt": f"q{i}"})).json()["id"] for i in range(5)]
        await asyncio.sleep(0.1)
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    db.execute("INSERT INTO jobs (id, model, status, created_at, completed_at, size, seconds, prompt, request, error) "
               "VALUES ('video_old', 'wan_t2v', 'failed', 1, 1, '32x32', '1', 'p', ?, '{}')",
               (_request().to_json(),))
    db.commit()
    db.close()
    (tmp_path / "videos" / "video_old.mp4").write_bytes(b"orphan")  # a failed job's leftover
    (tmp_path / "videos" / "video_gone.mp4").write_bytes(b"orphan")  # no row at all
    (tmp_path / "videos" / f".{running}.mp4.xyz.tmp").write_bytes(b"half-written")
    engine2 = FakeVideoEngine()
    async with Server(engine2, tmp_path, purge_after_s=1000) as c:
        assert (await c.get("/v1/videos/video_old")).status_code == 404  # purged at start
        for vid in [done, running, *queued]:
            assert (await c.get(f"/v1/videos/{vid}")).status_code == 200, vid
        for vid in [running, *queued]:
            body, _ = await wait_status(c, vid)
            assert body["status"] == "completed", body
        names = sorted(p.name for p in (tmp_path / "videos").iterdir())
    assert names == sorted(f"{v}.mp4" for v in [done, running, *queued])


# --------------------------------------------------------------------------- limits
async def test_stored_job_limit_is_a_400_checked_before_the_write(tmp_path):
    server = Server(FakeVideoEngine(), tmp_path, max_stored_jobs=2)
    async with server as c:
        ids = [(await c.post("/v1/videos", data={"prompt": f"p{i}"})).json()["id"] for i in range(2)]
        for vid in ids:
            await wait_status(c, vid)
        r = await c.post("/v1/videos", data={"prompt": "one more"})
        assert_error(r, 400, code="quota_exceeded")
        assert "2 video jobs are stored" in r.json()["error"]["message"]
        assert len((await c.get("/v1/videos")).json()["data"]) == 2
        assert (await c.delete(f"/v1/videos/{ids[0]}")).status_code == 200
        assert (await c.post("/v1/videos", data={"prompt": "room again"})).status_code == 200


async def test_stored_bytes_limit_counts_the_mp4s(tmp_path):
    server = Server(FakeVideoEngine(), tmp_path, max_stored_bytes=20_000)
    async with server as c:
        first = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        await wait_status(c, first)
        mp4 = (tmp_path / "videos" / f"{first}.mp4").stat().st_size
        assert mp4 > 0
        n = 1
        while True:  # each job adds its request (~400 B) and its MP4
            r = await c.post("/v1/videos", data={"prompt": "a cat"})
            if r.status_code != 200:
                break
            n += 1
            await wait_status(c, r.json()["id"])
            assert n < 100
        assert_error(r, 400, code="quota_exceeded")
        stored = sum(p.stat().st_size for p in (tmp_path / "videos").iterdir())
        assert stored <= 20_000 + mp4  # one MP4 may pass the limit, no more


def test_reference_image_limit_and_concurrent_creates(tmp_path):
    from openai_frontend.video_jobs import JobSettings, VideoJobs

    jobs = VideoJobs(None, JobSettings(storage_dir=tmp_path, max_reference_bytes=1000, max_queued=100,
                                       max_stored_jobs=3))
    big = base64.b64encode(b"x" * 1001).decode()
    with pytest.raises(JobQuotaError) as info:
        jobs.create(_request(reference=big))
    assert info.value.limit == "max_reference_bytes"
    assert jobs.create(_request(reference=base64.b64encode(b"x" * 1000).decode())) is not None
    # the count is checked in the insert's transaction: threads cannot pass it together
    import threading

    out = []

    def create():
        try:
            out.append(jobs.create(_request()).id)
        except JobQuotaError as exc:
            out.append(exc.limit)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out.count("max_stored_jobs") == 4 and jobs.store.count("queued") == 3
    asyncio.run(jobs.stop())


def test_an_old_store_is_migrated_and_its_rows_counted(tmp_path):
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    db.executescript("""
        CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, model TEXT NOT NULL,
            status TEXT NOT NULL, progress INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,
            started_at INTEGER, completed_at INTEGER, expires_at INTEGER, size TEXT NOT NULL, seconds TEXT NOT NULL,
            prompt TEXT NOT NULL, request TEXT NOT NULL, error TEXT, attempts INTEGER NOT NULL DEFAULT 0, file TEXT);
    """)
    text = _request().to_json()
    db.execute("INSERT INTO jobs (id, model, status, created_at, size, seconds, prompt, request) "
               "VALUES ('video_a', 'wan_t2v', 'queued', 1, '32x32', '1', 'p', ?)", (text,))
    db.commit()
    db.close()
    store = SqliteJobStore(tmp_path / "jobs.sqlite3")
    assert store.get("video_a").request == _request()
    with pytest.raises(JobQuotaError):  # the old row's request is counted
        store.insert(_request(), max_bytes=2 * len(text) - 1)
    assert store.insert(_request(), max_bytes=2 * len(text)) is not None
    store.close()


async def test_a_stored_reference_image_over_the_limit_is_a_400(tmp_path):
    from test_videos_i2v_frontend import FakeVideoEngines, png, ref

    async with Server(FakeVideoEngines(), tmp_path, max_reference_bytes=500) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", "size": "32x32"}, files=ref(png(32, 32)))
        assert_error(r, 400, param="input_reference", code="input_reference_too_large")
        assert (await c.get("/v1/videos")).json()["data"] == []
        flat = await c.post("/v1/videos", data={"prompt": "a cat", "size": "32x32"}, files=ref(png(32, 32, flat=True)))
        assert flat.status_code == 200, flat.text


async def test_polls_and_lists_do_not_read_the_stored_request(tmp_path):
    """The stored request holds the reference image (up to max_reference_bytes as base64): a poll
    or a list page must not load and parse it on the event loop. A request column that is not
    JSON at all shows that they do not touch it."""
    server = Server(FakeVideoEngine(), tmp_path)
    async with server as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        await wait_status(c, vid)
        server.app.state.video_jobs.store._write("UPDATE jobs SET request = 'x' WHERE id = ?", (vid,))
        assert (await c.get(f"/v1/videos/{vid}")).json()["status"] == "completed"
        assert [v["id"] for v in (await c.get("/v1/videos")).json()["data"]] == [vid]
        assert (await c.get(f"/v1/videos/{vid}/content")).status_code == 200


def test_the_store_options_reach_the_settings_also_through_serve(monkeypatch, tmp_path):
    """``python -m openai_frontend`` options -> JobSettings / VoiceSettings, and the same options
    passed by ``omni-triton serve --frontend-arg=...``."""
    import openai_frontend.__main__ as frontend_main
    from omni_triton.cli import build_parser

    serve = build_parser().parse_args(["serve", "--frontend-arg=--video-purge-after-s=60",
                                       "--frontend-arg=--voice-max-consents=5"])
    argv = [*serve.frontend_arg, "--video-storage-dir", str(tmp_path / "v"), "--voice-storage-dir",
            str(tmp_path / "a"), "--video-max-stored-jobs", "7", "--video-max-stored-bytes", "1000",
            "--video-max-reference-bytes", "99", "--voice-max-voices", "3", "--voice-max-stored-bytes", "500",
            "--voice-max-prompt-chars", "50"]
    seen = {}

    class Built(Exception):
        pass

    def create_app(engine, settings):  # the settings main built; stop before any server starts
        seen["s"] = settings
        raise Built

    monkeypatch.setattr(frontend_main, "create_app", create_app)
    with pytest.raises(Built):
        frontend_main.main(argv)
    video, voices = seen["s"].video, seen["s"].voices
    assert (video.purge_after_s, video.max_stored_jobs, video.max_stored_bytes, video.max_reference_bytes) == (
        60, 7, 1000, 99)
    assert (voices.max_consents, voices.max_voices, voices.max_stored_bytes, voices.max_prompt_chars) == (5, 3, 500, 50)
    with pytest.raises(Built):
        frontend_main.main(["--video-purge-after-s", "0", "--video-storage-dir", str(tmp_path / "v")])
    assert seen["s"].video.purge_after_s is None  # <= 0: failed and expired jobs are kept


async def test_a_claim_overtaken_by_shutdown_is_handed_back(tmp_path):
    """The dispatcher claims a job in a worker thread; a shutdown landing between the claim and
    the job's start puts it back in the queue without counting an attempt."""
    import threading

    from openai_frontend.video_jobs import JobSettings, VideoJobs

    jobs = VideoJobs(FakeVideoEngine(), JobSettings(storage_dir=tmp_path, sweep_interval_s=3600))
    await jobs.start()
    claimed, release = threading.Event(), threading.Event()
    original = jobs.store.next_queued

    def slow_claim():
        rec = original()
        if rec is not None:
            claimed.set()
            release.wait(10)  # the claim is committed; its answer is late
        return rec

    jobs.store.next_queued = slow_claim
    rec = await asyncio.to_thread(jobs.create, _request())
    assert await asyncio.to_thread(claimed.wait, 10)
    stopping = asyncio.create_task(jobs.stop())
    await asyncio.sleep(0.05)
    release.set()
    await stopping
    store = SqliteJobStore(tmp_path / "jobs.sqlite3")
    again = store.get(rec.id)
    assert (again.status, again.attempts) == ("queued", 0)
    store.close()


async def test_a_step_that_ends_as_its_job_is_cancelled_is_not_left_unretrieved():
    """``_next_event``: when the job is cancelled (a delete, a shutdown) in the same loop turn as
    its stream ends, the finished step's StopAsyncIteration is retrieved; it was reported
    "Task exception was never retrieved" at garbage collection (an error at the teardown of
    test_frontend_bad_input's video tests under load)."""
    import gc

    from openai_frontend.video_jobs import _next_event

    async def ended():
        return
        yield

    loop = asyncio.get_running_loop()
    reported = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        task = asyncio.ensure_future(_next_event(ended(), None))
        await asyncio.sleep(0)  # the task starts its step and waits for it
        await asyncio.sleep(0)  # the step ends (StopAsyncIteration); the task is not resumed yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c.get("exception") for c in reported] == []
