"""alignment lab (issue 16): experiments, their sampled items and per-arm calls

Revision ID: 0003_align
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel  # noqa: F401  (AutoString and UTCDateTime as in 0001)
from alembic import op

revision = "0003_align"
down_revision = "0002"
branch_labels = None
depends_on = None


def _text(length: int) -> sa.types.TypeEngine:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def _when() -> sa.types.TypeEngine:
    return sqlmodel.sql.sqltypes.UTCDateTime()


def upgrade() -> None:
    op.create_table(
        "alignment_experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", _text(200), nullable=False),
        sa.Column("product", _text(200), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("language", _text(16), nullable=True),
        sa.Column("start_date", _when(), nullable=True),
        sa.Column("end_date", _when(), nullable=True),
        sa.Column("sample_size", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("arms", sa.JSON(), nullable=False),
        sa.Column("edited_rubric", sa.JSON(), nullable=False),
        sa.Column("judge_model", _text(200), nullable=True),
        sa.Column("status", _text(16), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("created_by", _text(200), nullable=True),
        sa.Column("finished_at", _when(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_alignment_experiments_product", "alignment_experiments", ["product"])
    op.create_table(
        "alignment_items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("judgment_id", sa.Integer(), nullable=False),
        sa.Column("snapshot_id", _text(64), nullable=False),
        sa.Column("metric", _text(64), nullable=False),
        sa.Column("reviewer_score", sa.Float(), nullable=False),
        sa.Column("original_score", sa.Float(), nullable=True),
        sa.Column("as_of", _when(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["alignment_experiments.id"]),
        sa.ForeignKeyConstraint(["judgment_id"], ["judgments.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("experiment_id", "judgment_id", name="uq_alignment_item"),
    )
    op.create_index("ix_alignment_items_experiment_id", "alignment_items", ["experiment_id"])
    op.create_table(
        "alignment_calls",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("arm", _text(16), nullable=False),
        sa.Column("snapshot_id", _text(64), nullable=False),
        sa.Column("status", _text(16), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("llm_calls", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("wall_seconds", sa.Float(), nullable=False),
        sa.Column("finished_at", _when(), nullable=True),
        sa.ForeignKeyConstraint(["experiment_id"], ["alignment_experiments.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("experiment_id", "arm", "snapshot_id", name="uq_alignment_call"),
    )
    op.create_index("ix_alignment_calls_experiment_id", "alignment_calls", ["experiment_id"])


def downgrade() -> None:
    op.drop_index("ix_alignment_calls_experiment_id", table_name="alignment_calls")
    op.drop_table("alignment_calls")
    op.drop_index("ix_alignment_items_experiment_id", table_name="alignment_items")
    op.drop_table("alignment_items")
    op.drop_index("ix_alignment_experiments_product", table_name="alignment_experiments")
    op.drop_table("alignment_experiments")
