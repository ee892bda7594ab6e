"""Every filter combination of the Evaluations list flat at 1M (issue 27).

- `evaluation_counts`: evaluations per combination of the values the list filters on (product,
  language, model, category, judged metrics, largest gap in halves, review and evidence state,
  archived), kept on write by lib.counters: the list counts any combination without dates or text
  exactly from these rows, and chooses its plan from them. Backfilled by lib.counters' own rebuild.
- The Corrections list by metric or by reviewer: `ix_judgment_metric_id` and `ix_judgment_reviewer_id`
  hold the value, the id (the list's order) and the evaluation (its liveness), so a deep page skips
  index entries instead of reading rows.
- SQLite: `ix_snapshot_live_text`, the list index with the normalised question, so a common text
  filter is tested on the entries of a newest-first walk instead of on rows read one by one.
- The gap-sort indexes carry the list's filter columns, as `ix_snapshot_live_created` does: a page
  sorted by a gap walks its index testing the filters on the entries, never reading a row to skip it
  (a minimum gap of 4 sorted by weighted gap read a row for each of 990k entries at 1M).

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlmodel import Session

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_FILTER_COLUMNS = [
    "product", "language", "model_name", "category", "weighted_gap", "max_metric_gap", "evidence_count",
    "evidence_unlocated", "evidence_unverified", "judgments_total", "judgments_reviewed",
    "judgments_corrected", "judged_metrics",
]  # fmt: skip
_FLAGS = [
    "review_pending", "review_reviewed", "review_corrected", "evidence_unverified", "evidence_unlocated",
    "evidence_verified", "evidence_none",
]  # fmt: skip
_REVIEWED_BY = sa.text("reviewer IS NOT NULL")
_GAP_INDEXES = {"ix_snapshot_live_weighted_gap": "weighted_gap", "ix_snapshot_live_max_gap": "max_metric_gap"}


def _string(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    keys = [
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("product", _string(200), nullable=False),
        sa.Column("language", _string(16), nullable=False),
        sa.Column("model_name", _string(200), nullable=False),
        sa.Column("category", _string(200), nullable=False),
        sa.Column("judged_metrics", _string(1000), nullable=False),
        sa.Column("gap_halves", sa.Integer(), nullable=False),
        sa.Column("has_weighted_gap", sa.Boolean(), nullable=False),
        *[sa.Column(flag, sa.Boolean(), nullable=False) for flag in _FLAGS],
    ]
    op.create_table(
        "evaluation_counts",
        *keys,
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint(*(c.name for c in keys)),
    )
    for name, gap in _GAP_INDEXES.items():
        op.drop_index(name, table_name="evaluation_snapshots")
        rest = [c for c in _FILTER_COLUMNS if c != gap]
        op.create_index(name, "evaluation_snapshots", ["deleted_at", gap, "created_at", "id", *rest])
    if op.get_bind().dialect.name == "sqlite":
        op.create_index(
            "ix_snapshot_live_text",
            "evaluation_snapshots",
            ["deleted_at", "created_at", "id", *_FILTER_COLUMNS, "search_text"],
        )
    op.create_index("ix_judgment_metric_id", "judgments", ["metric", "id", "snapshot_id"])
    op.create_index(
        "ix_judgment_reviewer_id",
        "judgments",
        ["reviewer", "id", "snapshot_id"],
        sqlite_where=_REVIEWED_BY,
        postgresql_where=_REVIEWED_BY,
    )
    from lib import counters  # this revision's table only, not every registered rebuild

    counters.rebuild_evaluation_counts(Session(bind=op.get_bind()))


def downgrade() -> None:
    op.drop_index("ix_judgment_reviewer_id", table_name="judgments")
    op.drop_index("ix_judgment_metric_id", table_name="judgments")
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index("ix_snapshot_live_text", table_name="evaluation_snapshots")
    for name, gap in _GAP_INDEXES.items():
        op.drop_index(name, table_name="evaluation_snapshots")
        op.create_index(name, "evaluation_snapshots", ["deleted_at", gap, "created_at", "id"])
    op.drop_table("evaluation_counts")
