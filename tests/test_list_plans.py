"""Query plans of the lists' filters and sorts (issue 27): none falls back to a full walk.

Each scenario is a filter (or a pair the bench found slow) of the Evaluations or Corrections list,
with each sort, at the first page and at a page in the middle, over a small `bench/gen.py` database
(the bench's own filter values, `bench/bench_pages.py`). Every statement the list runs against the
large tables is explained: on SQLite, a walk (`SCAN`) must stop after a page (a LIMIT), give the
order itself (no sort of what it read) and, on an index, test the filters on its entries (a covering
index: no row read per entry walked); on PostgreSQL, told to avoid table scans, no `Seq Scan`.
A count the counters answer runs no such statement at all.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, func
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, col, select

from bench import bench_pages, gen
from lib import corrections, counters, inspector, notes, search
from lib.db import create_db_engine, session_scope
from lib.models import EvaluationSnapshot as _S
from lib.models import Judgment, utcnow

BIG_TABLES = ("evaluation_snapshots", "judgments", "judgment_events")
_FROM_BIG = re.compile(r"\b(FROM|JOIN)\s+(" + "|".join(BIG_TABLES) + r")\b")
SIZE = {"judgments": 600, "snapshots": 60, "notes": 40}
_WALK = re.compile(
    rf"(SCAN ({'|'.join(BIG_TABLES)})\b|SEARCH evaluation_snapshots USING (COVERING )?INDEX \S+ \(deleted_at=\?\)$)"
)
_FTS_PROBE = re.compile(r"SCAN \S+_search VIRTUAL TABLE INDEX \d+:\S*=")
MIDDLE = 25  # a page past the first (the lists hold 60 evaluations, 600 judgments)


@pytest.fixture(autouse=True)
def _small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thresholds scaled to the small database, so that every plan is taken: a common text
    (more matches than a rare one), counts that stop at their cap, a date range probe that stops."""
    monkeypatch.setattr(search, "RARE_MATCHES", 3)
    monkeypatch.setattr(counters, "COUNT_CAP", 8)
    monkeypatch.setattr(counters, "TEXT_COUNT_CAP", 4)
    monkeypatch.setattr(inspector, "RANGE_PROBE", 6)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def filled(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, bench_pages.Context]]:
    """A small generated database per dialect, shared by the module (read only)."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("plans") / "plans.db"
        shutil.copyfile(request.getfixturevalue("_sqlite_migrated"), path)
        url = f"sqlite:///{path}"
    else:
        url = request.getfixturevalue("pg_module_url")
    engine = create_db_engine(url)
    gen.generate(engine, seed=0, workers=0, **SIZE)
    try:
        yield engine, bench_pages.read_context(url, SIZE["snapshots"])
    finally:
        engine.dispose()


def _statements(
    engine: Engine, run: Callable[[], Any], *, match: Callable[[str], bool] | None = None
) -> list[tuple[str, Any]]:
    """The statements `run` sends that read the large tables (or that `match` picks)."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if match(statement) if match else _FROM_BIG.search(statement):
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


_REVIEWED_SEEK = re.compile(rf"USING COVERING INDEX {inspector.REVIEWED_INDEX} \(")


def _full_walks(engine: Engine, statements: list[tuple[str, Any]]) -> list[str]:
    """The plans among `statements` that walk a large table without stopping after a page."""
    bad = []
    for sql, plan, pg in _plans(engine, statements):
        if pg:
            walks = any(f"Seq Scan on {t}" in plan for t in BIG_TABLES)
        else:
            # A walk: a scan, or a seek that fixes only the live list's `deleted_at IS NULL`; but
            # the covering seek of the fully reviewed evaluations' index, whose whole range is that
            # filter's rows and holds every filter column (the plan seeks it when the counters say
            # they are fewer than the walk would read). A walk of it that reads each row is one.
            scans = [
                line
                for line in plan.splitlines()
                if _WALK.match(line.strip()) and not _REVIEWED_SEEK.search(line)
            ]
            walks = bool(scans) and ("LIMIT" not in sql.upper() or "TEMP B-TREE FOR ORDER BY" in plan)
            # An index walk that reads each entry's row to test a filter the index lacks.
            walks = walks or any(" USING INDEX " in line for line in scans)
            # The search index probed once per row of another walk (a rowid constraint on the MATCH):
            # the rows come from a walk of the list, not from the index (15 s for a rare text at 100k).
            walks = walks or bool(_FTS_PROBE.search(plan))
        if walks:
            bad.append(f"{sql}\n{plan}")
    return bad


def _plans(engine: Engine, statements: list[tuple[str, Any]]) -> Iterator[tuple[str, str, bool]]:
    """Each statement with its plan (PostgreSQL told to avoid table scans) and whether it is PostgreSQL."""
    with engine.connect() as conn:
        conn.execution_options(sqlite_begin="DEFERRED")  # a reader: no writer's turn (one may be open)
        pg = engine.dialect.name == "postgresql"
        if pg:
            conn.exec_driver_sql("SET enable_seqscan = off")
        explain = "EXPLAIN (COSTS OFF) " if pg else "EXPLAIN QUERY PLAN "
        for sql, parameters in statements:
            yield sql, "\n".join(str(r[-1]) for r in conn.exec_driver_sql(explain + sql, parameters)), pg
        conn.rollback()


def _evaluation_scenarios(ctx: bench_pages.Context) -> list[tuple[str, inspector.EvaluationFilters]]:
    """Every filter of the Evaluations page alone with every sort, and the pairs the bench found slow."""
    options = {o.label: o for o in bench_pages.evaluation_options()}
    picks: list[tuple[str, ...]] = [(), *((label,) for label in options)]
    picks += [
        ("min_gap=4", "review=reviewed"),
        ("product", "metric"),
        ("text=common", "product"),
        ("text=common", "language"),
        ("text=rare", "review=pending"),
        ("from=last 30 days", "min_gap=2"),
        ("archived", "min_gap=4"),
        ("review=reviewed", "text=common"),
        ("review=reviewed", "from=last 30 days"),
    ]
    found = []
    for picked in picks:
        chosen = {options[label].name: options[label].value(ctx) for label in picked}
        for sort in inspector.SORTS:
            found.append((" ".join([*picked, sort]), inspector.EvaluationFilters(**chosen, sort=sort)))
    return found


def test_every_evaluations_filter_and_sort_reads_a_page_not_the_list(filled: Any) -> None:
    engine, ctx = filled
    bad: dict[str, list[str]] = {}
    for name, filters in _evaluation_scenarios(ctx):
        for offset in (0, MIDDLE):
            with session_scope(engine, read_only=True) as s:
                statements = _statements(
                    engine,
                    lambda s=s, f=filters, o=offset: (
                        inspector.count_evaluations(session=s, filters=f),
                        inspector.fetch_page(session=s, filters=f, offset=o, limit=5),
                    ),
                )
            if walks := _full_walks(engine, statements):
                bad[f"{name} offset={offset}"] = walks
    assert not bad, "\n\n".join(f"{k}:\n" + "\n".join(v) for k, v in bad.items())


def test_every_corrections_filter_reads_a_page_not_the_list(filled: Any) -> None:
    engine, ctx = filled
    options = bench_pages.correction_options()
    picks = [(), *bench_pages._alone_and_in_pairs(options)]
    bad: dict[str, list[str]] = {}
    for picked in picks:
        filters = replace(corrections.JudgmentFilter(), **{o.name: o.value(ctx) for o in picked})
        for offset in (0, MIDDLE):
            with session_scope(engine, read_only=True) as s:
                statements = _statements(
                    engine,
                    lambda s=s, f=filters, o=offset: (
                        corrections.count_judgments(session=s, filters=f),
                        corrections.list_judgments(session=s, filters=f, offset=o, limit=5),
                    ),
                )
            if walks := _full_walks(engine, statements):
                bad[" ".join(o.label for o in picked) + f" offset={offset}"] = walks
    assert not bad, "\n\n".join(f"{k}:\n" + "\n".join(v) for k, v in bad.items())


def _count_and_page_plans(
    engine: Engine, session: Session, filters: inspector.EvaluationFilters, needle: str
) -> list[tuple[str, str, bool]]:
    """The plans of the statements a list's count and first page send that contain `needle`
    (there must be some), read in `session` (which may hold uncommitted rows)."""
    statements = _statements(
        engine,
        lambda: (
            inspector.count_evaluations(session=session, filters=filters),
            inspector.fetch_page(session=session, filters=filters, limit=5),
        ),
        match=lambda sql: needle in sql,
    )
    assert statements, filters
    return list(_plans(engine, statements))


def test_the_fully_reviewed_list_reads_its_own_index(filled: Any) -> None:
    """ "All metrics reviewed" with a common text or dates: the count and the page read the index of
    the fully reviewed evaluations, not the whole list (before it, the count walked every entry of
    the list index to prove fewer than 1,001 matches: 0.4% of gen.py's evaluations are reviewed)."""
    engine, ctx = filled
    phrase = "reset my password"
    with Session(engine) as s:  # a few evaluations reviewed in full, never committed
        with_phrase = select(_S.id).where(col(_S.search_text).contains(phrase)).limit(3)
        newest = (
            select(_S.id).where(col(_S.deleted_at).is_(None)).order_by(col(_S.created_at).desc()).limit(3)
        )
        ids = [*s.exec(with_phrase).all(), *s.exec(newest).all()]
        judged = s.exec(
            select(Judgment.change_id, Judgment.decision).where(col(Judgment.snapshot_id).in_(ids))
        )
        reviews = [corrections.BulkReview(c, d, "plans", None, utcnow()) for c, d in judged.all()]
        assert corrections.record_reviews(session=s, reviews=reviews).applied
        s.flush()
        for extra in ({"text": phrase}, {"date_from": ctx.last_day - timedelta(days=30)}):
            for sort in inspector.SORTS:
                filters = inspector.EvaluationFilters(review="reviewed", sort=sort, **extra)
                reviewed = "judgments_reviewed = evaluation_snapshots.judgments_total"
                for sql, plan, _pg in _count_and_page_plans(engine, s, filters, reviewed):
                    assert inspector.REVIEWED_INDEX in plan, f"{extra} {sort}:\n{sql}\n{plan}"
        s.rollback()


@pytest.mark.parametrize("sort_cost", [inspector.SORT_COST, 1e9])
def test_dates_sorted_by_a_gap_seek_the_dates(
    filled: Any, monkeypatch: pytest.MonkeyPatch, sort_cost: float
) -> None:
    """Dates sorted by a gap: the page's plan fixes the dates in the index it reads (an index
    condition), never tests them on every entry of a walk in gap order. Within one gap value the
    gap's index is newest first, so the first 30 days came after every later row of that value: a
    gap with three values walked 610k entries at 1M before its first match (70 ms). The plan seeks the
    dates inside each gap value (SQLite: `gap IN (its values)`), or the date range, read and sorted.
    A sort made dear makes SQLite's plan walk the gap's index (60 rows would rather be sorted)."""
    engine, ctx = filled
    monkeypatch.setattr(inspector, "SORT_COST", sort_cost)
    dates = {"date_to": ctx.first_day + timedelta(days=30), "date_from": ctx.last_day - timedelta(days=30)}
    for name, day in dates.items():
        for sort in ("weighted_gap", "max_gap"):
            gap = "max_metric_gap" if sort == "max_gap" else "weighted_gap"
            filters = inspector.EvaluationFilters(sort=sort, **{name: day})
            with session_scope(engine, read_only=True) as s:
                statements = _statements(
                    engine,
                    lambda s=s, f=filters: inspector.fetch_page(session=s, filters=f, limit=5),
                    # the rows with a gap, in gap order (not the gapless rows that follow them)
                    match=lambda sql, gap=gap: (
                        f"ORDER BY evaluation_snapshots.deleted_at DESC, "
                        f"evaluation_snapshots.{gap} DESC" in sql
                    ),
                )
            assert statements, (name, sort)
            for sql, plan, pg in _plans(engine, statements):
                if pg:
                    fixed = [
                        line for line in plan.splitlines() if "Index Cond" in line and "created_at" in line
                    ]
                    assert fixed, f"{name} {sort}:\n{sql}\n{plan}"
                else:  # each gap value's dates, or the date range read and sorted
                    seek = rf"\(deleted_at=\? AND ({gap}=\? AND )?created_at[<>]"
                    assert re.search(seek, plan), f"{name} {sort}:\n{sql}\n{plan}"


@pytest.mark.parametrize("values_cap", [inspector.GAP_VALUES_CAP, 1])
@pytest.mark.parametrize("min_gap", [None, 1.0])
def test_dates_sorted_by_a_gap_list_the_same_rows_either_way(
    filled: Any, monkeypatch: pytest.MonkeyPatch, min_gap: float | None, values_cap: int
) -> None:
    """The seek inside each gap value lists exactly the rows and order of a plain sort: every match
    once, largest gap first, the rows without a gap last, whichever plan the page takes (also past
    the cap of gap values, where the dates are tested along the gap's index)."""
    engine, ctx = filled
    monkeypatch.setattr(inspector, "SORT_COST", 1e9)  # the walk of the gap's index, as at scale
    monkeypatch.setattr(inspector, "GAP_VALUES_CAP", values_cap)
    with session_scope(engine, read_only=True) as s:
        rows = s.exec(select(_S).where(col(_S.deleted_at).is_(None))).all()
        for sort, gap in (("max_gap", "max_metric_gap"), ("weighted_gap", "weighted_gap")):
            for name, day in (("date_to", ctx.first_day + timedelta(days=200)), ("date_from", ctx.first_day)):
                filters = inspector.EvaluationFilters(sort=sort, min_gap=min_gap, **{name: day})
                start = inspector._day_start(day)
                kept = [
                    r for r in rows
                    if (r.created_at < start + timedelta(days=1) if name == "date_to" else r.created_at >= start)
                    and (min_gap is None or (r.max_metric_gap is not None and r.max_metric_gap >= min_gap))
                ]  # fmt: skip
                kept.sort(key=lambda r: (r.created_at, r.id), reverse=True)
                kept.sort(
                    key=lambda r, gap=gap: -getattr(r, gap) if getattr(r, gap) is not None else math.inf
                )
                listed = [
                    r.id
                    for offset in range(0, len(kept) + 5, 5)
                    for r in inspector.fetch_page(session=s, filters=filters, offset=offset, limit=5)
                ]
                assert listed == [r.id for r in kept], (sort, name, min_gap)


def test_dates_sorted_by_a_gap_seek_each_value_only_up_to_a_cap(
    filled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite seeks the dates inside each distinct gap value, one seek per value for the count and
    each page: a weighted mean can take thousands of values (gen.py: 92). Past GAP_VALUES_CAP the
    page tests the dates along the gap's index instead (the plan before the seek per value)."""
    engine, ctx = filled
    monkeypatch.setattr(inspector, "SORT_COST", 1e9)  # the walk of the gap's index, as at scale
    filters = inspector.EvaluationFilters(sort="weighted_gap", date_from=ctx.first_day)
    with session_scope(engine, read_only=True) as s:
        values = s.exec(
            select(func.count(func.distinct(_S.weighted_gap))).where(col(_S.deleted_at).is_(None))
        ).one()
    assert values > 1
    for cap in (values, values - 1):
        monkeypatch.setattr(inspector, "GAP_VALUES_CAP", cap)
        with session_scope(engine, read_only=True) as s:
            pages = _statements(
                engine,
                lambda s=s: inspector.fetch_page(session=s, filters=filters, limit=5),
                match=lambda sql: "ORDER BY" in sql and "weighted_gap DESC" in sql,
            )
        assert pages
        seeks = [sql for sql, _ in pages if "gap_values" in sql]
        assert bool(seeks) == (engine.dialect.name == "sqlite" and cap == values), cap


def test_the_archived_list_tests_a_text_on_its_own_rows(filled: Any) -> None:
    """The archived list with a text: its count and page read the archived range of the list index
    and test the text on those rows. PostgreSQL, given a LIKE, intersected the range with every
    trigram match of a common text (20,000 of 100k evaluations: 27-29 ms for ~1,000 archived rows,
    2 ms this way); it gets a test no index serves (strpos). SQLite's index never held archived rows."""
    engine, ctx = filled
    phrase, rare = "reset my password", f"(case {ctx.evaluations // 3}"
    with Session(engine) as s:  # a few evaluations archived, never committed
        live = col(_S.deleted_at).is_(None)
        ids = {*s.exec(select(_S.id).where(live, col(_S.search_text).contains(phrase)).limit(3)).all()}
        ids |= {*s.exec(select(_S.id).where(live, col(_S.search_text).contains(rare)).limit(1)).all()}
        assert len(ids) >= 2
        for sid in sorted(ids):
            assert inspector.archive_evaluation(session=s, snapshot_id=sid, reviewer="plans")
        s.flush()
        for text in (phrase, rare):
            for sort in inspector.SORTS:
                filters = inspector.EvaluationFilters(text=text, archived=True, sort=sort)
                for sql, plan, pg in _count_and_page_plans(engine, s, filters, "search_text"):
                    assert "search_trgm" not in plan and "_search VIRTUAL" not in plan, f"{sql}\n{plan}"
                    assert not (pg and re.search(r"search_text\s+LIKE", sql)), sql
                    if pg:
                        assert "strpos(evaluation_snapshots.search_text" in sql, sql
                assert inspector.fetch_page(session=s, filters=filters, limit=5), (text, sort)
        s.rollback()


def test_dates_and_a_common_text_test_the_text_on_the_range_rows(filled: Any) -> None:
    """Dates and a common text (PostgreSQL): the count and the page test the text on the rows the
    dates keep (strpos, no index serves it), so the count stops at its cap and the page walks the
    gap's index until its rows; given a LIKE, PostgreSQL intersected the range with every trigram
    match of the text (20,000 of 100k evaluations) and sorted the range by an incremental sort it
    mis-costs (50-53 ms a render at 100k, 30-36 this way). A rare text keeps the trigram index.
    SQLite's walks test the text on their index's entries either way. The rows listed are the same."""
    engine, ctx = filled
    common, rare = "reset my password", f"(case {ctx.evaluations // 3}"
    with session_scope(engine, read_only=True) as s:
        rows = s.exec(select(_S).where(col(_S.deleted_at).is_(None))).all()
        for text in (common, rare):
            for sort in inspector.SORTS:
                filters = inspector.EvaluationFilters(text=text, date_from=ctx.first_day, sort=sort)
                statements = _statements(
                    engine,
                    lambda s=s, f=filters: (
                        inspector.count_evaluations(session=s, filters=f),
                        inspector.fetch_page(session=s, filters=f, limit=5),
                    ),
                    match=lambda sql: "ORDER BY" in sql or "count(*)" in sql,
                )
                tested = [sql for sql, _ in statements if "search" in sql and " AS hit" not in sql]
                assert tested, (text, sort)
                for sql, plan, pg in _plans(engine, [(q, p) for q, p in statements if q in tested]):
                    rowwise = "strpos(evaluation_snapshots.search_text" in sql
                    assert rowwise == (pg and text == common), f"{text} {sort}:\n{sql}\n{plan}"
                    if rowwise:
                        assert "search_trgm" not in plan and "Incremental Sort" not in plan, f"{sql}\n{plan}"
                # The page's reads run with incremental sort off (in its own transaction: `_plans`'
                # connection above cannot show it), for a common text sorted by a gap only.
                toggled = _statements(
                    engine,
                    lambda s=s, f=filters: inspector.fetch_page(session=s, filters=f, limit=5),
                    match=lambda sql: "enable_incremental_sort" in sql,
                )
                pg = engine.dialect.name == "postgresql"
                assert bool(toggled) == (pg and text == common and sort != "newest"), (text, sort, toggled)
                kept = [r for r in rows if search.normalize_search_text(text) in r.search_text]
                page = inspector.fetch_page(session=s, filters=filters, limit=100)
                assert {r.id for r in page} == {r.id for r in kept}, (text, sort)
                assert inspector.count_evaluations(session=s, filters=filters, cap=1000) == len(kept)


def _listed_by_python(session: Session, text: str) -> list[str]:
    """The live list's ids whose question contains `text`, newest first: the list by a Python filter."""
    rows = session.exec(select(_S).where(col(_S.deleted_at).is_(None))).all()
    needle = search.normalize_search_text(text)
    kept = sorted(
        (r for r in rows if needle in r.search_text), key=lambda r: (r.created_at, r.id), reverse=True
    )
    return [r.id for r in kept]


_SHORT_TEXT = f"octet_length(evaluation_snapshots.search_text) <= {search.SHORT_TEXT_BYTES}"
_LONG_TEXT = f"octet_length(evaluation_snapshots.search_text) > {search.SHORT_TEXT_BYTES}"


def _walks_the_short_text_index(
    engine: Engine, statements: list[tuple[str, Any]], *, merged: bool = False
) -> None:
    """PostgreSQL plans each of `statements` (a count or a page of a text alone) with an Index Only
    Scan of `LIST_SHORT_TEXT_INDEX`, backward for a page (newest first); `merged`: a page merges it
    with the long questions' read in list order (a Merge Append, not a sort of both whole)."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off; SET enable_bitmapscan = off")  # a tiny table
        for sql, parameters in statements:
            assert _SHORT_TEXT in sql, sql
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN (COSTS OFF) " + sql, parameters))
            backward = " Backward" if "ORDER BY" in sql else ""
            assert f"Index Only Scan{backward} using {search.LIST_SHORT_TEXT_INDEX} " in plan, (
                f"{sql}\n{plan}"
            )
            assert not (merged and backward) or "Merge Append" in plan, f"{sql}\n{plan}"
        conn.rollback()


def _text_list_statements(
    engine: Engine, session: Session, filters: inspector.EvaluationFilters, *, offset: int
) -> list[tuple[str, Any]]:
    """The statements of a capped count and a page at `offset` that test the text (LIKE or MATCH),
    not the probe for a long question."""
    return _statements(
        engine,
        lambda: (
            inspector.count_evaluations(session=session, filters=filters, cap=1000),
            inspector.fetch_page(session=session, filters=filters, offset=offset, limit=4),
        ),
        match=lambda sql: "LIKE" in sql or "MATCH" in sql,
    )


def test_a_common_text_alone_walks_the_short_text_index(filled: Any) -> None:
    """A text alone on the live list, newest first (PostgreSQL): the count and the page state the
    short-text index's predicate, so the planner may walk `LIST_SHORT_TEXT_INDEX` (newest first, with
    the question) and test the text on its entries; before it, page 400 of a text in a fifth of 100k
    questions read ~13,600 pages of the table (70-85 ms a render). A live question longer than that
    index holds (a 10 kB one here, which a btree of every question could not hold) is read beside the
    walk and merged in list order, so the walk stays (before, one such question turned it off for
    every list): the rows, pages at an offset and after a key, and the count are a Python filter's.
    SQLite keeps its own plan (its list index holds the question): the same rows there too."""
    engine, _ctx = filled
    pg = engine.dialect.name == "postgresql"
    phrase = "reset my password"
    filters = inspector.EvaluationFilters(text=phrase)
    with Session(engine) as s:
        expected = _listed_by_python(s, phrase)
        assert len(expected) >= 8
        statements = _text_list_statements(engine, s, filters, offset=3)
        assert len(statements) >= (2 if pg else 1)  # SQLite counts a text alone off its FTS5 index
        if pg:  # all-visible pages, as autovacuum leaves a loaded table: an index-only walk's condition
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                    "VACUUM ANALYZE evaluation_snapshots"
                )
            assert not [sql for sql, _ in statements if _LONG_TEXT in sql], statements
            _walks_the_short_text_index(engine, statements)
        assert not [sql for sql, _ in statements if not pg and "octet_length" in sql]
        assert inspector.count_evaluations(session=s, filters=filters, cap=1000) == len(expected)
        page = inspector.fetch_page(session=s, filters=filters, offset=3, limit=4)
        assert [r.id for r in page] == expected[3:7]
        s.rollback()
    with Session(engine) as s:  # a live question of 10 kB with the phrase, never committed
        # The same session listed before the question was stored: that answer must not be reused.
        assert [r.id for r in inspector.fetch_page(session=s, filters=filters, limit=4)] == expected[:4]
        third = s.get(_S, expected[2])
        assert third is not None
        words = [f"{n * 7919 % 10007:x}" for n in range(3000)]
        long = _S(
            id="plans-long",
            question=" ".join([*words, phrase]),
            model_answer="a",
            product="p",
            created_at=third.created_at - timedelta(microseconds=1),  # fourth in the list
        )
        s.add(long)
        s.flush()
        assert len(long.search_text.encode()) > 5 * search.SHORT_TEXT_BYTES
        expected = _listed_by_python(s, phrase)
        assert expected[3] == long.id
        statements = _text_list_statements(engine, s, filters, offset=2)
        if pg:  # the short rows' walk and the long ones', one statement each
            assert len(statements) == 2, statements
            assert all(_LONG_TEXT in sql and "UNION ALL" in sql for sql, _ in statements), statements
            _walks_the_short_text_index(engine, statements, merged=True)
        assert inspector.count_evaluations(session=s, filters=filters, cap=1000) == len(expected)
        assert inspector.count_evaluations(session=s, filters=filters, cap=3) == 4  # cap + 1: capped
        for offset in range(6):
            page = inspector.fetch_page(session=s, filters=filters, offset=offset, limit=3)
            assert [r.id for r in page] == expected[offset : offset + 3], offset
        first = inspector.fetch_page(session=s, filters=filters, limit=3)
        after = inspector.page_key(first[-1], "newest")
        assert [
            r.id for r in inspector.fetch_page(session=s, filters=filters, after=after, limit=3)
        ] == expected[3:6]
        s.rollback()


def test_postgresql_plans_each_list_query_for_its_own_values(filled: Any) -> None:
    """psycopg prepares a statement the fifth time a connection runs it, and PostgreSQL may then keep
    one generic plan for any values. The lists' filters are bound values whose best plans differ: after
    the Evaluations pages before it, "all metrics reviewed + a rare text, by largest gap" ran under a
    plan made for no text in particular (0.21 s a render at 100k instead of 0.02). Every execution is
    planned for its values (`lib.db.PG_PLAN_EACH_EXECUTION`): no generic plan even after many runs."""
    engine, ctx = filled
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite plans each statement for its values")
    with session_scope(engine, read_only=True) as s:
        assert s.connection().exec_driver_sql("SHOW plan_cache_mode").scalar() == "force_custom_plan"
        for _ in range(4):
            for text in ("reset my password", f"(case {ctx.evaluations // 3}"):
                for sort in inspector.SORTS:
                    filters = inspector.EvaluationFilters(review="reviewed", text=text, sort=sort)
                    inspector.count_evaluations(session=s, filters=filters)
                    inspector.fetch_page(session=s, filters=filters, limit=5)
        prepared = s.connection().exec_driver_sql(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        )
        rows = prepared.all()
    assert any(custom >= 5 for _sql, _generic, custom in rows), rows  # psycopg prepared them
    assert not [sql for sql, generic, _custom in rows if generic], rows


def test_a_count_the_counters_answer_reads_no_evaluation(filled: Any) -> None:
    engine, ctx = filled
    exact = inspector.EvaluationFilters(product=ctx.products[-1], min_gap=2.0, review="reviewed")
    with session_scope(engine, read_only=True) as s:
        assert inspector.counted_exactly(exact)
        statements = _statements(engine, lambda: inspector.count_evaluations(session=s, filters=exact))
    assert statements == []


_NOTE_INDEX_READ = re.compile(r"(SCAN|SEARCH) session_notes USING INDEX (\S+)")


def _note_full_walks(engine: Engine, statements: list[tuple[str, Any]], *, text: bool) -> list[str]:
    """The plans among `statements` that read every note, or every note of a filter, to list a page.

    SQLite: no table scan; no sort of what was read, but of a rare text's matches or of a few
    sessions' notes; an index read that looks up each entry's row only under a LIMIT (a walk that
    stops), or on the session index (a few notes). A text's exact count is let read the rows the other
    filters keep (it tests the text on them). PostgreSQL, told to avoid table scans: no `Seq Scan`.
    """
    bad = []
    for sql, plan, pg in _plans(engine, statements):
        if pg:
            walks = "Seq Scan on session_notes" in plan
        else:
            lines = [line.strip() for line in plan.splitlines()]
            few = "SCAN session_notes_search" in plan or "(session_id=?" in plan
            walks = "SCAN session_notes" in lines or ("TEMP B-TREE FOR ORDER BY" in plan and not few)
            counted_text = text and sql.lstrip().upper().startswith("SELECT COUNT")
            # A LIMIT, or a walk in list order that its reader stops (the timeline's sessions).
            stops = "LIMIT" in sql.upper() or ("ORDER BY" in sql.upper() and "TEMP B-TREE" not in plan)
            for line in lines:
                read = _NOTE_INDEX_READ.match(line)
                if read and read[2] != notes.NOTE_INDEXES["session_id"] and not stops:
                    walks = walks or not counted_text
        if walks:
            bad.append(f"{sql}\n{plan}")
    return bad


def test_every_notes_filter_reads_a_page_not_the_list(filled: Any) -> None:
    """The Notes list, its count and its timeline for every filter alone and in pairs (the bench's
    values, and a rare text), at the first page and one further in."""
    engine, ctx = filled
    table = {"session_notes"}

    def reads_notes(statement: str) -> bool:
        return any(re.search(rf"\b(FROM|JOIN)\s+{t}\b", statement) for t in table)

    bad: dict[str, list[str]] = {}
    for name, filters in _note_pairs(ctx):
        for offset in (0, 3):
            with session_scope(engine, read_only=True) as s:

                def run(s: Any = s, f: notes.NoteFilter = filters, o: int = offset) -> None:
                    notes.count_notes(session=s, filters=f)
                    notes.search_notes(session=s, filters=f, offset=o, limit=5)
                    notes.count_sessions(session=s, filters=f)
                    shown = notes.session_timeline(session=s, filters=f, offset=o // 3, limit=2)
                    notes.notes_of_sessions(session=s, session_ids=[t.session_id for t in shown], filters=f)

                statements = [(sql, p) for sql, p in _statements(engine, run, match=reads_notes)]
            if walks := _note_full_walks(engine, statements, text=bool(filters.query)):
                bad[f"{name} offset={offset}"] = walks
    assert not bad, "\n\n".join(f"{k}:\n" + "\n".join(v) for k, v in bad.items())


_NOTES_READ = re.compile(r"\b(FROM|JOIN)\s+(session_notes|session_notes_search)\b")
_AT_MOST_ONE = re.compile(r"^\s*SELECT\s+(max|min)\(", re.IGNORECASE)


def _unbounded_note_reads(sql: str) -> list[str]:
    """The SELECTs of `sql` (each parenthesised level apart) that read the notes or their text index
    with no LIMIT: a count that reads every match. A min or max is one index entry."""
    levels: list[list[str]] = [[]]
    done: list[str] = []
    for char in sql:
        if char == "(":
            levels.append([])
        elif char == ")" and len(levels) > 1:
            done.append("".join(levels.pop()))
            levels[-1].append("(…)")
        else:
            levels[-1].append(char)
    done.append("".join(levels[0]))
    return [
        level
        for level in done
        if _NOTES_READ.search(level) and "LIMIT" not in level.upper() and not _AT_MOST_ONE.match(level)
    ]


def _note_pairs(ctx: bench_pages.Context) -> Iterator[tuple[str, notes.NoteFilter]]:
    """Every Notes filter alone and in pairs (the bench's values, and a rare text)."""
    options = bench_pages.note_options()
    options.append(bench_pages.Option("query", "text=rare", lambda _ctx: "(#7)"))
    now = notes.utcnow()
    for picked in [(), *bench_pages._alone_and_in_pairs(options)]:
        chosen: dict[str, Any] = {}
        for o in picked:
            value = o.value(ctx)
            if o.widget == "age":  # the page's Age choice: a since or an until relative to now
                newer, older = notes.AGES[value]
                value = now - (newer if o.name == "since" else older)
            chosen[o.name] = value
        yield " ".join(o.label for o in picked), notes.NoteFilter(**chosen)


def test_the_notes_counts_and_figures_stop_at_their_cap(filled: Any) -> None:
    """What the Notes page counts on every render (issue 27): the list's count (capped as the
    Evaluations list's: "10,000+", "1,000+" with a text), the timeline's sessions and the health
    figures read at most their cap of matches, from the selective side: every read of the notes
    under a LIMIT, with no table scan, no sort, no row read per entry but under that LIMIT. The exact
    counts they replace read every note of a type or an age (and each one's row with a text), the
    health figure every note."""
    engine, ctx = filled
    bad: dict[str, list[str]] = {}

    def reads_notes(statement: str) -> bool:
        return bool(_NOTES_READ.search(statement))

    for name, filters in _note_pairs(ctx):
        with session_scope(engine, read_only=True) as s:

            def run(s: Any = s, f: notes.NoteFilter = filters) -> None:
                notes.count_notes(session=s, filters=f, cap=notes.count_cap(f))
                notes.count_sessions(session=s, filters=f)
                notes.notes_health(session=s)

            statements = _statements(engine, run, match=reads_notes)
        found = [
            f"{sql}\nunbounded: {level}" for sql, _p in statements for level in _unbounded_note_reads(sql)
        ]
        found += _note_full_walks(engine, statements, text=False)
        if found:
            bad[name or "(no filter)"] = found
    assert not bad, "\n\n".join(f"{k}:\n" + "\n".join(v) for k, v in bad.items())


def test_a_deep_page_of_a_common_text_reads_no_row_per_entry(filled: Any) -> None:
    """Past `TEXT_SET_DEPTH`, a common text's page tests the text index's matches on the walk's
    entries (a covering read) instead of reading each walked note's row for its text (SQLite: 47 →
    19 ms for page 400 of 200k notes); the walk is the page's own index, newest first."""
    engine, ctx = filled
    if engine.dialect.name != "sqlite":
        pytest.skip("the text index and the index hints are SQLite's")
    now = notes.utcnow()
    for filters in (
        notes.NoteFilter(query="refund"),
        notes.NoteFilter(query="refund", note_type="TIP"),
        notes.NoteFilter(query="refund", language=ctx.note_languages[-1]),
        notes.NoteFilter(query="refund", until=now - timedelta(days=30)),
    ):
        with session_scope(engine, read_only=True) as s:
            statements = _statements(
                engine,
                lambda s=s, f=filters: notes.search_notes(session=s, filters=f, offset=10, limit=5),
                match=lambda sql: "ORDER BY" in sql,
            )
        assert statements, filters
        for _sql, plan, _pg in _plans(engine, statements):
            assert not _NOTE_INDEX_READ.search(plan), (filters, plan)
            assert "TEMP B-TREE FOR ORDER BY" not in plan, (filters, plan)


def test_a_timeline_page_tests_a_text_on_its_sessions_rows(filled: Any) -> None:
    """A timeline page's notes (their counts per type, their marks) are its few sessions' rows with
    the text tested on each: PostgreSQL read a common text's trigram index matches to intersect them
    (50,000 of 200k notes: 18 ms a page, growing with the notes)."""
    engine, _ctx = filled
    filters = notes.NoteFilter(query="refund")
    with session_scope(engine, read_only=True) as s:
        shown = [t.session_id for t in notes.session_timeline(session=s, filters=filters, limit=3)]
        assert shown
        statements = _statements(
            engine,
            lambda: (
                notes.session_timeline(session=s, filters=filters, limit=3),
                notes.notes_of_sessions(session=s, session_ids=shown, filters=filters),
                notes.count_notes(session=s, filters=replace(filters, session_id=shown[0])),
            ),
            match=lambda sql: "session_id IN" in sql or "session_id =" in sql,
        )
    assert len(statements) >= 3
    for sql, plan, pg in _plans(engine, statements):
        assert "session_notes_search" not in plan and "search_trgm" not in plan, f"{sql}\n{plan}"
        # On this small table PostgreSQL starts from the sessions anyway; at 200k notes it chose the
        # trigram index for a LIKE, which a row test that no index serves (strpos) rules out.
        assert not (pg and re.search(r"search_text\s+LIKE", sql)), sql


def test_the_language_menu_reads_one_index_entry_per_language(filled: Any) -> None:
    """Every render of the Notes page lists the languages: a seek to the next language after the
    last, not a DISTINCT over every note (PostgreSQL read all 200k entries of the index: 35 ms)."""
    engine, _ctx = filled
    with session_scope(engine, read_only=True) as s:
        statements = _statements(
            engine, lambda: notes.note_languages(session=s), match=lambda sql: bool(_NOTES_READ.search(sql))
        )
        languages = notes.note_languages(session=s)
    assert len(languages) >= 2 and statements
    with engine.connect() as conn:
        for sql, parameters in statements:
            if engine.dialect.name == "postgresql":
                explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
                plan = [str(r[0]) for r in conn.exec_driver_sql(explain + sql, parameters)]
                read = [int(m[1]) for line in plan if " on session_notes" in line
                        for m in [re.search(r"actual rows=(\d+)", line)] if m]  # fmt: skip
                assert read and max(read) <= 1, "\n".join(plan)
            else:
                plan = [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, parameters)]
                assert not [line for line in plan if line.startswith("SCAN session_notes")], plan
        conn.rollback()


def test_the_archived_export_seeks_the_archived_range(filled: Any) -> None:
    # The wide export's scanner SQL (lib.inspector.wide_scan) of the archived list: without the
    # list index's hint SQLite walked ix_evaluation_snapshots_created_at and read every row to test
    # deleted_at (1M row reads at 1M evaluations for ~1% of them).
    engine, _ctx = filled
    if engine.dialect.name != "sqlite":
        pytest.skip("the index hint is SQLite's; PostgreSQL plans by its statistics")
    for sort in inspector.SORTS:
        with session_scope(engine, read_only=True) as s:
            scan = inspector.wide_scan(
                session=s, filters=inspector.EvaluationFilters(archived=True, sort=sort)
            )
        assert scan is not None
        assert not _full_walks(engine, [(scan.sql, ())]), sort


def test_a_failed_page_read_reports_its_own_error_not_the_settings_restore(filled: Any, monkeypatch) -> None:
    """The page's reads with incremental sort off (PostgreSQL, dates + a common text by a gap): an error
    inside aborts the transaction, and the setting's restore must not run there and hide that error."""
    engine, _ctx = filled
    if engine.dialect.name != "postgresql":
        pytest.skip("the setting is PostgreSQL's")
    monkeypatch.setattr(inspector, "_scan_text_rows", lambda session, filters: True)
    filters = inspector.EvaluationFilters(text="password", sort="weighted_gap")
    with session_scope(engine, read_only=True) as s:
        with pytest.raises(DBAPIError, match="division by zero"), inspector._whole_sorts_only(s, filters):
            s.connection().exec_driver_sql("SELECT 1/0")
        s.rollback()
        with inspector._whole_sorts_only(s, filters):  # and without an error it is restored
            assert s.connection().exec_driver_sql("SHOW enable_incremental_sort").scalar() == "off"
        assert s.connection().exec_driver_sql("SHOW enable_incremental_sort").scalar() == "on"
