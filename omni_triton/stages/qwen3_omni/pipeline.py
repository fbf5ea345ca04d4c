"""The whole Qwen3-Omni pipeline in-process (no Triton): thinker -> talker -> code2wav.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    #: ``("text", i)`` / ``("audio", j)`` in the order they were produced (text delta ``i``,
    #: audio chunk ``j``): what a client would receive, for order-of-events tests.
    events: list[tuple[str, int]] = field(default_factory=list)

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
                 async_chunk: bool = False, thinker_steps=None, feed=None, media=None) -> OmniResult:
    """The whole pipeline in-process, doing what the ``qwen3_omni`` BLS model does through Triton:
    thinker text deltas -> (audio) talker frames -> :class:`ChunkSchedule` -> code2wav chunks.
    The no-Triton baseline of the benchmark and the unit parity test's subject. ``media``: the
    prompt's :class:`~omni_triton.stages.qwen3_omni.inputs.MultimodalInputs` (multimodal prompts).

    ``async_chunk`` (speak while thinking): the talker starts on the thinker's first tokens and
    consumes its per-token rows as they come (:meth:`OmniTalker.stream_while_thinking`); False:
    the talker starts when the thinker has finished (the reference's order). ``thinker_steps``
    (tests): a function wrapping the thinker's step iterator; ``feed``: the talker's
    :class:`~omni_triton.stages.qwen3_omni.talker.TextFeed` to watch (async only).

    ``timings`` (seconds): ``ttft_s`` (first text delta), ``thinker_s`` (thinker done),
    ``ttfp_s`` (first audio chunk), ``total_s``; stage costs ``talker_s`` (talker + code
    predictor, wall time while streaming minus decoding) and ``code2wav_s`` (sum over chunks);
    ``frames``: codec frames generated."""
    t0 = time.perf_counter()
    res = OmniResult()
    if async_chunk and audio:
        return _run_async(thinker, talker, decoder, prompt_ids, sampling, voice, talker_settings,
                          ChunkSchedule(first_chunk_frames, chunk_frames, left_context_frames), thinker_steps, feed,
                          t0, res)
    out = None
    for step in thinker.stream(prompt_ids, sampling, with_talker_inputs=audio, media=media):
        _text(res, step, t0)
        if step.finish_reason:
            out = step.output
    res.timings["thinker_s"] = time.perf_counter() - t0
    if not audio or out is None or len(out.sequence) - out.prompt_len < 2:
        return res
    res.timings["code2wav_s"] = 0.0

    decode = _timed_decode(decoder, res, t0)

    chunked = ChunkedDecoder(ChunkSchedule(first_chunk_frames, chunk_frames, left_context_frames), decode,
                             talker.num_code_groups)
    t_talker = time.perf_counter()

    def emit(chunks):
        for pcm in chunks:
            res.events.append(("audio", len(res.audio_chunks)))
            res.audio_chunks.append(pcm)

    for new in talker.stream(out, voice, talker_settings or TalkerSettings()):
        emit(chunked.push(new))
    if chunked.total:
        emit(chunked.flush())
    res.codes = chunked.codes
    total = chunked.total
    res.timings["total_s"] = time.perf_counter() - t0
    res.timings["talker_s"] = time.perf_counter() - t_talker - res.timings["code2wav_s"]
    res.timings["frames"] = int(total)
    return res


def _timed_decode(decoder: OmniCode2Wav, res: OmniResult, t0: float):
    """``decode(codes, left) -> pcm`` for ``ChunkedDecoder``: one code2wav call, its time added to
    ``res.timings["code2wav_s"]`` and the first chunk's time since ``t0`` kept as ``ttfp_s``."""

    def decode(codes, left):
        td = time.perf_counter()
        pcm = decoder.decode([codes], [left])[0]
        res.timings["code2wav_s"] += time.perf_counter() - td
        res.timings.setdefault("ttfp_s", time.perf_counter() - t0)
        return pcm

    return decode


def _text(res: OmniResult, step, t0: float) -> None:
    if step.text:
        res.events.append(("text", len(res.text_deltas)))
        res.text_deltas.append(step.text)
        res.timings.setdefault("ttft_s", time.perf_counter() - t0)
    res.completion_tokens = step.completion_tokens
    if step.finish_reason:
        res.finish_reason = step.finish_reason


def _run_async(thinker, talker, decoder, prompt_ids, sampling, voice, talker_settings, schedule, thinker_steps,
               feed, t0: float, res: OmniResult) -> OmniResult:
    """:func:`run_pipeline` with ``async_chunk``: one loop over the talker's merged stream."""
    from omni_triton.stages.qwen3_omni.thinker import ThinkerStep

    res.timings["code2wav_s"] = 0.0
    n_audio = [0]

    decode = _timed_decode(decoder, res, t0)

    def emit(chunks):
        for pcm in chunks:
            res.events.append(("audio", n_audio[0]))
            n_audio[0] += 1
            res.audio_chunks.append(pcm)

    chunked = ChunkedDecoder(schedule, decode, talker.num_code_groups)
    steps = thinker.stream(prompt_ids, sampling, stream_talker_inputs=True)
    if thinker_steps is not None:
        steps = thinker_steps(steps)
    for item in talker.stream_while_thinking(steps, voice, talker_settings or TalkerSettings(), feed=feed):
        if isinstance(item, ThinkerStep):
            _text(res, item, t0)
            if item.finish_reason:
                res.timings["thinker_s"] = time.perf_counter() - t0
        else:
            emit(chunked.push(item))
    if chunked.total:
        emit(chunked.flush())
        res.codes = chunked.codes
    res.timings["total_s"] = time.perf_counter() - t0
    res.timings["talker_s"] = res.timings["total_s"] - res.timings.get("thinker_s", 0.0) - res.timings["code2wav_s"]
    res.timings["frames"] = int(chunked.total)
    return res
