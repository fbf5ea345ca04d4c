"""Cancel flags shared by the stub processes of one tritonserver (BLS -> stage cancellation on
Triton versions whose BLS response iterator has no ``cancel()``).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


class CancelFlags:
    """Cancellation flags for talker streams, shared by every process of one tritonserver.

    Why: Triton 2.51's BLS response iterator has no ``cancel()``, so the ``csm`` BLS model cannot
    cancel the ``csm_talker`` request it started. It passes a ``REQUEST_ID`` instead and, when its
    own client goes away, raises the flag for that id; the talker checks the flag after every
    frame. The talker runs several instances (separate stub processes) that execute one request
    each, so the flags live in files, one per cancelled id, in a folder named after the server's
    pid (the stubs' parent process): cheap to check (one ``stat`` per frame) and visible to all
    instances at once. A flag raised before its stream starts still stops it.

    Args:
        directory: the folder of flags; created if missing.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_server(cls, server_pid: int | None = None) -> CancelFlags:
        """Flags of the tritonserver whose pid is ``server_pid`` (default: this stub's parent)."""
        from omni_triton.paths import server_run_dir

        pid = os.getppid() if server_pid is None else server_pid
        return cls(server_run_dir(pid) / "cancel")

    def _path(self, request_id: str) -> Path:
        return self.directory / hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:32]

    def cancel(self, request_id: str) -> None:
        """Raise the flag of ``request_id``."""
        self._path(request_id).touch()

    def is_cancelled(self, request_id: str | None) -> bool:
        """Whether the flag of ``request_id`` is raised (``False`` for ``None``/empty)."""
        if not request_id:
            return False
        return self._path(request_id).exists()

    def discard(self, request_id: str | None) -> None:
        """Lower the flag (when its stream ended)."""
        if request_id:
            self._path(request_id).unlink(missing_ok=True)
