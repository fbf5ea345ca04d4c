"""Follow ``omni-triton serve``'s status file: Triton restarts and stub deaths, for ``/health`` and
for ending the requests a dead stage would leave hanging.

Triton 2.51 never completes the in-flight requests of a Python stub that died (killed, OOM): their
gRPC streams stay open with nothing coming, and the model's unload (the launcher's reload) waits
for them. ``serve`` writes ``last_stub_death = {"at", "model", "affected", ...}`` to its status
file (``omni_triton.serve.supervisor.ServeStatus``; path in ``OMNI_TRITON_SERVE_STATUS``); this watcher
sees the change and calls back with the affected models, and the engine fails their in-flight
requests with a 503 (retried once where the request has no side effects).

``serve`` also hands the frontend the read end of a pipe (its number in
``OMNI_TRITON_SERVE_STATUS_FD``) and writes a byte to it after each status write: the watcher
reads the file when told, and never polls (an idle server costs nothing, issue 28 item 4).
Without that pipe (a frontend started by hand on a status file) it polls the file's mtime.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


#: environment variable holding the pipe serve writes a byte to after each status write
NOTIFY_FD_ENV = "OMNI_TRITON_SERVE_STATUS_FD"


class ServeStatusWatch:
    """Re-reads the status file when ``serve`` says it changed (a byte on ``notify_fd``), or, with
    no such pipe, when its modification time changed (polled every ``interval_s``).

    Args:
        path: the status JSON; ``None`` or a missing file: nothing to watch (frontend started
            without ``serve``), :attr:`status` stays ``None``.
        on_stub_death: ``(affected_models, dead_model) -> None``, called once per new stub death.
        interval_s: polling period in seconds when there is no ``notify_fd`` (4 wake-ups a
            second: at least 0.06% of a core for the wake-ups alone on the 2-core dev VM; with
            the pipe there are none).
        notify_fd: the read end of serve's notification pipe, or None.
    """

    def __init__(self, path: str | os.PathLike[str] | None,
                 on_stub_death: Callable[[list[str], str], object] | None = None,
                 interval_s: float = 0.25, notify_fd: int | None = None):
        self.path = Path(path) if path else None
        self.on_stub_death = on_stub_death
        self.interval_s = interval_s
        self.notify_fd = notify_fd
        self.status: dict[str, Any] | None = None
        self._mtime: float | None = None
        self._seen_death: float | None = None
        self._task: asyncio.Task[Any] | None = None
        self._reading = False  # the notify pipe is registered with the event loop

    @classmethod
    def from_env(cls, on_stub_death: Callable[[list[str], str], object] | None = None) -> ServeStatusWatch:
        """A watcher on ``$OMNI_TRITON_SERVE_STATUS`` (unset: a watcher with no file), told of
        changes through ``$OMNI_TRITON_SERVE_STATUS_FD`` when set."""
        fd = os.environ.get(NOTIFY_FD_ENV, "")
        return cls(os.environ.get("OMNI_TRITON_SERVE_STATUS"), on_stub_death,
                   notify_fd=int(fd) if fd.isdigit() else None)

    def poll(self, force: bool = False) -> None:
        """Re-read the file if it changed (``force``: whatever its mtime says); fire
        ``on_stub_death`` for a death newer than the last one seen (the death present at the
        first read counts as seen: it predates us)."""
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime and not force:
                return
            status = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return  # absent, or replaced between stat and read: next poll
        first = self._mtime is None
        self._mtime, self.status = mtime, status
        death = status.get("last_stub_death") or {}
        at = death.get("at")
        if at is None or at == self._seen_death:
            return
        self._seen_death = at
        if not first and self.on_stub_death is not None:
            affected = list(death.get("affected") or [death.get("model")])
            logger.warning("stage %s died; ending in-flight requests of %s", death.get("model"),
                           ", ".join(affected))
            self.on_stub_death(affected, str(death.get("model")))

    async def _run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self.interval_s)

    def _notified(self) -> None:
        assert self.notify_fd is not None
        try:
            data = os.read(self.notify_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # serve closed its end (it is stopping): nothing more will come
            asyncio.get_running_loop().remove_reader(self.notify_fd)
            self._reading = False
        self.poll(force=True)

    def start(self) -> None:
        """Start watching on the running event loop (idempotent; no-op without a file): read the
        file whenever serve writes to the pipe, or poll it without one."""
        if self.path is None or self._task is not None or self._reading:
            return
        self.poll()
        loop = asyncio.get_running_loop()
        if self.notify_fd is not None:
            try:  # bytes serve wrote before this stay in the pipe: the reader fires for them
                os.set_blocking(self.notify_fd, False)
                loop.add_reader(self.notify_fd, self._notified)
                self._reading = True
                return
            except (OSError, ValueError) as exc:
                logger.warning("serve's status pipe (fd %s) is unusable (%s): polling the file", self.notify_fd, exc)
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        if self._reading and self.notify_fd is not None:
            asyncio.get_running_loop().remove_reader(self.notify_fd)
            self._reading = False
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def health(self) -> dict[str, Any] | None:
        """What ``/health`` shows of ``serve``: state, restarts, last crash, stub reloads."""
        if self.status is None:
            return None
        keys = ("state", "restarts", "last_crash", "stub_reloads", "last_stub_death")
        return {k: self.status.get(k) for k in keys}
