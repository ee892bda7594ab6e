"""Judge version pairs (issue 28): "same items only" reads counts, not judgments.

`judge_version_pair_counts` holds, per two versions that judged the same live reviewed judgment ×
product × language × metric × (A's decision, B's decision, reviewer decision), how many such
judgments there are, kept by lib.counters and backfilled here by its own rebuild. The two version
indexes that "same items only" used to read judgments through have no reader left: every judgment
written paid for `ix_judgment_version`.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlmodel import Session

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def _string(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table(
        "judge_version_pair_counts",
        sa.Column("version_a", sa.Integer(), nullable=False),
        sa.Column("version_b", sa.Integer(), nullable=False),
        sa.Column("product", _string(200), nullable=False),
        sa.Column("language", _string(16), nullable=False),
        sa.Column("metric", _string(64), nullable=False),
        sa.Column("decision_a", _string(64), nullable=False),
        sa.Column("decision_b", _string(64), nullable=False),
        sa.Column("human", _string(64), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint(
            "version_a", "version_b", "product", "language", "metric", "decision_a", "decision_b", "human"
        ),
    )
    op.drop_index("ix_judgment_version", table_name="judgments")
    op.drop_index("ix_judge_verdict_version", table_name="judge_verdicts")
    from lib import counters  # this revision's table only, not every registered rebuild

    counters.rebuild_judge_version_pair_counts(Session(bind=op.get_bind()))


def downgrade() -> None:
    op.create_index("ix_judge_verdict_version", "judge_verdicts", ["judge_version_id", "judgment_id"])
    op.create_index("ix_judgment_version", "judgments", ["judge_version_id", "product"])
    op.drop_table("judge_version_pair_counts")
