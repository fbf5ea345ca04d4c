"""Playback-deadline scheduling of streamed synthesis work (issue 13 item 4).

Why: a stage that synthesises whole requests one after another (``piper``'s two workers, a
talker instance generating one request inside ``execute``) makes a new request's *first* chunk
wait behind every later chunk of the requests already running, although those streams are
far ahead of real time: time to first audio (TTFP) grows with the load while the running
listeners gain nothing. This module interleaves the work of concurrent streams step by step
(one sentence, one codec frame) and always runs the step whose audio is due soonest:

- a stream that has sent no audio yet is due at its arrival time (its first chunk is wanted
  now);
- a stream that is playing is due when the audio it has already delivered ends playing
  (:class:`~omni_triton.runtime.playback.PlaybackClock`: first chunk arrival + seconds
  delivered + stalls so far), minus ``guard_s``;
- so a stream far ahead of real time yields to every other, and one about to underrun runs
  first (earliest deadline first: EDF; with FIFO the oldest stream always runs first:
  run to completion, the stage's plain dispatch);
- an unpaced stream (the default since issue 29: every stream, whole clip and batch job whose
  request has no ``PACED``) is never parked: EDF alone is work-conserving, a step waits only for
  more urgent steps and never for the clock, so a stream ends as fast as the stage makes it;
- a *paced* stream (the request's ``PACED`` input: the frontend's opt-in ``stream_pacing:
  "realtime"``) is not computed more than ``max_lead_s`` ahead of its deadline: it waits,
  parked, until ``due() - max_lead_s``. Work-conserving, idle workers run streams seconds ahead
  of their listeners, and on a 2-core machine that work slows the next request's first chunk
  (it waits for a worker, then shares the cores). Parked streams leave the cores to first
  chunks; ``max_lead_s`` (seconds of audio kept ready ahead of the listener) absorbs the wait
  for a worker, so they still do not underrun.

Pure Python, no Triton: :class:`RunQueue` is the ordering (unit-tested without timing),
:class:`StepScheduler` the worker threads that step generators in that order,
:class:`AudioDeadline` / :class:`FrameDeadline` the per-stream deadline models (PCM seconds;
codec frames decoded in chunks). ``omni_triton.adapters.stream.DecoupledStage`` uses them when a
model's ``config.pbtxt`` sets ``scheduling: "deadline"`` (docs/scheduling.md).

The switch off: ``OMNI_TRITON_SCHEDULING=fifo`` in tritonserver's environment (or the config
parameter ``scheduling: "fifo"``) gives each stage its plain dispatch (whole requests in arrival
order, ``PACED`` ignored); the rest of its config stays as it is (docs/scheduling.md "The knobs").
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

LOGGER = logging.getLogger("omni_triton.scheduling")

#: Environment variable that overrides every stage's policy (``fifo`` turns scheduling off).
SCHEDULING_ENV = "OMNI_TRITON_SCHEDULING"
#: config.pbtxt parameter naming a stage's policy.
SCHEDULING_PARAM = "scheduling"


class Policy(str, Enum):
    """How a stage orders the steps of its concurrent streams."""

    DEADLINE = "deadline"  # earliest playback deadline first (first chunks at their arrival)
    FIFO = "fifo"  # oldest stream first: the stage's plain dispatch (whole requests in arrival order)


def scheduling_policy(params: Mapping[str, str], env: Mapping[str, str] | None = None) -> Policy:
    """The policy of one stage.

    ``OMNI_TRITON_SCHEDULING=fifo`` in ``env`` (default ``os.environ``) forces FIFO everywhere (the
    benchmark's "scheduling off" run); otherwise the ``scheduling`` parameter of ``params`` (the
    model's config.pbtxt parameters) decides; absent means FIFO (stages that never opted in).

    Raises:
        ValueError: an unknown policy name in the parameter or the environment.
    """
    env = os.environ if env is None else env
    forced = (env.get(SCHEDULING_ENV) or "").strip().lower()
    if forced:
        Policy(forced)  # validates
        if forced == Policy.FIFO.value:
            return Policy.FIFO
    return Policy((params.get(SCHEDULING_PARAM) or Policy.FIFO.value).strip().lower())


class Deadline(Protocol):
    """A stream's playback deadline (seconds on the scheduler's monotonic clock)."""

    def observe(self, now: float, amount: float) -> None:
        """``amount`` more output (model-specific unit) was sent at ``now``."""

    def due(self) -> float:
        """When the stream's next output must be there for its listener not to stall."""


@dataclass
class AudioDeadline:
    """Deadline of a stream of PCM chunks (``piper``): a real-time player with no buffer.

    Args:
        arrival: when the request arrived (seconds, the scheduler's clock).
        first_audio_budget_s: the first chunk is due this long after ``arrival`` (0: now).
        guard_s: later chunks are due this long before the delivered audio ends playing.

    ``observe(now, seconds)``: ``seconds`` of audio were sent at ``now``.
    """

    arrival: float
    first_audio_budget_s: float = 0.0
    guard_s: float = 0.0
    first_audio: float | None = None
    _play_end: float = field(default=0.0, repr=False)

    def observe(self, now: float, amount: float) -> None:
        if amount <= 0:
            return
        if self.first_audio is None:
            self.first_audio, self._play_end = now, now
        self._play_end = max(self._play_end, now) + amount  # a stall shifts the rest (PlaybackClock)

    def due(self) -> float:
        if self.first_audio is None:
            return self.arrival + self.first_audio_budget_s
        return self._play_end - self.guard_s


@dataclass
class FrameDeadline:
    """Deadline of a talker's codec-frame stream whose consumer decodes chunks
    (:class:`~omni_triton.stages.chunking.ChunkSchedule`: ``first_chunk_frames``, then
    ``chunk_frames``) and plays ``frame_rate_hz`` frames per second of audio.

    The frames of chunk ``j`` become audible together, when the chunk is complete; the chunk is
    due when the audio before it ends playing: ``first_audio + start_j / frame_rate_hz``, where
    ``first_audio`` is when the first chunk's last frame was sent (the decode after it is short).
    Before that the stream is due at ``arrival + first_audio_budget_s``.

    ``observe(now, frames)``: ``frames`` more frames were sent at ``now``.

    Raises:
        ValueError: chunk sizes < 1 or frame rate <= 0.
    """

    arrival: float
    first_chunk_frames: int = 5
    chunk_frames: int = 25
    frame_rate_hz: float = 12.5
    first_audio_budget_s: float = 0.0
    guard_s: float = 0.0
    frames: int = 0
    first_audio: float | None = None

    def __post_init__(self) -> None:
        if self.first_chunk_frames < 1 or self.chunk_frames < 1 or self.frame_rate_hz <= 0:
            raise ValueError("first_chunk_frames, chunk_frames must be >= 1 and frame_rate_hz > 0")

    def observe(self, now: float, amount: float) -> None:
        self.frames += int(amount)
        if self.first_audio is None and self.frames >= self.first_chunk_frames:
            self.first_audio = now

    def due(self) -> float:
        if self.first_audio is None:
            return self.arrival + self.first_audio_budget_s
        later = (self.frames - self.first_chunk_frames) // self.chunk_frames  # full chunks after the first
        chunk_start = self.first_chunk_frames + later * self.chunk_frames  # first frame of the next chunk
        return self.first_audio + chunk_start / self.frame_rate_hz - self.guard_s


@dataclass(eq=False)
class Ticket:
    """One stream in a :class:`RunQueue`: ``seq`` orders arrivals; ``payload`` is the caller's;
    ``paced``: the stream may be parked until ``deadline.due() - max_lead_s``."""

    seq: int
    deadline: Deadline
    payload: Any = None
    paced: bool = False


class RunQueue:
    """The ready streams, most urgent first (not thread-safe; :class:`StepScheduler` locks it).

    A stream is out of the queue while one of its steps runs and is pushed back after it, so its
    deadline is read when it is pushed and cannot change while queued.

    DEADLINE orders by ``(deadline.due(), seq)``: earliest playback deadline first, arrival
    order among equals. FIFO orders by ``seq`` alone: the oldest stream first, i.e. every stream
    runs to its end before a later one starts (with one worker).

    Pacing (DEADLINE only, opt-in per ticket): with ``max_lead_s`` set, a ``paced`` ticket is
    *eligible* only from ``deadline.due() - max_lead_s`` on; an unpaced one always is (so the
    queue is work-conserving for it); :meth:`pop` with ``now`` returns the most urgent eligible
    ticket and :meth:`next_eligible` says when a parked one becomes eligible.

    Raises:
        ValueError: ``max_lead_s`` < 0.
    """

    def __init__(self, policy: Policy = Policy.DEADLINE, max_lead_s: float | None = None):
        self.policy = Policy(policy)
        if max_lead_s is not None and max_lead_s < 0:
            raise ValueError("max_lead_s must be >= 0")
        self.max_lead_s = max_lead_s if self.policy is Policy.DEADLINE else None
        self._heap: list[tuple[tuple[float, ...], int, Ticket]] = []
        self._seq = itertools.count()
        self._push_seq = itertools.count()

    def ticket(self, deadline: Deadline, payload: Any = None, paced: bool = False) -> Ticket:
        """A new stream's ticket (the next arrival number)."""
        return Ticket(next(self._seq), deadline, payload, paced)

    def eligible_at(self, ticket: Ticket) -> float:
        """When ``ticket`` may run: ``-inf`` (now) unless it is paced under a ``max_lead_s``."""
        if self.max_lead_s is None or not ticket.paced:
            return float("-inf")
        return ticket.deadline.due() - self.max_lead_s

    def key(self, ticket: Ticket) -> tuple[float, ...]:
        if self.policy is Policy.FIFO:
            return (ticket.seq,)
        return (ticket.deadline.due(), ticket.seq)

    def push(self, ticket: Ticket) -> None:
        heapq.heappush(self._heap, (self.key(ticket), next(self._push_seq), ticket))

    def pop(self, now: float | None = None) -> Ticket | None:
        """The most urgent stream, removed; ``None`` when empty. With ``now`` (scheduler clock,
        s): the most urgent one eligible at ``now`` (parked paced streams are skipped and stay
        queued); ``None`` when none is."""
        if now is None or self.max_lead_s is None:
            return heapq.heappop(self._heap)[2] if self._heap else None
        parked, found = [], None
        while self._heap:
            item = heapq.heappop(self._heap)
            if self.eligible_at(item[2]) <= now:
                found = item[2]
                break
            parked.append(item)
        for item in parked:  # keys unchanged: a queued stream's deadline cannot move
            heapq.heappush(self._heap, item)
        return found

    def next_eligible(self) -> float | None:
        """The earliest time a queued stream becomes eligible (``-inf``: one is now); ``None``
        when empty."""
        return min((self.eligible_at(item[2]) for item in self._heap), default=None)

    def __len__(self) -> int:
        return len(self._heap)


@dataclass(eq=False)
class _Stream:
    steps: Iterator[Any]
    on_output: Callable[[Any], float]
    on_end: Callable[[BaseException | None], None]
    on_start: Callable[[], None] | None = None
    started: bool = False


class StepScheduler:
    """Worker threads that step many streams' generators, one step at a time, in
    :class:`RunQueue` order.

    ``submit`` a stream's generator (each ``next()`` is one unit of work: a sentence, a codec
    frame); a worker takes the most urgent stream, runs one step, hands the output to
    ``on_output`` (which sends it and returns its amount for the deadline: audio seconds,
    frames), and queues the stream again. A stream is stepped by one worker at a time, so its
    outputs stay in order. ``on_end(None)`` after the last step, ``on_end(exc)`` when a step
    raised; exceptions of the callbacks are logged, never kill a worker.

    Args:
        workers: threads (1 for Python-bound talkers; Piper's onnxruntime releases the GIL: 2).
        policy: the :class:`RunQueue` order.
        name: thread name prefix.
        clock: monotonic seconds (injectable for tests).
        max_lead_s: how far (seconds) ahead of its playback deadline a paced stream may be
            computed (``None``: no pacing; :class:`RunQueue`). Workers sleep until a parked
            stream becomes eligible or a new one arrives.

    Raises:
        ValueError: ``workers`` < 1, ``max_lead_s`` < 0.
    """

    def __init__(self, workers: int, policy: Policy = Policy.DEADLINE, name: str = "scheduler",
                 clock: Callable[[], float] = time.monotonic, max_lead_s: float | None = None):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.clock = clock
        self.queue = RunQueue(policy, max_lead_s)
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, steps: Iterator[Any], deadline: Deadline, on_output: Callable[[Any], float],
               on_end: Callable[[BaseException | None], None],
               on_start: Callable[[], None] | None = None, paced: bool = False) -> None:
        """Queue a new stream (its first step is due at ``deadline.due()``); ``on_start`` runs
        before its first step; ``paced``: its client plays it in real time (``max_lead_s``).

        Raises:
            RuntimeError: the scheduler is closed.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("scheduler closed")
            self.queue.push(self.queue.ticket(deadline, _Stream(iter(steps), on_output, on_end, on_start), paced))
            self._cond.notify()

    def _next(self) -> Ticket | None:
        """The next ticket to step, waiting for one to be queued and eligible; ``None`` when
        closed. Called with ``_cond`` held."""
        while not self._closed:
            ticket = self.queue.pop(self.clock())
            if ticket is not None:
                return ticket
            at = self.queue.next_eligible()
            # a parked stream: sleep until it is eligible (re-checked: the clock may be a test's)
            self._cond.wait(None if at is None else min(max(at - self.clock(), 0.001), 1.0))
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                ticket = self._next()
                if ticket is None:
                    return
            if self._step(ticket):
                with self._cond:
                    if self._closed:
                        return
                    self.queue.push(ticket)
                    self._cond.notify()

    def _step(self, ticket: Ticket) -> bool:
        """Run one step of ``ticket``'s stream; True when it has more."""
        s: _Stream = ticket.payload
        try:
            if not s.started:
                s.started = True
                if s.on_start is not None:
                    s.on_start()
            out = next(s.steps)
        except StopIteration:
            self._end(s, None)
            return False
        except Exception as exc:
            self._end(s, exc)
            return False
        try:
            amount = s.on_output(out)
            ticket.deadline.observe(self.clock(), float(amount or 0.0))
        except Exception as exc:
            self._end(s, exc)
            return False
        return True

    @staticmethod
    def _end(s: _Stream, error: BaseException | None) -> None:
        try:
            s.steps.close() if hasattr(s.steps, "close") else None
        except Exception:
            LOGGER.exception("closing a stream's generator")
        try:
            s.on_end(error)
        except Exception:
            LOGGER.exception("ending a scheduled stream")

    def close(self) -> None:
        """Stop the workers after their current step; each stream still queued ends with
        ``on_end(RuntimeError)`` (the model is being unloaded: its requests get their FINAL)."""
        with self._cond:
            self._closed = True
            left: list[Ticket] = []
            while (ticket := self.queue.pop()) is not None:  # no clock: parked ones too
                left.append(ticket)
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5.0)
        for ticket in left:
            self._end(ticket.payload, RuntimeError("stage unloading"))


@dataclass
class TokenDeadline:
    """Deadline of a thinker's token stream whose consumer speaks one token per codec frame
    (``qwen3_omni_thinker`` -> ``qwen3_omni_talker``, speaking while thinking).

    Why frames: after its prefill the Qwen3-Omni talker adds one thinker text embedding per codec
    frame (transformers 5.19 ``modeling_qwen3_omni_moe.py``,
    ``Qwen3OmniMoeTalkerForConditionalGeneration.prepare_inputs_for_generation``:
    ``trailing_text_hidden[:, generation_step]``; ``generate``: "The talker consumes one entry of
    `trailing_text_hidden` per step"), so thinker token ``i`` is needed about when the frame it
    conditions is, and that frame is due when its chunk is (:class:`FrameDeadline`). Entry ``k``
    is the row of generated token ``k + 1``, and a token's row comes out of the forward that
    computes the *next* token: frame ``k`` needs ``k + 1 + lead_tokens`` tokens, ``lead_tokens``
    = 1 (``OmniTalker.stream_while_thinking``). So: the first ``lead_tokens +
    first_chunk_frames`` tokens (the first chunk's, plus its lead) are due at ``arrival +
    first_audio_budget_s``, like a first chunk; each later token is due with the frame it feeds.

    A reader of text alone gets the same pace (``frame_rate_hz`` tokens per second, 12.5:
    faster than anyone reads). ``observe(now, tokens)``: ``tokens`` more were sent at ``now``.

    Raises:
        ValueError: ``lead_tokens`` < 0 or invalid chunk numbers (:class:`FrameDeadline`).
    """

    arrival: float
    first_chunk_frames: int = 5
    chunk_frames: int = 25
    frame_rate_hz: float = 12.5
    lead_tokens: int = 1
    first_audio_budget_s: float = 0.0
    guard_s: float = 0.0
    tokens: int = 0

    def __post_init__(self) -> None:
        if self.lead_tokens < 0:
            raise ValueError("lead_tokens must be >= 0")
        self._frames = FrameDeadline(self.arrival, self.first_chunk_frames, self.chunk_frames, self.frame_rate_hz,
                                     self.first_audio_budget_s, self.guard_s)

    def observe(self, now: float, amount: float) -> None:
        before, self.tokens = self.tokens, self.tokens + int(amount)
        frames = max(self.tokens - self.lead_tokens, 0) - max(before - self.lead_tokens, 0)
        if frames > 0:
            self._frames.observe(now, frames)

    def due(self) -> float:
        return self._frames.due()


class DueBatchQueue:
    """Work items of a dynamically batched stage (a codec decoder), taken as batches in
    earliest-deadline order (issue 13 item 4).

    Why: Triton's dynamic batcher hands ``execute`` whatever queued together, and a non-decoupled
    ``execute`` answers all of its requests at its end. A codec decoder runs one forward pass
    per chunk length (padding would change a shorter chunk's last samples), so a new stream's
    5-frame first chunk batched with other streams' later chunks of 5 other lengths waited for
    all 6 passes, after waiting for the whole previous ``execute`` (measured at c=8 with
    staggered arrivals: 100-220 ms of passes, 17-124 ms of waiting; docs/scheduling.md). Here the
    stage queues its requests and a worker takes the most urgent item and every queued item
    that can share its pass (the same ``key``), so a first chunk waits for at most the pass
    that is running, and each pass is answered as soon as it ends.

    ``due`` is monotonic seconds: when the chunk's decoding is due (a first chunk: its arrival;
    a later one: a guard before the audio its listener already has ends playing). Equal dues
    keep arrival order; with :attr:`Policy.FIFO` arrival order alone decides which item leads a
    batch.

    Every queued item of the lead's key joins it (up to ``max_batch``), due or not: a pass has
    a fixed cost besides its rows (the Qwen3-TTS decoder, 5 frames: ~23 ms for 1 row, ~50 ms for
    8), and taking only the items already due made more passes and overloaded the decoder
    (measured: clone underrun 4.25 s against 0.82-1.28 s at c=8).

    Thread-safe.

    Args:
        policy: DEADLINE (earliest due first) or FIFO (oldest first).
    """

    def __init__(self, policy: Policy = Policy.DEADLINE):
        self.policy = Policy(policy)
        self._items: list[tuple[float, int, Any, Any]] = []  # (due, seq, key, item)
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: Any, due: float, key: Any = None) -> None:
        """Queue ``item``, needed at ``due`` (monotonic s); items of one ``key`` may share a batch.

        Raises:
            RuntimeError: the queue is closed.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("queue closed")
            self._items.append((float(due), next(self._seq), key, item))
            self._cond.notify()

    def _order(self, entry: tuple[float, int, Any, Any]) -> tuple[float, ...]:
        return (entry[1],) if self.policy is Policy.FIFO else (entry[0], entry[1])

    def take(self, max_batch: int, timeout: float | None = None) -> list[Any]:
        """The next batch (blocking): the most urgent item and the queued items of its key, most
        urgent first, at most ``max_batch``; ``[]`` after ``timeout`` s with nothing queued, or
        once closed."""
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout)
            if self._closed or not self._items:
                return []
            ordered = sorted(self._items, key=self._order)
            key = ordered[0][2]
            batch = [e for e in ordered if e[2] == key][:max(1, int(max_batch))]
            taken = {id(e) for e in batch}
            self._items = [e for e in self._items if id(e) not in taken]
            return [e[3] for e in batch]

    def close(self) -> list[Any]:
        """Close the queue; returns the items still queued (their requests must be answered)."""
        with self._cond:
            self._closed = True
            left = [e[3] for e in sorted(self._items, key=self._order)]
            self._items = []
            self._cond.notify_all()
        return left

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
