"""Text-to-audio end to end: the real ``omni-triton serve`` with ``stable_audio`` (tiny random Stable
Audio Open: T5 -> StableAudioDiTModel -> Oobleck), ``POST /v1/audio/generate`` over HTTP (httpx),
clips decoded with soundfile / PyAV.

- parity through Triton: the ``stable_audio`` BLS's float waveform (gRPC) equals
  ``StableAudioPipeline.__call__`` on the same weights and seed, bit for bit;
- HTTP WAV and FLAC: the decoded samples equal the reference's PCM16 quantisation exactly; MP3
  decodes with PyAV to the requested length;
- 4 concurrent requests with their own seeds (the denoiser batches them): each clip is its own
  seed's, within one PCM16 level;
- SSE progress (one event per step) and a client that leaves mid-way stops the denoiser;
- bad input -> 400 in the OpenAI error shape, the server keeps serving.
"""
from __future__ import annotations

import io
import json
import queue
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import E2E_MODELS

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif("stable_audio" not in E2E_MODELS.split(","), reason="stable_audio not served")]
sf = pytest.importorskip("soundfile")

MODEL = "stable_audio"
PROMPT = "ocean waves crash on a rocky shore"
ROUTE = "/v1/audio/generate"


@pytest.fixture(scope="module")
def pipe():
    import torch

    from omni_triton.checkpoints.stable_audio import NAME, checkpoint_dir
    from omni_triton.stages.stable_audio import load_pipeline

    torch.set_num_threads(1)
    return load_pipeline(checkpoint_dir(NAME))


def reference(pipe, **kw):
    from omni_triton.stages.stable_audio import reference_audio

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Should have", category=UserWarning)  # torchsde's ulp warning
        return reference_audio(pipe, PROMPT, **kw)


def pcm16(audio):
    from omni_triton.media.audio import float_to_pcm16

    return np.frombuffer(float_to_pcm16(audio.T), "<i2").reshape(-1, audio.shape[0])


def grpc_audio(stack, **kw):
    """The float waveform and progress steps of one ``stable_audio`` request over Triton gRPC."""
    import tritonclient.grpc as grpcclient

    from omni_triton.contracts import stable_audio as ac
    from omni_triton.contracts.tensors import infer_input, wrap_inputs

    out: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    c.start_stream(callback=lambda result, error: out.put((result, error)))
    try:
        inputs = wrap_inputs(ac.audio_generate_inputs(PROMPT, **kw), lambda n, a: infer_input(grpcclient.InferInput,
                                                                                               n, a))
        c.async_stream_infer(MODEL, inputs, request_id="parity")
        steps = []
        while True:
            result, error = out.get(timeout=120)
            assert error is None, error
            audio = result.as_numpy(ac.AUDIO)
            if audio is not None:
                return audio, int(result.as_numpy(ac.SAMPLE_RATE)[0]), steps
            steps.append(int(result.as_numpy(ac.STEP)[0]))
    finally:
        c.stop_stream()
        c.close()


def test_parity_through_triton(stack, pipe):
    kw = dict(audio_start_s=0.25, audio_end_s=2.5, steps=5, seed=9, guidance_scale=6.0, negative_prompt="hiss")
    audio, rate, steps = grpc_audio(stack, **kw)
    ref = reference(pipe, **kw)
    assert steps == [1, 2, 3, 4, 5] and rate == 16000
    assert audio.dtype == np.float32 and audio.shape == ref.shape == (2, 40000 - 4000)
    assert np.array_equal(audio, ref)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_http_clip_round_trips_exactly(stack, pipe, fmt):
    body = dict(input=PROMPT, audio_length=1.5, seed=4, num_inference_steps=4, guidance_scale=7.0,
                negative_prompt="low quality", response_format=fmt)
    r = httpx.post(stack.frontend_url + ROUTE, json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == f"audio/{fmt}" and r.headers["x-channels"] == "2"
    got, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    ref = reference(pipe, audio_end_s=1.5, steps=4, seed=4, guidance_scale=7.0, negative_prompt="low quality")
    assert sr == 16000 and got.shape == (24000, 2)
    assert np.array_equal(got, pcm16(ref))


def test_http_mp3_decodes_with_pyav(stack):
    av = pytest.importorskip("av")
    from omni_triton.media.audio import SUPPORTED_FORMATS

    if "mp3" not in SUPPORTED_FORMATS:
        pytest.skip("libsndfile without MP3")
    r = httpx.post(stack.frontend_url + ROUTE, json=dict(input=PROMPT, audio_end_in_s=1.0, seed=1,
                                                         num_inference_steps=3, response_format="mp3"), timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    with av.open(io.BytesIO(r.content)) as container:
        stream = container.streams.audio[0]
        assert stream.rate == 16000 and stream.channels == 2
        samples = sum(frame.samples for frame in container.decode(stream))
    assert abs(samples - 16000) < 2000  # MP3 frame padding


def test_concurrent_requests_are_their_own_seeds(stack, pipe):
    seeds = [21, 22, 23, 24]

    def one(seed):
        r = httpx.post(stack.frontend_url + ROUTE, json=dict(input=PROMPT, audio_length=1.0, seed=seed,
                                                             num_inference_steps=4), timeout=180)
        assert r.status_code == 200, r.text
        return sf.read(io.BytesIO(r.content), dtype="int16")[0]

    batches = stack.metric("omni_stage_batch_size_sum", model="stable_audio_denoiser")
    with ThreadPoolExecutor(4) as pool:
        clips = list(pool.map(one, seeds))
    for seed, clip in zip(seeds, clips, strict=True):
        ref = pcm16(reference(pipe, audio_end_s=1.0, steps=4, seed=seed, guidance_scale=7.0))
        assert clip.shape == ref.shape
        assert np.abs(clip.astype(np.int32) - ref).max() <= 1  # batched GEMM rounding: <= 1 PCM16 level
    assert stack.metric("omni_stage_batch_size_sum", model="stable_audio_denoiser") == batches + 4


def test_sse_progress_and_done(stack):
    with httpx.stream("POST", stack.frontend_url + ROUTE, json=dict(input=PROMPT, audio_length=0.5, seed=2,
                                                                      num_inference_steps=6, stream=True),
                      timeout=120) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["step"] for e in events if e["type"] == "audio.generate.progress"] == [1, 2, 3, 4, 5, 6]
    assert events[-1]["type"] == "audio.generate.done" and events[-1]["audio_seconds"] == 0.5


def test_leaving_mid_way_stops_the_denoiser(stack):
    def steps_run():
        return stack.metric("omni_audio_generate_denoise_steps_total", model="stable_audio_denoiser")

    cancelled = stack.metric("omni_audio_generate_denoise_cancelled_total", model="stable_audio_denoiser")
    before = steps_run()
    with httpx.stream("POST", stack.frontend_url + ROUTE, json=dict(input=PROMPT, audio_length=4.0, seed=2,
                                                                      num_inference_steps=200, stream=True),
                      timeout=120) as r:
        for line in r.iter_lines():
            if '"step":3' in line:
                break  # leave: the connection closes
    stack.wait_until(lambda: stack.metric("omni_audio_generate_denoise_cancelled_total",
                                          model="stable_audio_denoiser") > cancelled, "denoiser never saw the cancel")
    time.sleep(1.0)
    ran = steps_run() - before
    time.sleep(1.0)
    assert steps_run() - before == ran < 200  # stopped at a step boundary, far from the end
    ok = httpx.post(stack.frontend_url + ROUTE, json=dict(input=PROMPT, audio_length=0.5, num_inference_steps=2),
                    timeout=60)
    assert ok.status_code == 200


@pytest.mark.parametrize("body, param", [
    (dict(input=PROMPT, audio_length=60.0), "audio_length"),
    (dict(input=PROMPT, num_inference_steps=500), "num_inference_steps"),
    (dict(input=""), "input"),
    (dict(input="dog " * 100, audio_length=1.0), None),  # more tokens than T5's tokenizer keeps (text encoder)
    (dict(input=PROMPT, negative_prompt="hiss " * 100, audio_length=1.0), None),
])
def test_bad_input_is_a_400_and_the_server_keeps_serving(stack, body, param):
    r = httpx.post(stack.frontend_url + ROUTE, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param
    else:
        assert "tokens" in err["message"]
    ok = httpx.post(stack.frontend_url + ROUTE, json=dict(input=PROMPT, audio_length=0.5, num_inference_steps=2),
                    timeout=60)
    assert ok.status_code == 200


# --------------------------------------------------------------------------- vLLM-Omni's chat form
@pytest.mark.parametrize("where", ["extra_body", "extra_args"])
def test_chat_form_through_the_openai_sdk(stack, pipe, where):
    """``client.chat.completions.create(model="stable_audio", ..., extra_body={...})``: the clip in
    ``choices[0].message.audio.data`` (WAV by default) equals the ``/v1/audio/generate`` clip for
    the same fields and the diffusers reference's PCM16, and lasts ``audio_end_in_s - audio_start_in_s``."""
    import base64

    from openai import OpenAI

    client = OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)
    fields = dict(audio_start_in_s=0.25, audio_end_in_s=1.75, seed=5, num_inference_steps=4, guidance_scale=6.0,
                  negative_prompt="hiss")
    extra = fields if where == "extra_body" else {"extra_args": fields}
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], extra_body=extra)
    wav = base64.b64decode(out.choices[0].message.audio.data)
    assert sf.info(io.BytesIO(wav)).format == "WAV"
    got, sr = sf.read(io.BytesIO(wav), dtype="int16")
    assert sr == 16000 and got.shape == (int(1.75 * sr) - int(0.25 * sr), 2)  # the duration follows the seconds
    r = httpx.post(stack.frontend_url + ROUTE, json=dict(input=PROMPT, **fields), timeout=120)
    assert r.status_code == 200
    assert np.array_equal(got, sf.read(io.BytesIO(r.content), dtype="int16")[0])
    ref = reference(pipe, audio_start_s=0.25, audio_end_s=1.75, steps=4, seed=5, guidance_scale=6.0,
                    negative_prompt="hiss")
    assert np.array_equal(got, pcm16(ref))


def test_chat_form_bad_input_is_a_400(stack):
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)
    for extra, param in (({"audio_end_in_s": 99.0}, "audio_end_in_s"), ({"num_inference_steps": 1000},
                                                                        "num_inference_steps")):
        with pytest.raises(BadRequestError) as exc:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body=extra)
        assert exc.value.body["param"] == param
    with pytest.raises(BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True)
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                        extra_body={"audio_end_in_s": 0.5, "num_inference_steps": 2})
    assert ok.choices[0].message.audio.data
