"""``POST /v1/images/edits`` with a ``mask`` (masked inpainting) against the in-process fake
engine of ``test_images_frontend.py``: the mask's decoding (safe decoder, alpha channel), the
OpenAI -> diffusers conversion, ``strength`` and every 400 (param ``mask``) before any work.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from openai_frontend.engine import ModelInfo, model_info_from_config
from tests.unit.test_images_frontend import EDIT, ENSEMBLE_INPUTS, T2I, FakeImageEngine, assert_error, png_bytes
from tests.unit.test_images_frontend import client as frontend

pytestmark = pytest.mark.anyio

INPAINT = ModelInfo(name="qwen_image_inpaint", inputs=ENSEMBLE_INPUTS | {"INPUT_IMAGE", "MASK", "STRENGTH"},
                    outputs=T2I.outputs, task="image-edit", default_size=(64, 64), size_multiple=16,
                    max_size=256, default_steps=2, max_steps=8, max_images=2, max_input_images=1,
                    supports_mask=True, parameters={"default_strength": "0.6"})


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return FakeImageEngine(models=(T2I, EDIT, INPAINT))


def mask_png(w=40, h=30, box=(5, 20, 10, 30), mode="RGBA") -> bytes:
    """OpenAI-style mask: opaque except a fully transparent box (rows y0:y1, columns x0:x1)."""
    rgba = np.full((h, w, 4), 255, np.uint8)
    y0, y1, x0, x1 = box
    rgba[y0:y1, x0:x1, 3] = 0
    rgba[0, 0, 3] = 1  # almost transparent is kept: only alpha 0 is edited
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").convert(mode).save(buf, "PNG")
    return buf.getvalue()


def files(mask: bytes | None = None, image: bytes | None = None):
    out = {"image": ("in.png", image or png_bytes(), "image/png")}
    if mask is not None:
        out["mask"] = ("mask.png", mask, "image/png")
    return out


async def test_mask_reaches_the_engine_in_the_diffusers_convention(engine):
    async with frontend(engine) as c:
        r = await c.post("/v1/images/edits", files=files(mask_png()),
                         data={"prompt": "a cat", "model": "qwen_image_inpaint", "seed": "3", "size": "32x48"})
    assert r.status_code == 200, r.text
    model, job = engine.jobs[0]
    assert model == "qwen_image_inpaint" and job.strength == 0.6  # the model's default_strength
    assert job.mask.shape == (30, 40) and job.mask.dtype == np.uint8 and job.image.shape == (30, 40, 3)
    want = np.zeros((30, 40), np.uint8)
    want[5:20, 10:30] = 255
    np.testing.assert_array_equal(job.mask, want)
    assert (job.width, job.height) == (32, 48)


async def test_strength_extension(engine):
    async with frontend(engine) as c:
        r = await c.post("/v1/images/edits", files=files(mask_png()),
                         data={"prompt": "a cat", "model": "qwen_image_inpaint", "strength": "1"})
        assert r.status_code == 200, r.text
        assert engine.jobs[-1][1].strength == 1.0
        for bad in ("0", "1.5", "-1", "nan"):
            r = await c.post("/v1/images/edits", files=files(mask_png()),
                             data={"prompt": "a cat", "model": "qwen_image_inpaint", "strength": bad})
            assert r.status_code == 400, (bad, r.text)
        r = await c.post("/v1/images/edits", files=files(), data={"prompt": "x", "model": "qwen_image_edit",
                                                                   "strength": "0.5"})
        assert_error(r, 400, "strength", "invalid_value")
    assert len(engine.jobs) == 1


def _big_png() -> bytes:
    """A 48 KB-ish PNG claiming 20000x20000 (the bomb of tests/unit/test_media_bombs.py)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("model,mask,code", [
    ("qwen_image_inpaint", mask_png(w=41), "mask_size_mismatch"),
    ("qwen_image_inpaint", mask_png(h=29), "mask_size_mismatch"),
    ("qwen_image_inpaint", mask_png(mode="RGB"), "mask_without_alpha"),
    ("qwen_image_inpaint", mask_png(mode="L"), "mask_without_alpha"),
    ("qwen_image_inpaint", b"not an image", "invalid_mask"),
    ("qwen_image_inpaint", b"", "invalid_mask"),
    ("qwen_image_inpaint", mask_png()[:60], "invalid_mask"),
    ("qwen_image_inpaint", _big_png(), "mask_too_large"),
    ("qwen_image_inpaint", None, "missing_mask"),
    ("qwen_image_edit", mask_png(), "unsupported_mask"),
])
async def test_mask_errors(engine, model, mask, code):
    async with frontend(engine) as c:
        r = await c.post("/v1/images/edits", files=files(mask), data={"prompt": "x", "model": model})
        assert_error(r, 400, "mask", code)
        if code == "unsupported_mask":  # names the model that has it
            assert "'qwen_image_inpaint'" in r.json()["error"]["message"]
        ok = await c.post("/v1/images/edits", files=files(mask_png()),
                          data={"prompt": "still serving", "model": "qwen_image_inpaint"})
    assert ok.status_code == 200
    assert len(engine.jobs) == 1  # nothing reached the engine before


async def test_mask_twice_or_not_a_file(engine):
    async with frontend(engine) as c:
        r = await c.post("/v1/images/edits", files=[("image", ("a.png", png_bytes(), "image/png")),
                                                    ("mask", ("m.png", mask_png(), "image/png")),
                                                    ("mask", ("n.png", mask_png(), "image/png"))],
                         data={"prompt": "x", "model": "qwen_image_inpaint"})
        assert_error(r, 400, "mask", "invalid_mask")
        r = await c.post("/v1/images/edits", files=files(), data={"prompt": "x", "model": "qwen_image_inpaint",
                                                                   "mask": "not a file"})
        assert_error(r, 400, "mask", "invalid_mask")
    assert not engine.jobs


def test_inpaint_ensemble_config_reaches_model_info():
    """``ensembles/qwen_image_inpaint/config.pbtxt`` -> ModelInfo: an edit model with masks."""
    from pathlib import Path

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    root = Path(__file__).parents[2]
    config = text_format.Parse((root / "ensembles" / "qwen_image_inpaint" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    info = model_info_from_config(config)
    assert info.task == "image-edit" and info.supports_mask and info.max_input_images == 1
    assert info.parameters["default_strength"] == "0.6"
    assert {"MASK", "STRENGTH", "INPUT_IMAGE"} <= info.inputs
