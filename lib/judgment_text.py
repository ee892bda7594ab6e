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
    """The numeric score of a stored score entry ({"score": x, ...} or a bare number), finite only.

    A stored NaN or infinity (json.dumps writes them; no validated writer stores one, `parse_score`)
    is no score, like a bool or a text: a page, a statistic or an export shows "not scored" rather
    than "nan", which would read as a value and turn every mean and gap over it into nan."""
    if isinstance(entry, Mapping):
        entry = entry.get("score")
    if entry is None or isinstance(entry, bool) or not isinstance(entry, int | float):
        return None
    number = float(entry)
    return number if math.isfinite(number) else None


def check_slugs(slugs: Sequence[str]) -> None:
    """Raise ValueError when two metric slugs are equal up to case: the exports read the scores as
    DuckDB struct fields, whose names are case-insensitive, so one metric would silently read the
    other's scores (rubric slugs are lowercase, `lib.metrics`; only foreign data can do this)."""
    seen: dict[str, str] = {}
    for slug in slugs:
        other = seen.setdefault(slug.casefold(), slug)
        if other != slug:
            raise ValueError(
                f"metrics {other!r} and {slug!r} differ only in case; an export cannot tell them apart"
            )


def json_pointer(key: str) -> str:
    """The JSON pointer (RFC 6901) of a top-level key, as DuckDB's json functions take it."""
    return "/" + key.replace("~", "~0").replace("/", "~1")


# A JSON value that score_of takes as a number starts with a minus or a digit (a bool, a string,
# null, an array or an object does not); DuckDB's cast of that text to DOUBLE reads it as Python's
# float() reads json.loads' number (an integer past 64 bits too).
_JSON_NUMBER = "'^[-0-9]'"
_WHITESPACE = "' \t\n\r'"


def _number_sql(json_value: str) -> str:
    """DuckDB SQL: `json_value` (the JSON text of one value) as DOUBLE where it is a JSON number."""
    return (
        f"CASE WHEN regexp_matches(CAST({json_value} AS VARCHAR), {_JSON_NUMBER}) "
        f"THEN CAST({json_value} AS DOUBLE) END"
    )


def object_parse_sql(doc: str, slugs: Sequence[str]) -> str:
    """DuckDB SQL reading the stored scores object `doc` (SQL of a JSON text) for `score_sql`: one
    `json_transform` to a struct of each slug's entry's "score" as JSON text. A missing entry is a
    NULL struct, an entry that is not an object (a bare number, an array) or has no "score" a struct
    with a NULL score, and a document that is not an object has no entries (score_of reads only an
    object's entries). NULL where DuckDB cannot parse the text (`unread_sql`). Select it in one query
    level, `bare_entries_sql` over it in the next, and `score_sql` over both in a third.

    One parse of each document per vector, and each parse keeps an arena of the vector's parsed
    documents (~9 MiB for 2,048 judge objects; the json_type of every entry and a json_extract of
    the scores took two, 23 MiB more at the worker's peak); an entry is not written back out as JSON
    where it is an object with a score (a judge's entry carries its reason). No expression is
    repeated in one query level: DuckDB would compute it once outside the TRY, where an unparsable
    document fails the whole export. `slugs` must not be empty (DuckDB cannot bind an empty struct)
    nor equal up to case (`check_slugs`)."""
    check_slugs(slugs)
    structure = json.dumps({slug: {"score": "JSON"} for slug in slugs})
    return f"TRY(json_transform({doc}, {quote_literal(structure)}))"


def bare_entries_sql(parsed: str, doc: str, slugs: Sequence[str]) -> str:
    """DuckDB SQL: the entries of `doc` as JSON text, only where some entry is there without a
    "score" (by `parsed`, `object_parse_sql` of `doc` selected in the query level below: a bare
    number, or anything score_of reads as none), else NULL: a second parse of just those documents."""
    entries = ", ".join(quote_literal(json_pointer(slug)) for slug in slugs)
    scoreless = " OR ".join(
        f"({parsed}[{quote_literal(slug)}] IS NOT NULL AND {parsed}[{quote_literal(slug)}]['score'] IS NULL)"
        for slug in slugs
    )
    return f"CASE WHEN {scoreless or 'false'} THEN TRY(json_extract({doc}, [{entries}])) END"


def score_sql(parsed: str, bare: str, slugs: Sequence[str], index: int) -> str:
    """DuckDB SQL of `score_of(scores.get(slugs[index]))` over `parsed` (`object_parse_sql`'s
    struct) and `bare` (`bare_entries_sql`'s list), as DOUBLE: an object's "score" or the bare
    value, a number only (tests/test_export_csv.py holds it against score_of on odd entries)."""
    score = f"{parsed}[{quote_literal(slugs[index])}]['score']"
    bare_number = _number_sql(f"{bare}[{index + 1}]")
    return f"COALESCE({_number_sql(score)}, CASE WHEN {score} IS NULL THEN {bare_number} END)"


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
    escaped lone surrogate, which Python's json reads) read by json.loads and score_of, and a
    non-finite score (NaN, Infinity, 1e400) read as none, as score_of reads it."""
    columns = [pc.if_else(pc.is_finite(column), column, None) for column in columns]
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
