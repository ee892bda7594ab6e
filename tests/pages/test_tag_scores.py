"""Tag scores page (and the shown-notes feedback widget) under AppTest: what a reviewer sees and writes."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select
from streamlit.testing.v1 import AppTest

from lib import relevance
from lib.db import session_scope
from lib.models import LessonTagRelevance, SessionNote, TagRelevanceEvent
from lib.notes import add_note
from tests.pages.conftest import APPTEST_TIMEOUT
from tests.pages.figures import figure_titled

PAGE = "pages/tag_scores.py"
SEED_TAGS = ["github", "personal", "python"]


def make_note(session: Session, content: str, note_type: str = "TIP", language: str = "en") -> int:
    note = add_note(session=session, language=language, note_type=note_type, content=content, session_id="s1")
    return int(note.id or 0)


def row(session: Session, note_id: int, tag: str, score: float, pos: int = 0, neg: int = 0) -> None:
    session.add(
        LessonTagRelevance(lesson_id=note_id, tag=tag, score=score, positive_evals=pos, negative_evals=neg)
    )


@pytest.fixture
def scored(app_engine: Engine) -> dict[str, int]:
    """The seed's example lesson, a helpful PATTERN note, and the latest run's audit with the seed's tags."""
    with session_scope(app_engine) as session:
        lesson = make_note(session, "Use <b>gh</b> [link](javascript:alert(1)) for PRs")
        helpful = make_note(session, "Read the rubric scale first", note_type="PATTERN", language="tr")
        row(session, lesson, "acme", 0.0, pos=1)
        row(session, lesson, "frontend", 0.0)
        row(session, lesson, "python", -0.283, neg=148)
        row(session, lesson, "github", -0.584, neg=197)
        row(session, helpful, "python", 0.9, pos=6)
        session.flush()
        relevance.apply_score(session=session, note_id=helpful, tags=["python"], raw=1.0)
        relevance.record_audit(
            session=session, session_id="run-1", shown_note_ids=[lesson, helpful], env_tags=SEED_TAGS
        )
    return {"lesson": lesson, "helpful": helpful}


def table(at: AppTest, column: str) -> pd.DataFrame:
    """The table holding `column` (AppTest exposes no dataframe keys, so tables are told by their columns)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_empty_database_says_where_scores_come_from(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    at = open_page(PAGE)
    assert any("No tag scores yet" in i.value for i in at.info)
    assert not at.get("plotly_chart")
    assert not at.exception


def test_heatmap_and_table_show_every_scored_note_and_tag(scored: dict[str, int], open_page) -> None:
    at = open_page(PAGE)
    shown = table(at, "positive_evals")
    assert sorted(set(shown["note_id"])) == sorted(scored.values())
    assert len(shown) == 5
    assert len(at.get("plotly_chart")) == 2  # heatmap and EMA history
    assert not at.exception


@pytest.mark.parametrize(
    ("widget", "value", "expected"),
    [("tag_scores_type", "PATTERN", "helpful"), ("tag_scores_language", "tr", "helpful")],
)
def test_filters_narrow_the_scores(
    scored: dict[str, int], open_page, widget: str, value: str, expected: str
) -> None:
    at = open_page(PAGE)
    at.selectbox(key=widget).set_value(value).run()
    assert set(table(at, "positive_evals")["note_id"]) == {scored[expected]}
    assert not at.exception


def test_tag_filter_keeps_only_those_tags(scored: dict[str, int], open_page) -> None:
    at = open_page(PAGE)
    at.multiselect(key="tag_scores_tags").set_value(["github"]).run()
    assert set(table(at, "positive_evals")["tag"]) == {"github"}
    assert not at.exception


def test_explainer_starts_from_the_latest_runs_tags_and_spells_out_the_arithmetic(
    scored: dict[str, int], open_page
) -> None:
    at = open_page(PAGE)
    assert at.multiselect(key="tag_scores_explain_tags").value == SEED_TAGS
    assert metric(at, "filtered out") == "1"
    assert metric(at, "shown, boosted") == "1"
    at.selectbox(key="tag_scores_explain_note").set_value(scored["lesson"]).run()
    code = at.code[0].value
    assert "avg = -0.867 / 3 = -0.289" in code
    assert "345 ≥ 3 and -0.289 < -0.1 → FILTERED OUT" in code
    assert any("filtered out" in m.value for m in at.markdown)
    assert not at.exception


def test_explainer_shows_exploration_for_little_evidence(scored: dict[str, int], open_page) -> None:
    at = open_page(PAGE)
    at.multiselect(key="tag_scores_explain_tags").set_value(["acme", "frontend"]).run()
    explained = table(at, "arithmetic").set_index("note_id")
    assert explained.loc[scored["lesson"], "decision"] == "neutral"
    at.selectbox(key="tag_scores_explain_note").set_value(scored["lesson"]).run()
    assert "passes (exploration)" in at.code[0].value
    assert not at.exception


def test_explainer_without_tags_asks_for_some(scored: dict[str, int], open_page) -> None:
    at = open_page(PAGE)
    at.multiselect(key="tag_scores_explain_tags").set_value([]).run()
    assert any("Pick at least one env tag" in i.value for i in at.info)
    assert not at.exception


def test_history_of_the_chosen_note_counts_its_applied_scores(scored: dict[str, int], open_page) -> None:
    at = open_page(PAGE)
    at.selectbox(key="tag_scores_history_note").set_value(scored["helpful"]).run()
    assert any("1 scores applied" in c.value for c in at.caption)
    assert not at.exception


def test_csv_downloads_are_offered_for_scores_history_and_explainer(
    scored: dict[str, int], open_page
) -> None:
    at = open_page(PAGE)
    labels = {b.proto.label for b in at.get("download_button")}
    assert {"Download scores (CSV)", "Download history (CSV)", "Download (CSV)"} <= labels
    assert not at.exception


def test_manual_pin_records_the_reviewer(scored: dict[str, int], app_engine: Engine, open_page) -> None:
    at = open_page(PAGE, reviewer="ayse")
    at.number_input(key="tag_scores_pin_note").set_value(scored["lesson"]).run()
    at.button(key="tag_scores_pin_pin").click().run()
    with Session(app_engine) as session:
        note = session.get(SessionNote, scored["lesson"])
        assert note is not None
        assert (note.pinned, note.auto_pinned, note.prerequisites["pinned_by"]) == (True, False, "ayse")
    pins = table(at, "pin_tags").set_index("note_id")["pin"]
    assert (pins[scored["lesson"]], pins[scored["helpful"]]) == ("manual", "auto (relevance)")
    assert any("pinned by ayse" in s.value for s in at.success)
    assert not at.exception


def test_pin_buttons_wait_for_a_reviewer_name(scored: dict[str, int], open_page) -> None:
    at = open_page(PAGE)
    assert at.button(key="tag_scores_pin_pin").disabled
    assert not at.exception


# --------------------------------------------------------------------------------------------
# The "notes shown to this judge run" widget on an evaluation


def feedback_app(snapshot_id: str) -> None:
    from lib.ui import reviewer_sidebar
    from lib.ui.relevance import shown_notes_feedback

    reviewer_sidebar()
    shown_notes_feedback(snapshot_id, key="fb")


@pytest.fixture
def shown(app_engine: Engine) -> int:
    with session_scope(app_engine) as session:
        note_id = make_note(session, "**Bold** <script>x</script> tip")
        relevance.record_audit(
            session=session,
            session_id="snap_1",
            shown_note_ids=[note_id],
            env_tags=["lang:en"],
            snapshot_id="snap_1",
        )
    return note_id


def open_feedback(reviewer: str | None = None) -> AppTest:
    at = AppTest.from_function(feedback_app, args=("snap_1",), default_timeout=APPTEST_TIMEOUT)
    if reviewer:
        at.session_state["sidebar_reviewer"] = reviewer
    return at.run()


def test_marking_a_shown_note_useful_scores_it_with_weight_two(shown: int, app_engine: Engine) -> None:
    at = open_feedback("ayse")
    at.button(key=f"fb_snap_1_{shown}_useful").click().run()
    with Session(app_engine) as session:
        event = session.exec(select(TagRelevanceEvent)).one()
    assert (event.lesson_id, event.raw_score, event.weight, event.reviewer) == (shown, 1.0, 2.0, "ayse")
    assert any("was useful here" in s.value for s in at.success)
    assert any("👍 useful" in m.value for m in at.markdown)
    assert not at.exception


def test_feedback_buttons_wait_for_a_reviewer_name(shown: int) -> None:
    at = open_feedback()
    assert at.button(key=f"fb_snap_1_{shown}_not_useful").disabled
    assert any("Enter your name" in w.value for w in at.warning)
    assert not at.exception


def test_shown_note_text_is_escaped(shown: int) -> None:
    at = open_feedback("ayse")
    note_line = next(m.value for m in at.markdown if "tip" in m.value)
    assert "\\*\\*Bold\\*\\*" in note_line and "\\<script\\>" in note_line
    assert not at.exception


def test_an_evaluation_without_shown_notes_says_so(app_engine: Engine) -> None:
    at = open_feedback("ayse")
    assert any("showed no cross-session notes" in c.value for c in at.caption)
    assert not at.exception


def test_a_lead_gives_an_abandoned_audit_its_retries_back(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    with session_scope(app_engine) as session:
        note_id = make_note(session, "Read the rubric scale first")
        relevance.record_audit(
            session=session, session_id="run-x", shown_note_ids=[note_id], env_tags=["python"]
        )
        for _ in range(relevance.MAX_EVALUATION_RETRIES):
            relevance.mark_failed(session=session, audit_session_id="run-x")
    at = open_page(PAGE, reviewer="lead")
    assert at.selectbox(key="tag_scores_abandoned_audit").value == "run-x"
    at.button(key="tag_scores_reset_retries").click().run()
    assert not at.exception
    assert any("will be evaluated again" in s.value for s in at.success)
    with Session(app_engine) as session:
        assert relevance.abandoned_audits(session=session) == []
        assert [a.session_id for a in relevance.unprocessed_audits(session=session)] == ["run-x"]
    assert not at.get("expander")


def test_history_has_a_panel_per_tag_kind_and_the_tag_picker_narrows_it(
    scored: dict[str, int], app_engine: Engine, open_page
) -> None:
    tags = ["lang:tr", "lang:en", "metric:clarity", "model:m1"]
    with session_scope(app_engine) as session:
        relevance.apply_score(session=session, note_id=scored["helpful"], tags=tags, raw=1.0)
        relevance.apply_score(session=session, note_id=scored["helpful"], tags=["lang:tr"], raw=-1.0)
    at = open_page(PAGE)
    at.selectbox(key="tag_scores_history_note").set_value(scored["helpful"]).run()
    history = figure_titled(at, "EMA history per tag")
    assert [a["text"] for a in history["layout"]["annotations"]] == ["lang", "metric", "model", "other"]
    assert sorted(t["name"] for t in history["data"]) == sorted([*tags, "python"])
    picker = at.multiselect(key=f"tag_scores_history_tags_{scored['helpful']}")
    assert picker.options[0] == "lang:tr"  # the most evaluated first
    picker.set_value(["lang:tr", "model:m1"]).run()
    history = figure_titled(at, "EMA history per tag")
    assert sorted(t["name"] for t in history["data"]) == ["lang:tr", "model:m1"]
    assert [a["text"] for a in history["layout"]["annotations"]] == ["lang", "model"]
    assert not at.exception


def test_note_types_are_shown_with_their_icons(scored: dict[str, int], open_page) -> None:
    at = open_page(PAGE)
    assert set(table(at, "positive_evals")["note_type"]) == {"💭 TIP", "🔍 PATTERN"}
    assert at.selectbox(key="tag_scores_type").options[1:] == [
        "✅ SUCCESS", "❌ FAILURE", "🔍 PATTERN", "💡 STRATEGY", "💭 TIP"
    ]  # fmt: skip
    assert not at.exception
