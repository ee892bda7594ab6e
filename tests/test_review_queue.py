"""The review queue: one evaluation at a time, oldest or largest-gap first, filters, skips,
archived evaluations left out, progress counts — on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, event

from lib import corrections
from lib.corrections import DecisionScale
from lib.db import session_scope
from lib.metrics import MetricSpec
from lib.models import EvaluationSnapshot, Judgment
from lib.review_queue import (
    QueueFilter,
    load_item,
    load_workspace,
    next_item,
    queue_options,
    queue_progress,
    score_keys,
)

T0 = datetime(2024, 3, 1, tzinfo=UTC)


def evaluation(
    engine: Engine,
    snapshot_id: str,
    *,
    hours: int = 0,
    product: str = "acme",
    language: str = "en",
    gap: float | None = None,
    metrics: tuple[str, ...] = ("clarity", "truthfulness"),
    archived: bool = False,
) -> None:
    """An evaluation with one unreviewed judgment per metric."""
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id=snapshot_id,
                question="q",
                model_answer="a",
                product=product,
                language=language,
                max_metric_gap=gap,
                created_at=T0 + timedelta(hours=hours),
                deleted_at=T0 if archived else None,
                status="archived" if archived else "active",
            )
        )
        s.flush()
        for metric in metrics:
            s.add(
                Judgment(
                    change_id=f"{snapshot_id}:{metric}",
                    product=product,
                    metric=metric,
                    snapshot_id=snapshot_id,
                    decision="3",
                    timestamp=T0 + timedelta(hours=hours),
                )
            )


def standalone(engine: Engine, change_id: str, *, hours: int = 0, product: str = "acme") -> None:
    with session_scope(engine) as s:
        s.add(
            Judgment(
                change_id=change_id,
                product=product,
                decision="INCLUDE",
                timestamp=T0 + timedelta(hours=hours),
            )
        )


def review(engine: Engine, change_id: str, decision: str = "3") -> None:
    with session_scope(engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id=change_id, user_decision=decision, reviewer="ayse"
        )


def next_key(engine: Engine, skipped: tuple[str, ...] = (), **filters) -> str | None:
    with session_scope(engine, read_only=True) as s:
        item = next_item(session=s, filters=QueueFilter(**filters), skipped=skipped)
        return item.key if item else None


def test_oldest_first_gives_the_oldest_evaluation_with_all_its_open_metrics_in_rubric_order(engine) -> None:
    evaluation(engine, "new", hours=5)
    evaluation(engine, "old", hours=1, metrics=("clarity", "safety", "truthfulness"))
    with session_scope(engine, read_only=True) as s:
        item = next_item(session=s, filters=QueueFilter())
        assert item is not None and item.snapshot is not None
        # The default rubric order: truthfulness, helpfulness, safety, bias, clarity, ...
        assert (item.key, [j.metric for j in item.judgments]) == (
            "snapshot:old",
            ["truthfulness", "safety", "clarity"],
        )


def test_largest_gap_first_puts_evaluations_without_a_gap_last(engine) -> None:
    standalone(engine, "pr#1", hours=5)
    evaluation(engine, "none", hours=0, gap=None)
    evaluation(engine, "small", hours=1, gap=0.5)
    evaluation(engine, "big", hours=2, gap=3.0)
    assert next_key(engine, order="largest_gap") == "snapshot:big"
    assert next_key(engine, ("snapshot:big",), order="largest_gap") == "snapshot:small"
    assert next_key(engine, ("snapshot:big", "snapshot:small"), order="largest_gap") == "snapshot:none"
    assert next_key(
        engine, ("snapshot:big", "snapshot:small", "snapshot:none"), order="largest_gap"
    ).startswith("judgment:")


def test_reviewed_metrics_leave_the_item_and_a_finished_item_leaves_the_queue(engine) -> None:
    evaluation(engine, "a", hours=0)
    evaluation(engine, "b", hours=1)
    review(engine, "a:clarity")
    with session_scope(engine, read_only=True) as s:
        item = load_item(session=s, key="snapshot:a", filters=QueueFilter())
        assert item is not None and [j.change_id for j in item.judgments] == ["a:truthfulness"]
    review(engine, "a:truthfulness")
    with session_scope(engine, read_only=True) as s:
        assert load_item(session=s, key="snapshot:a", filters=QueueFilter()) is None
    assert next_key(engine) == "snapshot:b"


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"product": "beta"}, "snapshot:beta-1"),
        ({"language": "tr"}, "snapshot:tr-1"),
        ({"metric": "safety"}, "snapshot:safe-1"),
        ({"product": "nobody"}, None),
    ],
)
def test_filters_pick_matching_items_only(engine, filters, expected) -> None:
    evaluation(engine, "first", hours=0)
    evaluation(engine, "beta-1", hours=1, product="beta")
    evaluation(engine, "tr-1", hours=2, language="tr")
    evaluation(engine, "safe-1", hours=3, metrics=("safety",))
    assert next_key(engine, **filters) == expected


def test_metric_filter_limits_the_items_judgments_to_that_metric(engine) -> None:
    evaluation(engine, "a", metrics=("clarity", "safety"))
    with session_scope(engine, read_only=True) as s:
        item = next_item(session=s, filters=QueueFilter(metric="safety"))
        assert item is not None and [j.metric for j in item.judgments] == ["safety"]


def test_skipped_items_are_passed_over(engine) -> None:
    evaluation(engine, "a", hours=0)
    standalone(engine, "pr#1", hours=1)
    evaluation(engine, "c", hours=2)
    with session_scope(engine, read_only=True) as s:
        pr = corrections.get_judgment(session=s, change_id="pr#1")
        assert pr is not None
    assert next_key(engine, ("snapshot:a",)) == f"judgment:{pr.id}"
    assert next_key(engine, ("snapshot:a", f"judgment:{pr.id}")) == "snapshot:c"
    assert next_key(engine, ("snapshot:a", f"judgment:{pr.id}", "snapshot:c")) is None


@pytest.mark.pg_repeats(
    "statements and lines of test_oldest_first_breaks_timestamp_ties_by_id_across_and_within_products"
)
def test_a_standalone_judgment_is_an_item_of_its_own(engine) -> None:
    standalone(engine, "pr#1")
    with session_scope(engine, read_only=True) as s:
        item = next_item(session=s, filters=QueueFilter())
        assert item is not None and item.snapshot is None
        assert [j.change_id for j in item.judgments] == ["pr#1"] and item.title == "Judgment pr#1"


@pytest.mark.pg_repeats("statements and lines of test_filters_pick_matching_items_only")
def test_a_language_filter_leaves_out_standalone_judgments(engine) -> None:
    standalone(engine, "pr#1")
    assert next_key(engine, language="en") is None


@pytest.mark.pg_repeats(
    "statements and lines of test_oldest_first_breaks_timestamp_ties_by_id_across_and_within_products"
)
def test_judgments_of_archived_evaluations_never_appear(engine) -> None:
    evaluation(engine, "gone", hours=0, archived=True)
    evaluation(engine, "live", hours=1)
    assert next_key(engine) == "snapshot:live"
    with session_scope(engine, read_only=True) as s:
        assert queue_progress(session=s, filters=QueueFilter()).total == 2


def test_oldest_first_breaks_timestamp_ties_by_id_across_and_within_products(engine) -> None:
    standalone(engine, "first", product="beta")
    evaluation(engine, "e", product="acme")
    standalone(engine, "last", product="acme")
    standalone(engine, "older-but-reviewed", hours=-1, product="acme")
    review(engine, "older-but-reviewed", "INCLUDE")
    with session_scope(engine, read_only=True) as s:
        ids = {c: corrections.get_judgment(session=s, change_id=c).id for c in ("first", "last")}  # type: ignore[union-attr]
    order = [f"judgment:{ids['first']}", "snapshot:e", f"judgment:{ids['last']}"]
    assert [next_key(engine, tuple(order[:n])) for n in range(4)] == [*order, None]


def _queue_statements(engine: Engine, filters: QueueFilter) -> list[tuple[str, object]]:
    """The SQL (with parameters) that picking the next item runs."""
    seen: list[tuple[str, object]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many) -> None:  # type: ignore[no-untyped-def]
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with session_scope(engine, read_only=True) as s:
            assert next_item(session=s, filters=filters) is not None
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


@pytest.mark.parametrize(
    ("order", "picks_by", "index"),
    [
        ("oldest", "ORDER BY judgments.timestamp", "ix_judgment_open"),
        ("largest_gap", "ORDER BY evaluation_snapshots.deleted_at DESC", "ix_snapshot_live_max_gap"),
    ],
)
def test_the_next_item_is_read_off_an_index_in_order_never_sorted(engine, order, picks_by, index) -> None:
    """However many judgments wait, the next item costs one index seek: the index gives the order.

    PostgreSQL is told to avoid sorts and table scans, so a plan that still sorts means no index
    can give this order (as `(reviewed_at, product, timestamp)` could not: there `IS NULL` does not
    fix the leading column, and it sorted every open judgment of a product).
    """
    evaluation(engine, "a", hours=0, gap=1.0)
    evaluation(engine, "b", hours=1, gap=2.0, product="beta")
    standalone(engine, "pr#1", hours=2)
    statements = [
        (sql, p) for sql, p in _queue_statements(engine, QueueFilter(order=order)) if picks_by in sql
    ]
    assert statements
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            for setting in ("enable_seqscan", "enable_sort", "enable_incremental_sort", "enable_bitmapscan"):
                conn.exec_driver_sql(f"SET {setting} = off")
            explain = "EXPLAIN (COSTS OFF) "
        else:
            explain = "EXPLAIN QUERY PLAN "
        for sql, parameters in statements:
            plan = "\n".join(str(row[-1]) for row in conn.exec_driver_sql(explain + sql, parameters))  # type: ignore[arg-type]
            assert index in plan, plan
            assert "Sort" not in plan and "TEMP B-TREE" not in plan, plan
        conn.rollback()


@pytest.mark.parametrize(
    ("filters", "reviewed", "total"),
    [
        ({}, 1, 5),
        ({"product": "acme"}, 1, 3),
        ({"product": "beta"}, 0, 2),
        ({"metric": "clarity"}, 1, 2),
        ({"product": "acme", "metric": "clarity"}, 1, 1),
        ({"language": "en"}, 1, 2),
        ({"language": "tr", "product": "beta"}, 0, 2),
    ],
)
def test_progress_counts_reviewed_of_all_leaving_out_archived_evaluations(
    engine, filters, reviewed, total
) -> None:
    evaluation(engine, "a", product="acme", language="en")
    evaluation(engine, "b", product="beta", language="tr")
    evaluation(engine, "gone", product="acme", language="en", archived=True)
    standalone(engine, "pr#1", product="acme")
    review(engine, "a:clarity")
    review(engine, "gone:clarity")
    with session_scope(engine, read_only=True) as s:
        progress = queue_progress(session=s, filters=QueueFilter(**filters))
    assert (progress.reviewed, progress.total) == (reviewed, total)
    assert progress.label == f"{reviewed} of {total} reviewed"


def test_progress_of_an_empty_queue_is_complete(engine) -> None:
    with session_scope(engine, read_only=True) as s:
        progress = queue_progress(session=s, filters=QueueFilter())
    assert (progress.label, progress.fraction) == ("0 of 0 reviewed", 1.0)


def test_unknown_order_is_refused(sqlite_engine) -> None:
    evaluation(sqlite_engine, "a")
    with session_scope(sqlite_engine) as s, pytest.raises(ValueError, match="order"):
        next_item(session=s, filters=QueueFilter(order="random"))


def test_queue_options_list_products_metrics_and_languages(sqlite_engine) -> None:
    evaluation(sqlite_engine, "a", product="acme", language="tr", metrics=("clarity",))
    standalone(sqlite_engine, "pr#1", product="beta")
    with session_scope(sqlite_engine) as s:
        assert queue_options(session=s) == {
            "products": ["acme", "beta"],
            "metrics": ["clarity"],
            "languages": ["tr"],
        }


def test_queue_options_offer_only_languages_with_live_judgments(engine) -> None:
    evaluation(engine, "live", language="tr")
    evaluation(engine, "gone", language="de", archived=True)
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(id="unjudged", question="q", model_answer="a", product="acme", language="fr")
        )
    standalone(engine, "pr#1")
    with session_scope(engine, read_only=True) as s:
        assert queue_options(session=s)["languages"] == ["tr"]


# ---------------------------------------------------------------------------------------------
# The workspace: rows by gap and the score keys


@pytest.mark.parametrize(
    ("scale", "keys"),
    [
        (DecisionScale(spec=MetricSpec(slug="m", display_name="M")), {str(i): str(i) for i in range(1, 6)}),
        (
            DecisionScale(
                spec=MetricSpec(slug="m", display_name="M", min_value=0, max_value=1, integer_scale=False)
            ),
            {"1": "0", "2": "0.25", "3": "0.5", "4": "0.75", "5": "1"},
        ),
        (
            DecisionScale(spec=MetricSpec(slug="m", display_name="M", min_value=0, max_value=100)),
            {"1": "0", "2": "25", "3": "50", "4": "75", "5": "100"},
        ),
        (DecisionScale(labels=("INCLUDE", "EXCLUDE")), {"1": "INCLUDE", "2": "EXCLUDE"}),
        (
            DecisionScale(
                spec=MetricSpec(
                    slug="m", display_name="M", min_value=-math.inf, max_value=math.inf, integer_scale=False
                )
            ),
            {},
        ),
    ],
)
def test_score_keys_fit_each_scale(scale: DecisionScale, keys: dict[str, str]) -> None:
    assert score_keys(scale) == keys
    for decision in keys.values():
        assert scale.parse(decision) == decision  # every key gives a decision the scale accepts


def test_workspace_rows_come_largest_gap_first_with_the_judgments_own_score(engine) -> None:
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id="ws", question="q", model_answer="Paris is big.", product="acme",
                user_scores_json={"truthfulness": {"score": 5}, "clarity": {"score": 1}, "safety": {"score": 4}},
                evidence_json={"clarity": [{"quote": "Paris", "start": 0, "end": 5, "why": "w"}]},
            )
        )  # fmt: skip
        s.flush()
        for metric, decision in (("truthfulness", "4"), ("safety", "4"), ("clarity", "4")):
            s.add(
                Judgment(
                    change_id=f"ws:{metric}",
                    product="acme",
                    metric=metric,
                    snapshot_id="ws",
                    decision=decision,
                )
            )
    with session_scope(engine, read_only=True) as s:
        item = load_item(session=s, key="snapshot:ws", filters=QueueFilter())
        assert item is not None
        ws = load_workspace(session=s, item=item)
        assert [(r.judgment.metric, r.gap) for r in ws.rows] == [
            ("clarity", 3),
            ("truthfulness", 1),
            ("safety", 0),
        ]
        assert [(span.metric, span.start, span.end) for span in ws.spans] == [("clarity", 0, 5)]
        assert ws.highlighted_metrics == ["clarity"]
