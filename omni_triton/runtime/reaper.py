"""Child-process reaping: kills an engine's child processes (vLLM EngineCore) when the model is
finalized or when the server process disappears (they outlive tritonserver otherwise).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

LOGGER = logging.getLogger("omni_triton.llm")


class ChildReaper:
    """Kill the child processes an engine started (vLLM's EngineCore and its workers).

    Why: the EngineCore children of a Triton stub outlive tritonserver when the server goes away
    while a request runs (docs/architecture.md "Environment facts"). :meth:`reap` runs from the model's ``finalize``
    and at interpreter exit; :meth:`watch` starts a daemon thread that reaps (and exits the stub)
    as soon as the server process (the stub's parent) is gone.

    Args:
        pid: the process whose descendants are reaped (default: this one).
    """

    def __init__(self, pid: int | None = None):
        import psutil

        self._proc = psutil.Process(pid or os.getpid())
        self._known: dict[int, Any] = {}
        self.snapshot()

    def snapshot(self) -> list[int]:
        """Remember the current descendants (call after the engine started); returns their pids."""
        import psutil

        try:
            for child in self._proc.children(recursive=True):
                self._known[child.pid] = child
        except psutil.Error:
            pass
        return sorted(self._known)

    def reap(self, timeout: float = 5.0) -> list[int]:
        """SIGTERM every known and current descendant, SIGKILL what is left after ``timeout``;
        returns the pids that were still alive."""
        import psutil

        self.snapshot()
        alive = []
        for p in self._known.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.terminate()
                    alive.append(p)
            except psutil.Error:
                pass
        _, still = psutil.wait_procs(alive, timeout=timeout)
        for p in still:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(still, timeout=timeout)
        return [p.pid for p in alive]

    def watch(self, server_pid: int, on_gone: Callable[[], None] | None = None,
              interval_s: float = 0.5) -> threading.Thread:
        """Wait for ``server_pid`` to exit (or this process to be re-parented); then reap the
        children and call ``on_gone`` (e.g. ``os._exit``).

        The thread sleeps on a pidfd of the server (readable once it exited): no wake-up at all
        while it runs (an idle server costs nothing, issue 28 item 4). Without pidfds (Linux <
        5.3) it polls every ``interval_s`` seconds."""
        import select

        import psutil

        def run() -> None:
            try:
                fd = os.pidfd_open(server_pid)
            except (AttributeError, OSError):
                fd = None
            if fd is not None and os.getppid() == server_pid:
                select.select([fd], [], [])
                os.close(fd)
            else:
                while psutil.pid_exists(server_pid) and os.getppid() == server_pid:
                    time.sleep(interval_s)
            LOGGER.warning("server process %d is gone: stopping the engine's child processes", server_pid)
            self.reap(timeout=2.0)
            if on_gone is not None:
                on_gone()

        thread = threading.Thread(target=run, name="engine-reaper", daemon=True)
        thread.start()
        return thread
