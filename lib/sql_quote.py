"""Names and values written into SQL text, quoted: DuckDB's queries (lib.duck, lib.export) and the
scores SQL (lib.metrics) build theirs from strings. Its own module, below both, so lib.metrics can
quote without importing lib.duck, which imports lib.db and, through the counters, lib.metrics back."""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """A DuckDB identifier, quoted so any name is safe in SQL."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """A DuckDB string literal (paths, connection strings, JSON pointers)."""
    return "'" + value.replace("'", "''") + "'"
