"""The inspector's queries on both backends: filters, sorts, pages, counts, detail, archive/restore."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import date
from typing import Any

import pytest
from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from lib.db import create_db_engine
from lib.export import evaluations_csv_bytes
from lib.importer import import_evaluations, import_metrics
from lib.inspector import (
    EvaluationFilters,
    archive_evaluation,
    count_evaluations,
    filter_options,
    filters_from_params,
    list_evaluations,
    load_evaluation,
    restore_evaluation,
    to_params,
)
from lib.models import EvaluationSnapshot, Judgment
from tests.conftest import module_db_url

ANSWER = "Paris is the capital of France.\n\nIt is known for  the Eiffel Tower."
EXACT = {"quote": "Paris is the capital of France.", "start": 0, "end": 31, "why": "correct", "better": "-"}
UNLOCATED = {"quote": "known for the Eiffel Tower", "start": None, "end": None, "why": "w", "better": "b"}
UNVERIFIED = {"quote": "Berlin is the capital", "start": 3, "end": 9, "why": "made up", "better": "drop it"}


def record(sid: str, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": sid,
        "question": f"Question {sid}?",
        "model_answer": ANSWER,
        "product": "acme",
        "language": "en",
        "model_name": "m1",
        "category": "geo",
        "created_at": "2025-01-10T12:00:00Z",
        "user_scores": {"clarity": 4, "safety": 5},
        "judge_scores": {"clarity": 4, "safety": 5},
    }
    base.update(over)
    return base


RECORDS = [
    # Exact (highlighted) evidence; clarity gap 2.
    record(
        "s_a",
        user_scores={"clarity": 2, "safety": 5},
        evidence={"clarity": [EXACT]},
        primary_metric="clarity",
    ),
    # Unlocated evidence, Turkish, another model and category, two days later.
    record(
        "s_b",
        language="tr",
        model_name="m2",
        category="history",
        created_at="2025-01-12T08:00:00Z",
        user_scores={"clarity": 3, "safety": 5},
        evidence={"safety": [UNLOCATED]},
    ),
    # Unverified evidence next to highlighted evidence, another product; gap 4 on safety.
    record(
        "s_c",
        product="beta",
        created_at="2025-01-14T08:00:00Z",
        user_scores={"clarity": 4, "safety": 1},
        evidence={"safety": [UNVERIFIED, EXACT]},
        primary_metric="safety",
    ),
    # No evidence at all, no category, judged on clarity only.
    record(
        "s_d",
        product="beta",
        category=None,
        created_at="2025-01-15T23:59:00Z",
        question="What does 100% mean?",
        judge_scores={"clarity": 4},
    ),
]


@pytest.fixture
def seeded(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        import_evaluations(session=session, records=RECORDS, reviewer="tester")
        session.commit()
        yield session


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def seeded_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """RECORDS imported once per module and backend, for the filter tests that only read them."""
    engine = create_db_engine(module_db_url(request, tmp_path_factory))
    try:
        with Session(engine) as session:
            import_evaluations(session=session, records=RECORDS, reviewer="tester")
            session.commit()
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def seeded_read(seeded_engine: Engine) -> Iterator[Session]:
    """A session on the module's imported RECORDS; never committed (the tests using it only read)."""
    with Session(seeded_engine) as session:
        yield session


def ids(filters: EvaluationFilters, session: Session, **kwargs: int) -> list[str]:
    return [r.id for r in list_evaluations(session=session, filters=filters, **kwargs).rows]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (EvaluationFilters(), ["s_d", "s_c", "s_b", "s_a"]),
        (EvaluationFilters(product="beta"), ["s_d", "s_c"]),
        (EvaluationFilters(language="tr"), ["s_b"]),
        (EvaluationFilters(model="m2"), ["s_b"]),
        (EvaluationFilters(category="geo"), ["s_c", "s_a"]),
        (EvaluationFilters(metric="safety"), ["s_c", "s_b", "s_a"]),
        (EvaluationFilters(metric="bias"), []),
        (EvaluationFilters(min_gap=2), ["s_c", "s_a"]),
        (EvaluationFilters(min_gap=3), ["s_c"]),
        (EvaluationFilters(evidence="unverified"), ["s_c"]),
        (EvaluationFilters(evidence="unlocated"), ["s_b"]),
        (EvaluationFilters(evidence="verified"), ["s_b", "s_a"]),
        (EvaluationFilters(evidence="none"), ["s_d"]),
        (EvaluationFilters(date_from=date(2025, 1, 12)), ["s_d", "s_c", "s_b"]),
        (EvaluationFilters(date_to=date(2025, 1, 12)), ["s_b", "s_a"]),
        (EvaluationFilters(date_from=date(2025, 1, 15), date_to=date(2025, 1, 15)), ["s_d"]),
        (EvaluationFilters(text="question s_b"), ["s_b"]),
        (EvaluationFilters(text="100%"), ["s_d"]),
        (EvaluationFilters(product="acme", language="en", evidence="verified"), ["s_a"]),
    ],
)
def test_filter_selects_exactly_the_matching_evaluations(seeded_read, filters, expected) -> None:
    assert ids(filters, seeded_read) == expected
    assert count_evaluations(session=seeded_read, filters=filters) == len(expected)


@pytest.mark.parametrize(
    ("needle", "expected"),
    # As wildcards, "Question_s" and "n%s" would match every "Question s_x?"; literally, none.
    [
        ("%", ["s_d"]),
        ("_", ["s_c", "s_b", "s_a"]),
        ("Question_s", []),
        ("n%s", []),
        ("QUESTION S_B", ["s_b"]),
    ],
)
def test_text_search_takes_like_wildcards_literally_and_ignores_case(seeded_read, needle, expected) -> None:
    assert ids(EvaluationFilters(text=needle), seeded_read) == expected


def _review(session: Session, change_id: str, user_decision: str) -> None:
    judgment = session.exec(select(Judgment).where(Judgment.change_id == change_id)).one()
    judgment.user_decision = user_decision
    judgment.was_corrected = user_decision != judgment.decision
    judgment.reviewed_at = judgment.timestamp
    judgment.reviewer = "ayse"
    session.add(judgment)
    session.commit()


@pytest.mark.parametrize(
    ("review", "expected"),
    [
        ("any", ["s_d", "s_c", "s_b", "s_a"]),
        ("pending", ["s_d", "s_c", "s_b"]),
        ("reviewed", ["s_a"]),
        ("corrected", ["s_b", "s_a"]),
    ],
)
def test_review_state_filter_reads_the_judgments(seeded, review, expected) -> None:
    _review(seeded, "s_a:clarity", "2")  # corrected
    _review(seeded, "s_a:safety", "5")  # confirmed: s_a fully reviewed
    _review(seeded, "s_b:clarity", "1")  # corrected, but safety still pending
    assert ids(EvaluationFilters(review=review), seeded) == expected


@pytest.mark.pg_repeats("statements and lines of test_review_state_filter_reads_the_judgments")
def test_page_rows_carry_their_review_counts(seeded) -> None:
    _review(seeded, "s_a:clarity", "2")
    row = next(r for r in list_evaluations(session=seeded, filters=EvaluationFilters()).rows if r.id == "s_a")
    assert (row.judged, row.reviewed, row.corrected) == (2, 1, 1)


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("newest", ["s_d", "s_c", "s_b", "s_a"]),
        ("max_gap", ["s_c", "s_a", "s_b", "s_d"]),
        ("weighted_gap", ["s_c", "s_a", "s_b", "s_d"]),
    ],
)
def test_sort_orders_rows_with_missing_gaps_last(seeded, sort, expected) -> None:
    # s_d has no user score, hence no gap at all: it must sort after every real gap on both backends.
    assert ids(EvaluationFilters(sort=sort), seeded) == expected


@pytest.mark.parametrize("limit", [1, 3])
def test_pages_are_disjoint_and_cover_every_match(seeded, limit) -> None:
    seen: list[str] = []
    for offset in range(0, 4, limit):
        page = list_evaluations(session=seeded, filters=EvaluationFilters(), offset=offset, limit=limit)
        assert page.total == 4
        assert len(page.rows) <= limit
        seen += [r.id for r in page.rows]
    assert seen == ["s_d", "s_c", "s_b", "s_a"]


def test_list_rows_preview_long_questions(engine: Engine) -> None:
    with Session(engine) as session:
        import_evaluations(session=session, records=[record("s_long", question="x" * 5000)])
        session.commit()
        (row,) = list_evaluations(session=session, filters=EvaluationFilters()).rows
    assert len(row.question) == 160


def test_archived_evaluation_leaves_every_list_and_count(seeded) -> None:
    assert archive_evaluation(session=seeded, snapshot_id="s_c", reviewer="lead")
    seeded.commit()
    for filters in (
        EvaluationFilters(),
        EvaluationFilters(product="beta"),
        EvaluationFilters(evidence="unverified"),
    ):
        assert "s_c" not in ids(filters, seeded)
    assert count_evaluations(session=seeded, filters=EvaluationFilters()) == 3
    assert ids(EvaluationFilters(archived=True), seeded) == ["s_c"]


def test_archive_records_reviewer_time_and_status(seeded) -> None:
    archive_evaluation(session=seeded, snapshot_id="s_c", reviewer="  lead ")
    seeded.commit()
    snap = seeded.get(EvaluationSnapshot, "s_c", populate_existing=True)
    assert (snap.status, snap.status_changed_by) == ("archived", "lead")
    assert snap.deleted_at is not None and snap.status_changed_at == snap.deleted_at


@pytest.mark.parametrize(("turns", "status"), [(0, "active"), (15, "completed")])
def test_restore_brings_the_evaluation_back_with_a_live_status(seeded, turns, status) -> None:
    seeded.exec(
        update(EvaluationSnapshot).where(col(EvaluationSnapshot.id) == "s_c").values(chat_turn_count=turns)
    )
    archive_evaluation(session=seeded, snapshot_id="s_c", reviewer="lead")
    assert restore_evaluation(session=seeded, snapshot_id="s_c", reviewer="ayse")
    seeded.commit()
    snap = seeded.get(EvaluationSnapshot, "s_c", populate_existing=True)
    assert (snap.deleted_at, snap.status, snap.status_changed_by) == (None, status, "ayse")
    assert "s_c" in ids(EvaluationFilters(), seeded)
    assert ids(EvaluationFilters(archived=True), seeded) == []


@pytest.mark.parametrize(("action", "sid"), [(archive_evaluation, "s_a"), (restore_evaluation, "s_a")])
@pytest.mark.pg_repeats("statements and lines of test_archive_records_reviewer_time_and_status")
def test_archive_and_restore_report_no_change_when_already_in_that_state(seeded, action, sid) -> None:
    if action is archive_evaluation:
        archive_evaluation(session=seeded, snapshot_id=sid, reviewer="lead")
    assert action(session=seeded, snapshot_id=sid, reviewer="lead") is False


@pytest.mark.parametrize("action", [archive_evaluation, restore_evaluation])
def test_archive_and_restore_refuse_an_unknown_id(seeded, action) -> None:
    with pytest.raises(LookupError, match="nope"):
        action(session=seeded, snapshot_id="nope", reviewer="lead")


@pytest.mark.parametrize("action", [archive_evaluation, restore_evaluation])
@pytest.mark.parametrize("reviewer", ["", "   "])
@pytest.mark.pg_repeats("statements and lines of test_archive_and_restore_refuse_an_unknown_id")
def test_archive_and_restore_require_a_reviewer(seeded, action, reviewer) -> None:
    with pytest.raises(ValueError, match="reviewer"):
        action(session=seeded, snapshot_id="s_a", reviewer=reviewer)


def test_filter_options_are_sorted_distinct_values_without_nulls(seeded) -> None:
    archive_evaluation(session=seeded, snapshot_id="s_b", reviewer="lead")
    seeded.commit()
    options = filter_options(session=seeded)
    assert options.products == ["acme", "beta"]
    # Archived rows keep their values on offer, for the "Show archived" list.
    assert options.languages == ["en", "tr"]
    assert options.models == ["m1", "m2"]
    assert options.categories == ["geo", "history"]
    assert list(options.metrics.items())[:2] == [
        ("truthfulness", "Truthfulness"),
        ("helpfulness", "Helpfulness"),
    ]


@pytest.mark.pg_repeats("statements and lines of test_filter_options_offer_the_metrics_of_every_product")
def test_filter_options_offer_a_products_own_metrics(seeded) -> None:
    import_metrics(
        session=seeded,
        data=[
            {"product": "beta", "slug": "coherence", "display_name": "Coherence", "min": 1, "max": 3},
            {"product": "beta", "slug": "groundedness", "display_name": "Groundedness", "min": 0, "max": 1},
        ],
    )
    seeded.commit()
    assert filter_options(session=seeded, product="beta").metrics == {
        "coherence": "Coherence",
        "groundedness": "Groundedness",
    }


@pytest.mark.parametrize(
    ("products", "expected"),
    [
        # Every product has its own rubric: the default set is not on offer.
        (["beta"], ["coherence", "groundedness"]),
        # Some product uses the default set: both.
        (["beta", "acme"], ["truthfulness", "coherence", "groundedness"]),
    ],
)
def test_filter_options_offer_the_metrics_of_every_product(engine, products, expected) -> None:
    with Session(engine) as session:
        import_metrics(
            session=session,
            data=[
                {"product": "beta", "slug": "coherence", "display_name": "Coherence", "min": 1, "max": 3},
                {
                    "product": "beta",
                    "slug": "groundedness",
                    "display_name": "Groundedness",
                    "min": 0,
                    "max": 1,
                },
            ],
        )
        import_evaluations(
            session=session,
            records=[
                record(
                    f"s_{p}",
                    product=p,
                    user_scores={"coherence": 2} if p == "beta" else {"clarity": 2},
                    judge_scores=None,
                )
                for p in products
            ],
        )
        session.commit()
        metrics = list(filter_options(session=session).metrics)
    assert [m for m in metrics if m in ("truthfulness", "coherence", "groundedness")] == expected


def _csv_rows(engine: Engine, filters: EvaluationFilters, form: str) -> list[dict[str, str]]:
    return list(
        csv.DictReader(io.StringIO(evaluations_csv_bytes(engine=engine, filters=filters, form=form).decode()))
    )


def test_wide_export_holds_every_match_with_scores_per_metric(seeded) -> None:
    rows = _csv_rows(seeded.get_bind(), EvaluationFilters(product="beta"), "wide")
    assert [r["id"] for r in rows] == ["s_d", "s_c"]
    assert [r["judged"] for r in rows] == ["1", "2"]
    s_c = rows[1]
    safety = [s_c[f"safety {f}"] for f in ("user_score", "judge_score", "gap", "reviewer_decision")]
    assert safety == ["1", "5", "4", ""]  # not reviewed yet
    clarity = [s_c[f"clarity {f}"] for f in ("user_score", "judge_score", "gap", "reviewer_decision")]
    assert clarity == ["4", "4", "0", ""]
    assert s_c["answer"] == ANSWER
    # The judge did not score s_d's safety: the user's score and no gap.
    assert (rows[0]["safety user_score"], rows[0]["safety judge_score"], rows[0]["safety gap"]) == (
        "5",
        "",
        "",
    )


@pytest.mark.pg_repeats("statements and lines of test_long_export_has_one_row_per_judgment_with_the_review")
def test_wide_export_names_whose_score_each_column_holds(seeded) -> None:
    """Issue 25: after overruling the judge's 5 with 2, the wide CSV's `reviewer` column still said
    1 (the evaluated user's score). Each of the three roles has its own column."""
    _review(seeded, "s_c:safety", "2")
    [s_c] = [
        r for r in _csv_rows(seeded.get_bind(), EvaluationFilters(product="beta"), "wide") if r["id"] == "s_c"
    ]
    assert {k: v for k, v in s_c.items() if k.startswith("safety ")} == {
        "safety user_score": "1",
        "safety judge_score": "5",
        "safety gap": "4",
        "safety reviewer_decision": "2",
    }
    assert s_c["clarity reviewer_decision"] == ""


def test_long_export_has_one_row_per_judgment_with_the_review(seeded) -> None:
    _review(seeded, "s_c:safety", "2")
    rows = _csv_rows(seeded.get_bind(), EvaluationFilters(product="beta"), "long")
    assert [(r["id"], r["metric"]) for r in rows] == [
        ("s_d", "clarity"),
        ("s_c", "clarity"),
        ("s_c", "safety"),
    ]
    safety = rows[2]
    assert (safety["user_score"], safety["judge_score"], safety["gap"]) == ("1", "5", "4")
    assert (safety["reviewer_decision"], safety["reviewed_by"], safety["was_corrected"]) == (
        "2",
        "ayse",
        "true",
    )
    assert safety["reviewed_at"].endswith("Z")
    assert rows[1]["was_corrected"] == "false" and rows[1]["reviewed_by"] == ""
    assert rows[1]["reviewer_decision"] == "" and rows[1]["reviewer_reason"] == ""


def test_the_long_export_names_the_three_roles_as_the_wide_one_does() -> None:
    from lib.inspector import LONG_EXPORT_COLUMNS, WIDE_METRIC_FIELDS

    assert set(WIDE_METRIC_FIELDS) <= set(LONG_EXPORT_COLUMNS)
    assert not {"reviewer_score", "review_decision", "review_reason"} & set(LONG_EXPORT_COLUMNS)
    assert {"user_reason", "judge_reason", "reviewer_reason"} <= set(LONG_EXPORT_COLUMNS)


@pytest.mark.parametrize("form", ["wide", "long"])
def test_export_applies_the_text_filter(seeded, form: str) -> None:
    rows = _csv_rows(seeded.get_bind(), EvaluationFilters(text="QUESTION S_B"), form)
    assert {r["id"] for r in rows} == {"s_b"}


@pytest.mark.pg_repeats("statements and lines of test_export_neutralises_formulas_in_the_answer")
def test_export_streams_rows_in_batches(seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    import lib.inspector as inspector

    monkeypatch.setattr(inspector, "EXPORT_BATCH_ROWS", 1)
    export = inspector.export_evaluations(session=seeded, filters=EvaluationFilters(), form="wide")
    assert [row[0] for row in export.rows] == ["s_d", "s_c", "s_b", "s_a"]


def test_export_refuses_an_unknown_form(seeded) -> None:
    with pytest.raises(ValueError, match="unknown export form 'tall'; choose one of: wide, long"):
        _csv_rows(seeded.get_bind(), EvaluationFilters(), "tall")


@pytest.mark.parametrize("form", ["wide", "long"])
def test_export_neutralises_formulas_in_the_answer(engine: Engine, form: str) -> None:
    with Session(engine) as session:
        import_evaluations(session=session, records=[record("s_f", model_answer="=1+2 and @SUM(A1)")])
        session.commit()
    rows = _csv_rows(engine, EvaluationFilters(), form)
    assert {r["answer"] for r in rows} == {"'=1+2 and @SUM(A1)"}


@pytest.mark.pg_repeats("statements and lines of test_wide_export_holds_every_match_with_scores_per_metric")
def test_filtered_csv_holds_full_questions_with_formulas_neutralised(engine: Engine) -> None:
    question = '=HYPERLINK("http://x")' + "y" * 300
    with Session(engine) as session:
        import_evaluations(
            session=session, records=[record("s_f", question=question), record("s_g", product="other")]
        )
        session.commit()
    rows = list(
        csv.DictReader(
            io.StringIO(
                evaluations_csv_bytes(engine=engine, filters=EvaluationFilters(product="acme")).decode()
            )
        )
    )
    assert [r["id"] for r in rows] == ["s_f"]
    assert rows[0]["question"] == "'" + question


# --- query-string round trip -------------------------------------------------------------------

ROUND_TRIP = [
    EvaluationFilters(),
    EvaluationFilters(product="a b&c", language="tr", model="m/1", category="x", metric="clarity"),
    EvaluationFilters(min_gap=1.5, review="corrected", evidence="unlocated", sort="max_gap", archived=True),
    EvaluationFilters(date_from=date(2025, 1, 2), date_to=date(2025, 2, 3), text="100% sure"),
]


@pytest.mark.parametrize("filters", ROUND_TRIP)
def test_filters_survive_the_query_string(filters) -> None:
    assert filters_from_params(to_params(filters)) == filters


def test_default_filters_make_an_empty_query_string() -> None:
    assert to_params(EvaluationFilters()) == {}


@pytest.mark.parametrize(
    "params",
    [
        {"min_gap": "abc"},
        {"min_gap": "-1"},
        {"min_gap": "nan"},
        {"review": "x"},
        {"evidence": "x"},
        {"sort": "drop table"},
        {"from": "2025-13-01"},
        {"to": "yesterday"},
        {"archived": "maybe"},
        {"product": "   "},
    ],
)
def test_bad_query_values_fall_back_to_defaults(params) -> None:
    assert filters_from_params(params) == EvaluationFilters()


def test_min_gap_in_the_url_is_capped_at_the_largest_possible_gap() -> None:
    assert filters_from_params({"min_gap": "99"}).min_gap == 4.0


# --- detail ------------------------------------------------------------------------------------


def test_detail_has_a_card_per_rubric_metric_largest_gap_first(seeded) -> None:
    detail = load_evaluation(session=seeded, snapshot_id="s_c")
    slugs = [card.spec.slug for card in detail.cards]
    assert len(slugs) == 8
    assert slugs[:2] == ["safety", "clarity"]  # gap 4, then gap 0; then unscored metrics in rubric order
    assert slugs[2:] == ["truthfulness", "helpfulness", "bias", "consistency", "efficiency", "robustness"]
    safety = detail.cards[0]
    assert (safety.user_score, safety.judge_score, safety.gap, safety.role) == (1, 5, 4, "primary")


@pytest.mark.pg_repeats("statements and lines of test_detail_has_a_card_per_rubric_metric_largest_gap_first")
def test_detail_marks_bonus_metrics(engine: Engine) -> None:
    with Session(engine) as session:
        import_evaluations(
            session=session, records=[record("s_x", primary_metric="clarity", bonus_metrics=["safety"])]
        )
        session.commit()
        detail = load_evaluation(session=session, snapshot_id="s_x")
    roles = {card.spec.slug: card.role for card in detail.cards}
    assert (roles["clarity"], roles["safety"], roles["bias"]) == ("primary", "bonus", None)


@pytest.mark.parametrize(
    ("sid", "stages", "spans"),
    [
        ("s_a", ["exact"], [(0, 31, "clarity")]),
        ("s_b", ["whitespace"], []),
        ("s_c", ["unverified", "exact"], [(0, 31, "safety")]),
        ("s_d", [], []),
    ],
)
@pytest.mark.pg_repeats("statements and lines of test_detail_has_a_card_per_rubric_metric_largest_gap_first")
def test_detail_highlights_only_stages_one_to_three(seeded, sid, stages, spans) -> None:
    detail = load_evaluation(session=seeded, snapshot_id=sid)
    assert [item.stage for card in detail.cards for item in card.evidence] == stages
    assert [(s.start, s.end, s.metric) for s in detail.spans] == spans
    assert detail.has_evidence is bool(stages)


@pytest.mark.pg_repeats("statements and lines of test_detail_has_a_card_per_rubric_metric_largest_gap_first")
def test_detail_shows_each_metric_on_its_own_scale(engine: Engine) -> None:
    with Session(engine) as session:
        import_metrics(
            session=session,
            data=[
                {"product": "rag", "slug": "coherence", "display_name": "Coherence", "min": 1, "max": 3},
                {
                    "product": "rag",
                    "slug": "groundedness",
                    "display_name": "Groundedness",
                    "min": 0,
                    "max": 1,
                },
            ],
        )
        import_evaluations(
            session=session,
            records=[
                record(
                    "s_r",
                    product="rag",
                    user_scores={"coherence": 2.67, "groundedness": 1},
                    judge_scores={"coherence": 2, "groundedness": 0.5},
                )
            ],
        )
        session.commit()
        detail = load_evaluation(session=session, snapshot_id="s_r")
    by_slug = {card.spec.slug: card for card in detail.cards}
    assert list(by_slug) == ["groundedness", "coherence"]  # 0.5 of 1 (rescaled 2) beats 0.67 of 2 (1.34)
    assert by_slug["groundedness"].gap == pytest.approx(0.5)
    assert by_slug["coherence"].gap == pytest.approx(0.67)
    assert by_slug["coherence"].spec.scale_label() == "1–3"


@pytest.mark.pg_repeats("statements and lines of test_detail_has_a_card_per_rubric_metric_largest_gap_first")
def test_detail_reasons_come_from_the_scores(engine: Engine) -> None:
    with Session(engine) as session:
        import_evaluations(
            session=session,
            records=[
                record(
                    "s_y",
                    user_scores={"clarity": {"score": 2, "reason": "muddled"}},
                    judge_scores={"clarity": {"score": 4, "reason": "fine"}},
                )
            ],
        )
        session.commit()
        card = load_evaluation(session=session, snapshot_id="s_y").cards[0]
    assert (card.spec.slug, card.user_reason, card.judge_reason) == ("clarity", "muddled", "fine")


@pytest.mark.pg_repeats("statements and lines of test_long_export_has_one_row_per_judgment_with_the_review")
def test_detail_carries_the_metric_judgment(seeded) -> None:
    _review(seeded, "s_a:clarity", "3")
    card = load_evaluation(session=seeded, snapshot_id="s_a").cards[0]
    assert (card.judgment.change_id, card.judgment.user_decision) == ("s_a:clarity", "3")


def test_detail_reverifies_items_stored_without_a_stage(seeded) -> None:
    evidence = {"clarity": {"evidence": [{"quote": "capital of France", "start": None, "end": None}]}}
    seeded.exec(
        update(EvaluationSnapshot).where(col(EvaluationSnapshot.id) == "s_d").values(evidence_json=evidence)
    )
    seeded.commit()
    detail = load_evaluation(session=seeded, snapshot_id="s_d")
    assert [(s.start, s.end) for s in detail.spans] == [(13, 30)]


def test_detail_keeps_metrics_the_rubric_no_longer_names(seeded) -> None:
    seeded.exec(
        update(EvaluationSnapshot)
        .where(col(EvaluationSnapshot.id) == "s_d")
        .values(judge_scores_json={"clarity": {"score": 4}, "legacy": {"score": 3}})
    )
    seeded.commit()
    cards = load_evaluation(session=seeded, snapshot_id="s_d").cards
    legacy = next(card for card in cards if card.spec.slug == "legacy")
    assert (legacy.in_rubric, legacy.judge_score, len(cards)) == (False, 3, 9)


def test_detail_of_an_unknown_id_is_none(seeded) -> None:
    assert load_evaluation(session=seeded, snapshot_id="missing") is None


@pytest.mark.pg_repeats("statements and lines of test_archive_records_reviewer_time_and_status")
def test_detail_of_an_archived_evaluation_still_loads(seeded) -> None:
    archive_evaluation(session=seeded, snapshot_id="s_a", reviewer="lead")
    seeded.commit()
    assert load_evaluation(session=seeded, snapshot_id="s_a").archived
