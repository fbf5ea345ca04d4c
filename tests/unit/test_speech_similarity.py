"""The speech check the e2e tests use (omni_triton.speech_similarity) accepts the same text spoken
again by the in-process Piper voice and rejects a tone, pink noise and other words."""
from __future__ import annotations

import numpy as np
import pytest

from omni_triton.speech_similarity import speech_mismatches, speech_similarity

TEXT = "The capital of France is Paris."
LONG = " ".join(f"This is sentence number {n} of a long answer." for n in range(1, 5))


@pytest.fixture(scope="module")
def piper():
    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    voices = discover_voices(model_dir("piper-voices"))
    if not voices:
        pytest.skip("Piper voice not prepared (omni-triton prepare --models piper_tts)")
    speaker = PiperSpeaker(voices)

    def speak(text: str) -> tuple[np.ndarray, int]:
        sentences = list(speaker.synthesize(text))
        return np.concatenate([s.audio for s in sentences]), sentences[0].sample_rate

    return speak


def _pink_noise(n: int, seed: int = 0) -> np.ndarray:
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    spectrum[1:] /= np.sqrt(np.fft.rfftfreq(n)[1:])  # 1/f power
    spectrum[0] = 0
    noise = np.fft.irfft(spectrum, n)
    return (0.2 * noise / noise.std()).astype(np.float32)


@pytest.mark.parametrize("text", [TEXT, LONG])
def test_same_text_spoken_again_passes(piper, text):
    reference, sr = piper(text)
    again, _ = piper(text)  # Piper samples durations: another waveform, the same speech
    assert not np.array_equal(again[: reference.size], reference[: again.size])
    assert speech_mismatches(again, reference, sr) == []


@pytest.mark.parametrize("text", [TEXT, LONG])
def test_tone_and_pink_noise_are_rejected(piper, text):
    reference, sr = piper(text)
    t = np.arange(reference.size) / sr
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    for fake in (tone, _pink_noise(reference.size)):
        problems = speech_mismatches(fake, reference, sr)  # same duration: the spectrum must tell
        assert any("envelope" in p for p in problems), problems
        assert any("dynamics" in p for p in problems), problems


def test_other_words_and_truncated_speech_are_rejected(piper):
    reference, sr = piper(LONG)
    other, _ = piper("Hello there.")
    assert any("duration" in p for p in speech_mismatches(other, reference, sr))
    assert any("duration" in p for p in speech_mismatches(reference[: reference.size // 2], reference, sr))


def test_similarity_fields():
    sr = 22050
    x = _pink_noise(sr)
    s = speech_similarity(x, x, sr)
    assert s.duration_ratio == 1.0 and s.envelope_correlation == pytest.approx(1.0) and s.dynamics_ratio == 1.0
    with pytest.raises(ValueError):
        speech_similarity(np.zeros(10, np.float32), x, sr)
