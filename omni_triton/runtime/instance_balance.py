"""Keep the open streams of a model's instances even (issue 13 item 4).

A decoupled stage under the deadline scheduler returns from ``execute`` at once, so Triton hands
it every request that arrives while its execute thread is free: which instance (stub process) a
stream lands on is decided at its arrival, and it stays there. A burst of 8 ``csm`` streams on
``csm_talker``'s 2 instances went 5/3 (frames 3,756 against 2,618 over a bench run): the busier
instance set the run's length, and the pipeline made 6.6 audio-s/s where FIFO, which takes one
request per instance at a time, made 8.3.

:class:`InstanceBalance` lets ``execute`` return only once this instance is the least loaded
(fewest open streams; ties: the lowest instance name), so Triton gives the next request to the
sibling whose execute thread is free. Counts live in one small file per instance, in the server's run folder
(:func:`omni_triton.paths.server_run_dir`), written on each open/close and read by siblings
while one waits; an instance whose process is gone no longer counts. Pure Python, no Triton.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class InstanceBalance:
    """Open-stream counts of one model's instances, shared through files.

    Args:
        directory: the model's folder of counts (one file per instance); created if missing.
        instance: this instance's name (Triton's ``model_instance_name``, e.g. ``tts_talker_0_1``).
        poll_s: how often :meth:`wait_turn` re-reads the siblings' counts (seconds).
    """

    def __init__(self, directory: str | os.PathLike[str], instance: str, poll_s: float = 0.01):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.instance = instance
        self.poll_s = poll_s
        self.open = 0
        self._cond = threading.Condition()
        self._write()

    def _write(self) -> None:
        tmp = self.directory / f".{self.instance}.{os.getpid()}.tmp"
        tmp.write_text(f"{os.getpid()} {self.open}")
        os.replace(tmp, self.directory / self.instance)

    def opened(self) -> None:
        """A stream of this instance started."""
        with self._cond:
            self.open += 1
            self._write()

    def closed(self) -> None:
        """A stream of this instance ended (wakes :meth:`wait_turn`)."""
        with self._cond:
            self.open = max(0, self.open - 1)
            self._write()
            self._cond.notify_all()

    def others(self) -> dict[str, int]:
        """Instance name -> open streams of the siblings whose process is alive and a child of
        this process's parent (the same tritonserver)."""
        out = {}
        for path in self.directory.iterdir():
            if path.name == self.instance or path.name.startswith("."):
                continue
            try:
                pid, count = (int(x) for x in path.read_text().split())
            except (OSError, ValueError):
                continue  # unreadable or half written: not a sibling to wait for
            if _parent(pid) == os.getppid():  # alive, and a stub of this server (not a reused pid)
                out[path.name] = count
        return out

    def should_wait(self) -> bool:
        """Whether a live sibling is less loaded: has fewer open streams, or as many and a lower
        instance name, while this one has a stream open. So, with counts even, one instance alone
        takes the next request: an
        instance that returned from ``execute`` cannot refuse the request Triton gives it next,
        so two returned at a tie would leave the next two to chance (5/3 in a bench trace)."""
        if self.open == 0:
            return False  # nothing of its own open: never holds execute (unload waits for it)
        others = self.others()
        return bool(others) and (self.open, self.instance) > min((n, name) for name, n in others.items())

    def wait_turn(self, timeout_s: float | None = None) -> float:
        """Block while :meth:`should_wait`; returns the seconds waited. ``timeout_s``: give up
        after that long (None: wait as long as it takes)."""
        start = time.monotonic()
        with self._cond:
            while self.should_wait():
                if timeout_s is not None and time.monotonic() - start >= timeout_s:
                    break
                self._cond.wait(self.poll_s)
        return time.monotonic() - start

    def close(self) -> None:
        """Remove this instance's file (its model is unloading)."""
        (self.directory / self.instance).unlink(missing_ok=True)


class OpenStreams:
    """Open streams of one model across all its instances (stub processes), the load a BLS knows
    when a request starts (its dynamic first chunk: docs/scheduling.md "The first chunk"). The
    counts are :class:`InstanceBalance`'s files (one per instance, dead processes not counted).

    Args:
        directory: the model's folder of counts (created if missing).
        instance: this instance's name.
    """

    def __init__(self, directory: str | os.PathLike[str], instance: str):
        self.counts = InstanceBalance(directory, instance)

    def others(self) -> int:
        """Streams open now at this model's instances, this instance's included."""
        return self.counts.open + sum(self.counts.others().values())

    @contextmanager
    def counted(self) -> Iterator[int]:
        """Count one stream of this instance open for the ``with`` block; yields how many other
        streams were open when it started."""
        others = self.others()
        self.counts.opened()
        try:
            yield others
        finally:
            self.counts.closed()


def _parent(pid: int) -> int | None:
    """The parent pid of process ``pid`` (``/proc/<pid>/stat``, field 4), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
