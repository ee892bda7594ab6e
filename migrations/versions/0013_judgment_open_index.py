"""The review queue's index: open judgments only, in the queue's order (issue 19, PostgreSQL).

`ix_judgment_queue (reviewed_at, product, timestamp)` only gave SQLite its order: SQLite treats
`reviewed_at IS NULL` as an equality, PostgreSQL does not, so PostgreSQL sorted every open judgment
of a product (a parallel hash join, ~0.4 s per product at 100k) to find the oldest one.
`ix_judgment_open (product, timestamp, id) WHERE reviewed_at IS NULL` is read in order by both, holds
only the open half of the judgments, and ends in `id`, the queue's tie-break.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_OPEN = sa.text("reviewed_at IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_judgment_open",
        "judgments",
        ["product", "timestamp", "id"],
        sqlite_where=_OPEN,
        postgresql_where=_OPEN,
    )
    op.drop_index("ix_judgment_queue", table_name="judgments")


def downgrade() -> None:
    op.create_index("ix_judgment_queue", "judgments", ["reviewed_at", "product", "timestamp"])
    op.drop_index("ix_judgment_open", table_name="judgments")
