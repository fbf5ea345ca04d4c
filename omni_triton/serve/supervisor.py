"""What ``serve``'s supervision loop keeps: the restart backoff, the status file the frontend
reads, and the reason of a tritonserver death.
"""
from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path


class RestartBackoff:
    """Delay before the next tritonserver restart: ``initial_s`` doubling per consecutive crash up
    to ``max_s``; back to ``initial_s`` once a server has run ``reset_after_s`` without dying.

    ``serve`` never gives up while the user has not stopped it: the delay keeps a server that
    crashes at start-up from spinning the CPU, nothing more.
    """

    def __init__(self, initial_s: float = 1.0, max_s: float = 30.0, reset_after_s: float = 300.0):
        self.initial_s, self.max_s, self.reset_after_s = initial_s, max_s, reset_after_s
        self._next = initial_s

    def delay(self, ran_for_s: float) -> float:
        """Seconds to wait before restarting a server that ran ``ran_for_s`` seconds."""
        if ran_for_s >= self.reset_after_s:
            self._next = self.initial_s
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay


@dataclass
class ServeStatus:
    """What ``serve`` knows about its tritonserver, written as JSON to :attr:`path` after every
    change (atomically: a temporary file renamed) so the OpenAI frontend's ``/health`` can show it
    (the frontend gets the path in ``OMNI_TRITON_SERVE_STATUS``).

    Attributes:
        state: ``starting``, ``ready`` or ``restarting``.
        restarts: tritonserver restarts since ``serve`` started.
        last_crash: ``{"at": unix seconds, "exit_code": int, "reason": str, "log": path}`` of the
            last tritonserver death, or ``None``.
        stub_reloads: model -> times its stub process died and the model was reloaded.
        last_stub_death: ``{"at", "model", "affected": [models whose in-flight requests hang on
            it], "killed_children": [pid], "shm_removed": n}`` or ``None``. The frontend fails
            the in-flight requests of the ``affected`` models when this changes (Triton 2.51
            never completes the requests of a dead stub).
    """

    path: Path
    state: str = "starting"
    restarts: int = 0
    last_crash: dict | None = None
    stub_reloads: dict = field(default_factory=dict)
    last_stub_death: dict | None = None

    def write(self, **changes) -> None:
        import json

        for key, value in changes.items():
            setattr(self, key, value)
        data = {k: getattr(self, k) for k in ("state", "restarts", "last_crash", "stub_reloads",
                                               "last_stub_death")}
        data["updated_at"] = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)


def crash_reason(log_text: str, exit_code: int | None) -> str:
    """A one-line reason for a tritonserver death: its ``Signal (N) received.`` line, else the
    signal name of a negative exit code, else the exit code."""
    for line in log_text.splitlines():
        if re.search(r"Signal \(\d+\) received", line):
            return line.strip()
    if exit_code is not None and exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            pass
    return f"exited with code {exit_code}"
