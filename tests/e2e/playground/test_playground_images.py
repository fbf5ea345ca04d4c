"""The playground's Images tab in Chromium against the real stack: a generated image appears in
the grid (a decoded <img> of the size asked), an uploaded image is edited, a brush-painted mask
inpaints (the mask PNG the page sends is transparent where painted), an adapter uploaded in the
tab is used by a generation, and a bad size shows the API's own error in the tab."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omni_triton.checkpoints.qwen_image_lora import write_lora
from omni_triton.contracts import lora as lora_contract
from tests.helpers.playground import open_tab, shot

pytestmark = pytest.mark.e2e

def _wait_done(page) -> None:
    """Wait for the request to end; fail with the tab's error unless the grid shows its result."""
    page.wait_for_selector("[data-testid=images-grid][data-state]:not([data-state=running])", state="attached",
                           timeout=120_000)
    assert page.get_attribute("[data-testid=images-grid]", "data-state") == "done", \
        page.text_content("[data-testid=images-error]")


def _sizes(page) -> list[list[int]]:
    return page.evaluate(
        "[...document.querySelectorAll('[data-testid=images-result]')]"
        ".filter((i) => i.complete).map((i) => [i.naturalWidth, i.naturalHeight])")


def _upload_png(tmp_path, width=64, height=48):
    path = tmp_path / "in.png"
    pixels = (np.random.default_rng(0).random((height, width, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _mask_alpha(page) -> np.ndarray:
    """The alpha channel of the mask PNG the page sent (its preview image, drawn on a canvas)."""
    width, height, alpha = page.evaluate(
        "(() => { const img = document.querySelector('[data-testid=images-mask-preview]');"
        " const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;"
        " const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);"
        " const d = ctx.getImageData(0, 0, c.width, c.height).data; const a = [];"
        " for (let i = 3; i < d.length; i += 4) a.push(d[i]); return [c.width, c.height, a]; })()")
    return np.asarray(alpha, dtype=np.uint8).reshape(height, width)


def test_generate_shows_images_of_the_size_asked(page, stack, artifact_dir, first_output):
    open_tab(page, "images")
    page.wait_for_selector("[data-testid=images-model] option[value=qwen_image]", state="attached")
    page.fill("[data-testid=images-size]", "48x32")
    page.fill("[data-testid=images-n]", "2")
    page.fill("[data-testid=images-seed]", "7")
    page.fill("[data-testid=images-steps]", "3")
    page.click("[data-testid=images-run]")
    _wait_done(page)
    assert _sizes(page) == [[48, 32], [48, 32]]
    seeds = page.eval_on_selector_all("[data-testid=images-result]", "(els) => els.map((e) => e.dataset.seed)")
    assert seeds == ["7", "8"]
    ttfp = float(page.get_attribute("[data-testid=images-ttfp]", "data-seconds"))
    assert 0 < ttfp < 120
    first_output["images"] = round(ttfp, 3)  # the click -> the first image decoded in the grid
    assert "3 steps" in page.text_content("[data-testid=images-usage]")
    shot(page, artifact_dir, "images")
    assert not page.errors, page.errors


def test_edit_an_uploaded_image(page, stack, tmp_path):
    open_tab(page, "images")
    page.select_option("[data-testid=images-mode]", "edit")
    page.wait_for_selector("[data-testid=images-model] option[value=qwen_image_edit]", state="attached")
    page.select_option("[data-testid=images-model]", "qwen_image_edit")
    page.wait_for_selector("[data-testid=images-edit-box]:not([hidden])")
    assert "one image" in page.text_content("[data-testid=images-edit-hint]")
    assert page.is_hidden("[data-testid=images-mask-box]")  # qwen_image_edit takes no mask
    page.set_input_files("[data-testid=images-upload]", str(_upload_png(tmp_path)))
    page.fill("[data-testid=images-size]", "32x32")
    page.click("[data-testid=images-run]")
    _wait_done(page)
    assert _sizes(page) == [[32, 32]]
    assert not page.errors, page.errors


def test_inpaint_with_a_brushed_mask(page, stack, tmp_path):
    open_tab(page, "images")
    page.select_option("[data-testid=images-mode]", "edit")
    page.wait_for_selector("[data-testid=images-model] option[value=qwen_image_inpaint]", state="attached")
    page.select_option("[data-testid=images-model]", "qwen_image_inpaint")
    page.wait_for_selector("[data-testid=images-mask-box]:not([hidden])")
    page.set_input_files("[data-testid=images-upload]", str(_upload_png(tmp_path, 64, 48)))
    page.wait_for_selector("[data-testid=images-mask-canvas][width='64']")
    page.fill("[data-testid=images-brush-size]", "40")  # 40 px shown = 10 image pixels
    box = page.locator("[data-testid=images-mask-canvas]").bounding_box()
    assert abs(box["width"] - 256) <= 2  # the 64 px image shown 4x: image (10, 15) -> (22, 32)
    page.mouse.move(box["x"] + 40, box["y"] + 60)
    page.mouse.down()
    page.mouse.move(box["x"] + 90, box["y"] + 130, steps=10)
    page.mouse.up()
    assert page.get_attribute("[data-testid=images-mask-canvas]", "data-painted") == "1"
    page.fill("[data-testid=images-size]", "64x48")
    page.click("[data-testid=images-run]")
    _wait_done(page)
    page.wait_for_selector("[data-testid=images-mask-preview][data-sent]")
    alpha = _mask_alpha(page)
    assert alpha.shape == (48, 64)
    assert alpha[20, 12] == 0 and alpha[5, 60] == 255, "the painted area is not the transparent one"
    assert 20 < (alpha == 0).sum() < 64 * 48 / 2
    assert _sizes(page) == [[64, 48]]
    assert not page.errors, page.errors


def test_a_bad_size_shows_the_api_error(page, stack):
    open_tab(page, "images")
    page.wait_for_selector("[data-testid=images-model] option[value=qwen_image]", state="attached")
    page.fill("[data-testid=images-size]", "65x64")
    page.click("[data-testid=images-run]")
    page.wait_for_selector("[data-testid=images-error]:not([hidden])", timeout=60_000)
    text = page.text_content("[data-testid=images-error]")
    assert "Invalid size '65x64'" in text and "invalid_size" in text and "param: size" in text, text
    assert page.get_attribute("[data-testid=images-grid]", "data-state") == "error"
    assert page.locator("[data-testid=images-result]").count() == 0


def _first_image_pixels(page) -> np.ndarray:
    width, height, rgba = page.evaluate(
        "(() => { const img = document.querySelector('[data-testid=images-result]');"
        " const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;"
        " const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);"
        " return [c.width, c.height, Array.from(ctx.getImageData(0, 0, c.width, c.height).data)]; })()")
    return np.asarray(rgba, dtype=np.uint8).reshape(height, width, 4)


def test_upload_a_lora_and_generate_with_it(page, stack, tmp_path):
    open_tab(page, "images")
    page.wait_for_selector("[data-testid=images-model] option[value=qwen_image]", state="attached")
    page.fill("[data-testid=images-size]", "32x32")
    page.fill("[data-testid=images-seed]", "5")
    page.click("[data-testid=images-run]")  # without adapter (also writes the denoiser's manifest)
    _wait_done(page)
    plain = _first_image_pixels(page)

    manifest = json.loads(lora_contract.manifest_file(Path(stack.lora_dir), "qwen_image_denoiser").read_text())
    adapter = write_lora(tmp_path / "style.safetensors", manifest["modules"], seed=1, rank=4)
    page.fill("[data-testid=images-lora-name]", "pg-style")
    page.set_input_files("[data-testid=images-lora-file]", str(adapter))
    page.click("[data-testid=images-lora-form] button[type=submit]")
    page.wait_for_selector("[data-testid=images-lora-list] li[data-name=pg-style]")
    page.select_option("[data-testid=images-lora]", "pg-style")
    page.fill("[data-testid=images-lora-scale]", "1.5")
    with page.expect_request(lambda r: r.url.endswith("/v1/images/generations")) as request:
        page.click("[data-testid=images-run]")
    assert request.value.post_data_json["lora"] == {"name": "pg-style", "scale": 1.5}
    _wait_done(page)
    styled = _first_image_pixels(page)
    assert styled.shape == plain.shape == (32, 32, 4)
    assert np.abs(styled.astype(int) - plain.astype(int)).max() > 0, "the adapter changed nothing"
    assert not page.errors, page.errors
