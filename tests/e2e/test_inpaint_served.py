"""End-to-end: masked inpainting (``qwen_image_inpaint``) on a real tritonserver, through Triton
gRPC and through the frontend with the official OpenAI SDK (``client.images.edit(image=...,
mask=..., prompt=...)``).

Needs only ``qwen_image_inpaint`` (its VAE encoder and denoiser plus qwen_image's text encoder and
VAE decoder): ``OMNI_TRITON_E2E_MODELS=qwen_image_inpaint pytest tests/e2e/test_inpaint_served.py``
(the full e2e model list includes it too).

Parity reference: ``QwenImageInpaintPipeline.__call__`` on the same prepared ``qwen-image-tiny``
folder in this process, with the OpenAI mask converted to diffusers' convention
(``diffusers_mask_from_alpha``: alpha 0 -> white = repaint). Tolerances: a request alone in its
batches: bit-exact (PNG is lossless); requests batched together (``n=2`` arrive at once): at most
``IMAGE_ATOL`` uint8 levels (batched GEMMs sum in another order; tests/unit/test_inpaint.py).
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import E2E_MODELS
from PIL import Image

from clients.image_grpc import generate
from omni_triton.contracts.image import diffusers_mask_from_alpha
from omni_triton.paths import model_dir

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif("qwen_image_inpaint" not in E2E_MODELS.split(","),
                                 reason="qwen_image_inpaint is not in OMNI_TRITON_E2E_MODELS")]

MODEL = "qwen_image_inpaint"
IMAGE_ATOL = 2
W, H = 56, 40


def source_png() -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def openai_mask(w: int = W, h: int = H, mode: str = "RGBA") -> bytes:
    """Opaque, with a fully transparent box: the area to edit (OpenAI's mask)."""
    rgba = np.full((h, w, 4), 255, np.uint8)
    rgba[8:30, 10:40, 3] = 0
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").convert(mode).save(buf, "PNG")
    return buf.getvalue()


def diffusers_mask(png: bytes) -> Image.Image:
    alpha = np.asarray(Image.open(io.BytesIO(png)).convert("RGBA").getchannel("A"))
    return Image.fromarray(diffusers_mask_from_alpha(alpha), "L")


def decode(b64: str) -> np.ndarray:
    import base64

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


@pytest.fixture(scope="module")
def reference():
    import torch

    from omni_triton.stages.qwen_image import load_pipeline, reference_images

    torch.set_num_threads(1)
    pipe = load_pipeline(model_dir("qwen-image-tiny"), "QwenImageInpaintPipeline")

    def run(prompt: str, **kwargs) -> np.ndarray:
        return reference_images(pipe, prompt, image=Image.open(io.BytesIO(source_png())).convert("RGB"),
                                mask=diffusers_mask(openai_mask()), **kwargs)

    return run


@pytest.fixture(scope="module")
def sdk(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_sdk_inpaint_equals_diffusers_call(sdk, reference):
    r = sdk.images.edit(model=MODEL, image=("in.png", source_png(), "image/png"),
                        mask=("mask.png", openai_mask(), "image/png"), prompt="a red balloon", size="64x32",
                        extra_body={"seed": 21, "num_inference_steps": 5, "strength": 0.6})
    assert r.usage.num_inference_steps == 3  # the last 5 * 0.6 of 5 steps (STRENGTH is FP64)
    got = decode(r.data[0].b64_json)
    ref = reference("a red balloon", height=32, width=64, steps=5, seed=21, strength=0.6)
    np.testing.assert_array_equal(got, ref)


def test_default_strength_and_batched_tolerance(sdk, reference):
    """``n=2``: two requests in flight at once (batched by the stages); each within IMAGE_ATOL of
    its seed's lone ``__call__``, with the pipeline's default strength."""
    r = sdk.images.edit(model=MODEL, image=("in.png", source_png(), "image/png"),
                        mask=("mask.png", openai_mask(), "image/png"), prompt="a cat", n=2,
                        extra_body={"seed": 5, "negative_prompt": "blurry", "true_cfg_scale": 2.0})
    worst = 0
    for i, d in enumerate(r.data):
        assert d.seed == 5 + i
        ref = reference("a cat", height=64, width=64, steps=2, seed=5 + i, negative_prompt="blurry",
                        true_cfg_scale=2.0)
        worst = max(worst, int(np.abs(decode(d.b64_json).astype(int) - ref).max()))
    assert worst <= IMAGE_ATOL


def test_grpc_ensemble_equals_diffusers_call(stack, reference):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    image = np.asarray(Image.open(io.BytesIO(source_png())).convert("RGB"))
    mask = np.asarray(diffusers_mask(openai_mask()))
    pixels, steps, seconds = generate(client, MODEL, "a boat", width=48, height=48, steps=3, seed=8,
                                      true_cfg_scale=1.0, image=image, mask=mask, strength=1.0)
    assert steps == 3 and seconds > 0
    np.testing.assert_array_equal(pixels, reference("a boat", height=48, width=48, steps=3, seed=8,
                                                    true_cfg_scale=1.0, strength=1.0))
    # a mask of another size than the image: INVALID_ARG from the VAE encoder, server keeps serving
    with pytest.raises(Exception, match="image's size"):
        generate(client, MODEL, "a boat", width=48, height=48, steps=2, seed=8, image=image,
                 mask=mask[:-1], strength=1.0)


@pytest.mark.parametrize("mask,code", [
    (openai_mask(w=W + 1), "mask_size_mismatch"),
    (openai_mask(mode="RGB"), "mask_without_alpha"),
    (b"not a png", "invalid_mask"),
])
def test_sdk_mask_errors(sdk, mask, code):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        sdk.images.edit(model=MODEL, image=("in.png", source_png(), "image/png"),
                        mask=("mask.png", mask, "image/png"), prompt="x")
    err = info.value.body
    assert err["param"] == "mask" and err["code"] == code, err
    r = sdk.images.edit(model=MODEL, image=("in.png", source_png(), "image/png"),
                        mask=("mask.png", openai_mask(), "image/png"), prompt="still serving", size="32x32")
    assert decode(r.data[0].b64_json).shape == (32, 32, 3)
