"""Image-to-video end to end: the real ``omni-triton serve`` with ``wan_i2v`` (tiny random
Wan2.2 I2V, two experts, the T2V text encoder and VAE decoder reused), the official OpenAI SDK's
``client.videos.create(input_reference=...)``, MP4s decoded with PyAV.

- create -> poll -> download with an uploaded image: the MP4 has the requested size, frame count
  and fps;
- parity through Triton: the ``wan_i2v`` BLS's frames (gRPC, raw uint8) equal
  ``WanImageToVideoPipeline.__call__(image=...)`` on the same weights, image and seed, bit for bit,
  and another image with the same seed gives other frames (the condition is used);
- no first-frame check, on purpose: the first frame need not look like the image. With
  ``expand_timesteps`` false (Wan2.2 A14B I2V, this checkpoint) diffusers' pipeline only
  concatenates the VAE-encoded image and a first-frame mask to the denoiser's input channels
  (``torch.cat([latents, condition], dim=1)``); replacing the first latent frame with the image's
  is the ``expand_timesteps`` (TI2V-5B) path. Measured on ``wan2.2-i2v-tiny`` (the parity case):
  frame 0 is 48.8 grey levels (mean abs) from the image, and the other image moves frame 0 by
  0.05 levels, far below H.264's error, so only the raw-frame parity above can see the condition;
- ``DELETE`` mid-job stops ``wan_i2v_denoiser`` (the T2V denoiser's cancel, reused: its step
  counter stops);
- bad input: a corrupt, an oversized and a non-file ``input_reference``, the I2V model without an
  image, the T2V model with one, ``seconds`` + ``fps`` + ``num_frames`` that disagree -> 400s
  (the SDK's ``BadRequestError``), and the server keeps serving.

Tiny sizes (32x48, 5-9 frames, 2-4 steps): the file adds well under a minute to the session.
"""
from __future__ import annotations

import io
import queue

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import E2E_MODELS

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif("wan_i2v" not in E2E_MODELS.split(","), reason="wan_i2v not served"),
              pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]
openai = pytest.importorskip("openai")
pytest.importorskip("av")

from omni_triton.media.video import decode_video  # noqa: E402

MODEL = "wan_i2v"


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def pipe():
    import torch

    from omni_triton.checkpoints.wan import checkpoint_dir
    from omni_triton.stages.wan import load_pipeline

    torch.set_num_threads(1)
    return load_pipeline(checkpoint_dir("wan2.2-i2v-tiny"))


def image(width=48, height=32, seed=0) -> np.ndarray:
    """A smooth colour gradient plus noise (a recognisable first frame)."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([255 * x / width, 255 * y / height, np.full_like(x, 128.0)], axis=-1)
    noise = np.random.default_rng(seed).normal(0, 20, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def poll(client, video_id, timeout_s=300.0):
    import time

    deadline = time.monotonic() + timeout_s
    seen = []
    while True:
        video = client.videos.retrieve(video_id)
        seen.append(video.progress)
        if video.status in ("completed", "failed", "expired"):
            return video, seen
        assert time.monotonic() < deadline, f"{video_id} still {video.status}"
        time.sleep(0.1)


def grpc_frames(stack, seed, image_array, **kw):
    """Raw frames of one ``wan_i2v`` request over Triton gRPC (decoupled stream)."""
    import tritonclient.grpc as grpcclient

    from omni_triton.contracts import video as vc
    from omni_triton.contracts.tensors import infer_input, wrap_inputs

    out: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    c.start_stream(callback=lambda result, error: out.put((result, error)))
    try:
        inputs = wrap_inputs(vc.video_inputs(seed=seed, image=image_array, **kw),
                             lambda n, a: infer_input(grpcclient.InferInput, n, a))
        c.async_stream_infer(MODEL, inputs, request_id=f"i2v-parity-{seed}")
        steps = []
        while True:
            result, error = out.get(timeout=120)
            assert error is None, error
            frames = result.as_numpy(vc.VIDEO)
            if frames is not None:
                return frames, steps
            steps.append(int(result.as_numpy(vc.STEP)[0]))
    finally:
        c.stop_stream()
        c.close()


def test_i2v_parity_through_triton(stack, pipe):
    from PIL import Image

    from omni_triton.stages.wan import reference_i2v_frames

    kw = dict(height=32, width=48, num_frames=9, steps=4, negative_prompt="blurry", guidance_scale=4.0,
              guidance_scale_2=3.0)
    first = image(48, 32, seed=1)
    frames, steps = grpc_frames(stack, 5, first, prompt="a red fox runs through the snow", **kw)
    ref = reference_i2v_frames(pipe, Image.fromarray(first), "a red fox runs through the snow", seed=5, **kw)
    assert steps == [1, 2, 3, 4]  # one progress response per step
    assert frames.shape == ref.shape == (9, 32, 48, 3) and frames.dtype == np.uint8
    assert np.array_equal(frames, ref)
    # the condition matters: another image, same seed, is another video
    other, _ = grpc_frames(stack, 5, image(48, 32, seed=2)[::-1].copy(), prompt="a red fox runs through the snow", **kw)
    assert not np.array_equal(other, frames)


def test_sdk_create_poll_download_with_an_image(client):
    upload = image(64, 32, seed=3)  # 2:1, fitted (centre crop, no stretch) to 48x32
    video = client.videos.create(model=MODEL, prompt="a cat walks on the grass", seconds="1", size="48x32",
                                 input_reference=("cat.png", png(upload), "image/png"),
                                 extra_body={"fps": 8, "num_inference_steps": 3, "seed": 4})
    assert video.object == "video" and video.model == MODEL and video.size == "48x32" and video.seconds == "1"
    done, seen = poll(client, video.id)
    assert done.status == "completed", done.error
    assert done.progress == 100 and seen == sorted(seen)
    decoded = decode_video(client.videos.download_content(video.id).read())
    assert decoded.codec == "h264" and decoded.frames.shape == (8, 32, 48, 3)  # 1 s at 8 fps
    assert decoded.fps == 8 and decoded.duration_s == pytest.approx(1.0)
    client.videos.delete(video.id)


def test_input_reference_alone_picks_the_i2v_model(stack):
    r = httpx.post(f"{stack.frontend_url}/v1/videos/sync", timeout=120,
                   data={"prompt": "waves", "num_frames": "5", "fps": "10", "size": "32x32",
                         "num_inference_steps": "2"},
                   files={"input_reference": ("a.png", png(image(32, 32)), "image/png")})
    assert r.status_code == 200, r.text
    decoded = decode_video(r.content)
    assert decoded.frames.shape == (5, 32, 32, 3) and decoded.fps == 10


def _steps(stack):
    return stack.metric("omni_video_denoise_steps_total", model="wan_i2v_denoiser")


def test_delete_mid_job_stops_the_i2v_denoiser(client, stack):
    import time

    cancelled = stack.metric("omni_video_denoise_cancelled_total", model="wan_i2v_denoiser")
    video = client.videos.create(model=MODEL, prompt="a dog catches a frisbee", size="128x128",
                                 input_reference=("dog.png", png(image(128, 128)), "image/png"),
                                 extra_body={"num_frames": 33, "num_inference_steps": 50, "seed": 11})
    before = _steps(stack)
    stack.wait_until(lambda: _steps(stack) >= before + 3, "the I2V denoiser never started", 120)
    client.videos.delete(video.id)
    stack.wait_until(lambda: stack.metric("omni_video_denoise_cancelled_total", model="wan_i2v_denoiser") > cancelled,
                     "the I2V denoiser never saw the cancel", 30)
    stopped = _steps(stack)
    time.sleep(2.0)  # a 50-step job would still be running: the counter must stand still
    assert _steps(stack) == stopped and stopped - before < 50
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_bad_input(client, stack):
    ok = ("a.png", png(image(32, 32)), "image/png")
    cases = [
        (dict(input_reference=("a.png", b"not a png", "image/png")), "invalid_input_reference"),
        (dict(input_reference=("a.png", png(image(48, 32))[:100], "image/png")), "invalid_input_reference"),
        (dict(input_reference=("big.png", b"\x89PNG" + bytes(11 << 20), "image/png")), "input_reference_too_large"),
        (dict(), "missing_input_reference"),
        (dict(input_reference=ok, extra_body={"num_frames": 9, "fps": 8}, seconds="4"), "conflicting_duration"),
    ]
    if "wan_t2v" in E2E_MODELS.split(","):
        cases.append((dict(model="wan_t2v", input_reference=ok), "unsupported_input_reference"))
    for case, code in cases:
        kwargs = {"model": MODEL, "prompt": "a cat", **case}
        with pytest.raises(openai.BadRequestError) as err:
            client.videos.create(**kwargs)
        assert err.value.body["code"] == code, (code, err.value.body)
        if code == "unsupported_input_reference":
            assert "'wan_t2v'" in err.value.body["message"]
    r = httpx.post(f"{stack.frontend_url}/v1/videos", data={"model": MODEL, "prompt": "x", "input_reference": "a.png"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input_reference"
    video = client.videos.create(model=MODEL, prompt="still serving", input_reference=ok,
                                 extra_body={"num_frames": 5, "num_inference_steps": 2})
    assert poll(client, video.id)[0].status == "completed"
    client.videos.delete(video.id)
