"""Video jobs end to end: the real ``omni-triton serve`` with ``wan_t2v`` (tiny random Wan2.2, two
experts), the official OpenAI SDK's ``client.videos``, MP4s decoded with PyAV.

- create -> poll -> download: the MP4 has the requested size, frame count and fps; progress
  rises and reaches 100;
- parity through Triton: the ``wan_t2v`` BLS's frames (gRPC, raw uint8) equal
  ``WanPipeline.__call__`` on the same weights and seed, bit for bit;
- 4 concurrent jobs with their own seeds: each MP4 is its own seed's video (the denoiser batches
  them: batched GEMMs change float rounding, so MP4s are compared with a tolerance);
- ``kill -9`` of the frontend mid-job: serve restarts it, the job completes (resumed), no MP4 lost;
- ``DELETE`` mid-job stops the denoiser (its step counter stops);
- bad input -> OpenAI errors (the SDK's exception classes), and the server keeps serving.

Sizes are tiny and steps few; the long jobs (delete, kill) are 128x128 x 33 frames x 50 steps.
"""
from __future__ import annotations

import os
import queue
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import psutil
import pytest

from tests.e2e.conftest import E2E_MODELS

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif("wan_t2v" not in E2E_MODELS.split(","), reason="wan_t2v not served"),
              pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]
openai = pytest.importorskip("openai")
pytest.importorskip("av")

from omni_triton.media.video import decode_video, encode_mp4  # noqa: E402

MODEL = "wan_t2v"
LONG = dict(size="128x128", extra_body={"num_frames": 33, "num_inference_steps": 50, "seed": 11})


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def pipe():
    import torch

    from omni_triton.checkpoints.wan import checkpoint_dir
    from omni_triton.stages.wan import load_pipeline

    torch.set_num_threads(1)
    return load_pipeline(checkpoint_dir("wan2.2-t2v-tiny"))


def poll(client, video_id, timeout_s=300.0, until=("completed", "failed", "expired")):
    """Retrieve until the status is one of ``until``; returns (video, progress seen)."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            video = client.videos.retrieve(video_id)
        except (openai.APIConnectionError, openai.InternalServerError):
            video = None  # the frontend is being restarted
        if video is not None:
            seen.append(video.progress)
            if video.status in until:
                return video, seen
        assert time.monotonic() < deadline, f"{video_id} still {video and video.status}"
        time.sleep(0.1)


def grpc_frames(stack, seed, **kw):
    """Raw frames of one ``wan_t2v`` request over Triton gRPC (decoupled stream)."""
    import tritonclient.grpc as grpcclient

    from omni_triton.contracts import video as vc
    from omni_triton.contracts.tensors import infer_input, wrap_inputs

    out: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    c.start_stream(callback=lambda result, error: out.put((result, error)))
    try:
        inputs = wrap_inputs(vc.video_inputs(seed=seed, **kw), lambda n, a: infer_input(grpcclient.InferInput, n, a))
        c.async_stream_infer(MODEL, inputs, request_id=f"parity-{seed}")
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


def test_parity_through_triton(stack, pipe):
    from omni_triton.stages.wan import reference_frames

    kw = dict(height=32, width=48, num_frames=9, steps=4, negative_prompt="blurry", guidance_scale=4.0,
              guidance_scale_2=3.0)
    frames, steps = grpc_frames(stack, 5, prompt="a red fox runs through the snow", **kw)
    ref = reference_frames(pipe, "a red fox runs through the snow", seed=5, **kw)
    assert steps == [1, 2, 3, 4]  # one progress response per step
    assert frames.shape == ref.shape == (9, 32, 48, 3) and frames.dtype == np.uint8
    assert np.array_equal(frames, ref)


def test_create_poll_download(client):
    video = client.videos.create(model=MODEL, prompt="a cat walks on the grass", seconds="1", size="48x32",
                                 extra_body={"fps": 8, "num_inference_steps": 10, "seed": 3})
    assert video.object == "video" and video.status == "queued" and video.seconds == "1" and video.size == "48x32"
    done, seen = poll(client, video.id)
    assert done.status == "completed" and done.progress == 100 and done.completed_at >= done.created_at
    assert seen == sorted(seen) and seen[-1] == 100
    data = client.videos.download_content(video.id).read()
    decoded = decode_video(data)
    assert decoded.codec == "h264" and decoded.frames.shape == (8, 32, 48, 3)  # 1 s at 8 fps
    assert decoded.fps == 8 and decoded.duration_s == pytest.approx(1.0)
    listed = [v.id for v in client.videos.list(limit=100)]
    assert video.id in listed
    assert client.videos.delete(video.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_sync_returns_the_mp4(stack):
    """... and the denoiser reports the stage telemetry of every stage (its base since issue 24)."""
    finished = stack.metric("omni_stage_requests_finished_total", model="wan_t2v_denoiser", reason="stop")
    batches = stack.metric("omni_stage_batch_size_count", model="wan_t2v_denoiser")
    r = httpx.post(f"{stack.frontend_url}/v1/videos/sync", timeout=120,
                   data={"model": MODEL, "prompt": "waves", "num_frames": "5", "fps": "10", "size": "32x32"})
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    decoded = decode_video(r.content)
    assert decoded.frames.shape == (5, 32, 32, 3) and decoded.fps == 10
    stack.wait_until(lambda: stack.metric("omni_stage_requests_finished_total", model="wan_t2v_denoiser",
                                          reason="stop") == finished + 1, "no finished request on the denoiser", 15)
    assert stack.metric("omni_stage_batch_size_count", model="wan_t2v_denoiser") == batches + 1
    assert stack.in_progress("wan_t2v_denoiser") == 0


def test_four_concurrent_jobs_keep_their_seeds(client, pipe):
    from omni_triton.stages.wan import reference_frames

    kw = dict(size="32x32", extra_body={"num_frames": 9, "fps": 8, "num_inference_steps": 6, "guidance_scale": 4.0})
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda s: client.videos.create(
            model=MODEL, prompt="fireworks over a city", **{**kw, "extra_body": {**kw["extra_body"], "seed": s}}).id,
            range(4)))
    videos = [decode_video(client.videos.download_content(i).read()).frames
              for i in ids if poll(client, i)[0].status == "completed"]
    assert len(videos) == 4
    refs = [decode_video(encode_mp4(reference_frames(pipe, "fireworks over a city", height=32, width=32, num_frames=9,
                                                     steps=6, seed=s, guidance_scale=4.0), 8)).frames
            for s in range(4)]
    for i, v in enumerate(videos):
        diffs = [np.abs(v.astype(int) - r).mean() for r in refs]
        # own seed: equal up to batched rounding (+-1 level) through H.264; other seeds: far apart
        assert diffs[i] < 2.0 and min(d for j, d in enumerate(diffs) if j != i) > 10 * max(diffs[i], 0.5), diffs


def _steps(stack):
    return stack.metric("omni_video_denoise_steps_total", model="wan_t2v_denoiser")


def test_delete_mid_job_stops_the_denoiser(client, stack):
    cancelled = stack.metric("omni_video_denoise_cancelled_total", model="wan_t2v_denoiser")
    video = client.videos.create(model=MODEL, prompt="a dog catches a frisbee", **LONG)
    poll(client, video.id, until=("in_progress",))
    before = _steps(stack)
    stack.wait_until(lambda: _steps(stack) >= before + 3, "the denoiser never started", 120)
    client.videos.delete(video.id)
    stack.wait_until(lambda: stack.metric("omni_video_denoise_cancelled_total", model="wan_t2v_denoiser") > cancelled,
                     "the denoiser never saw the cancel", 30)
    stopped = _steps(stack)
    time.sleep(2.0)  # a 50-step job would still be running: the counter must stand still
    assert _steps(stack) == stopped and stopped - before < 50
    assert stack.metric("omni_stage_requests_finished_total", model="wan_t2v_denoiser", reason="abort") >= 1
    assert stack.in_progress("wan_t2v_denoiser") == 0
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def _frontend(stack):
    for p in psutil.Process(stack.serve_pid).children(recursive=True):
        try:
            if "openai_frontend" in " ".join(p.cmdline()):
                return p
        except psutil.NoSuchProcess:
            pass
    return None


def test_kill_9_of_the_frontend_mid_job_loses_nothing(client, stack):
    video = client.videos.create(model=MODEL, prompt="clouds over green hills", **LONG)
    first, _ = poll(client, video.id, until=("in_progress",))
    stack.wait_until(lambda: client.videos.retrieve(video.id).progress > 0, "no progress", 120)
    old = _frontend(stack)
    os.kill(old.pid, signal.SIGKILL)
    # serve starts a new frontend; the job is resumed from the store and completes
    stack.wait_until(lambda: (_frontend(stack) or old).pid != old.pid, "the frontend was not restarted", 60)
    done, seen = poll(client, video.id)
    assert done.status == "completed", done.error
    assert done.id == video.id and done.created_at == first.created_at and done.progress == 100
    decoded = decode_video(client.videos.download_content(video.id).read())
    assert decoded.frames.shape == (33, 128, 128, 3)
    assert seen == sorted(seen)  # progress never went back, across the restart
    assert video.id in [v.id for v in client.videos.list(limit=100)]


def test_bad_input(client, stack):
    cases = [dict(size="40x32"), dict(extra_body={"num_frames": 8}), dict(extra_body={"num_frames": 1000}),
             dict(extra_body={"num_inference_steps": 500}), dict(seconds="-1"), dict(model="no_such_model"),
             dict(extra_body={"guidance_scale": "nan"})]
    for case in cases:
        kwargs = {"model": MODEL, "prompt": "a cat", **case}
        with pytest.raises((openai.BadRequestError, openai.NotFoundError, openai.UnprocessableEntityError)) as err:
            client.videos.create(**kwargs)
        assert err.value.status_code in (400, 404), case
        assert err.value.body and err.value.body.get("message"), case
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("video_does_not_exist")
    with pytest.raises(openai.NotFoundError):
        client.videos.download_content("video_does_not_exist")
    r = httpx.post(f"{stack.frontend_url}/v1/videos", data={"model": MODEL, "prompt": "x"},
                   files={"input_reference": ("a.png", b"not a png", "image/png")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_reference"
    video = client.videos.create(model=MODEL, prompt="still serving", **LONG)
    with pytest.raises(openai.ConflictError):  # not finished yet
        client.videos.download_content(video.id)
    client.videos.delete(video.id)
