"""Served Piper speech vs the same voice run in this test process on the same text.

``assert_speech_like`` is what the e2e tests call on audio from ``piper_tts`` and ``llm_tts``:
sanity (long enough, not silent, not clipped), then ``omni_triton.speech_similarity`` against an
in-process rendering of ``text`` (duration within 15%, spectral-envelope correlation >= 0.97,
energy dynamics within 0.5-2x; the measurements behind these bounds are in that module, and
tests/unit/test_speech_similarity.py shows a 440 Hz tone and pink noise fail them).
"""
from __future__ import annotations

import functools

import numpy as np

from omni_triton.speech_similarity import speech_mismatches


@functools.lru_cache(maxsize=1)
def _speaker():
    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    return PiperSpeaker(discover_voices(model_dir("piper-voices")))


def piper_reference(text: str, speed: float = 1.0, voice: str | None = None) -> tuple[np.ndarray, int]:
    """(float32 PCM ``[num_samples]``, sample rate Hz) of the prepared Piper voice in-process."""
    sentences = list(_speaker().synthesize(text, voice=voice, speed=speed))
    return np.concatenate([s.audio for s in sentences]), sentences[0].sample_rate


def assert_speech_like(audio: np.ndarray, sample_rate: int, text: str, min_seconds: float = 0.5,
                       lossy: bool = False, speed: float = 1.0) -> None:
    """Fail unless ``audio`` is the Piper voice speaking ``text``.

    Args:
        audio: mono float PCM in [-1, 1], ``[num_samples]``.
        sample_rate: Hz of ``audio``; must be the voice's.
        text: what was spoken (the request's input, or the transcript of a spoken answer).
        min_seconds: shortest accepted duration.
        lossy: decoded MP3: Piper normalises sentences to peak 1.0 and the codec may overshoot by
            a few percent, so 10% overshoot is allowed and clipping is not counted.
        speed: the request's speed (the reference is rendered at it).
    """
    assert audio.ndim == 1 and audio.size >= min_seconds * sample_rate, audio.shape
    rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
    assert rms > 0.02, f"too quiet: rms={rms}"
    assert np.max(np.abs(audio)) <= (1.1 if lossy else 1.0)
    if not lossy:
        clipped = float(np.mean(np.abs(audio) >= 0.999))
        assert clipped < 0.001, f"clipped fraction {clipped}"
    reference, ref_rate = piper_reference(text, speed)
    assert sample_rate == ref_rate, (sample_rate, ref_rate)
    problems = speech_mismatches(audio, reference, sample_rate)
    assert not problems, f"not the Piper voice saying {text[:60]!r}: " + "; ".join(problems)
