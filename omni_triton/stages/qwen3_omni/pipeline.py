"""The whole Qwen3-Omni pipeline in-process (no Triton): thinker -> talker -> code2wav.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from omni_triton.stages.chunking import ChunkedDecoder, ChunkSchedule
from omni_triton.stages.qwen3_omni.code2wav import OmniCode2Wav
from omni_triton.stages.qwen3_omni.request import SamplingSettings
from omni_triton.stages.qwen3_omni.talker import OmniTalker, TalkerSettings
from omni_triton.stages.qwen3_omni.thinker import OmniThinker

# ------------------------------------------------------------------------- in-process pipeline


@dataclass
class OmniResult:
    """Output of :func:`run_pipeline`: text deltas, codes int64 [T, G], audio chunks float32."""

    text_deltas: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    codes: np.ndarray | None = None
    audio_chunks: list[np.ndarray] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(self.text_deltas)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.audio_chunks) if self.audio_chunks else np.zeros(0, np.float32)


def run_pipeline(thinker: OmniThinker, talker: OmniTalker | None, decoder: OmniCode2Wav | None,
                 prompt_ids: Sequence[int], sampling: SamplingSettings, voice: str = "Ethan",
                 talker_settings: TalkerSettings | None = None, audio: bool = True,
                 first_chunk_frames: int = 5, chunk_frames: int = 25, left_context_frames: int = 25,
                 media=None) -> OmniResult:
    """The whole pipeline in-process, doing what the ``omni`` BLS model does through Triton:
    thinker text deltas -> (audio) talker frames -> :class:`ChunkSchedule` -> code2wav chunks.
    The no-Triton baseline of the benchmark and the unit parity test's subject. ``media``: the
    prompt's :class:`~omni_triton.stages.qwen3_omni.inputs.MultimodalInputs` (multimodal prompts).

    ``timings`` (seconds): ``ttft_s`` (first text delta), ``thinker_s`` (thinker done),
    ``ttfp_s`` (first audio chunk), ``total_s``; stage costs ``talker_s`` (talker + code
    predictor, wall time while streaming minus decoding) and ``code2wav_s`` (sum over chunks);
    ``frames``: codec frames generated."""
    t0 = time.perf_counter()
    res = OmniResult()
    out = None
    for step in thinker.stream(prompt_ids, sampling, with_talker_inputs=audio, media=media):
        if step.text:
            res.text_deltas.append(step.text)
            res.timings.setdefault("ttft_s", time.perf_counter() - t0)
        res.completion_tokens = step.completion_tokens
        if step.finish_reason:
            res.finish_reason, out = step.finish_reason, step.output
    res.timings["thinker_s"] = time.perf_counter() - t0
    if not audio or out is None or len(out.sequence) - out.prompt_len < 2:
        return res
    res.timings["code2wav_s"] = 0.0

    def decode(codes, left):
        td = time.perf_counter()
        pcm = decoder.decode([codes], [left])[0]
        res.timings["code2wav_s"] += time.perf_counter() - td
        res.timings.setdefault("ttfp_s", time.perf_counter() - t0)
        return pcm

    chunked = ChunkedDecoder(ChunkSchedule(first_chunk_frames, chunk_frames, left_context_frames), decode,
                             talker.num_code_groups)
    t_talker = time.perf_counter()
    for new in talker.stream(out, voice, talker_settings or TalkerSettings()):
        res.audio_chunks += chunked.push(new)
    if chunked.total:
        res.audio_chunks += chunked.flush()
    res.codes = chunked.codes
    total = chunked.total
    res.timings["total_s"] = time.perf_counter() - t0
    res.timings["talker_s"] = time.perf_counter() - t_talker - res.timings["code2wav_s"]
    res.timings["frames"] = int(total)
    return res
