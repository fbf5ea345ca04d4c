"""End-to-end: ``/v1/audio/transcriptions`` and ``/v1/audio/translations`` through the official
OpenAI SDK against the real stack (tritonserver with the ASR models, the OpenAI frontend).

Piper (``piper_tts``) speaks the sentences; ``pocketsphinx`` (real CMU Sphinx weights) must hear
them back (word error rate by ``jiwer``); ``whisper`` (a tiny random checkpoint: its text is
noise) shows the translation path; ``omni`` the thinker path. Short form, under the lock::

    OMNI_TRITON_E2E_MODELS=piper,pocketsphinx,whisper,qwen3_omni flock /tmp/omni-server.lock \\
        .venv/bin/python -m pytest -q tests/e2e/test_transcriptions_served.py
"""
from __future__ import annotations

import io

import httpx
import jiwer
import numpy as np
import openai
import pytest
import soundfile as sf
import srt
import webvtt
from conftest import E2E_MODELS

from omni_triton.serve.repository import resolve_models

pytestmark = pytest.mark.e2e

SERVED = set(resolve_models([m.strip() for m in E2E_MODELS.split(",") if m.strip()]))
needs_asr = pytest.mark.skipif(not {"piper", "pocketsphinx"} <= SERVED,
                               reason="piper and pocketsphinx not in OMNI_TRITON_E2E_MODELS")
needs_whisper = pytest.mark.skipif("whisper" not in SERVED, reason="whisper not in OMNI_TRITON_E2E_MODELS")
needs_omni = pytest.mark.skipif(not {"piper", "qwen3_omni"} <= SERVED,
                                reason="piper and qwen3_omni not in OMNI_TRITON_E2E_MODELS")

SENTENCE = "The capital of France is Paris."
SENTENCES = ("The capital of France is Paris.", "I would like a cup of coffee with milk.",
             "Please open the door and turn on the light.")
#: WER of pocketsphinx on Piper's voice (all three sentences together): measured 0-0.1; a margin
MAX_WER = 0.25
_NORMALIZE = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(),
                            jiwer.Strip()])


def wer(reference: str, hypothesis: str) -> float:
    return float(jiwer.wer(_NORMALIZE(reference), _NORMALIZE(hypothesis)))


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    return float(jiwer.wer([_NORMALIZE(r) for r in references], [_NORMALIZE(h) for h in hypotheses]))


def _sdk(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def spoken(stack) -> dict[str, bytes]:
    """Each sentence as Piper speaks it (22.05 kHz WAV from the served ``piper_tts``)."""
    if "piper" not in SERVED:
        pytest.skip("piper not served")
    client = _sdk(stack)
    return {s: client.audio.speech.create(model="piper_tts", voice="joe", input=s, response_format="wav").content
            for s in SENTENCES}


@pytest.fixture(scope="module")
def three_sentences(spoken) -> bytes:
    """The three sentences with 1.5 s of silence after each, as one WAV."""
    parts = []
    for s in SENTENCES:
        audio, rate = sf.read(io.BytesIO(spoken[s]), dtype="float32")
        parts += [audio, np.zeros(int(1.5 * rate), np.float32)]
    buf = io.BytesIO()
    sf.write(buf, np.concatenate(parts), rate, format="WAV")
    return buf.getvalue()


def _ok_after(stack, spoken) -> None:
    """The server still serves: a good transcription and /health."""
    r = _sdk(stack).audio.transcriptions.create(model="pocketsphinx", file=("ok.wav", spoken[SENTENCE], "audio/wav"))
    assert wer(SENTENCE, r.text) <= 0.5, r.text
    assert httpx.get(f"{stack.frontend_url}/health", timeout=30).status_code == 200


@needs_asr
def test_piper_sentence_comes_back_through_pocketsphinx(stack, spoken):
    client = _sdk(stack)
    heard = []
    for wav in spoken.values():
        r = client.audio.transcriptions.create(model="pocketsphinx", file=("s.wav", wav, "audio/wav"))
        assert r.usage.type == "duration" and 1.0 < r.usage.seconds < 6.0
        heard.append(r.text)
    # corpus WER over the three sentences (pocketsphinx's live CMN makes a word or two vary with what
    # its decoder heard before: NOTE-transcribe-to-asr)
    assert corpus_wer(list(spoken), heard) <= MAX_WER, heard
    alias = client.audio.transcriptions.create(model="whisper-1", file=("s.wav", spoken[SENTENCE], "audio/wav"))
    assert wer(SENTENCE, alias.text) <= 0.5, alias.text  # OpenAI's name -> pocketsphinx


@needs_asr
def test_every_response_format_agrees(stack, three_sentences):
    """Segment times are the VAD's, so equal in every format; the texts are each checked against
    what Piper said (a request's text may differ from the previous one's by a word: see above)."""
    client = _sdk(stack)
    f = ("three.wav", three_sentences, "audio/wav")
    verbose = client.audio.transcriptions.create(model="pocketsphinx", file=f, response_format="verbose_json",
                                                 timestamp_granularities=["segment"], language="en")
    assert verbose.language == "english"
    assert verbose.duration == pytest.approx(sf.info(io.BytesIO(three_sentences)).duration, abs=0.01)
    assert wer(" ".join(SENTENCES), verbose.text) <= MAX_WER, verbose.text
    segs = verbose.segments
    assert len(segs) == 3, [(s.start, s.end, s.text) for s in segs]  # one per sentence: cut at the pauses
    assert all(a.end <= b.start for a, b in zip(segs, segs[1:], strict=False))
    assert " ".join(s.text for s in segs) == verbose.text
    assert corpus_wer(list(SENTENCES), [s.text for s in segs]) <= MAX_WER
    text = client.audio.transcriptions.create(model="pocketsphinx", file=f, response_format="text")
    assert text.endswith("\n") and wer(" ".join(SENTENCES), text) <= MAX_WER
    assert wer(" ".join(SENTENCES), client.audio.transcriptions.create(model="pocketsphinx", file=f).text) <= MAX_WER
    subs = list(srt.parse(client.audio.transcriptions.create(model="pocketsphinx", file=f, response_format="srt")))
    assert [(round(s.start.total_seconds(), 2), round(s.end.total_seconds(), 2)) for s in subs] == \
        [(round(s.start, 2), round(s.end, 2)) for s in segs]
    assert corpus_wer(list(SENTENCES), [s.content for s in subs]) <= MAX_WER
    vtt = webvtt.from_string(client.audio.transcriptions.create(model="pocketsphinx", file=f,
                                                                response_format="vtt"))
    assert [(round(c.start_time.in_milliseconds() / 1000, 2), round(c.end_time.in_milliseconds() / 1000, 2))
            for c in vtt] == [(round(s.start, 2), round(s.end, 2)) for s in segs]
    assert corpus_wer(list(SENTENCES), [c.text for c in vtt]) <= MAX_WER


@needs_asr
def test_streamed_transcription_events(stack, three_sentences):
    client = _sdk(stack)
    f = ("three.wav", three_sentences, "audio/wav")
    events = list(client.audio.transcriptions.create(model="pocketsphinx", file=f, stream=True))
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) >= 3 and events[-1].type == "transcript.text.done" and len(events) == len(deltas) + 1
    assert "".join(d.delta for d in deltas) == events[-1].text
    assert wer(" ".join(SENTENCES), events[-1].text) <= MAX_WER


@needs_asr
@needs_whisper
def test_translation_on_whisper(stack, spoken):
    client = _sdk(stack)
    wav = spoken[SENTENCE]
    with pytest.warns(DeprecationWarning):  # deprecated in the SDK, still OpenAI's API
        r = client.audio.translations.create(model="whisper", file=("s.wav", wav, "audio/wav"),
                                             response_format="verbose_json")
    assert isinstance(r.text, str) and r.language == "english" and r.duration > 1.0  # random weights: noise text
    assert len(r.segments) == 1 and r.segments[0].end <= r.duration + 0.01
    t = client.audio.transcriptions.create(model="whisper", file=("s.wav", wav, "audio/wav"), language="en")
    assert isinstance(t.text, str)
    events = list(client.audio.transcriptions.create(model="whisper", file=("s.wav", wav, "audio/wav"),
                                                     stream=True))
    assert events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1]) == events[-1].text
    with pytest.warns(DeprecationWarning), pytest.raises(openai.BadRequestError) as e:
        client.audio.translations.create(model="pocketsphinx", file=("s.wav", wav, "audio/wav"))
    assert e.value.body["code"] == "translation_not_supported"


@needs_omni
def test_omni_thinker_transcribes(stack, spoken):
    client = _sdk(stack)
    r = client.audio.transcriptions.create(model="omni", file=("s.wav", spoken[SENTENCE], "audio/wav"),
                                           response_format="verbose_json")
    # the tiny random thinker says random words: the path (audio part -> thinker -> text) is what is shown
    assert r.text.strip() and len(r.segments) == 1
    events = list(client.audio.transcriptions.create(model="omni", file=("s.wav", spoken[SENTENCE], "audio/wav"),
                                                     stream=True))
    assert events[-1].type == "transcript.text.done" and events[-1].text.strip()


@needs_asr
def test_bad_input_gets_4xx_and_the_server_keeps_serving(stack, spoken):
    url = f"{stack.frontend_url}/v1/audio/transcriptions"
    wav = spoken[SENTENCE]

    def post(fields, files):
        parts = [(k, (None, v)) for k, v in fields.items()] + list(files.items())
        return httpx.post(url, files=parts, timeout=120)

    cases = [
        (post({"model": "pocketsphinx"}, {}), 400, "missing_required_parameter"),
        (post({"model": "pocketsphinx"}, {"file": ("g.wav", b"RIFF\x00\x00garbage" * 100, "audio/wav")}), 400,
         "invalid_audio"),
        (post({"model": "pocketsphinx"}, {"file": ("big.wav", b"\x00" * (9 << 20), "audio/wav")}), 413,
         "payload_too_large"),
        (post({"model": "pocketsphinx", "response_format": "docx"}, {"file": ("s.wav", wav, "audio/wav")}), 400,
         "unsupported_format"),
        (post({"model": "pocketsphinx", "language": "fr"}, {"file": ("s.wav", wav, "audio/wav")}), 400,
         "unsupported_language"),
        (post({"model": "nope"}, {"file": ("s.wav", wav, "audio/wav")}), 404, "model_not_found"),
        (post({"model": "piper_tts"}, {"file": ("s.wav", wav, "audio/wav")}), 400, "model_not_supported"),
    ]
    for r, status, code in cases:
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code, r.text
    with pytest.raises(openai.BadRequestError):
        _sdk(stack).audio.transcriptions.create(model="pocketsphinx", file=("x.wav", b"not audio", "audio/wav"))
    _ok_after(stack, spoken)
