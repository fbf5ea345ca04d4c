"""Work that grows with a request, run off the event loop with a bound.

The event loop only moves bytes between sockets and Triton; anything whose cost scales with what
a client sent (decoding and resizing images, decoding audio, tokenizing, rendering a chat
template, hashing files, SQLite commits with their fsync) runs in a worker thread through
:func:`off_loop`. At most :data:`MAX_WORKERS` such calls run at once per event loop; the others
wait their turn without holding a thread, so a flood of uploads queues instead of spawning
threads (each caller still holds its request's bytes, which the body cap bounds).

A thread only helps when the work releases the GIL (Pillow, libsndfile, soxr, numpy, hashlib on
large buffers, ``tokenizers``' batch encode, SQLite all do). Pure-Python loops and Python's ``re``
hold it: those must be linear and bounded by a size cap instead (``serving.speech_stream``'s
sentence splitter, ``schemas``' text caps).
"""

from __future__ import annotations

import asyncio
import functools
import os
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")

#: calls of :func:`off_loop` running at once (per event loop); the rest wait. One core is left
#: to the event loop (on 2 cores, two decoding threads made /health's p99 ~95 ms under an
#: image-to-video upload flood; the loop competes with them for the CPU, not only the GIL)
MAX_WORKERS = max(1, min(8, (os.cpu_count() or 2) - 1))

_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


def _limiter() -> anyio.CapacityLimiter:
    """The limiter of the running loop (a limiter belongs to the loop that made it; unit tests run
    one loop per ``TestClient``)."""
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        limiter = _limiters[loop] = anyio.CapacityLimiter(MAX_WORKERS)
    return limiter


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, at most :data:`MAX_WORKERS` at once.

    Exceptions propagate unchanged (an ``OpenAIError`` raised by a validator in the thread
    becomes the request's 4xx as if raised on the loop). Cancelling the caller waits for ``fn``
    to return (a thread cannot be interrupted) and then raises ``CancelledError``.
    """
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=_limiter())
