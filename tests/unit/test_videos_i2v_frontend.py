"""``/v1/videos`` image-to-video (``input_reference``), the duration conflict and the reason of
a job whose stage died, against the in-process fake engine of ``test_videos_frontend.py``
serving a text-to-video and an image-to-video model."""
from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("av")

from omni_triton.media.image import fit_image, pixels_from_png_base64
from openai_frontend.engine import InferenceError, ModelInfo, ModelNotFoundError, ModelNotReadyError
from openai_frontend.video_jobs import VideoRequest
from tests.unit.test_videos_frontend import PARAMS, T2V, FakeVideoEngine, Server, assert_error, wait_status

pytestmark = pytest.mark.anyio

I2V = ModelInfo(name="wan_i2v", inputs=T2V.inputs | {"INPUT_IMAGE"}, outputs=T2V.outputs, decoupled=True,
                default_size=(32, 32), parameters={**PARAMS, "task": "image-to-video", "max_input_image_bytes": "20000",
                                                   "max_input_image_pixels": "40000"})


@pytest.fixture
def anyio_backend():
    return "asyncio"


class FakeVideoEngines(FakeVideoEngine):
    """The fake engine serving wan_t2v and wan_i2v."""

    async def list_models(self):
        return [T2V, I2V]

    async def get_model(self, name):
        for m in (T2V, I2V):
            if m.name == name:
                return m
        raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")


def png(width=48, height=32, seed=0, fmt="PNG", flat=False) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    if flat:  # compresses to a few hundred bytes
        pixels[:] = 128
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def ref(data: bytes, name="a.png"):
    return {"input_reference": (name, data, "image/png")}


async def test_input_reference_selects_the_i2v_model_and_is_fitted(tmp_path):
    engine = FakeVideoEngines()
    async with Server(engine, tmp_path) as c:
        data = png(48, 32)
        r = await c.post("/v1/videos", data={"prompt": "a cat", "size": "32x32", "num_frames": "5"}, files=ref(data))
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "wan_i2v" and r.json()["size"] == "32x32"
        body, _ = await wait_status(c, r.json()["id"])
        assert body["status"] == "completed"
        t2v = await c.post("/v1/videos", data={"prompt": "a cat"})  # no image: the T2V model
        assert t2v.json()["model"] == "wan_t2v"
    job = engine.jobs[0]
    got = pixels_from_png_base64(job.input_reference)
    assert got.shape == (32, 32, 3)
    assert np.array_equal(got, fit_image(pixels(data), 32, 32))  # centre crop 48 -> 32 wide, no stretch
    assert np.array_equal(got, pixels(data)[:, 8:40])  # same height: the crop alone
    # a resumed job has its image: it is stored with the job
    rt = VideoRequest.from_json(VideoRequest("wan_i2v", job, 8, 5).to_json())
    assert rt.job.input_reference == job.input_reference


async def test_without_a_size_the_video_takes_the_image_aspect(tmp_path):
    engine = FakeVideoEngines()
    async with Server(engine, tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", "model": "wan_i2v"}, files=ref(png(64, 32)))
        assert r.status_code == 200, r.text
        assert r.json()["size"] == "32x16"  # 2:1 at ~32*32 pixels, multiples of 16


I2V_BAD = [
    (dict(files=ref(b"not an image")), "invalid_input_reference"),
    (dict(files=ref(b"")), "invalid_input_reference"),
    (dict(files=ref(png(48, 32)[:200])), "invalid_input_reference"),  # truncated
    (dict(files=ref(png(96, 96))), "input_reference_too_large"),  # > 20000 bytes (noise PNG)
    (dict(files=ref(png(256, 200, fmt="JPEG", flat=True))), "input_reference_too_large"),  # 51200 px > 40000
    (dict(data={"input_reference": "http://x/a.png"}), "invalid_input_reference"),  # not a file part
    (dict(data={"model": "wan_i2v"}), "missing_input_reference"),
    (dict(data={"model": "wan_t2v"}, files=ref(png())), "unsupported_input_reference"),
]


@pytest.mark.parametrize("kw,code", I2V_BAD, ids=[b[1] + str(i) for i, b in enumerate(I2V_BAD)])
async def test_bad_input_reference_is_an_openai_error(tmp_path, kw, code):
    engine = FakeVideoEngines()
    async with Server(engine, tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", **kw.get("data", {})}, files=kw.get("files"))
        assert_error(r, 400, "input_reference", code)
        if code == "unsupported_input_reference":
            assert "'wan_t2v'" in r.json()["error"]["message"] and "wan_i2v" in r.json()["error"]["message"]
        assert (await c.post("/v1/videos", data={"prompt": "a cat"}, files=ref(png()))).status_code == 200
    assert len(engine.jobs) <= 1


async def test_a_data_url_is_accepted_in_a_form_and_in_json(tmp_path):
    import base64
    import json

    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    engine = FakeVideoEngines()
    async with Server(engine, tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", "input_reference[image_url]": url})
        assert r.status_code == 200 and r.json()["model"] == "wan_i2v", r.text
        r = await c.post("/v1/videos", content=json.dumps({"prompt": "a cat", "input_reference": {"image_url": url}}),
                         headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["model"] == "wan_i2v", r.text
        for bad in ({"image_url": "https://example.com/a.png"}, {"file_id": "file_1"},
                    {"image_url": "data:x;base64,@@"}):
            r = await c.post("/v1/videos", content=json.dumps({"prompt": "a cat", "input_reference": bad}),
                             headers={"content-type": "application/json"})
            assert_error(r, 400, "input_reference", "invalid_input_reference")


async def test_a_jpeg_photo_is_accepted(tmp_path):
    async with Server(FakeVideoEngines(), tmp_path) as c:
        r = await c.post("/v1/videos/sync", data={"prompt": "a cat", "num_frames": "5"},
                         files=ref(png(40, 40, fmt="JPEG"), "a.jpg"))
        assert r.status_code == 200 and r.headers["x-video-frames"] == "5"


@pytest.mark.parametrize("fields,ok", [
    ({"seconds": "2", "fps": "8", "num_frames": "9"}, False),  # 9 frames at 8 fps = 1.125 s
    ({"seconds": "2", "num_frames": "9"}, False),  # at the default 8 fps
    ({"seconds": "1.125", "fps": "8", "num_frames": "9"}, True),
    ({"seconds": "1", "fps": "16", "num_frames": "17"}, False),
    ({"seconds": "1", "fps": "8"}, True),  # 8 frames kept of 9 generated
])
async def test_seconds_fps_and_num_frames_must_agree(tmp_path, fields, ok):
    async with Server(FakeVideoEngines(), tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", **fields})
        if ok:
            assert r.status_code == 200, r.text
        else:
            assert_error(r, 400, "num_frames", "conflicting_duration")
            message = r.json()["error"]["message"]
            assert "conflict" in message and ("fps=8 (the model's default" in message or "fps=16" in message
                                              or "fps=8 conflict" in message)


RAW = ("wan_i2v: Failed to process the request(s) for model 'wan_i2v_denoiser_0_0', message: Stub process "
       "'wan_i2v_denoiser_0_0' is not healthy.")


@pytest.mark.parametrize("fail,stage", [
    (InferenceError(RAW), "wan_i2v_denoiser"),
    (ModelNotReadyError("wan_t2v: its stage wan_t2v_denoiser died while this request was running and is being "
                        "restarted; retry the request"), "wan_t2v_denoiser"),
])
async def test_a_job_whose_stage_died_says_so(tmp_path, fail, stage):
    async with Server(FakeVideoEngine(fail=fail), tmp_path, max_attempts=2) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        body, _ = await wait_status(c, vid, timeout=10)
    assert body["status"] == "failed" and body["error"]["code"] == "stage_died"
    message = body["error"]["message"]
    assert message.startswith(f"stage {stage} died") and "retry" in message and "attempt 2 of 2" in message
    assert "Stub process" not in message
