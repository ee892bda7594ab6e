"""The alignment lab in a real browser: start a small experiment, watch it finish, see the comparison."""

from __future__ import annotations

import contextlib

import pytest
from playwright.sync_api import Error as PlaywrightError

from lib.db import init_db
from tests.test_alignment import scripted_judge, seed_lab

pytestmark = pytest.mark.browser


def test_start_a_small_experiment_and_see_the_comparison(streamlit_app, page, tmp_path, llm_server) -> None:
    url = f"sqlite:///{tmp_path / 'align.db'}"
    engine = init_db(url)
    seed_lab(engine)
    engine.dispose()
    llm_server.responder = scripted_judge
    server = streamlit_app(url, OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="test")

    page.goto(f"{server.base_url}/alignment")
    try:
        page.get_by_text("Your name (recorded with every change)").wait_for(timeout=30_000)
        name = page.get_by_label("Your name (recorded with every change)")
        name.fill("lena")
        name.press("Enter")
        size = page.get_by_label("Sample size")
        size.fill("14")
        size.press("Enter")
        page.get_by_role("button", name="Start").click()
        page.get_by_text("Experiment 1 started.").wait_for(timeout=30_000)
        for _ in range(240):  # the run is a background thread: refresh until its rows say finished
            if page.get_by_text("(finished)").count():
                break
            # While a rerun replaces the page, the old button can still stand beside the new one.
            refresh = page.locator(".st-key-alignment_refresh button")
            if refresh.count():
                with contextlib.suppress(PlaywrightError):  # the stale one, gone before the click
                    refresh.first.click(timeout=5_000)
            page.wait_for_timeout(500)
        page.get_by_text("28 calls done, 0 failed, 0 pending").wait_for(timeout=120_000)
        page.get_by_role("heading", name="Comparison").wait_for(timeout=30_000)
        page.get_by_text("Against bare: flipped items").wait_for(timeout=30_000)
        assert not page.dialogs
        # The Analytics page links the latest experiment of each product back here.
        page.goto(f"{server.base_url}/analytics")
        link = page.get_by_role("link", name="Latest alignment experiment for lab (#1)")
        link.wait_for(timeout=60_000)
        link.click()
        page.wait_for_url("**/alignment?experiment=1", timeout=30_000)
        page.get_by_role("heading", name="Comparison").wait_for(timeout=30_000)
    except Exception:
        page.screenshot(path=str(tmp_path / "alignment_fail.png"), full_page=True)
        print("log:", server.log_path.read_text()[-3000:])
        raise
