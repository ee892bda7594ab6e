"""The Notes timeline in Chromium: plotly renders HTML in hover boxes, so a note's text must arrive
escaped. Hovering a hostile note's mark shows its markup as text and runs nothing."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from lib.db import init_db, session_scope
from lib.notes import add_note
from tests.browser.conftest import settle

pytestmark = pytest.mark.browser

HOSTILE = '<img src=x onerror="alert(1)"><b>bold</b>'


def test_hovering_a_note_mark_shows_its_text_literally(streamlit_app, page, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'timeline.db'}"
    engine = init_db(url)
    with session_scope(engine) as session:
        add_note(session=session, language="en", note_type="STRATEGY", content=HOSTILE, session_id="run_x")
    engine.dispose()
    server = streamlit_app(url)
    try:
        page.goto(f"{server.base_url}/notes")
        settle(page)
        page.get_by_role("tab", name="Timeline").click()
        settle(page)
        chart = page.get_by_test_id("stPlotlyChart").filter(has_text="Sessions and their notes")
        mark = chart.locator(".scatterlayer .trace .points path").last
        # Plotly draws the marks first and binds hover to its drag layer after: wait for that layer.
        chart.locator(".draglayer .nsewdrag").first.wait_for(state="attached")
        mark.hover(force=True)
        hover = chart.locator(".hoverlayer")
        expect(hover).to_contain_text("onerror")
        text = hover.text_content() or ""
        assert "<img src=x" in text and "<b>bold</b>" in text  # shown as typed, not rendered
        assert "💡 STRATEGY" in text
        assert hover.locator("img").count() == 0 and hover.locator("b").filter(has_text="bold").count() == 0
        assert page.dialogs == []  # type: ignore[attr-defined]
    except Exception:
        page.screenshot(path=str(tmp_path / "timeline_failure.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise
