"""Counters maintained on write (issue 19): per-product, per-day and per-language judgment counts,
and each evaluation's review counts and judged metrics inside the Evaluations list index.

Backfilled here by lib.counters' own rebuilds (the one definition of every counter), so an
upgraded database reads the same figures as before, without a separate `python -m lib recount`.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlmodel import Session

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_LIST_INDEX = [
    "deleted_at", "created_at", "id", "product", "language", "model_name", "category", "weighted_gap",
    "max_metric_gap", "evidence_count", "evidence_unlocated", "evidence_unverified",
]  # fmt: skip
_COUNTS = ["judgments_total", "judgments_reviewed", "judgments_corrected", "judged_metrics"]
_JUDGMENT_VALUES = [
    "judgments", "reviewed", "corrected", "opinion_validated", "opinion_improved", "opinion_questioned",
]  # fmt: skip


def _string(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def _values(names: list[str]) -> list[sa.Column]:
    return [sa.Column(name, sa.Integer(), nullable=False) for name in names]


def upgrade() -> None:
    for name in _COUNTS[:3]:
        op.add_column(
            "evaluation_snapshots", sa.Column(name, sa.Integer(), nullable=False, server_default="0")
        )
    op.add_column(
        "evaluation_snapshots", sa.Column("judged_metrics", _string(1000), nullable=False, server_default="")
    )
    op.drop_index("ix_snapshot_live_created", table_name="evaluation_snapshots")
    op.create_index("ix_snapshot_live_created", "evaluation_snapshots", [*_LIST_INDEX, *_COUNTS])
    op.create_table(
        "product_counts",
        sa.Column("product", _string(200), nullable=False),
        *_values(
            [
                "evaluations",
                "archived",
                "evidence_total",
                "evidence_highlighted",
                "evidence_unlocated",
                "evidence_unverified",
            ]
        ),  # fmt: skip
        sa.PrimaryKeyConstraint("product"),
    )
    op.create_table(
        "judgment_day_counts",
        sa.Column("product", _string(200), nullable=False),
        sa.Column("metric", _string(64), nullable=False),
        sa.Column("day", _string(10), nullable=False),
        *_values(_JUDGMENT_VALUES),
        sa.PrimaryKeyConstraint("product", "metric", "day"),
    )
    op.create_table(
        "judgment_language_counts",
        sa.Column("product", _string(200), nullable=False),
        sa.Column("metric", _string(64), nullable=False),
        sa.Column("language", _string(16), nullable=False),
        *_values(_JUDGMENT_VALUES),
        sa.PrimaryKeyConstraint("product", "metric", "language"),
    )
    from lib import counters  # the rebuilds of this revision's tables only, not every registered one

    session = Session(bind=op.get_bind())
    counters.rebuild_product_counts(session)
    counters.rebuild_judgment_counts(session)
    counters.rebuild_evaluation_review_counts(session)


def downgrade() -> None:
    op.drop_table("judgment_language_counts")
    op.drop_table("judgment_day_counts")
    op.drop_table("product_counts")
    op.drop_index("ix_snapshot_live_created", table_name="evaluation_snapshots")
    op.create_index("ix_snapshot_live_created", "evaluation_snapshots", _LIST_INDEX)
    for name in reversed(_COUNTS):
        op.drop_column("evaluation_snapshots", name)
