"""Reviewer preferences (issue 26): a reviewer's remembered choices on a page (the review page's queue
and filters), so a reload, a new tab or another device starts where they were.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel  # noqa: F401  (sqlmodel's AutoString and UTCDateTime)
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reviewer_preferences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("reviewer", sqlmodel.sql.sqltypes.AutoString(length=320), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("reviewer", "name", name="uq_reviewer_preference"),
    )


def downgrade() -> None:
    op.drop_table("reviewer_preferences")
