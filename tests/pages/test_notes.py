"""Notes page under AppTest: health, filters, search, timeline, add, remove, prompt preview, escaping."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import col, delete, select
from streamlit.testing.v1 import AppTest

from lib import counters, notes
from lib.config import reset_settings
from lib.db import session_scope
from lib.models import NOTE_TYPES, SessionNote, utcnow
from tests.pages.conftest import APPTEST_TIMEOUT, ROOT
from tests.pages.figures import figure_titled

PAGE = "pages/notes.py"
HOSTILE = "<script>alert(1)</script> [x](javascript:alert(1)) **bold**"


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    notes.invalidate_notes_cache()


@pytest.fixture
def open_tab() -> Any:
    """Open the page on one tab, as a reviewer who clicked it (only the open tab runs)."""

    def _open(tab: str, *, reviewer: str | None = None) -> AppTest:
        at = AppTest.from_file(str(ROOT / PAGE), default_timeout=APPTEST_TIMEOUT)
        at.session_state["notes_tab"] = tab
        if reviewer:
            at.session_state["sidebar_reviewer"] = reviewer
        return at.run()

    return _open


def put(engine: Engine, **fields: Any) -> SessionNote:
    fields.setdefault("language", "en")
    fields.setdefault("note_type", "TIP")
    fields.setdefault("content", "a note")
    fields.setdefault("session_id", "20251108_143022_12345_789")
    with session_scope(engine) as s:
        return notes.add_note(session=s, **fields)


@pytest.fixture
def seeded(app_engine: Engine) -> Engine:
    now = utcnow()
    put(app_engine, content="english tip", session_id="run_a", timestamp=now - timedelta(days=40))
    put(app_engine, content="universal failure 100%", note_type="FAILURE", language="", session_id="run_a",
        timestamp=now - timedelta(days=2))  # fmt: skip
    put(app_engine, content="turkish pattern", note_type="PATTERN", language="tr", session_id="run_b",
        timestamp=now - timedelta(hours=3))  # fmt: skip
    put(
        app_engine,
        content="turkish tip",
        language="tr",
        session_id="run_b",
        timestamp=now - timedelta(hours=1),
    )
    return app_engine


def listed(at: AppTest) -> list[str]:
    """The note list's contents (AppTest exposes no dataframe keys, so the table is told by its columns)."""
    table = next((d.value for d in at.dataframe if "content" in d.value.columns), None)
    return [] if table is None else list(table["content"])


def rows(engine: Engine) -> list[SessionNote]:
    with session_scope(engine, read_only=True) as s:
        return list(s.exec(select(SessionNote).order_by(SessionNote.id)).all())


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def confirm_box(at: AppTest):  # type: ignore[no-untyped-def]
    return next(c for c in at.checkbox if c.key.startswith("notes_remove_confirm_"))


# --------------------------------------------------------------------------------------------
# Reading


def test_empty_database_explains_itself(app_engine, open_page, open_tab) -> None:
    at = open_page(PAGE)
    assert metric(at, "Notes") == "0" and metric(at, "Latest note") == "—"
    assert "No notes match these filters." in [i.value for i in at.info]
    assert not at.get("download_button")  # nothing to download
    at = open_tab("Timeline")
    assert "No sessions have notes matching these filters." in [i.value for i in at.info]
    at = open_tab("Prompt preview")
    infos = [i.value for i in at.info]
    assert "No relevant notes: this section of the judge prompt is empty for this language." in infos
    assert not at.exception


def test_health_metrics(seeded, open_page) -> None:
    at = open_page(PAGE)
    assert (metric(at, "Notes"), metric(at, "Sessions")) == ("4", "2")
    assert metric(at, "Latest note").endswith("UTC")
    assert not at.exception


def test_list_shows_every_note_newest_first(seeded, open_page) -> None:
    at = open_page(PAGE)
    assert listed(at) == ["turkish tip", "turkish pattern", "universal failure 100%", "english tip"]
    assert not at.exception


@pytest.mark.parametrize(
    ("widget", "key", "value", "expected"),
    [
        ("multiselect", "notes_types", ["PATTERN", "FAILURE"], ["turkish pattern", "universal failure 100%"]),
        ("selectbox", "notes_language", "tr", ["turkish tip", "turkish pattern"]),
        ("selectbox", "notes_language", "", ["universal failure 100%"]),
        ("selectbox", "notes_session", "run_a", ["universal failure 100%", "english tip"]),
        ("selectbox", "notes_age", "Last 24 hours", ["turkish tip", "turkish pattern"]),
        ("selectbox", "notes_age", "Older than 30 days", ["english tip"]),
        ("text_input", "notes_query", "TURKISH", ["turkish tip", "turkish pattern"]),
        ("text_input", "notes_query", "100%", ["universal failure 100%"]),
        ("text_input", "notes_query", "_", []),
    ],
)
def test_filters_narrow_the_list(
    seeded, open_page, widget: str, key: str, value: Any, expected: list[str]
) -> None:
    at = open_page(PAGE)
    getattr(at, widget)(key=key).set_value(value).run()
    assert listed(at) == expected
    if not expected:
        assert "No notes match these filters." in [i.value for i in at.info]
    assert not at.exception


def test_session_link_opens_that_session(seeded, open_page) -> None:
    at = open_page(PAGE, query={"session": "run_b"})
    assert at.selectbox(key="notes_session").value == "run_b"
    assert listed(at) == ["turkish tip", "turkish pattern"]
    assert not at.exception


def test_timeline_groups_by_session_newest_first(seeded, open_tab) -> None:
    at = open_tab("Timeline")
    timeline = next(d.value for d in at.dataframe if "first_note" in d.value.columns)
    assert list(timeline["session_id"]) == ["run_b", "run_a"]
    assert timeline.iloc[0][["notes", "TIP", "PATTERN", "FAILURE"]].tolist() == [2, 1, 1, 0]
    assert not at.exception


def test_timeline_draws_sessions_on_a_time_axis_and_notes_as_marks_by_type(seeded, open_tab) -> None:
    at = open_tab("Timeline")
    chart = figure_titled(at, "Sessions and their notes")
    assert chart["layout"]["yaxis"]["ticktext"] == ["run_a · 2 notes", "run_b · 2 notes"]  # newest on top
    assert chart["layout"]["xaxis"]["type"] == "date"
    marks = {t["name"]: len(t["x"]) for t in chart["data"] if t["mode"] == "markers"}
    assert marks == {"❌ FAILURE": 1, "🔍 PATTERN": 1, "💭 TIP": 2}
    at.multiselect(key="notes_types").set_value(["TIP"]).run()  # the page's filters apply to the marks
    chart = figure_titled(at, "Sessions and their notes")
    assert {t["name"]: len(t["x"]) for t in chart["data"] if t["mode"] == "markers"} == {"💭 TIP": 2}
    assert not at.exception


def test_timeline_hover_shows_the_note_text_escaped(app_engine, open_tab) -> None:
    put(app_engine, content=HOSTILE, note_type="STRATEGY")
    at = open_tab("Timeline")
    chart = figure_titled(at, "Sessions and their notes")
    (mark,) = [t for t in chart["data"] if t["mode"] == "markers"]
    excerpt = mark["customdata"][0][2]
    assert "<script>" not in excerpt and "&lt;script&gt;" in excerpt
    assert not at.exception


def test_note_types_are_offered_with_their_icons(seeded, open_page) -> None:
    at = open_page(PAGE)
    assert at.multiselect(key="notes_types").options == [notes.note_type_label(t) for t in NOTE_TYPES]
    assert at.multiselect(key="notes_types").options[0] == "✅ SUCCESS"
    listed_types = next(d.value for d in at.dataframe if "content" in d.value.columns)["note_type"]
    assert set(listed_types) == {"💭 TIP", "🔍 PATTERN", "❌ FAILURE"}
    assert not at.exception


def test_list_is_paginated(app_engine, open_page, monkeypatch) -> None:
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "3")
    reset_settings()
    now = utcnow()
    for i in range(7):
        put(app_engine, content=f"n{i}", timestamp=now - timedelta(minutes=i))
    at = open_page(PAGE)
    assert listed(at) == ["n0", "n1", "n2"]
    at.number_input(key="notes_page").set_value(3).run()
    assert listed(at) == ["n6"]
    at.multiselect(key="notes_types").set_value(["TIP"]).run()  # new filters: back to page 1
    assert listed(at) == ["n0", "n1", "n2"]
    assert not at.exception


def test_the_session_menu_names_the_sessions_of_the_latest_notes(seeded, open_page, monkeypatch) -> None:
    monkeypatch.setattr(notes, "RECENT_SESSIONS_WINDOW", 1)  # the newest note only
    at = open_page(PAGE)
    assert at.selectbox(key="notes_session").options == ["(any)", "run_b"]
    at = open_page(PAGE, query={"session": "run_a"})  # an older session still opens by link
    assert listed(at) == ["universal failure 100%", "english tip"]
    assert not at.exception


def test_only_the_open_tab_runs(seeded, open_page, open_tab) -> None:
    at = open_page(PAGE)
    assert listed(at) and not at.get("plotly_chart") and not at.code  # timeline and prompt not built
    at = open_tab("Timeline")
    assert at.get("plotly_chart") and not listed(at)
    assert not at.exception


def switch(at: AppTest, tab: str) -> AppTest:
    """Open another tab, as a click on it does (the page reruns with only that tab drawn)."""
    at.session_state["notes_tab"] = tab
    return at.run()


def test_switching_tabs_keeps_what_the_reviewer_typed_and_chose(app_engine, open_page, monkeypatch) -> None:
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "2")
    reset_settings()
    now = utcnow()
    for i in range(7):
        put(app_engine, content=f"n{i}", session_id=f"run_{i}", timestamp=now - timedelta(minutes=i))
    at = open_page(PAGE, reviewer="ayse")
    at.button(key="notes_page_next").click().run()
    assert listed(at) == ["n2", "n3"]
    switch(at, "Timeline")
    at.button(key="notes_timeline_page_next").click().run()
    switch(at, "Add a note")
    at.text_area(key="notes_add_content").set_value("half-written draft")
    at.text_input(key="notes_add_language").set_value("tr")
    at.text_input(key="notes_add_code").set_value("P-1")
    at.number_input(key="notes_add_confidence").set_value(0.7).run()
    switch(at, "Remove")
    at.multiselect(key="notes_remove_types").set_value(["TIP"])
    at.selectbox(key="notes_remove_language").set_value("en")
    at.text_input(key="notes_remove_age").set_value("30d").run()
    for tab in ("Prompt preview", "Notes"):
        switch(at, tab)
    assert at.number_input(key="notes_page").value == 2 and listed(at) == ["n2", "n3"]
    switch(at, "Timeline")
    assert at.number_input(key="notes_timeline_page").value == 2
    assert any(c.value.startswith("Showing the latest sessions 3–4 of 7") for c in at.caption)
    switch(at, "Add a note")
    assert at.text_area(key="notes_add_content").value == "half-written draft"
    assert at.text_input(key="notes_add_language").value == "tr"
    assert at.text_input(key="notes_add_code").value == "P-1"
    assert at.number_input(key="notes_add_confidence").value == 0.7
    switch(at, "Remove")
    assert at.multiselect(key="notes_remove_types").value == ["TIP"]
    assert at.selectbox(key="notes_remove_language").value == "en"
    assert at.text_input(key="notes_remove_age").value == "30d"
    assert not at.exception and not at.warning


def _three_sessions_two_a_page(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_new, run_mid and run_old, one note each a day apart, with timeline pages of two sessions."""
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "2")
    reset_settings()
    now = utcnow()
    for age, sid in enumerate(["run_new", "run_mid", "run_old"]):
        put(engine, content=f"from {sid}", session_id=sid, timestamp=now - timedelta(days=age))


def test_timeline_shows_the_latest_sessions_and_pages_further_back(
    any_app_engine, open_tab, monkeypatch
) -> None:
    _three_sessions_two_a_page(any_app_engine, monkeypatch)
    at = open_tab("Timeline")
    assert (
        "Showing the latest sessions 1–2 of 3 (newest activity first); page back to look further back."
        in [c.value for c in at.caption]
    )
    ticks = figure_titled(at, "Sessions and their notes")["layout"]["yaxis"]["ticktext"]
    assert ticks == ["run_mid · 1 note", "run_new · 1 note"]
    at.button(key="notes_timeline_page_next").click().run()
    assert any(c.value.startswith("Showing the latest sessions 3–3 of 3") for c in at.caption)
    ticks = figure_titled(at, "Sessions and their notes")["layout"]["yaxis"]["ticktext"]
    assert ticks == ["run_old · 1 note"]
    assert not at.exception


def test_session_counts_over_the_cap_say_so(app_engine, open_page, monkeypatch) -> None:
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "1")
    reset_settings()
    for sid in ("run_a", "run_b", "run_c"):
        put(app_engine, content=f"from {sid}", session_id=sid)
    monkeypatch.setattr(notes, "SESSION_COUNT_CAP", 1)  # the health metric's cap, and its labels'
    monkeypatch.setattr(notes, "count_sessions", functools.partial(notes.count_sessions, cap=1))
    at = open_page(PAGE)
    assert [m.value for m in at.metric if m.label == "Sessions"] == ["1+"]
    assert metric(at, "Notes") == "3"
    switch(at, "Timeline")
    assert any(c.value.startswith("Showing the latest sessions 1–1 of 1+") for c in at.caption)
    at.button(key="notes_timeline_page_next").click().run()  # a capped count pages on past the cap
    assert any(c.value.startswith("Showing the latest sessions 2–2 of 1+") for c in at.caption)
    assert not at.exception


def test_note_counts_over_the_cap_say_so(seeded, open_page, monkeypatch) -> None:
    """The list counts to a cap as the Evaluations list does ("1+", with a text its own cap) and
    pages on past it; the Notes figure stops at its cap too."""
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "1")
    reset_settings()
    monkeypatch.setattr(counters, "COUNT_CAP", 1)
    at = open_page(PAGE)
    assert metric(at, "Notes") == "1+"
    assert "1+ notes match" in [c.value for c in at.caption]
    assert at.number_input(key="notes_page").max == 2  # one page past the current one, not 4
    assert listed(at) == ["turkish tip"]
    at.button(key="notes_page_next").click().run()
    at.button(key="notes_page_next").click().run()
    assert listed(at) == ["universal failure 100%"]  # page 3 of "2+"
    monkeypatch.setattr(counters, "TEXT_COUNT_CAP", 1)
    at.text_input(key="notes_query").set_value("turkish").run()
    assert "1+ notes match" in [c.value for c in at.caption] and listed(at) == ["turkish tip"]
    assert [b.proto.label for b in at.get("download_button")] == ["Download CSV (all 1+ matches)"]
    assert not at.exception


def test_a_page_past_the_last_match_of_a_capped_count_says_it_is_empty(
    app_engine, open_page, monkeypatch
) -> None:
    """A capped count ("1+") offers one page more than it knows; past the last match the list says
    so, as the Evaluations list does, and still offers every match as CSV."""
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "1")
    reset_settings()
    monkeypatch.setattr(counters, "COUNT_CAP", 1)
    now = utcnow()
    for i in range(2):
        put(app_engine, content=f"n{i}", timestamp=now - timedelta(minutes=i))
    at = open_page(PAGE)
    at.button(key="notes_page_next").click().run()
    assert listed(at) == ["n1"] and "This page is empty." not in [i.value for i in at.info]
    at.button(key="notes_page_next").click().run()  # page 3 of "1+": nothing there
    assert listed(at) == []
    assert "This page is empty." in [i.value for i in at.info]
    assert [b.proto.label for b in at.get("download_button")] == ["Download CSV (all 1+ matches)"]
    assert not at.exception


def test_timeline_page_emptied_meanwhile_says_so(any_app_engine, open_tab, monkeypatch) -> None:
    if any_app_engine.dialect.name == "sqlite":  # one read transaction, one snapshot: count and page agree
        pytest.skip("SQLite reads the count and the page from one snapshot")
    app_engine = any_app_engine
    _three_sessions_two_a_page(app_engine, monkeypatch)
    at = open_tab("Timeline")
    counted = notes.count_sessions

    def count_then_removed(**kwargs: Any) -> int:  # another reviewer removes run_old's notes meanwhile
        total = counted(**kwargs)
        with session_scope(app_engine) as s:
            s.exec(delete(SessionNote).where(col(SessionNote.session_id) == "run_old"))
        return total

    monkeypatch.setattr(notes, "count_sessions", count_then_removed)
    at.button(key="notes_timeline_page_next").click().run()
    assert not any(c.value.startswith("Showing the latest sessions") for c in at.caption)
    assert [i.value for i in at.info] == [
        "No sessions left on page 2: their notes were removed meanwhile. Go back a page or reload."
    ]
    assert not at.get("plotly_chart") and not at.exception


def test_download_offers_every_match_not_just_the_page(any_app_engine, open_page, monkeypatch) -> None:
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "3")
    reset_settings()
    for i in range(7):
        put(any_app_engine, content=f"n{i}")
    at = open_page(PAGE)
    assert len(listed(at)) == 3
    assert [b.proto.label for b in at.get("download_button")] == ["Download CSV (all 7 matches)"]
    at.multiselect(key="notes_types").set_value(["FAILURE"]).run()
    assert not at.get("download_button")  # nothing matches: nothing to download
    assert not at.exception


def test_download_link_streams_every_matching_note(
    any_app_engine, open_page, monkeypatch, download_client
) -> None:
    import csv
    import io

    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "2")
    reset_settings()
    now = utcnow()
    for i in range(5):
        put(
            any_app_engine,
            content=f"n{i}",
            language="tr" if i % 2 else "en",
            timestamp=now - timedelta(minutes=i),
        )
    at = open_page(PAGE)
    at.selectbox(key="notes_language").set_value("en").run()
    [link] = at.get("link_button")
    assert link.proto.label == "Download CSV (all 3 matches)"
    response = download_client.get(link.proto.url)
    assert response.status_code == 200
    assert [r["content"] for r in csv.DictReader(io.StringIO(response.text))] == ["n0", "n2", "n4"]
    assert not at.exception


def test_hostile_note_is_shown_as_text_only(app_engine, open_page, open_tab) -> None:
    put(app_engine, content=HOSTILE, note_type="STRATEGY")
    at = open_page(PAGE)
    assert listed(at) == [HOSTILE]
    prompt = open_tab("Prompt preview")
    assert HOSTILE in prompt.code[0].value
    for shown in (at, prompt):
        rendered = [e.value for kind in ("markdown", "caption", "info", "success", "warning", "error")
                    for e in getattr(shown, kind)]  # fmt: skip
        assert not any("<script>" in text or "](javascript:" in text for text in rendered)
        assert not shown.exception


# --------------------------------------------------------------------------------------------
# Adding


def test_adding_needs_a_reviewer(app_engine, open_tab) -> None:
    at = open_tab("Add a note")
    assert at.button(key="notes_add_submit").disabled
    assert any("Enter your name in the sidebar to add notes" in w.value for w in at.warning)
    assert not at.exception


def test_add_note_records_the_reviewer(app_engine, open_tab) -> None:
    at = open_tab("Add a note", reviewer="ayse")
    at.selectbox(key="notes_add_type").set_value("SUCCESS")
    at.text_input(key="notes_add_language").set_value("EN")
    at.text_area(key="notes_add_content").set_value("Opening phrase decided it")
    at.text_input(key="notes_add_code").set_value("AB00123PRO")
    at.number_input(key="notes_add_confidence").set_value(0.85)
    at.button(key="notes_add_submit").click().run()
    [note] = rows(app_engine)
    assert (note.note_type, note.language, note.content, note.phelps_code, note.confidence, note.created_by) == (
        "SUCCESS", "en", "Opening phrase decided it", "AB00123PRO", 0.85, "ayse",
    )  # fmt: skip
    assert note.session_id == at.session_state["notes_session_id"]
    assert [s.value.replace("\\", "") for s in at.success] == ["Note added."]
    assert at.text_area(key="notes_add_content").value == ""
    at.session_state["notes_tab"] = "Notes"  # the reviewer opens the list: the note is there
    assert listed(at.run()) == ["Opening phrase decided it"]
    assert not at.exception


def test_notes_added_in_one_browser_session_share_a_session_id(app_engine, open_tab) -> None:
    at = open_tab("Add a note", reviewer="ayse")
    for text in ("first", "second"):
        at.text_area(key="notes_add_content").set_value(text)
        at.button(key="notes_add_submit").click().run()
    assert len({n.session_id for n in rows(app_engine)}) == 1
    assert not at.exception


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("notes_add_content", "   ", "note content is empty"),
        ("notes_add_code", "AB1", "only SUCCESS notes carry a code"),
        ("notes_add_language", "<b>x</b>", "language"),
    ],
)
def test_invalid_note_is_refused_with_the_reason(
    app_engine, open_tab, field: str, value: str, message: str
) -> None:
    at = open_tab("Add a note", reviewer="ayse")
    at.text_area(key="notes_add_content").set_value("kept text")
    widget = at.text_area(key=field) if field == "notes_add_content" else at.text_input(key=field)
    widget.set_value(value)
    at.button(key="notes_add_submit").click().run()
    assert rows(app_engine) == []
    [error] = at.error
    assert message in error.value.replace("\\", "")
    assert "<b>" not in error.value  # the reason is escaped, not rendered
    assert not at.exception


# --------------------------------------------------------------------------------------------
# Removing


def test_removal_asks_for_a_filter_first(seeded, open_tab) -> None:
    at = open_tab("Remove", reviewer="ayse")
    assert any(i.value.startswith("Choose a type, a language or an age first") for i in at.info)
    assert not [c for c in at.checkbox if c.key.startswith("notes_remove_confirm_")]
    assert not at.exception


def test_removal_previews_and_needs_confirmation(seeded, open_tab) -> None:
    at = open_tab("Remove", reviewer="ayse")
    at.selectbox(key="notes_remove_language").set_value("tr").run()
    assert metric(at, "Notes that will be removed") == "2"
    assert at.button(key="notes_remove_button").disabled
    confirm_box(at).check().run()
    assert not at.button(key="notes_remove_button").disabled
    at.button(key="notes_remove_button").click().run()
    assert sorted(n.content for n in rows(seeded)) == ["english tip", "universal failure 100%"]
    assert "Removed 2 notes." in [s.value.replace("\\", "") for s in at.success]
    assert at.selectbox(key="notes_remove_language").value == "(any)"  # "tr" has no notes left to offer
    assert not at.exception


def test_changing_the_filter_withdraws_the_confirmation(seeded, open_tab) -> None:
    at = open_tab("Remove", reviewer="ayse")
    at.selectbox(key="notes_remove_language").set_value("tr").run()
    confirm_box(at).check().run()
    at.multiselect(key="notes_remove_types").set_value(["TIP"]).run()
    assert not confirm_box(at).value
    assert at.button(key="notes_remove_button").disabled
    assert len(rows(seeded)) == 4
    assert not at.exception


def test_removal_by_age(seeded, open_tab) -> None:
    at = open_tab("Remove", reviewer="ayse")
    at.text_input(key="notes_remove_age").set_value("30d").run()
    assert metric(at, "Notes that will be removed") == "1"
    confirm_box(at).check().run()
    at.button(key="notes_remove_button").click().run()
    assert "english tip" not in [n.content for n in rows(seeded)] and len(rows(seeded)) == 3
    assert not at.exception


def test_invalid_age_is_explained(seeded, open_tab) -> None:
    at = open_tab("Remove", reviewer="ayse")
    at.text_input(key="notes_remove_age").set_value("30x").run()
    assert any("invalid age" in w.value for w in at.warning)
    assert not [c for c in at.checkbox if c.key.startswith("notes_remove_confirm_")]
    assert not at.exception


def test_remove_everything_needs_its_own_tick(seeded, open_tab) -> None:
    at = open_tab("Remove", reviewer="ayse")
    at.checkbox(key="notes_remove_all").check().run()
    assert metric(at, "Notes that will be removed") == "4"
    confirm_box(at).check().run()
    at.button(key="notes_remove_button").click().run()
    assert rows(seeded) == []
    assert not at.exception


def test_removal_needs_a_reviewer(seeded, open_tab) -> None:
    at = open_tab("Remove")
    at.selectbox(key="notes_remove_language").set_value("tr").run()
    assert confirm_box(at).disabled and at.button(key="notes_remove_button").disabled
    assert any("Enter your name in the sidebar to remove notes" in w.value for w in at.warning)
    assert not at.exception


# --------------------------------------------------------------------------------------------
# Prompt preview


@pytest.mark.parametrize("language", ["en", "tr", "de"])
def test_prompt_preview_is_what_the_judge_gets(seeded, open_tab, language: str) -> None:
    at = open_tab("Prompt preview")
    at.text_input(key="notes_preview_language").set_value(language).run()
    with session_scope(seeded, read_only=True) as s:
        expected = notes.relevant_notes(session=s, language=language, use_cache=False)
    block = at.code[0].value
    assert block.startswith(notes.PROMPT_HEADER) and block.endswith(notes.PROMPT_FOOTER)
    assert [line.split("): ", 1)[1].rsplit(" [SESSION", 1)[0] for line in block.splitlines()[3:-2]] == [
        n.content for n in expected
    ]
    assert not at.exception


def test_prompt_preview_follows_the_seed_rule(seeded, open_tab) -> None:
    at = open_tab("Prompt preview")
    at.text_input(key="notes_preview_language").set_value("en").run()
    block = at.code[0].value
    assert "english tip" in block and "universal failure 100%" in block and "turkish pattern" in block
    assert "turkish tip" not in block
    assert not at.exception


def test_prompt_preview_rejects_a_bad_language(seeded, open_tab) -> None:
    at = open_tab("Prompt preview")
    at.text_input(key="notes_preview_language").set_value("not a language").run()
    assert any("language" in e.value for e in at.error) and not at.code
    assert not at.exception
