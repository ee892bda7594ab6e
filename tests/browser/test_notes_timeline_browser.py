"""The Notes timeline in Chromium: plotly renders HTML in hover boxes, so a note's text must arrive
escaped. Hovering a hostile note's mark shows its markup as text and runs nothing."""

from __future__ import annotations

import time

import pytest

from lib.db import init_db, session_scope
from lib.notes import add_note

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
        page.goto(server.base_url)  # the router first: a fresh server serves deep links without it
        page.get_by_text("Your name (recorded with every change)").wait_for(timeout=30_000)
        page.goto(f"{server.base_url}/notes")
        page.get_by_role("tab", name="Timeline").click()
        chart = page.get_by_test_id("stPlotlyChart").filter(has_text="Sessions and their notes")
        mark = chart.locator(".scatterlayer .trace .points path").last
        mark.wait_for(timeout=120_000)
        hover = chart.locator(".hoverlayer")
        text = ""
        deadline = time.monotonic() + 90  # the shared CI machine can be slow to bind plotly's events
        while "onerror" not in text and time.monotonic() < deadline:
            page.mouse.move(0, 0)  # a hover before plotly has bound its events shows nothing: retry
            mark.hover(force=True)
            text = hover.text_content() or ""
            if "onerror" not in text:
                page.wait_for_timeout(500)
        assert "<img src=x" in text and "<b>bold</b>" in text  # shown as typed, not rendered
        assert "💡 STRATEGY" in text
        assert hover.locator("img").count() == 0 and hover.locator("b").filter(has_text="bold").count() == 0
        assert page.dialogs == []  # type: ignore[attr-defined]
    except Exception:
        page.screenshot(path=str(tmp_path / "timeline_failure.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise
