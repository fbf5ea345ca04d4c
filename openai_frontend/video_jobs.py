"""Durable video jobs: the SQLite job store and the runner that drives jobs through the engine.

Why durable: a video job runs for minutes on real hardware, and a job that silently disappears
(frontend restart, crash) is what users fear most. Every state change is committed to one SQLite
file (WAL, ``synchronous=FULL``) before it is reported, and every MP4 is written atomically (temp
file + fsync + rename, ``omni_triton.media.video.write_atomic``) *before* its job is marked
completed, so:

- a job ``queued`` when the frontend stops is still queued after the restart;
- a job ``in_progress`` when the frontend stops is, at the next start, ``completed`` if its MP4
  is on disk (the crash fell between the rename and the commit), else queued again (resumed
  from its first step: same inputs, same seed, so the same video) unless it was already started
  ``max_attempts`` times, then ``failed`` with the reason; never left in progress, never gone;
- ``progress`` only rises (``MAX`` in SQL), also across a resume.

Statuses: ``queued`` -> ``in_progress`` -> ``completed`` | ``failed``; ``completed`` ->
``expired`` when its MP4 is older than the retention (the file is removed, the job stays and says
so). ``DELETE`` removes the row and the files and cancels a running job's Triton stream, which
stops the denoiser at its next step boundary.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from omni_triton.media.video import encode_mp4, write_atomic

from .engine import EngineError, InvalidRequestError, VideoJob

#: A job id, exactly as ``VideoStore.insert`` makes them: ``video_`` + 24 lowercase hex digits.
JOB_ID = re.compile(r"video_[0-9a-f]{24}")


def is_job_id(text: object) -> bool:
    """True when ``text`` has the exact form of a job id (:data:`JOB_ID`). Client ids are
    checked with this before any database or file-system use (a path, never a glob pattern)."""
    return isinstance(text, str) and JOB_ID.fullmatch(text) is not None

logger = logging.getLogger(__name__)

QUEUED, IN_PROGRESS, COMPLETED, FAILED, EXPIRED = "queued", "in_progress", "completed", "failed", "expired"
ACTIVE = (QUEUED, IN_PROGRESS)
#: progress reported while denoising (steps map onto 0..DENOISE_PROGRESS); the decode and the
#: MP4 take the rest, 100 only once the MP4 is on disk.
DENOISE_PROGRESS = 95

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    progress INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    completed_at INTEGER,
    expires_at INTEGER,
    size TEXT NOT NULL,
    seconds TEXT NOT NULL,
    prompt TEXT NOT NULL,
    request TEXT NOT NULL,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    file TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, seq);
"""


#: how Triton 2.51 / the engine say a model's stub process died (``Stub process
#: 'wan_t2v_denoiser_0_0' is not healthy.``; ``model 'wan_t2v_denoiser_0_0'``; the engine's own
#: ``StageRestartedError`` text ``its stage wan_t2v_denoiser died``)
_DEAD_STAGE = (re.compile(r"its stage ([A-Za-z0-9_.-]+) died"),
               re.compile(r"Stub process '([A-Za-z0-9_.-]+?)(?:_\d+)*' is not healthy"),
               re.compile(r"model '([A-Za-z0-9_.-]+?)(?:_\d+)*'.*is not healthy"))


def dead_stage(message: str) -> str | None:
    """The Triton model whose stub died, read from an engine error ``message``; None when the
    message is not about a dead stage. The instance suffix (``_0_0``) is dropped."""
    for pattern in _DEAD_STAGE:
        found = pattern.search(message)
        if found:
            return found.group(1)
    return None


@dataclass(frozen=True)
class VideoRequest:
    """Everything needed to (re)run a job: the model, the engine job, the fps and how many of
    the generated frames go into the MP4 (``keep_frames``: ``seconds * fps`` when the client asked
    for seconds, else every frame)."""

    model: str
    job: VideoJob
    fps: int
    keep_frames: int

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "job": asdict(self.job), "fps": self.fps,
                           "keep_frames": self.keep_frames})

    @classmethod
    def from_json(cls, text: str) -> "VideoRequest":
        data = json.loads(text)
        return cls(data["model"], VideoJob(**data["job"]), int(data["fps"]), int(data["keep_frames"]))

    @property
    def size(self) -> str:
        return f"{self.job.width}x{self.job.height}"

    @property
    def seconds(self) -> str:
        """Duration of the MP4 in seconds, as the OpenAI video object spells it (a string)."""
        return f"{self.keep_frames / self.fps:g}"


@dataclass
class JobRecord:
    """One row of the store (times are Unix seconds)."""

    id: str
    model: str
    status: str
    progress: int
    created_at: int
    size: str
    seconds: str
    prompt: str
    request: VideoRequest
    started_at: int | None = None
    completed_at: int | None = None
    expires_at: int | None = None
    error: dict | None = None
    attempts: int = 0
    file: str | None = None
    seq: int = 0

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``Video`` object (``client.videos.retrieve``)."""
        return {"id": self.id, "object": "video", "model": self.model, "status": self.status,
                "progress": self.progress, "created_at": self.created_at, "completed_at": self.completed_at,
                "expires_at": self.expires_at, "size": self.size, "seconds": self.seconds,
                "prompt": self.prompt, "error": self.error, "remixed_from_video_id": None}


class JobStore:
    """The job table in one SQLite file (``<storage>/jobs.sqlite3``), safe to call from any
    thread (one connection behind a lock; every call is one short transaction)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self, sql: str, args: tuple = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    @staticmethod
    def _record(row: sqlite3.Row) -> JobRecord:
        return JobRecord(id=row["id"], model=row["model"], status=row["status"], progress=row["progress"],
                         created_at=row["created_at"], size=row["size"], seconds=row["seconds"],
                         prompt=row["prompt"], request=VideoRequest.from_json(row["request"]),
                         started_at=row["started_at"], completed_at=row["completed_at"],
                         expires_at=row["expires_at"], error=json.loads(row["error"]) if row["error"] else None,
                         attempts=row["attempts"], file=row["file"], seq=row["seq"])

    def insert(self, request: VideoRequest, now: int | None = None, max_queued: int | None = None) -> JobRecord | None:
        """Add a queued job; ``None`` when ``max_queued`` jobs are already queued (checked in the
        same transaction)."""
        job_id = "video_" + secrets.token_hex(12)  # the form of JOB_ID
        now = int(time.time()) if now is None else now
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if max_queued is not None:
                    (queued,) = self._db.execute("SELECT COUNT(*) FROM jobs WHERE status = ?", (QUEUED,)).fetchone()
                    if queued >= max_queued:
                        self._db.execute("ROLLBACK")
                        return None
                self._db.execute(
                    "INSERT INTO jobs (id, model, status, created_at, size, seconds, prompt, request) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (job_id, request.model, QUEUED, now, request.size, request.seconds, request.job.prompt,
                     request.to_json()))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return self.get(job_id)

    def get(self, job_id: str) -> JobRecord | None:
        rows = self._query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return self._record(rows[0]) if rows else None

    def list(self, limit: int = 20, after: str | None = None, order: str = "desc") -> tuple[list[JobRecord], bool]:
        """Jobs in creation order (``asc``/``desc``), starting after the job ``after``; returns
        (up to ``limit`` records, whether more follow).

        Raises:
            KeyError: ``after`` is not a job id.
        """
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        where, args = "", ()
        if after:
            found = self._query("SELECT seq FROM jobs WHERE id = ?", (after,))
            if not found:
                raise KeyError(after)
            where, args = f"WHERE seq {op} ?", (found[0]["seq"],)
        rows = self._query(f"SELECT * FROM jobs {where} ORDER BY seq {direction} LIMIT ?", args + (limit + 1,))
        return [self._record(r) for r in rows[:limit]], len(rows) > limit

    def count(self, status: str) -> int:
        return self._query("SELECT COUNT(*) FROM jobs WHERE status = ?", (status,))[0][0]

    def next_queued(self) -> JobRecord | None:
        """Claim the oldest queued job: mark it in progress (attempts + 1) and return it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT id FROM jobs WHERE status = ? ORDER BY seq LIMIT 1", (QUEUED,)).fetchone()
                if row is None:
                    self._db.execute("COMMIT")
                    return None
                self._db.execute("UPDATE jobs SET status = ?, attempts = attempts + 1, started_at = ? WHERE id = ?",
                                 (IN_PROGRESS, int(time.time()), row["id"]))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return self.get(row["id"])

    def progress(self, job_id: str, progress: int) -> None:
        """Raise a running job's progress (never lowers it)."""
        self._write("UPDATE jobs SET progress = MAX(progress, ?) WHERE id = ? AND status = ?",
                   (int(progress), job_id, IN_PROGRESS))

    def complete(self, job_id: str, file: str, expires_at: int | None, now: int | None = None) -> None:
        now = int(time.time()) if now is None else now
        self._write("UPDATE jobs SET status = ?, progress = 100, completed_at = ?, expires_at = ?, file = ?, "
                   "error = NULL WHERE id = ?", (COMPLETED, now, expires_at, file, job_id))

    def fail(self, job_id: str, code: str, message: str, now: int | None = None) -> None:
        now = int(time.time()) if now is None else now
        self._write("UPDATE jobs SET status = ?, completed_at = ?, error = ? WHERE id = ?",
                   (FAILED, now, json.dumps({"code": code, "message": message}), job_id))

    def requeue(self, job_id: str) -> None:
        self._write("UPDATE jobs SET status = ? WHERE id = ? AND status = ?", (QUEUED, job_id, IN_PROGRESS))

    def expire(self, job_id: str, message: str) -> None:
        self._write("UPDATE jobs SET status = ?, file = NULL, error = ? WHERE id = ? AND status = ?",
                   (EXPIRED, json.dumps({"code": "video_expired", "message": message}), job_id, COMPLETED))

    def delete(self, job_id: str) -> bool:
        return self._write("DELETE FROM jobs WHERE id = ?", (job_id,)) > 0

    def with_status(self, *statuses: str) -> list[JobRecord]:
        marks = ",".join("?" * len(statuses))
        return [self._record(r) for r in
                self._query(f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY seq", statuses)]

    def expired_before(self, now: int) -> list[JobRecord]:
        rows = self._query("SELECT * FROM jobs WHERE status = ? AND expires_at IS NOT NULL AND expires_at <= ?",
                           (COMPLETED, now))
        return [self._record(r) for r in rows]


@dataclass
class JobSettings:
    """Knobs of the video jobs (``python -m openai_frontend --video-*``).

    storage_dir: the SQLite file and the MP4s (``videos/<id>.mp4``) live here.
    max_queued: queued jobs accepted; one more is a 429 with ``Retry-After``.
    max_running: jobs streamed to Triton at once (the denoiser batches them).
    retention_s: a completed MP4 older than this is removed and its job becomes ``expired``
        (``None``: kept forever).
    max_attempts: starts of one job (the first plus resumes after restarts or a stage restart)
        before it is failed with the reason.
    retry_after_s: ``Retry-After`` of the 429.
    stall_timeout_s: a running job whose stream brings no event (a finished denoising step, the
        frames) for this long is stopped (its gRPC call cancelled, so the denoiser stops at its
        next step) and failed with code ``stalled``: a stage that never answers (a wedged stub,
        a lost response) cannot leave a job ``in_progress`` forever (``None``: no limit).
    """

    storage_dir: Path
    max_queued: int = 16
    max_running: int = 4
    retention_s: float | None = 24 * 3600
    max_attempts: int = 3
    retry_after_s: int = 5
    sweep_interval_s: float = 30.0
    stall_timeout_s: float | None = 600.0


@dataclass
class _Running:
    task: asyncio.Task
    deleted: bool = False


class VideoJobs:
    """Runs the store's jobs through ``engine.generate_video``.

    ``start()`` recovers what a previous process left (see the module docstring) and starts the
    dispatcher and the retention sweep; ``stop()`` cancels the running tasks, whose jobs stay
    ``in_progress`` in the store and are resumed by the next ``start()``.
    """

    def __init__(self, engine, settings: JobSettings, on_event: Callable[[str, str], None] | None = None):
        self.engine = engine
        self.settings = settings
        self.dir = Path(settings.storage_dir)
        self.videos_dir = self.dir / "videos"
        self.inputs_dir = self.dir / "inputs"
        self.store = JobStore(self.dir / "jobs.sqlite3")
        self._running: dict[str, _Running] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._on_event = on_event or (lambda job_id, what: None)

    # ------------------------------------------------------------------ lifecycle
    def recover(self) -> dict[str, int]:
        """Settle the jobs a previous process left in progress; returns counts per outcome."""
        counts = {"completed": 0, "requeued": 0, "failed": 0}
        for rec in self.store.with_status(IN_PROGRESS):
            path = self.video_path(rec.id)
            if path.is_file() and path.stat().st_size > 0:
                self.store.complete(rec.id, str(path), self._expiry(int(path.stat().st_mtime)))
                counts["completed"] += 1
            elif rec.attempts >= self.settings.max_attempts:
                self.store.fail(rec.id, "interrupted", f"the job was interrupted {rec.attempts} times (frontend "
                                f"restarts or stage failures) and is not retried again")
                counts["failed"] += 1
            else:
                self.store.requeue(rec.id)
                counts["requeued"] += 1
        if any(counts.values()):
            logger.warning("video jobs recovered after a restart: %s", counts)
        return counts

    async def start(self) -> None:
        self.recover()
        self.sweep()
        self._tasks = [asyncio.create_task(self._dispatch(), name="video-dispatch"),
                       asyncio.create_task(self._sweep_loop(), name="video-retention")]
        self._wake.set()

    async def stop(self) -> None:
        tasks = self._tasks + [r.task for r in self._running.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self.store.close()

    # ------------------------------------------------------------------ API
    def video_path(self, job_id: str) -> Path:
        """The MP4 of job ``job_id``. Raises ValueError for a string that is not a job id."""
        if not is_job_id(job_id):
            raise ValueError(f"not a video job id: {job_id!r}")
        return self.videos_dir / f"{job_id}.mp4"

    def create(self, request: VideoRequest) -> JobRecord | None:
        """Queue a job; ``None`` when the queue is full."""
        rec = self.store.insert(request, max_queued=self.settings.max_queued)
        if rec is not None:
            self._wake.set()
        return rec

    def get(self, job_id: str) -> JobRecord | None:
        """The job ``job_id``; ``None`` when there is none or ``job_id`` is not a job id."""
        if not is_job_id(job_id):
            return None
        rec = self.store.get(job_id)
        if rec is not None and rec.status == COMPLETED and rec.expires_at is not None and rec.expires_at <= time.time():
            self._expire(rec)
            rec = self.store.get(job_id)
        return rec

    async def delete(self, job_id: str) -> bool:
        """Remove a job and its files; a running job's stream is cancelled first (the denoiser
        stops at its next step). False when there is no such job (or ``job_id`` is not a job id:
        nothing is touched then)."""
        if not is_job_id(job_id):
            return False
        running = self._running.get(job_id)
        if running is not None:
            running.deleted = True
            running.task.cancel()
            await asyncio.gather(running.task, return_exceptions=True)
        found = self.store.delete(job_id)
        self.video_path(job_id).unlink(missing_ok=True)
        prefix = f".{job_id}.mp4."  # write_atomic's temporary files of this job (a prefix, not a glob)
        if self.videos_dir.is_dir():
            for tmp in self.videos_dir.iterdir():
                if tmp.name.startswith(prefix):
                    tmp.unlink(missing_ok=True)
        return found

    def sweep(self, now: float | None = None) -> int:
        """Expire the completed jobs past their retention; returns how many."""
        now = int(time.time() if now is None else now)
        expired = self.store.expired_before(now)
        for rec in expired:
            self._expire(rec)
        return len(expired)

    # ------------------------------------------------------------------ internals
    def _expiry(self, completed_at: int) -> int | None:
        r = self.settings.retention_s
        return None if r is None else math.ceil(completed_at + r)

    def _expire(self, rec: JobRecord) -> None:
        self.video_path(rec.id).unlink(missing_ok=True)
        self.store.expire(rec.id, f"the video was removed after the retention period "
                          f"({self.settings.retention_s:g} s after completion)")
        self._on_event(rec.id, EXPIRED)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the sweep must keep running
                logger.exception("video retention sweep failed")

    async def _dispatch(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while len(self._running) < self.settings.max_running:
                rec = self.store.next_queued()
                if rec is None:
                    break
                task = asyncio.create_task(self._run(rec), name=f"video-{rec.id}")
                self._running[rec.id] = _Running(task)

    async def _run(self, rec: JobRecord) -> None:
        req = rec.request
        stall = self.settings.stall_timeout_s
        loop = asyncio.get_running_loop()
        try:
            frames, progress = None, -1
            async with asyncio.timeout_at(None if stall is None else loop.time() + stall) as watchdog:
                async for event in self.engine.generate_video(req.model, req.job,
                                                              request_id=f"{rec.id}-{rec.attempts}"):
                    if stall is not None:
                        watchdog.reschedule(loop.time() + stall)
                    if event.frames is not None:
                        frames = event.frames
                    elif event.total and DENOISE_PROGRESS * event.step // event.total > progress:
                        # a committed (fsynced) row: off the loop, and only when the percentage rises
                        progress = DENOISE_PROGRESS * event.step // event.total
                        await asyncio.to_thread(self.store.progress, rec.id, progress)
            assert frames is not None
            frames = frames[: req.keep_frames]
            data = await asyncio.to_thread(encode_mp4, frames, req.fps)
            path = self.video_path(rec.id)
            await asyncio.to_thread(write_atomic, path, data)
            if self._running.get(rec.id, _Running(None)).deleted or self.store.get(rec.id) is None:
                path.unlink(missing_ok=True)  # deleted while its MP4 was being written
                return
            self.store.complete(rec.id, str(path), self._expiry(int(time.time())))
            self._on_event(rec.id, COMPLETED)
        except asyncio.CancelledError:
            raise  # deleted (row removed by delete) or shutting down (resumed at the next start)
        except TimeoutError:  # the watchdog: the stream (and so the stage's request) is cancelled
            logger.warning("video job %s: no event from %s for %g s; stopped", rec.id, req.model, stall)
            self.store.fail(rec.id, "stalled", f"model {req.model} sent no progress for {stall:g} s "
                            f"(a stage may be stuck); the job was stopped: retry it")
            self._on_event(rec.id, FAILED)
        except InvalidRequestError as exc:
            self.store.fail(rec.id, "invalid_request", exc.message if hasattr(exc, "message") else str(exc))
            self._on_event(rec.id, FAILED)
        except EngineError as exc:
            if rec.attempts < self.settings.max_attempts:
                logger.warning("video job %s: %s; queued again (attempt %d of %d)", rec.id, exc, rec.attempts,
                               self.settings.max_attempts)
                await asyncio.sleep(1.0)
                self.store.requeue(rec.id)
            else:
                stage = dead_stage(str(exc))
                if stage is None:
                    self.store.fail(rec.id, "generation_failed", str(exc))
                else:
                    logger.warning("video job %s failed: %s", rec.id, exc)  # the raw error, for operators
                    self.store.fail(rec.id, "stage_died", f"stage {stage} died while this job ran (attempt "
                                    f"{rec.attempts} of {self.settings.max_attempts}); retry the job")
                self._on_event(rec.id, FAILED)
        except Exception as exc:  # noqa: BLE001 - a job fails with its reason, never vanishes
            logger.exception("video job %s failed", rec.id)
            self.store.fail(rec.id, "internal_error", f"{type(exc).__name__}: {exc}")
            self._on_event(rec.id, FAILED)
        finally:
            self._running.pop(rec.id, None)
            self._wake.set()
