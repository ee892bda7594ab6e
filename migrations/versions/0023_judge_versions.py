"""Judge versions (issue 28): which judge made each judgment.

`judge_versions` (one configuration of a product's judge, content-addressed), `product_judges` (a
product's current judge options), `judge_verdicts` (a version's decision that is not the judgment's
own) and `judge_version_counts` (reviewed judgments per version and decisions, kept by lib.counters);
`judge_version_id` on judgments and evaluations (NULL: unversioned). The counts are backfilled by
lib.counters' own rebuild (every existing judgment is unversioned).

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlmodel import Session

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def _string(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table(
        "judge_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("product", _string(200), nullable=False),
        sa.Column("name", _string(200), nullable=False),
        sa.Column("content_hash", _string(64), nullable=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("judge_model", _string(200), nullable=True),
        sa.Column("rubric", sa.JSON(), nullable=True),
        sa.Column("prompt_hash", _string(64), nullable=True),
        sa.Column("history_entries", sa.Integer(), nullable=True),
        sa.Column("history_ratio", sa.Float(), nullable=True),
        sa.Column("notes_limit", sa.Integer(), nullable=True),
        sa.Column("relevance", sa.Boolean(), nullable=True),
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("max_tokens_judge", sa.Integer(), nullable=True),
        sa.Column("max_tokens_mentor", sa.Integer(), nullable=True),
        sa.Column("origin", _string(16), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("previous_id", sa.Integer(), nullable=True),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("experiment_arm", _string(16), nullable=True),
        sa.Column("created_by", _string(320), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("product", "name", name="uq_judge_version_name"),
        sa.UniqueConstraint("product", "content_hash", name="uq_judge_version_hash"),
    )
    op.create_table(
        "product_judges",
        sa.Column("product", _string(200), nullable=False),
        sa.Column("judge_version_id", sa.Integer(), nullable=False),
        sa.Column("set_by", _string(320), nullable=False),
        sa.Column("set_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["judge_version_id"], ["judge_versions.id"]),
        sa.PrimaryKeyConstraint("product"),
    )
    op.create_table(
        "judge_verdicts",
        sa.Column("judgment_id", sa.Integer(), nullable=False),
        sa.Column("judge_version_id", sa.Integer(), nullable=False),
        sa.Column("decision", _string(64), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("reasoning", sa.Text(), nullable=True),
        sa.Column("judged_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("week", sa.Date(), nullable=False),
        sa.ForeignKeyConstraint(["judgment_id"], ["judgments.id"]),
        sa.PrimaryKeyConstraint("judgment_id", "judge_version_id"),
    )
    op.create_index("ix_judge_verdict_version", "judge_verdicts", ["judge_version_id", "judgment_id"])
    op.create_table(
        "judge_version_counts",
        sa.Column("judge_version_id", sa.Integer(), nullable=False),
        sa.Column("product", _string(200), nullable=False),
        sa.Column("language", _string(16), nullable=False),
        sa.Column("metric", _string(64), nullable=False),
        sa.Column("week", sa.Date(), nullable=False),
        sa.Column("decision", _string(64), nullable=False),
        sa.Column("human", _string(64), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("judge_version_id", "product", "language", "metric", "week", "decision", "human"),
    )
    op.add_column("judgments", sa.Column("judge_version_id", sa.Integer(), nullable=True))
    op.add_column("evaluation_snapshots", sa.Column("judge_version_id", sa.Integer(), nullable=True))
    op.create_index("ix_judgment_version", "judgments", ["judge_version_id", "product"])
    # This revision's table only: not every registered rebuild, and not the recount's
    # `judge_version_counts` either, which also rebuilds the totals of 0030.
    from lib import version_counts

    version_counts.rebuild(Session(bind=op.get_bind()))


def downgrade() -> None:
    op.drop_index("ix_judgment_version", table_name="judgments")
    op.drop_column("evaluation_snapshots", "judge_version_id")
    op.drop_column("judgments", "judge_version_id")
    op.drop_table("judge_version_counts")
    op.drop_index("ix_judge_verdict_version", table_name="judge_verdicts")
    op.drop_table("judge_verdicts")
    op.drop_table("product_judges")
    op.drop_table("judge_versions")
