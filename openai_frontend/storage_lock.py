"""One frontend process per storage folder.

The video job store and the voice store keep their state in a folder (an SQLite file plus
files). Two frontend processes on one folder would each settle the other's running jobs at start
(requeue them, run them twice) and sweep the other's half-written files. So each store takes an
exclusive ``flock`` on ``<folder>/frontend.lock`` before it reads or cleans anything, and holds it
for as long as it is open (in practice the process's life). A second process gets
:class:`StorageLockedError`, whose message names the folder and the holder's pid;
``python -m openai_frontend`` prints it and exits with status 1.

``flock`` locks belong to the open file, so the kernel drops the lock when the holding process
dies, however it dies (SIGKILL included): ``omni-triton serve`` restarting a dead frontend, or
Kubernetes recreating the pod, finds the folder free. The lock file itself is left in place
(removing it would race with a starting process).

Within one process the lock is shared: a second store object on the same folder (a test, an
app rebuilt in-process after the first one's shutdown) counts a reference instead of failing.

A store on a shared database (``--database-url``: ``video_jobs.PostgresJobStore``,
``voice_store.PostgresVoiceMeta``) needs no lock: its jobs are claimed with ``SELECT ... FOR
UPDATE SKIP LOCKED`` and leases. Such a store says so with ``shared = True`` and
:func:`lock_unless_shared` then takes no lock.
"""
from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Any

LOCK_FILE = "frontend.lock"

_guard = threading.Lock()
_held: dict[str, list[Any]] = {}  # realpath of the folder -> [fd, references]


class StorageLockedError(RuntimeError):
    """Another process holds the storage folder's lock.

    Attributes:
        folder: the folder.
        holder_pid: the pid the holder wrote into the lock file (None when unreadable).
    """

    def __init__(self, folder: Path, holder_pid: int | None):
        self.folder, self.holder_pid = folder, holder_pid
        holder = f"process {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"the storage folder {folder} is in use by {holder} (lock file {folder / LOCK_FILE}); "
            f"two frontends on one folder would run and requeue each other's jobs. Stop that "
            f"frontend or give this one its own folder (--video-storage-dir / --voice-storage-dir)")


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


class StorageLock:
    """The exclusive lock of ``folder`` (created if missing) for this process.

    Raises:
        StorageLockedError: another process holds it.
        OSError: the folder or its lock file cannot be created or opened.
    """

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._key = os.path.realpath(self.folder)
        self._released = False
        with _guard:
            entry = _held.get(self._key)
            if entry is not None:
                entry[1] += 1
                return
            fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise StorageLockedError(self.folder, holder) from None
            except BaseException:
                os.close(fd)
                raise
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _held[self._key] = [fd, 1]

    def release(self) -> None:
        """Drop this reference; the lock is released when the process's last one goes.
        Idempotent."""
        with _guard:
            if self._released:
                return
            self._released = True
            entry = _held.get(self._key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self._key]
                os.close(entry[0])  # closing the only descriptor releases the flock


def lock_unless_shared(folder: Path | str, shared: bool = False) -> StorageLock | None:
    """:class:`StorageLock` of ``folder``, or None for a store on a shared database
    (``shared``), whose rows are claimed in the database instead.

    Raises:
        StorageLockedError: another process holds the folder.
    """
    return None if shared else StorageLock(folder)
