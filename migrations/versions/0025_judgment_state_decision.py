"""The reviewer's decision in `ix_judgment_snapshot_state` (issue 27): the Evaluations CSV reads it.

The wide export reads each evaluation's reviewed decisions (metric and `user_decision`, latest review
first) by walking this index per evaluation. Without the decision in it, every reviewed judgment
cost a lookup of its table row (about half the scanner export's read of decisions at 100k). The
decision is at most 64 characters, so the index stays small enough for PostgreSQL's entry limit.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_OLD = ["snapshot_id", "reviewed_at", "was_corrected", "metric"]


def upgrade() -> None:
    op.drop_index("ix_judgment_snapshot_state", table_name="judgments")
    op.create_index("ix_judgment_snapshot_state", "judgments", [*_OLD, "user_decision"])


def downgrade() -> None:
    op.drop_index("ix_judgment_snapshot_state", table_name="judgments")
    op.create_index("ix_judgment_snapshot_state", "judgments", _OLD)
