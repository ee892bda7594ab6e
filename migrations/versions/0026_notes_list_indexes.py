"""The Notes list's indexes give its order and hold its filters (issue 27).

Seed 000's four indexes on `session_notes` each held one column. A filter on a type or a language
then found its notes in id order, so a page newest first sorted every match (type at 200k notes:
40k rows sorted for 25), and a second filter or the age read each entry's row. Each index now starts
with its filter, then the list's order (`timestamp`, `id`: a page is a walk that stops after it,
and an age is a range of it), then the other filter columns, so a walk or a count tests them on its
entries without reading a row. Same names: the seed's queries on one column still seek them.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_FILTERS = ("note_type", "language", "session_id")
# index name: (its leading filter column or None for the time walk)
_INDEXES = {
    "idx_type": "note_type",
    "idx_language": "language",
    "idx_session": "session_id",
    "idx_timestamp": None,
}


def _columns(lead: str | None) -> list[str]:
    return [*([lead] if lead else []), "timestamp", "id", *(c for c in _FILTERS if c != lead)]


def upgrade() -> None:
    for name, lead in _INDEXES.items():
        op.drop_index(name, table_name="session_notes")
        op.create_index(name, "session_notes", _columns(lead))
    if op.get_bind().dialect.name == "sqlite":  # the new indexes' statistics (sampled, as lib.db does)
        op.execute("PRAGMA analysis_limit=400")
        op.execute("ANALYZE session_notes")


def downgrade() -> None:
    for name, lead in _INDEXES.items():
        op.drop_index(name, table_name="session_notes")
        op.create_index(name, "session_notes", [lead or "timestamp"])
