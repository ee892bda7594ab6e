"""Agreement between reviewers (lib.agreement) read from team-queue labels, on SQLite and PostgreSQL.

Labels are written as rows (a queue, its judgments, each reviewer's blind and final label) so each
test controls every value; the figures are compared with the reference implementations on the same
values (the `krippendorff` package, scikit-learn) and with hand-counted calibration and anchoring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import krippendorff
import numpy as np
import pytest
from sqlalchemy import Engine

from lib import agreement
from lib.agreement import AgreementFilters
from lib.analytics import AnalyticsFilters
from lib.db import session_scope
from lib.models import (
    EvaluationSnapshot,
    Judgment,
    MetricDefinition,
    ReviewLabel,
    ReviewQueue,
    ReviewQueueItem,
    ReviewQueueJudgment,
)
from tests.kappa import cohen_kappa_score

T0 = datetime(2025, 2, 3, 9, 0, tzinfo=UTC)
# Krippendorff (2011) section C: four observers, twelve units, None where an observer did not code.
SECTION_C = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]
REVIEWERS = ("ana", "ben", "cem", "dan")


@dataclass
class Label:
    reviewer: str
    final: str | None
    blind: str | None = None
    withdrawn: bool = False


def fmt(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def add_queue(
    engine: Engine,
    name: str,
    items: Sequence[tuple[str, Sequence[Label]]],
    *,
    product: str = "acme",
    metric: str | None = "clarity",
    mode: str = "open",
    tolerance: float | None = None,
    judge: Sequence[str] | None = None,
    resolved: Sequence[tuple[str, str | None]] | None = None,
    language: str = "en",
    day: int = 0,
) -> int:
    """A queue over len(items) new judgments; item i gets the labels given, the judge's decision
    judge[i] (default "3" / "INCLUDE") and the state and decision resolved[i] (default open)."""
    with session_scope(engine) as s:
        queue = ReviewQueue(
            name=name, product=product, overlap=2, mode=mode, tolerance=tolerance, created_by="lead"
        )
        s.add(queue)
        s.flush()
        assert queue.id is not None
        for position, (key, labels) in enumerate(items):
            snapshot_id = f"{name}-{key}"
            s.add(
                EvaluationSnapshot(
                    id=snapshot_id, question="q", model_answer="a", product=product, language=language,
                    created_at=T0 + timedelta(days=day),
                )
            )  # fmt: skip
            s.flush()
            decision = judge[position] if judge else ("3" if metric else "INCLUDE")
            judgment = Judgment(
                change_id=f"{snapshot_id}:{metric or 'label'}", product=product, metric=metric,
                snapshot_id=snapshot_id if metric else None, decision=decision, timestamp=T0,
            )  # fmt: skip
            item = ReviewQueueItem(queue_id=queue.id, position=position, item_key=f"snapshot:{snapshot_id}")
            s.add_all([judgment, item])
            s.flush()
            assert judgment.id is not None and item.id is not None
            state, decided = resolved[position] if resolved else ("open", None)
            s.add(
                ReviewQueueJudgment(
                    queue_id=queue.id, item_id=item.id, judgment_id=judgment.id, state=state, decision=decided,
                    held=state == "open", labels=len(labels),
                )
            )  # fmt: skip
            for label in labels:
                s.add(
                    ReviewLabel(
                        queue_id=queue.id, item_id=item.id, judgment_id=judgment.id, reviewer=label.reviewer,
                        blind_decision=label.blind, decision=label.final, labelled_at=T0,
                        withdrawn_at=T0 if label.withdrawn else None,
                    )
                )  # fmt: skip
        return queue.id


def matrix_items(matrix: Sequence[Sequence[object]]) -> list[tuple[str, list[Label]]]:
    """Reliability data (reviewers x items, None = not labelled) as queue items with labels."""
    return [
        (f"{u:02d}", [Label(REVIEWERS[r], fmt(row[u])) for r, row in enumerate(matrix) if row[u] is not None])
        for u in range(len(matrix[0]))
    ]


def reference(matrix: Sequence[Sequence[object]], level: str) -> float:
    data = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    return float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))


def load(engine: Engine, **filters) -> agreement.ReviewerAgreement:
    with session_scope(engine, read_only=True) as s:
        return agreement.load_agreement(session=s, filters=AgreementFilters(resamples=200, **filters))


def continuous_rubric(engine: Engine, product: str = "beta") -> None:
    with session_scope(engine) as s:
        s.add(
            MetricDefinition(
                product=product, slug="fluency", display_name="Fluency", min_value=0, max_value=1,
                integer_scale=False,
            )
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------


@pytest.mark.pg_repeats(
    "statements and lines of test_calibration_counts_signed_differences_and_adjudications_against_each_reviewer, test_human_ceiling_on_the_items_two_reviewers_labelled_follows_analytics_filters"
)
def test_whole_number_scale_gives_ordinal_alpha_equal_to_the_reference(engine: Engine) -> None:
    add_queue(engine, "team", matrix_items(SECTION_C))
    result = load(engine)
    row = result.metrics.iloc[0]
    assert (row["product"], row["metric"], row["level"], row["scale"]) == (
        "acme",
        "clarity",
        "ordinal",
        "1–5",
    )
    assert row["alpha"] == pytest.approx(reference(SECTION_C, "ordinal"))
    assert round(row["alpha"], 3) == 0.815
    assert row["alpha_lo"] < row["alpha"] < row["alpha_hi"]
    assert (row["items"], row["single_label_items"], row["labels"], row["reviewers"]) == (11, 1, 41, 4)
    assert result.labels == 41


@pytest.mark.pg_repeats(
    "statements and lines of test_calibration_counts_signed_differences_and_adjudications_against_each_reviewer, test_human_ceiling_on_the_items_two_reviewers_labelled_follows_analytics_filters"
)
def test_reviewer_pairs_kappa_equals_scikit_learn_on_their_shared_items(engine: Engine) -> None:
    add_queue(engine, "team", matrix_items(SECTION_C))
    pairs = load(engine).pairs.set_index(["reviewer_a", "reviewer_b"])
    assert len(pairs) == 6  # every two of four reviewers share an item
    for a, b in [("ana", "ben"), ("ben", "dan"), ("cem", "dan")]:
        x, y = SECTION_C[REVIEWERS.index(a)], SECTION_C[REVIEWERS.index(b)]
        shared = [(p, q) for p, q in zip(x, y, strict=True) if p is not None and q is not None]
        first, second = zip(*shared, strict=True)
        row = pairs.loc[(a, b)]
        assert row["items"] == len(shared)
        assert row["kappa"] == pytest.approx(
            cohen_kappa_score(first, second, labels=[1, 2, 3, 4, 5], weights="quadratic")
        )
        assert row["exact_agreement"] == pytest.approx(np.mean(np.equal(first, second)))
        assert row["kappa_weights"] == "quadratic"


def test_labels_give_nominal_alpha_and_unweighted_kappa(sqlite_engine: Engine) -> None:
    codes = {1: "INCLUDE", 2: "EXCLUDE", 3: "UNCERTAIN", 4: "EXCLUDE", 5: "INCLUDE"}
    labels = [[None if v is None else codes[v] for v in row] for row in SECTION_C]
    numeric = [
        [None if v is None else {"INCLUDE": 1, "EXCLUDE": 2, "UNCERTAIN": 3}[v] for v in r] for r in labels
    ]
    add_queue(sqlite_engine, "labels", matrix_items(labels), metric=None)
    result = load(sqlite_engine)
    row = result.metrics.iloc[0]
    assert (row["level"], row["scale"], row["kappa_weights"]) == ("nominal", "labels", "none")
    assert row["alpha"] == pytest.approx(reference(numeric, "nominal"))
    assert math.isnan(row["within_1_agreement"])


def test_continuous_scale_gives_interval_alpha_and_within_one_on_its_own_span(sqlite_engine: Engine) -> None:
    continuous_rubric(sqlite_engine)
    matrix = [[0.1, 0.5, 0.9, 0.3, None], [0.2, 0.5, 0.6, 0.35, 0.8], [None, 0.7, 0.9, 0.3, 0.75]]
    add_queue(sqlite_engine, "fluency", matrix_items(matrix), product="beta", metric="fluency")
    row = load(sqlite_engine).metrics.iloc[0]
    assert (row["level"], row["kappa_weights"]) == ("interval", "n/a")
    assert row["alpha"] == pytest.approx(reference(matrix, "interval"))
    # Pairs: (0.1,0.2) (0.5,0.5) (0.5,0.7) (0.5,0.7) (0.9,0.6) (0.9,0.9) (0.6,0.9) (0.3,0.35) (0.3,0.3)
    # (0.35,0.3) (0.8,0.75): within 0.25 (one step of the 1-5 span on 0-1) all but the two 0.3 gaps.
    assert row["exact_agreement"] == pytest.approx(3 / 11)
    assert row["within_1_agreement"] == pytest.approx(9 / 11)
    assert math.isnan(row["mean_pairwise_kappa"])


def test_each_queue_gets_its_own_row_and_filters_narrow_the_labels(sqlite_engine: Engine) -> None:
    first = add_queue(sqlite_engine, "first", matrix_items([row[:6] for row in SECTION_C]))
    second = add_queue(sqlite_engine, "second", matrix_items([row[6:] for row in SECTION_C]), product="other")
    result = load(sqlite_engine)
    by_queue = result.queues.set_index("queue")
    assert by_queue.loc["first", "alpha"] == pytest.approx(reference([r[:6] for r in SECTION_C], "ordinal"))
    assert by_queue.loc["second", "alpha"] == pytest.approx(reference([r[6:] for r in SECTION_C], "ordinal"))
    assert list(result.metrics["product"]) == ["acme", "other"]
    only = load(sqlite_engine, queue_ids=(second,))
    assert list(only.metrics["product"]) == ["other"] and list(only.queues["queue_id"]) == [second]
    assert list(load(sqlite_engine, products=("acme",)).queues["queue_id"]) == [first]


def test_withdrawn_labels_and_labels_awaiting_a_second_reviewer_do_not_count(sqlite_engine: Engine) -> None:
    add_queue(
        sqlite_engine,
        "team",
        [
            ("a", [Label("ana", "4"), Label("ben", "4")]),
            ("b", [Label("ana", "2"), Label("ben", "5", withdrawn=True)]),
            ("c", [Label("ana", "1"), Label("ben", "1")]),
            ("d", [Label("ana", "3")]),
        ],
    )
    row = load(sqlite_engine).metrics.iloc[0]
    assert (row["items"], row["single_label_items"], row["labels"]) == (2, 2, 6)
    assert row["exact_agreement"] == 1.0 and row["alpha"] == pytest.approx(1.0)


def test_blind_basis_reads_blind_labels_of_blind_first_queues_only(sqlite_engine: Engine) -> None:
    add_queue(
        sqlite_engine, "blind", [(str(i), [Label("ana", "3", blind=b1), Label("ben", "3", blind=b2)])
                                 for i, (b1, b2) in enumerate([("1", "5"), ("2", "4"), ("5", "1")])],
        mode="blind",
    )  # fmt: skip
    add_queue(sqlite_engine, "open", [("x", [Label("ana", "1", blind="1"), Label("ben", "1", blind="1")])])
    final = load(sqlite_engine)
    blind = load(sqlite_engine, basis="blind")
    assert final.metrics.iloc[0]["labels"] == 8 and final.metrics.iloc[0]["exact_agreement"] == 1.0
    assert blind.metrics.iloc[0]["labels"] == 6  # the open queue's blind column is not a blind label
    assert blind.metrics.iloc[0]["exact_agreement"] == 0.0
    assert blind.metrics.iloc[0]["alpha"] < 0
    with pytest.raises(agreement.AgreementError, match="unknown basis"):
        load(sqlite_engine, basis="sideways")


def test_calibration_counts_signed_differences_and_adjudications_against_each_reviewer(
    engine: Engine,
) -> None:
    items = [
        ("1", [Label("ana", "4"), Label("ben", "3")]),  # adjudicated 3: against ana
        ("2", [Label("ana", "5"), Label("ben", "4")]),  # adjudicated 4: against ana
        ("3", [Label("ana", "2"), Label("ben", "1")]),  # adjudicated 2: against ben
        ("4", [Label("ana", "3"), Label("ben", "3")]),  # resolved 3
        ("5", [Label("ana", "1"), Label("ben", "5")]),  # still disputed: no decision yet
    ]
    resolved = [
        ("adjudicated", "3"),
        ("adjudicated", "4"),
        ("adjudicated", "2"),
        ("resolved", "3"),
        ("disputed", None),
    ]
    add_queue(engine, "team", items, resolved=resolved)
    calibration = load(engine).calibration
    ana = calibration[(calibration["reviewer"] == "ana") & (calibration["metric"] == "clarity")].iloc[0]
    ben = calibration[(calibration["reviewer"] == "ben") & (calibration["metric"] == "clarity")].iloc[0]
    assert (ana["decided"], ana["adjudicated"], ana["adjudicated_against"]) == (4, 3, 2)
    assert ana["mean_signed_difference"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert ana["mean_signed_difference_rescaled"] == pytest.approx(0.5)  # 1-5 is already the 1-5 span
    assert ana["differs_from_decision"] == pytest.approx(0.5)
    assert ana["adjudicated_against_share"] == pytest.approx(2 / 3)
    assert ana["adjudicated_against_share_lo"] < 2 / 3 < ana["adjudicated_against_share_hi"]
    assert (ben["adjudicated_against"], ben["mean_signed_difference"]) == (1, pytest.approx(-1 / 4))
    everyone = calibration[calibration["reviewer"] == agreement.ALL_REVIEWERS].iloc[0]
    assert (everyone["decided"], everyone["adjudicated"], everyone["adjudicated_against"]) == (8, 6, 3)
    assert everyone["mean_signed_difference_rescaled"] == pytest.approx(1 / 8)


@pytest.mark.pg_repeats(
    "statements and lines of test_calibration_counts_signed_differences_and_adjudications_against_each_reviewer"
)
def test_anchoring_counts_moves_toward_and_away_from_the_judge(engine: Engine) -> None:
    # Judge 4 everywhere. ana: 2->4 (toward, all the way), 3->3 (stays), 5->4 (toward), 4->4 (stays).
    # ben: 4->2 (away), 1->2 (toward by 1), 2->2, 3->4 (toward).
    pairs = [("2", "4", "4", "2"), ("3", "3", "1", "2"), ("5", "4", "2", "2"), ("4", "4", "3", "4")]
    items = [
        (str(i), [Label("ana", fa, blind=ba), Label("ben", fb, blind=bb)])
        for i, (ba, fa, bb, fb) in enumerate(pairs)
    ]
    add_queue(engine, "blind", items, mode="blind", judge=["4"] * 4)
    add_queue(engine, "open", [("x", [Label("ana", "1", blind="5"), Label("ben", "1")])])  # not anchoring
    anchoring = load(engine).anchoring
    ana = anchoring[(anchoring["reviewer"] == "ana") & (anchoring["metric"] == "clarity")].iloc[0]
    ben = anchoring[(anchoring["reviewer"] == "ben") & (anchoring["metric"] == "clarity")].iloc[0]
    assert (ana["labels"], ana["changed"], ana["could_move"], ana["moved_toward_judge"], ana["moved_away"]) == (
        4, 2, 3, 2, 0,
    )  # fmt: skip
    assert ana["toward_share"] == pytest.approx(2 / 3)
    assert ana["mean_shift_toward_judge"] == pytest.approx((2 + 0 + 1 + 0) / 4)
    assert (ana["blind_exact_with_judge"], ana["final_exact_with_judge"]) == (0.25, 0.75)
    assert (ben["changed"], ben["moved_toward_judge"], ben["moved_away"]) == (3, 2, 1)
    assert ben["mean_shift_toward_judge"] == pytest.approx((-2 + 1 + 0 + 1) / 4)
    everyone = anchoring[anchoring["reviewer"] == agreement.ALL_REVIEWERS].iloc[0]
    assert (everyone["labels"], everyone["moved_toward_judge"], everyone["moved_away"]) == (8, 4, 1)
    assert everyone["mean_shift_toward_judge"] == pytest.approx(3 / 8)


def test_anchoring_on_labels_counts_switches_to_the_judges_label(sqlite_engine: Engine) -> None:
    items = [
        ("1", [Label("ana", "INCLUDE", blind="EXCLUDE")]),  # toward (judge INCLUDE)
        ("2", [Label("ana", "EXCLUDE", blind="INCLUDE")]),  # away
        ("3", [Label("ana", "UNCERTAIN", blind="EXCLUDE")]),  # changed, neither
    ]
    add_queue(sqlite_engine, "labels", items, metric=None, mode="blind")
    row = load(sqlite_engine).anchoring.iloc[0]
    assert (row["changed"], row["could_move"], row["moved_toward_judge"], row["moved_away"]) == (3, 2, 1, 1)
    assert math.isnan(row["mean_shift_toward_judge"])


@pytest.mark.pg_repeats(
    "statements and lines of test_calibration_counts_signed_differences_and_adjudications_against_each_reviewer"
)
def test_nothing_labelled_gives_empty_tables(engine: Engine) -> None:
    result = load(engine)
    assert result.empty and result.metrics.empty and result.pairs.empty and result.anchoring.empty
    assert list(result.metrics.columns) == agreement.METRIC_COLUMNS


def test_human_ceiling_on_the_items_two_reviewers_labelled_follows_analytics_filters(engine: Engine) -> None:
    # English items: reviewers agree on 3 of 4 pairs; the judge (3 everywhere) agrees with 4 of 8 labels.
    english = [
        ("1", [Label("ana", "3"), Label("ben", "3")]),
        ("2", [Label("ana", "4"), Label("ben", "4")]),
        ("3", [Label("ana", "3"), Label("ben", "3")]),
        ("4", [Label("ana", "1"), Label("ben", "5")]),
        ("5", [Label("ana", "3")]),  # one label: not a ceiling item
    ]
    add_queue(engine, "en", english)
    add_queue(engine, "tr", [("1", [Label("ana", "1"), Label("ben", "5")])], language="tr", day=10)
    with session_scope(engine, read_only=True) as s:
        everything = agreement.human_ceiling(session=s, filters=AnalyticsFilters())
        english_only = agreement.human_ceiling(session=s, filters=AnalyticsFilters(language="en"))
        early = agreement.human_ceiling(session=s, filters=AnalyticsFilters(end=date(2025, 2, 5)))
    row = english_only.iloc[0]
    assert (row["items"], row["human_pairs"], row["judge_pairs"]) == (4, 4, 8)
    assert row["human_exact_agreement"] == pytest.approx(3 / 4)
    assert row["judge_exact_agreement"] == pytest.approx(4 / 8)
    a, b = [3, 4, 3, 1], [3, 4, 3, 5]
    assert row["human_weighted_kappa"] == pytest.approx(
        cohen_kappa_score(a + b, b + a, labels=[1, 2, 3, 4, 5], weights="quadratic")
    )
    assert everything.iloc[0]["items"] == 5
    assert early.iloc[0]["items"] == 4
