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
  phrase matches exactly the rows that contain the query as a substring.
- PostgreSQL: a `pg_trgm` GIN index on `search_text`; the condition is `search_text LIKE '%query%'`,
  which the planner answers from the index.
- A query of fewer than three characters has no trigram: it is a LIKE over the normalised column
  (a scan, but of a short query, which matches many rows and so finds a page quickly).
- A Python whose SQLite lacks FTS5 or the trigram tokenizer (before 3.34) gets no index from the
  migration and the LIKE everywhere (`sqlite_trigram_available`), correct but scanning.
"""

from __future__ import annotations

import sqlite3
import unicodedata
from functools import cache
from typing import Any

from sqlalchemy import Boolean, String, Table, bindparam, true
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler

SEARCH_COLUMN = "search_text"
# Each searchable table and the column its search text is the normalised copy of.
SEARCHABLE: dict[str, str] = {"evaluation_snapshots": "question", "session_notes": "content"}
MIN_TRIGRAM_CHARS = 3
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


def is_search_index_object(name: str | None) -> bool:
    """Whether a schema object is part of the search index (FTS5 tables and their shadow tables, the
    trigram GIN indexes): built by migration, not declared in lib.models, so schema comparison skips it."""
    if not name:
        return False
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


class TextMatch(ColumnElement[bool]):
    """`table`'s normalised search text contains `query`; compiled per database (see module doc)."""

    type = Boolean()
    _is_implicitly_boolean = True  # a condition itself: no "= 1" appended on SQLite
    inherit_cache = False  # the SQL text depends on the query's length: never reuse a compiled form

    def __init__(self, table: Table, query: str) -> None:
        if table.name not in SEARCHABLE:
            raise ValueError(f"{table.name!r} has no search text; searchable: {', '.join(SEARCHABLE)}")
        self.table = table
        self.needle = normalize_search_text(query)

    def like(self) -> ColumnElement[bool]:
        """The scan form: LIKE over the stored normalised column."""
        column = self.table.c[SEARCH_COLUMN]
        return column.like(like_pattern(self.needle), escape=LIKE_ESCAPE)


def text_match(table: Table, query: str) -> ColumnElement[bool]:
    """The WHERE condition for "`table`'s text contains `query`" under the one normalisation rule."""
    match = TextMatch(table, query)
    return true() if not match.needle else match


@compiles(TextMatch)
def _compile_like(element: TextMatch, compiler: SQLCompiler, **kw: Any) -> str:
    # PostgreSQL: the pg_trgm GIN index serves this LIKE directly.
    return compiler.process(element.like(), **kw)


@compiles(TextMatch, "sqlite")
def _compile_sqlite(element: TextMatch, compiler: SQLCompiler, **kw: Any) -> str:
    if len(element.needle) < MIN_TRIGRAM_CHARS or not sqlite_trigram_available():
        return compiler.process(element.like(), **kw)
    quote = compiler.preparer.quote
    fts = quote(search_table_name(element.table.name))
    phrase = '"' + element.needle.replace('"', '""') + '"'  # one FTS5 string: no operators inside
    param = compiler.process(bindparam(None, phrase, type_=String(), unique=True), **kw)
    return f"{quote(element.table.name)}.rowid IN (SELECT rowid FROM {fts} WHERE {fts} MATCH {param})"
