"""A covering index for Analytics' weekly trend over agreement_counts (issue 19 item 2).

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_agreement_count_week",
        "agreement_counts",
        ["product", "week", "metric", "user_score", "judge_score", "n"],
    )


def downgrade() -> None:
    op.drop_index("ix_agreement_count_week", table_name="agreement_counts")
