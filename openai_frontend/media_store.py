"""Where the frontend keeps its media files: MP4s of video jobs, voice clips and clone prompts,
consent recordings (``--media-url``).

A :class:`MediaStore` is a folder of an fsspec file system (``fsspec.core.url_to_fs``): a local
folder (a plain path or ``file:///shared/media``: also an NFS / ReadWriteMany volume several
frontends mount) or an object store (``s3://bucket/prefix`` with ``s3fs`` installed; any fsspec
protocol works the same way). Keys are ``/``-separated paths below that folder, made only by the
stores from ids they checked:

- ``videos/<video id>.mp4`` (:mod:`openai_frontend.video_jobs`);
- ``voices/<voice id>/clip.wav``, ``voices/<voice id>/voice_prompt.bin``, ``consents/<consent
  id>.<ext>`` (:mod:`openai_frontend.voice_store`).

Default (no ``--media-url``): each store's own storage folder (``--video-storage-dir``,
``--voice-storage-dir``), so the files of an existing store stay where they are and keep working.

Writes: :meth:`MediaStore.put` is all-or-nothing. On a local file system it is
:func:`omni_triton.media.video.write_atomic` (a temporary file ``.<name>.<random>.tmp`` in the same
folder, fsync, ``os.replace``, fsync of the folder); on an object store one ``PUT`` (an object is
visible whole or not at all). Reads are streamed (:meth:`MediaStore.open`); every method is
blocking: the frontend calls them in worker threads, never on the event loop.

Sweeps when several frontends share the location (``shared=True``, what an explicit
``--media-url`` makes). Each frontend removes, at start, what a crash left: temporary files, and
files no database row owns (the video jobs also every :attr:`MediaStore.sweep_grace_s` while
running). On a shared location another frontend may be writing at that very
moment, so:

- a temporary file (a name starting with ``.``) is removed only once it is older than
  :attr:`MediaStore.sweep_grace_s` (:data:`SHARED_SWEEP_GRACE_S`, 15 min; a write takes seconds,
  and the margin also absorbs clock skew between hosts: the age is the file system's mtime
  against this host's clock). An object store has no temporary files (a ``PUT`` is atomic);
- an MP4 is an orphan only when its job's row is gone (or failed / expired): a job's row is
  committed before its MP4 is written, and the folder is listed *before* the rows are read, so
  a file another frontend just wrote always has its row (shared database);
- a voice's files and a consent recording are written *before* their row is committed (a failed
  insert removes them again), so a folder / file without a row may be an upload in flight on
  another frontend: it is removed only once it is older than the grace as well.

Orphans are decided by database rows, so they are only right when every frontend on the
location uses the same database: with a shared database (PostgreSQL) that is so; a local
(SQLite) store on an explicit local ``--media-url`` takes the media folder's
:mod:`openai_frontend.storage_lock` lock (a second frontend with its own SQLite file cannot use
the folder); an object store cannot be locked: one frontend per prefix unless the database is
shared. Without ``--media-url`` the store's own folder lock already makes the frontend the only
writer, and the grace is 0 (today's behaviour: everything stray is removed at start).
"""
from __future__ import annotations

import datetime
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.to_thread
import fsspec
from fsspec.implementations.local import LocalFileSystem
from starlette.responses import FileResponse
from starlette.types import Receive, Scope, Send

from omni_triton.media.video import write_atomic

logger = logging.getLogger(__name__)

#: seconds a temporary file or an unowned voice/consent upload on a shared location must be old
#: before a sweep removes it (a write takes seconds; the rest absorbs clock skew between hosts)
SHARED_SWEEP_GRACE_S = 15 * 60.0

#: one segment of a key: starts with a letter or digit, then letters, digits, ``_``, ``-``, and
#: dots between them (``video_<hex>.mp4``, ``clip.wav``); never ``.``, ``..``, ``.hidden``, ``a..b``
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*")
#: a listed entry's name may also be a temporary file's (``.<name>.<random>.tmp``, ``.tmp-<id>``)
_LISTED_SEGMENT = re.compile(r"\.?[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
MAX_KEY_CHARS = 256
#: bytes an object store's file fetches per request when read (streamed ``Range`` reads of an MP4)
READ_BLOCK_BYTES = 2 << 20
MAX_KEY_DEPTH = 4


class InvalidMediaKey(ValueError):
    """A key that is not a plain relative path of safe segments (``..``, absolute, empty, hidden)."""


def check_key(key: str, *, listed: bool = False) -> str:
    """``key`` when it is a relative ``/``-separated path of at most :data:`MAX_KEY_DEPTH` segments
    of :data:`_SEGMENT` (``listed``: the last may be a temporary file's ``.name``).

    Raises:
        InvalidMediaKey: anything else (``..``, ``/abs``, ``a//b``, ``\\``, a hidden segment).
    """
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise InvalidMediaKey(f"invalid media key {str(key)[:80]!r}")
    parts = key.split("/")
    if len(parts) > MAX_KEY_DEPTH:
        raise InvalidMediaKey(f"invalid media key {key[:80]!r}: more than {MAX_KEY_DEPTH} segments")
    for i, part in enumerate(parts):
        pattern = _LISTED_SEGMENT if listed and i == len(parts) - 1 else _SEGMENT
        if pattern.fullmatch(part) is None or ".." in part:
            raise InvalidMediaKey(f"invalid media key {key[:80]!r}")
    return key


def _mtime(info: dict[str, Any]) -> float | None:
    """Modification time (Unix seconds) of an fsspec ``info`` dict: ``mtime`` (local),
    ``LastModified`` (s3fs), ``created`` (memory); None when the file system gives none."""
    for field in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(field)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return None


@dataclass(frozen=True)
class MediaEntry:
    """One file or folder of a store (what :meth:`MediaStore.info` and :meth:`MediaStore.list`
    return). ``key``: its path below the store's root; ``size`` in bytes (0 for a folder);
    ``mtime``: Unix seconds or None (unknown); ``version``: what changes when the content is
    replaced (size, mtime, inode or ETag), to cache a checksum by."""

    key: str
    size: int
    mtime: float | None
    is_dir: bool = False
    version: tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def temporary(self) -> bool:
        """A temporary file (``write_atomic``'s ``.<name>.<random>.tmp``, a voice store's
        ``.tmp-<id>`` folder of older versions): a name starting with ``.``."""
        return self.name.startswith(".")


class MediaStore:
    """The files under ``url`` (a local path, ``file://...``, ``s3://bucket/prefix``, any fsspec URL).

    Args:
        url: where the files live; a local folder is created if missing.
        shared: several frontends may use the location at once (an explicit ``--media-url``):
            sweeps leave young temporary and unowned files alone (module docstring).
        sweep_grace_s: seconds such a file must be old before a sweep removes it (default:
            :data:`SHARED_SWEEP_GRACE_S` when ``shared``, else 0).

    Raises:
        ValueError: an unknown protocol. ImportError: the protocol's package (``s3fs``) is missing.
        OSError: a local folder cannot be created.
    """

    def __init__(self, url: str | os.PathLike[str], *, shared: bool = False, sweep_grace_s: float | None = None):
        self.url = os.fspath(url)
        # no listings cache: another frontend's new files must show at once (s3fs answers info()
        # from a cached listing of the folder otherwise)
        fs, root = fsspec.core.url_to_fs(self.url, use_listings_cache=False)
        self.fs: Any = fs
        self.root: str = root.rstrip("/") or "/"
        self.local = isinstance(fs, LocalFileSystem)
        self.shared = shared
        self.sweep_grace_s = (SHARED_SWEEP_GRACE_S if shared else 0.0) if sweep_grace_s is None else sweep_grace_s
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"MediaStore({self.url!r}, shared={self.shared})"

    def _path(self, key: str, *, listed: bool = False) -> str:
        return f"{self.root.rstrip('/')}/{check_key(key, listed=listed)}"

    def _key(self, path: str) -> str:
        """The key of an fsspec path below the root (as ``ls`` / ``find`` return them)."""
        root = self.fs._strip_protocol(self.root).rstrip("/")
        path = self.fs._strip_protocol(path)
        if not path.startswith(root + "/"):
            raise InvalidMediaKey(f"{path!r} is not below {root!r}")
        return path[len(root) + 1:]

    def makedirs(self, prefix: str) -> None:
        """Create the folder ``prefix`` on a local store (an object store has no folders: nothing).

        Raises:
            InvalidMediaKey, OSError.
        """
        if self.local:
            Path(self._path(prefix)).mkdir(parents=True, exist_ok=True)

    def local_path(self, key: str) -> Path | None:
        """The file's path on this host when the store is a local folder, else None."""
        return Path(self._path(key)) if self.local else None

    # ------------------------------------------------------------------ files
    def put(self, key: str, data: bytes) -> int:
        """Store ``data`` at ``key`` (replacing it) all-or-nothing; returns its size in bytes.

        Raises:
            InvalidMediaKey: see :func:`check_key`. OSError: the write failed (nothing changed).
        """
        path = self._path(key)
        if self.local:
            write_atomic(path, data)
        else:
            self.fs.pipe_file(path, data)
        return len(data)

    def get(self, key: str) -> bytes:
        """The whole content of ``key`` (small files: prompts, clips).

        Raises:
            FileNotFoundError: no such file. InvalidMediaKey, OSError.
        """
        data: bytes = self.fs.cat_file(self._path(key))
        return data

    def open(self, key: str) -> IO[bytes]:
        """``key`` opened for (seekable, streamed) reading; the caller closes it.

        Raises:
            FileNotFoundError: no such file. InvalidMediaKey, OSError.
        """
        if self.local:
            f: IO[bytes] = self.fs.open(self._path(key), "rb")
        else:  # an object store reads ahead by blocks (s3fs: 50 MiB): a Range read fetches a bounded block
            f = self.fs.open(self._path(key), "rb", block_size=READ_BLOCK_BYTES)
        return f

    def _entry(self, info: dict[str, Any]) -> MediaEntry:
        is_dir = info.get("type") == "directory"
        size = 0 if is_dir else int(info.get("size") or 0)
        mtime = _mtime(info)
        version = (size, mtime, info.get("ino"), info.get("ETag") or info.get("etag"))
        return MediaEntry(self._key(info["name"]), size, mtime, is_dir, version)

    def info(self, key: str) -> MediaEntry | None:
        """The file ``key`` (size, mtime, version), or None when there is none (or it is a folder).

        Raises:
            InvalidMediaKey, OSError (other than not found).
        """
        try:
            info = self.fs.info(self._path(key))
        except FileNotFoundError:
            return None
        entry = self._entry(info)
        return None if entry.is_dir else entry

    def size(self, key: str) -> int | None:
        """Bytes of ``key``, None when missing."""
        entry = self.info(key)
        return None if entry is None else entry.size

    def exists(self, key: str) -> bool:
        """Whether the file ``key`` exists."""
        return self.info(key) is not None

    def delete(self, key: str) -> bool:
        """Remove the file ``key``; False when there was none. On a local folder also removes the
        file's own temporary files (``.<name>.*``, matched by prefix, never as a pattern) that an
        interrupted :meth:`put` left.

        Raises:
            InvalidMediaKey, OSError.
        """
        path = self._path(key)
        # an object store answers a DELETE of a missing key with success: ask first
        found = self.local or bool(self.fs.exists(path))
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            found = False
        if self.local:
            folder, _, name = key.rpartition("/")
            for entry in self.list(folder):
                if entry.temporary and entry.name.startswith(f".{name}."):
                    self.remove(entry)
        return found

    def delete_prefix(self, prefix: str) -> int:
        """Remove the folder ``prefix`` and everything below it; returns how many files went.

        Raises:
            InvalidMediaKey, OSError.
        """
        path = self._path(prefix)
        try:
            files = self.fs.find(path)
        except FileNotFoundError:
            files = []
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        return len(files)

    # ------------------------------------------------------------------ sweeps
    def list(self, prefix: str = "") -> list[MediaEntry]:
        """The files and folders directly in the folder ``prefix`` ("" = the root), temporary ones
        included; [] when the folder does not exist.

        Raises:
            InvalidMediaKey, OSError.
        """
        path = self._path(prefix) if prefix else self.root
        try:
            infos = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        entries = []
        for info in infos:
            try:
                entry = self._entry(info)
                check_key(entry.key, listed=True)
            except InvalidMediaKey:  # a name no store makes (someone else's file): left alone
                continue
            if entry.key != prefix:
                entries.append(entry)
        return entries

    def newest_mtime(self, entry: MediaEntry) -> float | None:
        """The newest mtime of ``entry`` and, for a folder, of everything in it (None: unknown)."""
        if not entry.is_dir:
            return entry.mtime
        times = [entry.mtime] if entry.mtime is not None else []
        try:
            found = self.fs.find(self._path(entry.key, listed=True), detail=True, withdirs=True)
        except FileNotFoundError:
            found = {}
        times += [t for t in (_mtime(i) for i in found.values()) if t is not None]
        return max(times) if times else None

    def stale(self, entry: MediaEntry, now: float | None = None) -> bool:
        """Whether a sweep may remove ``entry`` (a temporary file, or one no row owns): always
        when :attr:`sweep_grace_s` is 0 (one frontend on the location), else once its newest
        mtime is at least that old (an unknown age is never stale)."""
        if self.sweep_grace_s <= 0:
            return True
        mtime = self.newest_mtime(entry)
        now = time.time() if now is None else now
        return mtime is not None and now - mtime >= self.sweep_grace_s

    def remove(self, entry: MediaEntry) -> None:
        """Remove a listed entry (a file, or a folder with everything in it); gone already is fine.

        Raises:
            InvalidMediaKey, OSError.
        """
        path = self._path(entry.key, listed=True)
        try:
            if entry.is_dir:
                self.fs.rm(path, recursive=True)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass


class MediaUrlError(ValueError):
    """``--media-url`` cannot be used (unknown protocol, its package missing, folder not creatable)."""


def open_media_url(url: str) -> MediaStore:
    """The shared store of ``--media-url`` (``file:///shared/media``, ``/shared/media``,
    ``s3://bucket/prefix``).

    Raises:
        MediaUrlError: naming the URL and why (``s3://`` without ``s3fs`` installed, a protocol
            fsspec does not know, a local folder that cannot be created).
    """
    try:
        return MediaStore(url, shared=True)
    except ImportError as exc:
        raise MediaUrlError(f"--media-url {url}: {exc} (the protocol's fsspec package is not installed)") from exc
    except (ValueError, OSError) as exc:
        raise MediaUrlError(f"--media-url {url}: {exc}") from exc


class MediaFileResponse(FileResponse):
    """Starlette's ``FileResponse`` (``Range`` / multipart ranges, ``If-Range``, ``HEAD``, ETag)
    over a file of a non-local :class:`MediaStore`: the file is opened through fsspec and read in
    worker threads, chunk by chunk (``FileResponse.chunk_size``), instead of from a local path.
    Relies on ``FileResponse._open_file`` (starlette 1.x, pinned in requirements.lock; the unit
    tests run this class over an in-memory file system, so an upgrade that drops it fails there).
    """

    def __init__(self, store: MediaStore, entry: MediaEntry, media_type: str, filename: str):
        mtime = entry.mtime or 0.0
        stat = os.stat_result((0o100644, 0, 0, 1, 0, 0, entry.size, mtime, mtime, mtime))
        super().__init__(entry.key, media_type=media_type, filename=filename, stat_result=stat)
        self.store, self.key = store, entry.key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extensions = {k: v for k, v in scope.get("extensions", {}).items() if k != "http.response.pathsend"}
        await super().__call__({**scope, "extensions": extensions}, receive, send)  # no local path to send

    @asynccontextmanager
    async def _open_file(self) -> AsyncIterator[anyio.AsyncFile[bytes]]:
        raw = await anyio.to_thread.run_sync(self.store.open, self.key)
        file = anyio.wrap_file(raw)
        try:
            yield file
        finally:
            with anyio.CancelScope(shield=True):
                await file.aclose()
