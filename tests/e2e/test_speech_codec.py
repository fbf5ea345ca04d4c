"""End-to-end: the codec-token TTS pipeline (csm_talker -> csm_code2wav, BLS ``csm``) on Triton.

Parity reference: plain transformers on the same prepared tiny CSM checkpoint in this test process,
none of the project's generation code: ``CsmProcessor.apply_chat_template`` (the speaker id as the
role), ``CsmForConditionalGeneration.generate`` greedy with the served settings (the talker's
``default_min_frames``/``default_max_frames``), the frames cut at CSM's EOS frame (codebooks
0..K-2 all ``codebook_eos_token_id``, generate's own stopping rule), and one Mimi
``codec_model.decode`` of all frames. The depth decoder's settings are passed as generate's
``depth_decoder_*`` arguments from the checkpoint's ``generation_config.json`` (transformers 5.19's
``GenerationConfig.from_pretrained`` drops those keys). The min-frames floor is a logits processor
written here: generate's ``min_new_tokens`` counts codebooks, not frames, for CSM's 3-D ids.
Tolerances:
- float32 PCM from Triton gRPC vs the one-shot reference: 2e-5 max abs. Chunked decoding with 25
  frames of left context differs from the one-shot decode by ~1.5e-6 on this tiny model, and
  dynamic batching (right padding, other requests in the batch) by ~2.7e-7 (measured; see
  tests/unit/test_codec_tts.py and docs/speech_contracts.md).
- 16-bit PCM through the OpenAI frontend: the float tolerance plus one quantisation step
  (1/32767), since int16 rounding of values within 2e-5 can land on neighbouring codes.
"""
from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf

from clients.tts_grpc_stream import stream_tts
from omni_triton.paths import model_dir
from omni_triton.serve.repository import available_models, model_parameters

pytestmark = pytest.mark.e2e

TEXT = "Hello from the codec pipeline. It streams chunk by chunk."
FLOAT_TOL = 2e-5
INT16_TOL = FLOAT_TOL + 1.5 / 32767


@pytest.fixture(scope="module")
def reference():
    """``reference(text, speaker)`` -> SimpleNamespace(codes ``int64 [T, K]``, audio ``float32
    [T * samples_per_frame]``) from plain transformers (see the module docstring)."""
    import json
    import math
    from types import SimpleNamespace

    import torch
    from transformers import AutoProcessor, CsmForConditionalGeneration, LogitsProcessor, LogitsProcessorList

    torch.set_num_threads(1)
    path = model_dir("csm-tiny")
    models = available_models()
    talker_params = model_parameters(models["csm_talker"])
    tts_params = model_parameters(models["csm"])
    model = CsmForConditionalGeneration.from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)
    saved = json.loads((path / "generation_config.json").read_text())
    depth = {k: v for k, v in saved.items() if k in ("depth_decoder_do_sample", "depth_decoder_suppress_tokens")}
    eos = model.config.codebook_eos_token_id
    min_frames = int(talker_params["default_min_frames"])

    def frame_cap(text: str) -> int:
        """The talker's cap tts sets without MAX_FRAMES (model_repository/csm/config.pbtxt:
        max(min_max_frames, ceil(len(text) * max_frames_per_char))), written out here."""
        return max(int(tts_params["min_max_frames"]),
                   math.ceil(len(text) * float(tts_params["max_frames_per_char"])))

    class MinFrames(LogitsProcessor):
        """No EOS in codebook 0 before ``min_frames`` frames (CSM's ids are [batch, frames, K])."""

        def __call__(self, input_ids, scores):
            if (input_ids.shape[1] if input_ids.ndim == 3 else 0) < min_frames:
                scores = scores.clone()
                scores[:, eos] = -float("inf")
            return scores

    lock = threading.Lock()

    def run(text: str, speaker: int):
        conversation = [{"role": str(speaker), "content": [{"type": "text", "text": text}]}]
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True, return_tensors="pt")
        with lock, torch.inference_mode():
            codes = model.generate(**inputs, do_sample=False, max_new_tokens=frame_cap(text), **depth,
                                   logits_processor=LogitsProcessorList([MinFrames()]))[0]
            ended = (codes[:, :-1] == eos).all(-1).nonzero()
            codes = codes[: int(ended.min()) if ended.numel() else codes.shape[0]]
            audio = model.codec_model.decode(codes.transpose(0, 1).unsqueeze(0)).audio_values[0, 0]
        return SimpleNamespace(codes=codes.numpy(), audio=audio.numpy())

    # an idle server's first chunk: the dynamic first chunk's smallest (docs/scheduling.md "The first chunk")
    run.first_chunk_frames = int(tts_params.get("initial_chunk_frames_min", tts_params["first_chunk_frames"]))
    run.initial_chunk_frames_max = int(tts_params.get("initial_chunk_frames_max", run.first_chunk_frames))
    run.chunk_frames = int(tts_params["chunk_frames"])
    run.samples_per_frame = int(round(model.codec_model.config.sampling_rate / model.codec_model.config.frame_rate))
    return run


def _chunk_frames(total: int, first: int, chunk: int) -> list[int]:
    """New frames per streamed chunk under the tts schedule: a small first chunk, then ``chunk``
    frames each, then the rest (docs/speech_contracts.md)."""
    sizes = [min(first, total)]
    while sum(sizes) < total:
        sizes.append(min(chunk, total - sum(sizes)))
    return [s for s in sizes if s]


def _assert_chunk_rule(sizes: list[int], total: int, first: int, chunk: int) -> None:
    """Streamed chunk sizes (frames) follow the tts schedule: the fixed one, or with the config's
    low water some later chunks sent early, shorter (>= ``first`` frames, never more than
    ``chunk``), when the talker fell behind the listener (a loaded machine). Every frame once."""
    assert sizes[0] == first and sum(sizes) == total, sizes
    if sizes != _chunk_frames(total, first, chunk):
        assert all(first <= n <= chunk for n in sizes[1:-1]) and 1 <= sizes[-1] <= chunk, sizes


def test_grpc_stream_matches_in_process_reference(stack, reference):
    ref = reference(TEXT, 1)
    result = stream_tts(stack.triton_grpc_url, "csm", TEXT, voice="1")
    assert result.sample_rate == 24000
    assert len(result.chunks) >= 3, "expected a small first chunk and further chunks"
    assert result.chunks[0].size == reference.first_chunk_frames * reference.samples_per_frame  # low TTFP
    frames = len(ref.codes)
    assert all(c.size % reference.samples_per_frame == 0 for c in result.chunks)
    _assert_chunk_rule([c.size // reference.samples_per_frame for c in result.chunks], frames,
                       reference.first_chunk_frames, reference.chunk_frames)
    assert result.audio.size == ref.audio.size
    assert np.max(np.abs(result.audio - ref.audio)) <= FLOAT_TOL
    rms = float(np.sqrt(np.mean(result.audio ** 2)))
    assert rms > 1e-3 and np.max(np.abs(result.audio)) < 1.0  # audible, not clipped


def test_the_first_chunk_grows_with_the_open_streams(stack, reference):
    """Issue 29 item 2 (docs/scheduling.md "The first chunk"): alone, a csm stream's first chunk is
    the smallest (2 frames, 0.16 s); with 7 other csm streams open (8 at once) some first chunks are
    larger, none above 16 frames, and every stream's joined audio is the in-process reference's.
    Red with a fixed first chunk (both initial_chunk_frames_* removed from csm's config)."""
    alone = stream_tts(stack.triton_grpc_url, "csm", TEXT, voice="1")
    assert alone.chunks[0].size == reference.first_chunk_frames * reference.samples_per_frame == 2 * 1920
    texts = [(f"Concurrent request number {i}, with its own words.", i % 4) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda tv: stream_tts(stack.triton_grpc_url, "csm", tv[0], voice=str(tv[1])), texts))
    firsts = sorted(r.chunks[0].size // reference.samples_per_frame for r in results)
    assert firsts[-1] > reference.first_chunk_frames and firsts[-1] <= reference.initial_chunk_frames_max, firsts
    assert set(firsts) <= {2, 4, 8, 16}, firsts
    for (text, voice), result in zip(texts, results, strict=True):
        ref = reference(text, voice)
        assert result.audio.size == ref.audio.size
        assert np.max(np.abs(result.audio - ref.audio)) <= FLOAT_TOL


def test_first_audio_arrives_before_the_talker_finishes(stack, reference):
    """Streaming, not buffering: when the first chunk reaches the client the talker has generated
    only part of the frames (its frames counter, read while the stream is open)."""
    before = stack.metric("omni_tts_talker_frames_total", model="csm_talker")
    at_first = []

    def on_chunk(index, _pcm):
        if index == 0:
            at_first.append(stack.metric("omni_tts_talker_frames_total", model="csm_talker") - before)

    result = stream_tts(stack.triton_grpc_url, "csm", TEXT, voice="1", on_chunk=on_chunk)
    total = result.audio.size // reference.samples_per_frame
    assert stack.metric("omni_tts_talker_frames_total", model="csm_talker") - before == total
    assert at_first and at_first[0] < total, f"{at_first} of {total} frames generated at the first audio"


def test_frontend_streamed_pcm_equals_non_streamed_and_reference(stack, reference):
    ref = reference(TEXT, 2)
    body = {"model": "tts", "voice": "2", "input": TEXT, "response_format": "pcm"}
    whole = httpx.post(f"{stack.frontend_url}/v1/audio/speech", json=body, timeout=120)
    assert whole.status_code == 200, whole.text
    assert whole.headers["x-sample-rate"] == "24000"
    pieces = []
    with httpx.stream("POST", f"{stack.frontend_url}/v1/audio/speech", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            pieces.append(chunk)
    streamed = b"".join(pieces)
    a = np.frombuffer(whole.content, "<i2").astype(np.float32) / 32767
    b = np.frombuffer(streamed, "<i2").astype(np.float32) / 32767
    assert a.size == b.size == ref.audio.size
    assert np.max(np.abs(a - b)) <= 1.5 / 32767  # same pipeline, at most one LSB from batching
    assert np.max(np.abs(a - ref.audio)) <= INT16_TOL


def test_openai_sdk_wav_from_codec_pipeline(stack, reference):
    import openai

    client = openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0)
    audio = client.audio.speech.create(model="tts", voice="0", input=TEXT, response_format="wav")
    data, sr = sf.read(io.BytesIO(audio.content), dtype="float32")
    ref = reference(TEXT, 0)
    assert sr == 24000 and data.size == ref.audio.size
    assert np.max(np.abs(data - ref.audio)) <= INT16_TOL


def test_concurrent_requests_each_get_their_own_audio(stack, reference):
    """Four concurrent streams (code2wav batches their chunks) equal their in-process references."""
    texts = [(f"Concurrent request number {i}, with its own words.", i % 4) for i in range(4)]
    before = _talker_requests_by_instance(stack)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda tv: stream_tts(stack.triton_grpc_url, "csm", tv[0], voice=str(tv[1])), texts))
    after = _talker_requests_by_instance(stack)
    busy = [i for i in after if after[i] > before.get(i, 0)]
    assert len(busy) == 2, f"talker instances that served requests: {busy}"
    for (text, voice), result in zip(texts, results, strict=True):
        ref = reference(text, voice)
        assert result.audio.size == ref.audio.size
        assert np.max(np.abs(result.audio - ref.audio)) <= FLOAT_TOL


def _talker_requests_by_instance(stack) -> dict[str, float]:
    import re

    text = httpx.get(stack.metrics_url, timeout=10).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^omni_tts_talker_requests_total\{[^}]*instance="([^"]+)"[^}]*\} (\S+)$', text, re.M)}


def test_code2wav_batches_concurrent_chunks(stack, reference):
    """Chunks of different lengths sent together run in one execution (ragged dynamic batching)."""
    import tritonclient.grpc as grpcclient

    stats_before = httpx.get(f"{stack.triton_http_url}/v2/models/csm_code2wav/stats").json()
    client = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    rng = np.random.default_rng(0)
    done = []
    event = threading.Event()

    def callback(result, error):
        done.append((result, error))
        if len(done) == 8:
            event.set()

    for i in range(8):
        frames = 5 + 3 * i
        codes = grpcclient.InferInput("CODES", [1, frames, 8], "INT64")
        codes.set_data_from_numpy(rng.integers(0, 64, size=(1, frames, 8), dtype=np.int64))
        left = grpcclient.InferInput("LEFT_CONTEXT", [1, 1], "INT32")
        left.set_data_from_numpy(np.array([[0]], np.int32))
        client.async_infer("csm_code2wav", [codes, left], callback)
    assert event.wait(120)
    assert all(err is None for _, err in done), [str(e) for _, e in done if e]
    sizes = sorted(res.as_numpy("AUDIO").size for res, _ in done)
    assert sizes == [(5 + 3 * i) * reference.samples_per_frame for i in range(8)]
    stats = httpx.get(f"{stack.triton_http_url}/v2/models/csm_code2wav/stats").json()

    def batch_sizes(s):
        return {int(b["batch_size"]): int(b["compute_infer"]["count"])
                for b in s["model_stats"][0].get("batch_stats", [])}

    before, after = batch_sizes(stats_before), batch_sizes(stats)
    grew = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    assert any(k > 1 for k in grew), f"no multi-request batch executed: {grew}"
    client.close()


def test_grpc_cancel_stops_the_talker(stack):
    """Cancelling the ``csm`` stream after one chunk stops the talker within a few frames (the
    BLS raises the talker's shared cancel flag: omni_triton.runtime.cancel_flags.CancelFlags)."""
    frames_before = stack.metric("omni_tts_talker_frames_total", model="csm_talker")
    cancelled_before = stack.metric("omni_tts_talker_cancelled_total", model="csm_talker")
    result = stream_tts(stack.triton_grpc_url, "csm", "A very long request that should be stopped.",
                        voice="3", max_frames=3000, max_chunks=1)
    assert len(result.chunks) == 1
    stack.wait_until(lambda: stack.metric("omni_tts_talker_cancelled_total", model="csm_talker") > cancelled_before,
                     "talker never saw the cancellation")
    stack.wait_until(lambda: stack.in_progress("csm_talker") == 0,
                     "talker still generating for a gone client")
    generated = stack.metric("omni_tts_talker_frames_total", model="csm_talker") - frames_before
    assert generated < 3000 // 4, f"talker generated {generated} of 3000 frames after cancel"
    time.sleep(0.5)
    assert stack.metric("omni_tts_talker_frames_total", model="csm_talker") - frames_before == generated


def test_bad_codec_requests(stack):
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=60,
                   json={"model": "tts", "voice": "7", "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice"
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=60,
                   json={"model": "tts", "voice": "0", "input": "x" * 2001})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    ok = stream_tts(stack.triton_grpc_url, "csm", "Still serving.", voice="0")
    assert ok.chunks


@pytest.mark.kills_stub("csm_talker")  # csm_talker's stubs go away on purpose: serve may see them gone and reload it
def test_health_is_not_ok_while_a_stage_is_down(stack):
    """Triton keeps the BLS model ``csm`` READY when its talker is unloaded; the frontend's
    /health and /v1/audio/speech still see that the pipeline cannot serve (503), and recover
    once the stage is loaded again."""
    repo = f"{stack.triton_http_url}/v2/repository/models/csm_talker"
    assert httpx.post(f"{repo}/unload", timeout=60, headers=stack.admin_headers).status_code == 200
    try:
        deadline = time.monotonic() + 60
        while httpx.get(f"{stack.triton_http_url}/v2/models/csm_talker/ready").status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        health = httpx.get(f"{stack.frontend_url}/health", timeout=30)
        assert health.status_code == 503
        assert "csm_talker" in health.json()["message"]
        r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=60,
                       json={"model": "tts", "voice": "0", "input": "hello"})
        assert r.status_code == 503 and "csm_talker" in r.json()["error"]["message"]
        ok = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=120,
                        json={"model": "piper_tts", "voice": "joe", "input": "Piper still works."})
        assert ok.status_code == 200
    finally:
        assert httpx.post(f"{repo}/load", timeout=300, headers=stack.admin_headers).status_code == 200
    assert httpx.get(f"{stack.frontend_url}/health", timeout=30).status_code == 200
    assert stream_tts(stack.triton_grpc_url, "csm", "Back again.", voice="0").chunks
