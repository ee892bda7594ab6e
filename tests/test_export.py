"""Exports through DuckDB (SPEC §6, §8): CSV injection safety, Parquet, the seed-004 JSON cache,
JSON Lines, errors, the CLI, and the offline scanner connection — on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import cycle
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, insert
from sqlmodel import SQLModel

from lib import auth, duck, export, isolated
from lib.config import reset_settings
from lib.db import create_db_engine, init_db
from lib.duck import duck_connect, fetch_frame, source_kind, table_ref, with_duck
from lib.export import (
    EXPORTABLE_TABLES,
    FORMATS,
    ExportError,
    export_query_csv,
    export_table,
    frame_to_csv_bytes,
    neutralise_cell,
)
from lib.models import EvaluationSnapshot, Judgment
from tests import cli
from tests.cli import CliResult
from tests.conftest import sqlite_only

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = [
    "=cmd|' /C calc'!A0",
    "+1",
    "-2+3",
    "@SUM(1)",
    "\tx",
    "\rx",
    # full-width forms an East Asian spreadsheet reads as = + - @ (issue 24 point 11)
    '\uff1dHYPERLINK("http://evil.example")',
    "\uff0b1",
    "\uff0d2+3",
    "\uff20SUM(1)",
]
PLAIN = ["Implements core feature", "a=b+c", "ops@example.com", "3-2", "'already quoted", "ürün açıklaması"]
MOMENT = datetime(2024, 11, 15, 10, 30, 0, 123456, tzinfo=UTC)
MOMENT_TEXT = "2024-11-15T10:30:00.123456Z"
JSON_VALUE = {"note": "=1+1", "scores": [1, 2.5]}
TABLES = sorted(set(SQLModel.metadata.tables) - export.UNEXPORTABLE_TABLES)


# --- one row in every table, every text column hostile -------------------------------------------


def _kind(column: sa.Column) -> str:
    col_type = column.type
    if isinstance(col_type, sa.TypeDecorator):
        col_type = col_type.impl_instance
    for sql_type, kind in (
        (sa.JSON, "json"),
        (sa.Boolean, "bool"),
        (sa.Integer, "int"),
        (sa.Float, "float"),
        (sa.DateTime, "datetime"),
        (sa.Date, "date"),
        (sa.LargeBinary, "bytes"),
    ):
        if isinstance(col_type, sql_type):
            return kind
    return "text"


def _hostile_rows() -> dict[str, dict[str, Any]]:
    """One valid row per table (parents first, foreign keys resolved), text columns all hostile."""
    hostile = cycle(HOSTILE)
    rows: dict[str, dict[str, Any]] = {}
    for table in SQLModel.metadata.sorted_tables:
        row: dict[str, Any] = {}
        for column in table.columns:
            if column.foreign_keys:
                target = next(iter(column.foreign_keys)).column
                row[column.name] = rows[target.table.name][target.name]
                continue
            kind = _kind(column)
            if kind == "text":
                length = getattr(column.type, "length", None)
                row[column.name] = next(hostile)[:length]
            else:
                row[column.name] = {
                    "json": JSON_VALUE,
                    "bool": True,
                    "int": 1 if column.primary_key else -3,
                    "float": -2.5,
                    "datetime": MOMENT,
                    "date": MOMENT.date(),
                    "bytes": b"=1\x00",
                }[kind]
        rows[table.name] = row
    return rows


def _insert_everywhere(engine: Engine) -> dict[str, dict[str, Any]]:
    rows = _hostile_rows()
    with engine.begin() as conn:
        for table in SQLModel.metadata.sorted_tables:
            conn.execute(insert(table), [rows[table.name]])
    return rows


Filled = tuple[Engine, dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def filled_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    """One hostile row in every table of a SQLite file, shared by the module's read-only tests."""
    engine = init_db(f"sqlite:///{tmp_path_factory.mktemp('filled') / 'overrule.db'}")
    yield engine, _insert_everywhere(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def filled_postgresql(pg_module_url: str) -> Iterator[Filled]:
    """The same on PostgreSQL."""
    engine = create_db_engine(pg_module_url)
    try:
        yield engine, _insert_everywhere(engine)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def filled(request: pytest.FixtureRequest) -> Filled:
    """One hostile row in every table, on each backend (set up once per module and backend)."""
    return request.getfixturevalue(f"filled_{request.param}")


# The per-table round trips. On SQLite every table. On PostgreSQL a table's export differs from
# another's only by its columns' types (the typed view casts each column by type, the writers
# project each by type), so the tables below, which hold every pair of a PostgreSQL column type
# (as the migrations made it) and its DuckDB type, cover every cast and projection there; each
# further PostgreSQL table cost 0.2-0.4 CPU s per format and repeated one of these paths.
# test_the_postgresql_round_trip_tables_cover_every_column_type fails when a migration brings a
# new pair and names the table to add.
PG_TYPE_TABLES = ["interactions", "metric_scores", "session_notes"]


def _round_trips(tables: list[str]) -> list[Any]:
    pairs = [("sqlite", t) for t in tables] + [("postgresql", t) for t in tables if t in PG_TYPE_TABLES]
    return [pytest.param(backend, table, id=f"{backend}-{table}") for backend, table in pairs]


def _filled(request: pytest.FixtureRequest, backend: str) -> Filled:
    return request.getfixturevalue(f"filled_{backend}")


def _column_type_pairs(conn: sa.Connection, tables: list[str]) -> dict[tuple[str, str], str]:
    """(PostgreSQL type as migrated, DuckDB view type) of every column of `tables` -> a table holding it."""
    migrated = {
        (table, column): udt
        for table, column, udt in conn.execute(
            sa.text(
                "SELECT table_name, column_name, udt_name FROM information_schema.columns "
                "WHERE table_schema = current_schema()"
            )
        )
    }
    pairs: dict[tuple[str, str], str] = {}
    for table in tables:
        for column in SQLModel.metadata.tables[table].columns:
            pairs.setdefault((migrated[(table, column.name)], duck._duck_type(column)), table)
    return pairs


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_postgresql_round_trip_tables_cover_every_column_type(engine) -> None:
    with engine.connect() as conn:
        everywhere = _column_type_pairs(conn, TABLES)
        covered = _column_type_pairs(conn, PG_TYPE_TABLES)
    missing = {pair: table for pair, table in everywhere.items() if pair not in covered}
    assert not missing, f"add these tables to PG_TYPE_TABLES (their column types are not covered): {missing}"


def _insert_judgments(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(Judgment), rows)


def _judgment(change_id: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "change_id": change_id,
        "product": "Acme Fungear",
        "decision": "INCLUDE",
        "reasoning": "Implements core feature",
        "timestamp": MOMENT,
        "was_corrected": False,
        # every row names every column: an executemany takes its columns from the first row
        **dict.fromkeys(("metric", "confidence", "user_decision", "user_reasoning", "url", "ai_provider")),
    }
    row.update(fields)
    return row


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# --- CSV ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "table"), _round_trips(TABLES))
def test_csv_round_trip_neutralises_text_and_keeps_other_values(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, table: str
) -> None:
    engine, rows = _filled(request, backend)
    out = tmp_path / f"{table}.csv"
    assert export_table(engine=engine, table=table, fmt="csv", out=out) == 1
    (cell_row,) = _csv_rows(out)
    expected_by_kind = {
        "text": lambda value: "'" + value,  # every text cell of the fixture is hostile
        "int": str,
        "float": lambda _: "-2.5",
        "bool": lambda _: "true",
        "datetime": lambda _: MOMENT_TEXT,
        "date": lambda value: value.isoformat(),  # a DATE exports as ISO text in CSV
        "json": lambda value: json.dumps(value),
        "bytes": lambda _: "'=1\\x00",  # DuckDB's escaped text of the blob, neutralised
    }
    for column in SQLModel.metadata.tables[table].columns:
        expected = expected_by_kind[_kind(column)](rows[table][column.name])
        assert cell_row[column.name] == expected, column.name


def test_csv_export_leaves_plain_text_and_negative_numbers_untouched(engine, tmp_path: Path) -> None:
    confidences = [-0.75, -3.0, 0.0, 0.9, -1.5, 1.0]
    _insert_judgments(
        engine,
        [
            _judgment(f"c{i}", reasoning=text, confidence=c)
            for i, (text, c) in enumerate(zip(PLAIN, confidences, strict=True))
        ],
    )
    out = tmp_path / "judgments.csv"
    export_table(engine=engine, table="judgments", fmt="csv", out=out)
    rows = {r["change_id"]: r for r in _csv_rows(out)}
    assert [rows[f"c{i}"]["reasoning"] for i in range(len(PLAIN))] == PLAIN
    assert [float(rows[f"c{i}"]["confidence"]) for i in range(len(PLAIN))] == confidences
    assert all(not rows[f"c{i}"]["confidence"].startswith("'") for i in range(len(PLAIN)))


def _snapshot(snapshot_id: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": snapshot_id,
        "question": "q",
        "model_answer": "a",
        "product": "p",
        "created_at": MOMENT,
        "bonus_metrics": [],
        "user_scores_json": {},
        "judge_scores_json": {},
        "status": "active",
        "deleted_at": None,
    }
    row.update(fields)
    return row


def test_evaluations_view_excludes_soft_deleted_snapshots(engine, tmp_path: Path) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(EvaluationSnapshot),
            [_snapshot("live"), _snapshot("gone", status="archived", deleted_at=MOMENT)],
        )
    out = tmp_path / "evaluations.csv"
    assert export_table(engine=engine, table="evaluations", fmt="csv", out=out) == 1
    assert [r["id"] for r in _csv_rows(out)] == ["live"]


def test_corrections_view_holds_only_corrected_judgments(engine, tmp_path: Path) -> None:
    _insert_judgments(
        engine,
        [
            _judgment("kept", user_decision="EXCLUDE", was_corrected=True),
            _judgment("confirmed", user_decision="INCLUDE", was_corrected=False),
            _judgment("unreviewed"),
        ],
    )
    out = tmp_path / "corrections.csv"
    assert export_table(engine=engine, table="corrections", fmt="csv", out=out) == 1
    assert [r["change_id"] for r in _csv_rows(out)] == ["kept"]


def test_where_sql_exports_only_matching_rows(engine, tmp_path: Path) -> None:
    _insert_judgments(
        engine, [_judgment("a1", product="A"), _judgment("b1", product="B"), _judgment("a2", product="A")]
    )
    out = tmp_path / "a.csv"
    count = export_table(
        engine=engine, table="judgments", fmt="csv", out=out, where_sql="product = ?", params=["A"]
    )
    assert count == 2
    assert sorted(r["change_id"] for r in _csv_rows(out)) == ["a1", "a2"]


def test_query_csv_exports_every_filtered_row_neutralised(engine, tmp_path: Path) -> None:
    _insert_judgments(
        engine,
        [_judgment(f"c{i}", product="A", reasoning="=HYPERLINK(1)") for i in range(30)]
        + [_judgment("b", product="B")],
    )
    out = tmp_path / "filtered.csv"
    sql = f"SELECT change_id, reasoning FROM {table_ref('judgments')} WHERE product = $p ORDER BY id"
    assert export_query_csv(engine=engine, sql=sql, params={"p": "A"}, out=out) == 30
    rows = _csv_rows(out)
    assert len(rows) == 30
    assert {r["reasoning"] for r in rows} == {"'=HYPERLINK(1)"}


# --- Parquet and JSON Lines -----------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "table"), _round_trips(TABLES))
def test_parquet_round_trip_keeps_values(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, table: str
) -> None:
    engine, rows = _filled(request, backend)
    out = tmp_path / f"{table}.parquet"
    assert export_table(engine=engine, table=table, fmt="parquet", out=out) == 1
    (back,) = pq.read_table(out).to_pylist()
    for column in SQLModel.metadata.tables[table].columns:
        value = rows[table][column.name]
        got = json.loads(back[column.name]) if _kind(column) == "json" else back[column.name]
        assert got == value, column.name  # a DATE column stays a date (lib.duck maps it to DATE)


@pytest.mark.parametrize(
    ("backend", "table"), _round_trips([t for t in TABLES if t not in export.CACHE_FORMAT_TABLES])
)
def test_json_lines_round_trip_keeps_values(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, table: str
) -> None:
    engine, rows = _filled(request, backend)
    out = tmp_path / f"{table}.jsonl"
    assert export_table(engine=engine, table=table, fmt="json", out=out) == 1
    (line,) = out.read_text(encoding="utf-8").splitlines()
    back = json.loads(line)
    for column in SQLModel.metadata.tables[table].columns:
        expected = {"datetime": MOMENT_TEXT, "bytes": "=1\\x00", "date": MOMENT.date().isoformat()}.get(
            _kind(column), rows[table][column.name]
        )
        assert back[column.name] == expected, column.name


# --- seed-004 JSON cache --------------------------------------------------------------------------


def _cache_rows() -> list[dict[str, Any]]:
    return [
        _judgment(
            "github.com/owner/repo#123",
            user_decision="EXCLUDE",
            user_reasoning="Actually internal tooling",
            was_corrected=True,
            url="https://github.com/owner/repo/pull/123",
            ai_provider="openai",
        ),
        _judgment("snap_1:clarity", decision="4", metric="clarity", timestamp=MOMENT + timedelta(days=1)),
    ]


def test_judgments_json_is_the_seed_cache_format(engine, tmp_path: Path) -> None:
    _insert_judgments(engine, _cache_rows())
    out = tmp_path / "cache.json"
    assert export_table(engine=engine, table="judgments", fmt="json", out=out) == 2
    cache = json.loads(out.read_text(encoding="utf-8"))
    assert cache == {
        "cache_version": "1.0",
        "judgments": {
            "github.com/owner/repo#123": {
                "change_id": "github.com/owner/repo#123",
                "decision": "INCLUDE",
                "reasoning": "Implements core feature",
                "user_decision": "EXCLUDE",
                "user_reasoning": "Actually internal tooling",
                "product": "Acme Fungear",
                "timestamp": MOMENT_TEXT,
                "url": "https://github.com/owner/repo/pull/123",
                "ai_provider": "openai",
            },
            "snap_1:clarity": {
                "change_id": "snap_1:clarity",
                "decision": "4",
                "reasoning": "Implements core feature",
                "user_decision": None,
                "user_reasoning": None,
                "product": "Acme Fungear",
                "timestamp": "2024-11-16T10:30:00.123456Z",
                "metric": "clarity",
            },
        },
    }


def test_cache_timestamps_parse_back_to_the_stored_instant(engine, tmp_path: Path) -> None:
    _insert_judgments(engine, _cache_rows())
    out = tmp_path / "cache.json"
    export_table(engine=engine, table="judgments", fmt="json", out=out)
    entry = json.loads(out.read_text(encoding="utf-8"))["judgments"]["github.com/owner/repo#123"]
    assert datetime.fromisoformat(entry["timestamp"]) == MOMENT


def test_cache_json_of_an_empty_table_is_valid(engine, tmp_path: Path) -> None:
    out = tmp_path / "cache.json"
    assert export_table(engine=engine, table="judgments", fmt="json", out=out) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == {"cache_version": "1.0", "judgments": {}}


def test_cache_json_streams_across_batches(engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "JSON_BATCH_ROWS", 3)
    _insert_judgments(engine, [_judgment(f"c{i}") for i in range(10)])
    out = tmp_path / "cache.json"
    assert export_table(engine=engine, table="judgments", fmt="json", out=out) == 10
    assert sorted(json.loads(out.read_text(encoding="utf-8"))["judgments"]) == sorted(
        f"c{i}" for i in range(10)
    )


def test_corrections_json_is_a_cache_of_corrections_only(engine, tmp_path: Path) -> None:
    _insert_judgments(engine, _cache_rows())
    out = tmp_path / "corrections.json"
    export_table(engine=engine, table="corrections", fmt="json", out=out)
    assert list(json.loads(out.read_text(encoding="utf-8"))["judgments"]) == ["github.com/owner/repo#123"]


# --- errors ---------------------------------------------------------------------------------------


def test_unknown_table_error_lists_valid_names(engine, tmp_path: Path) -> None:
    with pytest.raises(ExportError) as info:
        export_table(engine=engine, table="users", fmt="csv", out=tmp_path / "x.csv")
    for name in ("judgments", "evaluations", "corrections", "session_notes"):
        assert name in str(info.value)


def test_unknown_format_is_refused(engine, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="xlsx"):
        export_table(engine=engine, table="judgments", fmt="xlsx", out=tmp_path / "x.xlsx")


@pytest.mark.parametrize("fmt", export.FORMATS)
def test_missing_directory_is_refused(engine, tmp_path: Path, fmt: str) -> None:
    with pytest.raises(ExportError, match="does not exist"):
        export_table(engine=engine, table="judgments", fmt=fmt, out=tmp_path / "nowhere" / "x.out")


def test_directory_as_output_is_refused(engine, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="directory"):
        export_table(engine=engine, table="judgments", fmt="csv", out=tmp_path)


def test_failed_export_leaves_no_file_behind(engine, tmp_path: Path) -> None:
    _insert_judgments(engine, [_judgment("c1")])
    out_dir = tmp_path / "exports"
    out_dir.mkdir()
    with pytest.raises(ExportError):
        export_table(
            engine=engine, table="judgments", fmt="csv", out=out_dir / "x.csv", where_sql="no_such_column = 1"
        )
    assert list(out_dir.iterdir()) == []


def _leftover(folder: Path, name: str, token: str, *, claim: bool = True, age: float = 7200) -> list[Path]:
    """A dead export's files to `name` (its partial, and its claim unless `claim` is False), `age` s old."""
    made = [folder / f".{name}.{token}.partial", *([folder / f".{name}.{token}.lock"] if claim else [])]
    then = time.time() - age
    for path in made:
        path.write_bytes(b"half a file" if path.suffix == ".partial" else b"")
        os.utime(path, (then, then))
    return made


def test_an_export_sweeps_its_files_dead_leftovers_and_keeps_the_rest(engine, tmp_path: Path) -> None:
    """An export killed before its cleanup (at exit, SIGKILL) left its hidden partial for ever."""
    _insert_judgments(engine, [_judgment("c1")])
    folder = tmp_path / "exports"
    folder.mkdir()
    dead = _leftover(folder, "x.csv", "0badc0de") + _leftover(folder, "x.csv", "01dc0de0", claim=False)
    kept = [
        *_leftover(folder, "x.csv", "f4e5a6b7", age=60),  # recent: maybe an export between claim and lock
        *_leftover(folder, "y.csv", "0badc0de"),  # another file's: swept by an export to y.csv
        *_leftover(folder, "x.csv", "not-hex0"),  # not an export's name
    ]
    live = _leftover(folder, "x.csv", "1a2b3c4d")  # an hour old, but its export still runs
    holder = os.open(live[1], os.O_WRONLY)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert export_table(engine=engine, table="judgments", fmt="csv", out=folder / "x.csv") == 1
    finally:
        os.close(holder)
    assert sorted(folder.iterdir()) == sorted([*kept, *live, folder / "x.csv"])
    assert not any(path.exists() for path in dead)


@pytest.mark.parametrize("failing", ["partial", "lock"])
def test_a_cleanup_unlink_that_fails_keeps_the_export_s_error_and_lets_the_claim_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """An unlink in the cleanup that fails with something other than FileNotFoundError skipped the
    rest of it: the claim's descriptor stayed open and locked (until the process exits: the API
    server), and the PermissionError replaced the export's own error (review3 E1)."""
    out = tmp_path / "x.csv"
    claims: list[tuple[str, int]] = []
    claim_of = export._claim
    monkeypatch.setattr(export, "_claim", lambda path: claims.append(claim_of(path)) or claims[-1])
    unlink = Path.unlink

    def refused(path: Path, missing_ok: bool = False) -> None:
        if path.parent == tmp_path and path.name.endswith(f".{failing}"):
            raise PermissionError(13, "Permission denied", str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)
    with pytest.raises(RuntimeError, match="the export's own error"), export._written_aside(out) as partial:
        partial.write_bytes(b"half a file")
        raise RuntimeError("the export's own error")
    monkeypatch.undo()
    ((token, fd),) = claims
    with pytest.raises(OSError):  # closed
        os.fstat(fd)
    partial, claim = export._aside_paths(out, token)
    assert [path.exists() for path in (partial, claim)] == [failing == "partial", failing == "lock"]
    if failing == "lock":  # nobody holds its lock: the next export's sweep may take it
        holder = os.open(claim, os.O_WRONLY)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(holder)


@sqlite_only  # a process's death, not a dialect: the PostgreSQL sweep runs in the test above
def test_a_killed_exports_partial_is_kept_while_it_runs_and_swept_once_it_is_dead(
    engine, tmp_path: Path
) -> None:
    """A real second process: its claim's lock, not its files' age, tells a live export from a dead one."""
    _insert_judgments(engine, [_judgment("c1")])
    out = tmp_path / "x.csv"
    writer = subprocess.Popen(
        [sys.executable, "-c", f"""
import os, signal, sys
from pathlib import Path
from lib import export
with export._written_aside(Path({str(out)!r})) as partial:
    partial.write_bytes(b"half a file")
    print("writing", flush=True)
    sys.stdin.readline()
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup: as at exit or under the OOM killer
"""],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        leftovers = sorted(tmp_path.glob(".x.csv.*"))
        assert [p.suffix for p in leftovers] == [".lock", ".partial"]
        for path in leftovers:
            os.utime(path, (time.time() - 7200,) * 2)
        export_table(engine=engine, table="judgments", fmt="csv", out=out)
        assert all(path.exists() for path in leftovers), "a live export's files are never swept"
    finally:
        assert writer.stdin is not None
        writer.stdin.write("\n")
        writer.stdin.close()
        assert writer.wait(timeout=60) == -signal.SIGKILL
    assert all(path.exists() for path in leftovers)
    export_table(engine=engine, table="judgments", fmt="csv", out=out)
    assert sorted(tmp_path.glob(".x.csv.*")) == []


# --- small frames for download buttons ------------------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE)
def test_neutralise_cell_prefixes_formula_text(value: str) -> None:
    assert neutralise_cell(value) == "'" + value


@pytest.mark.parametrize("value", [*PLAIN, "", -2, -0.5, None, True])
def test_neutralise_cell_leaves_other_values(value: object) -> None:
    assert neutralise_cell(value) == value


def test_frame_csv_neutralises_text_and_keeps_numbers() -> None:
    scores = [-(i + 1) if i % 2 else i for i in range(len(HOSTILE) + 1)]
    frame = pd.DataFrame({"reason": [*HOSTILE, "fine"], "score": scores})
    back = pd.read_csv(io.BytesIO(frame_to_csv_bytes(frame)), keep_default_na=False)
    assert back["reason"].tolist() == ["'" + v for v in HOSTILE] + ["fine"]
    assert back["score"].tolist() == scores


def test_frame_csv_neutralises_header_cells() -> None:
    frame = pd.DataFrame({"=metric": ["x"]})
    assert frame_to_csv_bytes(frame).decode("utf-8").splitlines()[0] == "'=metric"


# --- the CLI --------------------------------------------------------------------------------------


def _cli(engine: Engine, *args: str) -> CliResult:
    return cli.run_cli(*args, env={"OVERRULE_DATABASE_URL": engine.url.render_as_string(hide_password=False)})


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_cli_export_writes_the_file(engine, tmp_path: Path, fmt: str) -> None:
    _insert_judgments(engine, _cache_rows())
    out = tmp_path / f"judgments.{fmt}"
    result = _cli(engine, "export", "judgments", "--format", fmt, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "exported 2 rows" in result.stdout
    assert out.stat().st_size > 0


def test_cli_export_of_unknown_table_fails_with_the_valid_names(engine, tmp_path: Path) -> None:
    result = _cli(engine, "export", "users", "--out", str(tmp_path / "x.csv"))
    assert result.returncode == 1
    assert "judgments" in result.stderr


# --- the DuckDB connection ------------------------------------------------------------------------

_PROBE = """
import json, sys
import lib.isolated
from lib.db import create_db_engine
from lib.duck import duck_connect, scan_source, source_kind
from lib.isolated import RAW_QUERY_FUNCTIONS, scanner_session
lib.isolated._sqlite_scanner_allowed = True  # as in a worker: this process holds no connection
engine = create_db_engine(sys.argv[1])
con = duck_connect(engine)
row = con.execute(
    "SELECT loaded, installed FROM duckdb_extensions() WHERE extension_name LIKE '%scanner'"
    " AND loaded"
).fetchone()
with scanner_session(scan_source(engine)) as cur:  # the export worker's path: a cursor of its kept database
    read = RAW_QUERY_FUNCTIONS[engine.dialect.name] + "('app_raw', 'SELECT timestamp FROM judgments')"
    kept_time = cur.execute(f"SELECT CAST(CAST(timestamp AS TIMESTAMPTZ) AS VARCHAR) FROM {read}").fetchone()[0]
print(json.dumps({"source": source_kind(con), "loaded": row[0], "installed": row[1],
                  "rows": con.execute("SELECT count(*) FROM db.judgments").fetchone()[0],
                  "time": con.execute("SELECT CAST(timestamp AS VARCHAR) FROM db.judgments").fetchone()[0],
                  "kept_time": kept_time,
                  "unsigned": con.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()[0]}))
"""


@pytest.mark.slow  # a new interpreter importing the whole stack and DuckDB's scanner
def test_scanner_loads_from_the_package_without_install(engine, tmp_path: Path) -> None:
    _insert_judgments(engine, [_judgment("c1")])
    home = tmp_path / "home"
    home.mkdir()
    # An empty home: no previously downloaded extension. A server whose zone is not UTC: times are
    # still read and exported in UTC, on a connection and on a cursor of the worker's kept database.
    env = {**os.environ, "HOME": str(home), "TZ": "America/New_York"}
    # As deployed: the extension's signature is checked (the rest of the suite skips that check).
    env.pop(isolated.TRUST_EXTENSIONS_VAR, None)
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, engine.url.render_as_string(hide_password=False)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    expected_source = "sqlite" if engine.dialect.name == "sqlite" else "postgres"
    assert probe == {
        "source": expected_source,
        "loaded": True,
        "installed": False,
        "rows": 1,
        "time": "2024-11-15 10:30:00.123456+00",
        "kept_time": "2024-11-15 10:30:00.123456+00",
        "unsigned": False,
    }
    assert not (home / ".duckdb" / "extensions").exists()


def _scanned_tables(con: duckdb.DuckDBPyConnection) -> tuple[str, dict[str, pd.DataFrame]]:
    """Every exportable table read through one scanner connection (module-level: it crosses to a child)."""
    return source_kind(con), {
        table: fetch_frame(con, f"SELECT * FROM {table_ref(table)}") for table in TABLES
    }


def test_arrow_path_reads_the_same_rows_as_the_scanner(filled) -> None:
    engine, _ = filled
    # with_duck uses the scanner: in a child process on SQLite (issue #17), in this one on PostgreSQL.
    # One with_duck call reads every table: a scanner connection per table cost ~0.4 s each.
    source, scanned = with_duck(engine, _scanned_tables)
    assert source == ("sqlite" if engine.dialect.name == "sqlite" else "postgres")
    assert sorted(scanned) == TABLES
    fallback = duck_connect(engine, scanner=False)
    try:
        assert source_kind(fallback) == "duckdb"
        for table in TABLES:
            query = f"SELECT * FROM {table_ref(table)}"
            pd.testing.assert_frame_equal(fetch_frame(fallback, query), scanned[table], obj=table)
    finally:
        fallback.close()


def test_sqlite_scanner_never_opens_the_file_in_the_app_process(sqlite_engine) -> None:
    """Issue #17: DuckDB's own SQLite library in this process would drop this process's locks."""
    con = duck_connect(sqlite_engine)
    try:
        assert source_kind(con) == "duckdb"  # read through the app's connection, as Arrow batches
        loaded = con.execute(
            "SELECT count(*) FROM duckdb_extensions() WHERE loaded AND extension_name LIKE 'sqlite%'"
        )
        assert loaded.fetchone() == (0,)
    finally:
        con.close()
    assert with_duck(sqlite_engine, source_kind) == "sqlite"


def test_an_error_inside_the_child_reaches_the_caller(sqlite_engine, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="failed"):
        export_query_csv(
            engine=sqlite_engine, sql="SELECT no_such_column FROM db.judgments", out=tmp_path / "x.csv"
        )


TYPED_COLUMNS = [
    ("judgments", "id", "BIGINT"),
    ("judgments", "was_corrected", "BOOLEAN"),
    ("judgments", "timestamp", "TIMESTAMP WITH TIME ZONE"),
    ("judgments", "confidence", "DOUBLE"),
    ("evaluation_snapshots", "bonus_metrics", "JSON"),
    ("evaluation_snapshots", "question", "VARCHAR"),
]


def test_typed_views_use_one_type_per_column_on_every_backend(filled) -> None:
    con = duck_connect(filled[0])  # one connection for every column (each costs a scanner attach)
    try:
        types = {
            (table, column): con.execute(
                f"SELECT column_type FROM (DESCRIBE {table_ref(table)}) WHERE column_name = ?", [column]
            ).fetchone()[0]
            for table, column, _ in TYPED_COLUMNS
        }
    finally:
        con.close()
    assert types == {(table, column): duck_type for table, column, duck_type in TYPED_COLUMNS}


@pytest.mark.parametrize("name", ["users", "judgments; DROP TABLE judgments", 'judgments"'])
def test_table_ref_refuses_unknown_names(name: str) -> None:
    with pytest.raises(ValueError, match="unknown table"):
        table_ref(name)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("table", ["evaluation_snapshots", "evaluations"])
def test_a_lone_surrogate_already_stored_does_not_fail_the_export(
    engine, tmp_path: Path, table: str, fmt: str
) -> None:
    """Issue #17: imports refuse them now, but JSON stored earlier can hold one (SQLite, PostgreSQL json)."""
    broken = {"clarity": {"user_reason": "why \ud800 not", "evidence": [{"quote": "a", "better": "\udc00"}]}}
    with engine.begin() as conn:
        conn.execute(
            insert(EvaluationSnapshot),
            [_snapshot("broken", evidence_json=broken), _snapshot("fine", evidence_json={"ok": "😀"})],
        )
    out = tmp_path / f"{table}.{fmt}"
    assert export_table(engine=engine, table=table, fmt=fmt, out=out) == 2
    if fmt == "parquet":
        values = {row["id"]: row["evidence_json"] for row in pq.read_table(out).to_pylist()}
    elif fmt == "csv":
        values = {row["id"]: row["evidence_json"] for row in _csv_rows(out)}
    else:
        lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        values = {row["id"]: json.dumps(row["evidence_json"]) for row in lines}
    assert json.loads(values["broken"]) == {
        "clarity": {"user_reason": "why \ufffd not", "evidence": [{"quote": "a", "better": "\ufffd"}]}
    }
    assert json.loads(values["fine"]) == {"ok": "😀"}  # a valid surrogate pair is untouched


def test_the_arrow_copy_reads_a_stored_lone_surrogate_too(engine) -> None:
    with engine.begin() as conn:
        conn.execute(insert(EvaluationSnapshot), [_snapshot("broken", evidence_json={"why": "\ud800"})])
    con = duck_connect(engine, scanner=False)
    try:
        frame = fetch_frame(con, f"SELECT evidence_json FROM {table_ref('evaluation_snapshots')}")
    finally:
        con.close()
    assert json.loads(frame["evidence_json"][0]) == {"why": "\ufffd"}


def test_api_token_hashes_are_not_exportable(tmp_path: Path) -> None:
    """The tokens table exists but no export (CLI, page or API) can read it."""
    assert "api_tokens" in SQLModel.metadata.tables
    assert "api_tokens" not in export.EXPORTABLE_TABLES
    with pytest.raises(export.ExportError):
        export.export_table(engine=None, table="api_tokens", fmt="csv", out=tmp_path / "t.csv")  # type: ignore[arg-type]


# --- the evaluations CSV, wide and long ------------------------------------------------------------


@pytest.mark.parametrize(("form", "rows"), [("wide", 1), ("long", 2)])
def test_cli_exports_evaluations_wide_or_long(engine, tmp_path: Path, form: str, rows: int) -> None:
    from sqlmodel import Session

    from lib.importer import import_evaluations

    record = {
        "id": "s_1",
        "question": "Ödülü kim aldı?",
        "model_answer": "+cmd|' /C calc'!A0",
        "product": "acme",
        "user_scores": {"clarity": 2, "safety": 5},
        "judge_scores": {"clarity": 4, "safety": 5},
    }
    with Session(engine) as session:
        import_evaluations(session=session, records=[record], reviewer="t")
        session.commit()
    out = tmp_path / f"evaluations_{form}.csv"
    result = _cli(engine, "export", "evaluations", "--form", form, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"exported {rows} rows of evaluations" in result.stdout
    read = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert len(read) == rows
    assert {r["answer"] for r in read} == {"'+cmd|' /C calc'!A0"}
    assert {r["question"] for r in read} == {"Ödülü kim aldı?"}
    if form == "wide":
        assert (read[0]["clarity judge_score"], read[0]["clarity user_score"], read[0]["clarity gap"]) == (
            "4",
            "2",
            "2",
        )


def test_cli_export_form_is_for_the_evaluations_csv_only(engine, tmp_path: Path) -> None:
    result = _cli(engine, "export", "judgments", "--form", "long", "--out", str(tmp_path / "x.csv"))
    assert result.returncode == 1
    assert "--form applies to `export evaluations --format csv` only" in result.stderr
    assert not (tmp_path / "x.csv").exists()


# --- who may export what (issue 24 point 7) ------------------------------------------------------


def test_every_exportable_table_has_one_export_permission() -> None:
    assert set(export.EXPORT_PERMISSIONS) == set(EXPORTABLE_TABLES)
    admin_only = {t for t, p in export.EXPORT_PERMISSIONS.items() if not auth.role_allows("lead", p)}
    assert admin_only == {"audit_events", "user_roles"}


@pytest.mark.parametrize("table", ["audit_events", "user_roles"])
def test_access_records_export_only_for_admins_in_lib(
    engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "signin")
    reset_settings()
    out = tmp_path / f"{table}.csv"
    for role in ("viewer", "reviewer", "lead"):
        with pytest.raises(auth.PermissionDenied, match="admin"):
            export_table(engine=engine, table=table, fmt="csv", out=out, actor=auth.Actor("v@x", role))
        assert not out.exists()
    with pytest.raises(auth.MissingIdentity):
        export_table(engine=engine, table=table, fmt="csv", out=out)
    export_table(engine=engine, table=table, fmt="csv", out=out, actor=auth.Actor("a@x", "admin"))
    assert out.exists()
    viewer = auth.Actor("v@x", "viewer")
    assert (
        export_table(engine=engine, table="judgments", fmt="csv", out=tmp_path / "j.csv", actor=viewer) == 0
    )
