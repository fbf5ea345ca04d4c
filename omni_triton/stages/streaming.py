"""Streaming out of transformers ``generate``: run it on a thread and hand over what its streamer
queues, with a stopping criterion that ends it early (consumer gone or request cancelled).
Shared by the CSM talker and the Qwen3-Omni thinker and talker.

Paced generation (the deadline scheduler's mode, ``omni_triton.runtime.scheduling``): a
:class:`Gate` makes the generate thread stop after each unit (a token, a codec frame) until its
consumer asks for the next, so several generations of one model object interleave unit by unit
and none runs ahead on its own thread. :class:`ThreadHook` / :class:`ThreadPrepare` give such
concurrent generations of one shared module their own forward hook and
``prepare_inputs_for_generation`` override (module-level hooks would see every thread's steps).
"""
from __future__ import annotations

import contextlib
import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import torch


def stopping_criteria(should_stop: Callable[[torch.Tensor], bool]):
    """A transformers ``StoppingCriteria`` calling ``should_stop(input_ids)`` after every step."""
    from transformers import StoppingCriteria

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), bool(should_stop(input_ids)), dtype=torch.bool)

    return _Stop()


class GenerationCancelled(Exception):
    """Raised inside a paced ``generate`` (at its :meth:`Gate.park`) when its consumer closed."""


#: Queued by :meth:`Gate.park`: the generate thread has stopped after its unit of work.
PARKED = object()


class Gate:
    """Paces a generate thread by its consumer: the thread computes only between a
    :meth:`release` (the consumer asks for the next unit) and its next :meth:`park` (called on the
    generate thread after it queued a unit; it queues :data:`PARKED` and waits).

    While parked, other generations of the same model run (on their own threads, one at a time:
    each consumer waits for ``PARKED`` before it goes on). What one generation keeps on the shared
    model object between steps is saved at ``park`` and restored at the release: ``state``
    ``(object, attribute)`` pairs (Qwen's ``rope_deltas``, set at prefill and read at every decode
    step), and torch's global RNG state (sampling: each stream keeps its own random sequence).

    Raises (in ``park``): :class:`GenerationCancelled` when ``closed`` is set.
    """

    def __init__(self, q: queue.Queue, closed: threading.Event, state: Iterable[tuple[object, str]] = ()):
        self.q, self.closed = q, closed
        self.state = list(state)
        self._sem = threading.Semaphore(0)

    def park(self) -> None:
        saved = [(o, a, getattr(o, a, None)) for o, a in self.state]
        rng = torch.get_rng_state()
        self.q.put(PARKED)
        while not self._sem.acquire(timeout=0.05):
            if self.closed.is_set():
                raise GenerationCancelled()
        if self.closed.is_set():
            raise GenerationCancelled()
        torch.set_rng_state(rng)
        for o, a, v in saved:
            setattr(o, a, v)

    def release(self) -> None:
        self._sem.release()


class _PerThread:
    """A handler per calling thread, set for the duration of :meth:`active` (none outside)."""

    def __init__(self):
        self._local = threading.local()

    def _fn(self):
        return getattr(self._local, "fn", None)

    @contextlib.contextmanager
    def active(self, fn):
        self._local.fn = fn
        try:
            yield
        finally:
            self._local.fn = None


class ThreadHook(_PerThread):
    """One forward hook on a shared module, calling the handler the *calling thread* set with
    :meth:`active` (none: nothing), so concurrent generations of one model each see only their own
    forward passes."""

    def __init__(self, module):
        super().__init__()
        self.handle = module.register_forward_hook(self._call)

    def _call(self, module, args, output):
        fn = self._fn()
        if fn is not None:
            fn(module, args, output)


class ThreadPrepare(_PerThread):
    """``module.prepare_inputs_for_generation`` wrapped once: the calling thread's ``fn(kwargs)``
    (set with :meth:`active`) may rewrite its keyword arguments before the original runs."""

    def __init__(self, module):
        super().__init__()
        original = module.prepare_inputs_for_generation

        @functools.wraps(original)  # generate inspects its signature
        def prepare(*args, **kwargs):
            fn = self._fn()
            return original(*args, **(fn(kwargs) if fn is not None else kwargs))

        module.prepare_inputs_for_generation = prepare


def threaded_generate(run: Callable[[], object], q: queue.Queue, done: object, closed: threading.Event,
                      name: str = "generate", gate: Gate | None = None) -> Iterator:
    """Run ``run()`` on a thread (one torch thread); yield the lists of items it queues (batched by
    what is already there) until it returns, then its return value; re-raise its exception.
    Closing the generator early sets ``closed`` (``run``'s stopping criterion must watch it) and
    joins the thread.

    ``gate`` (paced): the thread is started by the first ``next()`` and released by each later
    one; each list holds what it queued up to its next :meth:`Gate.park` (one unit of work)."""
    if gate is not None:
        yield from _paced_generate(run, q, done, closed, name, gate)
        return
    box: dict = {}
    th = threading.Thread(target=_thread_target(run, q, done, box), name=name, daemon=True)
    th.start()
    try:
        finished = False
        while not finished:
            items = [q.get()]
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            if items[-1] is done:
                items.pop()
                finished = True
            yield items
    finally:
        closed.set()
        th.join()
    if "error" in box:
        raise box["error"]
    yield box.get("result")  # last item: generate's return value


def _thread_target(run, q: queue.Queue, done: object, box: dict, quiet: tuple = ()) -> Callable[[], None]:
    """The generate thread's body: ``run()`` with one torch thread under inference mode, its
    result or exception (other than ``quiet`` ones) in ``box``, then ``done`` queued."""
    def target():
        try:
            torch.set_num_threads(1)
            with torch.inference_mode():
                box["result"] = run()
        except quiet:
            pass
        except BaseException as e:  # re-raised in the consumer
            box["error"] = e
        finally:
            q.put(done)

    return target


def _paced_generate(run, q, done, closed, name, gate: Gate) -> Iterator:
    box: dict = {}
    th = threading.Thread(target=_thread_target(run, q, done, box, quiet=(GenerationCancelled,)), name=name,
                          daemon=True)
    try:
        finished = False
        while not finished:
            if th.ident is None:
                th.start()
            else:
                gate.release()
            items = []
            while True:
                item = q.get()
                if item is PARKED:
                    break
                if item is done:
                    finished = True
                    break
                items.append(item)
            if items or not finished:  # the release that only ends generate queues nothing
                yield items
    finally:
        closed.set()
        if th.ident is not None:
            th.join()
    if "error" in box:
        raise box["error"]
    yield box.get("result")
