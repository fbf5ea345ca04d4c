"""The PostgreSQL backends of the video-job and voice stores (issue 25, "stateless frontends"),
against a REAL PostgreSQL server started by the session fixture (tests/helpers/postgres_db.py;
skipped with the reason when no PostgreSQL binaries are installed).

Two "frontends" are two store objects, each on its own connection pool (``Database``) with its
own ``--frontend-id``: they claim disjoint jobs under concurrency (``FOR UPDATE SKIP LOCKED``),
the quotas hold under concurrent inserts from both (advisory lock in the insert transaction), a
job whose lease expired is taken over (resumed; failed with the reason at ``max_attempts``;
completed when its MP4 is there), the old owner's renewal and writes are refused after a
takeover, a start leaves the other frontends' running jobs alone, migrations are idempotent and
safe when two run at once, and voices/consents round-trip and persist across a re-open.
"""
from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from openai_frontend.db import (
    ENV,
    MIGRATIONS,
    Database,
    DatabaseError,
    Migration,
    check_migrations,
    database_url,
    migrate,
    redact,
)
from openai_frontend.engine import VideoJob
from openai_frontend.video_jobs import (
    FAILED,
    IN_PROGRESS,
    QUEUED,
    JobQuotaError,
    JobSettings,
    PostgresJobStore,
    VideoJobs,
    VideoRequest,
)
from openai_frontend.voice_store import (
    DuplicateVoiceName,
    PostgresVoiceMeta,
    QuotaExceededError,
    VoiceSettings,
    VoiceStore,
)
from tests.helpers.postgres_db import pg_url, postgres_server  # noqa: F401  (fixtures)


def _request(prompt: str = "a cat") -> VideoRequest:
    job = VideoJob(prompt=prompt, width=32, height=32, num_frames=5, steps=2, seed=1)
    return VideoRequest(model="wan_t2v", job=job, fps=8, keep_frames=5)


@pytest.fixture
def databases(pg_url):  # noqa: F811
    """Two pools on one database: the connections of two frontends."""
    opened = [Database(pg_url), Database(pg_url)]
    yield opened
    for db in opened:
        db.close()


def _row(pg_url, sql, args=()):  # noqa: F811
    with psycopg.connect(pg_url) as conn:
        return conn.execute(sql, args).fetchone()


def _run_together(n: int, fn) -> list:
    """``fn(i)`` in ``n`` threads released at once; their results (or exceptions) in order."""
    barrier = threading.Barrier(n)
    out: list = [None] * n

    def worker(i):
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


# --------------------------------------------------------------------------- URL and flags
def test_database_url_env_scheme_and_redaction(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert database_url(None) is None and database_url("") is None  # SQLite files: the default
    monkeypatch.setenv(ENV, "postgresql://u:secret@db:5432/omni")
    assert database_url(None) == "postgresql://u:secret@db:5432/omni"
    assert database_url("postgres:///x?host=/tmp/s") == "postgres:///x?host=/tmp/s"  # the flag wins
    with pytest.raises(DatabaseError, match="not a PostgreSQL URL") as info:
        database_url("mysql://u:secret@db/omni")
    assert "secret" not in str(info.value)
    assert redact("postgresql://u:secret@db:5432/omni") == "postgresql://u:***@db:5432/omni"


def test_database_url_needs_a_media_url_and_a_lease_of_at_least_zero(monkeypatch, tmp_path):
    import openai_frontend.__main__ as frontend_main

    monkeypatch.delenv(ENV, raising=False)
    args = frontend_main.parse_args(["--database-url", "postgresql://h/db"])
    with pytest.raises(SystemExit, match="--database-url needs --media-url"):
        frontend_main.shared_database_url(args)
    args.media_url = "file:///shared/media"  # helper media's flag; the combination is accepted
    assert frontend_main.shared_database_url(args) == "postgresql://h/db"
    args.video_lease_s = -1
    with pytest.raises(SystemExit, match="--video-lease-s"):
        frontend_main.shared_database_url(args)
    plain = frontend_main.parse_args([])
    assert frontend_main.shared_database_url(plain) is None  # no URL: SQLite, no media URL needed
    assert (plain.video_lease_s, plain.frontend_id) == (30.0, None)


def test_the_lease_and_id_options_reach_the_settings(monkeypatch, tmp_path):
    import openai_frontend.__main__ as frontend_main

    monkeypatch.delenv(ENV, raising=False)
    seen = {}

    class Built(Exception):
        pass

    def create_app(engine, settings):
        seen["s"] = settings
        raise Built

    monkeypatch.setattr(frontend_main, "create_app", create_app)
    with pytest.raises(Built):
        frontend_main.main(["--video-storage-dir", str(tmp_path), "--video-lease-s", "5", "--frontend-id", "web-1"])
    s = seen["s"]
    assert (s.video.lease_s, s.video.renew_interval_s, s.frontend_id, s.database_url) == (5.0, 5 / 3, "web-1", None)


def test_an_unreachable_database_is_a_clear_start_error():
    with pytest.raises(DatabaseError, match=r"postgresql://u:\*\*\*@127.0.0.1:1/x cannot be used"):
        Database("postgresql://u:pw@127.0.0.1:1/x", connect_timeout_s=2)


# --------------------------------------------------------------------------- migrations
def test_migrations_are_recorded_and_idempotent(pg_url):  # noqa: F811
    first = Database(pg_url)
    first.close()
    again = Database(pg_url)  # a restart: nothing to apply
    with again.connection() as conn:
        conn.autocommit = True
        try:
            assert migrate(conn) == []
        finally:
            conn.autocommit = False
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    again.close()
    assert versions == [m.version for m in MIGRATIONS] == [1, 2]
    with pytest.raises(ValueError):
        check_migrations([Migration(2, "b", ""), Migration(1, "a", "")])


def test_two_frontends_migrating_at_once_apply_each_version_once(pg_url):  # noqa: F811
    """Both read schema_migrations before either commits, unless the advisory lock serialises
    them: without it the second fails ("relation already exists") or records a version twice."""
    slow = (Migration(1, "slow", "SELECT pg_sleep(0.5); CREATE TABLE slow_a (x int)"),
            Migration(2, "next", "CREATE TABLE slow_b (x int)"))

    def run(_):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return migrate(conn, slow)

    results = _run_together(2, run)
    assert sorted(map(str, results)) == ["[1, 2]", "[]"], results
    assert _row(pg_url, "SELECT COUNT(*) FROM schema_migrations")[0] == 2


# --------------------------------------------------------------------------- claims
def test_two_frontends_claim_disjoint_jobs_under_concurrency(databases, pg_url):  # noqa: F811
    a, b = PostgresJobStore(databases[0], "frontend-a"), PostgresJobStore(databases[1], "frontend-b")
    ids = {a.insert(_request(f"p{i}")).id for i in range(40)}

    def claim_all(i):
        store = (a, b)[i % 2]
        got = []
        while (rec := store.next_queued()) is not None:
            got.append((store.owner, rec.id, rec.attempts, rec.request is not None))
        return got

    claims = [c for got in _run_together(8, claim_all) for c in got]
    claimed = [job_id for _, job_id, _, _ in claims]
    assert sorted(claimed) == sorted(ids), "a job claimed twice or never"
    assert {(attempts, has_request) for _, _, attempts, has_request in claims} == {(1, True)}
    with psycopg.connect(pg_url) as conn:
        owners = dict(conn.execute("SELECT id, owner FROM video_jobs WHERE status = %s", (IN_PROGRESS,)).fetchall())
    assert owners == {job_id: owner for owner, job_id, _, _ in claims}
    assert {owner for owner, _, _, _ in claims} == {"frontend-a", "frontend-b"}  # both took part


def test_a_claim_skips_a_job_another_frontend_is_claiming_instead_of_waiting(databases, pg_url):  # noqa: F811
    store = PostgresJobStore(databases[0], "frontend-a")
    first, second = store.insert(_request("first")), store.insert(_request("second"))
    with psycopg.connect(pg_url) as other:  # frontend B in the middle of its claim of the oldest job
        other.execute("SELECT id FROM video_jobs WHERE id = %s FOR UPDATE", (first.id,))
        out: list = []
        t = threading.Thread(target=lambda: out.append(store.next_queued()))
        t.start()
        t.join(5)
        waited = t.is_alive()
        other.rollback()
        t.join(10)
    assert not waited, "the claim waited for the other frontend's lock"
    assert out[0].id == second.id


def test_quotas_hold_under_concurrent_inserts_from_two_frontends(databases):
    a, b = PostgresJobStore(databases[0], "frontend-a"), PostgresJobStore(databases[1], "frontend-b")

    def insert(i):
        return (a, b)[i % 2].insert(_request(), max_queued=100, max_jobs=5)

    results = _run_together(12, insert)
    assert sum(isinstance(r, JobQuotaError) and r.limit == "max_stored_jobs" for r in results) == 7, results
    assert a.count(QUEUED) == 5
    for rec in a.list(limit=100)[0]:
        a.delete(rec.id)
    results = _run_together(12, lambda i: (a, b)[i % 2].insert(_request(), max_queued=3))
    assert sum(r is None for r in results) == 9 and b.count(QUEUED) == 3, results
    size = len(_request().to_json())
    for rec in a.list(limit=100)[0]:
        a.delete(rec.id)
    results = _run_together(12, lambda i: (a, b)[i % 2].insert(_request(), max_bytes=4 * size))
    assert sum(isinstance(r, JobQuotaError) and r.limit == "max_stored_bytes" for r in results) == 8, results


def test_pages_expiry_and_purge_on_the_shared_store(databases, tmp_path):
    """What the API and the retention sweep ask of any frontend: pages in creation order, the
    completed job past its retention expired, failed and expired jobs purged once (ids returned
    to one frontend only)."""
    a, b = PostgresJobStore(databases[0], "frontend-a"), PostgresJobStore(databases[1], "frontend-b")
    ids = [a.insert(_request(f"p{i}")).id for i in range(5)]
    page, more = b.list(limit=2, order="asc")
    assert [r.id for r in page] == ids[:2] and more
    page, more = b.list(limit=5, after=ids[1], order="asc")
    assert [r.id for r in page] == ids[2:] and not more
    assert [r.id for r in b.list(limit=2, after=ids[2])[0]] == ids[1::-1]
    with pytest.raises(KeyError):
        b.list(after="video_" + "f" * 24)
    now = int(time.time())
    done, failed = a.next_queued(), a.next_queued()
    assert a.complete(done.id, f"videos/{done.id}.mp4", now - 1, file_bytes=1000)
    a.fail(failed.id, "generation_failed", "boom", now=now - 100)
    jobs_b = VideoJobs(None, _settings(tmp_path, purge_after_s=50), store=b)
    assert jobs_b.sweep(now) == 1  # the completed job's retention passed: expired (and the failed one purged)
    assert b.get(done.id).status == "expired" and b.get(failed.id) is None
    assert b.statuses() == {done.id: "expired", **{i: QUEUED for i in ids[2:]}}
    # expired at now - 1 (its expires_at): purged from now + 49 on, by one frontend only
    assert a.purge(now + 48, 50) == [] and b.purge(now + 49, 50) == [done.id] and a.purge(now + 49, 50) == []


# --------------------------------------------------------------------------- leases
def _settings(tmp_path, **kw) -> JobSettings:
    return JobSettings(storage_dir=tmp_path, sweep_interval_s=3600, **kw)


def test_an_expired_lease_is_taken_over_resumed_then_failed_with_the_reason(databases, pg_url, tmp_path):  # noqa: F811
    a = PostgresJobStore(databases[0], "frontend-a", lease_s=1.0)
    b = PostgresJobStore(databases[1], "frontend-b")
    jobs_b = VideoJobs(None, _settings(tmp_path, max_attempts=2), store=b)
    rec = a.insert(_request())
    assert a.next_queued().id == rec.id
    assert sum(jobs_b.take_over().values()) == 0  # A's lease still runs: left alone
    time.sleep(1.2)  # frontend A died: no renewal
    assert jobs_b.take_over() == {"completed": 0, "requeued": 1, "failed": 0}
    again = b.get(rec.id)
    assert (again.status, again.attempts) == (QUEUED, 1)
    assert a.next_queued().attempts == 2  # resumed (by any frontend): attempts + 1
    time.sleep(1.2)  # and A dies again, at max_attempts
    assert jobs_b.take_over()["failed"] == 1
    failed = b.get(rec.id)
    assert failed.status == FAILED and failed.error["code"] == "interrupted", failed.error
    assert "frontend frontend-a" in failed.error["message"] and "2 times" in failed.error["message"]
    jobs_b.store.close()


def test_an_expired_job_whose_mp4_is_written_is_completed(databases, tmp_path):
    a = PostgresJobStore(databases[0], "frontend-a", lease_s=0.3)
    b = PostgresJobStore(databases[1], "frontend-b")
    jobs_b = VideoJobs(None, _settings(tmp_path), store=b)
    rec = a.insert(_request())
    a.next_queued()
    jobs_b.media.put(jobs_b.video_key(rec.id), b"mp4 bytes")  # A died between the write and the commit
    time.sleep(0.5)
    assert jobs_b.take_over()["completed"] == 1
    done = b.get(rec.id)
    assert (done.status, done.progress, done.file) == ("completed", 100, jobs_b.video_key(rec.id))


def test_the_old_owner_can_neither_renew_nor_write_after_a_takeover(databases):
    a = PostgresJobStore(databases[0], "frontend-a", lease_s=0.3)
    b = PostgresJobStore(databases[1], "frontend-b")
    rec = a.insert(_request())
    a.next_queued()
    assert a.renew([rec.id]) == {rec.id}  # renewed while it is A's
    time.sleep(0.5)
    taken = b.take_over_expired()
    assert [(r.id, owner) for r, owner in taken] == [(rec.id, "frontend-a")]
    assert a.renew([rec.id]) == set()  # A (back from a pause) learns the job is no longer its own
    a.progress(rec.id, 50)
    assert a.complete(rec.id, "/x.mp4", None) is False
    a.fail(rec.id, "generation_failed", "late")
    a.requeue(rec.id)
    now = b.get(rec.id)
    assert (now.status, now.progress, now.error) == (IN_PROGRESS, 0, None)
    assert b.renew([rec.id]) == {rec.id}


def test_a_lease_of_zero_never_expires(databases):
    """``--video-lease-s 0`` (the e2e test's switch that disables takeover): the lease is
    ``infinity``; the job is never taken over."""
    a = PostgresJobStore(databases[0], "frontend-a", lease_s=0)
    b = PostgresJobStore(databases[1], "frontend-b")
    rec = a.insert(_request())
    a.next_queued()
    time.sleep(0.2)
    assert b.take_over_expired() == []
    assert a.renew([rec.id]) == {rec.id}


def test_a_start_leaves_other_frontends_running_jobs_alone(databases, tmp_path):
    a = PostgresJobStore(databases[0], "frontend-a")  # alive, lease 30 s
    old_b = PostgresJobStore(databases[0], "frontend-b")  # the previous process of frontend-b's id
    theirs, mine = a.insert(_request("a's")), a.insert(_request("b's"))
    assert a.next_queued().id == theirs.id and old_b.next_queued().id == mine.id
    jobs_b = VideoJobs(None, _settings(tmp_path), store=PostgresJobStore(databases[1], "frontend-b"))
    assert jobs_b.recover() == {"completed": 0, "requeued": 1, "failed": 0}
    assert (a.get(theirs.id).status, a.get(mine.id).status) == (IN_PROGRESS, QUEUED)
    assert jobs_b._folder_lock is None  # a shared store takes no folder lock


# --------------------------------------------------------------------------- the runner
@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _until(predicate, timeout=10.0, what="condition"):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.anyio
async def test_a_job_deleted_on_another_frontend_stops_its_run_here(databases, tmp_path):
    from test_videos_frontend import FakeVideoEngine

    engine = FakeVideoEngine()
    engine.gate = asyncio.Event()  # never finishes on its own
    a = PostgresJobStore(databases[0], "frontend-a", lease_s=0.3)
    jobs_a = VideoJobs(engine, _settings(tmp_path, poll_interval_s=0.05, lease_s=0.3), store=a)
    await jobs_a.start()
    try:
        rec = await asyncio.to_thread(jobs_a.create, _request())
        await _until(lambda: rec.id in jobs_a._running and engine.jobs, what="the run")
        b = PostgresJobStore(databases[1], "frontend-b")
        assert await asyncio.to_thread(b.delete, rec.id)  # DELETE /v1/videos/{id} on frontend B
        await _until(lambda: rec.id not in jobs_a._running, timeout=5, what="the run's cancellation")
        assert engine.cancelled == 1
    finally:
        await jobs_a.stop()


@pytest.mark.anyio
async def test_a_stopped_frontend_hands_its_running_jobs_back_at_once(databases, tmp_path):
    from test_videos_frontend import FakeVideoEngine

    engine = FakeVideoEngine()
    engine.gate = asyncio.Event()
    store = PostgresJobStore(databases[0], "frontend-a")
    jobs = VideoJobs(engine, _settings(tmp_path, poll_interval_s=0.05), store=store)
    await jobs.start()
    rec = await asyncio.to_thread(jobs.create, _request())
    await _until(lambda: rec.id in jobs._running and engine.jobs, what="the run")
    await jobs.stop()  # a rolling update: the job is queued again for any frontend, lease cleared
    other = PostgresJobStore(databases[1], "frontend-b")
    back = other.get(rec.id)
    assert (back.status, back.attempts) == (QUEUED, 1)
    assert other.next_queued().id == rec.id


@pytest.mark.anyio
async def test_two_frontends_share_the_queue_and_a_dead_ones_job_is_finished(databases, tmp_path):
    """Frontend A holds one job forever (its engine stalls) and B runs the rest, created on A;
    then A dies (no hand-back): once its lease expires, B takes the job over and finishes it."""
    from test_videos_frontend import FakeVideoEngine

    stalled, working = FakeVideoEngine(), FakeVideoEngine()
    stalled.gate = asyncio.Event()
    fast = {"poll_interval_s": 0.05, "lease_s": 2.0}  # renewed every 0.67 s: room for a loaded machine
    jobs_a = VideoJobs(stalled, _settings(tmp_path, max_running=1, **fast),
                       store=PostgresJobStore(databases[0], "frontend-a", lease_s=2.0))
    jobs_b = VideoJobs(working, _settings(tmp_path, **fast),
                       store=PostgresJobStore(databases[1], "frontend-b", lease_s=2.0))
    await jobs_a.start()
    first = await asyncio.to_thread(jobs_a.create, _request("held by A"))
    await _until(lambda: first.id in jobs_a._running, what="A's claim")
    others = [await asyncio.to_thread(jobs_a.create, _request(f"job {i}")) for i in range(3)]
    await jobs_b.start()
    try:
        await _until(lambda: all(jobs_b.store.get(r.id).status == "completed" for r in others),
                     what="B running the jobs created on A")
        assert jobs_b.store.get(first.id).status == IN_PROGRESS  # A renews its lease: B leaves it alone
        await asyncio.sleep(2.5)  # past one lease: renewed, not taken over
        assert jobs_b.store.get(first.id).status == IN_PROGRESS
        for t in jobs_a._tasks + [r.task for r in jobs_a._running.values()]:  # kill -9 of A: nothing handed back
            t.cancel()
        await asyncio.gather(*jobs_a._tasks, return_exceptions=True)
        await _until(lambda: jobs_b.store.get(first.id).status == "completed", timeout=10,
                     what="B taking over A's job")
        done = jobs_b.store.get(first.id)
        assert done.attempts == 2 and done.error is None
    finally:
        await jobs_b.stop()


# --------------------------------------------------------------------------- voices
def _voices(db, tmp_path, **kw) -> VoiceStore:
    return VoiceStore(VoiceSettings(storage_dir=tmp_path, **kw), PostgresVoiceMeta(db))


def test_voices_and_consents_round_trip_and_persist_across_a_reopen(pg_url, tmp_path):  # noqa: F811
    import numpy as np

    db = Database(pg_url)
    store = _voices(db, tmp_path)
    assert store.shared and store._folder_lock is None
    consent = store.add_consent("me", "en", b"RIFF recording", "wav")
    clip = np.sin(np.linspace(0, 100, 24000)).astype(np.float32)
    cloned = store.add_clip("mine", clip, 24000, b"\x01prompt", "hello", consent.id)
    designed = store.add_design("calm", "a calm low voice")
    other = _voices(Database(pg_url), tmp_path)  # a second frontend: the name is taken there too
    with pytest.raises(DuplicateVoiceName):
        other.add_design("calm", "another")
    other.meta.db.close()
    store.close()
    db.close()

    db = Database(pg_url)  # a restart of every frontend
    store = _voices(db, tmp_path)
    assert [(v.id, v.name, v.type, v.error) for v in store.list_voices()] == [
        (cloned.id, "mine", "audio_sample", None), (designed.id, "calm", "prompt", None)]
    assert store.get("mine") == cloned and store.get(designed.id) == designed
    assert store.voice_prompt(cloned) == b"\x01prompt"
    assert store.name_taken("calm") and store.count() == 2
    assert store.get_consent(consent.id) == consent
    assert store.list_consents() == ([consent], False)
    assert store.rename_consent(consent.id, "renamed").name == "renamed"
    assert store.delete_consent(consent.id) and not store.delete_consent(consent.id)
    assert store.delete("calm") == designed and store.get("calm") is None
    assert store.meta.usage()[:2] == (1, 0)
    store.close()
    db.close()


def test_voice_quotas_hold_under_concurrent_inserts_from_two_frontends(databases, tmp_path):
    stores = [_voices(db, tmp_path, max_voices=3) for db in databases]
    results = _run_together(10, lambda i: stores[i % 2].add_design(f"voice {i}", "a voice"))
    assert sum(isinstance(r, QuotaExceededError) and r.limit == "max_voices" for r in results) == 7, results
    assert stores[0].count() == 3
    consents = [_voices(db, tmp_path / "c", max_consents=2) for db in databases]
    results = _run_together(6, lambda i: consents[i % 2].add_consent("c", "en", b"x" * 10, "wav"))
    assert sum(isinstance(r, QuotaExceededError) for r in results) == 4 and len(consents[0].list_consents()[0]) == 2


# --------------------------------------------------------------------------- the app
@pytest.mark.anyio
async def test_two_apps_on_one_database_see_one_set_of_jobs_and_voices(pg_url, tmp_path):  # noqa: F811
    import httpx
    from test_videos_frontend import FakeVideoEngine, wait_status

    from openai_frontend.app import Settings, create_app

    def app(name):
        return create_app(FakeVideoEngine(), Settings(
            database_url=pg_url, frontend_id=name,
            video=JobSettings(storage_dir=tmp_path / "media", sweep_interval_s=3600, poll_interval_s=0.05),
            voices=VoiceSettings(storage_dir=tmp_path / "media")))  # one shared folder: no folder lock

    apps = [app("frontend-a"), app("frontend-b")]
    lives = [a.router.lifespan_context(a) for a in apps]
    for life in lives:
        await life.__aenter__()
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://test") for a in apps]
    try:
        a, b = clients
        r = await a.post("/v1/audio/voices", data={"name": "calm", "type": "prompt", "prompt": "a calm voice"})
        assert r.status_code == 200, r.text
        listed = (await b.get("/v1/audio/voices")).json()
        assert [v["name"] for v in listed["uploaded_voices"]] == ["calm"]
        dup = await b.post("/v1/audio/voices", data={"name": "calm", "type": "prompt", "prompt": "x"})
        assert (dup.status_code, dup.json()["error"]["code"]) == (409, "duplicate_name"), dup.text
        vid = (await a.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        body, _ = await wait_status(b, vid)
        assert body["status"] == "completed"
        assert (await b.get(f"/v1/videos/{vid}/content")).status_code == 200
        assert apps[0].state.frontend_id == "frontend-a"
    finally:
        for c in clients:
            await c.aclose()
        for life in lives:
            await life.__aexit__(None, None, None)


@pytest.mark.anyio
async def test_a_database_that_stops_answering_is_a_503_not_a_500(pg_url, tmp_path, monkeypatch):  # noqa: F811
    import httpx
    from test_videos_frontend import FakeVideoEngine

    from openai_frontend.app import Settings, create_app

    app = create_app(FakeVideoEngine(), Settings(
        database_url=pg_url, video=JobSettings(storage_dir=tmp_path, sweep_interval_s=3600),
        voices=VoiceSettings(storage_dir=tmp_path)))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        def down(*args, **kwargs):
            raise psycopg.OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

        monkeypatch.setattr(PostgresJobStore, "get", down)
        monkeypatch.setattr(PostgresVoiceMeta, "name_taken", down)
        r = await c.get("/v1/videos/video_" + "0" * 24)
        assert (r.status_code, r.json()["error"]["code"], r.headers["retry-after"]) == (503, "store_unavailable", "1")
        r = await c.post("/v1/audio/voices", data={"name": "calm", "type": "prompt", "prompt": "a calm voice"})
        assert (r.status_code, r.json()["error"]["code"]) == (503, "store_unavailable"), r.text
