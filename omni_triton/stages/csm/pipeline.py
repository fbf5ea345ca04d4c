"""The whole codec TTS pipeline in-process (no Triton): parity reference and no-Triton baseline.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from omni_triton.stages.chunking import ChunkedDecoder, ChunkSchedule
from omni_triton.stages.csm.code2wav import CodecDecoder
from omni_triton.stages.csm.talker import CodecTalker

# --------------------------------------------------------------------------- in-process pipeline


@dataclass
class SynthesisResult:
    """Output of :func:`synthesize_reference`.

    codes: ``np.int64 [T, K]``; audio: one-shot decode of all codes, ``np.float32 [T*spf]``;
    streamed_chunks: per-chunk PCM of the streamed in-process variant (concatenation has the same
    length as ``audio``); timings in seconds (``ttfp_s``: time to first streamed chunk)."""

    codes: np.ndarray
    audio: np.ndarray
    sampling_rate: int
    streamed_chunks: list[np.ndarray] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def streamed_audio(self) -> np.ndarray:
        return np.concatenate(self.streamed_chunks) if self.streamed_chunks else np.zeros(0, np.float32)


def synthesize_reference(
    talker: CodecTalker,
    decoder: CodecDecoder,
    text: str,
    speaker: int = 0,
    min_frames: int | None = None,
    max_frames: int | None = None,
    first_chunk_frames: int = 5,
    chunk_frames: int = 25,
    left_context_frames: int = 25,
    stream: bool = True,
) -> SynthesisResult:
    """Whole pipeline in-process (no Triton): the parity reference and the no-Triton baseline.

    Runs the talker once; while frames arrive, the streamed variant decodes chunks with the
    :class:`ChunkSchedule` (exactly what the ``csm`` BLS model does); then decodes all codes in one
    shot (``audio``).
    """
    t0 = time.perf_counter()
    chunks: list[np.ndarray] = []
    timings: dict = {"decode_chunk_s": []}

    def decode(codes, left):
        td = time.perf_counter()
        pcm = decoder.decode([codes], [left])[0]
        timings["decode_chunk_s"].append(time.perf_counter() - td)
        timings.setdefault("ttfp_s", time.perf_counter() - t0)
        return pcm

    chunked = ChunkedDecoder(ChunkSchedule(first_chunk_frames, chunk_frames, left_context_frames), decode,
                             talker.num_codebooks)
    frames: list[np.ndarray] = []  # stream=False: collected, decoded once below
    for new in talker.stream(text, speaker, min_frames, max_frames):
        if stream:
            chunks += chunked.push(new)
        else:
            frames.append(new)
    t_talk = time.perf_counter() - t0
    if stream:
        chunks += chunked.flush()
    all_codes = chunked.codes if stream or not frames else np.concatenate(frames)
    timings["talker_s"] = t_talk
    timings["talker_frames_per_s"] = len(all_codes) / t_talk if t_talk > 0 else 0.0
    td = time.perf_counter()
    audio = decoder.decode([all_codes], [0])[0]
    timings["full_decode_s"] = time.perf_counter() - td
    timings["total_s"] = time.perf_counter() - t0
    return SynthesisResult(all_codes, audio, decoder.sampling_rate, chunks, timings)
