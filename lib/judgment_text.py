"""How a judgment's values are read and written as text: a score from stored JSON or text, a score
and a reviewer's decision as CSV text, a judge version's name.

The one home of these rules, and lean on purpose (DuckDB, Arrow and the standard library; no
SQLModel, SQLAlchemy or pandas): the export's DuckDB worker (`lib.wide_scan`) imports only this,
`lib.csv_text` and `lib.isolated`, so it starts at a fraction of the app's memory. `lib.metrics`,
`lib.corrections`, `lib.judge_versions` and `lib.inspector` import what they need from here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from lib.sql_quote import quote_literal

UNVERSIONED_NAME = "unversioned"


def parse_score(value: Any) -> float | None:
    """A finite float from a number or numeric text, else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def format_score(value: float) -> str:
    """The one text form of a score as a decision: whole numbers without ".0" ("4"), others the
    shortest text that reads back to the same float ("2.67", "0.3333333333333333").

    Every writer uses it (importer, judge, reviews, demo), so a stored decision never loses
    precision (`f"{x:g}"` would store 0.333333) and equal scores are equal text.
    """
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def decision_value(decision: str | None) -> float | str | None:
    """A decision as the CSV holds it: a number when it is one (a score), else its text (a label)."""
    if decision is None:
        return None
    number = parse_score(decision)
    return decision if number is None else number


def score_of(entry: Any) -> float | None:
    """The numeric score of a stored score entry ({"score": x, ...} or a bare number)."""
    if isinstance(entry, Mapping):
        entry = entry.get("score")
    if entry is None or isinstance(entry, bool):
        return None
    return float(entry) if isinstance(entry, int | float) else None


def json_pointer(key: str) -> str:
    """The JSON pointer (RFC 6901) of a top-level key, as DuckDB's json functions take it."""
    return "/" + key.replace("~", "~0").replace("/", "~1")


# JSON types whose value score_of takes as a number (a bool is not one; yyjson reads an integer past
# 64 bits as a double, as Python's float() of it gives).
_JSON_NUMBERS = "'BIGINT', 'UBIGINT', 'DOUBLE'"


_WHITESPACE = "' \t\n\r'"


def object_parse_sql(doc: str, slugs: Sequence[str]) -> str:
    """DuckDB SQL reading the stored scores object `doc` (SQL of a JSON text) for `score_sql`: a
    struct of whether `doc` is a JSON object (`o`: score_of reads only an object's entries, and a
    pointer such as "/0" would read into an array), the JSON types of each slug's entry and then of
    each entry's "score" (`t`) and each entry's "score" (`s`). NULL where DuckDB cannot parse the
    text (`unread_sql`). Select it in one query level, `bare_entries_sql` over it in the next, and
    `score_sql` over both in a third.

    Each document is parsed twice per vector (one json_type of every path, one json_extract of the
    scores), and each parse keeps an arena of the vector's parsed documents (~9 MiB for 2,048 judge
    objects): no CASE around the reads (which would parse the document again for the condition),
    no json_type per score, and no expression repeated in the same query level (DuckDB would compute
    it once outside the TRY, where an unparsable document fails the whole export). Entries are not
    written back out as JSON where they are objects (a judge's entry carries its reason: that was
    most of the CPU)."""
    paths = [json_pointer(slug) for slug in slugs]
    every = ", ".join(map(quote_literal, [*paths, *(p + "/score" for p in paths)]))
    scores = f"[{', '.join(quote_literal(p + '/score') for p in paths)}]"
    return (
        f"TRY({{'o': starts_with(ltrim({doc}, {_WHITESPACE}), '{{'), 't': json_type({doc}, [{every}]), "
        f"'s': json_extract({doc}, {scores})}})"
    )


def bare_entries_sql(parsed: str, doc: str, slugs: Sequence[str]) -> str:
    """DuckDB SQL: the entries of `doc` as JSON, only where some entry is a bare number (by `parsed`,
    `object_parse_sql` of `doc` selected in the query level below), else NULL: a third parse of
    just those documents."""
    entries = ", ".join(quote_literal(json_pointer(slug)) for slug in slugs)
    return (
        f"CASE WHEN list_has_any({parsed}.t[1:{len(slugs)}], [{_JSON_NUMBERS}]) "
        f"THEN TRY(json_extract({doc}, [{entries}])) END"
    )


def score_sql(parsed: str, bare: str, slugs: Sequence[str], index: int) -> str:
    """DuckDB SQL of `score_of(scores.get(slugs[index]))` over `parsed` (`object_parse_sql`'s
    struct) and `bare` (`bare_entries_sql`'s list), as DOUBLE: an object's "score" or the bare
    value, a number only (tests/test_export_csv.py holds it against score_of on odd entries)."""
    at = index + 1
    kind, score_kind = f"{parsed}.t[{at}]", f"{parsed}.t[{len(slugs) + at}]"
    return (
        f"CASE WHEN NOT {parsed}.o THEN NULL WHEN {kind} = 'OBJECT' THEN (CASE WHEN {score_kind} IN "
        f"({_JSON_NUMBERS}) THEN CAST({parsed}.s[{at}] AS DOUBLE) END) WHEN {kind} IN ({_JSON_NUMBERS}) "
        f"THEN CAST({bare}[{at}] AS DOUBLE) END"
    )


def unread_sql(parsed: str, doc: str) -> str:
    """DuckDB SQL: whether `doc` looks like a JSON object that DuckDB could not parse (`parsed`, from
    `object_parse_sql`, is NULL), so `rescue_unread_scores` reads it with Python's json."""
    return f"COALESCE({parsed} IS NULL AND starts_with(ltrim({doc}, {_WHITESPACE}), '{{'), false)"


def rescue_unread_scores(
    columns: list[pa.Array],
    texts: pa.Array | pa.ChunkedArray,
    unread: pa.Array | pa.ChunkedArray,
    slugs: Sequence[str],
) -> list[pa.Array]:
    """`columns` (per slug, from `score_sql`) with the rows DuckDB could not parse (`unread`; e.g. an
    escaped lone surrogate, which Python's json reads) read by json.loads and score_of."""
    if not pc.any(unread).as_py():
        return columns
    values = [column.to_pylist() for column in columns]
    for row in pc.indices_nonzero(unread).to_pylist():
        stored = json.loads(texts[row].as_py())
        stored = stored if isinstance(stored, Mapping) else {}
        for slug, column in zip(slugs, values, strict=True):
            column[row] = score_of(stored.get(slug))
    return [pa.array(column, pa.float64()) for column in values]


def scores_of_json(con: duckdb.DuckDBPyConnection, texts: pa.Array, slugs: Sequence[str]) -> list[pa.Array]:
    """`score_of(scores.get(slug))` of each stored scores object (JSON text), per slug, as float64
    arrays: the exports' way to read a million evaluations' scores without a json.loads per row.

    DuckDB (`con`: an in-memory connection, no database attached) parses each document once
    (`object_parse_sql`) and reads each score by `score_sql`; a text DuckDB cannot parse goes
    through json.loads (`rescue_unread_scores`).
    """
    if not slugs:
        return []
    reads = ", ".join(f"{score_sql('x', 'e', slugs, i)} AS s{i}" for i in range(len(slugs)))
    con.register("_overrule_scores", pa.table({"t": texts}))
    try:
        found = con.execute(
            f"SELECT {unread_sql('x', 't')} AS unread, {reads} "
            f"FROM (SELECT *, {bare_entries_sql('x', 't', slugs)} AS e "
            f"FROM (SELECT t, {object_parse_sql('t', slugs)} AS x FROM _overrule_scores))"
        ).to_arrow_table()
    finally:
        con.unregister("_overrule_scores")
    columns = [found.column(f"s{i}").combine_chunks() for i in range(len(slugs))]
    return rescue_unread_scores(columns, texts, found.column("unread").combine_chunks(), slugs)


def name_for(version_id: int | None, names: Mapping[int, str] | None) -> str:
    """How a judgment's version is named wherever a judgment appears: its name, or "unversioned"."""
    if not version_id:
        return UNVERSIONED_NAME
    return (names or {}).get(int(version_id), f"#{version_id}")
