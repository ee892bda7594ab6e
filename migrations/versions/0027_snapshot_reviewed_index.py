"""The Evaluations list's fully reviewed evaluations as an index of their own (issue 27).

"All metrics reviewed" compares two counters (`judgments_reviewed = judgments_total`), so no index
held it as a range: its count with a common text or dates walked the whole list index testing each
entry, to prove fewer than 1,001 matches (gen.py's fully reviewed evaluations are 0.4% of them).
`ix_snapshot_live_reviewed` is partial: the live, fully reviewed evaluations only, newest first, with
the list's filter columns (and on SQLite the normalised question, as `ix_snapshot_live_text`), so
that list is the index's whole range. A review that completes an evaluation adds its entry.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_NAME = "ix_snapshot_live_reviewed"
# lib.models.LIST_FILTER_COLUMNS and REVIEWED_WHERE as of this revision.
_FILTER_COLUMNS = [
    "product", "language", "model_name", "category", "weighted_gap", "max_metric_gap", "evidence_count",
    "evidence_unlocated", "evidence_unverified", "judgments_total", "judgments_reviewed",
    "judgments_corrected", "judged_metrics",
]  # fmt: skip
_REVIEWED = sa.text("deleted_at IS NULL AND judgments_total > 0 AND judgments_reviewed = judgments_total")


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    columns = ["deleted_at", "created_at", "id", *_FILTER_COLUMNS, *(["search_text"] if sqlite else [])]
    op.create_index(
        _NAME, "evaluation_snapshots", columns, sqlite_where=_REVIEWED, postgresql_where=_REVIEWED
    )
    if sqlite:  # the new index's statistics (sampled, as lib.db does)
        op.execute("PRAGMA analysis_limit=400")
        op.execute(f"ANALYZE {_NAME}")


def downgrade() -> None:
    op.drop_index(_NAME, table_name="evaluation_snapshots")
