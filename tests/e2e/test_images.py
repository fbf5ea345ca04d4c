"""End-to-end: Qwen-Image / Qwen-Image-Edit ensembles on Triton, ``/v1/images/*`` through the frontend.

Parity reference: the same prepared tiny pipelines run in this test process with the plain
diffusers ``__call__`` (``omni_triton.stages.qwen_image.reference_images``). Tolerances:
- a request alone in its batches: bit-exact (the stages call the pipeline's own code on the same
  float32 weights; PNG is lossless);
- a request batched with others (concurrency tests): at most ``IMAGE_ATOL`` uint8 levels, since
  a batched DiT/attention GEMM sums in another order than a single one (measured <= 1 level;
  tests/unit/test_diffusion.py). Different seeds differ by far more (:func:`seeds_differ`; the
  tiny random model's images depend more on its weights than on the noise, so the mean
  difference is only ~2 levels, the largest one tens of levels).
"""
from __future__ import annotations

import base64
import io
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from PIL import Image

from clients.image_grpc import generate
from omni_triton.paths import model_dir

pytestmark = pytest.mark.e2e

IMAGE_ATOL = 2
SEED_DIFF = 1.0  # mean |difference| of two seeds' images: measured ~2.0-2.3 levels here


def seeds_differ(a: np.ndarray, b: np.ndarray) -> bool:
    """Images of two seeds: far apart on average and somewhere well beyond the batching tolerance."""
    d = np.abs(a.astype(int) - b)
    return d.mean() > SEED_DIFF and d.max() > 4 * IMAGE_ATOL


@pytest.fixture(scope="module")
def reference():
    """``reference(kind, prompt, **kwargs)`` -> uint8 image from diffusers ``__call__`` in-process."""
    import torch

    from omni_triton.stages.qwen_image import load_pipeline, reference_images

    torch.set_num_threads(1)
    pipes = {}
    lock = threading.Lock()

    def run(kind: str, prompt: str, **kwargs) -> np.ndarray:
        with lock:
            if kind not in pipes:
                pipes[kind] = load_pipeline(model_dir(kind))
            return reference_images(pipes[kind], prompt, **kwargs)

    return run


@pytest.fixture(scope="module")
def sdk(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def triton(stack):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(stack.triton_grpc_url)


def decode(b64: str) -> Image.Image:
    img = Image.open(io.BytesIO(base64.b64decode(b64)))
    img.load()
    return img


def condition_png(w: int = 56, h: int = 40) -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def assert_serves(stack):
    r = httpx.post(f"{stack.frontend_url}/v1/images/generations", timeout=120,
                   json={"model": "qwen_image", "prompt": "still serving", "size": "32x32"})
    assert r.status_code == 200, r.text
    assert decode(r.json()["data"][0]["b64_json"]).size == (32, 32)


def test_models_list_image_modality(stack):
    data = httpx.get(f"{stack.frontend_url}/v1/models", timeout=10).json()["data"]
    modality = {m["id"]: m.get("modality") for m in data}
    assert modality["qwen_image"] == "image" and modality["qwen_image_edit"] == "image"


def test_sdk_generate(sdk, reference):
    r = sdk.images.generate(model="qwen_image", prompt="a red fox in the snow", size="64x48", n=2,
                            response_format="b64_json",
                            extra_body={"seed": 21, "num_inference_steps": 3})
    assert len(r.data) == 2 and r.data[0].revised_prompt == "a red fox in the snow"
    images = [decode(d.b64_json) for d in r.data]
    assert all(im.format == "PNG" and im.size == (64, 48) and im.mode == "RGB" for im in images)
    assert r.usage.input_tokens == len("a red fox in the snow")
    extra = r.usage.model_extra
    assert extra["num_inference_steps"] == 3 and extra["denoise_seconds"] > 0
    # image i has seed 21 + i; the two may share a denoiser batch
    for i, im in enumerate(images):
        ref = reference("qwen-image-tiny", "a red fox in the snow", height=48, width=64, steps=3, seed=21 + i)
        assert np.abs(np.asarray(im).astype(int) - ref).max() <= IMAGE_ATOL


def test_sdk_chat_on_image_model_returns_data_url_images(sdk, reference):
    """vLLM-Omni's chat on a diffusion model: image_url data URL parts, each image its seed's."""
    r = sdk.chat.completions.create(
        model="qwen_image", n=2, seed=31,
        messages=[{"role": "user", "content": "a lighthouse at dusk"}],
        extra_body={"size": "32x48", "num_inference_steps": 3})
    parts = r.choices[0].message.content
    assert [p["type"] for p in parts] == ["image_url", "image_url"]
    for i, part in enumerate(parts):
        url = part["image_url"]["url"]
        assert url.startswith("data:image/png;base64,")
        im = decode(url.split(",", 1)[1])
        assert im.size == (32, 48)
        ref = reference("qwen-image-tiny", "a lighthouse at dusk", height=48, width=32, steps=3, seed=31 + i)
        assert np.abs(np.asarray(im).astype(int) - ref).max() <= IMAGE_ATOL
    assert r.usage.model_extra["num_inference_steps"] == 3


@pytest.mark.parametrize("fmt,pil", [("jpeg", "JPEG"), ("webp", "WEBP")])
def test_sdk_generate_formats(sdk, fmt, pil):
    r = sdk.images.generate(model="qwen_image", prompt="a cat", size="32x64", output_format=fmt,
                            output_compression=30)
    im = decode(r.data[0].b64_json)
    assert im.format == pil and im.size == (32, 64)


def test_parity_with_diffusers_call(stack, sdk, triton, reference):
    """A lone request: Triton ensemble (gRPC, raw uint8) and the frontend (PNG) equal ``__call__``."""
    kwargs = dict(height=48, width=32, steps=3, seed=1234, negative_prompt="blurry, low quality",
                  true_cfg_scale=3.5)
    ref = reference("qwen-image-tiny", "a bowl of fruit", **kwargs)
    pixels, steps, seconds = generate(triton, "qwen_image", "a bowl of fruit", width=32, height=48,
                                      steps=3, seed=1234, negative_prompt="blurry, low quality",
                                      true_cfg_scale=3.5)
    assert steps == 3 and seconds > 0
    np.testing.assert_array_equal(pixels, ref)
    r = sdk.images.generate(model="qwen_image", prompt="a bowl of fruit", size="32x48",
                            extra_body={"seed": 1234, "num_inference_steps": 3,
                                        "negative_prompt": "blurry, low quality", "true_cfg_scale": 3.5})
    np.testing.assert_array_equal(np.asarray(decode(r.data[0].b64_json)), ref)


def test_sdk_edit_and_parity(sdk, reference):
    src = condition_png()
    r = sdk.images.edit(model="qwen_image_edit", image=("in.png", src, "image/png"),
                        prompt="make the sky purple", size="64x32", output_format="webp", n=2,
                        extra_body={"seed": 9})
    images = [decode(d.b64_json) for d in r.data]
    assert len(images) == 2 and all(im.format == "WEBP" and im.size == (64, 32) for im in images)
    r = sdk.images.edit(model="qwen_image_edit", image=("in.png", src, "image/png"),
                        prompt="make the sky purple", size="64x32", extra_body={"seed": 9})
    got = np.asarray(decode(r.data[0].b64_json))
    ref = reference("qwen-image-edit-tiny", "make the sky purple", height=32, width=64, steps=2, seed=9,
                    image=Image.open(io.BytesIO(src)).convert("RGB"))
    np.testing.assert_array_equal(got, ref)


def test_concurrent_requests_each_get_their_seed(stack):
    """8 concurrent HTTP requests all return, each with its own seed's image (vs sequential runs)."""
    url = f"{stack.frontend_url}/v1/images/generations"

    def one(seed: int) -> np.ndarray:
        r = httpx.post(url, timeout=300, json={"model": "qwen_image", "prompt": f"a lighthouse {seed % 3}",
                                               "size": "64x64", "seed": seed})
        assert r.status_code == 200, r.text
        return np.asarray(decode(r.json()["data"][0]["b64_json"])).astype(int)

    seeds = list(range(100, 108))
    sequential = [one(s) for s in seeds]
    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(one, seeds))
    for s, c in zip(sequential, concurrent, strict=True):
        assert np.abs(s - c).max() <= IMAGE_ATOL
    # prompts 100 and 103 are equal ("a lighthouse 1"): only the seed differs
    assert seeds_differ(concurrent[0], concurrent[3])


def test_n_images_are_batched_by_triton(stack):
    """One request with n=8: its 8 images reach the denoiser together, so Triton runs fewer
    denoiser executions than requests (counted on Triton's metrics endpoint, not timed)."""
    labels = {"model": "qwen_image_denoiser"}
    req0 = stack.metric("nv_inference_request_success", **labels)
    exec0 = stack.metric("nv_inference_exec_count", **labels)
    r = httpx.post(f"{stack.frontend_url}/v1/images/generations", timeout=300,
                   json={"model": "qwen_image", "prompt": "a forest", "size": "32x32", "n": 8, "seed": 5})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["seed"] for d in data] == list(range(5, 13))
    images = [np.asarray(decode(d["b64_json"])).astype(int) for d in data]
    assert all(seeds_differ(images[0], im) for im in images[1:])
    requests = stack.metric("nv_inference_request_success", **labels) - req0
    executions = stack.metric("nv_inference_exec_count", **labels) - exec0
    assert requests == 8 and executions < requests


@pytest.mark.parametrize("payload,param", [
    ({"size": "60x64"}, "size"),
    ({"n": 0}, "n"),
    ({"n": 1000}, "n"),
    ({"output_format": "gif"}, "output_format"),
    ({"response_format": "url"}, "response_format"),
    ({"prompt": ""}, "prompt"),
    ({"num_inference_steps": 0}, "num_inference_steps"),
])
def test_generation_bad_input(stack, payload, param):
    body = {"model": "qwen_image", "prompt": "x", **payload}
    r = httpx.post(f"{stack.frontend_url}/v1/images/generations", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert_serves(stack)


@pytest.mark.parametrize("files,data,param", [
    ({"image": ("a.png", b"\x89PNG\r\n\x1a\n corrupt", "image/png")}, {"prompt": "x"}, "image"),
    ({"image": ("a.png", condition_png(), "image/png"),
      "mask": ("m.png", condition_png(), "image/png")}, {"prompt": "x"}, "mask"),
    ({"image": ("a.png", condition_png(), "image/png")}, {"prompt": " "}, "prompt"),
    ({"image": ("a.png", condition_png(), "image/png")}, {"prompt": "x", "size": "100x100"}, "size"),
])
def test_edit_bad_input(stack, files, data, param):
    r = httpx.post(f"{stack.frontend_url}/v1/images/edits", files=files,
                   data={"model": "qwen_image_edit", **data}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert_serves(stack)


def test_triton_rejects_bad_size_with_invalid_arg(stack, triton):
    """Straight to Triton (no frontend checks): the denoiser answers INVALID_ARG, and serves on."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        generate(triton, "qwen_image", "x", width=60, height=64)
    assert "multiple of 16" in info.value.message()
    with pytest.raises(InferenceServerException):
        generate(triton, "qwen_image", "   ")
    pixels, _, _ = generate(triton, "qwen_image", "fine", width=16, height=32)
    assert pixels.shape == (32, 16, 3)
    assert_serves(stack)
