"""The whole Qwen2.5-Omni pipeline in-process (no Triton): thinker -> talker -> token2wav.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from omni_triton.stages.qwen2_5_omni.talker import Qwen25Talker, TalkerSettings
from omni_triton.stages.qwen2_5_omni.thinker import Qwen25Thinker
from omni_triton.stages.qwen2_5_omni.token2wav import Qwen25Token2Wav
from omni_triton.stages.qwen3_omni import OmniResult, SamplingSettings


def run_pipeline(thinker: Qwen25Thinker, talker: Qwen25Talker | None, token2wav: Qwen25Token2Wav | None,
                 prompt_ids: Sequence[int], sampling: SamplingSettings, voice: str = "Chelsie",
                 talker_settings: TalkerSettings | None = None, audio: bool = True, seed: int = 0) -> OmniResult:
    """What the ``qwen2_5_omni`` BLS model does through Triton, in one process: thinker text deltas
    -> (audio) talker codes -> one token2wav call on the whole utterance (DiT noise seeded with
    ``seed``). Returns an :class:`~omni_triton.stages.qwen3_omni.OmniResult` (``codes`` int64
    [T, 1], one audio chunk); ``timings`` in seconds: ``ttft_s``, ``thinker_s``, ``talker_s``,
    ``token2wav_s``, ``ttfp_s`` (= audio ready), ``total_s``; ``frames``: codes generated."""
    t0 = time.perf_counter()
    res = OmniResult()
    out = None
    for step in thinker.stream(prompt_ids, sampling, with_talker_inputs=audio):
        if step.text:
            res.text_deltas.append(step.text)
            res.timings.setdefault("ttft_s", time.perf_counter() - t0)
        res.completion_tokens = step.completion_tokens
        if step.finish_reason:
            res.finish_reason, out = step.finish_reason, step.output
    res.timings["thinker_s"] = time.perf_counter() - t0
    if not audio or out is None or len(out.sequence) - out.prompt_len < 2:
        return res
    t1 = time.perf_counter()
    parts = list(talker.stream(out, voice, talker_settings or TalkerSettings()))
    res.codes = np.concatenate(parts) if parts else np.zeros((0, 1), np.int64)
    res.timings["talker_s"] = time.perf_counter() - t1
    res.timings["frames"] = int(len(res.codes))
    if len(res.codes):
        t2 = time.perf_counter()
        res.audio_chunks.append(token2wav.synthesize(res.codes[:, 0], voice, seed))
        res.timings["token2wav_s"] = time.perf_counter() - t2
        res.timings["ttfp_s"] = time.perf_counter() - t0
    res.timings["total_s"] = time.perf_counter() - t0
    return res
