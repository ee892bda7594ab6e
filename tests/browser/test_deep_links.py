"""Deep links on a freshly started server go through the router (sidebar, reviewer name, titles)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from lib.db import init_db
from tests.browser.conftest import settle

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("path", ["review", "notes", "coach"])
def test_first_request_to_a_deep_link_has_the_router(streamlit_app, page, tmp_path, path: str) -> None:
    url = f"sqlite:///{tmp_path / 'deep.db'}"
    init_db(url).dispose()
    server = streamlit_app(url)
    page.goto(f"{server.base_url}/{path}")
    settle(page)
    expect(page.get_by_text("Your name (recorded with every change)")).to_be_visible()
    nav = page.get_by_test_id("stSidebarNav").inner_text()
    assert "Review queue" in nav and "Tag scores" in nav
    assert "app" not in nav.split()
