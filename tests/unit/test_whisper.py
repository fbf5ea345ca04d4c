"""The whisper family without Triton (omni_triton.stages.whisper, checkpoints.whisper): the tiny
checkpoint works with transformers' ``generate(language=, task=, prompt_ids=)``, and the stages'
encoder + continuously batched decoder give exactly ``generate``'s greedy tokens and text, for one
request and for requests that join and leave one batch (docs/asr.md "Parity")."""
from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from omni_triton.checkpoints.whisper import build_tiny_whisper  # noqa: E402
from omni_triton.stages.whisper.decoder import DecodeRequest, DecoderScheduler, WhisperDecoding  # noqa: E402
from omni_triton.stages.whisper.encoder import WhisperEncoderRunner  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    path = build_tiny_whisper(tmp_path_factory.mktemp("whisper"))
    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    return (path, model, WhisperProcessor.from_pretrained(path), WhisperEncoderRunner.from_pretrained(path),
            WhisperDecoding.from_pretrained(path))


def _clips(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal(int(16000 * (0.5 + 0.6 * i))) * (0.05 + 0.1 * i)).astype(np.float32)
            for i in range(n)]


def _generate(tiny, audio, language=None, task="transcribe", prompt=None) -> list[int]:
    _, model, proc, _, dec = tiny
    feats = proc.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    kw = {"task": task, **({"language": language} if language else {})}
    if prompt:
        kw["prompt_ids"] = proc.tokenizer.get_prompt_ids(prompt, return_tensors="pt")
    with torch.no_grad():
        return [t for t in model.generate(feats, **kw)[0].tolist() if t != dec.eot]


def _serve(tiny, audios, cases, max_seqs=8, stop_after=None):
    """Decode ``audios`` through the stages' encoder and one :class:`DecoderScheduler`, all submitted
    at once; returns (tokens, texts, reasons, rows per step)."""
    _, _, _, enc, dec = tiny
    hidden = enc.encode(audios)
    steps: list[int] = []
    sched = DecoderScheduler(dec, max_seqs, on_step=steps.append)
    n = len(audios)
    tokens, texts, reasons = [[] for _ in range(n)], [""] * n, [None] * n
    left, finished = [n], threading.Event()

    def done(i, reason, error):
        reasons[i] = (reason, error)
        left[0] -= 1
        if not left[0]:
            finished.set()

    for i, (h, case) in enumerate(zip(hidden, cases, strict=True)):
        def emit(token, delta, compute_ms, i=i):
            tokens[i].append(token)
            texts[i] += delta
            assert compute_ms > 0

        stop = (lambda i=i: len(tokens[i]) >= stop_after) if stop_after else (lambda: False)
        sched.submit(DecodeRequest(h, case.get("language"), case.get("task", "transcribe"), case.get("prompt"), 24),
                     emit, stop, lambda reason, error, i=i: done(i, reason, error))
    assert finished.wait(120)
    sched.close()
    return tokens, texts, reasons, steps


CASES = [dict(language="en"), dict(language="fr", task="translate"), dict(), dict(language="de", prompt="hello world")]


def test_the_tiny_checkpoint_generates_with_language_and_task(tiny):
    _, _, proc, _, dec = tiny
    audio = _clips(1)[0]
    en, fr = _generate(tiny, audio, "en"), _generate(tiny, audio, "fr", "translate")
    assert 1 <= len(en) <= 24 and en != fr  # the forced tokens change the text
    assert dec.eot not in en and all(t >= 256 for t in en)  # byte tokens suppressed: whole UTF-8 text
    assert proc.tokenizer.decode(en, skip_special_tokens=True)
    assert len(dec.languages) > 90 and "en" in dec.languages


@pytest.mark.parametrize("case", CASES, ids=["en", "fr-translate", "detect", "de-prompt"])
def test_one_request_equals_generate(tiny, case):
    audio = _clips(3)[2]
    tokens, texts, reasons, _ = _serve(tiny, [audio], [case])
    want = _generate(tiny, audio, case.get("language"), case.get("task", "transcribe"), case.get("prompt"))
    assert tokens[0] == want
    assert texts[0] == tiny[2].tokenizer.decode(want, skip_special_tokens=True)
    assert reasons[0] == ("stop", None)


def test_requests_batched_together_equal_generate_each(tiny):
    """Six requests of different audio, prompt lengths and stop points share the decoder's steps
    (rows per step > 1, rows leaving as they end) and each still gets exactly its own tokens."""
    audios = _clips(6)
    cases = [CASES[i % len(CASES)] for i in range(6)]
    tokens, _, reasons, steps = _serve(tiny, audios, cases)
    for audio, case, got in zip(audios, cases, tokens, strict=True):
        assert got == _generate(tiny, audio, case.get("language"), case.get("task", "transcribe"), case.get("prompt"))
    assert max(steps) == 6 and sum(steps) / len(steps) > 2, steps
    assert all(r == ("stop", None) for r in reasons)


def test_admission_is_bounded_by_max_seqs(tiny):
    audios = _clips(3)
    tokens, _, _, steps = _serve(tiny, audios, [CASES[0]] * 3, max_seqs=2)
    assert max(steps) == 2
    assert tokens == [_generate(tiny, a, "en") for a in audios]


def test_a_cancelled_request_leaves_the_batch_and_the_others_go_on(tiny):
    audios = _clips(3)
    tokens, _, reasons, _ = _serve(tiny, audios, [CASES[0]] * 3, stop_after=3)
    assert all(r == ("cancelled", None) for r in reasons)
    assert all(len(t) == 3 for t in tokens)
