"""End-to-end: per-request LoRA on masked inpainting (``qwen_image_inpaint``) and multi-image edit
(``qwen_image_edit_plus``) through the official OpenAI SDK (``client.images.edit(...,
extra_body={"lora": {"name", "scale"}})``) on a real tritonserver (docs/lora.md).

Parity reference, in this test process: a fresh ``QwenImageInpaintPipeline`` /
``QwenImageEditPlusPipeline`` on the same tiny weights with diffusers' ``load_lora_weights`` +
``set_adapters`` and the same seed; a request alone in its batches: bit-exact. Each model's tests
skip unless it is served: ``OMNI_TRITON_E2E_MODELS=qwen_image_inpaint,qwen_image_edit_plus``.
"""
from __future__ import annotations

import base64
import io
import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import E2E_MODELS
from PIL import Image

from omni_triton.checkpoints.qwen_image_lora import write_lora
from omni_triton.contracts import lora as cl
from omni_triton.contracts.image import diffusers_mask_from_alpha
from omni_triton.paths import model_dir

INPAINT, PLUS = "qwen_image_inpaint", "qwen_image_edit_plus"
SERVED = [m for m in (INPAINT, PLUS) if m in E2E_MODELS.split(",")]
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not SERVED, reason="neither model in OMNI_TRITON_E2E_MODELS")]
needs_inpaint = pytest.mark.skipif(INPAINT not in SERVED, reason=f"{INPAINT} is not in OMNI_TRITON_E2E_MODELS")
needs_plus = pytest.mark.skipif(PLUS not in SERVED, reason=f"{PLUS} is not in OMNI_TRITON_E2E_MODELS")


def png(pixels: np.ndarray, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode).save(buf, "PNG")
    return buf.getvalue()


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def picture(w: int, h: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


SOURCE = picture(56, 40, 1)
A, B = picture(56, 40, 1), picture(32, 48, 2)


def openai_mask() -> np.ndarray:
    """RGBA, opaque with a fully transparent box: the area to repaint (OpenAI's mask)."""
    rgba = np.full((40, 56, 4), 255, np.uint8)
    rgba[8:30, 10:40, 3] = 0
    return rgba


DENOISERS = {INPAINT: "qwen_image_inpaint_denoiser", PLUS: "qwen_image_edit_plus_denoiser"}


@pytest.fixture(scope="module")
def sdk(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def manifests(stack):
    """Each served denoiser's module manifest (``targets/<denoiser>.json`` in the session's LoRA
    directory): what the frontend checks an adapter against for that model."""
    out = {}
    for model in SERVED:
        path = cl.manifest_file(Path(stack.lora_dir), DENOISERS[model])
        data = json.loads(path.read_text())
        assert data["model"] == DENOISERS[model] and data["modules"]
        out[model] = data["modules"]
    return out


@pytest.fixture(scope="module")
def adapters(stack, manifests, tmp_path_factory):
    """Two diffusers-format uploads made for the first served denoiser's transformer: ``{name: file}``
    (names of their own: test_lora_served.py registers "style-a" in the same session)."""
    src = tmp_path_factory.mktemp("lora-src")
    manifest = manifests[SERVED[0]]
    out = {"ie-style-a": write_lora(src / "a.safetensors", manifest, seed=1, rank=4),
           "ie-style-b": write_lora(src / "b.safetensors", manifest, seed=2, rank=8)}
    with httpx.Client(base_url=stack.frontend_url, timeout=60) as client:
        for name, path in out.items():
            r = client.post("/v1/loras", data={"name": name},
                            files={"file": (f"{name}.safetensors", path.read_bytes())})
            assert r.status_code == 200, r.text
    return out


@pytest.fixture(scope="module")
def reference():
    """``reference(model, prompt, lora=(file, scale) | None, **kwargs)``: diffusers alone, on a
    fresh pipeline each call (no adapter of an earlier call)."""
    import torch

    from omni_triton.stages.qwen_image import load_pipeline, reference_images

    torch.set_num_threads(1)
    lock = threading.Lock()

    def run(model: str, prompt: str, lora=None, **kwargs) -> np.ndarray:
        with lock:
            if model == INPAINT:
                pipe = load_pipeline(model_dir("qwen-image-tiny"), "QwenImageInpaintPipeline")
            else:
                pipe = load_pipeline(model_dir("qwen-image-edit-plus-tiny"))
            if lora is not None:
                pipe.load_lora_weights(str(lora[0]), adapter_name="ref")
                pipe.set_adapters(["ref"], adapter_weights=[lora[1]])
            return reference_images(pipe, prompt, **kwargs)

    return run


def inpaint(sdk, lora=None, seed=21):
    extra = {"seed": seed, "num_inference_steps": 5, "strength": 0.6}
    if lora is not None:
        extra["lora"] = lora
    r = sdk.images.edit(model=INPAINT, image=("in.png", png(SOURCE), "image/png"),
                        mask=("mask.png", png(openai_mask(), "RGBA"), "image/png"), prompt="a red balloon",
                        size="64x32", extra_body=extra)
    return decode(r.data[0].b64_json)


INPAINT_KW = dict(height=32, width=64, steps=5, seed=21, strength=0.6)


def inpaint_reference(reference, lora=None):
    mask = Image.fromarray(diffusers_mask_from_alpha(openai_mask()[..., 3]), "L")
    return reference(INPAINT, "a red balloon", lora=lora, image=Image.fromarray(SOURCE, "RGB"), mask=mask,
                     **INPAINT_KW)


@needs_inpaint
@pytest.mark.parametrize("name,scale", [("ie-style-a", 1.0), ("ie-style-b", 0.6)])
def test_inpaint_with_lora_equals_diffusers(sdk, adapters, reference, name, scale):
    got = inpaint(sdk, {"name": name, "scale": scale})
    np.testing.assert_array_equal(got, inpaint_reference(reference, (adapters[name], scale)))
    assert np.abs(got.astype(int) - inpaint_reference(reference)).max() > 0  # the adapter was applied


@needs_inpaint
def test_inpaint_without_lora_stays_bit_exact(sdk, adapters, reference):
    inpaint(sdk, {"name": "ie-style-a"})  # an adapter is loaded and was active
    np.testing.assert_array_equal(inpaint(sdk), inpaint_reference(reference))


PLUS_PROMPT = "put the cat of picture 1 on the sofa of picture 2"


def edit_plus(sdk, lora=None, seed=11):
    extra = {"seed": seed, "true_cfg_scale": 1.0}
    if lora is not None:
        extra["lora"] = lora
    r = sdk.images.edit(model=PLUS, image=[("a.png", png(A), "image/png"), ("b.png", png(B), "image/png")],
                        prompt=PLUS_PROMPT, size="48x32", extra_body=extra)
    return decode(r.data[0].b64_json)


def plus_reference(reference, lora=None, seed=11):
    return reference(PLUS, PLUS_PROMPT, lora=lora, image=[Image.fromarray(A, "RGB"), Image.fromarray(B, "RGB")],
                     width=48, height=32, steps=2, seed=seed, true_cfg_scale=1.0)


@needs_plus
@pytest.mark.parametrize("name,scale", [("ie-style-a", 1.0), ("ie-style-b", 0.6)])
def test_edit_plus_with_lora_equals_diffusers(sdk, adapters, reference, name, scale):
    got = edit_plus(sdk, {"name": name, "scale": scale})
    np.testing.assert_array_equal(got, plus_reference(reference, (adapters[name], scale)))
    assert np.abs(got.astype(int) - plus_reference(reference)).max() > 0  # the adapter was applied


@needs_plus
def test_edit_plus_without_lora_stays_bit_exact(sdk, adapters, reference):
    edit_plus(sdk, {"name": "ie-style-b"})
    np.testing.assert_array_equal(edit_plus(sdk), plus_reference(reference))


def test_unknown_adapter_is_404_not_unsupported(sdk, adapters):
    """The models declare LORA_ID now: an unknown name is ``lora_not_found`` (before: 400
    ``unsupported_parameter``)."""
    import openai

    for model in SERVED:
        with pytest.raises(openai.NotFoundError) as err:
            (inpaint if model == INPAINT else edit_plus)(sdk, {"name": "nope"})
        assert err.value.body["code"] == "lora_not_found", model
