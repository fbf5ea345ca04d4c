"""``/v1/images/generations`` and ``/v1/images/edits`` against an in-process fake engine.

The fake implements the ``Engine`` protocol's ``generate_images`` (pixels derived from the seed,
so tests can tell images apart); the router, schemas, multipart parsing, encoding and errors
are the real ones. End-to-end tests drive the real engine against tritonserver.
"""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import pytest
from engine_stub import EngineStub
from PIL import Image

from omni_triton.media.image import decode_image, encode_image, normalise_format
from openai_frontend.engine import (
    Engine,
    GeneratedImage,
    InvalidRequestError,
    ModelInfo,
    ModelNotFoundError,
    StageStatistics,
    model_info_from_config,
)
from tests.helpers.frontend import frontend_client

#: per image, what the fake's stages report to the statistics API: (queue ms, compute ms)
FAKE_STAGE_MS = {"qwen_image_text_encoder": (1.0, 10.0), "qwen_image_denoiser": (2.0, 40.0),
                 "qwen_image_vae_decoder": (0.5, 5.0)}


def count_stage(stats: dict, name: str, n: int, queue_ms: float, compute_ms: float) -> None:
    """Add ``n`` requests of ``queue_ms`` / ``compute_ms`` to the fake statistics of ``name``."""
    old = stats.get(name, StageStatistics())
    stats[name] = StageStatistics(success=old.success + n, executions=old.executions + 1,
                                  queue_ns=old.queue_ns + int(n * queue_ms * 1e6),
                                  compute_ns=old.compute_ns + int(n * compute_ms * 1e6))

pytestmark = pytest.mark.anyio

ENSEMBLE_INPUTS = frozenset({"PROMPT", "NEGATIVE_PROMPT", "HEIGHT", "WIDTH", "NUM_INFERENCE_STEPS",
                             "TRUE_CFG_SCALE", "GUIDANCE_SCALE", "SEED"})
T2I = ModelInfo(name="qwen_image", inputs=ENSEMBLE_INPUTS,
                outputs=frozenset({"IMAGE", "NUM_STEPS", "DENOISE_SECONDS"}), task="text-to-image",
                default_size=(64, 64), size_multiple=16, max_size=256, default_steps=2, max_steps=8,
                default_true_cfg_scale=4.0, max_images=4,
                ensemble_steps=("qwen_image_text_encoder", "qwen_image_denoiser", "qwen_image_vae_decoder"))
EDIT = ModelInfo(name="qwen_image_edit", inputs=ENSEMBLE_INPUTS | {"INPUT_IMAGE"},
                 outputs=T2I.outputs, task="image-edit", default_size=(64, 64), size_multiple=16,
                 max_size=256, default_steps=2, max_steps=8, max_images=2, max_input_images=1)
SPEECH = ModelInfo(name="piper_tts", inputs=frozenset({"TEXT"}), outputs=frozenset({"AUDIO"}))


def pixels_for(seed: int, w: int, h: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


class FakeImageEngine(EngineStub):
    def __init__(self, models=(T2I, EDIT, SPEECH)):
        self.models = {m.name: m for m in models}
        self.jobs = []
        self.inflight = 0
        self.max_inflight = 0
        self.reject: str | None = None
        self.stats: dict[str, StageStatistics] = {}

    async def stage_statistics(self, models):
        return {m: self.stats[m] for m in models if m in self.stats}

    async def is_live(self):
        return True

    async def list_models(self):
        return list(self.models.values())

    async def get_model(self, name):
        if name not in self.models:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        return self.models[name]

    async def synthesize(self, model, text, voice=None, speed=None, paced=False):  # pragma: no cover
        raise NotImplementedError
        yield

    async def generate_images(self, model, job):
        self.jobs.append((model, job))
        if self.reject:
            raise InvalidRequestError(self.reject)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        await asyncio.sleep(0.01)
        self.inflight -= 1
        for name in self.models[model].ensemble_steps:
            count_stage(self.stats, name, job.n, *FAKE_STAGE_MS[name])
        # each step's own compute per image (STAGE_COMPUTE_MS), growing with the steps asked for
        compute = {name: FAKE_STAGE_MS[name][1] * job.steps for name in self.models[model].ensemble_steps
                   if name in FAKE_STAGE_MS}
        return [GeneratedImage(pixels_for(job.seed + i, job.width, job.height), job.seed + i,
                               job.steps, 0.5, stage_compute_ms=compute, wall_s=0.01) for i in range(job.n)]

    async def generate(self, model, request):  # pragma: no cover - image-only fake
        raise NotImplementedError
        yield

    async def close(self):
        pass


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return FakeImageEngine()


client = frontend_client


def png_bytes(w=40, h=30, color=(200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, "PNG")
    return buf.getvalue()


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err


def test_fake_engine_implements_protocol(engine):
    assert isinstance(engine, Engine)


# ------------------------------------------------------------------ generations
async def test_generation_response_shape(engine):
    async with client(engine) as c:
        r = await c.post("/v1/images/generations", json={
            "model": "qwen_image", "prompt": "a red fox", "n": 3, "size": "48x32", "seed": 10,
            "negative_prompt": "blurry", "num_inference_steps": 4, "true_cfg_scale": 3.0,
            "guidance_scale": 1.5, "response_format": "b64_json"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"created", "data", "output_format", "size", "usage"}
    assert body["size"] == "48x32" and body["output_format"] == "png"
    assert [d["seed"] for d in body["data"]] == [10, 11, 12]
    for i, d in enumerate(body["data"]):
        assert d["revised_prompt"] == "a red fox"
        img = Image.open(io.BytesIO(base64.b64decode(d["b64_json"])))
        assert img.format == "PNG" and img.size == (48, 32)
        np.testing.assert_array_equal(np.asarray(img), pixels_for(10 + i, 48, 32))
    assert body["usage"] == {"input_tokens": 9, "output_tokens": 0, "total_tokens": 9,
                             "num_inference_steps": 4, "denoise_seconds": 0.5}
    assert r.headers["x-denoise-steps"] == "4" and float(r.headers["x-denoise-seconds"]) == 0.5
    model, job = engine.jobs[0]
    assert model == "qwen_image" and job.n == 3 and (job.width, job.height) == (48, 32)
    assert job.negative_prompt == "blurry" and job.true_cfg_scale == 3.0 and job.guidance_scale == 1.5
    assert job.steps == 4 and job.image is None


async def test_generation_defaults(engine):
    async with client(engine) as c:
        r = await c.post("/v1/images/generations", json={"prompt": "a cat"})  # one t2i model: no model needed
    assert r.status_code == 200, r.text
    _, job = engine.jobs[0]
    assert (job.width, job.height, job.steps, job.n) == (64, 64, 2, 1)
    assert job.negative_prompt is None and job.true_cfg_scale == 4.0 and job.guidance_scale is None
    assert 0 <= job.seed < 2**31


@pytest.mark.parametrize("fmt,pil,compression", [("jpeg", "JPEG", 30), ("webp", "WEBP", None), ("png", "PNG", 50)])
async def test_generation_output_formats(engine, fmt, pil, compression):
    payload = {"model": "qwen_image", "prompt": "x", "output_format": fmt}
    if compression is not None:
        payload["output_compression"] = compression
    async with client(engine) as c:
        r = await c.post("/v1/images/generations", json=payload)
    assert r.status_code == 200, r.text
    assert Image.open(io.BytesIO(base64.b64decode(r.json()["data"][0]["b64_json"]))).format == pil


@pytest.mark.parametrize("payload,status,param,code", [
    ({"model": "qwen_image", "prompt": ""}, 400, "prompt", "empty_prompt"),
    ({"model": "qwen_image", "prompt": "   "}, 400, "prompt", "empty_prompt"),
    ({"model": "qwen_image"}, 400, "prompt", "invalid_value"),
    ({"model": "qwen_image", "prompt": "x", "n": 0}, 400, "n", "invalid_n"),
    ({"model": "qwen_image", "prompt": "x", "n": 5}, 400, "n", "invalid_n"),
    ({"model": "qwen_image", "prompt": "x", "n": "two"}, 400, "n", "invalid_value"),
    ({"model": "qwen_image", "prompt": "x", "size": "60x64"}, 400, "size", "invalid_size"),
    ({"model": "qwen_image", "prompt": "x", "size": "512x512"}, 400, "size", "invalid_size"),
    ({"model": "qwen_image", "prompt": "x", "size": "big"}, 400, "size", "invalid_size"),
    ({"model": "qwen_image", "prompt": "x", "response_format": "url"}, 400, "response_format", "unsupported_format"),
    ({"model": "qwen_image", "prompt": "x", "output_format": "gif"}, 400, "output_format", "unsupported_format"),
    ({"model": "qwen_image", "prompt": "x", "output_compression": 101}, 400, "output_compression", None),
    ({"model": "qwen_image", "prompt": "x", "num_inference_steps": 9}, 400, "num_inference_steps", None),
    ({"model": "qwen_image", "prompt": "x", "num_inference_steps": 0}, 400, "num_inference_steps", None),
    ({"model": "qwen_image", "prompt": "x", "seed": -1}, 400, "seed", None),
    ({"model": "qwen_image", "prompt": "x", "stream": True}, 400, "stream", None),
    ({"model": "nope", "prompt": "x"}, 404, "model", "model_not_found"),
    ({"model": "piper_tts", "prompt": "x"}, 400, "model", "model_not_supported"),
    ({"model": "qwen_image_edit", "prompt": "x"}, 400, "model", "model_not_supported"),
])
async def test_generation_bad_input(engine, payload, status, param, code):
    async with client(engine) as c:
        r = await c.post("/v1/images/generations", json=payload)
        assert_error(r, status, param, code)
        ok = await c.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "still serving"})
    assert ok.status_code == 200
    assert len(engine.jobs) == 1  # nothing invalid reached the engine


async def test_model_rejection_is_400(engine):
    engine.reject = "qwen_image: height=60: must be a multiple of 16"
    async with client(engine) as c:
        r = await c.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "x"})
    assert_error(r, 400, code="invalid_value")


async def test_concurrent_requests_are_not_serialised(engine):
    async with client(engine) as c:
        rs = await asyncio.gather(*[c.post("/v1/images/generations", json={
            "model": "qwen_image", "prompt": "x", "seed": s}) for s in range(8)])
    assert [r.status_code for r in rs] == [200] * 8
    assert [r.json()["data"][0]["seed"] for r in rs] == list(range(8))
    assert engine.max_inflight > 1


async def test_admission_429(engine):
    async with client(engine, max_inflight=1) as c:
        rs = await asyncio.gather(*[c.post("/v1/images/generations", json={"prompt": "x"}) for _ in range(3)])
    codes = sorted(r.status_code for r in rs)
    assert codes[0] == 200 and 429 in codes
    assert [r for r in rs if r.status_code == 429][0].headers["retry-after"]


# ------------------------------------------------------------------ edits
async def test_edit_multipart(engine):
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files={"image": ("in.png", png_bytes(), "image/png")},
                         data={"prompt": "make it blue", "n": "2", "size": "32x48", "seed": "5",
                               "output_format": "jpeg", "output_compression": "20"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output_format"] == "jpeg" and len(body["data"]) == 2
    img = Image.open(io.BytesIO(base64.b64decode(body["data"][0]["b64_json"])))
    assert img.format == "JPEG" and img.size == (32, 48)
    model, job = engine.jobs[0]
    assert model == "qwen_image_edit" and job.n == 2 and job.seed == 5
    assert job.image.shape == (30, 40, 3) and tuple(job.image[0, 0]) == (200, 10, 10)


async def test_edit_sdk_list_field_name(engine):
    async with client(engine) as c:  # the OpenAI SDK names a list of images "image[]"
        r = await c.post("/v1/images/edits", files=[("image[]", ("a.png", png_bytes(), "image/png"))],
                         data={"prompt": "x", "model": "qwen_image_edit"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("files,data,param,code", [
    ({"image": ("a.png", b"not an image", "image/png")}, {"prompt": "x"}, "image", "invalid_image"),
    ({"image": ("a.png", png_bytes()[:40], "image/png")}, {"prompt": "x"}, "image", "invalid_image"),
    ({"image": ("a.png", b"", "image/png")}, {"prompt": "x"}, "image", "invalid_image"),
    ({"image": ("a.png", png_bytes(), "image/png"), "mask": ("m.png", png_bytes(), "image/png")},
     {"prompt": "x"}, "mask", "unsupported_mask"),
    ([("image", ("a.png", png_bytes(), "image/png")), ("image", ("b.png", png_bytes(), "image/png"))],
     {"prompt": "x"}, "image", "too_many_images"),
    ({"image": ("a.png", png_bytes(), "image/png")}, {"prompt": ""}, "prompt", "empty_prompt"),
    ({"image": ("a.png", png_bytes(), "image/png")}, {}, "prompt", None),
    ([("prompt", (None, "x"))], {}, "image", None),  # multipart without any file
    ({"image": ("a.png", png_bytes(), "image/png")}, {"prompt": "x", "n": "0"}, "n", "invalid_n"),
    ({"image": ("a.png", png_bytes(), "image/png")}, {"prompt": "x", "size": "33x32"}, "size", "invalid_size"),
    ({"image": ("a.png", png_bytes(), "image/png")}, {"prompt": "x", "output_format": "bmp"}, "output_format", None),
    ({"image": ("a.png", png_bytes(), "image/png")}, {"prompt": "x", "model": "qwen_image"}, "model", None),
])
async def test_edit_bad_input(engine, files, data, param, code):
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files=files, data=data)
        assert_error(r, 400, param, code)
        ok = await c.post("/v1/images/edits", files={"image": ("a.png", png_bytes(), "image/png")},
                          data={"prompt": "still serving"})
    assert ok.status_code == 200
    assert len(engine.jobs) == 1


async def test_edit_needs_multipart(engine):
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", json={"prompt": "x"})
    assert_error(r, 400, code="invalid_content_type")


# ------------------------------------------------------------------ models / engine helpers
async def test_models_list_modality(engine):
    async with client(engine) as c:
        data = (await c.get("/v1/models")).json()["data"]
    assert {m["id"]: m["modality"] for m in data} == {
        "qwen_image": "image", "qwen_image_edit": "image", "piper_tts": "audio"}


def test_model_info_from_ensemble_config():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from omni_triton.paths import REPO_ROOT

    for name, edit in (("qwen_image", False), ("qwen_image_edit", True)):
        config = text_format.Parse((REPO_ROOT / "ensembles" / name / "config.pbtxt").read_text(),
                                   model_config_pb2.ModelConfig())
        info = model_info_from_config(config)
        assert info.is_image and info.is_image_edit == edit and info.modality == "image"
        assert info.default_size == (64, 64) and info.size_multiple == 16 and info.max_images >= 1
        assert info.supports_mask is False and info.default_steps == 2


# ------------------------------------------------------------------ image codec
def test_encode_decode_round_trip():
    px = pixels_for(1, 24, 16)
    png = encode_image(px, "png")
    assert png.mime_type == "image/png"
    np.testing.assert_array_equal(decode_image(png.data), px)  # lossless
    assert decode_image(encode_image(px, "jpeg", 0).data).shape == (16, 24, 3)
    assert normalise_format("JPG") == "jpeg" and normalise_format(None) == "png"
    with pytest.raises(ValueError):
        normalise_format("tiff")
    with pytest.raises(ValueError):
        decode_image(b"\x89PNG garbage")
    rgba = io.BytesIO()
    Image.new("RGBA", (3, 2), (1, 2, 3, 4)).save(rgba, "PNG")
    assert decode_image(rgba.getvalue()).shape == (2, 3, 3)


# ------------------------------------------------------------------ chat on a diffusion model
async def test_chat_on_image_model_returns_image_url_parts(engine):
    async with client(engine) as c:
        r = await c.post("/v1/chat/completions", json={
            "model": "qwen_image", "n": 2, "seed": 5, "size": "32x48", "num_inference_steps": 3,
            "messages": [{"role": "system", "content": "ignored"},
                         {"role": "user", "content": "a cat"},
                         {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": [{"type": "text", "text": "a red fox"}]}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    parts = body["choices"][0]["message"]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url"]
    for i, p in enumerate(parts):
        url = p["image_url"]["url"]
        assert url.startswith("data:image/png;base64,")
        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))
        assert pixels.shape == (48, 32, 3)
        assert np.array_equal(pixels, pixels_for(5 + i, 32, 48))
    model, job = engine.jobs[-1]
    assert model == "qwen_image" and job.prompt == "a red fox" and job.steps == 3 and job.n == 2
    assert body["usage"]["num_inference_steps"] == 3 and r.headers["X-Denoise-Steps"] == "3"


@pytest.mark.parametrize("payload, param", [
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"size": "30x30"}, "size"),
    ({"n": 0}, None),
    ({"messages": [{"role": "system", "content": "only a system message"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "  "}]}, "prompt"),
])
async def test_chat_on_image_model_bad_input(engine, payload, param):
    body = {"model": "qwen_image", "messages": [{"role": "user", "content": "a fox"}], **payload}
    async with client(engine) as c:
        r = await c.post("/v1/chat/completions", json=body)
        assert_error(r, 400, param=param)
        ok = await c.post("/v1/chat/completions", json={
            "model": "qwen_image", "messages": [{"role": "user", "content": "a fox"}]})
    assert ok.status_code == 200, ok.text


async def test_image_fields_on_a_model_without_images_are_400(engine):
    async with client(engine) as c:
        r = await c.post("/v1/chat/completions", json={
            "model": SPEECH.name, "size": "64x64", "messages": [{"role": "user", "content": "hi"}]})
    assert_error(r, 400, param="size", code="unsupported_modality")


async def test_one_step_is_rejected_before_it_makes_a_black_image(engine):
    """diffusers' flow-match pipelines give NaN latents with one step; the frontend and the stage
    share the bound."""
    from omni_triton.contracts.image import MIN_INFERENCE_STEPS
    from openai_frontend.serving import images

    assert images.MIN_INFERENCE_STEPS == MIN_INFERENCE_STEPS == 2
    async with client(engine) as c:
        r = await c.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "x",
                                                         "num_inference_steps": 1})
    assert_error(r, 400, param="num_inference_steps")
