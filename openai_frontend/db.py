"""The frontend's shared database: URL, PostgreSQL connection pool and schema migrations.

Without a database URL (the default) each store keeps its own SQLite file in its storage folder
(``jobs.sqlite3``, ``voices.sqlite``), exactly as before the scale-out issue: zero set-up, one
frontend per folder (:mod:`openai_frontend.storage_lock`).

With ``--database-url`` (or env :data:`ENV`) = ``postgresql://user[:pw]@host:port/db`` (or
``postgresql:///db?host=/socket/dir&port=N``, libpq's own URL forms) the video jobs and the
voice/consent metadata of every frontend live in that one PostgreSQL database
(:class:`openai_frontend.video_jobs.PostgresJobStore`,
:class:`openai_frontend.voice_store.PostgresVoiceMeta`), reached through one psycopg 3
connection pool per process (:class:`Database`). Several frontends share the queue: jobs are
claimed with ``SELECT ... FOR UPDATE SKIP LOCKED`` and held by a lease.

Migrations: :data:`MIGRATIONS` are numbered; :func:`migrate` applies the ones a database lacks,
in order, in ONE transaction that first takes ``pg_advisory_xact_lock(MIGRATION_LOCK)``, and
records each in ``schema_migrations(version, name, applied_at)``. Several frontends starting at
once therefore queue on the lock; the first applies, the others find every version recorded.
A migration is never edited once released: a schema change is a new, higher version.

No ORM: every statement is plain SQL in the store that runs it (psycopg's ``%s`` parameters).
psycopg is imported only when a database URL is given, so a SQLite frontend does not load it.
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

logger = logging.getLogger(__name__)

#: environment variable read when ``--database-url`` is not given
ENV = "OMNI_TRITON_DATABASE_URL"
SCHEMES = ("postgresql", "postgres")

#: ``pg_advisory_xact_lock`` keys (bigint; arbitrary but fixed, "omni" in ASCII + a number):
#: the migrations, the video-job quota check + insert, the voice/consent quota check + insert.
MIGRATION_LOCK = 0x6F6D6E69_0001
VIDEO_QUOTA_LOCK = 0x6F6D6E69_0002
VOICE_QUOTA_LOCK = 0x6F6D6E69_0003


class DatabaseError(RuntimeError):
    """The database cannot be used at start (bad URL, unreachable, a migration failed). The
    message names the URL without its password."""


def database_url(arg: str | None) -> str | None:
    """The database URL to use: ``arg`` (``--database-url``), else env :data:`ENV`, else None
    (SQLite files, the default). An empty string counts as not given.

    Raises:
        DatabaseError: the URL is not a ``postgresql://`` / ``postgres://`` URL.
    """
    url = arg or os.environ.get(ENV) or None
    if url is None:
        return None
    if urlsplit(url).scheme not in SCHEMES:
        raise DatabaseError(f"--database-url / {ENV}: {redact(url)!r} is not a PostgreSQL URL "
                            f"(postgresql://user:password@host:5432/db or "
                            f"postgresql:///db?host=/socket/dir&port=5432); leave it unset for SQLite files")
    return url


def default_frontend_id() -> str:
    """``<hostname>-<pid>``: the owner a frontend writes into its job leases unless
    ``--frontend-id`` names it (it must differ between frontends that run at the same time)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Migration:
    """One schema step: ``version`` (its order; unique, never reused), a short ``name`` and the
    ``sql`` (one or more statements, run in the migration transaction)."""

    version: int
    name: str
    sql: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "video jobs", """
        CREATE TABLE video_jobs (
            seq BIGSERIAL PRIMARY KEY,
            id TEXT UNIQUE NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL,
            progress INTEGER NOT NULL DEFAULT 0,
            created_at BIGINT NOT NULL,
            started_at BIGINT,
            completed_at BIGINT,
            expires_at BIGINT,
            size TEXT NOT NULL,
            seconds TEXT NOT NULL,
            prompt TEXT NOT NULL,
            request TEXT NOT NULL,
            error TEXT,
            attempts INTEGER NOT NULL DEFAULT 0,
            file TEXT,
            bytes BIGINT NOT NULL DEFAULT 0,
            owner TEXT,
            lease_expires_at TIMESTAMPTZ
        );
        CREATE INDEX video_jobs_status ON video_jobs (status, seq);
    """),
    Migration(2, "voices and consents", """
        CREATE TABLE voices (
            seq BIGSERIAL PRIMARY KEY,
            id TEXT UNIQUE NOT NULL,
            name TEXT NOT NULL CONSTRAINT voices_name_unique UNIQUE,
            type TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            prompt TEXT,
            ref_text TEXT,
            consent TEXT,
            sample_rate INTEGER,
            seconds DOUBLE PRECISION,
            prompt_sha256 TEXT,
            clip_sha256 TEXT,
            bytes BIGINT NOT NULL DEFAULT 0
        );
        CREATE TABLE voice_consents (
            seq BIGSERIAL PRIMARY KEY,
            id TEXT UNIQUE NOT NULL,
            name TEXT NOT NULL,
            language TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            file TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            bytes BIGINT NOT NULL DEFAULT 0
        );
    """),
)


def check_migrations(migrations: Sequence[Migration]) -> None:
    """Raise ValueError unless the versions are unique, positive and in increasing order."""
    versions = [m.version for m in migrations]
    if any(v <= 0 for v in versions) or versions != sorted(set(versions)):
        raise ValueError(f"migration versions must be positive, unique and increasing: {versions}")


def migrate(conn: psycopg.Connection[Any], migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Apply the ``migrations`` the database lacks, in order, in one transaction under
    ``pg_advisory_xact_lock(MIGRATION_LOCK)`` (concurrent callers wait, then find them applied).
    ``conn`` must not be in a transaction. Returns the versions applied by this call.

    Raises:
        ValueError: ``migrations`` are not ordered (:func:`check_migrations`).
        psycopg.Error: a statement failed; nothing of this call is kept (the transaction rolls back).
    """
    check_migrations(migrations)
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                     "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        have = {int(r[0]) for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
        for m in migrations:
            if m.version in have:
                continue
            conn.execute(m.sql)  # several statements: allowed without parameters
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (m.version, m.name))
            applied.append(m.version)
        newer = sorted(v for v in have if v > max((m.version for m in migrations), default=0))
    if applied:
        logger.info("database: applied migrations %s", applied)
    if newer:
        logger.warning("database: it has migrations %s this frontend does not know (a newer frontend "
                       "migrated it); continuing with the tables it knows", newer)
    return applied


class Database:
    """A psycopg 3 connection pool to one PostgreSQL database, migrated when opened; thread-safe
    (the stores call it from worker threads, never from the event loop).

    ``connection()`` lends a connection for one transaction: committed at the end of the
    ``with`` block, rolled back if it raises. Broken connections (a database restart) are
    checked and replaced when lent (``ConnectionPool.check_connection``).

    Args:
        url: a libpq URL (:func:`database_url`).
        min_size / max_size: pooled connections (the dispatcher, the lease renewals, the sweeps
            and the API's worker threads share them; a call waits for a free one at most
            ``timeout_s`` seconds, then raises ``psycopg_pool.PoolTimeout``).
        migrations: applied at open (:func:`migrate`).

    Raises (at construction):
        DatabaseError: the database cannot be reached within ``connect_timeout_s`` or a migration
            failed (the message names the URL without its password).
    """

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, timeout_s: float = 10.0,
                 connect_timeout_s: float = 15.0, migrations: Sequence[Migration] = MIGRATIONS):
        import psycopg
        from psycopg_pool import ConnectionPool

        self.url = url
        #: what the stores' callers catch as "the database failed" (retried with backoff)
        self.errors: tuple[type[BaseException], ...] = (psycopg.Error, OSError)
        #: the database cannot be reached (connection lost, no pooled connection in time): an API
        #: call failing so is a 503 ``store_unavailable`` (errors.install_store_unavailable_handler)
        self.unavailable_errors: tuple[type[Exception], ...] = (psycopg.OperationalError,)
        self.pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url, min_size=min_size, max_size=max_size, timeout=timeout_s, open=False,
            check=ConnectionPool.check_connection, name="omni-frontend")
        try:
            self.pool.open(wait=True, timeout=connect_timeout_s)
            with self.pool.connection() as conn:
                conn.autocommit = True  # migrate() opens its own transaction
                try:
                    migrate(conn, migrations)
                finally:
                    conn.autocommit = False
        except psycopg.Error as exc:
            self.pool.close()
            raise DatabaseError(f"the database {redact(url)} cannot be used: {type(exc).__name__}: {exc}") from exc
        logger.info("database: %s (PostgreSQL), migrated", redact(url))

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one transaction (commit at the end, rollback on an error)."""
        with self.pool.connection() as conn:
            yield conn

    def close(self) -> None:
        """Close the pool (idempotent)."""
        self.pool.close()
