"""Helpers of the playground's browser tests (tests/e2e/playground/; fixtures in its conftest)."""
from __future__ import annotations

from pathlib import Path


def new_page(browser, base_url: str):
    """A page in a fresh context of ``browser`` (its own sessionStorage, so its own API key) on
    ``base_url``, 1200x900, microphone allowed; page errors and console errors are collected in
    ``page.errors``. Close it with ``page.context.close()``."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1200, "height": 900},
                                  permissions=["microphone"])
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.errors = errors
    return page


def open_tab(page, name: str) -> None:
    """Open the playground on tab ``name`` and wait for its panel to be shown."""
    page.goto(f"/playground/#{name}")
    page.wait_for_selector(f"#tab-{name}:not([hidden])")


def shot(page, artifact_dir: Path, name: str) -> Path:
    """Save a full-page screenshot ``<artifact_dir>/<name>.png``; returns its path."""
    path = artifact_dir / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
