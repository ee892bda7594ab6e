"""Unicode-aware, indexed search: a normalised `search_text` column and a trigram index over it

`evaluation_snapshots.search_text` (from the question) and `session_notes.search_text` (from the
content) hold the text under `lib.search.normalize_search_text` (NFKC, Turkish I folded, case
folded), backfilled here in batches. The index under it:

- SQLite: an FTS5 table `<table>_search` with the trigram tokenizer, external content (the text is
  not stored twice), kept in step by triggers on insert, delete and update of `search_text`. Skipped
  when this Python's SQLite has no trigram tokenizer (lib.search then uses LIKE).
- PostgreSQL: `pg_trgm` (a trusted extension) and a GIN index with `gin_trgm_ops`.

A later SQLite migration that rebuilds one of these tables (batch "move and copy") drops its
triggers: it must recreate them (tests/test_search.py checks the head schema keeps them).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

BATCH = 5_000
SEARCHABLE = {"evaluation_snapshots": "question", "session_notes": "content"}


def search_table_name(table: str) -> str:
    return f"{table}_search"


def _backfill(conn: sa.Connection, table: str, source: str) -> None:
    """search_text for every existing row, a batch of primary keys at a time (keyset, not OFFSET)."""
    # The rule lives in lib.search (one rule for the backfill and every write); imported here, not at
    # the top, so `alembic heads` can read this file without lib on the path.
    from lib.search import normalize_search_text

    key = "id"
    t = sa.table(table, sa.column(key), sa.column(source), sa.column("search_text"))
    update = sa.update(t).where(t.c[key] == sa.bindparam("k")).values(search_text=sa.bindparam("v"))
    last = None
    while True:
        stmt = sa.select(t.c[key], t.c[source]).order_by(t.c[key]).limit(BATCH)
        if last is not None:
            stmt = stmt.where(t.c[key] > last)
        rows = conn.execute(stmt).all()
        if not rows:
            return
        conn.execute(update, [{"k": k, "v": normalize_search_text(text)} for k, text in rows])
        last = rows[-1][0]


def _sqlite_index(table: str) -> list[str]:
    fts = search_table_name(table)
    return [
        f"CREATE VIRTUAL TABLE {fts} USING fts5(search_text, content='{table}', content_rowid='rowid', "
        "tokenize='trigram case_sensitive 1')",
        f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN "
        f"INSERT INTO {fts}(rowid, search_text) VALUES (new.rowid, new.search_text); END",
        f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN "
        f"INSERT INTO {fts}({fts}, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); END",
        f"CREATE TRIGGER {fts}_au AFTER UPDATE OF search_text ON {table} BEGIN "
        f"INSERT INTO {fts}({fts}, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); "
        f"INSERT INTO {fts}(rowid, search_text) VALUES (new.rowid, new.search_text); END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",
    ]


def upgrade() -> None:
    from lib.search import sqlite_trigram_available

    conn = op.get_bind()
    dialect = conn.dialect.name
    for table, source in SEARCHABLE.items():
        op.add_column(table, sa.Column("search_text", sa.Text(), nullable=False, server_default=""))
        _backfill(conn, table, source)
    if dialect == "sqlite":
        if sqlite_trigram_available():
            for table in SEARCHABLE:
                for statement in _sqlite_index(table):
                    op.execute(statement)
    elif dialect == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        for table in SEARCHABLE:
            op.execute(f"CREATE INDEX ix_{table}_search_trgm ON {table} USING gin (search_text gin_trgm_ops)")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in SEARCHABLE:
        if dialect == "sqlite":
            fts = search_table_name(table)
            for suffix in ("ai", "ad", "au"):
                op.execute(f"DROP TRIGGER IF EXISTS {fts}_{suffix}")
            op.execute(f"DROP TABLE IF EXISTS {fts}")
        elif dialect == "postgresql":
            op.execute(f"DROP INDEX IF EXISTS ix_{table}_search_trgm")
        # A plain DROP COLUMN (SQLite ≥ 3.35): a batch rebuild would DROP TABLE evaluation_snapshots,
        # which fails with `PRAGMA foreign_keys=ON` (lib.db) once judgments reference its rows.
        op.drop_column(table, "search_text")
