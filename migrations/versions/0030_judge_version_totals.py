"""Reviewed judgments per judge version summed over weeks: Analytics' Judge versions tab reads these.

The tab read `judge_version_counts` (per version x product x language x metric x week x decisions)
with six whole-table GROUP BY / DISTINCT scans per render, and that table grows with every week
judged (4.7k rows at 1k evaluations, 108k at 1M): the Analytics page went 2.37x in CPU from 1k to
1M. `judge_version_totals` is the same without the week (a few thousand rows), kept by
lib.version_counts with the weekly counts on every write, as `agreement_totals` (0011) is kept
beside `agreement_counts`. Backfilled here by summing the weekly counts, which is the totals'
definition (`lib.version_counts.rebuild_totals`, the recount, sums them the same way): no
judgment is read. What still needs the week (the timeline, first and last weeks) groups the weekly
counts by (version, product, week): `ix_judge_version_count_week` covers it in that order.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    string = sqlmodel.sql.sqltypes.AutoString
    op.create_table(
        "judge_version_totals",
        sa.Column("judge_version_id", sa.Integer(), nullable=False),
        sa.Column("product", string(length=200), nullable=False),
        sa.Column("language", string(length=16), nullable=False),
        sa.Column("metric", string(length=64), nullable=False),
        sa.Column("decision", string(length=64), nullable=False),
        sa.Column("human", string(length=64), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("judge_version_id", "product", "language", "metric", "decision", "human"),
    )
    # The reads that still need the week group by (version, product, week): streamed in this order.
    op.create_index(
        "ix_judge_version_count_week",
        "judge_version_counts",
        ["judge_version_id", "product", "week", "language", "metric", "decision", "human", "n"],
    )
    # SQL as of this revision (a later change to lib's tables cannot break it).
    op.execute(
        "INSERT INTO judge_version_totals (judge_version_id, product, language, metric, decision, human, n) "
        "SELECT judge_version_id, product, language, metric, decision, human, sum(n) "
        "FROM judge_version_counts WHERE n > 0 "
        "GROUP BY judge_version_id, product, language, metric, decision, human"
    )
    # Planner statistics of the new table and index (SQLite sampled, as lib.db does).
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA analysis_limit=400")
        op.execute("ANALYZE ix_judge_version_count_week")
        op.execute("ANALYZE judge_version_totals")
    else:
        op.execute("ANALYZE judge_version_counts")
        op.execute("ANALYZE judge_version_totals")


def downgrade() -> None:
    op.drop_index("ix_judge_version_count_week", table_name="judge_version_counts")
    op.drop_table("judge_version_totals")
