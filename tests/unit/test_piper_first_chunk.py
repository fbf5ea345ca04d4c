"""Piper's first chunk (docs/scheduling.md "The first chunk"): the first response ends at a phrase
boundary (the first clause mark, or after ``first_chunk_words`` words), then the rest of that
sentence, then whole sentences. The rule on phoneme lists (no voice), and with the real voice:
the stage's responses joined are exactly ``piper.PiperVoice``'s own synthesis of the same segments
(noise off: Piper draws fresh VITS noise per run, see tests/e2e/speech_reference.py)."""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

from omni_triton.stages.piper.speaker import FIRST_CHUNK_WORDS, segment_phonemes
from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)


def _ph(text: str) -> list[str]:
    return list(text)


def test_the_first_sentence_is_cut_at_its_first_clause_mark():
    sentences = [_ph("ɡˈʊd mˈɔːɹnɪŋ, ænd wˈɛlkʌm tə ðə stˈeɪʃən."), _ph("nˈɛkst tɹˈeɪn, ɪz hˈɪə.")]
    segments = segment_phonemes(sentences, 4)
    assert ["".join(s) for s in segments] == ["ɡˈʊd mˈɔːɹnɪŋ,", "ænd wˈɛlkʌm tə ðə stˈeɪʃən.",
                                              "nˈɛkst tɹˈeɪn, ɪz hˈɪə."]  # later sentences whole
    for mark in ";:":
        assert "".join(segment_phonemes([_ph(f"wˈʌn{mark} tˈuː θɹˈiː.")], 4)[0]) == f"wˈʌn{mark}"


def test_without_an_early_clause_mark_the_cut_comes_after_n_words():
    sentence = _ph("ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ, ænd mˈoːɹ.")
    assert ["".join(s) for s in segment_phonemes([sentence], 4)] == [
        "ðə kwˈɪk bɹˈaʊn fˈɑːks", "dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ, ænd mˈoːɹ."]
    assert "".join(segment_phonemes([sentence], 2)[0]) == "ðə kwˈɪk"
    assert "".join(segment_phonemes([sentence], 9)[0]) == "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ,"


def test_no_cut_when_nothing_would_follow_or_when_off():
    short = [_ph("jˈɛs."), _ph("nˈoʊ.")]
    assert segment_phonemes(short, 4) == short
    assert segment_phonemes([_ph("wˈʌn tˈuː θɹˈiː fˈɔːɹ")], 4) == [_ph("wˈʌn tˈuː θɹˈiː fˈɔːɹ")]  # 4th word ends it
    assert segment_phonemes([_ph("hˈaɪ, ")], 4) == [_ph("hˈaɪ, ")]  # a mark at the very end
    long = [_ph("wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks.")]
    assert segment_phonemes(long, 0) == long  # "0": whole sentences
    assert segment_phonemes([[], *long], 0) == long  # empty sentences dropped
    with pytest.raises(ValueError):
        segment_phonemes(long, -1)


def test_segments_join_to_the_sentences_less_the_space_at_the_cut():
    sentences = [_ph("ə bˈɪt ʌv tˈɛkst hˈɪə ænd ðˈɛɹ."), _ph("mˈoːɹ.")]
    head, rest, *others = segment_phonemes(sentences, 3)
    assert head + [" "] + rest == sentences[0] and others == sentences[1:]


# ------------------------------------------------------------------------------------ real voice

TEXT = ("The quick brown fox jumps over the lazy dog. Good morning, and welcome to the station. "
        "How many pickled peppers did Peter Piper pick?")


@pytest.fixture(scope="module")
def voice_dir():
    from omni_triton.paths import model_dir

    if not model_dir("piper-voices").exists():
        pytest.skip("Piper voice not prepared (omni-triton prepare --models piper_tts)")
    return model_dir("piper-voices")


def _run_stage(voice_dir, params: dict, text: str) -> list[np.ndarray]:
    """The ``piper`` stage (its TritonPythonModel, fake stub module) with noise-free voices:
    the AUDIO of each response, in order."""
    from omni_triton.adapters.piper import PiperStage
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    def setup(self, args, p):
        self.read_params(p)
        self.speaker = PiperSpeaker(discover_voices(voice_dir), first_chunk_words=self.first_chunk_words,
                                    noise_scale=0.0, noise_w_scale=0.0)

    stage = type("NoiseFreePiper", (PiperStage,), {"setup": setup})()
    stage.initialize({"model_name": "piper", "model_instance_name": "piper_0", "model_config": json.dumps(
        {"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    request = pb.FakeRequest({"TEXT": np.array([text.encode()], dtype=object)})
    stage.execute([request])
    deadline = time.monotonic() + 120
    while request.sender.finals < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    stage.finalize()
    assert not request.sender.errors() and request.sender.finals == 1
    return [o["AUDIO"] for o in request.sender.outputs() if "AUDIO" in o and o["AUDIO"].size]


def _piper_own(text: str, first_chunk_words: int) -> list[np.ndarray]:
    """``piper.PiperVoice`` (the package's loader and ``synthesize``, noise off) speaking each
    segment given as raw phonemes (``[[...]]``)."""
    from piper import PiperVoice, SynthesisConfig

    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import trim_word_cut

    (onnx,) = sorted((model_dir("piper-voices") / "joe").glob("*.onnx"))
    voice = PiperVoice.load(onnx)
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    out = [np.asarray(c.audio_float_array, np.float32)
           for seg in segment_phonemes(voice.phonemize(text), first_chunk_words)
           for c in voice.synthesize("[[" + "".join(seg) + "]]", syn_config=config)]
    # TEXT's first sentence is cut after 4 words (no comma): the stage trims the silence at the cut
    return [trim_word_cut(out[0], 22050, end=True), trim_word_cut(out[1], 22050, end=False), *out[2:]]


def test_the_stage_s_joined_stream_is_piper_s_own_synthesis_of_the_segments(voice_dir):
    """The stage's responses (what a stream sends, and what a whole request joins) equal
    PiperVoice's own synthesis of the same segments: the same sample counts exactly, samples within
    1e-5 (measured max 2.7e-6: PiperVoice.load's session uses onnxruntime's default thread count,
    the stage one thread, so sums are ordered differently); the stage against itself with and
    without the cut is exact after the first sentence. The first
    response is a phrase (4 words), under half the first sentence's audio. Red when the stage's
    post-processing differs from Piper's (normalisation dropped) or a cut loses or moves a phoneme."""
    got = _run_stage(voice_dir, {"first_chunk_words": str(FIRST_CHUNK_WORDS)}, TEXT)
    want = _piper_own(TEXT, FIRST_CHUNK_WORDS)
    assert [g.size for g in got] == [w.size for w in want]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), rtol=0, atol=1e-5)
    whole_sentences = _run_stage(voice_dir, {"first_chunk_words": "0"}, TEXT)
    assert len(whole_sentences) == 3 and len(got) == 4
    assert got[0].size < 0.5 * whole_sentences[0].size, (got[0].size, whole_sentences[0].size)
    np.testing.assert_array_equal(np.concatenate(whole_sentences[1:]), np.concatenate(got[2:]))
    # the cut costs little length: the silence at the cut is trimmed (measured 1.06x; untrimmed 1.10x)
    cut, whole = got[0].size + got[1].size, whole_sentences[0].size
    assert cut < 1.08 * whole, (cut, whole)


def test_only_a_word_cut_is_trimmed():
    """The silence VITS pads a run with is trimmed at a word cut (to 40 ms at the phrase's end, 20
    ms at the rest's start); a comma's pause is kept (is_word_cut)."""
    from omni_triton.stages.piper import is_word_cut, trim_word_cut

    audio = np.concatenate([np.zeros(1000), np.full(500, 0.5), np.zeros(3000)]).astype(np.float32)
    assert trim_word_cut(audio, 1000, end=True).size == 1500 + 40
    assert trim_word_cut(audio, 1000, end=False).size == 500 + 3000 + 20
    assert trim_word_cut(np.zeros(10, np.float32), 1000, end=True).size == 10  # silence only: kept
    assert is_word_cut(list("ðə kwˈɪk")) and not is_word_cut(list("ɡˈʊd mˈɔːɹnɪŋ,"))


def test_a_bad_first_chunk_words_is_a_load_error():
    from omni_triton.adapters.piper import PiperStage

    stage = PiperStage()
    with pytest.raises(ValueError):
        stage.read_params({"first_chunk_words": "-2"})
    stage.read_params({})
    assert stage.first_chunk_words == FIRST_CHUNK_WORDS
