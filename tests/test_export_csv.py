"""The columnar CSV writer (issue 27): byte for byte what `csv.writer` wrote for `_stream_cell` of
each value, cell by cell, on tricky values; the wide Evaluations CSV against the row-by-row rules
(score_of, the decision's number or label) on both backends. Speed and memory: bench/bench_export_csv.py."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import tracemalloc
from collections.abc import Sequence
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlmodel import Session, select

import lib.isolated
from lib import export, inspector, judge_versions, wide_scan
from lib.csv_text import _stream_cell, csv_batch, neutralise_cell
from lib.export import iter_csv
from lib.importer import import_evaluations
from lib.inspector import EvaluationFilters
from lib.isolated import WorkerPool
from lib.judgment_text import decision_value, name_for, score_of, scores_of_json
from lib.lean_worker import LeanExecutor, init_lean_worker
from lib.models import EvaluationSnapshot, Judgment
from tests.test_inspector import record

TEXTS = [
    "=cmd|' /C calc'!A0", "+1", "-2+3", "@SUM(1)", "\tx", "\rx", "\uff1dHYPERLINK(1)", "\uff0b1", "\uff0d2",
    "\uff20SUM", 'say "hi"', "a,b", "cr\ronly", "lf\nonly", "crlf\r\nend", "", None, "ürün açıklaması 🎉",
    "'quoted", " lead", "-", "日本語,\"x\"", "plain",
]  # fmt: skip
FLOATS = [4.0, 2.67, 1 / 3, -0.5, 1e16, 1e-7, math.nan, None, -0.0, 0.1 + 0.2, 12345678.9]
INTS = [0, -3, 2**62, None, 7]
AWARE = [
    datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
    datetime(2025, 6, 1, 1, 0, tzinfo=timezone(timedelta(hours=2))),
    None,
]
MIXED = [4.0, "INCLUDE", None, "=x", 2.5, -1.0]  # a decision column: numbers and labels
ODD = [2**70, datetime(2025, 1, 1), datetime(2025, 1, 1, tzinfo=UTC), True, 3, None]  # cell by cell


def old_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    """The writer before issue 27: csv.writer over `_stream_cell` of each value."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow([neutralise_cell(c) for c in columns])
    for row in rows:
        writer.writerow([_stream_cell(v) for v in row])
    return buffer.getvalue().encode("utf-8")


def _rows(n: int) -> list[tuple[Any, ...]]:
    kinds = (TEXTS, FLOATS, INTS, [True, False, None], AWARE, [datetime(2025, 3, 1, 12), None], MIXED, ODD)
    return [tuple(kind[(i * (k + 1)) % len(kind)] for k, kind in enumerate(kinds)) for i in range(n)]


@pytest.mark.parametrize("batch_rows", [4, 5_000])
def test_the_columnar_writer_writes_the_bytes_the_row_writer_wrote(
    monkeypatch: pytest.MonkeyPatch, batch_rows: int
) -> None:
    monkeypatch.setattr(export, "CSV_BATCH_ROWS", batch_rows)
    columns = ["text", "=float", "int", "bool", "aware", "naive", "decision", "odd"]
    rows = _rows(60)
    assert b"".join(iter_csv(columns, rows)) == old_csv(columns, rows)


def test_one_column_and_no_rows_are_written_as_before() -> None:
    rows = [("",), ("x",), (None,), ("=1",)]
    assert b"".join(iter_csv(["only"], rows)) == old_csv(["only"], rows)
    assert b"".join(iter_csv(["a", "b"], [])) == old_csv(["a", "b"], [])


def test_a_rule_runs_once_per_distinct_value_and_gives_the_rows_value() -> None:
    seen: list[Any] = []

    def rule(value: Any) -> Any:
        seen.append(value)
        return None if value is None else float(value) if value.isdigit() else value

    column = ["4", "4", "=x", None, "4", "label"]
    body = csv_batch([column], {0: rule})
    assert body == old_csv(["c"], [(rule(v),) for v in column]).split(b"\r\n", 1)[1]
    assert len(seen) == 4 + len(column)  # the distinct values, then the oracle's own calls


SCORES = [
    '{"a": {"score": 4, "reason": "=x"}, "b": 3, "c/d": {"score": 2.5}, "e~f": 1, "0": 1180591620717411303424}',
    '{"a": {"score": true}, "b": "4", "c/d": {"score": {"score": 2}}, "e~f": null, "0": {"score": -0}}',
    '\n\t {"a": {"score": 0.1}, "b": 1.7976931348623157e308, "c/d": {"score": 5e-324}, "0": [3]}',
    '[{"score": 1}, 4]',
    '{"a": {"reason": "no score"}, "b": false, "c/d": [1]}',
    '{"a": {"score": 5, "why": "\\ud800 stored before imports refused it"}, "b": 2}',
    "[1, 2]",
    '"text"',
    "null",
    "{}",
]


def test_scores_of_json_reads_what_score_of_reads() -> None:
    slugs = ["a", "b", "c/d", "e~f", "0", "missing"]
    con = duckdb.connect()
    try:
        found = scores_of_json(con, pa.array(SCORES, pa.string()), slugs)
    finally:
        con.close()
    for slug, column in zip(slugs, found, strict=True):
        stored = [json.loads(text) for text in SCORES]
        expected = [score_of(s.get(slug)) if isinstance(s, dict) else None for s in stored]
        assert column.to_pylist() == expected, slug


def _oracle_wide(session: Session, slugs: Sequence[str]) -> list[tuple[Any, ...]]:
    """The wide rows as the row-by-row export built them (before issue 27)."""
    snapshots = session.exec(
        select(EvaluationSnapshot)
        .where(EvaluationSnapshot.deleted_at.is_(None))  # type: ignore[union-attr]
        .order_by(EvaluationSnapshot.created_at.desc(), EvaluationSnapshot.id.desc())  # type: ignore[attr-defined]
    ).all()
    decided = inspector._reviewer_decisions(session, [s.id for s in snapshots])
    versions = judge_versions.names_of(session)
    rows = []
    for s in snapshots:
        row: list[Any] = [
            s.id, s.created_at, s.product, s.language, s.model_name, s.category, s.question, s.weighted_gap,
            s.max_metric_gap, s.judge_meta_score, s.evidence_count, s.evidence_highlighted,
            s.evidence_unlocated, s.evidence_unverified, s.status, s.judgments_total, s.judgments_reviewed,
            s.judgments_corrected, s.model_answer, name_for(s.judge_version_id, versions),
        ]  # fmt: skip
        user = s.user_scores_json if isinstance(s.user_scores_json, dict) else {}
        judge = s.judge_scores_json if isinstance(s.judge_scores_json, dict) else {}
        for slug in slugs:
            u, j = score_of(user.get(slug)), score_of(judge.get(slug))
            gap = abs(u - j) if u is not None and j is not None else None
            row += [u, j, gap, decision_value(decided.get((s.id, slug)))]
        rows.append(tuple(row))
    return rows


def test_the_wide_export_writes_what_the_row_rules_give(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inspector, "EXPORT_BATCH_ROWS", 2)  # several batches, one decision read each
    records = [
        record(
            "s_q",
            question="=cmd|' /C calc'!A0 \uff0b1",
            model_answer='She said "no",\r\nthen\nleft; ürün 🎉',
            model_name=None,
            category=None,
            created_at="2025-01-10T12:00:00.250000Z",
            user_scores={"clarity": {"score": 2.5, "reason": "-meh"}, "safety": 5},
        ),
        record("s_r", created_at="2025-01-10T12:00:00Z", judge_scores={"clarity": 1, "safety": 4.5}),
        record("s_s", question="@SUM(A1)", created_at="2025-01-09T00:00:00Z", product="beta"),
    ]
    with Session(engine, expire_on_commit=False) as session:
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
        for change_id, decision in (
            ("s_q:clarity", "4.50"),
            ("s_r:safety", "=INCLUDE"),
            ("s_s:clarity", "-1"),
        ):
            judgment = session.exec(select(Judgment).where(Judgment.change_id == change_id)).one()
            judgment.user_decision, judgment.reviewed_at, judgment.reviewer = (
                decision,
                judgment.timestamp,
                "ayse",
            )
            session.add(judgment)
        session.commit()
        # Scores stored in forms imports no longer write: a bare bool, text, and an escaped lone surrogate.
        odd = '{"clarity": true, "safety": {"score": "4", "reason": "\\ud800"}}'
        with engine.begin() as conn:
            json_text = sa.cast(sa.literal(odd), sa.JSON) if engine.dialect.name == "postgresql" else odd
            conn.execute(
                sa.update(EvaluationSnapshot.__table__)  # type: ignore[attr-defined]
                .where(EvaluationSnapshot.__table__.c.id == "s_s")  # type: ignore[attr-defined]
                .values(judge_scores_json=sa.literal_column(f"'{odd}'") if json_text is odd else json_text)
            )
            # Gaps no short decimal holds: the scanner hands floats over as text, which must read back
            # as the same double (at SQLite's default 15 digits they do not).
            for snapshot_id, gaps in (("s_q", (0.1 + 0.2, 1 / 3)), ("s_r", (2 / 3 * 7, 1e-7 + 1e-23))):
                conn.execute(
                    sa.update(EvaluationSnapshot.__table__)  # type: ignore[attr-defined]
                    .where(EvaluationSnapshot.__table__.c.id == snapshot_id)  # type: ignore[attr-defined]
                    .values(weighted_gap=gaps[0], max_metric_gap=gaps[1])
                )
        session.expire_all()
        found = inspector.export_evaluations(session=session, filters=EvaluationFilters(), form="wide")
        slugs = inspector.export_metrics(session=session, filters=EvaluationFilters())
        expected = _oracle_wide(session, slugs)
        assert list(found.rows) == expected
    assert export.evaluations_csv_bytes(engine=engine, filters=EvaluationFilters()) == old_csv(
        found.columns, expected
    )


def _traced_peak(chunks: Any) -> tuple[int, int]:
    """Python's peak allocation (tracemalloc: bytes asked for, the same on any allocator or machine)
    while `chunks` are produced and dropped, as a download sends them; and the CSV's size."""
    tracemalloc.start()
    try:
        size = sum(len(chunk) for chunk in chunks)
        return tracemalloc.get_traced_memory()[1], size
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("form", ["wide", "long"])
def test_the_in_session_export_holds_a_batch_of_rows_not_every_row(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """Issue 27's memory bound (docs/benchmarks.md: under 300 MiB at 1M evaluations, measured by
    bench/bench_export_csv.py, not here) as a ratio: the export of 4x the rows peaks no higher, by a
    margin of most of the extra CSV, so an export that read every row before writing (or kept them)
    fails whatever the machine. 20 KB answers, batches of 8 rows; the scanner path's worker is
    bounded by DuckDB's memory limit instead (lib.wide_scan.SCAN_DUCKDB_CONFIG)."""
    monkeypatch.setattr(inspector, "EXPORT_BATCH_ROWS", 8)
    monkeypatch.setattr(inspector, "wide_scan", lambda **_: None)  # the app's own session
    answer = "an answer of twenty kilobytes. " * 650

    def load(first: int, count: int) -> None:
        with Session(sqlite_engine) as session:
            records = [record(f"s_{i:04d}", model_answer=answer) for i in range(first, first + count)]
            import_evaluations(session=session, records=records, reviewer="tester")
            session.commit()

    def peak() -> tuple[int, int]:
        return _traced_peak(
            export.evaluations_csv_chunks(engine=sqlite_engine, filters=EvaluationFilters(), form=form)
        )

    load(0, 32)
    peak()  # statements compiled and cached once, outside what is compared
    small, small_size = peak()
    load(32, 96)
    large, large_size = peak()
    assert large_size > 3.9 * small_size > 3.9 * 32 * len(answer)
    # Streamed, the peak is a batch whatever the rows (measured: +22-30 KB for +1.9 MB wide, +3.9 MB
    # long); reading every row first added 2.1 MB wide, 4.2 MB long.
    assert large - small < (large_size - small_size) / 4, (small, large, small_size, large_size)


# What an export worker may not import: the app's stack, which put a fork server and a worker of
# ~120 MiB summed PSS beside the app (issue 27: the export must stay under 300 MiB in all).
HEAVY_MODULES = ("numpy", "pandas", "sqlalchemy", "sqlmodel", "lib.models", "lib.db", "lib.duck", "streamlit")


def test_the_export_worker_imports_no_app_stack(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker that wrote an export (its DuckDB query, Arrow reader and CSV encoding) holds none
    of the app's stack: a pool of one worker, so the modules are read in the process that wrote the
    CSV, and the CSV is the scanner path's (write_wide_csv returned its rows there; a fallback to the
    app's session would have written the same bytes without the worker)."""
    with Session(sqlite_engine) as session:
        import_evaluations(session=session, records=[record("s_lean")], reviewer="tester")
        session.commit()
    monkeypatch.setattr(lib.isolated, "ISOLATED_WORKERS", 1)
    pool = WorkerPool(LeanExecutor, init_lean_worker)
    calls: list[tuple[object, Future[Any]]] = []
    submit_in_pool = pool.submit

    def submit(func: Any, *args: Any) -> Future[Any]:
        calls.append((func, submit_in_pool(func, *args)))
        return calls[-1][1]

    monkeypatch.setattr(pool, "submit", submit)
    monkeypatch.setattr(export, "EXPORT_WORKERS", pool)
    try:
        csv_bytes = export.evaluations_csv_bytes(engine=sqlite_engine, filters=EvaluationFilters())
        assert b"s_lean" in csv_bytes
        assert [func for func, _ in calls] == [wide_scan.write_wide_csv]
        assert pool.result(calls[0][1]) == 1  # the row, written by the scanner path in the worker
        # The same worker's modules after the export, and after Arrow converted Python values (which
        # would import pandas if it could).
        loaded = pool.run(eval, "(__import__('pyarrow').array(['x']), sorted(__import__('sys').modules))[-1]")
        arrow_pool = pool.run(eval, "__import__('pyarrow').default_memory_pool().backend_name")
    finally:
        pool.stop()
    assert "lib.wide_scan" in loaded
    # Arrow's jemalloc pool where this build has it (~9 MiB less at the export's peak than mimalloc).
    assert arrow_pool == ("jemalloc" if _has_jemalloc() else pa.default_memory_pool().backend_name)
    assert [m for m in loaded if m.split(".")[0] in HEAVY_MODULES or m in HEAVY_MODULES] == []


def _has_jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        return False
    return True


def _both_paths(
    engine: Engine, records: list[dict[str, Any]], stored: dict[str, dict[str, str]]
) -> tuple[bytes, bytes]:
    """The wide CSV of `records` by the in-session path and by the scanner path (its worker), with
    each row's columns in `stored` (id: column: raw text) written as is, as legacy or foreign rows
    hold them (SQLite: no JSON or time check)."""
    with Session(engine) as session:
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
    table = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
    with engine.begin() as conn:
        for snapshot_id, columns in stored.items():
            raw = {
                name: sa.literal_column("'" + text.replace("'", "''") + "'") for name, text in columns.items()
            }
            conn.execute(sa.update(table).where(table.c.id == snapshot_id).values(**raw))
    in_session = export._streamed_csv_bytes(engine, export._evaluations_table(EvaluationFilters(), "wide"))
    with Session(engine) as session:
        scan = inspector.wide_scan(session=session, filters=EvaluationFilters())
    assert scan is not None
    return in_session, export._chunks_bytes(export._scanned_chunks(engine, scan))


def _cells(csv_bytes: bytes, column: str) -> list[str]:
    rows = list(csv.DictReader(io.StringIO(csv_bytes.decode())))
    return [row[column] for row in rows]


def test_a_non_finite_stored_score_is_no_score_on_both_paths(sqlite_engine: Engine) -> None:
    # json.dumps writes NaN and Infinity; a page, a statistic and both exports read them as no score.
    records = [
        record("s_n", created_at="2025-01-03T00:00:00Z"),
        record("s_i", created_at="2025-01-02T00:00:00Z"),
        record("s_f", created_at="2025-01-01T00:00:00Z"),
    ]
    stored = {
        "s_n": {"user_scores_json": '{"clarity": NaN, "safety": {"score": NaN}}'},
        "s_i": {"user_scores_json": '{"clarity": Infinity, "safety": {"score": -Infinity}}'},
        # DuckDB cannot parse this one (a lone surrogate): read by json.loads, the same rule.
        "s_f": {"user_scores_json": '{"clarity": 1e400, "safety": {"score": NaN, "why": "\\ud800"}}'},
    }
    in_session, scanned = _both_paths(sqlite_engine, records, stored)
    assert in_session == scanned
    for column in ("clarity user_score", "safety user_score", "clarity gap", "safety gap"):
        assert _cells(in_session, column) == ["", "", ""], column
    assert _cells(in_session, "clarity judge_score") == ["4", "4", "4"]
    assert score_of(json.loads('{"score": NaN}')) is None
    assert score_of(float("inf")) is None and score_of(2) == 2.0


def test_an_evaluation_without_a_gap_exports_empty_gaps_on_both_paths(engine: Engine) -> None:
    # A judge-only evaluation (no reviewer score beside the judge's) has no gap: NULL, written as an
    # empty cell. SQLite's printf('%!.20g', NULL) is '0', which the scanner path wrote (review5 F2).
    records = [
        {k: v for k, v in record("s_none", created_at="2025-01-02T00:00:00Z").items() if k != "user_scores"},
        record("s_gap", created_at="2025-01-01T00:00:00Z", user_scores={"clarity": 2, "safety": 5}),
    ]
    in_session, scanned = _both_paths(engine, records, {})
    assert in_session == scanned
    assert _cells(scanned, "weighted_gap")[0] == "" and _cells(scanned, "max_gap")[0] == ""
    assert _cells(scanned, "max_gap")[1] not in ("", "0")


def test_an_export_of_most_rows_scans_the_table_and_sorts_with_the_same_bytes(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 27: from EXPORT_SCAN_MIN_ROWS matches that are most of the table, SQLite reads the table
    # in file order and sorts (a million random page reads from a cold page cache cost 27 CPU s);
    # a narrower export still walks the list's index. Either way the rows come in the list's order.
    monkeypatch.setattr(inspector, "EXPORT_SCAN_MIN_ROWS", 3)
    records = [
        record(f"s_{i}", created_at=f"2025-01-0{1 + i % 3}T00:00:00Z", product="acme" if i < 4 else "beta")
        for i in range(6)  # ties on the time: the id orders them
    ]
    in_session, scanned = _both_paths(sqlite_engine, records, {})
    assert in_session == scanned
    assert _cells(scanned, "id") == ["s_5", "s_2", "s_4", "s_1", "s_3", "s_0"]

    def plan(filters: EvaluationFilters) -> str:
        with Session(sqlite_engine) as session:
            scan = inspector.wide_scan(session=session, filters=filters)
            assert scan is not None
            rows = session.connection().exec_driver_sql("EXPLAIN QUERY PLAN " + scan.sql).all()
        return " | ".join(str(row[-1]) for row in rows)

    assert "SCAN evaluation_snapshots" in plan(EvaluationFilters())
    assert "TEMP B-TREE FOR ORDER BY" in plan(EvaluationFilters())
    assert "SCAN evaluation_snapshots" in plan(EvaluationFilters(product="acme"))  # 4 of 6
    assert "USING" in plan(EvaluationFilters(product="beta"))  # 2 of 6: the index
    monkeypatch.setattr(inspector, "EXPORT_SCAN_MIN_ROWS", 7)
    assert "TEMP B-TREE FOR ORDER BY" not in plan(EvaluationFilters())


def test_a_scanner_query_that_fails_before_its_first_row_falls_back_to_the_app_session(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A sort that finds SQLite's temp dir full fails before the first row (review6 R2): the download
    # sent a header and broke off. Now the app writes the CSV in its own session, whole.
    with Session(sqlite_engine) as session:
        import_evaluations(session=session, records=[record("s_a"), record("s_b")], reviewer="tester")
        session.commit()
    whole = export.evaluations_csv_bytes(engine=sqlite_engine, filters=EvaluationFilters())
    real = inspector.wide_scan

    def failing(**kwargs: Any) -> Any:
        scan = real(**kwargs)
        # Fails at the first step, as a sort out of temp space does: SQLite's integer overflow.
        sql = f"SELECT * FROM ({scan.sql}) WHERE abs(-9223372036854775808) IS NOT NULL"
        return dataclasses.replace(scan, sql=sql)

    monkeypatch.setattr(inspector, "wide_scan", failing)
    with caplog.at_level("WARNING", logger="lib.export"):
        assert export.evaluations_csv_bytes(engine=sqlite_engine, filters=EvaluationFilters()) == whole
    assert "failed before its first row" in caplog.text and "integer overflow" in caplog.text


def test_an_export_with_no_metrics_writes_the_rows_without_score_columns(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inspector, "export_metrics", lambda **_: [])
    records = [
        record("s_a", created_at="2025-01-02T00:00:00Z"),
        record("s_b", created_at="2025-01-01T00:00:00Z"),
    ]
    in_session, scanned = _both_paths(engine, records, {})
    assert in_session == scanned
    assert _cells(scanned, "id") == ["s_a", "s_b"]
    assert scanned.split(b"\r\n", 1)[0].endswith(b",answer,judge_version")


def test_a_stored_time_with_an_offset_exports_as_utc_on_both_paths(sqlite_engine: Engine) -> None:
    records = [
        record("s_a", created_at="2025-01-02T00:00:00Z"),
        record("s_b", created_at="2025-01-01T00:00:00Z"),
    ]
    stored = {"s_a": {"created_at": "2025-01-02 01:30:00+01:30"}}
    in_session, scanned = _both_paths(sqlite_engine, records, stored)
    assert in_session == scanned
    assert _cells(scanned, "created_at") == ["2025-01-02T00:00:00Z", "2025-01-01T00:00:00Z"]


def test_metric_slugs_equal_up_to_case_are_refused_on_both_paths(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inspector, "export_metrics", lambda **_: ["clarity", "Clarity"])
    with Session(engine) as session:
        import_evaluations(session=session, records=[record("s_a")], reviewer="tester")
        session.commit()
    with pytest.raises(ValueError, match="'clarity' and 'Clarity' differ only in case"):
        export.evaluations_csv_bytes(engine=engine, filters=EvaluationFilters())
    with Session(engine) as session, pytest.raises(ValueError, match="differ only in case"):
        inspector.export_evaluations(session=session, filters=EvaluationFilters())
    with Session(engine) as session, pytest.raises(ValueError, match="differ only in case"):
        inspector.wide_scan(session=session, filters=EvaluationFilters())
    con = duckdb.connect()
    try:
        with pytest.raises(ValueError, match="differ only in case"):
            scores_of_json(con, pa.array(['{"a": 1, "A": 2}']), ["a", "A"])
    finally:
        con.close()
