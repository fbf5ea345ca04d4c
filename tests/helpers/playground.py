"""Helpers of the playground's browser tests (tests/e2e/playground/; fixtures in its conftest)."""
from __future__ import annotations

from pathlib import Path


def open_tab(page, name: str) -> None:
    """Open the playground on tab ``name`` and wait for its panel to be shown."""
    page.goto(f"/playground/#{name}")
    page.wait_for_selector(f"#tab-{name}:not([hidden])")


def shot(page, artifact_dir: Path, name: str) -> Path:
    """Save a full-page screenshot ``<artifact_dir>/<name>.png``; returns its path."""
    path = artifact_dir / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
