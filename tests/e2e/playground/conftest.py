"""Browser fixtures for the playground's e2e tests: Debian's Chromium (``/usr/bin/chromium``,
headless) driven by Playwright for Python, against the session's real stack (``stack`` from
``tests/e2e/conftest.py``).

Set-up: ``scripts/setup_browser.sh`` (run by ``scripts/test.sh``) installs Chromium and
Playwright's venv (``$OMNI_TRITON_CACHE/browser-venv``); its site-packages are added after the
project's here, so the project's own packages win. Without them the tests skip, saying why.

``scripts/test.sh`` runs this folder in a session of its own (``pytest tests/e2e/playground``)
with the models the tabs use (:data:`PLAYGROUND_MODELS`; the default session ignores the
folder): the default stack plus a browser would not fit in 24 GB.

Helpers for the tests: ``tests/helpers/playground.py``. Screenshots (one per tab,
``shot(page, artifact_dir, "speech")``) go to ``artifacts/playground/`` under the
repository (``OMNI_TRITON_ARTIFACTS`` overrides the ``artifacts`` folder).
"""
from __future__ import annotations

import json
import os
import site
import sysconfig
from pathlib import Path

import pytest

from omni_triton.paths import cache_dir
from tests.helpers.playground import new_page

#: the models this folder's session serves (OMNI_TRITON_E2E_MODELS overrides; the ``stack``
#: fixture reads it when the session starts)
PLAYGROUND_MODELS = "piper,llm_tts,qwen3_omni,qwen3_tts,qwen_image,qwen_image_edit,qwen_image_inpaint,wan_t2v"
os.environ.setdefault("OMNI_TRITON_E2E_MODELS", PLAYGROUND_MODELS)

CHROMIUM = "/usr/bin/chromium"
#: Chromium's flags on these machines (closed network: no background connections, no QUIC),
#: plus audio without a user gesture and a fake microphone (the Voices and Realtime tabs).
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
]

REPO = Path(__file__).resolve().parents[3]


def _browser_site() -> str | None:
    venv = Path(os.environ.get("OMNI_TRITON_BROWSER_VENV", cache_dir() / "browser-venv"))
    python = f"python{sysconfig.get_python_version()}"
    candidate = venv / "lib" / python / "site-packages"
    return str(candidate) if candidate.is_dir() else None


def _import_playwright():
    try:
        from playwright.sync_api import sync_playwright
        return sync_playwright
    except ImportError:
        where = _browser_site()
        if where is None:
            return None
        site.addsitedir(where)  # after the project's site-packages: ours win
        from playwright.sync_api import sync_playwright
        return sync_playwright


@pytest.fixture(scope="session")
def artifact_dir() -> Path:
    """``artifacts/playground/`` (screenshots), created."""
    root = Path(os.environ.get("OMNI_TRITON_ARTIFACTS", REPO / "artifacts"))
    out = root / "playground"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="session")
def chromium_launch():
    """``launch(extra_args=())`` -> a new headless Chromium (Playwright ``Browser``); all closed
    at the end of the session. A test that needs its own flags (a fake microphone file) launches
    one of its own."""
    sync_playwright = _import_playwright()
    if sync_playwright is None:
        pytest.skip("Playwright is not installed: run scripts/setup_browser.sh")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: run scripts/setup_browser.sh")
    manager = sync_playwright().start()
    browsers = []

    def launch(extra_args=()):
        browser = manager.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=[*CHROMIUM_ARGS, *extra_args])
        browsers.append(browser)
        return browser

    yield launch
    for browser in browsers:
        browser.close()
    manager.stop()


@pytest.fixture(scope="session")
def browser(chromium_launch):
    """The session's Chromium."""
    return chromium_launch()


@pytest.fixture
def page(browser, stack):
    """A fresh browser context (its own sessionStorage, so its own API key) on the playground;
    console errors and page errors are collected in ``page.errors`` (a test may assert none)."""
    page = new_page(browser, stack.frontend_url)
    yield page
    page.context.close()


@pytest.fixture(scope="session")
def first_output(artifact_dir):
    """Each tab's time to its first sound or picture as the page measured it (seconds, from the
    click to the first audio scheduled / image decoded / video playing): tests set
    ``first_output["speech"] = 0.42``; written to ``<artifact_dir>/first_output.json`` at the end
    of the session (the closing notes quote it; not a timing assertion)."""
    figures: dict[str, float] = {}
    yield figures
    if figures:
        (artifact_dir / "first_output.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
