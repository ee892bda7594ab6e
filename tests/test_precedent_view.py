"""lib.precedent_view on SQLite and PostgreSQL: filters, counts, paging, and the expert review rule."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from lib import precedent_view as view
from lib import precedents
from lib.models import ExpertFeedback, Interaction, utcnow
from tests.conftest import sqlite_only

CITE = "https://help.acme.test/reset-password"
ANSWER = "Open Settings and choose Reset password. We email you a link that works for one hour."


def _add(
    session: Session, iid: str, *, days: int, language: str = "en", expert: bool = False, **kw: str
) -> None:
    session.add(
        Interaction(
            id=iid,
            product=kw.get("product", "acme"),
            language=language,
            question=kw.get("question", "How do I reset my password?"),
            answer=kw.get("answer", ANSWER),
            citation_url=kw.get("citation", CITE),
            created_at=utcnow() - timedelta(days=days),
        )
    )
    session.flush()
    if expert:
        view.add_expert_review(
            session=session,
            interaction_id=iid,
            sentence_scores=[80, None],
            citation_score=20,
            citation_url=CITE,
            reviewer="ayse",
        )
    session.commit()


@pytest.fixture
def filled(engine: Engine) -> Engine:
    with Session(engine) as session:
        _add(session, "prec", days=10, expert=True)
        _add(session, "same", days=5)
        _add(session, "cite", days=4, citation="https://help.acme.test/other")
        _add(session, "other", days=3, language="tr", question="Invoices?", answer="Monthly, by email.")
        _add(session, "globex", days=2, product="globex", question="Q?", answer="A.")
    precedents.evaluate_ids(engine, ["same", "cite", "other"], concurrency=0)
    return engine


def _days_ago(start: int, end: int) -> Callable[[], view.PrecedentFilters]:
    """A date range counted back from the day the test runs, not the day it was collected (a run
    that crossed midnight filtered one day off)."""
    return lambda: view.PrecedentFilters(
        start=utcnow().date() - timedelta(days=start), end=utcnow().date() - timedelta(days=end)
    )


@pytest.mark.parametrize(
    ("filters", "ids"),
    [
        (view.PrecedentFilters(), ["globex", "other", "cite", "same", "prec"]),
        (view.PrecedentFilters(product="acme", language="en"), ["cite", "same", "prec"]),
        (view.PrecedentFilters(outcome="matched"), ["same"]),
        (view.PrecedentFilters(outcome="no_citation_match"), ["cite"]),
        (view.PrecedentFilters(outcome="pending"), ["globex"]),
        (view.PrecedentFilters(outcome="expert-reviewed"), ["prec"]),
        (_days_ago(4, 3), ["other", "cite"]),
    ],
)
def test_filters_count_and_page_in_sql(
    filled: Engine, filters: view.PrecedentFilters | Callable[[], view.PrecedentFilters], ids: list[str]
) -> None:
    filters = filters() if callable(filters) else filters
    with Session(filled) as session:
        assert view.count_interactions(session=session, filters=filters) == len(ids)
        assert list(view.list_page(session=session, filters=filters, offset=0, limit=50)["id"]) == ids
        assert list(view.list_page(session=session, filters=filters, offset=1, limit=1)["id"]) == ids[1:2]


def test_reason_counts_over_the_filter(filled: Engine) -> None:
    with Session(filled) as session:
        counts = view.reason_counts(session=session, filters=view.PrecedentFilters())
        assert dict(zip(counts["outcome"], counts["count"], strict=True)) == {
            "matched": 1,
            "no_citation_match": 1,
            "no_qa_match": 1,
        }
        assert view.reason_counts(session=session, filters=view.PrecedentFilters(language="tr"))[
            "outcome"
        ].tolist() == ["no_qa_match"]
        fig = view.reason_figure(counts)
        assert list(fig.data[0].y) == [1, 1, 1]


def test_detail_and_distance_once_an_expert_scores_an_auto_evaluated_interaction(filled: Engine) -> None:
    with Session(filled) as session:
        detail = view.load_detail(session=session, interaction_id="same")
        assert detail is not None and detail.outcome == "matched" and detail.distance is None
        assert list(detail.sentence_frame()["copied score"]) == [80, 100]
        view.add_expert_review(
            session=session,
            interaction_id="same",
            sentence_scores=[0, 0],
            citation_score=0,
            citation_url=None,
            reviewer="bo",
        )
        session.commit()
        detail = view.load_detail(session=session, interaction_id="same")
        assert detail is not None and detail.distance == precedents.total_score([80, 100], 20)
        assert view.load_detail(session=session, interaction_id="missing") is None


@sqlite_only
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sentence_scores": [101, 0]}, "review.sentence_scores[0].score: 101 is outside 0–100"),
        ({"sentence_scores": [1]}, "2 sentence scores are needed, got 1"),
        ({"citation_score": 26}, "review.citation_score: 26 is outside 0–25"),
        ({"reviewer": "  "}, "a reviewer name is required"),
    ],
)
def test_a_bad_review_is_refused_and_writes_nothing(filled: Engine, kwargs: dict, message: str) -> None:
    args = {
        "sentence_scores": [50, 50],
        "citation_score": 10,
        "citation_url": CITE,
        "reviewer": "ayse",
    } | kwargs
    with Session(filled) as session:
        with pytest.raises(view.ReviewRefused, match=message.replace("[", r"\[").replace("]", r"\]")):
            view.add_expert_review(session=session, interaction_id="same", **args)
        session.rollback()
        assert session.query(ExpertFeedback).filter_by(interaction_id="same", type="expert").count() == 0


def test_csv_holds_every_match_of_the_filter_with_formulas_neutralised(filled: Engine) -> None:
    import csv
    import io

    from lib import export

    with Session(filled) as session:
        _add(session, "formula", days=1, question='=HYPERLINK("http://evil.test","x")', answer="A.")
    data = export.precedents_csv_bytes(engine=filled, filters=view.PrecedentFilters(product="acme"))
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"))))
    assert [r["id"] for r in rows] == ["formula", "other", "cite", "same", "prec"]
    assert not rows[0]["question"].startswith("=")
    assert "HYPERLINK" in rows[0]["question"]
    one = export.precedents_csv_bytes(engine=filled, filters=view.PrecedentFilters(outcome="matched"))
    assert [r["id"] for r in csv.DictReader(io.StringIO(one.decode("utf-8-sig")))] == ["same"]


def test_csv_streams_in_batches_with_the_page_outcomes(
    filled: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv
    import io

    from lib import export

    monkeypatch.setattr(view, "CSV_BATCH_ROWS", 1)  # every row its own batch and expert lookup
    data = export.precedents_csv_bytes(engine=filled, filters=view.PrecedentFilters())
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    with Session(filled) as session:
        page = view.list_page(session=session, filters=view.PrecedentFilters(), offset=0, limit=100)
    assert [(r["id"], r["outcome"]) for r in rows] == list(zip(page["id"], page["outcome"], strict=True))
    assert len(rows) > 1
