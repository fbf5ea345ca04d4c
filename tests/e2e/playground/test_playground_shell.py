"""The playground's shell in Chromium: served by the frontend at /playground/ (``/`` redirects),
every tab opens without a script error, the tab lists come from /v1/models."""
from __future__ import annotations

import pytest

from tests.helpers.playground import open_tab

pytestmark = pytest.mark.e2e

TABS = ["speech", "chat", "voices", "images", "video", "realtime", "server"]


def test_root_redirects_to_the_page_and_every_tab_opens(page, stack):
    response = page.goto("/")
    assert response is not None and response.ok
    page.wait_for_selector("#tab-speech:not([hidden])")
    assert page.url.endswith("/playground/#speech"), page.url
    assert "script-src 'self'" in response.headers["content-security-policy"]
    for tab in TABS:
        page.click(f"nav button[data-tab={tab}]")
        page.wait_for_selector(f"#tab-{tab}:not([hidden])")
        assert page.get_attribute(f"nav button[data-tab={tab}]", "aria-selected") == "true"
    page.wait_for_selector("#server-state.ok")
    assert not page.errors, page.errors


def test_a_tab_opens_from_the_url_fragment(page, stack):
    open_tab(page, "images")
    assert page.is_hidden("#tab-speech")
