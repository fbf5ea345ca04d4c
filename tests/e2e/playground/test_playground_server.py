"""The playground's Server tab in Chromium against the real stack: /health's status and model
states, the /v1/models table, and live charts drawn from the frontend's /metrics that follow a
request made meanwhile."""
from __future__ import annotations

import httpx
import pytest

from tests.helpers.playground import open_tab, shot

pytestmark = pytest.mark.e2e

MODELS = ["qwen_image", "qwen_image_edit", "qwen_image_inpaint", "wan_t2v"]


def _drawn_pixels(page, testid: str) -> int:
    """Pixels of the canvas that are not transparent (what the chart drew)."""
    return page.evaluate(
        f"(() => {{ const c = document.querySelector('[data-testid={testid}]');"
        " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; })()")


def test_health_models_and_a_chart_from_metrics(page, stack, artifact_dir):
    open_tab(page, "server")
    page.wait_for_selector("[data-testid=server-health][data-state=ok]", timeout=30_000)
    for model in MODELS:
        page.wait_for_selector(f"[data-testid=server-health-models] tr[data-model={model}][data-state=READY]",
                               state="attached")
        page.wait_for_selector(f"[data-testid=server-models] tr[data-model={model}]", state="attached")
    row = page.text_content("[data-testid=server-models] tr[data-model=wan_t2v]")
    assert "/v1/videos" in row and "loaded" in row, row
    assert "/v1/images/generations" in page.text_content("[data-testid=server-models] tr[data-model=qwen_image]")

    images = "[data-testid=server-chart-images]"
    page.wait_for_selector(f"{images}:not([data-points='0'])", state="attached", timeout=15_000)
    before = float(page.get_attribute(images, "data-last"))
    requests_before = float(page.get_attribute("[data-testid=server-chart-requests]", "data-last"))
    r = httpx.post(f"{stack.frontend_url}/v1/images/generations",
                   json={"model": "qwen_image", "prompt": "a red fox", "size": "32x32", "n": 2, "seed": 1},
                   timeout=120)
    assert r.status_code == 200, r.text
    # the next scrapes (every 3 s) see the two images and the request
    page.wait_for_selector(f"{images}[data-last='{before + 2:g}']", state="attached", timeout=20_000)
    assert float(page.get_attribute("[data-testid=server-chart-requests]", "data-last")) >= requests_before + 1
    assert int(page.get_attribute(images, "data-points")) >= 2
    assert _drawn_pixels(page, "server-chart-images") > 20
    assert page.text_content("[data-testid=server-value-images]") == f"{before + 2:g}"
    shot(page, artifact_dir, "server")
    assert not page.errors, page.errors
