"""``/v1/images/edits`` with several images (a multi-image edit model, ``qwen_image_edit_plus``)
against the in-process fake engine of ``test_images_frontend``, and the engine's packing of the
condition images into INPUT_IMAGES + INPUT_IMAGE_SIZES. No Triton."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from test_images_frontend import EDIT, T2I, FakeImageEngine, assert_error, png_bytes

from omni_triton.contracts import image as image_contract
from openai_frontend.engine import ImageJob, TritonEngine
from openai_frontend.serving import images as serving
from tests.helpers.frontend import frontend_client as client

pytestmark = pytest.mark.anyio

PLUS = dataclasses.replace(EDIT, name="qwen_image_edit_plus", max_input_images=3,
                           inputs=(EDIT.inputs - {"INPUT_IMAGE"}) | {"INPUT_IMAGES", "INPUT_IMAGE_SIZES"})


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return FakeImageEngine(models=(T2I, EDIT, PLUS))


def parts(*sizes, field="image[]"):
    colors = [(200, 10, 10), (10, 200, 10), (10, 10, 200), (90, 90, 90)]
    return [(field, (f"{k}.png", png_bytes(w, h, colors[k]), "image/png")) for k, (w, h) in enumerate(sizes)]


def test_plus_is_an_edit_model():
    assert PLUS.is_image_edit and not PLUS.is_image_to_video


@pytest.mark.parametrize("field", ["image[]", "image"])
async def test_images_reach_the_job_in_order(engine, field):
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files=parts((40, 30), (20, 50), (16, 16), field=field),
                         data={"prompt": "x", "model": "qwen_image_edit_plus", "seed": "3"})
    assert r.status_code == 200, r.text
    _, job = engine.jobs[0]
    assert [im.shape for im in job.condition_images] == [(30, 40, 3), (50, 20, 3), (16, 16, 3)]
    assert [tuple(im[0, 0]) for im in job.condition_images] == [(200, 10, 10), (10, 200, 10), (10, 10, 200)]
    assert job.image is job.condition_images[0] and len(job.more_images) == 2


async def test_one_image_on_a_multi_image_model(engine):
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files=parts((40, 30)),
                         data={"prompt": "x", "model": "qwen_image_edit_plus"})
    assert r.status_code == 200, r.text
    assert engine.jobs[0][1].more_images == ()


async def test_too_many_images_names_the_limit(engine):
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files=parts((8, 8), (8, 8), (8, 8), (8, 8)),
                         data={"prompt": "x", "model": "qwen_image_edit_plus"})
        assert_error(r, 400, "image", "too_many_images")
        assert "'qwen_image_edit_plus' takes at most 3 input image(s); got 4" in r.json()["error"]["message"]
        assert "no model served here takes that many" in r.json()["error"]["message"]
        r = await c.post("/v1/images/edits", files=parts((8, 8), (8, 8)),
                         data={"prompt": "x", "model": "qwen_image_edit"})
        assert_error(r, 400, "image", "too_many_images")
        assert "models that take 2: 'qwen_image_edit_plus' (up to 3)" in r.json()["error"]["message"]
    assert engine.jobs == []


async def test_a_bad_second_image_is_named(engine):
    files = parts((8, 8)) + [("image[]", ("b.png", b"not an image", "image/png"))]
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files=files, data={"prompt": "x", "model": "qwen_image_edit_plus"})
        assert_error(r, 400, "image", "invalid_image")
        assert r.json()["error"]["message"].startswith("Image 2: ")
        r = await c.post("/v1/images/edits", files=parts((8, 8), (500, 4)),
                         data={"prompt": "x", "model": "qwen_image_edit_plus"})
        assert_error(r, 400, "image", "invalid_image")
        assert "Image 2 is 500x4" in r.json()["error"]["message"]
    assert engine.jobs == []


async def test_total_pixels_are_bounded_before_decoding(engine, monkeypatch):
    """The images together may have MAX_EDIT_TOTAL_PIXELS; the image that goes over is refused
    from its header (decode_image's max_pixels is what is left), not decoded."""
    monkeypatch.setattr(serving, "MAX_EDIT_TOTAL_PIXELS", 40 * 30 + 20 * 50)
    async with client(engine) as c:
        ok = await c.post("/v1/images/edits", files=parts((40, 30), (20, 50)),
                          data={"prompt": "x", "model": "qwen_image_edit_plus"})
        assert ok.status_code == 200, ok.text
        r = await c.post("/v1/images/edits", files=parts((40, 30), (20, 50), (1, 1)),
                         data={"prompt": "x", "model": "qwen_image_edit_plus"})
    assert_error(r, 400, "image", "image_too_large")
    assert "Image 3 makes the condition images larger than 2200 pixels in all" in r.json()["error"]["message"]
    assert len(engine.jobs) == 1


class _Result:
    def as_numpy(self, name):
        return np.zeros((1, 4, 4, 3), np.uint8) if name == image_contract.IMAGE else None


@pytest.mark.parametrize("info,expect", [(PLUS, {"INPUT_IMAGES", "INPUT_IMAGE_SIZES"}), (EDIT, {"INPUT_IMAGE"})])
def test_engine_sends_the_inputs_the_model_declares(info, expect):
    sent = []

    async def unary(model, inputs, request_id):
        sent.append({i.name(): i for i in inputs})
        return _Result()

    engine = TritonEngine("127.0.0.1:1")
    engine._unary = unary
    engine._config_cache[info.name] = info
    a, b = np.zeros((3, 5, 3), np.uint8), np.ones((2, 2, 3), np.uint8)
    more = (b,) if info is PLUS else ()
    asyncio.run(engine.generate_images(info.name, ImageJob("p", 16, 16, 2, seed=1, image=a, more_images=more)))
    (inputs,) = sent
    assert expect <= set(inputs) and not ({"INPUT_IMAGE", "INPUT_IMAGES"} - expect) & set(inputs)
    if info is PLUS:
        assert inputs["INPUT_IMAGES"].shape() == [1, 15 + 4, 3]
        assert inputs["INPUT_IMAGE_SIZES"].shape() == [1, 2, 2]


def test_pack_unpack_round_trip_and_errors():
    a = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    b = np.full((4, 1, 3), 7, np.uint8)
    pixels, sizes = image_contract.pack_images([a, b])
    assert pixels.shape == (10, 3) and sizes.tolist() == [[2, 3], [4, 1]] and sizes.dtype == np.int32
    back = image_contract.unpack_images(pixels, sizes, 3)
    assert [x.shape for x in back] == [a.shape, b.shape]
    np.testing.assert_array_equal(back[0], a)
    np.testing.assert_array_equal(back[1], b)
    for bad_pixels, bad_sizes, limit in [
        (pixels, sizes + 1, 3),  # sizes do not match the pixels
        (pixels, sizes, 1),  # more images than the model takes
        (pixels[:, :2], sizes, 3),  # not [P, 3]
        (pixels, np.zeros((0, 2), np.int32), 3),  # no image
        (pixels, np.array([[0, 10], [4, 0]], np.int32), 3),  # a zero size
        (pixels.astype(np.float32), sizes, 3),
    ]:
        with pytest.raises(image_contract.ImageInputError):
            image_contract.unpack_images(bad_pixels, bad_sizes, limit)
    with pytest.raises(image_contract.ImageInputError):
        image_contract.pack_images([])
