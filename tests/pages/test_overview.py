"""Overview page under AppTest: what a user sees on an empty and on a filled database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from lib import overview
from lib.db import session_scope
from lib.display import page_url
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, SessionNote, utcnow
from lib.safe_markdown import escape_markdown
from tests.pages.conftest import APPTEST_TIMEOUT, ROOT


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_empty_database_shows_how_to_get_data(app_engine, open_page) -> None:
    at = open_page("pages/overview.py")
    assert not at.exception
    assert any("database is empty" in i.value for i in at.info)
    assert _metric(at, "Evaluations") == "0"
    assert _metric(at, "Corrected of reviewed") == "—"


def test_counts_come_from_the_database(app_engine, open_page) -> None:
    now = utcnow()
    with session_scope(app_engine) as s:
        s.add(
            EvaluationSnapshot(
                id="snap_a",
                question="q",
                model_answer="a",
                product="p1",
                evidence_count=4,
                evidence_highlighted=2,
                evidence_unlocated=1,
                evidence_unverified=1,
            )
        )
        s.add(
            EvaluationSnapshot(
                id="snap_b", question="q", model_answer="a", product="p2", deleted_at=now, status="archived"
            )
        )
        s.add(
            Judgment(
                change_id="snap_a:clarity",
                product="p1",
                metric="clarity",
                decision="4",
                user_decision="2",
                was_corrected=True,
                reviewed_at=now,
                reviewer="ayse",
            )
        )
        s.add(
            Judgment(
                change_id="snap_a:safety",
                product="p1",
                metric="safety",
                decision="5",
                user_decision="5",
                reviewed_at=now,
                reviewer="ayse",
            )
        )
        s.add(
            Judgment(
                change_id="snap_a:bias",
                product="p1",
                metric="bias",
                decision="5",
                second_opinion_action="validated",
            )
        )
        s.add(
            Judgment(change_id="gen:1", product="p1", decision="INCLUDE", second_opinion_action="questioned")
        )
        s.add(
            Judgment(change_id="gen:2", product="p1", decision="INCLUDE", second_opinion_action="unchanged")
        )
        s.add(
            SessionNote(
                note_type="TIP", content="<b>tip</b>", session_id="s1", timestamp=now - timedelta(hours=1)
            )
        )
    at = open_page("pages/overview.py")
    assert not at.exception
    assert _metric(at, "Evaluations") == "1"
    assert _metric(at, "Pending reviews") == "3"
    assert _metric(at, "Second-opinion agreement") == "50%"
    assert _metric(at, "Corrected of reviewed") == "50%"
    assert _metric(at, "Agreement rate") == "50%"
    assert _metric(at, "Evidence verified") == "75%"
    assert _metric(at, "Session notes") == "1"
    assert not at.info


def _filled(engine) -> None:
    """Two evaluations (one with unverified evidence), a corrected, a confirmed and a pending judgment."""
    now = utcnow()
    with session_scope(engine) as s:
        s.add(EvaluationSnapshot(id="snap_a", question="Where is Ankara?\nMore text", model_answer="a",
                                 product="p1", evidence_count=2, evidence_highlighted=1, evidence_unverified=1,
                                 created_at=now - timedelta(hours=2)))  # fmt: skip
        s.add(EvaluationSnapshot(id="snap_b", question="Why?", model_answer="a", product="p2",
                                 created_at=now - timedelta(hours=1)))  # fmt: skip
        s.flush()
        for metric, user, corrected, reviewed in (("clarity", "2", True, True), ("safety", "5", False, True),
                                                  ("bias", None, False, False)):  # fmt: skip
            s.add(Judgment(change_id=f"snap_a:{metric}", snapshot_id="snap_a", product="p1", metric=metric,
                           decision="4" if metric != "safety" else "5", user_decision=user,
                           was_corrected=corrected, reviewed_at=now if reviewed else None,
                           reviewer="ayse" if reviewed else None))  # fmt: skip


def test_figures_link_to_the_filtered_lists_they_count(app_engine) -> None:
    # Under the app's navigation (app.py) the links are st.page_link elements with query strings.
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=APPTEST_TIMEOUT).run()
    links = {p.proto.label: (p.proto.page, p.proto.query_string) for p in at.page_link}
    assert links == {
        "All evaluations →": ("evaluations", ""),
        "Unreviewed →": ("corrections", "state=unreviewed"),
        "Confirmed →": ("corrections", "state=confirmed"),
        "Corrected →": ("corrections", "state=corrected"),
        "With unverified evidence →": ("evaluations", "evidence=unverified"),
        "Notes →": ("notes", ""),
    }
    assert not at.exception


@pytest.mark.parametrize(
    ("figure", "page", "expected"),
    [
        ("Corrected of reviewed", "pages/corrections.py", ["snap_a:clarity"]),
        ("Pending reviews", "pages/corrections.py", ["snap_a:bias"]),
        ("Agreement rate", "pages/corrections.py", ["snap_a:safety"]),
        ("Evidence verified", "pages/evaluations.py", ["snap_a"]),
    ],
)
def test_each_figures_link_lists_the_rows_it_counts(app_engine, open_page, figure, page, expected) -> None:
    _filled(app_engine)
    at = open_page("pages/overview.py")
    name = {"Corrected of reviewed": "correction", "Pending reviews": "pending", "Agreement rate": "agreement",
            "Evidence verified": "evidence"}[figure]  # fmt: skip
    target = overview.FIGURE_LINKS[name]
    assert target.page == page
    # A page run on its own renders the same link as Markdown, with the same relative URL.
    assert f"[{escape_markdown(target.label + ' →')}]({page_url(target.path, target.params)})" in [
        m.value for m in at.markdown
    ]
    listed = open_page(page, query=target.params).dataframe[0].value
    assert list(listed["change_id" if "corrections" in page else "id"]) == expected
    assert not at.exception


def test_activity_rows_and_product_rows_link_to_what_they_name(app_engine, open_page) -> None:
    _filled(app_engine)
    with session_scope(app_engine) as s:
        judgment = s.exec(select(Judgment).where(Judgment.change_id == "snap_a:clarity")).one()
        s.add(JudgmentEvent(judgment_id=judgment.id, change_id=judgment.change_id, action="overruled",
                            reviewer="ayse", from_decision="4", to_decision="2"))  # fmt: skip
    at = open_page("pages/overview.py")
    activity = next(d for d in at.dataframe if d.proto.column_order[:2] == ["link", "when"]).value
    assert list(activity["what"]) == [
        "overruled snap_a:clarity: 4 → 2",
        "new evaluation (p2): Why?",
        "new evaluation (p1): Where is Ankara?",
    ]
    assert list(activity["link"]) == [
        "evaluations?snapshot=snap_a",
        "evaluations?snapshot=snap_b",
        "evaluations?snapshot=snap_a",
    ]
    products = next(d for d in at.dataframe if "corrected_of_reviewed" in d.value.columns)
    assert list(products.value["link"]) == ["evaluations?product=p1", "evaluations?product=p2"]
    assert json.loads(products.proto.columns)["corrected_of_reviewed"]["type_config"]["type"] == "progress"
    assert not at.exception


def test_note_sessions_are_counted_by_the_notes_rule_and_capped(app_engine, open_page, monkeypatch) -> None:
    """The Overview's session figure is the Notes page's capped count (one rule), never a scan of every note."""
    from lib import counters, notes

    with session_scope(app_engine) as s:
        for n, sid in enumerate(("run1", "run1", "run2", "run3")):
            s.add(SessionNote(session_id=sid, note_type="TIP", content=f"tip {n}"))
    at = open_page("pages/overview.py")
    assert not at.exception
    [metric] = [m for m in at.metric if m.label == "Session notes"]
    assert metric.value == "4" and metric.help == "from 3 sessions"

    monkeypatch.setattr(notes, "SESSION_COUNT_CAP", 2)
    at = open_page("pages/overview.py")
    [metric] = [m for m in at.metric if m.label == "Session notes"]
    assert metric.value == "4" and metric.help == "from 2+ sessions"

    monkeypatch.setattr(counters, "COUNT_CAP", 3)  # the notes too are counted to a cap
    at = open_page("pages/overview.py")
    [metric] = [m for m in at.metric if m.label == "Session notes"]
    assert metric.value == "3+" and metric.help == "from 2+ sessions"


def test_products_figure_counts_the_rows_of_the_per_product_table(app_engine, open_page) -> None:
    """Issue 25: "Products 3" above four rows. A product of judgments alone (an imported judgment
    cache) is a product; one whose evaluations are all archived and has no judgment is not."""
    _filled(app_engine)
    now = utcnow()
    with session_scope(app_engine) as s:
        for n in range(3):
            s.add(Judgment(change_id=f"cache:{n}", product="fungear", decision="INCLUDE"))
        s.add(EvaluationSnapshot(id="snap_old", question="q", model_answer="a", product="gone",
                                 deleted_at=now, status="archived"))  # fmt: skip
    at = open_page("pages/overview.py")
    products = next(d for d in at.dataframe if "corrected_of_reviewed" in d.value.columns).value
    assert list(products["product"]) == ["fungear", "p1", "p2"]
    [figure] = [m for m in at.metric if m.label == "Products"]
    assert figure.value == "3" and figure.help == overview.PRODUCTS_HELP
    # The judgments-only product links to its judgments, not to an empty list of evaluations.
    assert list(products["link"]) == [
        "corrections?product=fungear", "evaluations?product=p1", "evaluations?product=p2"
    ]  # fmt: skip
    assert not at.exception


def test_latest_note_shows_its_day_with_the_minute_in_the_help(app_engine, open_page) -> None:
    with session_scope(app_engine) as s:
        s.add(SessionNote(session_id="run1", note_type="TIP", content="tip",
                          timestamp=datetime(2026, 11, 7, 13, 3, tzinfo=UTC)))  # fmt: skip
    at = open_page("pages/overview.py")
    [figure] = [m for m in at.metric if m.label == "Latest note"]
    assert (figure.value, figure.help) == ("2026-11-07", "2026-11-07 13:03 UTC")
    assert not at.exception
