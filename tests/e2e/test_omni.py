"""End-to-end: the Qwen3-Omni pipeline (qwen3_omni_thinker -> qwen3_omni_talker -> qwen3_omni_code2wav,
BLS ``qwen3_omni``) on the real tritonserver, through tritonclient gRPC streaming.

Parity reference: ``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)`` on the
same prepared checkpoint in this test process, greedy thinker and talker, with the talker settings
of ``model_repository/qwen3_omni_talker/config.pbtxt``. Text must be equal; the waveform within
WAVE_TOL = 2e-4: the pipeline decodes chunks with 25 frames of left context while the reference
decodes all frames at once, and code2wav's 72-frame attention window is cut to the context
(measured 2.7e-5 / 4.0e-5 in process, tests/unit/test_qwen3_omni.py; dynamic batching of chunks
adds float rounding only).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from clients.omni_grpc_stream import build_chat_inputs, stream_chat
from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX
from omni_triton.paths import model_dir
from omni_triton.serve.repository import available_models, model_parameters

pytestmark = pytest.mark.e2e

WAVE_TOL = 2e-4
QUESTION = "What is the capital of France?"


def _msgs(text):
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def reference():
    """(text, waveform) of the reference generate for a question, voice and max_tokens."""
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    from omni_triton.checkpoints.qwen3_omni import read_manifest

    torch.set_num_threads(1)
    path = model_dir("qwen3-omni-tiny")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    eos = read_manifest(path)["thinker_eos_token_id"]
    talker = model_parameters(available_models()["qwen3_omni_talker"])
    lock = threading.Lock()

    def run(question: str, voice: str = "Ethan", max_tokens: int = 16):
        ids = tok.apply_chat_template(_msgs(question), tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        with lock, torch.inference_mode():
            seq, wav = model.generate(
                torch.tensor([ids]), speaker=voice, return_audio=True, thinker_max_new_tokens=max_tokens,
                thinker_eos_token_id=eos, talker_do_sample=talker["do_sample"] == "true",
                talker_repetition_penalty=float(talker["repetition_penalty"]),
                talker_max_new_tokens=int(talker["default_max_frames"]),
                talker_min_new_tokens=int(talker["default_min_frames"]))
        return tok.decode(seq[0, len(ids):], skip_special_tokens=True), wav[0, 0].float().numpy()

    return run


def _chat(stack, question=QUESTION, max_tokens=16, on_audio=None, **kw):
    sampling = {"temperature": 0, "max_tokens": max_tokens}
    return stream_chat(stack.triton_grpc_url, "qwen3_omni", build_chat_inputs(_msgs(question), sampling=sampling, **kw),
                       on_audio=on_audio)


def test_streamed_text_and_audio_match_reference_generate(stack, reference):
    ref_text, ref_wav = reference(QUESTION, "Ethan")
    frames_before = stack.metric("omni_talker_frames_total", model="qwen3_omni_talker")
    frames_at_first_audio = []

    def on_audio(index, _pcm):  # read while the stream is open
        if index == 0:
            frames_at_first_audio.append(stack.metric("omni_talker_frames_total",
                                                      model="qwen3_omni_talker") - frames_before)

    r = _chat(stack, voice="Ethan", on_audio=on_audio)
    talker_frames = stack.metric("omni_talker_frames_total", model="qwen3_omni_talker") - frames_before
    assert r.completed and r.finish_reason in ("stop", "length")
    assert r.text == ref_text
    assert r.prompt_tokens > 0 and r.completion_tokens == 16
    assert r.sample_rate == 24000
    assert r.audio.shape == ref_wav.shape
    assert np.abs(r.audio - ref_wav).max() <= WAVE_TOL
    # streaming really streams: several text deltas, text before audio, several audio chunks, the
    # first one small (5 frames of 1920 samples, less the decoder's trimmed tail)
    assert len(r.text_deltas) > 1 and r.text_arrival_s[0] < r.audio_arrival_s[0]
    assert len(r.audio_chunks) >= 3 and r.audio_chunks[0].size < r.audio_chunks[1].size
    # the first audio reaches the client before the talker has generated its last frame
    assert frames_at_first_audio and frames_at_first_audio[0] < talker_frames, (frames_at_first_audio, talker_frames)
    assert 1e-3 < float(np.sqrt(np.mean(r.audio ** 2))) and np.abs(r.audio).max() < 0.99


def test_text_only_skips_the_talker(stack, reference):
    before = stack.metric("omni_talker_requests_total", model="qwen3_omni_talker")
    r = _chat(stack, modalities=["text"])
    assert r.completed and r.text == reference(QUESTION)[0]
    assert not r.audio_chunks
    assert stack.metric("omni_talker_requests_total", model="qwen3_omni_talker") == before


def test_concurrent_chats_each_get_their_own_answer(stack, reference):
    jobs = [("Tell me a story.", "Chelsie"), ("Hello, how are you?", "Aiden")]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda qv: _chat(stack, qv[0], voice=qv[1]), jobs))
    for (question, voice), r in zip(jobs, results, strict=True):
        ref_text, ref_wav = reference(question, voice)
        assert r.text == ref_text
        assert r.audio.shape == ref_wav.shape and np.abs(r.audio - ref_wav).max() <= WAVE_TOL


def test_concurrent_requests_interleave_at_the_talker_with_the_same_answers(stack, reference):
    """Four requests at once on two qwen3_omni_talker instances and one qwen3_omni_thinker, all scheduled
    (docs/scheduling.md "The omni talker"): every request's first audio arrives before any
    request's last audio (with the old dispatch, one whole request per talker instance, requests
    3 and 4 got their first audio only after request 1 or 2 had sent its last), and each answer
    still equals its solo reference (the interleaved paced generations are the solo ones)."""
    jobs = [("Tell me a story.", "Chelsie"), ("Hello, how are you?", "Aiden"), (QUESTION, "Ethan"),
            ("Tell me a story.", "Ethan")]
    barrier = threading.Barrier(len(jobs))

    def one(job):
        barrier.wait()
        t0 = time.perf_counter()
        return t0, _chat(stack, job[0], voice=job[1])

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(one, jobs))
    for (question, voice), (_, r) in zip(jobs, results, strict=True):
        ref_text, ref_wav = reference(question, voice)
        assert r.completed and r.text == ref_text
        assert r.audio.shape == ref_wav.shape and np.abs(r.audio - ref_wav).max() <= WAVE_TOL
        assert len(r.audio_chunks) >= 2
    last_first_audio = max(t0 + r.audio_arrival_s[0] for t0, r in results)
    first_last_audio = min(t0 + r.audio_arrival_s[-1] for t0, r in results)
    assert last_first_audio < first_last_audio, (last_first_audio, first_last_audio)


def test_cancel_mid_audio_stops_the_talker(stack):
    """Cancelling after the first audio chunk of a 3000-frame request stops the talker (the BLS
    raises its cancel flag, omni_triton.runtime.cancel_flags.CancelFlags)."""
    frames_before = stack.metric("omni_talker_frames_total", model="qwen3_omni_talker")
    cancelled_before = stack.metric("omni_talker_cancelled_total", model="qwen3_omni_talker")
    inputs = build_chat_inputs(_msgs(QUESTION), sampling={"temperature": 0, "max_tokens": 8})
    import tritonclient.grpc as grpcclient

    cap = grpcclient.InferInput("MAX_AUDIO_FRAMES", [1], "INT32")
    cap.set_data_from_numpy(np.array([3000], np.int32))
    r = stream_chat(stack.triton_grpc_url, "qwen3_omni", inputs + [cap], max_audio_chunks=1)
    assert len(r.audio_chunks) == 1 and not r.completed
    stack.wait_until(lambda: stack.metric("omni_talker_cancelled_total", model="qwen3_omni_talker") > cancelled_before,
                     "talker never saw the cancellation")
    stack.wait_until(lambda: stack.in_progress("qwen3_omni_talker") == 0,
                     "talker still generating for a gone client")
    generated = stack.metric("omni_talker_frames_total", model="qwen3_omni_talker") - frames_before
    assert generated < 3000 // 4, f"talker generated {generated} of 3000 frames after cancel"


def test_cancel_mid_text_stops_the_thinker(stack):
    tokens_before = stack.metric("omni_thinker_tokens_total", model="qwen3_omni_thinker")
    cancelled_before = stack.metric("omni_thinker_cancelled_total", model="qwen3_omni_thinker")
    inputs = build_chat_inputs(_msgs(QUESTION), sampling={"temperature": 0, "max_tokens": 1000, "ignore_eos": True})
    r = stream_chat(stack.triton_grpc_url, "qwen3_omni", inputs, max_text_deltas=1)
    assert r.text_deltas and not r.completed
    stack.wait_until(lambda: stack.metric("omni_thinker_cancelled_total",
                                          model="qwen3_omni_thinker") > cancelled_before,
                     "thinker never saw the cancellation")
    stack.wait_until(lambda: stack.in_progress("qwen3_omni_thinker") == 0, "thinker still busy")
    generated = stack.metric("omni_thinker_tokens_total", model="qwen3_omni_thinker") - tokens_before
    assert generated < 1000, f"thinker generated {generated} of 1000 tokens after cancel"


@pytest.mark.parametrize("kwargs,needle", [
    (dict(messages=[{"role": "robot", "content": "hi"}]), "role"),
    (dict(messages=[]), "non-empty"),
    (dict(messages=_msgs("hi"), sampling={"max_tokens": -1}), "max_tokens"),
    (dict(messages=_msgs("hi"), sampling={"temperature": "hot"}), "temperature"),
    (dict(messages=_msgs("hi"), modalities=["video"]), "MODALITIES"),
    (dict(messages=_msgs("hi"), voice="Bob"), "voice"),
    (dict(prompt="no chat template here"), "assistant"),
    (dict(messages=_msgs("word " * 1200)), "max_model_len"),
])
def test_bad_input_is_invalid_arg_and_server_keeps_serving(stack, kwargs, needle):
    with pytest.raises(InferenceServerException) as exc:
        stream_chat(stack.triton_grpc_url, "qwen3_omni", build_chat_inputs(**kwargs), timeout_s=60)
    # in-band error (no triton_grpc_error header: it crashed 2.51): INVALID_ARG is the message prefix
    assert INVALID_INPUT_PREFIX in exc.value.message(), exc.value.message()  # as the frontend reads it
    assert needle in exc.value.message(), exc.value.message()
    ok = _chat(stack, "Still there?", max_tokens=4, modalities=["text"])
    assert ok.completed and ok.completion_tokens == 4


def test_raw_prompt_text_only(stack):
    """``PROMPT`` (``/v1/completions``) is tokenized as is; text-only, since the talker's prompt
    needs a chat turn."""
    r = stream_chat(stack.triton_grpc_url, "qwen3_omni", build_chat_inputs(
        prompt="The capital of France is", sampling={"temperature": 0, "max_tokens": 6}, modalities=["text"]))
    assert r.completed and r.completion_tokens == 6 and r.text and not r.audio_chunks


def test_code2wav_batches_concurrent_chunks(stack):
    """Chunks of different lengths sent together run in one execution (ragged dynamic batching)
    and each gets exactly its own samples."""
    import httpx
    import tritonclient.grpc as grpcclient

    def batch_sizes():
        s = httpx.get(f"{stack.triton_http_url}/v2/models/qwen3_omni_code2wav/stats").json()
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in s["model_stats"][0].get("batch_stats",
                                                                                                        [])}

    before = batch_sizes()
    client = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    rng = np.random.default_rng(0)
    done, event = [], threading.Event()

    def callback(result, error):
        done.append((result, error))
        if len(done) == 8:
            event.set()

    for i in range(8):
        frames = 5 + 3 * i
        codes = grpcclient.InferInput("CODES", [1, frames, 4], "INT64")
        codes.set_data_from_numpy(rng.integers(0, 64, size=(1, frames, 4), dtype=np.int64))
        left = grpcclient.InferInput("LEFT_CONTEXT", [1, 1], "INT32")
        left.set_data_from_numpy(np.array([[2]], np.int32))
        client.async_infer("qwen3_omni_code2wav", [codes, left], callback)
    assert event.wait(120)
    client.close()
    assert all(err is None for _, err in done), [str(e) for _, e in done if e]
    # 1920 samples per frame; a chunk with context gives the new frames' samples exactly
    assert sorted(res.as_numpy("AUDIO").size for res, _ in done) == [(3 + 3 * i) * 1920 for i in range(8)]
    executed = lambda: sum(k * (v - before.get(k, 0)) for k, v in batch_sizes().items())  # noqa: E731
    stack.wait_until(lambda: executed() >= 8, "statistics never counted the 8 requests")  # updated after the responses
    after = batch_sizes()
    grew = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    assert any(k > 1 for k in grew), f"no multi-request batch executed: {grew}"
