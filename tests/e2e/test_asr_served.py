"""End-to-end: the ASR models (``whisper`` BLS over ``whisper_encoder`` -> ``whisper_decoder``, and
``pocketsphinx``) served by tritonserver, spoken to with tritonclient (docs/asr.md).

Run alone with ``OMNI_TRITON_E2E_MODELS=piper,whisper,pocketsphinx``. Properties: the served
Whisper tokens and text equal transformers' ``generate`` (greedy, the same features and forced
language/task/prompt tokens), alone and for requests batched together (the batches are shown
formed: the encoder's Triton statistics, the decoder's step metrics); the text streams as deltas;
pocketsphinx transcribes Piper's speech (WER by jiwer); bad input is INVALID_ARG and the server
keeps serving."""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jiwer
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from clients.bench_common import metric_total
from clients.tts_grpc_stream import stream_tts
from omni_triton.contracts import asr
from omni_triton.contracts import whisper as wh
from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX, infer_input, utf8_array
from omni_triton.media.audio import resample

pytestmark = pytest.mark.e2e

SENTENCES = ["The capital of France is Paris.", "Please speak slowly and clearly, thank you.",
             "The weather is nice and the sky is blue."]


def _stream(url: str, model: str, pairs, outputs=(asr.TEXT_DELTA,), timeout_s: float = 120.0):
    """One request on a gRPC stream: ``[(arrival s, {output: array})]`` of its non-empty responses.

    Raises:
        InferenceServerException: the model answered with an error.
    """
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    got, done = [], False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        start = time.perf_counter()
        client.async_stream_infer(model, [infer_input(grpcclient.InferInput, n, a) for n, a in pairs],
                                  outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                                  enable_empty_final_response=True)
        while True:
            res, err = responses.get(timeout=timeout_s)
            if err is not None:
                raise err
            out = {o: res.as_numpy(o) for o in outputs if res.as_numpy(o) is not None}
            if out:
                got.append((time.perf_counter() - start, out))
            final = res.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                done = True
                return got
    finally:
        client.stop_stream(cancel_requests=not done)
        client.close()


def _text(responses) -> str:
    return "".join(out[asr.TEXT_DELTA].reshape(-1)[0].decode() for _, out in responses)


def _transcribe(url, model, audio, language=None, prompt=None, task=None) -> str:
    return _text(_stream(url, model, asr.asr_inputs(audio, language, prompt, task)))


@pytest.fixture(scope="module")
def reference():
    """transformers' Whisper (the checkpoint the stages load) and a ``generate`` reference."""
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from omni_triton.checkpoints.whisper import checkpoint_dir

    path = checkpoint_dir()
    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    proc = WhisperProcessor.from_pretrained(path)
    eot = proc.tokenizer.eos_token_id

    def generate(audio, language=None, task="transcribe", prompt=None) -> list[int]:
        feats = proc.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
        kw = {"task": task}
        if language:
            kw["language"] = language
        if prompt:
            kw["prompt_ids"] = proc.tokenizer.get_prompt_ids(prompt, return_tensors="pt")
        with torch.no_grad():
            return [t for t in model.generate(feats, **kw)[0].tolist() if t != eot]

    generate.decode = lambda tokens: proc.tokenizer.decode(tokens, skip_special_tokens=True)  # type: ignore[attr-defined]
    return generate


def _audios(n: int) -> list[np.ndarray]:
    """``n`` different 16 kHz clips (noise of different lengths and levels, a tone)."""
    rng = np.random.default_rng(26)
    clips = [(rng.standard_normal(int(16000 * (0.5 + 0.7 * i))) * (0.05 + 0.1 * i)).astype(np.float32)
             for i in range(n - 1)]
    return clips + [(0.3 * np.sin(np.arange(32000) / 16000 * 2 * np.pi * 440)).astype(np.float32)]


CASES = [dict(language="en"), dict(language="fr", task="translate"), dict(), dict(language="de", prompt="hello world")]


@pytest.mark.parametrize("case", CASES, ids=["en", "fr-translate", "detect", "de-prompt"])
def test_whisper_alone_equals_generate(stack, reference, case):
    audio = _audios(3)[1]
    want = reference(audio, case.get("language"), case.get("task", "transcribe"), case.get("prompt"))
    text = _transcribe(stack.triton_grpc_url, "whisper", audio, case.get("language"), case.get("prompt"),
                       case.get("task"))
    assert text == reference.decode(want)
    # the tokens themselves, through the two stages
    hidden = grpcclient.InferenceServerClient(stack.triton_grpc_url).infer(
        "whisper_encoder", [infer_input(grpcclient.InferInput, "AUDIO", audio[None])]).as_numpy(wh.ENCODER_HIDDEN)[0]
    pairs = [(wh.ENCODER_HIDDEN, hidden)] + [(k.upper(), utf8_array(v)) for k, v in case.items()]
    got = _stream(stack.triton_grpc_url, "whisper_decoder", pairs, (wh.TOKENS, asr.TEXT_DELTA))
    assert [int(out[wh.TOKENS][0]) for _, out in got] == want


def _decoder_rows_steps(stack) -> tuple[float, float]:
    text = httpx.get(stack.metrics_url).text
    return (metric_total(text, "omni_asr_decoder_step_rows_total"), metric_total(text, "omni_asr_decoder_steps_total"))


def _encoder_counts(stack) -> tuple[int, int]:
    stats = grpcclient.InferenceServerClient(stack.triton_grpc_url).get_inference_statistics(
        "whisper_encoder", as_json=True)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_whisper_batched_equals_generate(stack, reference):
    """8 requests at once: each text equals its own ``generate``; the decoder decoded them in
    shared steps (rows per step > 1) and the encoder ran them in batches (executions < inferences)."""
    audios = _audios(8)
    want = [reference.decode(reference(a, "en")) for a in audios]
    rows0, steps0 = _decoder_rows_steps(stack)
    with ThreadPoolExecutor(len(audios)) as pool:
        got = list(pool.map(lambda a: _transcribe(stack.triton_grpc_url, "whisper", a, "en"), audios))
    assert got == want
    rows1, steps1 = _decoder_rows_steps(stack)
    assert (rows1 - rows0) / (steps1 - steps0) > 1.5, "the decoder did not batch the concurrent requests"
    # the encoder's dynamic batcher: 8 segments sent together share passes
    inf0, exe0 = _encoder_counts(stack)
    client = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    results: queue.Queue = queue.Queue()
    for a in audios:
        client.async_infer("whisper_encoder", [infer_input(grpcclient.InferInput, "AUDIO", a[None])],
                           callback=lambda result, error: results.put((result, error)))
    hidden = [results.get(timeout=60) for _ in audios]
    assert all(err is None for _, err in hidden)
    inf1, exe1 = _encoder_counts(stack)
    assert inf1 - inf0 == len(audios) and exe1 - exe0 < inf1 - inf0, (inf1 - inf0, exe1 - exe0)


def test_whisper_streams_text_deltas(stack, reference):
    audio = _audios(2)[0]
    got = _stream(stack.triton_grpc_url, "whisper", asr.asr_inputs(audio, "en"))
    assert len(got) > 3, "the text came in one piece"
    assert all(out[asr.TEXT_DELTA].reshape(-1)[0] for _, out in got)
    assert got[0][0] < got[-1][0]
    assert _text(got) == reference.decode(reference(audio, "en"))


@pytest.fixture(scope="module")
def spoken(stack):
    """The Piper voice (served ``piper``) speaking :data:`SENTENCES`, resampled to 16 kHz."""
    out = []
    for text in SENTENCES:
        result = stream_tts(stack.triton_grpc_url, "piper", text)
        out.append(resample(np.concatenate(result.chunks), result.sample_rate, asr.SAMPLE_RATE))
    return out


def _words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


def test_pocketsphinx_transcribes_piper(stack, spoken):
    """Piper speaks, pocketsphinx (real weights) writes it back, all sentences at once: WER <= 0.5."""
    with ThreadPoolExecutor(len(spoken)) as pool:
        hyps = list(pool.map(lambda a: _transcribe(stack.triton_grpc_url, "pocketsphinx", a, "en"), spoken))
    wer = jiwer.wer([_words(s) for s in SENTENCES], [_words(h) for h in hyps])
    print(f"pocketsphinx WER {wer:.3f}: {hyps}")
    assert wer <= 0.5, hyps


def _refused(stack, model, audio, **kw) -> str:
    with pytest.raises(InferenceServerException) as info:
        _stream(stack.triton_grpc_url, model, asr.asr_inputs(audio, **kw))
    return f"{info.value.status()} {info.value.message()}"


@pytest.mark.parametrize("model", ["whisper", "pocketsphinx"])
def test_bad_input_is_invalid_arg_and_the_server_keeps_serving(stack, spoken, model):
    ok = spoken[0]
    too_long = np.zeros(30 * asr.SAMPLE_RATE + 1, np.float32)
    cases = [(np.zeros(0, np.float32), {}, "empty"), (too_long, {}, "at most 30"),
             (ok, {"language": "xx"}, "language"), (ok, {"task": "summarize"}, "task")]
    if model == "pocketsphinx":
        cases.append((ok, {"task": "translate"}, "cannot translate"))
    for audio, kw, needle in cases:
        message = _refused(stack, model, audio, **kw)
        # a decoupled stream's error carries no status code: INVALID_ARG is the message prefix the
        # stage bases write for it (contracts.tensors.INVALID_INPUT_PREFIX; the frontend's 400)
        assert INVALID_INPUT_PREFIX in message and needle in message, message
    assert _transcribe(stack.triton_grpc_url, model, ok, "en")  # still serving


def test_cancelled_whisper_request_cancels_the_decoder(stack):
    """Stopping the stream after the first delta cancels the decoder's request (its counter moves)."""
    def cancelled() -> float:
        return metric_total(httpx.get(stack.metrics_url).text, "omni_asr_decoder_cancelled_total")

    before = cancelled()
    client = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    first = threading.Event()
    client.start_stream(callback=lambda result, error: first.set())
    audio = _audios(2)[0]
    client.async_stream_infer("whisper", [infer_input(grpcclient.InferInput, n, a)
                                          for n, a in asr.asr_inputs(audio, "en")],
                              enable_empty_final_response=True)
    assert first.wait(60)
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 30
    while cancelled() <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cancelled() > before
