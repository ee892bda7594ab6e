"""SQLite's evaluation search index holds live evaluations only (issue 19).

A capped count of a live list's text matches ("10,000+") then reads the FTS5 index alone: every
index match is a live row, so the first cap + 1 matches settle the count without reading a row.
With archived rows in the index it had to read cap + every archived row (twice the work at 1M) or
look each match's row up. Archived evaluations are searched row by row (`lib.search`, the "scan"
form), over the archived rows only.

The triggers of 0008 on `evaluation_snapshots` are replaced by ones that index a row while its
`deleted_at` is NULL: archive removes it, restore puts it back. Rows archived before this migration
leave the index here. `session_notes` keeps 0008's triggers (notes are not archived).

PostgreSQL: nothing changes. Its `pg_trgm` GIN index serves rare queries; for a common one the
planner walks the table (or `ix_snapshot_live_created`) and stops at cap + 1. An index holding
`search_text` itself (an earlier draft of this migration: `(deleted_at, created_at, id) INCLUDE
(search_text)`) cannot be used: a btree entry is limited to 2,704 bytes, so a question of ~2,700+
bytes could not be stored (nor this migration run over one).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLE = "evaluation_snapshots"
FTS = f"{TABLE}_search"
_ADD = f"INSERT INTO {FTS}(rowid, search_text)"
_REMOVE = f"INSERT INTO {FTS}({FTS}, rowid, search_text)"


def _has_index() -> bool:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return False
    found = conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (FTS,))
    return found.first() is not None  # none when this Python's SQLite had no trigram tokenizer (0008)


def _drop_triggers() -> None:
    for suffix in ("ai", "ad", "au"):
        op.execute(f"DROP TRIGGER IF EXISTS {FTS}_{suffix}")


def upgrade() -> None:
    if not _has_index():
        return
    _drop_triggers()
    # An external-content FTS5 'delete' must name a row the index holds, hence every WHERE below.
    op.execute(
        f"CREATE TRIGGER {FTS}_ai AFTER INSERT ON {TABLE} WHEN new.deleted_at IS NULL BEGIN "
        f"{_ADD} VALUES (new.rowid, new.search_text); END"
    )
    op.execute(
        f"CREATE TRIGGER {FTS}_ad AFTER DELETE ON {TABLE} WHEN old.deleted_at IS NULL BEGIN "
        f"{_REMOVE} VALUES ('delete', old.rowid, old.search_text); END"
    )
    op.execute(
        f"CREATE TRIGGER {FTS}_au AFTER UPDATE OF search_text, deleted_at ON {TABLE} BEGIN "
        f"{_REMOVE} SELECT 'delete', old.rowid, old.search_text WHERE old.deleted_at IS NULL; "
        f"{_ADD} SELECT new.rowid, new.search_text WHERE new.deleted_at IS NULL; END"
    )
    op.execute(f"{_REMOVE} SELECT 'delete', rowid, search_text FROM {TABLE} WHERE deleted_at IS NOT NULL")


def downgrade() -> None:
    if not _has_index():
        return
    _drop_triggers()
    op.execute(
        f"CREATE TRIGGER {FTS}_ai AFTER INSERT ON {TABLE} BEGIN {_ADD} VALUES (new.rowid, new.search_text); END"
    )
    op.execute(
        f"CREATE TRIGGER {FTS}_ad AFTER DELETE ON {TABLE} BEGIN "
        f"{_REMOVE} VALUES ('delete', old.rowid, old.search_text); END"
    )
    op.execute(
        f"CREATE TRIGGER {FTS}_au AFTER UPDATE OF search_text ON {TABLE} BEGIN "
        f"{_REMOVE} VALUES ('delete', old.rowid, old.search_text); {_ADD} VALUES (new.rowid, new.search_text); END"
    )
    op.execute(f"{_ADD} SELECT rowid, search_text FROM {TABLE} WHERE deleted_at IS NOT NULL")
