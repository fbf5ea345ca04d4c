"""End-to-end: the multi-image edit ensemble ``qwen_image_edit_plus`` (diffusers
``QwenImageEditPlusPipeline``, Qwen-Image-Edit-2509) on Triton, and ``/v1/images/edits`` with
several ``image`` parts (the OpenAI SDK's ``images.edit(image=[a, b])``).

Parity reference: the prepared ``qwen-image-edit-plus-tiny`` run in this test process with the
plain diffusers ``__call__`` (``omni_triton.stages.qwen_image.reference_images``, the image list
as ``image=``). Tolerances:
- a request alone: bit-exact (uint8), through Triton gRPC and through the frontend (PNG);
- batched with other requests: at most ``BATCHED_ATOL`` uint8 levels. The Plus pipeline refuses
  ``batch_size > 1``, so the denoiser runs one pipeline call per request and only the VAE
  decoder's batched decode can round differently (measured here: 0 levels, i.e. bit-exact).

The tiny random model's images barely depend on their condition images (swapping two images or
zeroing the second one's latents changes 5-84 pixels by 1 level: tests/unit/test_diffusion.py),
so the bit-exact checks are what can see a miswired stage; that is why they are bit-exact.

Served models: ``qwen_image_edit_plus`` and ``qwen_image_edit`` (for the hint of the
too-many-images error): ``OMNI_TRITON_E2E_MODELS=qwen_image_edit,qwen_image_edit_plus``.
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

MODEL = "qwen_image_edit_plus"
BATCHED_ATOL = 2  # uint8 levels, batched VAE decode (measured 0)
PROMPT = "put the cat of picture 1 on the sofa of picture 2"


@pytest.fixture(scope="module", autouse=True)
def served(stack):
    models = {m["id"] for m in httpx.get(f"{stack.frontend_url}/v1/models", timeout=30).json()["data"]}
    if MODEL not in models:
        pytest.skip(f"{MODEL} is not served")
    return models


@pytest.fixture(scope="module")
def reference():
    """``reference(prompt, images, **kwargs)`` -> uint8 image of diffusers' ``__call__`` in-process."""
    import torch

    from omni_triton.stages.qwen_image import load_pipeline, reference_images

    torch.set_num_threads(1)
    pipes = {}
    lock = threading.Lock()

    def run(prompt: str, images: list[np.ndarray], **kwargs) -> np.ndarray:
        with lock:
            if "pipe" not in pipes:
                pipes["pipe"] = load_pipeline(model_dir("qwen-image-edit-plus-tiny"))
            pil = [Image.fromarray(im, "RGB") for im in images]
            return reference_images(pipes["pipe"], prompt, image=pil, **kwargs)

    return run


@pytest.fixture(scope="module")
def sdk(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def triton(stack):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(stack.triton_grpc_url)


def picture(w: int, h: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


A, B, C = picture(56, 40, 1), picture(32, 48, 2), picture(40, 40, 3)


def test_grpc_two_images_equal_the_pipeline_call(triton, reference):
    kwargs = dict(width=48, height=32, steps=2, seed=7)
    pixels, steps, seconds = generate(triton, MODEL, PROMPT, images=[A, B], true_cfg_scale=1.0, **kwargs)
    assert pixels.shape == (32, 48, 3) and steps == 2 and seconds > 0
    np.testing.assert_array_equal(pixels, reference(PROMPT, [A, B], true_cfg_scale=1.0, **kwargs))


def test_grpc_one_image_with_cfg_equals_the_pipeline_call(triton, reference):
    kwargs = dict(width=32, height=32, steps=2, seed=3)
    pixels, _, _ = generate(triton, MODEL, "make it blue", images=[C], negative_prompt=" ",
                            true_cfg_scale=2.0, **kwargs)
    ref = reference("make it blue", [C], negative_prompt=" ", true_cfg_scale=2.0, **kwargs)
    np.testing.assert_array_equal(pixels, ref)


def test_sdk_two_images_equal_the_pipeline_call(sdk, reference):
    r = sdk.images.edit(model=MODEL, image=[("a.png", png(A), "image/png"), ("b.png", png(B), "image/png")],
                        prompt=PROMPT, size="48x32", extra_body={"seed": 11, "true_cfg_scale": 1.0})
    got = decode(r.data[0].b64_json)
    assert got.shape == (32, 48, 3) and r.data[0].seed == 11
    np.testing.assert_array_equal(got, reference(PROMPT, [A, B], width=48, height=32, steps=2, seed=11,
                                                 true_cfg_scale=1.0))


def test_batched_requests_within_tolerance(stack, reference):
    """Three concurrent requests (1, 2 and 3 images, their own seeds) through the frontend, each
    compared with its own diffusers call."""
    cases = [([A], 21), ([B, A], 22), ([A, B, C], 23)]

    def one(case):
        images, seed = case
        files = [("image[]", (f"{k}.png", png(im), "image/png")) for k, im in enumerate(images)]
        r = httpx.post(f"{stack.frontend_url}/v1/images/edits", files=files, timeout=600,
                       data={"model": MODEL, "prompt": PROMPT, "size": "32x32", "seed": str(seed),
                             "true_cfg_scale": "1.0"})
        assert r.status_code == 200, r.text
        return decode(r.json()["data"][0]["b64_json"])

    with ThreadPoolExecutor(len(cases)) as pool:
        served = list(pool.map(one, cases))
    worst = 0
    for (images, seed), got in zip(cases, served, strict=True):
        ref = reference(PROMPT, images, width=32, height=32, steps=2, seed=seed, true_cfg_scale=1.0)
        worst = max(worst, int(np.abs(got.astype(int) - ref).max()))
    print(f"batched vs alone: max {worst} uint8 levels")
    assert worst <= BATCHED_ATOL


def test_too_many_images_is_a_clear_400(stack, served):
    files = [("image", (f"{k}.png", png(C), "image/png")) for k in range(4)]
    r = httpx.post(f"{stack.frontend_url}/v1/images/edits", files=files, timeout=60,
                   data={"model": MODEL, "prompt": "x", "size": "32x32"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "too_many_images" and err["param"] == "image"
    assert "at most 3 input image(s); got 4" in err["message"]
    if "qwen_image_edit" in served:
        r = httpx.post(f"{stack.frontend_url}/v1/images/edits", files=files[:2], timeout=60,
                       data={"model": "qwen_image_edit", "prompt": "x", "size": "32x32"})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "at most 1 input image(s); got 2" in message and f"'{MODEL}' (up to 3)" in message


def test_a_bad_second_image_is_a_400_and_serving_goes_on(stack):
    files = [("image", ("a.png", png(A), "image/png")), ("image", ("b.png", b"\x89PNG\r\n\x1a\n broken", "image/png"))]
    r = httpx.post(f"{stack.frontend_url}/v1/images/edits", files=files, timeout=60,
                   data={"model": MODEL, "prompt": "x", "size": "32x32"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_image" and "Image 2" in r.json()["error"]["message"]
    elongated = picture(1000, 4, 5)  # 250:1, beyond MAX_CONDITION_ASPECT_RATIO
    files = [("image", ("a.png", png(A), "image/png")), ("image", ("b.png", png(elongated), "image/png"))]
    r = httpx.post(f"{stack.frontend_url}/v1/images/edits", files=files, timeout=60,
                   data={"model": MODEL, "prompt": "x", "size": "32x32"})
    assert r.status_code == 400 and "Image 2 is 1000x4" in r.json()["error"]["message"], r.text
    r = httpx.post(f"{stack.frontend_url}/v1/images/edits", files=files[:1], timeout=600,
                   data={"model": MODEL, "prompt": "x", "size": "32x32"})
    assert r.status_code == 200, r.text


def test_triton_refuses_a_malformed_image_pack(triton):
    """Straight to Triton (no frontend): sizes that do not match the pixels, and 4 images, are
    INVALID_ARG from the first step; the model serves on."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from omni_triton.contracts import image as contract
    from omni_triton.contracts.tensors import infer_input, wrap_inputs

    def inputs(pixels, sizes):
        pairs = contract.image_inputs("x", width=32, height=32, steps=2, seed=0)
        pairs += [(contract.INPUT_IMAGES, pixels[None]), (contract.INPUT_IMAGE_SIZES, sizes[None])]
        from functools import partial
        return wrap_inputs(pairs, partial(infer_input, grpcclient.InferInput))

    pixels, sizes = contract.pack_images([A, B])
    with pytest.raises(InferenceServerException) as info:
        triton.infer(MODEL, inputs(pixels, sizes + 1))
    assert "IMAGE_SIZES" in info.value.message()
    pixels, sizes = contract.pack_images([C] * 4)
    with pytest.raises(InferenceServerException) as info:
        triton.infer(MODEL, inputs(pixels, sizes))
    assert "1 to 3" in info.value.message()
    out, _, _ = generate(triton, MODEL, "fine", images=[C], width=16, height=16)
    assert out.shape == (16, 16, 3)
