"""The playground with an API key, in Chromium, on the real app over the fake engine (uvicorn in a
thread: the key handling is the page's and the frontend's, not the stages'): the page loads
without the key, asks for it on the API's 401 (showing the API's message), keeps it for this
tab only (sessionStorage: a new tab asks again), sends it as a header, never in a URL."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.frontend import serve_in_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit"))  # the fake engine's folder
from fake_engine import fake_app

pytestmark = pytest.mark.e2e
KEY = "sk-playground-browser"


def _keyed(tmp_path_factory, key: str):
    """The fake-engine app with API key ``key`` on uvicorn in a thread: yields its URL."""
    server, thread, port = serve_in_thread(fake_app(tmp_path_factory.mktemp("keyed"), api_key=key))
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join()


@pytest.fixture(scope="module")
def keyed_frontend(tmp_path_factory):
    yield from _keyed(tmp_path_factory, KEY)


def test_the_page_asks_for_the_key_keeps_it_per_tab_and_never_puts_it_in_a_url(browser, keyed_frontend):
    context = browser.new_context(base_url=keyed_frontend)
    urls: list[str] = []
    auth: list[str | None] = []
    context.on("request", lambda r: (urls.append(r.url), auth.append(r.headers.get("authorization"))))
    page = context.new_page()
    page.goto("/playground/#speech")
    page.wait_for_selector("#key-form:not([hidden])")
    error = page.wait_for_selector("#global-error:not([hidden])")
    assert "API key" in error.inner_text() and "401" in error.inner_text()

    page.fill("#api-key", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-form[data-state=ok]")  # /v1/models answered with the key
    assert page.is_hidden("#global-error")
    # the shown tab, whose first init met the 401, is set up again: its lists fill, once
    page.wait_for_selector("[data-testid=speech-model] option[value=piper_tts]", state="attached")
    page.click("nav button[data-tab=chat]")
    page.wait_for_selector("[data-testid=chat-model] option[value=llm]", state="attached")
    page.click("nav button[data-tab=speech]")
    assert page.locator("#tab-speech [data-testid=speech-model]").count() == 1
    assert page.evaluate("sessionStorage.getItem('omni-triton.api-key')") == KEY
    assert page.evaluate("localStorage.length") == 0 and KEY not in page.evaluate("document.cookie")
    assert f"Bearer {KEY}" in auth
    assert not [u for u in urls if KEY in u]

    other_tab = context.new_page()  # same browser, another tab: sessionStorage is per tab
    other_tab.goto("/playground/#speech")
    other_tab.wait_for_selector("#key-form:not([hidden])")
    assert other_tab.evaluate("sessionStorage.getItem('omni-triton.api-key')") is None
    context.close()


SLASH_KEY = "my/secret+key=="  # base64-like: not an RFC 7230 token


@pytest.fixture(scope="module")
def slash_keyed_frontend(tmp_path_factory):
    yield from _keyed(tmp_path_factory, SLASH_KEY)


def test_a_key_a_browser_cannot_send_on_a_websocket_is_explained_not_shown(browser, slash_keyed_frontend):
    """Chromium refuses such a subprotocol and quotes it (the key) in its exception: the Realtime
    tab says why instead, and the key appears nowhere on the page."""
    context = browser.new_context(base_url=slash_keyed_frontend)
    page = context.new_page()
    page.goto("/playground/#realtime")
    page.wait_for_selector("#key-form:not([hidden])")
    page.fill("#api-key", SLASH_KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-form[data-state=ok]")
    page.wait_for_selector("[data-testid=rt-model] option[value=omni]", state="attached")
    page.click("[data-testid=rt-connect]")
    error = page.wait_for_selector("[data-testid=rt-error]:not([hidden])")
    assert "cannot send on a WebSocket" in error.inner_text()
    assert SLASH_KEY not in page.inner_text("body")
    context.close()
