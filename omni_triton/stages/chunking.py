"""The chunk schedule of streamed codec decoding (vLLM-Omni's code2wav scheme: a small first
chunk, then fixed chunks, each decoded with left context), shared by codec TTS and Qwen3-Omni.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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
    """

    first_chunk_frames: int = 5
    chunk_frames: int = 25
    left_context_frames: int = 25
    emitted: int = 0  # frames whose audio has been scheduled

    def __post_init__(self):
        if self.first_chunk_frames < 1 or self.chunk_frames < 1 or self.left_context_frames < 0:
            raise ValueError("first_chunk_frames, chunk_frames must be >= 1, left_context_frames >= 0")

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
        return out

    def flush(self, total_frames: int) -> list[tuple[int, int, int]]:
        out = self.push(total_frames)
        if total_frames > self.emitted:
            out.append(self._chunk(total_frames))
        return out


def chunk_slices(frames: np.ndarray, chunks: Sequence[tuple[int, int, int]]) -> list[tuple[np.ndarray, int]]:
    """``(codes_with_context [end-start, K], left_context)`` for each ``(start, end, left)``."""
    return [(frames[s:e], left) for s, e, left in chunks]


class ChunkedDecoder:
    """Streamed decoding with left context: frames in, PCM chunks out, as the schedule allows.

    The one frames -> :class:`ChunkSchedule` -> decode loop of every streaming codec path (the
    ``tts`` and ``omni`` BLS models, :func:`~omni_triton.stages.codec_tts.synthesize_reference`,
    :func:`~omni_triton.stages.qwen3_omni.run_pipeline`, the TTS benchmark's in-process codec);
    only the decode call differs, so it is injected.

    Args:
        schedule: the chunk schedule (fresh per stream).
        decode: ``(codes int64 [T, K] with left context, left_context frames) -> float32 PCM`` of
            the new frames only (a BLS call of a code2wav stage, or a codec in-process).
        num_codebooks: K, for the empty frame matrix before the first push.
    """

    def __init__(self, schedule: ChunkSchedule, decode, num_codebooks: int = 0):
        self.schedule = schedule
        self.decode = decode
        self._parts: list[np.ndarray] = []
        self._codes = np.zeros((0, num_codebooks), np.int64)

    @property
    def codes(self) -> np.ndarray:
        """Every frame pushed so far, ``int64 [T, K]``."""
        if self._parts:
            self._codes = np.concatenate([self._codes, *self._parts]) if self._codes.size else np.concatenate(self._parts)
            self._parts = []
        return self._codes

    @property
    def total(self) -> int:
        return len(self._codes) + sum(len(p) for p in self._parts)

    def _run(self, chunks) -> list[np.ndarray]:
        if not chunks:
            return []
        codes = self.codes
        return [self.decode(c, left) for c, left in chunk_slices(codes, chunks)]

    def push(self, frames: np.ndarray) -> list[np.ndarray]:
        """Add ``frames`` (``[n, K]``; empty is fine) and decode every chunk now ready."""
        if len(frames):
            self._parts.append(np.asarray(frames).reshape(-1, np.asarray(frames).shape[-1]))
        return self._run(self.schedule.push(self.total))

    def flush(self) -> list[np.ndarray]:
        """Decode the tail (end of the stream)."""
        return self._run(self.schedule.flush(self.total))
