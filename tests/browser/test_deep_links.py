"""Deep links on a freshly started server go through the router (sidebar, reviewer name, titles).

Streamlit settles once per process whether `pages/` means its old file-based mode (lib/ui/server.py
settles it before the server starts), so what can go wrong is the first request a server gets,
whichever page it names: one fresh server answers a deep link first, then the other deep links each
open a session of their own on it.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from lib.db import init_db
from tests.browser.conftest import new_app_context, settle

pytestmark = pytest.mark.browser


def _has_the_router(page) -> None:  # type: ignore[no-untyped-def]
    expect(page.get_by_text("Your name (recorded with every change)")).to_be_visible()
    nav = page.get_by_test_id("stSidebarNav").inner_text()
    assert "Review queue" in nav and "Tag scores" in nav
    assert "app" not in nav.split()


def test_first_request_to_a_deep_link_has_the_router(streamlit_app, browser, page, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'deep.db'}"
    init_db(url).dispose()
    server = streamlit_app(url)
    page.goto(f"{server.base_url}/review")  # the server's first request
    settle(page)
    _has_the_router(page)
    for path in ("notes", "coach"):  # a new browser session's first request
        context = new_app_context(browser, viewport={"width": 1400, "height": 1000})
        try:
            other = context.new_page()
            other.goto(f"{server.base_url}/{path}")
            settle(other)
            _has_the_router(other)
        finally:
            context.close()
