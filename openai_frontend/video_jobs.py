"""Durable video jobs: the SQLite job store and the runner that drives jobs through the engine.

Why durable: a video job runs for minutes on real hardware, and a job that silently disappears
(frontend restart, crash) is what users fear most. Every state change is committed to one SQLite
file (WAL, ``synchronous=FULL``) before it is reported, and every MP4 is written all-or-nothing
into the media store (``videos/<id>.mp4`` of :class:`openai_frontend.media_store.MediaStore`:
the storage folder by default, ``--media-url`` when set; on a local folder temp file + fsync +
rename) *before* its job is marked completed, so:

- a job ``queued`` when the frontend stops is still queued after the restart;
- a job ``in_progress`` when the frontend stops is, at the next start, ``completed`` if its MP4
  is in the media store (the crash fell between the rename and the commit), else queued again (resumed
  from its first step: same inputs, same seed, so the same video) unless it was already started
  ``max_attempts`` times, then ``failed`` with the reason; never left in progress, never gone;
- ``progress`` only rises (``MAX`` in SQL), also across a resume.

Statuses: ``queued`` -> ``in_progress`` -> ``completed`` | ``failed``; ``completed`` ->
``expired`` when its MP4 is older than the retention (the file is removed, the job stays and says
so). ``DELETE`` removes the row and the files and cancels a running job's Triton stream, which
stops the denoiser at its next step boundary.

Retention and limits (:class:`JobSettings`): a ``failed`` job and an ``expired`` one are purged
(row, reference image, MP4, temporary files) ``purge_after_s`` after they failed / expired, by
the sweep that runs at start and every ``sweep_interval_s``; the start also removes temporary
MP4s and MP4s no live job owns (on a shared ``--media-url``: temporary files only once they are
older than the media store's grace, see :mod:`openai_frontend.media_store`). At most
``max_queued`` jobs wait (429 + ``Retry-After``), at most ``max_stored_jobs`` jobs of any status
and ``max_stored_bytes`` bytes (MP4s + stored requests, reference images included) are kept, and
a stored reference image has at most ``max_reference_bytes`` (400s, checked before the row is
written).

Database errors do not stop the runner: the dispatcher and every job-state write retry with
backoff (``db_retry_initial_s`` doubling to ``db_retry_max_s``) until the database answers again;
meanwhile :attr:`VideoJobs.store_error` says what fails since when, ``GET /v1/videos/{id}`` of a
queued job carries it in ``error`` (code ``job_store_unavailable``), and every failure is logged
and counted (``omni_frontend_video_store_errors``). A progress update that fails is skipped.

One process per folder: :class:`VideoJobs` holds ``<storage_dir>/frontend.lock``
(:mod:`openai_frontend.storage_lock`) from before it settles the previous process's jobs until
:meth:`VideoJobs.stop`, so a second frontend on the folder cannot requeue this one's jobs.

Several frontends on one database (``--database-url``, :class:`PostgresJobStore`): no folder
lock; the jobs are claimed with ``FOR UPDATE SKIP LOCKED`` and held by a lease
(``JobSettings.lease_s``) the running frontend renews; the start and every dispatcher round
take over only the jobs whose lease expired (their frontend died) and settle them as a restart
does above (the failure names the lost frontend); a running job deleted or taken over elsewhere
is stopped at the next renewal. ``JobStore`` is the interface both stores implement.
"""
from __future__ import annotations

import asyncio
import builtins
import json
import logging
import math
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from omni_triton.media.video import encode_mp4

from .engine import EngineError, InvalidRequestError, VideoJob
from .media_store import InvalidMediaKey, MediaEntry, MediaStore
from .storage_lock import lock_unless_shared

if TYPE_CHECKING:
    from .db import Database
    from .engine import Engine

T = TypeVar("T")

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
    file TEXT,
    bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, seq);
"""
#: columns added after the first release: (column, definition, how old rows are filled)
_MIGRATIONS = (("bytes", "INTEGER NOT NULL DEFAULT 0", "UPDATE jobs SET bytes = length(request)"),)


class JobQuotaError(Exception):
    """A new job would pass a :class:`JobSettings` limit (nothing was written).

    Attributes:
        limit: the setting's name (``max_stored_jobs``, ``max_stored_bytes``, ``max_reference_bytes``).
    """

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


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
    def from_json(cls, text: str) -> VideoRequest:
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
    """One row of the store (times are Unix seconds). ``request`` is None when the row was read
    for the API: the stored request (with its reference image, up to ``max_reference_bytes``) is
    loaded only to run the job, not for every poll or list."""

    id: str
    model: str
    status: str
    progress: int
    created_at: int
    size: str
    seconds: str
    prompt: str
    request: VideoRequest | None
    started_at: int | None = None
    completed_at: int | None = None
    expires_at: int | None = None
    error: dict[str, Any] | None = None
    attempts: int = 0
    file: str | None = None
    seq: int = 0

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``Video`` object (``client.videos.retrieve``)."""
        return {"id": self.id, "object": "video", "model": self.model, "status": self.status,
                "progress": self.progress, "created_at": self.created_at, "completed_at": self.completed_at,
                "expires_at": self.expires_at, "size": self.size, "seconds": self.seconds,
                "prompt": self.prompt, "error": self.error, "remixed_from_video_id": None}


def _quota_error(stored: int, nbytes: int, new_bytes: int, max_jobs: int | None,
                 max_bytes: int | None) -> JobQuotaError | None:
    """Why one more job of ``new_bytes`` (its stored request) cannot be stored next to
    ``stored`` jobs holding ``nbytes`` bytes, or None (both stores call it in their insert's
    transaction)."""
    if max_jobs is not None and stored >= max_jobs:
        return JobQuotaError("max_stored_jobs", f"{stored} video jobs are stored, the most this "
                             f"server keeps; delete finished jobs (DELETE /v1/videos/{{id}}) first")
    if max_bytes is not None and nbytes + new_bytes > max_bytes:
        return JobQuotaError("max_stored_bytes", f"the video store holds {nbytes} bytes; this job "
                             f"would pass its limit of {max_bytes}; delete finished jobs first")
    return None


class JobStore(Protocol):
    """What :class:`VideoJobs` needs of a job store; two backends: :class:`SqliteJobStore` (one
    file per frontend, the default) and :class:`PostgresJobStore` (one database shared by
    several frontends). Every method is blocking (called from worker threads) and is one short
    transaction. Times are Unix seconds (ints).

    Attributes:
        shared: True when several frontends use the store at once (no folder lock; jobs are
            claimed with a lease, :meth:`renew` and :meth:`take_over_expired` matter).
        errors: the exception types that mean "the database failed" (retried with backoff by
            :class:`VideoJobs`, reported as ``store_error``).
    """

    shared: bool
    errors: tuple[type[BaseException], ...]

    def close(self) -> None: ...

    def insert(self, request: VideoRequest, now: int | None = None, max_queued: int | None = None,
               max_jobs: int | None = None, max_bytes: int | None = None) -> JobRecord | None:
        """Add a queued job (None: ``max_queued`` are queued); limits checked in the insert's
        transaction. Raises :class:`JobQuotaError`."""

    def get(self, job_id: str, with_request: bool = True) -> JobRecord | None: ...

    def list(self, limit: int = 20, after: str | None = None,
             order: str = "desc") -> tuple[builtins.list[JobRecord], bool]: ...

    def count(self, status: str) -> int: ...

    def next_queued(self) -> JobRecord | None:
        """Claim the oldest queued job (in progress, attempts + 1, with its request)."""

    def progress(self, job_id: str, progress: int) -> None: ...

    def complete(self, job_id: str, file: str, expires_at: int | None, now: int | None = None,
                 file_bytes: int = 0) -> bool:
        """Mark completed; False when the job is gone (or, shared, no longer this frontend's)."""

    def fail(self, job_id: str, code: str, message: str, now: int | None = None,
             expires_at: int | None = None) -> None: ...

    def requeue(self, job_id: str, refund_attempt: bool = False) -> None: ...

    def expire(self, job_id: str, message: str) -> None: ...

    def delete(self, job_id: str) -> bool: ...

    def with_status(self, *statuses: str) -> builtins.list[JobRecord]: ...

    def expired_before(self, now: int) -> builtins.list[JobRecord]: ...

    def purge(self, now: int, after_s: float) -> builtins.list[str]: ...

    def statuses(self) -> dict[str, str]: ...

    def renew(self, job_ids: Iterable[str]) -> set[str]:
        """Extend the leases of the running ``job_ids``; returns those still this frontend's."""

    def take_over_expired(self, include_own: bool = False) -> builtins.list[tuple[JobRecord, str | None]]:
        """Claim the in-progress jobs whose lease expired; returns (record, previous owner)."""


class SqliteJobStore:
    """The job table in one SQLite file (``<storage>/jobs.sqlite3``), safe to call from any
    thread (one connection behind a lock; every call is one short transaction). One frontend
    per file (the folder lock): no leases, a job left in progress is settled at the next start."""

    #: local to one frontend: :class:`VideoJobs` holds the folder lock
    #: (:func:`openai_frontend.storage_lock.lock_unless_shared`)
    shared = False
    errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)

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
            have = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
            for column, definition, fill in _MIGRATIONS:
                if column not in have:
                    self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {definition}")
                    self._db.execute(fill)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    #: every column but ``request`` (what the API and the sweeps read)
    _SUMMARY = ("seq, id, model, status, progress, created_at, started_at, completed_at, expires_at, size, "
                "seconds, prompt, error, attempts, file")

    @staticmethod
    def _record(row: sqlite3.Row) -> JobRecord:
        request = VideoRequest.from_json(row["request"]) if "request" in row.keys() else None
        return JobRecord(id=row["id"], model=row["model"], status=row["status"], progress=row["progress"],
                         created_at=row["created_at"], size=row["size"], seconds=row["seconds"],
                         prompt=row["prompt"], request=request,
                         started_at=row["started_at"], completed_at=row["completed_at"],
                         expires_at=row["expires_at"], error=json.loads(row["error"]) if row["error"] else None,
                         attempts=row["attempts"], file=row["file"], seq=row["seq"])

    def insert(self, request: VideoRequest, now: int | None = None, max_queued: int | None = None,
               max_jobs: int | None = None, max_bytes: int | None = None) -> JobRecord | None:
        """Add a queued job; ``None`` when ``max_queued`` jobs are already queued. The limits are
        checked in the insert's transaction (concurrent creates cannot pass them together).

        Raises:
            JobQuotaError: ``max_jobs`` jobs (any status) are stored, or the stored bytes plus
                this request's would pass ``max_bytes``.
        """
        job_id = "video_" + secrets.token_hex(12)  # the form of JOB_ID
        now = int(time.time()) if now is None else now
        text = request.to_json()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (queued, stored, nbytes) = self._db.execute(
                    "SELECT COUNT(*) FILTER (WHERE status = ?), COUNT(*), COALESCE(SUM(bytes), 0) FROM jobs",
                    (QUEUED,)).fetchone()
                if max_queued is not None and queued >= max_queued:
                    self._db.execute("ROLLBACK")
                    return None
                error = _quota_error(stored, nbytes, len(text), max_jobs, max_bytes)
                if error is not None:
                    self._db.execute("ROLLBACK")
                    raise error
                self._db.execute(
                    "INSERT INTO jobs (id, model, status, created_at, size, seconds, prompt, request, bytes) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (job_id, request.model, QUEUED, now, request.size, request.seconds, request.job.prompt,
                     text, len(text)))
                # read in the transaction: a runner in another thread may claim it right after
                row = self._db.execute(f"SELECT {self._SUMMARY} FROM jobs WHERE id = ?", (job_id,)).fetchone()
                self._db.execute("COMMIT")
            except JobQuotaError:
                raise
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return self._record(row)

    def get(self, job_id: str, with_request: bool = True) -> JobRecord | None:
        """The job ``job_id`` or None; ``with_request=False`` leaves its stored request unread."""
        columns = "*" if with_request else self._SUMMARY
        rows = self._query(f"SELECT {columns} FROM jobs WHERE id = ?", (job_id,))
        return self._record(rows[0]) if rows else None

    def list(self, limit: int = 20, after: str | None = None, order: str = "desc") -> tuple[list[JobRecord], bool]:
        """Jobs in creation order (``asc``/``desc``), starting after the job ``after``; returns
        (up to ``limit`` records, whether more follow).

        Raises:
            KeyError: ``after`` is not a job id.
        """
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        args: tuple[Any, ...]
        where, args = "", ()
        if after:
            found = self._query("SELECT seq FROM jobs WHERE id = ?", (after,))
            if not found:
                raise KeyError(after)
            where, args = f"WHERE seq {op} ?", (found[0]["seq"],)
        rows = self._query(f"SELECT {self._SUMMARY} FROM jobs {where} ORDER BY seq {direction} LIMIT ?",
                           args + (limit + 1,))
        return [self._record(r) for r in rows[:limit]], len(rows) > limit

    def count(self, status: str) -> int:
        count: int = self._query("SELECT COUNT(*) FROM jobs WHERE status = ?", (status,))[0][0]
        return count

    def next_queued(self) -> JobRecord | None:
        """Claim the oldest queued job: mark it in progress (attempts + 1) and return it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT id FROM jobs WHERE status = ? ORDER BY seq LIMIT 1",
                                       (QUEUED,)).fetchone()
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

    def complete(self, job_id: str, file: str, expires_at: int | None, now: int | None = None,
                 file_bytes: int = 0) -> bool:
        """Mark the job completed with its MP4 ``file`` of ``file_bytes`` bytes (counted against
        ``max_stored_bytes`` until it expires); False when there is no such job."""
        now = int(time.time()) if now is None else now
        return 0 < self._write("UPDATE jobs SET status = ?, progress = 100, completed_at = ?, expires_at = ?, "
                               "file = ?, error = NULL, bytes = length(request) + ? WHERE id = ?",
                               (COMPLETED, now, expires_at, file, int(file_bytes), job_id))

    def fail(self, job_id: str, code: str, message: str, now: int | None = None,
             expires_at: int | None = None) -> None:
        """Mark the job failed; ``expires_at``: when the purge will remove it (shown to clients;
        the purge itself counts from ``completed_at``)."""
        now = int(time.time()) if now is None else now
        self._write("UPDATE jobs SET status = ?, completed_at = ?, expires_at = ?, error = ? WHERE id = ?",
                   (FAILED, now, expires_at, json.dumps({"code": code, "message": message}), job_id))

    def requeue(self, job_id: str, refund_attempt: bool = False) -> None:
        """Queue a running job again; ``refund_attempt``: it never started (a claim that a
        shutdown overtook), so its start does not count against ``max_attempts``."""
        self._write("UPDATE jobs SET status = ?, attempts = MAX(attempts - ?, 0) WHERE id = ? AND status = ?",
                    (QUEUED, int(refund_attempt), job_id, IN_PROGRESS))

    def expire(self, job_id: str, message: str) -> None:
        self._write("UPDATE jobs SET status = ?, file = NULL, error = ?, bytes = length(request) "
                   "WHERE id = ? AND status = ?",
                   (EXPIRED, json.dumps({"code": "video_expired", "message": message}), job_id, COMPLETED))

    def delete(self, job_id: str) -> bool:
        return self._write("DELETE FROM jobs WHERE id = ?", (job_id,)) > 0

    def with_status(self, *statuses: str) -> builtins.list[JobRecord]:  # builtins: list is a method here
        marks = ",".join("?" * len(statuses))
        return [self._record(r) for r in
                self._query(f"SELECT {self._SUMMARY} FROM jobs WHERE status IN ({marks}) ORDER BY seq", statuses)]

    def expired_before(self, now: int) -> builtins.list[JobRecord]:
        rows = self._query(f"SELECT {self._SUMMARY} FROM jobs WHERE status = ? AND expires_at IS NOT NULL "
                           "AND expires_at <= ?", (COMPLETED, now))
        return [self._record(r) for r in rows]

    def purge(self, now: int, after_s: float) -> builtins.list[str]:
        """Delete the jobs that failed (``completed_at``) or expired (``expires_at``) at least
        ``after_s`` seconds before ``now``; returns their ids (the caller removes their files)."""
        where = ("(status = ? AND completed_at IS NOT NULL AND completed_at + ? <= ?) OR "
                 "(status = ? AND expires_at IS NOT NULL AND expires_at + ? <= ?)")
        args = (FAILED, after_s, now, EXPIRED, after_s, now)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                ids = [r[0] for r in self._db.execute(f"SELECT id FROM jobs WHERE {where}", args)]
                self._db.execute(f"DELETE FROM jobs WHERE {where}", args)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return ids

    def statuses(self) -> dict[str, str]:
        """Every job id -> its status (the start-up file sweep; bounded by ``max_stored_jobs``)."""
        return {r[0]: r[1] for r in self._query("SELECT id, status FROM jobs")}

    def renew(self, job_ids: Iterable[str]) -> set[str]:
        """No leases in a file one frontend owns: every running job stays this frontend's."""
        return set(job_ids)

    def take_over_expired(self, include_own: bool = False) -> builtins.list[tuple[JobRecord, str | None]]:
        """No leases: the jobs a previous process left are settled at start (``VideoJobs.recover``)."""
        return []


class PostgresJobStore:
    """The job table (``video_jobs``, :data:`openai_frontend.db.MIGRATIONS`) in a PostgreSQL
    database several frontends share; thread-safe (a connection from the pool per call).

    Claims: :meth:`next_queued` takes the oldest queued job with ``FOR UPDATE SKIP LOCKED`` (two
    frontends never claim the same job, neither waits for the other) and writes ``owner`` (this
    frontend's id) and ``lease_expires_at`` (the database's clock + ``lease_s``; ``lease_s <= 0``:
    ``infinity``, the lease never expires: a test switch that disables takeover). The runner
    renews the lease (:meth:`renew`); every write of a running job's state is guarded by
    ``owner`` (a job taken over is no longer written by its old frontend). Any frontend's
    dispatcher claims the jobs whose lease expired (:meth:`take_over_expired`) and settles them
    (``VideoJobs.recover``). Quotas: the insert's count and write run under
    ``pg_advisory_xact_lock(VIDEO_QUOTA_LOCK)``, so concurrent creates on several frontends
    cannot pass a limit together.

    Args:
        db: the pool (:class:`openai_frontend.db.Database`, migrated); not closed by :meth:`close`.
        owner: this frontend's id (``--frontend-id``), written into the leases it holds.
        lease_s: seconds a claim or a renewal holds the job (``--video-lease-s``).
    """

    shared = True

    def __init__(self, db: Database, owner: str, lease_s: float = 30.0):
        from psycopg.rows import dict_row

        self.db, self.owner, self.lease_s = db, owner, float(lease_s)
        self.errors = db.errors
        self._dict_row = dict_row

    def close(self) -> None:
        """Nothing to close: the pool belongs to the app (it also serves the voice store)."""

    def _lease(self) -> tuple[str, tuple[Any, ...]]:
        """The SQL value of a new lease end and its parameters."""
        if self.lease_s <= 0:
            return "'infinity'::timestamptz", ()
        return "now() + %s * interval '1 second'", (self.lease_s,)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> builtins.list[dict[str, Any]]:
        with self.db.connection() as conn, conn.cursor(row_factory=self._dict_row) as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description is not None else []

    def _write(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self.db.connection() as conn:
            return conn.execute(sql, args).rowcount

    _SUMMARY = SqliteJobStore._SUMMARY
    #: the columns a job is run from (never ``lease_expires_at``: ``infinity`` has no Python datetime)
    _FULL = _SUMMARY + ", request"

    @staticmethod
    def _record(row: dict[str, Any]) -> JobRecord:
        return SqliteJobStore._record(row)  # type: ignore[arg-type]  # a dict reads like an sqlite3.Row

    def insert(self, request: VideoRequest, now: int | None = None, max_queued: int | None = None,
               max_jobs: int | None = None, max_bytes: int | None = None) -> JobRecord | None:
        """Add a queued job; ``None`` when ``max_queued`` jobs are already queued (by any
        frontend). The limits are checked under the quota lock in the insert's transaction.

        Raises:
            JobQuotaError: ``max_jobs`` jobs are stored, or the bytes would pass ``max_bytes``.
        """
        from .db import VIDEO_QUOTA_LOCK

        job_id = "video_" + secrets.token_hex(12)  # the form of JOB_ID
        now = int(time.time()) if now is None else now
        text = request.to_json()
        with self.db.connection() as conn, conn.cursor(row_factory=self._dict_row) as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (VIDEO_QUOTA_LOCK,))
            counts = cur.execute(
                "SELECT COUNT(*) FILTER (WHERE status = %s) AS queued, COUNT(*) AS stored, "
                "COALESCE(SUM(bytes), 0) AS nbytes FROM video_jobs", (QUEUED,)).fetchone()
            assert counts is not None
            if max_queued is not None and counts["queued"] >= max_queued:
                return None
            error = _quota_error(int(counts["stored"]), int(counts["nbytes"]), len(text), max_jobs, max_bytes)
            if error is not None:
                raise error  # the transaction rolls back (nothing was written)
            row = cur.execute(
                f"INSERT INTO video_jobs (id, model, status, created_at, size, seconds, prompt, request, bytes) "
                f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {self._SUMMARY}",
                (job_id, request.model, QUEUED, now, request.size, request.seconds, request.job.prompt,
                 text, len(text))).fetchone()
        assert row is not None
        return self._record(row)

    def get(self, job_id: str, with_request: bool = True) -> JobRecord | None:
        """The job ``job_id`` or None; ``with_request=False`` leaves its stored request unread."""
        columns = self._FULL if with_request else self._SUMMARY
        rows = self._rows(f"SELECT {columns} FROM video_jobs WHERE id = %s", (job_id,))
        return self._record(rows[0]) if rows else None

    def list(self, limit: int = 20, after: str | None = None,
             order: str = "desc") -> tuple[builtins.list[JobRecord], bool]:
        """Jobs in creation order (``asc``/``desc``), after the job ``after``; (records, more follow).

        Raises:
            KeyError: ``after`` is not a job id.
        """
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        where, args = "", ()  # type: tuple[str, tuple[Any, ...]]
        if after:
            found = self._rows("SELECT seq FROM video_jobs WHERE id = %s", (after,))
            if not found:
                raise KeyError(after)
            where, args = f"WHERE seq {op} %s", (found[0]["seq"],)
        rows = self._rows(f"SELECT {self._SUMMARY} FROM video_jobs {where} ORDER BY seq {direction} LIMIT %s",
                          args + (limit + 1,))
        return [self._record(r) for r in rows[:limit]], len(rows) > limit

    def count(self, status: str) -> int:
        return int(self._rows("SELECT COUNT(*) AS n FROM video_jobs WHERE status = %s", (status,))[0]["n"])

    def next_queued(self) -> JobRecord | None:
        """Claim the oldest queued job no other frontend is claiming (``FOR UPDATE SKIP
        LOCKED``): in progress, attempts + 1, ``owner`` = this frontend, a fresh lease."""
        lease, lease_args = self._lease()
        rows = self._rows(
            f"UPDATE video_jobs SET status = %s, attempts = attempts + 1, started_at = %s, owner = %s, "
            f"lease_expires_at = {lease} WHERE id = (SELECT id FROM video_jobs WHERE status = %s "
            f"ORDER BY seq FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING {self._FULL}",
            (IN_PROGRESS, int(time.time()), self.owner, *lease_args, QUEUED))
        return self._record(rows[0]) if rows else None

    def progress(self, job_id: str, progress: int) -> None:
        """Raise this frontend's running job's progress (never lowers it)."""
        self._write("UPDATE video_jobs SET progress = GREATEST(progress, %s) WHERE id = %s AND status = %s "
                    "AND owner = %s", (int(progress), job_id, IN_PROGRESS, self.owner))

    def complete(self, job_id: str, file: str, expires_at: int | None, now: int | None = None,
                 file_bytes: int = 0) -> bool:
        """Mark this frontend's job completed (see :meth:`SqliteJobStore.complete`); False when
        it is gone or another frontend took it over."""
        now = int(time.time()) if now is None else now
        return 0 < self._write(
            "UPDATE video_jobs SET status = %s, progress = 100, completed_at = %s, expires_at = %s, file = %s, "
            "error = NULL, bytes = length(request) + %s, lease_expires_at = NULL WHERE id = %s AND owner = %s",
            (COMPLETED, now, expires_at, file, int(file_bytes), job_id, self.owner))

    def fail(self, job_id: str, code: str, message: str, now: int | None = None,
             expires_at: int | None = None) -> None:
        """Mark this frontend's job failed (see :meth:`SqliteJobStore.fail`)."""
        now = int(time.time()) if now is None else now
        self._write("UPDATE video_jobs SET status = %s, completed_at = %s, expires_at = %s, error = %s, "
                    "lease_expires_at = NULL WHERE id = %s AND owner = %s",
                    (FAILED, now, expires_at, json.dumps({"code": code, "message": message}), job_id, self.owner))

    def requeue(self, job_id: str, refund_attempt: bool = False) -> None:
        """Queue this frontend's running job again, for any frontend to claim (see
        :meth:`SqliteJobStore.requeue`)."""
        self._write("UPDATE video_jobs SET status = %s, attempts = GREATEST(attempts - %s, 0), owner = NULL, "
                    "lease_expires_at = NULL WHERE id = %s AND status = %s AND owner = %s",
                    (QUEUED, int(refund_attempt), job_id, IN_PROGRESS, self.owner))

    def expire(self, job_id: str, message: str) -> None:
        self._write("UPDATE video_jobs SET status = %s, file = NULL, error = %s, bytes = length(request) "
                    "WHERE id = %s AND status = %s",
                    (EXPIRED, json.dumps({"code": "video_expired", "message": message}), job_id, COMPLETED))

    def delete(self, job_id: str) -> bool:
        """Remove the job, whoever runs it (its frontend's next renewal stops the run)."""
        return self._write("DELETE FROM video_jobs WHERE id = %s", (job_id,)) > 0

    def with_status(self, *statuses: str) -> builtins.list[JobRecord]:
        return [self._record(r) for r in self._rows(
            f"SELECT {self._SUMMARY} FROM video_jobs WHERE status = ANY(%s) ORDER BY seq", (builtins.list(statuses),))]

    def expired_before(self, now: int) -> builtins.list[JobRecord]:
        rows = self._rows(f"SELECT {self._SUMMARY} FROM video_jobs WHERE status = %s AND expires_at IS NOT NULL "
                          "AND expires_at <= %s", (COMPLETED, now))
        return [self._record(r) for r in rows]

    def purge(self, now: int, after_s: float) -> builtins.list[str]:
        """Delete the failed / expired jobs past ``after_s`` (see :meth:`SqliteJobStore.purge`);
        each id is returned to exactly one of several frontends purging at once."""
        rows = self._rows(
            "DELETE FROM video_jobs WHERE (status = %s AND completed_at IS NOT NULL AND completed_at + %s <= %s) "
            "OR (status = %s AND expires_at IS NOT NULL AND expires_at + %s <= %s) RETURNING id",
            (FAILED, after_s, now, EXPIRED, after_s, now))
        return [str(r["id"]) for r in rows]

    def statuses(self) -> dict[str, str]:
        return {str(r["id"]): str(r["status"]) for r in self._rows("SELECT id, status FROM video_jobs")}

    def renew(self, job_ids: Iterable[str]) -> set[str]:
        """Extend the leases of this frontend's running ``job_ids``; returns the ids still ours
        (a job missing from the answer was deleted, finished elsewhere or taken over: its local
        run must stop)."""
        ids = builtins.list(job_ids)
        if not ids:
            return set()
        lease, lease_args = self._lease()
        rows = self._rows(f"UPDATE video_jobs SET lease_expires_at = {lease} WHERE id = ANY(%s) AND owner = %s "
                          f"AND status = %s RETURNING id", (*lease_args, ids, self.owner, IN_PROGRESS))
        return {str(r["id"]) for r in rows}

    def take_over_expired(self, include_own: bool = False) -> builtins.list[tuple[JobRecord, str | None]]:
        """Claim the in-progress jobs whose lease expired (their frontend died or lost the
        database), skipping rows another frontend is claiming (``SKIP LOCKED``): ``owner`` = this
        frontend, a fresh lease. ``include_own``: also this frontend id's jobs whatever their
        lease (at start: they are a previous process's with the same ``--frontend-id``).
        Returns (record without request, the previous owner) pairs; the caller settles each."""
        lease, lease_args = self._lease()
        own = "OR owner = %s" if include_own else ""
        rows = self._rows(
            f"WITH lost AS (SELECT id, owner FROM video_jobs WHERE status = %s AND (lease_expires_at < now() "
            f"OR lease_expires_at IS NULL OR owner IS NULL {own}) FOR UPDATE SKIP LOCKED) "
            f"UPDATE video_jobs j SET owner = %s, lease_expires_at = {lease} FROM lost WHERE j.id = lost.id "
            f"RETURNING {', '.join('j.' + c.strip() for c in self._SUMMARY.split(','))}, lost.owner AS lost_owner",
            (IN_PROGRESS, *((self.owner,) if include_own else ()), self.owner, *lease_args))
        return [(self._record(r), r["lost_owner"]) for r in rows]


@dataclass
class JobSettings:
    """Knobs of the video jobs (``python -m openai_frontend --video-*``).

    storage_dir: the SQLite file lives here, and the MP4s (``videos/<id>.mp4``) unless the
        frontend has a ``--media-url`` (:class:`openai_frontend.media_store.MediaStore`).
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
    purge_after_s: a failed job, and an expired one, is deleted (row, stored request and
        reference image, files) this long after it failed / expired (``None``: kept).
    sweep_interval_s: seconds between two retention sweeps (expiry + purge; one also runs at start).
    max_stored_jobs: jobs of any status kept at once; a new job beyond is a 400 ``quota_exceeded``.
    max_stored_bytes: bytes of MP4s and stored requests (reference images included) kept at
        once; a new job while the store is at the limit is a 400 ``quota_exceeded`` (one job's MP4
        may pass it: its size is known only when it is written).
    max_reference_bytes: bytes of a stored ``input_reference`` (the PNG of the image fitted to
        the video's size); more is a 400 ``input_reference_too_large``.
    db_retry_initial_s / db_retry_max_s: backoff of the dispatcher and the job-state writes after
        a database error (doubling from the first to the second, then retried at that pace).
    lease_s: shared store only (``--database-url``): seconds a frontend's claim of a running
        job holds without renewal; renewed every ``lease_s / 3`` while the job runs. A job whose
        lease expired (its frontend died) is taken over by another frontend. ``<= 0``: leases
        never expire (no takeover; a test switch), the job is still checked every
        ``poll_interval_s * 10`` s for a delete on another frontend.
    poll_interval_s: shared store only: seconds between two looks of an idle dispatcher at the
        shared queue (jobs created on other frontends) and at expired leases.
    """

    storage_dir: Path
    max_queued: int = 16
    max_running: int = 4
    retention_s: float | None = 24 * 3600
    max_attempts: int = 3
    retry_after_s: int = 5
    sweep_interval_s: float = 30.0
    stall_timeout_s: float | None = 600.0
    purge_after_s: float | None = 7 * 24 * 3600
    max_stored_jobs: int = 10000
    max_stored_bytes: int = 20 << 30
    max_reference_bytes: int = 8 << 20
    db_retry_initial_s: float = 0.5
    db_retry_max_s: float = 30.0
    lease_s: float = 30.0
    poll_interval_s: float = 1.0

    @property
    def renew_interval_s(self) -> float:
        """Seconds between two lease renewals of the running jobs (``lease_s / 3``)."""
        return self.lease_s / 3 if self.lease_s > 0 else self.poll_interval_s * 10


async def _next_event(events: AsyncGenerator[T, None], timeout: float | None) -> T:
    """The next item of ``events``, waiting at most ``timeout`` seconds (None: no limit).

    Not ``asyncio.wait_for``: on Python 3.10/3.11 it returns the item and *swallows* a
    cancellation of the caller that arrives as the item completes (so a deleted video job ran
    to its end); not ``asyncio.timeout_at``: Python 3.11+ only, and the GPU image runs 3.10.
    ``asyncio.wait`` neither swallows the caller's cancellation nor cancels on its own, so the
    pending step is cancelled (and awaited) here before ``events`` can be closed.

    Raises:
        StopAsyncIteration: ``events`` is exhausted.
        asyncio.TimeoutError: no item within ``timeout`` (the pending step is cancelled).
        asyncio.CancelledError: the caller was cancelled (the pending step is cancelled too).
    """
    step = asyncio.ensure_future(events.__anext__())
    try:
        done, _ = await asyncio.wait({step}, timeout=timeout)
    finally:
        if not step.done():
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
        elif not step.cancelled():
            # the caller was cancelled as the step ended (StopAsyncIteration, an error): its
            # exception is retrieved here, or asyncio reports it "never retrieved" at garbage collection
            step.exception()
    if not done:
        raise asyncio.TimeoutError
    return step.result()


@dataclass
class _Running:
    task: asyncio.Task[Any]
    deleted: bool = False
    #: shared store: the job is no longer this frontend's (deleted or taken over elsewhere)
    lost: bool = False


class VideoJobs:
    """Runs the store's jobs through ``engine.generate_video``.

    ``start()`` recovers what a previous process left (see the module docstring) and starts the
    dispatcher and the retention sweep; ``stop()`` cancels the running tasks, whose jobs stay
    ``in_progress`` in the store and are resumed by the next ``start()``.

    ``on_event(job_id, outcome)`` is called when a job ends (completed, failed, expired);
    ``on_store_error(operation)`` on every database error the runner survives. ``media``: where
    the MP4s go (``videos/<id>.mp4``); default: ``settings.storage_dir``.

    ``store``: the job store (default: :class:`SqliteJobStore` in ``settings.storage_dir``,
    under the folder lock). A shared store (:class:`PostgresJobStore`) takes no folder lock; the
    dispatcher then also polls the shared queue, takes over expired leases, and a renewal loop
    keeps the running jobs' leases (a job no longer ours is stopped here).

    Raises (at construction):
        StorageLockedError: another process has ``settings.storage_dir`` open (SQLite store; or,
            with a local store, the explicit local ``media`` folder: :mod:`openai_frontend.media_store`).
    """

    def __init__(self, engine: Engine, settings: JobSettings, on_event: Callable[[str, str], None] | None = None,
                 on_store_error: Callable[[str], None] | None = None, store: JobStore | None = None,
                 media: MediaStore | None = None):
        self.engine = engine
        self.settings = settings
        self.dir = Path(settings.storage_dir)
        self.inputs_dir = self.dir / "inputs"
        shared_store = store.shared if store is not None else SqliteJobStore.shared
        self._folder_lock = lock_unless_shared(self.dir, shared_store)
        self._media_lock = None
        try:
            self.media = media if media is not None else MediaStore(self.dir)
            if self.media.shared and self.media.local:  # orphans are judged by this store's rows
                self._media_lock = lock_unless_shared(Path(self.media.root), shared_store)
            self.store: JobStore = store if store is not None else SqliteJobStore(self.dir / "jobs.sqlite3")
        except BaseException:
            for lock in (self._media_lock, self._folder_lock):
                if lock is not None:
                    lock.release()
            raise
        self._running: dict[str, _Running] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._on_event = on_event or (lambda job_id, what: None)
        self._on_store_error = on_store_error or (lambda operation: None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._claim: asyncio.Future[Any] | None = None  # the dispatcher's claim in flight (a worker thread)
        #: the database error the runner is retrying, or None: ``{"operation", "message", "since"}``
        self.store_error: dict[str, Any] | None = None

    # ------------------------------------------------------------------ lifecycle
    def recover(self) -> dict[str, int]:
        """Settle the jobs a previous process left in progress (SQLite), or, on a shared store,
        the jobs whose lease expired plus this frontend id's own (:meth:`take_over`); returns
        counts per outcome. A shared store's running jobs of other live frontends are left alone."""
        if self.store.shared:
            return self.take_over(include_own=True)
        counts = {"completed": 0, "requeued": 0, "failed": 0}
        for rec in self.store.with_status(IN_PROGRESS):
            counts[self._settle_interrupted(rec, None)] += 1
        if any(counts.values()):
            logger.warning("video jobs recovered after a restart: %s", counts)
        return counts

    def take_over(self, include_own: bool = False) -> dict[str, int]:
        """Shared store: claim the jobs whose lease expired (:meth:`JobStore.take_over_expired`)
        and settle each (:meth:`_settle_interrupted`); returns counts per outcome. Blocking."""
        counts = {"completed": 0, "requeued": 0, "failed": 0}
        for rec, lost_owner in self.store.take_over_expired(include_own=include_own):
            if rec.id in self._running:  # our own live run, its renewal late (the claim renewed it): keep it
                continue
            outcome = self._settle_interrupted(rec, lost_owner)
            counts[outcome] += 1
            if outcome != "requeued":
                self._on_event(rec.id, outcome)  # "completed" / "failed": the outcomes of on_event
            logger.warning("video job %s: the lease of frontend %s expired (attempt %d of %d); taken over by %s: %s",
                           rec.id, lost_owner, rec.attempts, self.settings.max_attempts,
                           getattr(self.store, "owner", "?"), outcome)
        return counts

    def _finished_mp4(self, job_id: str) -> tuple[str, int, float] | None:
        """(media key, bytes, mtime) of job ``job_id``'s MP4 when it is already written, else None:
        a run that ended between writing the MP4 and committing the job. Blocking (the media store)."""
        mp4 = self.video_file(job_id)
        if mp4 is None or mp4.size <= 0:
            return None
        return mp4.key, mp4.size, mp4.mtime or time.time()

    def _settle_interrupted(self, rec: JobRecord, lost_owner: str | None) -> str:
        """Settle a job whose run was interrupted (a previous process; a frontend whose lease
        expired, ``lost_owner``): ``completed`` if its MP4 is written, ``failed`` (code
        ``interrupted``, naming the lost frontend) once it was started ``max_attempts`` times,
        else ``requeued`` (resumed by the next claim, attempts + 1). Returns the outcome."""
        done = self._finished_mp4(rec.id)
        if done is not None:
            path, size, mtime = done
            self.store.complete(rec.id, path, self._expiry(int(mtime)), file_bytes=size)
            return "completed"
        if rec.attempts >= self.settings.max_attempts:
            message = (f"the job was interrupted {rec.attempts} times (frontend restarts or stage failures) "
                       f"and is not retried again")
            if lost_owner is not None:
                message += f"; its last run, on frontend {lost_owner}, stopped renewing its lease"
            self.store.fail(rec.id, "interrupted", message, expires_at=self._purge_at(int(time.time())))
            return "failed"
        self.store.requeue(rec.id)
        return "requeued"

    async def start(self) -> None:
        """Settle the previous process's jobs, sweep (expiry, purge, stray files; in a worker
        thread), then start the dispatcher, the periodic sweep and, on a shared store, the lease
        renewals. The stray-file sweep is safe beside other frontends writing to a shared media
        location (:meth:`remove_stray_files`)."""
        def settle() -> None:
            self.recover()
            self.sweep()
            self.remove_stray_files()  # shared-safe: see MediaStore's sweeps

        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(settle)
        self._tasks = [asyncio.create_task(self._dispatch(), name="video-dispatch"),
                       asyncio.create_task(self._sweep_loop(), name="video-retention")]
        if self.store.shared:
            self._tasks.append(asyncio.create_task(self._renew_loop(), name="video-leases"))
        self._wake.set()

    async def stop(self) -> None:
        """Cancel the dispatcher, the sweep and the running jobs, close the store and release
        the folder lock. SQLite: the jobs stay in progress and are resumed at the next start. A
        shared store: they are queued again at once (any frontend resumes them; the attempt
        counts, as a restart does), or, if the database does not answer, taken over once their
        leases expire."""
        running = builtins.list(self._running)
        tasks = self._tasks + [r.task for r in self._running.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        claim, self._claim = self._claim, None
        if claim is not None:  # the dispatcher was stopped while its thread claimed a job
            rec = (await asyncio.gather(claim, return_exceptions=True))[0]
            if isinstance(rec, JobRecord):
                self.store.requeue(rec.id, refund_attempt=True)
        if self.store.shared and running:
            def hand_back() -> None:
                for job_id in running:
                    self.store.requeue(job_id)

            try:
                await asyncio.to_thread(hand_back)
                logger.info("video jobs: %d running jobs handed back to the shared queue", len(running))
            except self.store.errors as exc:
                logger.warning("video jobs: could not hand back %d running jobs (%s); other frontends take "
                               "them over when their leases expire", len(running), exc)
        self.store.close()
        for lock in (self._media_lock, self._folder_lock):
            if lock is not None:
                lock.release()

    # ------------------------------------------------------------------ API
    def video_key(self, job_id: str) -> str:
        """The media key of job ``job_id``'s MP4 (``videos/<id>.mp4``). Raises ValueError for a
        string that is not a job id."""
        if not is_job_id(job_id):
            raise ValueError(f"not a video job id: {job_id!r}")
        return f"videos/{job_id}.mp4"

    def video_file(self, job_id: str) -> MediaEntry | None:
        """Job ``job_id``'s MP4 in the media store (size, mtime), None when it is not there.
        Blocking (a file system or object store call): run it in a worker thread.

        Raises:
            ValueError: ``job_id`` is not a job id. OSError: the media store fails.
        """
        return self.media.info(self.video_key(job_id))

    def create(self, request: VideoRequest) -> JobRecord | None:
        """Queue a job; ``None`` when the queue is full.

        Raises:
            JobQuotaError: a stored-jobs limit, or ``max_reference_bytes``, would be passed
                (nothing is written).
        """
        cfg = self.settings
        reference = request.job.input_reference  # base64 of the fitted PNG
        size = len(reference) * 3 // 4 - reference[-2:].count("=") if reference else 0
        if size > cfg.max_reference_bytes:
            raise JobQuotaError("max_reference_bytes", f"input_reference is {size} bytes once fitted to the "
                                f"video's size; at most {cfg.max_reference_bytes} are stored")
        rec = self.store.insert(request, max_queued=cfg.max_queued, max_jobs=cfg.max_stored_jobs,
                                max_bytes=cfg.max_stored_bytes)
        if rec is not None:
            self._wake_dispatcher()
        return rec

    def _wake_dispatcher(self) -> None:
        """Wake the dispatcher, from the event loop or from a worker thread (``create`` runs in one)."""
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if self._loop is None or on_loop:
            self._wake.set()
        else:
            self._loop.call_soon_threadsafe(self._wake.set)

    def to_openai(self, rec: JobRecord) -> dict[str, Any]:
        """``rec.to_openai()``; a queued job's ``error`` says when the runner cannot reach the
        database (``job_store_unavailable``: it waits, it is not lost)."""
        out = rec.to_openai()
        if rec.status == QUEUED and self.store_error is not None and out["error"] is None:
            out["error"] = {"code": "job_store_unavailable",
                            "message": f"the job store fails since {self.store_error['since']} "
                                       f"({self.store_error['message']}); queued jobs wait and start "
                                       f"once it answers again"}
        return out

    def get(self, job_id: str) -> JobRecord | None:
        """The job ``job_id``; ``None`` when there is none or ``job_id`` is not a job id."""
        if not is_job_id(job_id):
            return None
        rec = self.store.get(job_id, with_request=False)
        if rec is not None and rec.status == COMPLETED and rec.expires_at is not None and rec.expires_at <= time.time():
            self._expire(rec)
            rec = self.store.get(job_id, with_request=False)
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
        found = await asyncio.to_thread(self.store.delete, job_id)  # a commit (PostgreSQL: a round trip)
        await asyncio.to_thread(self._remove_files, job_id)  # a file system or object store call
        return found

    def sweep(self, now: float | None = None) -> int:
        """Expire the completed jobs past their retention, then purge the failed and expired
        jobs past ``purge_after_s`` with their files; returns how many jobs expired. Blocking
        (files and database): run it in a worker thread."""
        now = int(time.time() if now is None else now)
        expired = self.store.expired_before(now)
        for rec in expired:
            self._expire(rec)
        if self.settings.purge_after_s is not None:
            purged = self.store.purge(now, self.settings.purge_after_s)
            for job_id in purged:
                self._remove_files(job_id)
            if purged:
                logger.info("video jobs: purged %d failed or expired jobs", len(purged))
        return len(expired)

    def remove_stray_files(self, now: float | None = None) -> int:
        """Remove temporary MP4s and MP4s no queued, running or completed job owns (a crash
        between writing and committing, a purge interrupted); returns how many were removed.

        Safe while other frontends run jobs on a shared media store: the folder is listed
        *before* the statuses are read (a job's row exists before its MP4 is written, so a file
        listed has its row), and a temporary file goes only once :meth:`MediaStore.stale` (older
        than the store's grace; at once on a store only this frontend uses)."""
        entries = self.media.list("videos")  # first: see above
        if not entries:
            return 0
        statuses = self.store.statuses()
        removed = 0
        for entry in entries:
            if entry.is_dir:
                continue
            if entry.temporary:
                stray = self.media.stale(entry, now)
            else:
                job_id = entry.name[:-len(".mp4")] if entry.name.endswith(".mp4") else None
                stray = job_id is None or statuses.get(job_id) not in (QUEUED, IN_PROGRESS, COMPLETED)
            if stray:
                self.media.remove(entry)
                removed += 1
        if removed:
            logger.warning("video jobs: removed %d temporary or orphaned files from %s", removed, self.media)
        return removed

    # ------------------------------------------------------------------ internals
    def _remove_files(self, job_id: str) -> None:
        """Remove job ``job_id``'s MP4 and the temporary files of it (``MediaStore.delete``:
        matched by exact name and prefix, never as a glob pattern; an id from an older store need
        not have :data:`JOB_ID`'s form, a name no key may have is left alone and logged)."""
        try:
            self.media.delete(f"videos/{job_id}.mp4")
        except InvalidMediaKey:
            logger.warning("video jobs: job id %r names no media file; nothing removed", job_id[:80])

    def _expiry(self, completed_at: int) -> int | None:
        r = self.settings.retention_s
        return None if r is None else math.ceil(completed_at + r)

    def _purge_at(self, failed_at: int) -> int | None:
        r = self.settings.purge_after_s
        return None if r is None else math.ceil(failed_at + r)

    def _store_failed(self, operation: str, exc: BaseException, delay: float | None) -> float:
        """Record and log a database error of ``operation``; returns the next backoff delay."""
        cfg = self.settings
        message = f"{type(exc).__name__}: {exc}"
        if self.store_error is None:
            self.store_error = {"operation": operation, "message": message,
                                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        else:
            self.store_error.update(operation=operation, message=message)
        self._on_store_error(operation)
        delay = cfg.db_retry_initial_s if delay is None else min(cfg.db_retry_max_s, delay * 2)
        logger.error("video jobs: %s failed (%s); retrying in %g s", operation, message, delay)
        return delay

    def _store_ok(self) -> None:
        if self.store_error is not None:
            logger.warning("video jobs: the job store answers again (it failed since %s)", self.store_error["since"])
            self.store_error = None

    async def _db(self, operation: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker thread, retried with backoff until it succeeds
        (or the task is cancelled): a job's state change is never dropped."""
        delay = None
        while True:
            try:
                result = await asyncio.to_thread(fn, *args, **kwargs)
            except self.store.errors as exc:
                delay = self._store_failed(operation, exc, delay)
                await asyncio.sleep(delay)
                continue
            self._store_ok()
            return result

    def _expire(self, rec: JobRecord) -> None:
        self._remove_files(rec.id)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.expires_at or time.time()))
        self.store.expire(rec.id, f"the video was removed after its retention period (expired at {when})")
        self._on_event(rec.id, EXPIRED)

    async def _sweep_loop(self) -> None:
        """The retention sweep every ``sweep_interval_s``; on a shared media store also the stray
        file sweep, at most once per the store's grace (frontends on a shared store may run for
        weeks: what a dead one left is removed without waiting for a restart)."""
        strays_at = time.monotonic()  # start() swept them
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                await asyncio.to_thread(self.sweep)
                if self.media.shared and time.monotonic() - strays_at >= self.media.sweep_grace_s:
                    strays_at = time.monotonic()
                    await asyncio.to_thread(self.remove_stray_files)
            except self.store.errors as exc:  # the next sweep tries again
                self._store_failed("sweep", exc, None)
            except Exception:
                logger.exception("video retention sweep failed")

    async def _dispatch(self) -> None:
        """Start queued jobs while fewer than ``max_running`` run. A database error is retried
        with backoff (and reported: :attr:`store_error`), never the end of the dispatcher. On a
        shared store it also wakes every ``poll_interval_s`` (jobs created on other frontends)
        and first takes over the jobs whose lease expired (:meth:`take_over`)."""
        delay = None
        poll = self.settings.poll_interval_s if self.store.shared else None
        while True:
            if delay is not None:
                await asyncio.sleep(delay)
            elif poll is None:
                await self._wake.wait()
            else:  # asyncio.wait, not wait_for: it never swallows stop()'s cancellation (see _next_event)
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({woken}, timeout=poll)
                finally:
                    woken.cancel()
            self._wake.clear()
            try:
                if self.store.shared:
                    await asyncio.to_thread(self.take_over)
                while len(self._running) < self.settings.max_running:
                    self._claim = claim = asyncio.ensure_future(asyncio.to_thread(self.store.next_queued))
                    try:
                        rec = await asyncio.shield(claim)  # cancelled: stop() settles the claim
                    except asyncio.CancelledError:
                        raise
                    except BaseException:
                        self._claim = None
                        raise
                    self._claim = None
                    if rec is None:
                        break
                    task = asyncio.create_task(self._run(rec), name=f"video-{rec.id}")
                    self._running[rec.id] = _Running(task)
            except Exception as exc:
                delay = self._store_failed("dispatch", exc, delay)
            else:
                delay = None
                self._store_ok()

    async def _renew_loop(self) -> None:
        """Shared store: every ``renew_interval_s``, renew the leases of the jobs running here;
        a job the renewal does not return (deleted on any frontend, or taken over after this
        frontend lost the database for longer than the lease) has its local run cancelled (the
        Triton stream ends, the denoiser stops at its next step; nothing more is written)."""
        while True:
            await asyncio.sleep(self.settings.renew_interval_s)
            ids = builtins.list(self._running)
            if not ids:
                continue
            try:
                ours = await asyncio.to_thread(self.store.renew, ids)
            except self.store.errors as exc:  # the next renewal tries again; writes stay owner-guarded
                self._store_failed("renew", exc, None)
                continue
            self._store_ok()
            for job_id in ids:
                running = self._running.get(job_id)
                if job_id not in ours and running is not None and not running.task.done():
                    logger.warning("video job %s is no longer this frontend's (deleted, or taken over by another "
                                   "frontend); its run here is stopped", job_id)
                    running.lost = True
                    running.task.cancel()

    async def _run(self, rec: JobRecord) -> None:
        req = rec.request
        if req is None:  # next_queued reads the stored request; a summary row cannot be run
            raise ValueError(f"video job {rec.id}: the record has no request")
        stall = self.settings.stall_timeout_s
        try:
            frames, progress = None, -1
            events = self.engine.generate_video(req.model, req.job, request_id=f"{rec.id}-{rec.attempts}")
            try:
                while True:
                    try:  # the stall watchdog: at most ``stall`` seconds per event
                        event = await _next_event(events, stall)
                    except StopAsyncIteration:
                        break
                    if event.frames is not None:
                        frames = event.frames
                    elif event.total and DENOISE_PROGRESS * event.step // event.total > progress:
                        # a committed (fsynced) row: off the loop, and only when the percentage rises
                        progress = DENOISE_PROGRESS * event.step // event.total
                        await self._progress(rec.id, progress)
            finally:
                await events.aclose()
            assert frames is not None
            frames = frames[: req.keep_frames]
            data = await asyncio.to_thread(encode_mp4, frames, req.fps)
            key = self.video_key(rec.id)
            await asyncio.to_thread(self.media.put, key, data)
            running = self._running.get(rec.id)
            if ((running is not None and running.deleted)
                    or await self._db("check", self.store.get, rec.id, with_request=False) is None):
                await asyncio.to_thread(self.media.delete, key)  # deleted while its MP4 was being written
                return
            if await self._db("complete", self.store.complete, rec.id, key, self._expiry(int(time.time())),
                              file_bytes=len(data)):
                self._on_event(rec.id, COMPLETED)
            else:  # shared store: taken over meanwhile (the same inputs and seed: the same MP4)
                logger.warning("video job %s: finished here but no longer this frontend's; not completed here",
                               rec.id)
        except asyncio.CancelledError:
            raise  # deleted (row removed by delete) or shutting down (resumed at the next start)
        # the watchdog (asyncio.TimeoutError is TimeoutError on 3.11+, its own class on 3.10): the stream
        # (and so the stage's request) is cancelled
        except asyncio.TimeoutError:
            logger.warning("video job %s: no event from %s for %g s; stopped", rec.id, req.model, stall)
            await self._fail(rec.id, "stalled", f"model {req.model} sent no progress for {stall:g} s "
                             f"(a stage may be stuck); the job was stopped: retry it")
        except InvalidRequestError as exc:
            await self._fail(rec.id, "invalid_request", exc.message if hasattr(exc, "message") else str(exc))
        except EngineError as exc:
            if rec.attempts < self.settings.max_attempts:
                logger.warning("video job %s: %s; queued again (attempt %d of %d)", rec.id, exc, rec.attempts,
                               self.settings.max_attempts)
                await asyncio.sleep(1.0)
                await self._db("requeue", self.store.requeue, rec.id)
            else:
                stage = dead_stage(str(exc))
                if stage is None:
                    await self._fail(rec.id, "generation_failed", str(exc))
                else:
                    logger.warning("video job %s failed: %s", rec.id, exc)  # the raw error, for operators
                    await self._fail(rec.id, "stage_died", f"stage {stage} died while this job ran (attempt "
                                     f"{rec.attempts} of {self.settings.max_attempts}); retry the job")
        except Exception as exc:
            logger.exception("video job %s failed", rec.id)
            await self._fail(rec.id, "internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            self._running.pop(rec.id, None)
            self._wake.set()

    async def _fail(self, job_id: str, code: str, message: str) -> None:
        """Fail the job (retried until the database takes it) and report the outcome."""
        now = int(time.time())
        await self._db("fail", self.store.fail, job_id, code, message, now=now, expires_at=self._purge_at(now))
        self._on_event(job_id, FAILED)

    async def _progress(self, job_id: str, progress: int) -> None:
        """Raise the job's progress; a database error skips this update (the next one, or the
        completion, catches up) instead of stopping the job."""
        try:
            await asyncio.to_thread(self.store.progress, job_id, progress)
        except self.store.errors as exc:
            self._store_failed("progress", exc, None)
        else:
            self._store_ok()
