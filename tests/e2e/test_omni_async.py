"""End-to-end: speak while thinking (``qwen3_omni``'s ``async_chunk``) on the real tritonserver.

With ``ASYNC_CHUNK`` true, ``qwen3_omni`` streams one stage, ``qwen3_omni_talker``, which streams
``qwen3_omni_thinker`` itself and feeds the talker the thinker's per-token rows as they come; with false,
the talker starts when the thinker has finished (the old order). Parity: both give the reference
``generate``'s text and, within WAVE_TOL (chunked decoding, see tests/e2e/test_omni.py), its
waveform; the two modes decode the same codes (they differ by code2wav's dynamic-batching
rounding at most, <= 1e-5). Order of events, not seconds: on a long answer the first audio
response arrives before the thinker's last text delta only when speaking while thinking.
"""
from __future__ import annotations

import numpy as np
import pytest

from clients.omni_grpc_stream import build_chat_inputs, stream_chat

pytestmark = pytest.mark.e2e

WAVE_TOL = 2e-4
QUESTION = "Tell me a story."


def _msgs(text):
    return [{"role": "user", "content": text}]


def _flag(name, value, dtype="BOOL"):
    import tritonclient.grpc as grpcclient

    t = grpcclient.InferInput(name, [1], dtype)
    t.set_data_from_numpy(np.array([value], dtype=bool if dtype == "BOOL" else np.int32))
    return t


def _chat(stack, async_chunk, sampling, max_frames=None, **kw):
    inputs = build_chat_inputs(_msgs(QUESTION),
                               sampling={"temperature": 0, **sampling}) + [_flag("ASYNC_CHUNK", async_chunk)]
    if max_frames is not None:
        inputs.append(_flag("MAX_AUDIO_FRAMES", max_frames, "INT32"))
    return stream_chat(stack.triton_grpc_url, "qwen3_omni", inputs, **kw)


@pytest.fixture(scope="module")
def reference():
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    from omni_triton.checkpoints.qwen3_omni import read_manifest
    from omni_triton.paths import model_dir
    from omni_triton.serve.repository import available_models, model_parameters

    torch.set_num_threads(1)
    path = model_dir("qwen3-omni-tiny")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    talker = model_parameters(available_models()["qwen3_omni_talker"])
    ids = tok.apply_chat_template(_msgs(QUESTION), tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    with torch.inference_mode():
        seq, wav = model.generate(
            torch.tensor([ids]), speaker="Ethan", return_audio=True, thinker_max_new_tokens=24,
            thinker_eos_token_id=read_manifest(path)["thinker_eos_token_id"], talker_do_sample=False,
            talker_repetition_penalty=float(talker["repetition_penalty"]),
            talker_max_new_tokens=int(talker["default_max_frames"]),
            talker_min_new_tokens=int(talker["default_min_frames"]))
    return tok.decode(seq[0, len(ids):], skip_special_tokens=True), wav[0, 0].float().numpy()


def test_async_chunk_parity_with_reference_and_sync(stack, reference):
    ref_text, ref_wav = reference
    talker_requests = stack.metric("omni_talker_requests_total", model="qwen3_omni_talker")
    on = _chat(stack, True, {"max_tokens": 24})
    off = _chat(stack, False, {"max_tokens": 24})
    assert stack.metric("omni_talker_requests_total", model="qwen3_omni_talker") == talker_requests + 2
    for r in (on, off):
        assert r.completed and r.text == ref_text and r.completion_tokens == 24
        assert r.audio.shape == ref_wav.shape and np.abs(r.audio - ref_wav).max() <= WAVE_TOL
        assert len(r.audio_chunks) >= 3
    assert [c.size for c in on.audio_chunks] == [c.size for c in off.audio_chunks]
    assert np.abs(on.audio - off.audio).max() <= 1e-5


def test_first_audio_before_the_last_text_delta_only_when_speaking_while_thinking(stack):
    """A 200-token answer (min_tokens), 30 frames of speech: the talker needs ~7 thinker tokens
    for its first 5-frame chunk."""
    sampling = {"max_tokens": 200, "min_tokens": 200}
    on = _chat(stack, True, sampling, max_frames=30)
    assert on.completed and on.completion_tokens == 200 and on.audio_chunks
    assert on.audio_arrival_s[0] < on.text_arrival_s[-1], "first audio came after the whole answer"
    off = _chat(stack, False, sampling, max_frames=30)
    assert off.completed and off.text == on.text
    assert off.audio_arrival_s[0] > off.text_arrival_s[-1]  # the old order: speech after the answer
    assert np.abs(on.audio - off.audio).max() <= 1e-5


def test_cancel_mid_answer_stops_thinker_and_talker(stack):
    """The client goes away after the first audio chunk, while the thinker is still generating a
    1000-token answer: both stages see the cancellation and stop."""
    def metric(name, model):
        return stack.metric(name, model=model)

    tokens = metric("omni_thinker_tokens_total", "qwen3_omni_thinker")
    frames = metric("omni_talker_frames_total", "qwen3_omni_talker")
    cancelled = (metric("omni_thinker_cancelled_total", "qwen3_omni_thinker"),
                 metric("omni_talker_cancelled_total", "qwen3_omni_talker"))
    r = _chat(stack, True, {"max_tokens": 1000, "ignore_eos": True}, max_frames=3000, max_audio_chunks=1)
    assert len(r.audio_chunks) == 1 and not r.completed
    stack.wait_until(lambda: metric("omni_thinker_cancelled_total", "qwen3_omni_thinker") > cancelled[0],
                     "thinker never saw the cancellation")
    stack.wait_until(lambda: metric("omni_talker_cancelled_total", "qwen3_omni_talker") > cancelled[1],
                     "talker never saw the cancellation")
    stack.wait_until(lambda: stack.in_progress("qwen3_omni_thinker") == 0, "thinker still busy")
    stack.wait_until(lambda: stack.in_progress("qwen3_omni_talker") == 0, "talker still busy")
    assert metric("omni_thinker_tokens_total", "qwen3_omni_thinker") - tokens < 1000
    assert metric("omni_talker_frames_total", "qwen3_omni_talker") - frames < 3000 // 4
    ok = _chat(stack, True, {"max_tokens": 4})  # and the pipeline keeps serving
    assert ok.completed and ok.completion_tokens == 4
