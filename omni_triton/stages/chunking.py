"""The chunk schedule of streamed codec decoding (vLLM-Omni's code2wav scheme: a small first
chunk, then fixed chunks, each decoded with left context), shared by codec TTS and Qwen3-Omni;
and the size of the first chunk chosen from load (:func:`dynamic_initial_chunk_frames`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# ------------------------------------------------------------------------------ chunk schedule


@dataclass
class ChunkSchedule:
    """Decides code2wav chunks from a growing list of frames (pure python, no torch).

    vLLM-Omni's Qwen3-TTS talker -> code2wav connector streams 25-frame chunks, each decoded with
    25 frames of left context (connector ``extra``: ``codec_chunk_frames: 25``,
    ``codec_left_context_frames: 25``, and ``initial_codec_chunk_frames`` for a smaller first
    chunk, which lowers time-to-first-packet).

    Usage: call :meth:`push` with the total number of frames seen so far; it returns the ready
    chunks as ``(start, end, left_context)`` frame indices: decode ``frames[start:end]`` and keep
    the audio after the first ``left_context`` frames (``start = first_new - left_context``).
    At the end call :meth:`flush` for the tail. Every frame is emitted exactly once, in order.

    Low water (``low_water_s`` > 0; off by default, the fixed scheme above): the schedule also
    keeps a real-time listener's playback clock (each chunk adds its new frames /
    ``frame_rate_hz`` seconds from when it was scheduled, a stall shifting the rest, as
    ``omni_triton.runtime.playback.PlaybackClock``) and, when the audio already scheduled would
    end playing within ``low_water_s`` of now, schedules the pending frames early as a shorter
    chunk (at least ``first_chunk_frames`` of them). Why: after the small first chunk (5 frames:
    0.4 s of audio at 12.5 Hz) the fixed scheme waits for 25 more frames, which must be generated
    within those 0.4 s, i.e. at 5x real time; under load a talker slower than that stalls every
    stream at its second chunk (docs/notes/scheduling-2026-12.md, "Results"). Early chunks only come when the
    listener would otherwise stall, so an unloaded stream keeps the fixed chunks; the audio is the
    same within the decoder's left-context tolerance (``tests/unit/test_codec_tts.py``).

    Once the listener has run dry anyway (the audio scheduled before ended before the next frames
    came), low water is off for the rest of the stream: the talker is then slower than real time
    for it, so no chunking avoids the stalls, and early chunks would only add decode work (a
    5-frame chunk decodes 30 frames with its left context, 6 per new frame; a 25-frame one 2),
    taking compute from the talker and so from every stream on the machine.

    Args:
        first_chunk_frames, chunk_frames, left_context_frames: the fixed scheme (frames).
        low_water_s: seconds of scheduled-but-unplayed audio below which pending frames are
            scheduled early (0: never).
        due_guard_s: :meth:`due_in_s` of a later chunk is this much before the audio before it
            ends playing (the decode time it needs; config ``deadline_guard_ms``).
        frame_rate_hz: codec frames per second of audio (12.5 for Mimi / the Qwen3 codecs).
        clock: monotonic seconds (injectable for tests).

    Raises:
        ValueError: chunk sizes < 1, left context < 0, ``low_water_s`` < 0 or frame rate <= 0.
    """

    first_chunk_frames: int = 5
    chunk_frames: int = 25
    left_context_frames: int = 25
    emitted: int = 0  # frames whose audio has been scheduled
    low_water_s: float = 0.0
    frame_rate_hz: float = 12.5
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    due_guard_s: float = 0.0  # a later chunk is due this long before the audio before it ends
    _play_end: float | None = field(default=None, repr=False)  # when the scheduled audio ends playing
    _due_in: dict = field(default_factory=dict, repr=False)  # chunk -> seconds until its decoding is due
    ran_dry: bool = field(default=False, repr=False)  # the listener stalled once: low water off

    def __post_init__(self):
        if self.first_chunk_frames < 1 or self.chunk_frames < 1 or self.left_context_frames < 0:
            raise ValueError("first_chunk_frames, chunk_frames must be >= 1, left_context_frames >= 0")
        if self.low_water_s < 0 or self.frame_rate_hz <= 0 or self.due_guard_s < 0:
            raise ValueError("low_water_s and due_guard_s must be >= 0 and frame_rate_hz > 0")

    def _next_size(self) -> int:
        return self.first_chunk_frames if self.emitted == 0 else self.chunk_frames

    def _chunk(self, end: int) -> tuple[int, int, int]:
        new_start = self.emitted
        start = max(0, new_start - self.left_context_frames)
        self.emitted = end
        return (start, end, new_start - start)

    def push(self, total_frames: int) -> list[tuple[int, int, int]]:
        out = []
        while total_frames - self.emitted >= self._next_size():
            out.append(self._chunk(self.emitted + self._next_size()))
        if self.low_water_s > 0 and not self.ran_dry:
            now = self.clock()
            if self._play_end is not None and self._play_end < now:
                self.ran_dry = True  # slower than real time for this stream: the fixed chunks from now on
                return out
            self._played(out, now)
            if (self._play_end is not None and total_frames - self.emitted >= self.first_chunk_frames
                    and self._play_end - now <= self.low_water_s):
                early = [self._chunk(total_frames)]  # the listener is about to run dry
                self._played(early, now)
                out += early
        return out

    def _played(self, chunks: list[tuple[int, int, int]], now: float) -> None:
        """Advance the listener's playback clock by the new frames of ``chunks`` scheduled at ``now``
        (and note when each chunk's audio is needed: when the audio before it ends playing)."""
        for chunk in chunks:
            start, end, left = chunk
            self._due_in[chunk] = 0.0 if self._play_end is None else self._play_end - now - self.due_guard_s
            self._play_end = max(self._play_end if self._play_end is not None else now, now) + \
                (end - start - left) / self.frame_rate_hz

    def due_in_s(self, chunk: tuple[int, int, int]) -> float | None:
        """Seconds from when ``chunk`` (one returned by :meth:`push`) was scheduled until its
        decoding is due: 0 for the first chunk (now), else when the audio scheduled before it
        ends playing minus ``due_guard_s`` (time to decode it; negative: overdue, more urgent
        than a new stream's first chunk). ``None`` when the schedule keeps no playback clock
        (low water off, the listener ran dry, the tail of :meth:`flush`): needed now. Each
        chunk's value is read once."""
        return self._due_in.pop(chunk, None)

    def flush(self, total_frames: int) -> list[tuple[int, int, int]]:
        out = self.push(total_frames)
        if total_frames > self.emitted:
            out.append(self._chunk(total_frames))
        return out


def schedule_params(params: dict[str, str]) -> dict:
    """:class:`ChunkSchedule` keyword arguments from a BLS model's config.pbtxt parameters:
    ``first_chunk_frames`` (5), ``chunk_frames`` (25), ``left_context_frames`` (25),
    ``low_water_ms`` (0: off), ``frame_rate_hz`` (12.5) and ``deadline_guard_ms`` (0);
    validated (``ValueError``)."""
    kw = dict(first_chunk_frames=int(params.get("first_chunk_frames", "5")),
              chunk_frames=int(params.get("chunk_frames", "25")),
              left_context_frames=int(params.get("left_context_frames", "25")),
              low_water_s=float(params.get("low_water_ms", "0")) / 1000.0,
              frame_rate_hz=float(params.get("frame_rate_hz", "12.5")),
              due_guard_s=float(params.get("deadline_guard_ms", "0")) / 1000.0)
    ChunkSchedule(**kw)  # validates
    return kw


# ------------------------------------------------------------------------ dynamic first chunk


def initial_chunk_steps(lo: int = 2, hi: int = 16) -> list[int]:
    """The first-chunk sizes :func:`dynamic_initial_chunk_frames` picks from: ``lo`` doubled while
    it stays <= ``hi`` (2, 4, 8, 16 for the defaults).

    Raises:
        ValueError: ``lo`` < 1 or ``hi`` < ``lo``.
    """
    if lo < 1 or hi < lo:
        raise ValueError(f"initial chunk frames need 1 <= min <= max, got {lo}, {hi}")
    steps = [lo]
    while steps[-1] * 2 <= hi:
        steps.append(steps[-1] * 2)
    return steps


def dynamic_initial_chunk_frames(active: int, capacity: int, lo: int = 2, hi: int = 16) -> int:
    """Frames of a new request's first chunk, from the load when it starts: small when the stage is
    idle (first audio after fewer talker steps), larger under load (fewer, cheaper decodes: a
    2-frame first chunk costs one code2wav call per 0.16 s of audio).

    The rule is vLLM-Omni's dynamic initial chunk (pull request #1714, "Simple dynamic TTFA based
    on Code2Wav load"; ``compute_dynamic_initial_chunk_size`` in
    ``vllm_omni/model_executor/stage_input_processors/chunk_size_utils.py``, read, not copied):
    the sizes are powers of two from 2 up to the largest below the steady chunk (16 for 25
    frames); the load factor is ``min(active / capacity, 1)``; the size is the step at index
    ``round(load * (steps - 1))``. vLLM-Omni counts the requests still in their first chunk over
    the scheduler's ``max_num_seqs`` and recomputes on every call; here the caller passes the
    open streams of the stage and its admitted concurrency, and the size is chosen once, when the
    request starts (a size that changed mid-stream would move chunk boundaries already sent).

    Args:
        active: other requests open at the stage when this one starts (>= 0).
        capacity: requests the stage admits at once (its BLS instance count); <= 0: idle (``lo``).
        lo, hi: ``initial_chunk_frames_min`` / ``initial_chunk_frames_max`` (config; 2 / 16).

    Returns:
        frames of the first chunk, one of :func:`initial_chunk_steps` ``(lo, hi)``.

    Raises:
        ValueError: ``lo`` < 1 or ``hi`` < ``lo``.
    """
    steps = initial_chunk_steps(lo, hi)
    if capacity <= 0:
        return steps[0]
    load = min(max(active, 0) / capacity, 1.0)
    return steps[int(round(load * (len(steps) - 1)))]


@dataclass(frozen=True)
class InitialChunk:
    """A BLS's first-chunk policy (config ``initial_chunk_frames_min`` / ``_max``).

    Attributes:
        lo, hi: the range of :func:`dynamic_initial_chunk_frames`; ``None`` when the config sets
            neither: the fixed ``first_chunk_frames`` for every request.
        capacity: requests the BLS admits at once (its instance count).
    """

    lo: int | None = None
    hi: int | None = None
    capacity: int = 1

    @classmethod
    def from_params(cls, params: dict[str, str], chunk_frames: int, capacity: int) -> InitialChunk:
        """From config parameters; off when neither bound is set.

        Raises:
            ValueError: only one bound set, min < 1, max < min, or max > ``chunk_frames``.
        """
        lo, hi = params.get("initial_chunk_frames_min"), params.get("initial_chunk_frames_max")
        if lo is None and hi is None:
            return cls(None, None, capacity)
        if lo is None or hi is None:
            raise ValueError("initial_chunk_frames_min and initial_chunk_frames_max go together")
        initial_chunk_steps(int(lo), int(hi))  # validates
        if int(hi) > chunk_frames:
            raise ValueError(f"initial_chunk_frames_max {hi} > chunk_frames {chunk_frames}")
        return cls(int(lo), int(hi), max(1, int(capacity)))

    def frames(self, active: int, fixed: int) -> int:
        """The first chunk of a request starting while ``active`` others are open (``fixed``,
        the config's ``first_chunk_frames``, when off)."""
        if self.lo is None or self.hi is None:
            return fixed
        return dynamic_initial_chunk_frames(active, self.capacity, self.lo, self.hi)


def instance_count(args: dict) -> int:
    """A Triton model's instance count (the sum of its ``instance_group`` counts) from the
    ``args`` of ``initialize`` (``model_config`` JSON); 1 when it names none."""
    import json

    config = json.loads(args.get("model_config", "{}") or "{}")
    return max(1, sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1)


def fixed_if_unpaced(kw: dict, paced: bool) -> dict:
    """``kw`` (:func:`schedule_params`) with low water off unless the request is ``paced``: a
    whole clip has no listener to keep fed, and fixed later chunks keep its bytes closer from run
    to run (early chunks move chunk boundaries, and so PCM16 samples by a step, with the machine's
    load; the dynamic first chunk, :func:`dynamic_initial_chunk_frames`, moves the first boundary
    with the load for every request)."""
    return kw if paced else {**kw, "low_water_s": 0.0}


def chunk_slices(frames: np.ndarray, chunks: Sequence[tuple[int, int, int]]) -> list[tuple[np.ndarray, int]]:
    """``(codes_with_context [end-start, K], left_context)`` for each ``(start, end, left)``."""
    return [(frames[s:e], left) for s, e, left in chunks]


class ChunkedDecoder:
    """Streamed decoding with left context: frames in, PCM chunks out, as the schedule allows.

    The one frames -> :class:`ChunkSchedule` -> decode loop of every streaming codec path (the
    ``csm`` and ``qwen3_omni`` BLS models, :func:`~omni_triton.stages.csm.synthesize_reference`,
    :func:`~omni_triton.stages.qwen3_omni.run_pipeline`, the TTS benchmark's in-process codec);
    only the decode call differs, so it is injected.

    Args:
        schedule: the chunk schedule (fresh per stream).
        decode: ``(codes int64 [T, K] with left context, left_context frames) -> float32 PCM`` of
            the new frames only (a BLS call of a code2wav stage, or a codec in-process); with
            ``with_due``, ``decode(codes, left, due_s)``, ``due_s`` the chunk's
            :meth:`ChunkSchedule.due_in_s` (for a decoder that takes the most urgent chunk first).
        num_codebooks: K, for the empty frame matrix before the first push.
    """

    def __init__(self, schedule: ChunkSchedule, decode, num_codebooks: int = 0, with_due: bool = False):
        self.schedule = schedule
        self.decode = decode
        self.with_due = with_due
        self._parts: list[np.ndarray] = []
        self._codes = np.zeros((0, num_codebooks), np.int64)

    @property
    def codes(self) -> np.ndarray:
        """Every frame pushed so far, ``int64 [T, K]``."""
        if self._parts:
            parts = [self._codes, *self._parts] if self._codes.size else self._parts
            self._codes = np.concatenate(parts)
            self._parts = []
        return self._codes

    @property
    def total(self) -> int:
        return len(self._codes) + sum(len(p) for p in self._parts)

    def _run(self, chunks) -> list[np.ndarray]:
        if not chunks:
            return []
        out = []
        for (c, left), chunk in zip(chunk_slices(self.codes, chunks), chunks, strict=False):
            due = self.schedule.due_in_s(chunk)
            out.append(self.decode(c, left, due) if self.with_due else self.decode(c, left))
        return out

    def push(self, frames: np.ndarray) -> list[np.ndarray]:
        """Add ``frames`` (``[n, K]``; empty is fine) and decode every chunk now ready."""
        if len(frames):
            self._parts.append(np.asarray(frames).reshape(-1, np.asarray(frames).shape[-1]))
        return self._run(self.schedule.push(self.total))

    def flush(self) -> list[np.ndarray]:
        """Decode the tail (end of the stream)."""
        return self._run(self.schedule.flush(self.total))


class FrameGroups:
    """Codec frames collected into responses of ``size`` frames (a talker's stream to its BLS).

    A talker that sends one response per frame pays one stub -> server -> BLS hop per frame and
    stream (8 streams: 8 hops per batched step), CPU taken from the decoder that makes first
    audio. Grouping by ``size`` loses nothing when ``size`` divides the consumer's chunk sizes:
    every chunk still becomes ready on the frame that completes it (the consumer's
    ``first_chunk_frames`` and ``chunk_frames``; ``tests/unit/test_scheduling.py`` checks the
    configs). Not thread-safe: one stream, one owner.

    With ``first`` (the consumer's first chunk of this request, :data:`FIRST_CHUNK_FRAMES
    <omni_triton.contracts.codec.FIRST_CHUNK_FRAMES>`) the first response holds ``first`` frames
    and the later ones ``size``: the first chunk is ready on its last frame whatever its size, and
    later chunk boundaries (``first + k * chunk_frames``) stay on group boundaries.

    Args:
        size: frames per response (>= 1; 1 = one response per frame).
        first: frames of the first response (>= 1; ``None``: ``size``).

    Raises:
        ValueError: ``size`` or ``first`` < 1.
    """

    def __init__(self, size: int, first: int | None = None):
        if int(size) < 1 or (first is not None and int(first) < 1):
            raise ValueError(f"frames per response must be >= 1, got {size} (first {first})")
        self.size = int(size)
        self._next = self.size if first is None else int(first)
        self._frames: list[np.ndarray] = []

    def push(self, frames: np.ndarray) -> np.ndarray | None:
        """Add one frame (``int64 [K]``) or several (``[n, K]``); returns the complete groups now
        held (``int64 [m * size, K]``, m >= 1), else None. The rest waits for the next push."""
        frames = np.asarray(frames)
        self._frames.extend(frames.reshape(-1, frames.shape[-1]))
        if len(self._frames) < self._next:
            return None
        full = self._next + (len(self._frames) - self._next) // self.size * self.size
        self._next = self.size
        out, self._frames = np.stack(self._frames[:full]), self._frames[full:]
        return out

    def flush(self) -> np.ndarray | None:
        """The frames held (``int64 [n, K]``, n < size at the stream's end), or None if none."""
        if not self._frames:
            return None
        out, self._frames = np.stack(self._frames), []
        return out


def emit_frames(params: dict[str, str]) -> int:
    """A talker's ``emit_frames`` config parameter (frames per CODES response; default 1).

    Raises:
        ValueError: not an integer >= 1.
    """
    size = int(params.get("emit_frames", "1"))
    if size < 1:
        raise ValueError(f"emit_frames must be >= 1, got {size}")
    return size


def validate_chunk(codes: np.ndarray, left_context, num_codebooks: int, codebook_size: int) -> tuple[np.ndarray, int]:
    """Check one code2wav request: ``codes`` [..., T, K] int -> int64 [T, K]; ``left_context`` (any
    array holding one int) in [0, T]; codes in [0, codebook_size). Raises ValueError (INVALID_ARG)."""
    c = np.asarray(codes)
    c = c.reshape(-1, c.shape[-1]).astype(np.int64, copy=False)
    left = int(np.asarray(left_context).reshape(-1)[0])
    if c.shape[1] != num_codebooks:
        raise ValueError(f"CODES has {c.shape[1]} codebooks, the codec expects {num_codebooks}")
    if c.size and (c.min() < 0 or c.max() >= codebook_size):
        raise ValueError(f"CODES must lie in [0, {codebook_size})")
    if not 0 <= left <= c.shape[0]:
        raise ValueError(f"LEFT_CONTEXT={left} outside [0, {c.shape[0]}]")
    return c, left
