"""Narrow scores table and agreement counts for Analytics (issue 19 item 2), backfilled from snapshots.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_scores",
        sa.Column("snapshot_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("metric", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("product", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("language", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("week", sa.Date(), nullable=False),
        sa.Column("user_score", sa.Float(), nullable=False),
        sa.Column("judge_score", sa.Float(), nullable=False),
        sa.Column("live", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["snapshot_id"], ["evaluation_snapshots.id"]),
        sa.PrimaryKeyConstraint("snapshot_id", "metric"),
    )
    op.create_index("ix_metric_score_day", "metric_scores", ["day", "product", "language"])
    op.create_table(
        "agreement_counts",
        sa.Column("product", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("language", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("metric", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("week", sa.Date(), nullable=False),
        sa.Column("user_score", sa.Float(), nullable=False),
        sa.Column("judge_score", sa.Float(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("product", "language", "metric", "week", "user_score", "judge_score"),
    )
    # The backfill is the same rebuild `python -m lib recount` runs: one rule for what a pair is.
    from lib.scores import rebuild_scores_on

    rebuild_scores_on(op.get_bind(), count_tables=["agreement_counts"])  # agreement_totals comes in 0011


def downgrade() -> None:
    op.drop_table("agreement_counts")
    op.drop_index("ix_metric_score_day", table_name="metric_scores")
    op.drop_table("metric_scores")
