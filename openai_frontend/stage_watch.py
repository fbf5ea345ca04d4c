"""Follow ``omni-triton serve``'s status file: Triton restarts and stub deaths, for ``/health`` and
for ending the requests a dead stage would leave hanging.

Triton 2.51 never completes the in-flight requests of a Python stub that died (killed, OOM): their
gRPC streams stay open with nothing coming, and the model's unload (the launcher's reload) waits
for them. ``serve`` writes ``last_stub_death = {"at", "model", "affected", ...}`` to its status
file (``omni_triton.serve.supervisor.ServeStatus``; path in ``OMNI_TRITON_SERVE_STATUS``); this watcher
sees the change and calls back with the affected models, and the engine fails their in-flight
requests with a 503 (retried once where the request has no side effects).
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


class ServeStatusWatch:
    """Polls the status file's modification time every ``interval_s`` and re-reads it on change.

    Args:
        path: the status JSON; ``None`` or a missing file: nothing to watch (frontend started
            without ``serve``), :attr:`status` stays ``None``.
        on_stub_death: ``(affected_models, dead_model) -> None``, called once per new stub death.
        interval_s: polling period in seconds.
    """

    def __init__(self, path: str | os.PathLike[str] | None,
                 on_stub_death: Callable[[list[str], str], object] | None = None,
                 interval_s: float = 0.25):
        self.path = Path(path) if path else None
        self.on_stub_death = on_stub_death
        self.interval_s = interval_s
        self.status: dict[str, Any] | None = None
        self._mtime: float | None = None
        self._seen_death: float | None = None
        self._task: asyncio.Task[Any] | None = None

    @classmethod
    def from_env(cls, on_stub_death: Callable[[list[str], str], object] | None = None) -> ServeStatusWatch:
        """A watcher on ``$OMNI_TRITON_SERVE_STATUS`` (unset: a watcher with no file)."""
        return cls(os.environ.get("OMNI_TRITON_SERVE_STATUS"), on_stub_death)

    def poll(self) -> None:
        """Re-read the file if it changed; fire ``on_stub_death`` for a death newer than the
        last one seen (the death present at the first read counts as seen: it predates us)."""
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
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

    def start(self) -> None:
        """Start polling on the running event loop (idempotent; no-op without a file)."""
        if self.path is not None and self._task is None:
            self.poll()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
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
