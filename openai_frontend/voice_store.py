"""Durable custom voices and consent recordings (``/v1/audio/voices``, ``/v1/audio/voice_consents``).

One SQLite file (``voices.sqlite``, WAL, ``synchronous=FULL``) holds the metadata (or the shared
PostgreSQL database of ``--database-url``: :class:`PostgresVoiceMeta`); the files are
in the media store (:class:`openai_frontend.media_store.MediaStore`: the storage folder by
default, ``--media-url`` when set). Each uploaded voice owns a folder ``voices/<id>/`` with its
clip (``clip.wav``, float32 mono at ``VoiceSettings.sample_rate``) and the clone prompt the
``qwen3_tts_voice_prompt`` model computed once at upload (``voice_prompt.bin``, opaque bytes sent
back as ``VOICE_PROMPT``). A consent recording is ``consents/<id>.<ext>``.

Nothing is half-written: each file of a voice is written all-or-nothing (``MediaStore.put``:
temp file, fsync, rename on a local folder; one PUT on an object store) *before* its row is
committed; a failed write or insert (duplicate name) removes the voice's folder again. At start,
temporary files and folders, and folders / recordings without a row (a crash between the writes
and the commit) are removed; on a shared ``--media-url`` only once they are older than the media
store's grace (another frontend may be uploading them: :mod:`openai_frontend.media_store`). A
row whose files are missing or no longer match their SHA-256 is *corrupt*: listed with an
``error``, refused on use (:class:`VoiceCorruptError`, a 409), never a crash.

Limits (:class:`VoiceSettings`): at most ``max_voices`` voices, ``max_consents`` consent
recordings and ``max_stored_bytes`` bytes of clips, prompts and recordings together; a designed
voice's ``prompt`` has at most ``max_prompt_chars`` characters. Each is checked before anything
is written (:meth:`VoiceStore.check_quota`) and again in the transaction that commits the row, so
concurrent uploads cannot pass it together (:class:`QuotaExceededError`, a 400 ``quota_exceeded``).

One process per folder: the store holds ``<storage_dir>/frontend.lock``
(:mod:`openai_frontend.storage_lock`) from before its start-up sweep until :meth:`VoiceStore.close`
(and that of an explicit local ``--media-url`` folder: its orphans are judged by this store's rows).

The metadata sits behind :class:`VoiceMeta`: :class:`SqliteVoiceMeta` (the file above, the
default) or :class:`PostgresVoiceMeta` (``--database-url``: one database several frontends
share; names unique by constraint, the limits checked in the committing transaction under an
advisory lock). With a shared database no folder lock is taken; the start-up sweep stays safe
beside other frontends (``MediaStore.stale``: a folder another frontend is committing is young).
"""
from __future__ import annotations

import hashlib
import io
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from .media_store import InvalidMediaKey, MediaStore
from .storage_lock import lock_unless_shared

if TYPE_CHECKING:
    from .db import Database

logger = logging.getLogger(__name__)

AUDIO_SAMPLE, PROMPT = "audio_sample", "prompt"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    name TEXT UNIQUE NOT NULL,
    type TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    prompt TEXT,
    ref_text TEXT,
    consent TEXT,
    sample_rate INTEGER,
    seconds REAL,
    prompt_sha256 TEXT,
    clip_sha256 TEXT,
    bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS consents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    name TEXT NOT NULL,
    language TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    file TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    bytes INTEGER NOT NULL DEFAULT 0
);
"""
#: columns added after the first release: (table, column, definition, how old rows are filled)
_MIGRATIONS = (("voices", "bytes", "INTEGER NOT NULL DEFAULT 0",
                "UPDATE voices SET bytes = length(CAST(prompt AS BLOB)) WHERE prompt IS NOT NULL"),
               ("consents", "bytes", "INTEGER NOT NULL DEFAULT 0", None))

CLIP_FILE, PROMPT_FILE = "clip.wav", "voice_prompt.bin"


@dataclass
class VoiceSettings:
    """Voice store knobs.

    storage_dir: folder of ``voices.sqlite`` and the files (created if missing).
    min_seconds / max_seconds: accepted clip length after decoding (400 outside).
    max_upload_bytes: largest ``audio_sample`` / ``recording`` part (413 beyond; OpenAI: 10 MiB).
    sample_rate: Hz clips are resampled to (soxr) before the prompt is computed and stored.
    require_consent: an ``audio_sample`` voice needs ``consent``, the id of a stored consent
        recording (OpenAI's rule); False accepts any non-empty or missing consent (vLLM-Omni).
    max_voices: stored voices at most (400 ``quota_exceeded`` beyond).
    max_consents: stored consent recordings at most (400 ``quota_exceeded`` beyond).
    max_stored_bytes: bytes of voice clips, clone prompts, designed-voice prompts and consent
        recordings together (400 ``quota_exceeded`` when one more would pass it).
    max_prompt_chars: characters of a designed voice's ``prompt`` (400 ``prompt_too_long``).
    """

    storage_dir: Path
    min_seconds: float = 1.0
    max_seconds: float = 30.0
    max_upload_bytes: int = 10 << 20
    sample_rate: int = 24000
    require_consent: bool = True
    max_voices: int = 1000
    max_consents: int = 1000
    max_stored_bytes: int = 2 << 30
    max_prompt_chars: int = 4096


@dataclass(frozen=True)
class StoredVoice:
    """One stored voice. ``type``: ``audio_sample`` (a clone: clip + prompt) or ``prompt`` (a
    designed voice: ``prompt`` is its description). ``error``: why the entry is unusable, or None."""

    id: str
    name: str
    type: str
    created_at: int
    prompt: str | None = None
    ref_text: str | None = None
    consent: str | None = None
    sample_rate: int | None = None
    seconds: float | None = None
    error: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``audio.voice`` object plus the extensions ``ref_text``, ``consent``,
        ``seconds`` and ``error`` (only when set)."""
        out = {"id": self.id, "object": "audio.voice", "name": self.name, "type": self.type,
               "created_at": self.created_at}
        for key in ("prompt", "ref_text", "consent", "seconds", "error"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class StoredConsent:
    id: str
    name: str
    language: str
    created_at: int

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``audio.voice_consent`` object."""
        return {"id": self.id, "object": "audio.voice_consent", "name": self.name,
                "language": self.language, "created_at": self.created_at}


class VoiceStoreError(Exception):
    """Base of the store's errors (the serving layer maps them to OpenAI errors)."""


class DuplicateVoiceName(VoiceStoreError):
    """A voice with that name exists already."""


class VoiceCorruptError(VoiceStoreError):
    """The voice's files are missing or do not match what was stored."""


class QuotaExceededError(VoiceStoreError):
    """Storing one more item would pass a :class:`VoiceSettings` limit.

    Attributes:
        limit: the setting's name (``max_voices``, ``max_consents``, ``max_stored_bytes``).
    """

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _voice_key(voice_id: str, fname: str = "") -> str:
    """The media key ``voices/<id>/<fname>`` (``voices/<id>`` without ``fname``); the media store
    refuses it (``InvalidMediaKey``) when ``voice_id`` is no plain key segment (a row edited
    outside the frontend)."""
    return f"voices/{voice_id}/{fname}" if fname else f"voices/{voice_id}"


def encode_clip(samples: NDArray[Any], sample_rate: int) -> bytes:
    """float32 mono [T] -> WAV bytes (FLOAT subtype: lossless)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.asarray(samples, np.float32), sample_rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


#: quota callback of an insert: (voices, consents, stored bytes) -> the error, or None to insert
QuotaCheck = Callable[[tuple[int, int, int]], "QuotaExceededError | None"]


class VoiceMeta(Protocol):
    """The metadata (rows) behind :class:`VoiceStore`; two backends: :class:`SqliteVoiceMeta`
    (``voices.sqlite`` in the storage folder, the default) and :class:`PostgresVoiceMeta` (the
    shared database of ``--database-url``). Rows are tuples in the column order of
    :attr:`VoiceStore._COLUMNS` (voices) and ``(id, name, language, created_at)`` (consents).
    Blocking calls; thread-safe.

    Attributes:
        shared: several frontends use it at once (no folder lock, no orphan-folder sweep).
        errors: the exception types meaning "the database failed".
    """

    shared: bool
    errors: tuple[type[BaseException], ...]

    def close(self) -> None: ...
    def usage(self) -> tuple[int, int, int]: ...

    def insert_voice(self, row: tuple[Any, ...], nbytes: int, quota: QuotaCheck) -> None:
        """Insert a voice row if ``quota(usage)`` is None, in one transaction with the count.
        Raises the quota's error, or DuplicateVoiceName (the name is taken, by constraint)."""

    def insert_consent(self, row: tuple[Any, ...], quota: QuotaCheck) -> None:
        """Insert ``(id, name, language, created_at, file, sha256, bytes)`` like :meth:`insert_voice`."""

    def voice_ids(self) -> set[str]: ...
    def consent_files(self) -> set[str]: ...
    def voice_rows(self) -> list[tuple[Any, ...]]: ...
    def voice_row(self, key: str) -> tuple[Any, ...] | None: ...
    def name_taken(self, name: str) -> bool: ...
    def count_voices(self) -> int: ...
    def prompt_sha256(self, voice_id: str) -> tuple[str | None] | None: ...
    def delete_voice(self, voice_id: str) -> None: ...
    def consent(self, cid: str) -> tuple[Any, ...] | None: ...
    def consents(self, after: str | None, limit: int) -> list[tuple[Any, ...]]: ...
    def rename_consent(self, cid: str, name: str) -> None: ...
    def delete_consent(self, cid: str) -> str | None:
        """Delete the consent row; its file name, or None when there was none."""


class _SqlVoiceMeta:
    """The SQL both backends share, written with ``?`` parameters (PostgreSQL's ``%s`` are
    substituted); the backends provide the connection handling and the quota transaction."""

    _consents = "consents"  # the table of consent recordings
    _COLUMNS = ("id, name, type, created_at, prompt, ref_text, consent, sample_rate, seconds, prompt_sha256, "
                "clip_sha256")

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        raise NotImplementedError

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        rows = self._all(sql, args)
        return rows[0] if rows else None

    def _usage_sql(self) -> str:
        consents = self._consents
        return (f"SELECT (SELECT COUNT(*) FROM voices), (SELECT COUNT(*) FROM {consents}), "
                f"(SELECT COALESCE(SUM(bytes), 0) FROM voices) + (SELECT COALESCE(SUM(bytes), 0) FROM {consents})")

    def usage(self) -> tuple[int, int, int]:
        """(voices, consents, stored bytes of both)."""
        row = self._one(self._usage_sql())
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def _voice_insert_sql(self) -> str:
        return f"INSERT INTO voices ({self._COLUMNS}, bytes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"

    def _consent_insert_sql(self) -> str:
        return (f"INSERT INTO {self._consents} (id, name, language, created_at, file, sha256, bytes) "
                f"VALUES (?,?,?,?,?,?,?)")

    def voice_ids(self) -> set[str]:
        return {str(r[0]) for r in self._all("SELECT id FROM voices")}

    def consent_files(self) -> set[str]:
        return {str(r[0]) for r in self._all(f"SELECT file FROM {self._consents}")}

    def voice_rows(self) -> list[tuple[Any, ...]]:
        return self._all(f"SELECT {self._COLUMNS} FROM voices ORDER BY seq")

    def voice_row(self, key: str) -> tuple[Any, ...] | None:
        """The row whose id, else whose name, is ``key``."""
        row = self._one(f"SELECT {self._COLUMNS} FROM voices WHERE id = ?", (key,))
        return row if row is not None else self._one(f"SELECT {self._COLUMNS} FROM voices WHERE name = ?", (key,))

    def name_taken(self, name: str) -> bool:
        return self._one("SELECT 1 FROM voices WHERE name = ?", (name,)) is not None

    def count_voices(self) -> int:
        row = self._one("SELECT COUNT(*) FROM voices")
        return int(row[0]) if row else 0

    def prompt_sha256(self, voice_id: str) -> tuple[str | None] | None:
        """``(prompt_sha256,)`` of the voice, or None when there is no such row."""
        row = self._one("SELECT prompt_sha256 FROM voices WHERE id = ?", (voice_id,))
        return (row[0],) if row is not None else None

    def delete_voice(self, voice_id: str) -> None:
        self._exec("DELETE FROM voices WHERE id = ?", (voice_id,))

    def consent(self, cid: str) -> tuple[Any, ...] | None:
        return self._one(f"SELECT id, name, language, created_at FROM {self._consents} WHERE id = ?", (cid,))

    def consents(self, after: str | None, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` consent rows after the id ``after`` (oldest first).

        Raises:
            KeyError: ``after`` names no consent (as ``/v1/videos?after=``: a 400)."""
        seq = 0
        if after:
            row = self._one(f"SELECT seq FROM {self._consents} WHERE id = ?", (after,))
            if row is None:
                raise KeyError(after)
            seq = int(row[0])
        return self._all(f"SELECT id, name, language, created_at FROM {self._consents} WHERE seq > ? "
                         f"ORDER BY seq LIMIT ?", (seq, limit))

    def rename_consent(self, cid: str, name: str) -> None:
        self._exec(f"UPDATE {self._consents} SET name = ? WHERE id = ?", (name, cid))


class SqliteVoiceMeta(_SqlVoiceMeta):
    """The metadata in ``voices.sqlite`` (WAL, ``synchronous=FULL``): one connection behind a
    lock, schema created and old stores migrated (:data:`_MIGRATIONS`) when opened.

    Raises (at construction):
        sqlite3.DatabaseError, OSError: the file cannot be opened.
    """

    shared = False
    errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)

    def __init__(self, path: Path):
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _migrate(self) -> None:
        """Add the columns a store written by an older frontend lacks (:data:`_MIGRATIONS`)."""
        for table, column, definition, fill in _MIGRATIONS:
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
                if fill:
                    self._db.execute(fill)

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return [tuple(r) for r in self._db.execute(sql, args).fetchall()]

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        with self._lock:
            self._db.execute(sql, args)

    def _insert_within_quota(self, quota: QuotaCheck, sql: str, args: tuple[Any, ...]) -> None:
        """Run the INSERT ``sql`` in one transaction with the quota check (concurrent uploads
        cannot pass a limit together).

        Raises:
            QuotaExceededError: nothing was inserted.
            sqlite3.IntegrityError: a UNIQUE column is taken.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(self._usage_sql()).fetchone()
                error = quota((int(row[0]), int(row[1]), int(row[2])))
                if error is None:
                    self._db.execute(sql, args)
                self._db.execute("ROLLBACK" if error else "COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if error is not None:
            raise error

    def insert_voice(self, row: tuple[Any, ...], nbytes: int, quota: QuotaCheck) -> None:
        try:
            self._insert_within_quota(quota, self._voice_insert_sql(), (*row, nbytes))
        except sqlite3.IntegrityError as exc:
            raise DuplicateVoiceName(str(row[1])) from exc

    def insert_consent(self, row: tuple[Any, ...], quota: QuotaCheck) -> None:
        self._insert_within_quota(quota, self._consent_insert_sql(), row)

    def delete_consent(self, cid: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT file FROM consents WHERE id = ?", (cid,)).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM consents WHERE id = ?", (cid,))
        return str(row[0])


class PostgresVoiceMeta(_SqlVoiceMeta):
    """The metadata in the shared PostgreSQL database (tables ``voices`` and ``voice_consents``
    of :data:`openai_frontend.db.MIGRATIONS`): names unique by the ``voices_name_unique``
    constraint, the quotas counted and checked in the inserting transaction under
    ``pg_advisory_xact_lock(VOICE_QUOTA_LOCK)`` (uploads on several frontends cannot pass a
    limit together).

    Args:
        db: the pool (:class:`openai_frontend.db.Database`, migrated); not closed by :meth:`close`.
    """

    shared = True
    _consents = "voice_consents"

    def __init__(self, db: Database):
        self.db = db
        self.errors = db.errors

    def close(self) -> None:
        """Nothing to close: the pool belongs to the app (it also serves the video jobs)."""

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("?", "%s")  # no literal '?' in this module's SQL

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.db.connection() as conn:
            cur = conn.execute(self._sql(sql), args)
            return [tuple(r) for r in cur.fetchall()] if cur.description is not None else []

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        with self.db.connection() as conn:
            conn.execute(self._sql(sql), args)

    def _insert_within_quota(self, quota: QuotaCheck, sql: str, args: tuple[Any, ...]) -> None:
        from .db import VOICE_QUOTA_LOCK

        with self.db.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (VOICE_QUOTA_LOCK,))
            row = conn.execute(self._usage_sql()).fetchone()
            assert row is not None
            error = quota((int(row[0]), int(row[1]), int(row[2])))
            if error is not None:
                raise error  # rolled back: nothing inserted
            conn.execute(self._sql(sql), args)

    def insert_voice(self, row: tuple[Any, ...], nbytes: int, quota: QuotaCheck) -> None:
        from psycopg.errors import UniqueViolation

        try:
            self._insert_within_quota(quota, self._voice_insert_sql(), (*row, nbytes))
        except UniqueViolation as exc:
            raise DuplicateVoiceName(str(row[1])) from exc

    def insert_consent(self, row: tuple[Any, ...], quota: QuotaCheck) -> None:
        self._insert_within_quota(quota, self._consent_insert_sql(), row)

    def delete_consent(self, cid: str) -> str | None:
        rows = self._all("DELETE FROM voice_consents WHERE id = ? RETURNING file", (cid,))
        return str(rows[0][0]) if rows else None


class VoiceStore:
    """The voice files in ``media`` (default: ``settings.storage_dir``) and their metadata
    (``meta``: default :class:`SqliteVoiceMeta` in ``voices.sqlite`` there;
    :class:`PostgresVoiceMeta` with ``--database-url``). Thread-safe; calls are short and blocking
    (the serving layer runs them in worker threads).

    Raises (at construction):
        StorageLockedError: another process has the folder (or the explicit local ``media``
            folder) open (:mod:`openai_frontend.storage_lock`; not taken with a shared ``meta``).
        sqlite3.DatabaseError, OSError: the database or the folder cannot be opened.
    """

    #: the voice columns in the order of a :class:`VoiceMeta` row
    _COLUMNS = _SqlVoiceMeta._COLUMNS

    def __init__(self, settings: VoiceSettings, meta: VoiceMeta | None = None, media: MediaStore | None = None):
        self.settings = settings
        self.root = Path(settings.storage_dir)
        #: True when the metadata is in a database several frontends share: no folder lock (the
        #: start-up sweep is safe beside them: MediaStore.stale)
        self.shared = meta.shared if meta is not None else SqliteVoiceMeta.shared
        self._folder_lock = lock_unless_shared(self.root, self.shared)  # before the sweep below
        self._media_lock = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.media = media if media is not None else MediaStore(self.root)
            if self.media.shared and self.media.local:  # orphans are judged by this store's rows
                self._media_lock = lock_unless_shared(Path(self.media.root), self.shared)
            for prefix in ("voices", "consents"):
                self.media.makedirs(prefix)
            #: files whose checksum was verified: key -> (version, sha256), the version being the
            #: media store's (size, mtime, inode / ETag); a listing reads each file's info and
            #: hashes it again only when it changed (not every clip on every GET)
            self._verified: dict[str, tuple[tuple[Any, ...], str]] = {}
            self.meta: VoiceMeta = meta if meta is not None else SqliteVoiceMeta(self.root / "voices.sqlite")
            self._sweep()
        except BaseException:
            for lock in (self._media_lock, self._folder_lock):
                if lock is not None:
                    lock.release()
            raise

    def close(self) -> None:
        """Close the database and release the folder lock(s)."""
        self.meta.close()
        for lock in (self._media_lock, self._folder_lock):
            if lock is not None:
                lock.release()

    # ------------------------------------------------------------------ limits
    def _quota_error(self, kind: str, new_bytes: int,
                     usage: tuple[int, int, int] | None = None) -> QuotaExceededError | None:
        """Why one more ``kind`` (``voice`` / ``consent``) of ``new_bytes`` cannot be stored
        next to ``usage`` (voices, consents, bytes; default: read now), or None."""
        cfg = self.settings
        voices, consents, stored = usage if usage is not None else self.meta.usage()
        if kind == "voice" and voices >= cfg.max_voices:
            return QuotaExceededError("max_voices", f"At most {cfg.max_voices} voices can be stored; "
                                      "delete one first")
        if kind == "consent" and consents >= cfg.max_consents:
            return QuotaExceededError("max_consents", f"At most {cfg.max_consents} consent recordings can be "
                                      "stored; delete one first")
        if stored + new_bytes > cfg.max_stored_bytes:
            return QuotaExceededError("max_stored_bytes", f"The voice store holds {stored} bytes; {new_bytes} "
                                      f"more would pass its limit of {cfg.max_stored_bytes}; delete voices or "
                                      "consent recordings first")
        return None

    def check_quota(self, kind: str, new_bytes: int = 0) -> None:
        """Raise if one more ``kind`` (``"voice"`` or ``"consent"``) of ``new_bytes`` bytes would
        pass a limit (the serving layer calls it before decoding or writing anything; the insert
        checks again atomically).

        Raises:
            QuotaExceededError: naming the limit.
        """
        error = self._quota_error(kind, new_bytes)
        if error is not None:
            raise error

    def _quota(self, kind: str, new_bytes: int) -> QuotaCheck:
        """The check the metadata runs in the transaction that commits the row."""
        return lambda usage: self._quota_error(kind, new_bytes, usage)

    # ------------------------------------------------------------------ start-up
    def _sweep(self, now: float | None = None) -> None:
        """Remove temporary folders/files and voice folders / consent recordings no row owns (a
        crash between the writes and the commit); rows without files stay and are reported
        corrupt. The folders are listed *before* the rows are read, and on a shared media store
        an entry goes only once ``MediaStore.stale`` (an upload in flight on another frontend has
        its files before its row)."""
        voices, consents = self.media.list("voices"), self.media.list("consents")
        ids = self.meta.voice_ids()
        files = self.meta.consent_files()
        for entry in voices:
            if (entry.temporary or (entry.is_dir and entry.name not in ids)) and self.media.stale(entry, now):
                logger.warning("voice store: removing unfinished or orphaned %s", entry.key)
                self.media.remove(entry)
        for entry in consents:
            if (entry.temporary or entry.name not in files) and self.media.stale(entry, now):
                logger.warning("voice store: removing unfinished or orphaned %s", entry.key)
                self.media.remove(entry)

    # ------------------------------------------------------------------ voices
    def _row_to_voice(self, row: tuple[Any, ...]) -> StoredVoice:
        (vid, name, vtype, created_at, prompt, ref_text, consent, sample_rate, seconds, prompt_sha,
         clip_sha) = row
        try:
            voice = StoredVoice(id=str(vid), name=str(name), type=str(vtype), created_at=int(created_at),
                                prompt=prompt, ref_text=ref_text, consent=consent,
                                sample_rate=int(sample_rate) if sample_rate is not None else None,
                                seconds=float(seconds) if seconds is not None else None)
        except (TypeError, ValueError) as exc:  # a row edited or damaged outside the frontend
            return StoredVoice(id=str(vid), name=str(name), type=str(vtype), created_at=0,
                               error=f"unreadable entry ({exc})")
        error = self._check(voice, prompt_sha, clip_sha)
        if error:
            voice = StoredVoice(**{**voice.__dict__, "error": error})
        return voice

    def _check(self, voice: StoredVoice, prompt_sha: str | None, clip_sha: str | None) -> str | None:
        """Why ``voice`` cannot be used (missing/altered files, bad row), or None."""
        if voice.type == PROMPT:
            return None if voice.prompt and voice.prompt.strip() else "designed voice without a prompt"
        if voice.type != AUDIO_SAMPLE:
            return f"unknown voice type {voice.type!r}"
        for fname, sha in ((PROMPT_FILE, prompt_sha), (CLIP_FILE, clip_sha)):
            try:
                key = _voice_key(voice.id, fname)
                entry = self.media.info(key)
                if entry is None:
                    return f"{fname} is missing"
                if self._verified.get(key) == (entry.version, sha):
                    continue
                data = self.media.get(key)
            except InvalidMediaKey:
                return f"unreadable entry (id {voice.id[:80]!r})"
            except OSError as exc:  # FileNotFoundError (removed meanwhile) included
                return f"{fname} is missing" if isinstance(exc, FileNotFoundError) else f"{fname} is unreadable ({exc})"
            if sha is None or _sha256(data) != sha:
                return f"{fname} does not match its checksum"
            self._verified[key] = (entry.version, sha)
        return None

    def list_voices(self) -> list[StoredVoice]:
        """Every stored voice, oldest first (corrupt ones with ``error`` set)."""
        return [self._row_to_voice(r) for r in self.meta.voice_rows()]

    def get(self, key: str) -> StoredVoice | None:
        """The voice whose id or name is ``key`` (id first), or None."""
        row = self.meta.voice_row(key)
        return self._row_to_voice(row) if row else None

    def name_taken(self, name: str) -> bool:
        return self.meta.name_taken(name)

    def count(self) -> int:
        return self.meta.count_voices()

    def voice_prompt(self, voice: StoredVoice) -> bytes:
        """The stored clone prompt of an ``audio_sample`` voice.

        Raises:
            VoiceCorruptError: the entry is corrupt (``voice.error``) or its file changed since.
        """
        if voice.error:
            raise VoiceCorruptError(voice.error)
        try:
            data = self.media.get(_voice_key(voice.id, PROMPT_FILE)) if voice.type == AUDIO_SAMPLE else b""
        except (OSError, InvalidMediaKey) as exc:
            raise VoiceCorruptError(f"{PROMPT_FILE} is unreadable ({getattr(exc, 'strerror', None) or exc})") from None
        row = self.meta.prompt_sha256(voice.id)
        if row is None or _sha256(data) != row[0]:
            raise VoiceCorruptError(f"{PROMPT_FILE} does not match its checksum")
        return data

    def add_clip(self, name: str, clip: NDArray[Any], sample_rate: int, voice_prompt: bytes,
                 ref_text: str | None, consent: str | None, seconds: float | None = None) -> StoredVoice:
        """Store a cloned voice: ``clip`` (float32 mono [T] at ``sample_rate`` Hz) and its
        ``voice_prompt`` bytes: both files written (each all-or-nothing), then the row committed.

        Raises:
            DuplicateVoiceName: ``name`` is taken (no file is left).
            QuotaExceededError: a limit would be passed (no file is left).
            OSError: the media store failed (no file is left).
        """
        vid = "voice_" + secrets.token_hex(12)
        clip_bytes = encode_clip(clip, sample_rate)
        self.check_quota("voice", len(clip_bytes) + len(voice_prompt))
        folder = _voice_key(vid)
        try:
            self.media.put(_voice_key(vid, CLIP_FILE), clip_bytes)
            self.media.put(_voice_key(vid, PROMPT_FILE), voice_prompt)
        except BaseException:
            self.media.delete_prefix(folder)
            raise
        voice = StoredVoice(id=vid, name=name, type=AUDIO_SAMPLE, created_at=int(time.time()),
                            ref_text=ref_text or None, consent=consent or None, sample_rate=sample_rate,
                            seconds=round(float(seconds if seconds is not None else len(clip) / sample_rate), 3))
        try:
            self._insert(voice, _sha256(voice_prompt), _sha256(clip_bytes), len(clip_bytes) + len(voice_prompt))
        except BaseException:
            self.media.delete_prefix(folder)
            raise
        return voice

    def add_design(self, name: str, prompt: str) -> StoredVoice:
        """Store a designed voice (a description, used as Qwen3-TTS VoiceDesign ``INSTRUCTIONS``).

        Raises:
            DuplicateVoiceName: ``name`` is taken.
            QuotaExceededError: a limit would be passed, or ``prompt`` has more than
                ``max_prompt_chars`` characters (limit ``max_prompt_chars``).
        """
        if len(prompt) > self.settings.max_prompt_chars:
            raise QuotaExceededError("max_prompt_chars", f"'prompt' has {len(prompt)} characters; at most "
                                     f"{self.settings.max_prompt_chars} are accepted")
        voice = StoredVoice(id="voice_" + secrets.token_hex(12), name=name, type=PROMPT,
                            created_at=int(time.time()), prompt=prompt)
        self._insert(voice, None, None, len(prompt.encode("utf-8", "surrogatepass")))
        return voice

    def _insert(self, v: StoredVoice, prompt_sha: str | None, clip_sha: str | None, nbytes: int = 0) -> None:
        """Commit the voice's row with the quota check in its transaction.

        Raises:
            DuplicateVoiceName: the name is taken (the UNIQUE constraint).
            QuotaExceededError: nothing was inserted.
        """
        self.meta.insert_voice((v.id, v.name, v.type, v.created_at, v.prompt, v.ref_text, v.consent, v.sample_rate,
                                v.seconds, prompt_sha, clip_sha), nbytes, self._quota("voice", nbytes))

    def delete(self, key: str) -> StoredVoice | None:
        """Remove the voice ``key`` (id or name): the row first, then its folder. None if unknown.

        Raises:
            OSError: the media store failed (the row is gone; the start-up sweep removes the
                orphaned folder later).
        """
        voice = self.get(key)
        if voice is None:
            return None
        self.meta.delete_voice(voice.id)
        if voice.type == AUDIO_SAMPLE:
            try:
                self.media.delete_prefix(_voice_key(voice.id))
            except InvalidMediaKey:
                logger.warning("voice store: voice id %r names no media folder; nothing removed", voice.id[:80])
        return voice

    # ------------------------------------------------------------------ consents
    def add_consent(self, name: str, language: str, recording: bytes, ext: str) -> StoredConsent:
        """Store a consent recording (``recording`` bytes as uploaded, file written atomically).

        Raises:
            QuotaExceededError: ``max_consents`` or ``max_stored_bytes`` would be passed
                (nothing is left on disk).
        """
        self.check_quota("consent", len(recording))
        cid = "cons_" + secrets.token_hex(12)
        fname = f"{cid}.{ext}"
        self.media.put(f"consents/{fname}", recording)
        consent = StoredConsent(id=cid, name=name, language=language, created_at=int(time.time()))
        try:
            self.meta.insert_consent((cid, name, language, consent.created_at, fname, _sha256(recording),
                                      len(recording)), self._quota("consent", len(recording)))
        except BaseException:
            self.media.delete(f"consents/{fname}")
            raise
        return consent

    def get_consent(self, cid: str) -> StoredConsent | None:
        row = self.meta.consent(cid)
        return StoredConsent(*row) if row else None

    def list_consents(self, after: str | None = None, limit: int = 20) -> tuple[list[StoredConsent], bool]:
        """Consents oldest first, starting after the id ``after``; ``(page, has_more)``.

        Raises:
            KeyError: ``after`` names no consent."""
        rows = self.meta.consents(after, limit + 1)
        return [StoredConsent(*r) for r in rows[:limit]], len(rows) > limit

    def rename_consent(self, cid: str, name: str) -> StoredConsent | None:
        self.meta.rename_consent(cid, name)
        return self.get_consent(cid)

    def delete_consent(self, cid: str) -> bool:
        fname = self.meta.delete_consent(cid)
        if fname is None:
            return False
        try:
            self.media.delete(f"consents/{fname}")
        except InvalidMediaKey:
            logger.warning("voice store: consent file %r names no media file; nothing removed", str(fname)[:80])
        return True
