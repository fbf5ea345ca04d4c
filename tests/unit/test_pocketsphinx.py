"""pocketsphinx without Triton (omni_triton.stages.pocketsphinx): the wheel's real US-English model
writes back what the real Piper voice says (WER by jiwer, loose bound), one delta per utterance,
concurrent requests on separate Decoders, and a cancelled request stops."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import jiwer
import numpy as np
import pytest

from omni_triton.media.audio import resample
from omni_triton.stages.pocketsphinx import SphinxRecognizer

SENTENCES = ["The capital of France is Paris.", "Please speak slowly and clearly, thank you.",
             "The weather is nice and the sky is blue."]


def _words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


@pytest.fixture(scope="module")
def spoken():
    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    voices = discover_voices(model_dir("piper-voices"))
    if not voices:
        pytest.skip("no Piper voice: omni-triton prepare --models piper")
    speaker = PiperSpeaker(voices)
    out = []
    for text in SENTENCES:
        chunks = list(speaker.synthesize(text))
        out.append(resample(np.concatenate([c.audio for c in chunks]), chunks[0].sample_rate, 16000))
    return out


def test_piper_round_trip_concurrently(spoken):
    rec = SphinxRecognizer(decoders=2)
    with ThreadPoolExecutor(3) as pool:
        hyps = list(pool.map(lambda a: "".join(rec.transcribe(a)), spoken))
    wer = jiwer.wer([_words(s) for s in SENTENCES], [_words(h) for h in hyps])
    assert wer <= 0.5, (wer, hyps)


def test_one_delta_per_utterance(spoken):
    """Two sentences with a second of silence between them: two utterances, two deltas."""
    rec = SphinxRecognizer(decoders=1)
    gap = np.zeros(16000, np.float32)
    audio = np.concatenate([spoken[0], gap, spoken[2]])
    assert len(rec.utterances(audio)) == 2
    deltas = list(rec.transcribe(audio))
    assert len(deltas) == 2 and deltas[1].startswith(" ")
    assert jiwer.wer(_words(SENTENCES[0] + " " + SENTENCES[2]), _words("".join(deltas))) <= 0.5


def test_silence_and_cancel(spoken):
    rec = SphinxRecognizer(decoders=1)
    assert "".join(rec.transcribe(np.zeros(16000, np.float32))) == ""
    assert list(rec.transcribe(spoken[0], should_stop=lambda: True)) == []


def test_a_clip_reads_the_same_whatever_the_decoder_heard_before(spoken):
    """One Decoder (as in the stage's pool): the same clip before and after other speech and noise
    gives the same text (per-utterance CMN; with live CMN carried over, it did not)."""
    rec = SphinxRecognizer(decoders=1)
    noise = (np.random.default_rng(0).standard_normal(16000) * 0.3).astype(np.float32)
    first = "".join(rec.transcribe(spoken[0]))
    for other in (spoken[1], noise, spoken[2]):
        list(rec.transcribe(other))
        assert "".join(rec.transcribe(spoken[0])) == first
    assert jiwer.wer(_words(SENTENCES[0]), _words(first)) <= 0.5, first


def test_worker_processes_read_what_the_stub_threads_read(spoken):
    """``processes`` (the served stage's configuration, pocketsphinx holding the GIL): the same
    words as decoding in this process, for requests taken on two threads at once."""
    import os

    import psutil

    local = SphinxRecognizer(decoders=1)
    expected = ["".join(local.transcribe(a)) for a in spoken]
    rec = SphinxRecognizer(decoders=2, processes=2)
    try:
        children = {p.pid for p in psutil.Process(os.getpid()).children()}
        assert len(children) >= 2, "the Decoders live in worker processes"
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda a: "".join(rec.transcribe(a)), spoken)) == expected
    finally:
        rec.close()
