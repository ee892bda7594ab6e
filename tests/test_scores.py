"""The narrow scores table and agreement counts (issue 19 item 2), on SQLite and PostgreSQL.

Two proofs on random data: the counts-based report equals the pair-based computation Analytics ran
before (DuckDB SQL over the JSON columns, kept here verbatim as the reference), and the counts the
write paths maintain equal a full rebuild after random imports, judge runs, reviews, archives and
restores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from lib import analytics, corrections, inspector, reliability, scores
from lib.analytics import AnalyticsFilters
from lib.db import create_db_engine, session_scope
from lib.duck import duck_connect, fetch_frame, table_ref
from lib.importer import import_evaluations
from lib.judge import write_snapshot
from lib.metrics import DEFAULT_METRICS, metrics_for_product
from lib.models import (
    AgreementCount,
    AgreementTotal,
    EvaluationSnapshot,
    Judgment,
    MetricDefinition,
    MetricScore,
)
from lib.snapshots import build_snapshot_rows
from tests.conftest import fill_database, module_db_url

START = datetime(2026, 1, 1, tzinfo=UTC)  # a Thursday: weeks are cut at both ends
PRODUCTS = ("alpha", "beta", "gamma")  # gamma has its own rubric: one integer and one continuous metric
SLUGS = [m.slug for m in DEFAULT_METRICS[:4]]

# --- The reference: the pair-based DuckDB computation Analytics used before the counts -------------

_EPS = 1e-9


def _score_sql(column: str) -> str:
    entry = f"json_extract(s.{column}, '/' || m.slug)"
    value = f"CASE WHEN json_type({entry}) = 'OBJECT' THEN json_extract({entry}, '/score') ELSE {entry} END"
    return (
        f"CASE WHEN json_type({value}) IN ('BIGINT', 'UBIGINT', 'DOUBLE') "
        f"THEN CAST(CAST({value} AS VARCHAR) AS DOUBLE) END"
    )


def _pairs_sql(filters: AnalyticsFilters) -> tuple[str, list[object]]:
    where = ["s.deleted_at IS NULL"]
    params: list[object] = []
    if filters.products:
        where.append(f"s.product IN ({', '.join('?' for _ in filters.products)})")
        params.extend(filters.products)
    if filters.language:
        where.append("s.language = ?")
        params.append(filters.language)
    if filters.start:
        where.append("s.created_at >= CAST(? AS TIMESTAMPTZ)")
        params.append(f"{filters.start.isoformat()} 00:00:00+00")
    if filters.end:
        where.append("s.created_at < CAST(? AS TIMESTAMPTZ)")
        params.append(f"{(filters.end + timedelta(days=1)).isoformat()} 00:00:00+00")
    sql = f"""
    WITH scored AS (
        SELECT s.product, m.slug AS metric, m.display_name AS metric_name, m.position,
               m.min_value, m.max_value, m.integer_scale, s.created_at,
               {_score_sql("user_scores_json")} AS u, {_score_sql("judge_scores_json")} AS j
        FROM {table_ref("evaluation_snapshots")} AS s JOIN specs AS m ON m.product = s.product
        WHERE {" AND ".join(where)}
    ),
    pairs AS (
        SELECT *, abs(u - j) * 4.0 / nullif(max_value - min_value, 0) AS rescaled_gap
        FROM scored WHERE u IS NOT NULL AND j IS NOT NULL
    )
    """
    return sql, params


def _reference(con: duckdb.DuckDBPyConnection, specs: pd.DataFrame, filters: AnalyticsFilters) -> dict:
    con.register("specs", pa.Table.from_pandas(specs, preserve_index=False))
    pairs, params = _pairs_sql(filters)
    summary = fetch_frame(
        con,
        pairs
        + f"""
        , ranked AS (
            SELECT product, metric, u, j,
                   rank() OVER (PARTITION BY product, metric ORDER BY u)
                     + (count(*) OVER (PARTITION BY product, metric, u) - 1) / 2.0 AS ru,
                   rank() OVER (PARTITION BY product, metric ORDER BY j)
                     + (count(*) OVER (PARTITION BY product, metric, j) - 1) / 2.0 AS rj
            FROM pairs
        ),
        rho AS (
            SELECT product, metric,
                   CASE WHEN var_pop(ru) > 0 AND var_pop(rj) > 0 THEN corr(ru, rj) END AS spearman
            FROM ranked GROUP BY ALL
        )
        SELECT p.product, p.metric, any_value(p.metric_name) AS metric_name, any_value(p.position) AS position,
               bool_and(p.integer_scale) AS integer_scale, count(*) AS pairs,
               avg(CASE WHEN p.u = p.j THEN 1.0 ELSE 0.0 END) AS exact_agreement,
               avg(CASE WHEN p.rescaled_gap <= 1.0 + {_EPS} THEN 1.0 ELSE 0.0 END) AS within_1_agreement,
               avg(p.rescaled_gap) AS mean_rescaled_gap, any_value(r.spearman) AS spearman
        FROM pairs AS p JOIN rho AS r USING (product, metric)
        GROUP BY p.product, p.metric ORDER BY p.product, position
        """,
        params,
    )
    counts = fetch_frame(
        con,
        pairs + "SELECT product, metric, u, j, count(*) AS n FROM pairs WHERE integer_scale GROUP BY ALL",
        params,
    )
    kappas = {
        key: reliability.kappa(g["u"], g["j"], g["n"], weights="quadratic")
        for key, g in counts.groupby(["product", "metric"], sort=False)
    }
    summary["weighted_kappa"] = [
        kappas.get((r.product, r.metric), math.nan) if r.integer_scale else math.nan
        for r in summary.itertuples()
    ]
    gaps = fetch_frame(
        con,
        pairs
        + f"""
        SELECT product, metric, metric_name,
               least(floor(rescaled_gap / {analytics.GAP_BUCKET}) * {analytics.GAP_BUCKET}, 4.0) AS gap_bucket,
               count(*) AS pairs
        FROM pairs GROUP BY ALL ORDER BY product, any_value(position), gap_bucket
        """,
        params,
    )
    weekly = fetch_frame(
        con,
        pairs
        + f"""
        SELECT product, CAST(date_trunc('week', created_at) AS DATE) AS week, count(*) AS pairs,
               avg(CASE WHEN u = j THEN 1.0 ELSE 0.0 END) AS exact_agreement,
               avg(CASE WHEN rescaled_gap <= 1.0 + {_EPS} THEN 1.0 ELSE 0.0 END) AS within_1_agreement
        FROM pairs GROUP BY ALL ORDER BY product, week
        """,
        params,
    )
    return {"metrics": summary, "gaps": gaps, "weekly": weekly}


def reference_report(engine: Engine, filters: AnalyticsFilters) -> dict[str, pd.DataFrame]:
    with Session(engine) as session:
        products = list(filters.products) or sorted(
            set(
                session.exec(
                    select(EvaluationSnapshot.product).where(EvaluationSnapshot.deleted_at.is_(None))
                ).all()
            )  # type: ignore[union-attr,call-overload]
        )
        specs = pd.DataFrame(
            [
                {"product": product, "position": position, "slug": spec.slug, "display_name": spec.display_name,
                 "min_value": float(spec.min_value), "max_value": float(spec.max_value),
                 "integer_scale": bool(spec.integer_scale)}
                for product in products
                for position, spec in enumerate(metrics_for_product(session=session, product=product))
            ],
            columns=["product", "position", "slug", "display_name", "min_value", "max_value", "integer_scale"],
        )  # fmt: skip
    con = duck_connect(engine, tables=["evaluation_snapshots"])  # the Arrow path on SQLite: no scanner here
    try:
        return _reference(con, specs, filters)
    finally:
        con.close()


def assert_same_report(engine: Engine, filters: AnalyticsFilters) -> analytics.AgreementReport:
    with Session(engine) as session:
        got = analytics.load_report(session=session, filters=filters)
    want = reference_report(engine, filters)
    columns = {
        "metrics": analytics.METRIC_COLUMNS,
        "gaps": analytics.GAP_COLUMNS,
        "weekly": analytics.WEEK_COLUMNS,
    }
    for name, cols in columns.items():
        frame = getattr(got, name)
        cols = [c for c in cols if c != "scale"]  # display text, not a measure
        expected = want[name][cols] if not want[name].empty else pd.DataFrame(columns=cols)
        assert len(frame) == len(expected), name
        if frame.empty:
            continue
        pd.testing.assert_frame_equal(
            frame[cols].reset_index(drop=True),
            expected.reset_index(drop=True),
            check_dtype=False,
            check_exact=False,
            rtol=1e-9,
            atol=1e-12,
        )
    return got


# --- Random data -------------------------------------------------------------------------------------


def _entry(rng: random.Random, value: float) -> Any:
    roll = rng.random()
    if roll < 0.05:
        return True  # a boolean is not a score
    if roll < 0.08:
        return str(value)  # nor is a string
    return value if roll < 0.4 else {"score": value, "reason": "why"}


def _scores(rng: random.Random, product: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if product == "gamma":
        values: dict[str, list[float]] = {"fluency": [i / 10 for i in range(11)], "tone": [1, 2, 3]}
    else:
        values = {slug: [1, 2, 3, 4, 5] for slug in SLUGS}
    user: dict[str, Any] = {}
    judge: dict[str, Any] = {}
    for slug, choices in values.items():
        if rng.random() < 0.85:
            user[slug] = _entry(rng, rng.choice(choices))
        if rng.random() < 0.85:
            judge[slug] = _entry(rng, rng.choice(choices))
    return user, judge


def _rubric(session: Session) -> None:
    session.add(MetricDefinition(product="gamma", slug="fluency", display_name="Fluency", min_value=0.0,
                                 max_value=1.0, integer_scale=False))  # fmt: skip
    session.add(MetricDefinition(product="gamma", slug="tone", display_name="Tone", min_value=1.0,
                                 max_value=3.0, integer_scale=True))  # fmt: skip


def random_snapshot(rng: random.Random, i: int) -> EvaluationSnapshot:
    product = rng.choice(PRODUCTS)
    user, judge = _scores(rng, product)
    created = START + timedelta(seconds=rng.randrange(45 * 86400))
    return EvaluationSnapshot(
        id=f"r_{i:05d}",
        question="q",
        model_answer="a",
        product=product,
        language=rng.choice(("en", "en", "tr")),
        created_at=created,
        deleted_at=created + timedelta(days=1) if rng.random() < 0.1 else None,
        user_scores_json=user,
        judge_scores_json=judge,
    )


def _fill_random(engine: Engine) -> Engine:
    rng = random.Random(19)
    with session_scope(engine) as s:
        _rubric(s)
        s.add_all(random_snapshot(rng, i) for i in range(400))
    return engine


@pytest.fixture
def random_data(request: pytest.FixtureRequest, engine: Engine) -> Engine:
    """The random data in this test's own database, for tests that change it."""
    return fill_database(request, engine, _fill_random)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_random_data(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """The same random data once per backend, for the read-only report comparisons (~1 s a fill)."""
    engine = create_db_engine(module_db_url(request, tmp_path_factory))
    try:
        yield fill_database(request, engine, _fill_random)
    finally:
        engine.dispose()


FILTERS = [
    AnalyticsFilters(),
    AnalyticsFilters(products=("alpha", "gamma")),
    AnalyticsFilters(language="tr"),
    AnalyticsFilters(start=date(2026, 1, 3), end=date(2026, 1, 29)),  # Saturday to Thursday: both ends cut
    AnalyticsFilters(start=date(2026, 1, 5), end=date(2026, 1, 25)),  # Monday to Sunday: whole weeks only
    AnalyticsFilters(start=date(2026, 1, 14)),
    AnalyticsFilters(end=date(2026, 1, 10), language="en"),
    AnalyticsFilters(start=date(2026, 1, 7), end=date(2026, 1, 9)),  # inside one week
    AnalyticsFilters(start=date(2026, 1, 10), end=date(2026, 1, 13)),  # across one week boundary
    AnalyticsFilters(start=date(2026, 1, 13), end=date(2026, 1, 12)),  # backwards: nothing
    AnalyticsFilters(start=date(2025, 12, 1), end=date(2026, 3, 1)),  # the whole live span and more
]


# The PostgreSQL variants of filters 0, 9 and 10 (none, an empty range, the whole span) send the statement
# shapes of the others and run no PostgreSQL-only line of their own; the cut weeks stay on both backends.
@pytest.mark.parametrize(
    "filters",
    [
        pytest.param(f, marks=pytest.mark.pg_repeats("shapes of filters 1-8")) if i in (0, 9, 10) else f
        for i, f in enumerate(FILTERS)
    ],
    ids=[str(i) for i in range(len(FILTERS))],
)
def test_counts_report_equals_pair_based_reference(
    shared_random_data: Engine, filters: AnalyticsFilters
) -> None:
    report = assert_same_report(shared_random_data, filters)
    if filters.start != date(2026, 1, 13):  # every other filter matches pairs
        assert not report.empty


def test_reference_sees_a_changed_score(random_data: Engine) -> None:
    """The comparison can fail: a JSON edit that bypasses lib.scores makes the two disagree."""
    with session_scope(random_data) as s:
        target = s.exec(select(MetricScore).where(MetricScore.live.is_(True)).limit(1)).one()  # type: ignore[attr-defined,call-overload]
        snap = s.get(EvaluationSnapshot, target.snapshot_id)
        assert snap is not None
        bumped = 1.0 if target.user_score != 1.0 else 2.0
        s.connection().execute(
            EvaluationSnapshot.__table__.update()  # type: ignore[attr-defined]
            .where(EvaluationSnapshot.__table__.c.id == snap.id)  # type: ignore[attr-defined]
            .values(user_scores_json={**snap.user_scores_json, target.metric: bumped})
        )
    with pytest.raises(AssertionError):
        assert_same_report(random_data, AnalyticsFilters())


# --- Maintained counts equal a rebuild ----------------------------------------------------------------


def table_state(engine: Engine) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """Weekly counts, totals (zero rows dropped: a retraction may leave one) and score rows."""
    with Session(engine) as s:
        counts = sorted(
            (c.product, c.language, c.metric, c.week, c.user_score, c.judge_score, c.n)
            for c in s.exec(select(AgreementCount)).all()
            if c.n
        )
        totals = sorted(
            (t.product, t.language, t.metric, t.user_score, t.judge_score, t.n)
            for t in s.exec(select(AgreementTotal)).all()
            if t.n
        )
        rows = sorted(
            (
                r.snapshot_id,
                r.metric,
                r.product,
                r.language,
                r.day,
                r.week,
                r.user_score,
                r.judge_score,
                r.live,
            )
            for r in s.exec(select(MetricScore)).all()
        )
    return counts, totals, rows


def _record(rng: random.Random, i: int) -> dict[str, Any]:
    product = rng.choice(("alpha", "beta"))
    user, judge = _scores(rng, product)
    user = {
        k: v for k, v in user.items() if not isinstance(v, bool | str)
    }  # the importer refuses non-numbers
    judge = {k: v for k, v in judge.items() if not isinstance(v, bool | str)}
    if not user and not judge:
        user = {SLUGS[0]: 3}
    return {
        "question": f"Question {i}?",
        "model_answer": f"Answer {i}.",
        "product": product,
        "language": rng.choice(("en", "tr")),
        "created_at": (START + timedelta(seconds=rng.randrange(45 * 86400))).isoformat(),
        "user_scores": user,
        "judge_scores": judge,
    }


def _operate(engine: Engine, rng: random.Random, step: int) -> None:
    """One random write through the app's own paths."""
    op = rng.choice(("import", "judge", "review", "review", "archive", "archive", "restore"))
    with session_scope(engine) as s:
        if op == "import":
            import_evaluations(
                session=s, records=[_record(rng, step * 100 + k) for k in range(rng.randint(1, 30))]
            )
        elif op == "judge":
            record = {**_record(rng, step * 100), "id": f"judged_{step}"}
            row, judgments = build_snapshot_rows(
                record, metrics_for_product(session=s, product=record["product"]), reviewer="judge"
            )
            write_snapshot(session=s, row=row, judgments=judgments)
        elif op == "review":
            open_ids = s.exec(
                select(Judgment.id, Judgment.version, Judgment.decision).where(Judgment.reviewed_at.is_(None))
            ).all()  # type: ignore[union-attr,call-overload]
            for judgment_id, version, decision in rng.sample(open_ids, min(5, len(open_ids))):
                overrule = rng.random() < 0.5
                corrections.record_review(
                    session=s, judgment_id=judgment_id, expected_version=version,
                    action="overrule" if overrule else "confirm",
                    user_decision="1" if decision != "1" else "2", reviewer="ayse", reason="r",
                )  # fmt: skip
        else:
            archived = op == "archive"
            ids = s.exec(
                select(EvaluationSnapshot.id).where(
                    EvaluationSnapshot.deleted_at.is_(None)
                    if archived
                    else EvaluationSnapshot.deleted_at.is_not(None)
                )
            ).all()  # type: ignore[union-attr,call-overload]
            action = inspector.archive_evaluation if archived else inspector.restore_evaluation
            for snapshot_id in rng.sample(ids, min(4, len(ids))):
                assert action(session=s, snapshot_id=snapshot_id, reviewer="lead")


def test_maintained_counts_equal_a_rebuild_after_random_operations(random_data: Engine) -> None:
    rng = random.Random(7)
    # 20 steps: the first 20 of seed 7 run the same lib lines and the same SQL statements as 40 did
    # on both backends (measured with a line tracer over lib/ and the statements each engine sent;
    # only the row count of PostgreSQL's multi-row INSERT batches differed), at half the CPU.
    for step in range(20):
        _operate(random_data, rng, step)
    maintained = table_state(random_data)
    assert all(maintained)
    with session_scope(random_data) as s:
        written = scores.rebuild_scores(session=s)
    assert written == len(maintained[2])
    assert table_state(random_data) == maintained
    assert_same_report(random_data, AnalyticsFilters(start=date(2026, 1, 2), end=date(2026, 2, 4)))


def test_a_second_archive_changes_no_count(random_data: Engine) -> None:
    with session_scope(random_data) as s:
        snap = s.exec(select(MetricScore.snapshot_id).where(MetricScore.live.is_(True)).limit(1)).one()  # type: ignore[attr-defined,call-overload]
        inspector.archive_evaluation(session=s, snapshot_id=snap, reviewer="lead")
    before = table_state(random_data)
    with session_scope(random_data) as s:
        assert not inspector.archive_evaluation(session=s, snapshot_id=snap, reviewer="lead")
        scores.set_snapshots_live(session=s, snapshot_ids=[snap], live=False)
    assert table_state(random_data) == before


def test_orm_edits_and_deletes_move_the_counts(random_data: Engine) -> None:
    with session_scope(random_data) as s:
        snaps = s.exec(
            select(EvaluationSnapshot).where(EvaluationSnapshot.deleted_at.is_(None)).limit(3)
        ).all()  # type: ignore[union-attr,call-overload]
        snaps[0].user_scores_json = {SLUGS[0]: 5, "fluency": 0.3, "tone": 2}
        snaps[0].judge_scores_json = {SLUGS[0]: {"score": 1}, "fluency": 0.3, "tone": 2}
        snaps[1].deleted_at = datetime.now(UTC)
        s.delete(snaps[2])
    maintained = table_state(random_data)
    with session_scope(random_data) as s:
        scores.rebuild_scores(session=s)
    assert table_state(random_data) == maintained


def test_score_rows_follow_score_of_and_the_utc_week() -> None:
    snap = scores.ScoredSnapshot(
        id="s", product="p", language="en", created_at=datetime(2026, 1, 11, 23, 30, tzinfo=UTC), live=True,
        user_scores={"a": {"score": 4}, "b": 3, "c": True, "d": "5", "e": 2},
        judge_scores={"a": 4.5, "b": {"score": None}, "c": 1, "d": 5},
    )  # fmt: skip
    rows = scores.score_rows([snap])
    assert [(r.metric, r.user_score, r.judge_score, r.day, r.week) for r in rows] == [
        ("a", 4.0, 4.5, date(2026, 1, 11), date(2026, 1, 5))
    ]


@pytest.mark.parametrize(
    ("user", "judge", "counts"),
    [
        ([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], [1, 1, 1, 1, 1]),
        ([1, 1, 2, 3, 3], [1, 2, 2, 2, 3], [4, 1, 3, 2, 5]),
        ([0.1, 0.5, 0.9], [0.9, 0.5, 0.1], [2, 7, 1]),
    ],
)
def test_spearman_of_counts_equals_the_expanded_pairs(user: list, judge: list, counts: list) -> None:
    expanded = pd.DataFrame(
        [(u, j) for u, j, n in zip(user, judge, counts, strict=True) for _ in range(n)], columns=["u", "j"]
    )
    expected = float(expanded.corr(method="spearman").loc["u", "j"])
    assert analytics.spearman_of_counts(user, judge, counts) == pytest.approx(expected)


@pytest.mark.pg_repeats(
    "statements and lines of test_maintained_counts_equal_a_rebuild_after_random_operations"
)
def test_recount_rebuilds_the_scores(random_data: Engine) -> None:
    """`python -m lib recount` (lib.counters' registry) repairs scores a raw write left behind."""
    from lib import counters

    kept = table_state(random_data)
    with session_scope(random_data) as s:
        s.execute(MetricScore.__table__.delete())  # type: ignore[attr-defined]
        s.execute(AgreementCount.__table__.delete())  # type: ignore[attr-defined]
        s.execute(AgreementTotal.__table__.delete())  # type: ignore[attr-defined]
        assert "metric_scores" in counters.recount(session=s, only=["metric_scores"])
    assert table_state(random_data) == kept


@pytest.mark.slow  # a new interpreter importing the whole stack
def test_the_recount_command_repairs_corrupted_agreement_counts(random_data: Engine) -> None:
    """`python -m lib recount` in a fresh process (nothing imported lib.scores beforehand) rebuilds
    agreement counts a raw write corrupted, with no name given."""
    from tests.cli import run_cli_process

    kept = table_state(random_data)
    with session_scope(random_data) as s:
        s.execute(AgreementCount.__table__.update().values(n=AgreementCount.n + 7))  # type: ignore[attr-defined]
    assert table_state(random_data) != kept
    done = run_cli_process("recount", env={"OVERRULE_DATABASE_URL": random_data.url.render_as_string(False)})
    assert done.returncode == 0, done.stderr
    assert "metric_scores" in done.stdout
    assert table_state(random_data) == kept
