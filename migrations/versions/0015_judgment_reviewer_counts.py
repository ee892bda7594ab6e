"""Judgment counters per reviewer (issue 25 point 16): the Corrections page's statistics and list
count under its Reviewer filter read `judgment_reviewer_counts` (reviewer × product × metric × day),
kept on write by lib.counters like the other judgment counters, instead of reading a reviewer's
judgments.

Backfilled here by lib.counters' own rebuild of this table (the one definition of its counts).

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlmodel import Session

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_JUDGMENT_VALUES = [
    "judgments", "reviewed", "corrected", "opinion_validated", "opinion_improved", "opinion_questioned",
]  # fmt: skip


def _string(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table(
        "judgment_reviewer_counts",
        sa.Column("reviewer", _string(200), nullable=False),
        sa.Column("product", _string(200), nullable=False),
        sa.Column("metric", _string(64), nullable=False),
        sa.Column("day", _string(10), nullable=False),
        *[sa.Column(name, sa.Integer(), nullable=False) for name in _JUDGMENT_VALUES],
        sa.PrimaryKeyConstraint("reviewer", "product", "metric", "day"),
    )
    from lib import counters  # this revision's table only, not every registered rebuild

    counters.rebuild_reviewer_counts(Session(bind=op.get_bind()))


def downgrade() -> None:
    op.drop_table("judgment_reviewer_counts")
