"""Agreement counts summed over weeks (issue 19 item 2): Analytics without a date filter reads these.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agreement_totals",
        sa.Column("product", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("language", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("metric", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("user_score", sa.Float(), nullable=False),
        sa.Column("judge_score", sa.Float(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("product", "language", "metric", "user_score", "judge_score"),
    )
    # Backfilled from the weekly counts 0009 filled: the same pairs, summed over weeks.
    op.execute(
        "INSERT INTO agreement_totals (product, language, metric, user_score, judge_score, n) "
        "SELECT product, language, metric, user_score, judge_score, sum(n) FROM agreement_counts "
        "WHERE n > 0 GROUP BY product, language, metric, user_score, judge_score"
    )


def downgrade() -> None:
    op.drop_table("agreement_totals")
