"""Text search: one normalisation rule, a stored normalised column, and a trigram index under it.

The rule (`normalize_search_text`): NFKC, then the Turkish dotted/dotless I folded to a plain i
(so İ, I, ı and i all match each other), then Unicode full case folding, then NFKC again (case
folding can leave a string unnormalised). "ödülü" finds "Ödülü", "istanbul" finds "İstanbul",
"ISTANBUL" and "ıstanbul", "strasse" finds "Straße", "fi" finds the ligature "ﬁ". Accents are kept:
ö is not o (in Turkish they are different letters), so "odul" does not find "ödül". Folding every
I to i is the one choice that works without knowing a text's language: Turkish "ılık" and "ilik"
then match each other too, a price paid for never missing "istanbul".

Where it is stored: `evaluation_snapshots.search_text` (the question) and `session_notes.search_text`
(the content) hold the normalised text. It is written on every insert: by the row builders
(`lib.snapshots.evaluation_row`, the importer's note rows), by a Python column default for any other
Core insert that leaves it out, and by an ORM hook for objects (`lib.models`), which also recomputes
it on update. A matching query is `search_text` containing the normalised query, literally
(`%`, `_` and `\\` match themselves).

How it is found without a scan (the index is built by migration 0008):
- SQLite: an FTS5 table `<table>_search` with the `trigram` tokenizer over `search_text` (external
  content, so the text is not stored twice), kept in step by triggers; the condition is
  `rowid IN (SELECT rowid FROM <table>_search WHERE <table>_search MATCH '"<query>"')`. A trigram
  phrase matches exactly the rows that contain the query as a substring. The evaluations' index holds
  live rows only (migration 0014, `INDEX_LEAVES_OUT`): a count of a live list's matches is then the
  index's own count. The condition adds the archived rows whose stored text matches, row by row.
- PostgreSQL: a `pg_trgm` GIN index on `search_text`; the condition is `search_text LIKE '%query%'`,
  which the planner answers from the index. For a common query it walks the table or the list's
  date index instead, testing each row, and stops after a page or at a count's cap. A btree entry is
  limited to 2,704 bytes and questions may be longer, so no btree holds every `search_text`; one
  holds the short ones (`LIST_SHORT_TEXT_INDEX`, below).
- PostgreSQL, the live evaluations' text alone (issue 27): `LIST_SHORT_TEXT_INDEX` is the list's
  newest-first order with the normalised question as an INCLUDE column, for live rows whose text is
  at most `SHORT_TEXT_BYTES` (migration 0028). With `short_text` among its conditions the planner
  can walk it and test the text on its entries (an Index Only Scan: page 400 of a text in a fifth of
  100k questions reads 13 MB of index instead of ~13,600 pages of a 327 MB table), or still take
  the trigram index for a rare text. The live rows whose text is longer are read beside it (the
  same conditions with `short_text(..., longer=True)`, merged in list order: lib.inspector), when
  there are any: `TEXT_BYTES_INDEX` (the text's length in bytes) answers that in one probe of an
  empty range, finds the long ones, and gives the planner statistics of the length, so that it
  knows the condition keeps (nearly) every row (without them it guesses a third, and intersects
  the index with the trigram matches).
- A query of fewer than three characters has no trigram: it is a LIKE over the normalised column
  (a scan, but of a short query, which matches many rows and so finds a page quickly).
- A Python whose SQLite lacks FTS5 or the trigram tokenizer (before 3.34) gets no index from the
  migration and the LIKE everywhere (`sqlite_trigram_available`), correct but scanning.

Rare and common queries (SQLite, issue 19): any plan that starts from the index reads every match, so
its cost follows the number of matches, not the page (a phrase in a fifth of 1M questions is 200k
rowids before the first row of a page). A list therefore asks the index how many rows match, stopping
at `RARE_MATCHES` + 1 (`count_index_matches`, cheap because the index hands rowids out one by one):
- rare (at most `RARE_MATCHES`): the page comes from the index's rows (`index_matched_rows`) and a sort
  of those few;
- common: the page walks the list's own ordered index and tests each row's stored text with the LIKE
  (`text_match(..., scan=True)`); with at least `RARE_MATCHES` matches among the rows, a page of 25 is
  found within a bounded stretch of the walk, and it stops there.
A capped count of text alone over live evaluations is the index's count (`count_index_matches`), stopped
at `counters.TEXT_COUNT_CAP` + 1 (1,001: reading 10,001 rowids grew with the data). With other
filters, a text in at most `counters.COUNT_CAP` rows is counted from the index (`index_matched_rows`
under a LIMIT); a commoner one by the walk of the list index, which tests the other filters on its entries
and the text on the rows they keep, stopping at cap + 1 (from the index it would read every match).
`count_index_matches` and `index_matched_rows` see indexed rows only: for evaluations, live ones.
Every form states the same condition: the stored normalised text contains the normalised query.
"""

from __future__ import annotations

import sqlite3
import unicodedata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

from sqlalchemy import (
    Boolean,
    Connection,
    String,
    Table,
    bindparam,
    column,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy import table as table_clause
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement, FromClause, Join
from sqlalchemy.sql.compiler import SQLCompiler

SEARCH_COLUMN = "search_text"
# Each searchable table and the column its search text is the normalised copy of.
SEARCHABLE: dict[str, str] = {"evaluation_snapshots": "question", "session_notes": "content"}
MIN_TRIGRAM_CHARS = 3
# Up to this many index matches a list sorts them; above it the list walks its ordered index. The
# crossover (at 1M rows): a sort reads each match once (~2.5 µs), a walk reads ~N/matches rows per
# listed row (~5 µs each); at 5,000 either costs ~15-30 ms for a page of 25, and less on both sides.
RARE_MATCHES = 5_000
# Rows SQLite's index leaves out: those where this column is set (archived evaluations, migration 0014).
INDEX_LEAVES_OUT: dict[str, str] = {"evaluation_snapshots": "deleted_at"}
_SEEN_KEY = "lib.search.index_matches"  # session.info: (table, needle) -> (found, limit) of the last count
LIKE_ESCAPE = "\\"

# İ (U+0130) and ı (U+0131): case folding keeps ı apart from i and turns İ into i + combining dot.
_TURKISH_I = str.maketrans({"\u0130": "i", "\u0131": "i"})


def normalize_search_text(text: str | None) -> str:
    """The text as search compares it: NFKC, every dotted/dotless I as i, case-folded (see module doc)."""
    if not text:
        return ""
    if text.isascii():
        return text.lower()  # NFKC and casefold of ASCII are lower(); most text takes this path
    folded = unicodedata.normalize("NFKC", text).translate(_TURKISH_I).casefold()
    # "İ".lower() gives i + U+0307; text lower-cased that way elsewhere must still match "i".
    return unicodedata.normalize("NFKC", folded.replace("i\u0307", "i"))


def like_pattern(query: str) -> str:
    """A LIKE pattern (escape `\\`) matching `query` literally anywhere: its own % _ and \\ escaped."""
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def search_table_name(table: str) -> str:
    """The SQLite FTS5 table that indexes `table`'s search text."""
    return f"{table}_search"


# SQLite's Evaluations list index that also holds the normalised question (lib.models, issue 27): a
# common text is tested on the entries of a newest-first walk. PostgreSQL's btrees cannot hold every
# text; its trigram index and `LIST_SHORT_TEXT_INDEX` (below) serve there.
LIST_TEXT_INDEX = "ix_snapshot_live_text"
# The Evaluations list's index of fully reviewed live evaluations (lib.models): with the question on
# SQLite only, so each dialect has its own form of it.
LIST_REVIEWED_INDEX = "ix_snapshot_live_reviewed"
# PostgreSQL's Evaluations list order (live rows, newest first) with the normalised question as an
# INCLUDE column, for the live rows whose question is short enough for a btree entry, and the
# questions' length in bytes (migration 0028, lib.models; see the module doc).
LIST_SHORT_TEXT_INDEX = "ix_snapshot_live_short_text"
TEXT_BYTES_INDEX = "ix_snapshot_search_text_bytes"
# The longest `search_text` (bytes) `LIST_SHORT_TEXT_INDEX` holds: a btree entry is at most 2,704 bytes
# on 8 kB pages, which must also hold the entry's header, `created_at` and an `id` of up to 64
# characters (256 bytes): ~2,300 bytes at most.
SHORT_TEXT_BYTES = 2000


def is_search_index_object(name: str | None) -> bool:
    """Whether a schema object is part of the search index (FTS5 tables and their shadow tables, the
    trigram GIN indexes, SQLite's `LIST_TEXT_INDEX`, `LIST_REVIEWED_INDEX` with the text on SQLite
    and without it on PostgreSQL, PostgreSQL's `LIST_SHORT_TEXT_INDEX` and `TEXT_BYTES_INDEX`):
    built for one dialect only (the first two by migration, not declared in lib.models), so schema
    comparison skips it (tests/test_db.py compares the declared ones itself)."""
    if not name:
        return False
    if name in (LIST_TEXT_INDEX, LIST_REVIEWED_INDEX, LIST_SHORT_TEXT_INDEX, TEXT_BYTES_INDEX):
        return True
    for table in SEARCHABLE:
        fts = search_table_name(table)
        if name == fts or name.startswith(f"{fts}_") or name == f"ix_{table}_search_trgm":
            return True
    return False


@cache
def sqlite_trigram_available() -> bool:
    """Whether this Python's SQLite has FTS5 with the trigram tokenizer (3.34+); decides index or LIKE."""
    try:
        con = sqlite3.connect(":memory:")
        try:
            con.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='trigram case_sensitive 1')")
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return True


def index_covers(table: str, *, archived: bool) -> bool:
    """Whether SQLite's search index holds exactly the rows of `table`'s live (or archived) list, so
    that its matches are the list's matches and its count the list's count.

    The index leaves out the rows where `INDEX_LEAVES_OUT[table]` is set, which is what archives an
    evaluation (migration 0014): it holds the live list, none of the archived one, whose text is then
    tested row by row. A table that leaves nothing out has no archived list.
    """
    return table in SEARCHABLE and not archived


def _fts_phrase(needle: str) -> str:
    return '"' + needle.replace('"', '""') + '"'  # one FTS5 string: no operators inside


def _index_answers(dialect: str, needle: str) -> bool:
    """Whether SQLite's FTS5 trigram index can answer this normalised query (3+ chars, tokenizer present)."""
    return dialect == "sqlite" and len(needle) >= MIN_TRIGRAM_CHARS and sqlite_trigram_available()


class TextMatch(ColumnElement[bool]):
    """`table`'s normalised search text contains `query`; compiled per database (see module doc)."""

    type = Boolean()
    _is_implicitly_boolean = True  # a condition itself: no "= 1" appended on SQLite
    inherit_cache = False  # the SQL text depends on the query's length: never reuse a compiled form

    def __init__(self, table: Table, query: str, *, scan: bool = False, rows: bool = False) -> None:
        if table.name not in SEARCHABLE:
            raise ValueError(f"{table.name!r} has no search text; searchable: {', '.join(SEARCHABLE)}")
        self.table = table
        self.needle = normalize_search_text(query)
        self.scan = scan or rows
        self.rows = rows

    def like(self) -> ColumnElement[bool]:
        """The scan form: LIKE over the stored normalised column."""
        column = self.table.c[SEARCH_COLUMN]
        return column.like(like_pattern(self.needle), escape=LIKE_ESCAPE)


def text_match(table: Table, query: str, *, scan: bool = False, rows: bool = False) -> ColumnElement[bool]:
    """The WHERE condition for "`table`'s text contains `query`" under the one normalisation rule.

    `scan=True` asks for the row-by-row form (LIKE on the stored text) on every database: for a walk of
    an ordered index that stops after a page, when the query is common (module doc).
    `rows=True` is for rows the other conditions already keep to a few (a small range of an index):
    each one's text is tested and no index may serve the test. On PostgreSQL that is `strpos` of the
    normalised query (literal, like the escaped LIKE), since for a LIKE its planner intersects the
    range with every trigram match of a common query (20,000 of 100k evaluations: 25-45 ms where
    the range's own ~1,000 rows take 2).
    """
    match = TextMatch(table, query, scan=scan, rows=rows)
    return true() if not match.needle else match


def text_bytes(text: ColumnElement[Any]) -> ColumnElement[int]:
    """A stored search text's length in bytes: `TEXT_BYTES_INDEX`'s expression (lib.models) and the
    one `short_text` bounds, so that PostgreSQL matches the query's expression to the index's."""
    return func.octet_length(text)


def short_text(text: ColumnElement[Any], *, longer: bool = False) -> ColumnElement[bool]:
    """The stored search text `text` is at most `SHORT_TEXT_BYTES` long (or, `longer`, above it):
    `LIST_SHORT_TEXT_INDEX`'s predicate (lib.models declares the index with it) and the condition
    a query states so that PostgreSQL proves it may read that partial index (the bound a literal:
    a bound parameter would not prove it)."""
    size = text_bytes(text)
    bound = literal_column(str(SHORT_TEXT_BYTES))
    return size > bound if longer else size <= bound


def _index_rows(table: Table, needle: str) -> Any:
    fts_name = search_table_name(table.name)
    fts = table_clause(fts_name, column("rowid"))
    phrase = bindparam(None, _fts_phrase(needle), type_=String(), unique=True)
    return fts, literal_column(fts_name).op("MATCH")(phrase)


def count_index_matches(
    *, session: Session, table: Table, query: str, limit: int, for_plan: bool = False
) -> int | None:
    """How many indexed rows (for evaluations: live ones) contain `query`, counting at most `limit`
    (cheap: the index hands out rowids one by one). None where no index answers (PostgreSQL, a short
    query, no FTS5).

    `for_plan=True` may answer from an earlier count in this session (the page's match count has
    just asked the same): only for choosing a plan, where a stale answer costs time, never rows.
    """
    needle = normalize_search_text(query)
    if not needle or not _index_answers(session.get_bind().dialect.name, needle):
        return None
    seen: dict[tuple[str, str], tuple[int, int]] = session.info.setdefault(_SEEN_KEY, {})
    if for_plan and (table.name, needle) in seen:
        found, asked = seen[(table.name, needle)]
        if found < asked or asked >= limit:  # exact, or already at least `limit`
            return min(found, limit)
    fts, match = _index_rows(table, needle)
    rows = select(fts.c.rowid).where(match).limit(limit).subquery()
    found = int(session.execute(select(func.count()).select_from(rows)).scalar_one())
    seen[(table.name, needle)] = (found, limit)
    return found


def index_matched_rows(*, session: Session, table: Table, query: str) -> FromClause | None:
    """`table`'s indexed rows (for evaluations: live ones) that contain `query`, as a FROM that starts
    from the index, so its cost follows the matches (for a capped count, or a sort of a rare query's rows).
    None where no index answers (PostgreSQL, a short query, no FTS5): use `text_match` there."""
    needle = normalize_search_text(query)
    if not needle or not _index_answers(session.get_bind().dialect.name, needle):
        return None
    fts, match = _index_rows(table, needle)
    return _IndexFirst(fts, table, (literal_column(f"{table.name}.rowid") == fts.c.rowid) & match)


class _IndexFirst(Join):
    """An inner join that SQLite runs with the search index as the outer loop (`CROSS JOIN`, SQLite's
    way to fix the join order). With a plain JOIN its planner may walk the list's ordered index instead,
    because that gives the page's order without a sort, and probe the index with MATCH per row: a rare
    query over 100k evaluations took 15 s that way (0.7 ms index first)."""

    inherit_cache = True


@compiles(_IndexFirst, "sqlite")
def _compile_index_first(element: _IndexFirst, compiler: SQLCompiler, **kw: Any) -> str:
    # The left side is the FTS table itself, so the first " JOIN " is this join's own keyword.
    return compiler.visit_join(element, **kw).replace(" JOIN ", " CROSS JOIN ", 1)


@compiles(TextMatch)
def _compile_like(element: TextMatch, compiler: SQLCompiler, **kw: Any) -> str:
    # PostgreSQL: the pg_trgm GIN index serves this LIKE directly, or the walk of the live search index.
    if element.rows and compiler.dialect.name == "postgresql":
        column_sql = compiler.process(element.table.c[SEARCH_COLUMN], **kw)
        needle = compiler.process(bindparam(None, element.needle, type_=String(), unique=True), **kw)
        return f"strpos({column_sql}, {needle}) > 0"
    return compiler.process(element.like(), **kw)


@compiles(TextMatch, "sqlite")
def _compile_sqlite(element: TextMatch, compiler: SQLCompiler, **kw: Any) -> str:
    if element.scan or not _index_answers("sqlite", element.needle):
        return compiler.process(element.like(), **kw)
    quote = compiler.preparer.quote
    fts = quote(search_table_name(element.table.name))
    param = compiler.process(bindparam(None, _fts_phrase(element.needle), type_=String(), unique=True), **kw)
    table = quote(element.table.name)
    matches = f"SELECT rowid FROM {fts} WHERE {fts} MATCH {param}"
    left_out = INDEX_LEAVES_OUT.get(element.table.name)
    if left_out:  # rows the index does not hold: their stored text, one by one (an index range of them)
        like = compiler.process(element.like(), **kw)
        matches += (
            f" UNION ALL SELECT rowid FROM {table} WHERE {table}.{quote(left_out)} IS NOT NULL AND {like}"
        )
    return f"{table}.rowid IN ({matches})"


@contextmanager
def deferred_search_index(conn: Connection, tables: Sequence[str]) -> Iterator[None]:
    """Rows inserted inside the block are indexed for search once at its end (SQLite), not one by one.

    The insert trigger indexes each row alone; FTS5's 'rebuild' indexes the whole table in one
    pass, about a third of the CPU at 100k rows, then the rows the index leaves out
    (`INDEX_LEAVES_OUT`: archived evaluations) are taken out again, as migration 0014 does. It reads
    every row of the table, so it is for loads that are most of it (a benchmark build). Same
    transaction as the caller's rows. PostgreSQL's trigram GIN index is an ordinary index
    (`lib.bulk.deferred_indexes` defers those).
    """
    if conn.dialect.name != "sqlite":
        yield
        return
    triggers = [
        (table, name, sql)
        for table in tables
        for name, sql in conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name = ?",
            (f"{search_table_name(table)}_ai",),
        )
    ]
    for _table, name, _sql in triggers:
        conn.exec_driver_sql(f'DROP TRIGGER "{name}"')
    yield
    for table, _name, sql in triggers:
        fts = search_table_name(table)
        conn.exec_driver_sql(f'INSERT INTO "{fts}"("{fts}") VALUES (\'rebuild\')')
        left_out = INDEX_LEAVES_OUT.get(table)
        if left_out:
            conn.exec_driver_sql(
                f'INSERT INTO "{fts}"("{fts}", rowid, search_text) SELECT \'delete\', rowid, search_text '
                f'FROM "{table}" WHERE "{left_out}" IS NOT NULL'
            )
        conn.exec_driver_sql(sql)
