"""Durable custom voices and consent recordings (``/v1/audio/voices``, ``/v1/audio/voice_consents``).

One SQLite file (``voices.sqlite``, WAL, ``synchronous=FULL``) holds the metadata; each uploaded
voice owns a folder ``voices/<id>/`` with its clip (``clip.wav``, float32 mono at
``VoiceSettings.sample_rate``) and the clone prompt the ``qwen3_tts_voice_prompt`` model computed
once at upload (``voice_prompt.bin``, opaque bytes sent back as ``VOICE_PROMPT``). A consent
recording is ``consents/<id>.<ext>``.

Nothing is half-written: the files of a voice are written into a temporary folder, fsynced and
renamed into place (one ``os.replace``) *before* its row is committed; a failed insert (duplicate
name) removes the folder again. At start, temporary folders and folders without a row (a crash
between the rename and the commit) are removed. A row whose files are missing or whose prompt
no longer matches its SHA-256 is *corrupt*: listed with an ``error``, refused on use
(:class:`VoiceCorruptError`, a 409), never a crash.

Limits (:class:`VoiceSettings`): at most ``max_voices`` voices, ``max_consents`` consent
recordings and ``max_stored_bytes`` bytes of clips, prompts and recordings together; a designed
voice's ``prompt`` has at most ``max_prompt_chars`` characters. Each is checked before anything
is written (:meth:`VoiceStore.check_quota`) and again in the transaction that commits the row, so
concurrent uploads cannot pass it together (:class:`QuotaExceededError`, a 400 ``quota_exceeded``).

One process per folder: the store holds ``<storage_dir>/frontend.lock``
(:mod:`openai_frontend.storage_lock`) from before its start-up sweep until :meth:`VoiceStore.close`.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import secrets
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .storage_lock import lock_unless_shared

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


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (the caller renames its folder into place)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path`` or nothing: temp file in the same folder, fsync, ``os.replace``."""
    tmp = path.with_name(f".tmp-{secrets.token_hex(6)}-{path.name}")
    try:
        _write_file(tmp, data)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def encode_clip(samples: NDArray[Any], sample_rate: int) -> bytes:
    """float32 mono [T] -> WAV bytes (FLOAT subtype: lossless)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.asarray(samples, np.float32), sample_rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


class VoiceStore:
    """The SQLite file + voice folders under ``settings.storage_dir`` (thread-safe; calls are short).

    Raises (at construction):
        StorageLockedError: another process has the folder open
            (:mod:`openai_frontend.storage_lock`).
        sqlite3.DatabaseError, OSError: the database or the folder cannot be opened.
    """

    #: True for a store on a database several frontends share (the scale-out issue's
    #: PostgreSQL store, not built yet): it takes no folder lock. This SQLite store is local.
    shared = False

    def __init__(self, settings: VoiceSettings):
        self.settings = settings
        self.root = Path(settings.storage_dir)
        self.voices_dir = self.root / "voices"
        self.consents_dir = self.root / "consents"
        self._folder_lock = lock_unless_shared(self.root, self.shared)  # before the sweep below
        try:
            for d in (self.root, self.voices_dir, self.consents_dir):
                d.mkdir(parents=True, exist_ok=True)
            self._lock = threading.Lock()
            #: files whose checksum was verified: path -> (size, mtime_ns, sha256); a listing stats
            #: each file and hashes it again only when it changed (not every clip on every GET)
            self._verified: dict[str, tuple[int, int, str]] = {}
            self._db = sqlite3.connect(self.root / "voices.sqlite", check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._migrate()
            self._sweep()
        except BaseException:
            if self._folder_lock is not None:
                self._folder_lock.release()
            raise

    def close(self) -> None:
        """Close the database and release the folder lock."""
        with self._lock:
            self._db.close()
        if self._folder_lock is not None:
            self._folder_lock.release()

    def _migrate(self) -> None:
        """Add the columns a store written by an older frontend lacks (:data:`_MIGRATIONS`)."""
        for table, column, definition, fill in _MIGRATIONS:
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
                if fill:
                    self._db.execute(fill)

    # ------------------------------------------------------------------ limits
    def _usage(self) -> tuple[int, int, int]:
        """(voices, consents, stored bytes); the caller holds ``self._lock``."""
        voices, vbytes = self._db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM voices").fetchone()
        consents, cbytes = self._db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM consents").fetchone()
        return voices, consents, vbytes + cbytes

    def _quota_error(self, kind: str, new_bytes: int) -> QuotaExceededError | None:
        """Why one more ``kind`` (``voice`` / ``consent``) of ``new_bytes`` cannot be stored, or
        None; the caller holds ``self._lock``."""
        cfg = self.settings
        voices, consents, stored = self._usage()
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
        with self._lock:
            error = self._quota_error(kind, new_bytes)
        if error is not None:
            raise error

    def _insert_within_quota(self, kind: str, new_bytes: int, sql: str, args: tuple[Any, ...]) -> None:
        """Run the INSERT ``sql`` in one transaction with the quota check (concurrent uploads
        cannot pass a limit together).

        Raises:
            QuotaExceededError: nothing was inserted.
            sqlite3.IntegrityError: a UNIQUE column is taken.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                error = self._quota_error(kind, new_bytes)
                if error is None:
                    self._db.execute(sql, args)
                self._db.execute("ROLLBACK" if error else "COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if error is not None:
            raise error

    # ------------------------------------------------------------------ start-up
    def _sweep(self) -> None:
        """Remove temporary folders/files and voice folders no row owns (a crash between the
        rename and the commit); rows without files stay and are reported corrupt."""
        ids = {r[0] for r in self._db.execute("SELECT id FROM voices")}
        for entry in self.voices_dir.iterdir():
            if entry.name.startswith(".tmp-") or (entry.is_dir() and entry.name not in ids):
                logger.warning("voice store: removing unfinished or orphaned %s", entry.name)
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        files = {r[0] for r in self._db.execute("SELECT file FROM consents")}
        for entry in self.consents_dir.iterdir():
            if entry.name.startswith(".tmp-") or entry.name not in files:
                entry.unlink(missing_ok=True)

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
        folder = self.voices_dir / voice.id
        for fname, sha in ((PROMPT_FILE, prompt_sha), (CLIP_FILE, clip_sha)):
            path = folder / fname
            try:
                st = path.stat()
                if self._verified.get(str(path)) == (st.st_size, st.st_mtime_ns, sha):
                    continue
                data = path.read_bytes()
            except OSError:
                return f"{fname} is missing"
            if _sha256(data) != sha:
                return f"{fname} does not match its checksum"
            self._verified[str(path)] = (st.st_size, st.st_mtime_ns, sha)
        return None

    _COLUMNS = "id, name, type, created_at, prompt, ref_text, consent, sample_rate, seconds, prompt_sha256, clip_sha256"

    def list_voices(self) -> list[StoredVoice]:
        """Every stored voice, oldest first (corrupt ones with ``error`` set)."""
        with self._lock:
            rows = self._db.execute(f"SELECT {self._COLUMNS} FROM voices ORDER BY seq").fetchall()
        return [self._row_to_voice(r) for r in rows]

    def get(self, key: str) -> StoredVoice | None:
        """The voice whose id or name is ``key`` (id first), or None."""
        with self._lock:
            row = self._db.execute(f"SELECT {self._COLUMNS} FROM voices WHERE id = ?", (key,)).fetchone()
            if row is None:
                row = self._db.execute(f"SELECT {self._COLUMNS} FROM voices WHERE name = ?", (key,)).fetchone()
        return self._row_to_voice(row) if row else None

    def name_taken(self, name: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM voices WHERE name = ?", (name,)).fetchone() is not None

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM voices").fetchone()[0])

    def voice_prompt(self, voice: StoredVoice) -> bytes:
        """The stored clone prompt of an ``audio_sample`` voice.

        Raises:
            VoiceCorruptError: the entry is corrupt (``voice.error``) or its file changed since.
        """
        if voice.error:
            raise VoiceCorruptError(voice.error)
        try:
            data = (self.voices_dir / voice.id / PROMPT_FILE).read_bytes() if voice.type == AUDIO_SAMPLE else b""
        except OSError as exc:
            raise VoiceCorruptError(f"{PROMPT_FILE} is unreadable ({exc.strerror})") from None
        with self._lock:
            row = self._db.execute("SELECT prompt_sha256 FROM voices WHERE id = ?", (voice.id,)).fetchone()
        if row is None or _sha256(data) != row[0]:
            raise VoiceCorruptError(f"{PROMPT_FILE} does not match its checksum")
        return data

    def add_clip(self, name: str, clip: NDArray[Any], sample_rate: int, voice_prompt: bytes,
                 ref_text: str | None, consent: str | None, seconds: float | None = None) -> StoredVoice:
        """Store a cloned voice: ``clip`` (float32 mono [T] at ``sample_rate`` Hz) and its
        ``voice_prompt`` bytes, atomically (folder renamed into place, then the row committed).

        Raises:
            DuplicateVoiceName: ``name`` is taken (nothing is left on disk).
            QuotaExceededError: a limit would be passed (nothing is left on disk).
        """
        vid = "voice_" + secrets.token_hex(12)
        clip_bytes = encode_clip(clip, sample_rate)
        self.check_quota("voice", len(clip_bytes) + len(voice_prompt))
        tmp = self.voices_dir / f".tmp-{vid}"
        final = self.voices_dir / vid
        tmp.mkdir()
        try:
            _write_file(tmp / CLIP_FILE, clip_bytes)
            _write_file(tmp / PROMPT_FILE, voice_prompt)
            _fsync_dir(tmp)
            os.replace(tmp, final)
            _fsync_dir(self.voices_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        voice = StoredVoice(id=vid, name=name, type=AUDIO_SAMPLE, created_at=int(time.time()),
                            ref_text=ref_text or None, consent=consent or None, sample_rate=sample_rate,
                            seconds=round(float(seconds if seconds is not None else len(clip) / sample_rate), 3))
        try:
            self._insert(voice, _sha256(voice_prompt), _sha256(clip_bytes), len(clip_bytes) + len(voice_prompt))
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
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
        try:
            self._insert_within_quota(
                "voice", nbytes, f"INSERT INTO voices ({self._COLUMNS}, bytes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (v.id, v.name, v.type, v.created_at, v.prompt, v.ref_text, v.consent, v.sample_rate,
                 v.seconds, prompt_sha, clip_sha, nbytes))
        except sqlite3.IntegrityError as exc:
            raise DuplicateVoiceName(v.name) from exc

    def delete(self, key: str) -> StoredVoice | None:
        """Remove the voice ``key`` (id or name): the row first, then its folder. None if unknown."""
        voice = self.get(key)
        if voice is None:
            return None
        with self._lock:
            self._db.execute("DELETE FROM voices WHERE id = ?", (voice.id,))
        shutil.rmtree(self.voices_dir / voice.id, ignore_errors=True)
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
        write_atomic(self.consents_dir / fname, recording)
        consent = StoredConsent(id=cid, name=name, language=language, created_at=int(time.time()))
        try:
            self._insert_within_quota(
                "consent", len(recording), "INSERT INTO consents (id, name, language, created_at, file, sha256, "
                "bytes) VALUES (?,?,?,?,?,?,?)", (cid, name, language, consent.created_at, fname,
                                                  _sha256(recording), len(recording)))
        except BaseException:
            (self.consents_dir / fname).unlink(missing_ok=True)
            raise
        return consent

    def get_consent(self, cid: str) -> StoredConsent | None:
        with self._lock:
            row = self._db.execute("SELECT id, name, language, created_at FROM consents WHERE id = ?",
                                   (cid,)).fetchone()
        return StoredConsent(*row) if row else None

    def list_consents(self, after: str | None = None, limit: int = 20) -> tuple[list[StoredConsent], bool]:
        """Consents oldest first, starting after the id ``after``; ``(page, has_more)``."""
        with self._lock:
            seq = 0
            if after:
                row = self._db.execute("SELECT seq FROM consents WHERE id = ?", (after,)).fetchone()
                seq = row[0] if row else 0
            rows = self._db.execute("SELECT id, name, language, created_at FROM consents WHERE seq > ? "
                                    "ORDER BY seq LIMIT ?", (seq, limit + 1)).fetchall()
        return [StoredConsent(*r) for r in rows[:limit]], len(rows) > limit

    def rename_consent(self, cid: str, name: str) -> StoredConsent | None:
        with self._lock:
            self._db.execute("UPDATE consents SET name = ? WHERE id = ?", (name, cid))
        return self.get_consent(cid)

    def delete_consent(self, cid: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT file FROM consents WHERE id = ?", (cid,)).fetchone()
            if row is None:
                return False
            self._db.execute("DELETE FROM consents WHERE id = ?", (cid,))
        (self.consents_dir / row[0]).unlink(missing_ok=True)
        return True
