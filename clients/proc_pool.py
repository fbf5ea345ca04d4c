"""Worker processes for the benchmarks' in-process baselines: the same number of processes as the
served path, each with one torch thread, instead of threads sharing one GIL in the client.

A :class:`ProcessPool` starts ``n`` processes (``spawn``: no forked torch/thread state); each
builds its worker once from a picklable factory (a module-level function and its arguments) and
then serves requests sent by the client threads. ``call(payload)`` blocks the calling thread until
a worker answered, so the benchmarks' closed loops (``clients.bench_common.closed_loop``) drive
the pool as they drive a server.

Two dispatch modes:

- ``concurrent=False``: one shared queue; each worker takes the next request when it finished
  the last one (a server's instances taking from one queue). For a peer whose generate call
  serves one request at a time (the ``qwen-tts`` package, diffusers ``__call__``).
- ``concurrent=True``: each request goes to the worker with the fewest open requests (ties: the
  lowest index) and runs there on its own thread, so a worker that batches across requests (the
  project's talker scheduler) sees them at once.

Timestamps taken in a worker with :func:`time.perf_counter` are comparable with the client's: on
Linux it is ``CLOCK_MONOTONIC``, one clock for the whole machine (checked at start:
:func:`shared_clock`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

_STOP = None


def shared_clock() -> bool:
    """True when :func:`time.perf_counter` is the machine-wide monotonic clock (Linux), so a
    worker's timestamps can be compared with the client's."""
    return "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation


def pick_worker(open_counts: list[int]) -> int:
    """Index of the worker with the fewest open requests (ties: the lowest index).

    Raises:
        ValueError: no workers.
    """
    if not open_counts:
        raise ValueError("no workers")
    return min(range(len(open_counts)), key=lambda k: (open_counts[k], k))


def _limit_threads() -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    import torch

    torch.set_num_threads(1)  # one torch thread per process, as each Triton stub has


def _worker_main(factory: Callable[..., Callable[[Any], Any]], args: tuple, inbox, outbox, concurrent: bool) -> None:
    """A worker process: build ``factory(*args)`` once, report ready, then answer
    ``(rid, payload)`` with ``(rid, ok, result or error text)`` until the stop sentinel."""
    _limit_threads()
    try:
        handle = factory(*args)
    except BaseException as exc:  # reported to the client, which raises
        outbox.put(("ready", False, f"{type(exc).__name__}: {exc}"))
        return
    outbox.put(("ready", True, os.getpid()))

    def answer(rid, payload):
        try:
            outbox.put((rid, True, handle(payload)))
        except BaseException as exc:  # one bad request must not end the worker
            outbox.put((rid, False, f"{type(exc).__name__}: {exc}"[:300]))

    threads = []
    while (item := inbox.get()) is not _STOP:
        if concurrent:
            t = threading.Thread(target=answer, args=item, daemon=True)
            t.start()
            threads.append(t)
        else:
            answer(*item)
    for t in threads:
        t.join()


class ProcessPool:
    """``n`` worker processes built by ``factory(*args)`` (a picklable module-level callable
    returning ``handle(payload) -> result``; payloads and results must pickle).

    Args:
        n: processes (>= 1).
        factory, args: the worker, built once per process.
        concurrent: see the module docstring.
        ready_timeout_s: seconds to wait for every worker to be built.

    Raises:
        ValueError: ``n`` < 1. RuntimeError: a worker failed to build (its error text) or was
        not ready in time.
    """

    def __init__(self, n: int, factory: Callable[..., Callable[[Any], Any]], args: tuple = (),
                 concurrent: bool = False, ready_timeout_s: float = 900.0):
        if n < 1:
            raise ValueError(f"processes must be >= 1, got {n}")
        ctx = mp.get_context("spawn")
        self.concurrent = concurrent
        self._outbox = ctx.Queue()
        shared = ctx.Queue()
        self._inboxes = [ctx.Queue() if concurrent else shared for _ in range(n)]
        self._procs = [ctx.Process(target=_worker_main, daemon=True,
                                   args=(factory, args, self._inboxes[k], self._outbox, concurrent)) for k in range(n)]
        for p in self._procs:
            p.start()
        self.pids: list[int] = []
        deadline = time.monotonic() + ready_timeout_s
        try:
            while len(self.pids) < n:
                tag, ok, info = self._outbox.get(timeout=max(0.1, deadline - time.monotonic()))
                if not ok:
                    raise RuntimeError(f"a benchmark worker failed to start: {info}")
                self.pids.append(info)
        except queue.Empty:
            self.close()
            raise RuntimeError(f"benchmark workers not ready after {ready_timeout_s} s") from None
        except BaseException:
            self.close()
            raise
        self._lock = threading.Lock()
        self._open = [0] * n
        self._waiting: dict[int, tuple[threading.Event, list]] = {}
        self._where: dict[int, int] = {}
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __len__(self) -> int:
        return len(self._procs)

    def _read(self) -> None:
        while True:
            item = self._outbox.get()
            if item is _STOP:
                return
            rid, ok, value = item
            with self._lock:
                event, slot = self._waiting.pop(rid)
                k = self._where.pop(rid, None)
                if k is not None:
                    self._open[k] -= 1
            slot.extend((ok, value))
            event.set()

    def call(self, payload: Any, timeout_s: float | None = None) -> Any:
        """Run ``payload`` on a worker and return its result (blocks this thread).

        Raises:
            RuntimeError: the worker raised (its error text). TimeoutError: no answer in time.
        """
        event, slot = threading.Event(), []
        with self._lock:
            rid, self._next = self._next, self._next + 1
            self._waiting[rid] = (event, slot)
            k = 0
            if self.concurrent:
                k = pick_worker(self._open)
                self._open[k] += 1
                self._where[rid] = k
        self._inboxes[k].put((rid, payload))
        if not event.wait(timeout_s):
            raise TimeoutError(f"no answer from a benchmark worker in {timeout_s} s")
        ok, value = slot
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        """Stop the workers (they finish what they hold) and the reader; idempotent."""
        for inbox in {id(q): q for q in self._inboxes}.values():
            for _ in self._procs:
                inbox.put(_STOP)
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        if getattr(self, "_reader", None) is not None and self._reader.is_alive():
            self._outbox.put(_STOP)
            self._reader.join(timeout=5)

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
