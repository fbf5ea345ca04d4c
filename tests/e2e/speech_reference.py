"""Served Piper speech vs the ``piper-tts`` package's own ``piper.PiperVoice`` in this process.

The reference is ``piper.PiperVoice.load(<prepared voice>.onnx)`` and its ``synthesize`` called
directly (none of ``omni_triton``'s speaker code), so a bug in the project's wrapper shows.

``assert_speech_like`` is what the e2e tests call on audio from ``piper_tts`` and ``llm_tts``:
sanity (long enough, not silent, not clipped), then ``omni_triton.speech_similarity`` against the
reference rendering of ``text`` (duration within 15%, spectral-envelope correlation >= 0.97,
energy dynamics within 0.5-2x; the measurements behind these bounds are in that module, and
tests/unit/test_speech_similarity.py shows a 440 Hz tone and pink noise fail them).

``assert_piper_sentences`` is the per-segment parity of ``piper_tts``'s one-response-per-segment
stream (segments: ``omni_triton.stages.piper.segment_phonemes``, the first sentence's first phrase,
the rest of it, then whole sentences; each rendered by ``PiperVoice.synthesize`` of its raw
phonemes ``[[...]]``). Exact samples are not a property of the pipeline: the VITS graph draws its noise
(``noise_scale``, ``noise_w``) with ONNX ``RandomNormalLike`` from a generator that lives in the
session, so the served audio of a request depends on how many requests that session served
before (a fresh session's first call equals the reference's first call; its second call differs
in length). The check is therefore: the same number of sentences as ``PiperVoice.phonemize``
splits the text into (exact), and each sentence's length within ``SENTENCE_DURATION_TOL`` of
the reference's noise-free rendering (``noise_scale = noise_w_scale = 0``) of that sentence, with
its spectral envelope correlated >= 0.97. Measured: about 750 noisy renderings of single
sentences (0.4-5 s, speed 1 and 1.5) were 0.875-1.21x their noise-free length, envelope
correlation >= 0.98; a dropped sentence changes the count, and a repeated or swapped one of a text
whose neighbouring sentences differ in length by 3x or more is off by 3x.
"""
from __future__ import annotations

import functools

import numpy as np

from omni_triton.speech_similarity import speech_mismatches

SENTENCE_DURATION_TOL = 0.3


@functools.lru_cache(maxsize=4)
def piper_voice(voice: str = "joe"):
    """``piper.PiperVoice.load`` of the prepared voice ``<cache>/models/piper-voices/<voice>/*.onnx``
    (the package's own loader: its config JSON, onnxruntime CPU session)."""
    from piper import PiperVoice

    from omni_triton.paths import model_dir

    (onnx,) = sorted((model_dir("piper-voices") / voice).glob("*.onnx"))
    return PiperVoice.load(onnx)


def _config(voice, speed: float, noise: bool):
    from piper import SynthesisConfig

    # OpenAI ``speed`` -> Piper ``length_scale`` = the voice's length_scale / speed (the contract)
    extra = {} if noise else {"noise_scale": 0.0, "noise_w_scale": 0.0}
    return SynthesisConfig(length_scale=voice.config.length_scale / speed, **extra)


def piper_sentences(text: str, speed: float = 1.0, voice: str = "joe", noise: bool = True) -> list[np.ndarray]:
    """One float32 PCM array ``[num_samples]`` per sentence of ``text`` from ``PiperVoice.synthesize``
    (``noise=False``: the deterministic noise-free rendering)."""
    v = piper_voice(voice)
    return [np.asarray(c.audio_float_array, np.float32).reshape(-1)
            for c in v.synthesize(text, syn_config=_config(v, speed, noise))]


def piper_segments(text: str, speed: float = 1.0, voice: str = "joe", noise: bool = True,
                   first_chunk_words: int | None = None) -> list[np.ndarray]:
    """One float32 PCM array ``[num_samples]`` per segment the ``piper`` stage sends for ``text``
    (``segment_phonemes`` of ``PiperVoice.phonemize``, ``first_chunk_words`` default: the
    config's), each ``PiperVoice.synthesize`` of the segment's raw phonemes."""
    from omni_triton.stages.piper import FIRST_CHUNK_WORDS, is_word_cut, segment_phonemes, trim_word_cut

    v = piper_voice(voice)
    words = FIRST_CHUNK_WORDS if first_chunk_words is None else first_chunk_words
    sentences = v.phonemize(text)
    segments = segment_phonemes(sentences, words)
    out = [np.asarray(c.audio_float_array, np.float32).reshape(-1)
           for seg in segments
           for c in v.synthesize("[[" + "".join(seg) + "]]", syn_config=_config(v, speed, noise))]
    if len(segments) > len([s for s in sentences if s]) and is_word_cut(segments[0]):  # the stage's trim
        rate = int(v.config.sample_rate)
        out[0], out[1] = trim_word_cut(out[0], rate, end=True), trim_word_cut(out[1], rate, end=False)
    return out


def piper_reference(text: str, speed: float = 1.0, voice: str = "joe") -> tuple[np.ndarray, int]:
    """(float32 PCM ``[num_samples]``, sample rate Hz) of ``piper.PiperVoice`` speaking ``text`` in
    the stage's segments (:func:`piper_segments`: a cut first sentence is ~1.06-1.13x as long as
    when spoken whole, docs/scheduling.md "The first chunk")."""
    return np.concatenate(piper_segments(text, speed, voice)), int(piper_voice(voice).config.sample_rate)


def assert_piper_sentences(chunks: list[np.ndarray], sample_rate: int, text: str, speed: float = 1.0,
                           voice: str = "joe") -> None:
    """Fail unless ``chunks`` (one float PCM array per served segment, in order) are the segments
    ``piper.PiperVoice`` speaks for ``text`` (:func:`piper_segments`): same count, each within
    ``SENTENCE_DURATION_TOL`` of the reference segment's noise-free length and with a spectral
    envelope correlated >= 0.97 (see the module docstring for why not exact)."""
    from omni_triton.speech_similarity import MIN_ENVELOPE_CORRELATION, speech_similarity

    v = piper_voice(voice)
    assert sample_rate == v.config.sample_rate, (sample_rate, v.config.sample_rate)
    reference = piper_segments(text, speed, voice, noise=False)
    assert len(v.phonemize(text)) in (len(reference), len(reference) - 1)
    assert len(chunks) == len(reference), (
        f"{len(chunks)} segments served, PiperVoice speaks {len(reference)}: "
        f"{[c.size for c in chunks]} vs {[r.size for r in reference]} samples")
    for i, (got, want) in enumerate(zip(chunks, reference, strict=True)):
        s = speech_similarity(np.asarray(got, np.float32).reshape(-1), want, sample_rate)
        assert abs(s.duration_ratio - 1) <= SENTENCE_DURATION_TOL, (
            f"sentence {i}: {got.size} samples, PiperVoice's {want.size} ({s.duration_ratio:.2f}x); "
            f"all: {[c.size for c in chunks]} vs {[r.size for r in reference]}")
        assert s.envelope_correlation >= MIN_ENVELOPE_CORRELATION, (i, s)


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
