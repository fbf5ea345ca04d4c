"""An on-demand model's first request in Chromium, on the real app over a fake engine whose
``piper_tts`` is "unloaded" until its first speech request and then takes 3 s to load: the page
says a model is loading while it loads (and names it), then takes the notice down and lists the
model as loaded. The trial of issue 30: 33 s of an empty answer with nothing said."""
from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path

import pytest

from openai_frontend.app import Settings, create_app
from tests.helpers.frontend import serve_in_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit"))  # the fake engine's folder
from fake_engine import FakeEngine

pytestmark = pytest.mark.e2e
LOAD_S = 3.0


class LoadsOnFirstUse(FakeEngine):
    """``piper_tts`` listed as UNLOADED, then LOADING for ``LOAD_S`` from its first request, then
    READY; that first request waits for the load, as the real on-demand engine's does."""

    def __init__(self):
        super().__init__()
        self.ready_at: float | None = None

    async def list_models(self):
        if self.ready_at is None:
            state = "UNLOADED"
        else:
            state = "READY" if time.monotonic() >= self.ready_at else "LOADING"
        return [dataclasses.replace(m, state=state, on_demand=True) if m.name == "piper_tts" else m
                for m in await super().list_models()]

    async def synthesize(self, model, text, voice=None, speed=None, options=None, paced=False):
        if model == "piper_tts":
            if self.ready_at is None:
                self.ready_at = time.monotonic() + LOAD_S
            await asyncio.sleep(max(0.0, self.ready_at - time.monotonic()))
        async for chunk in super().synthesize(model, text, voice, speed, options, paced):
            yield chunk


@pytest.fixture
def on_demand_frontend():
    server, thread, port = serve_in_thread(create_app(LoadsOnFirstUse(), Settings()))
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join()


def test_the_page_says_a_model_is_loading_on_its_first_request(browser, on_demand_frontend):
    context = browser.new_context(base_url=on_demand_frontend)
    page = context.new_page()
    page.goto("/playground/#speech")
    page.wait_for_selector("[data-testid=speech-model] option[value=piper_tts]", state="attached")
    assert "unloaded" in page.inner_text("[data-testid=speech-model] option[value=piper_tts]")
    page.select_option("[data-testid=speech-model]", "piper_tts")
    page.click("[data-testid=speech-play]")
    notice = page.wait_for_selector("[data-testid=global-notice]:not([hidden])", timeout=LOAD_S * 1000)
    assert "Loading piper_tts" in notice.inner_text()
    page.wait_for_selector("[data-testid=global-notice][hidden]", state="attached", timeout=20_000)
    # the tab lists the model's new state
    deadline = time.monotonic() + 10
    while "unloaded" in page.inner_text("[data-testid=speech-model] option[value=piper_tts]") \
            or "loading" in page.inner_text("[data-testid=speech-model] option[value=piper_tts]"):
        assert time.monotonic() < deadline, page.inner_text("[data-testid=speech-model] option[value=piper_tts]")
        page.wait_for_timeout(200)
    context.close()
