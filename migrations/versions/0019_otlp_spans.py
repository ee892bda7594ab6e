"""GenAI spans and evaluation events received over OTLP until they meet (issue 29.1, lib.otlp).

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel  # noqa: F401  (sqlmodel's AutoString and UTCDateTime)
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "otlp_spans",
        sa.Column("key", sqlmodel.sql.sqltypes.AutoString(length=300), nullable=False),
        sa.Column("response_id", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=True),
        sa.Column("snapshot_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("span_json", sa.JSON(), nullable=True),
        sa.Column("pending_json", sa.JSON(), nullable=False),
        sa.Column("received_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    with op.batch_alter_table("otlp_spans") as batch:
        batch.create_index("ix_otlp_spans_response_id", ["response_id"], unique=False)
        batch.create_index("ix_otlp_spans_snapshot_id", ["snapshot_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("otlp_spans") as batch:
        batch.drop_index("ix_otlp_spans_snapshot_id")
        batch.drop_index("ix_otlp_spans_response_id")
    op.drop_table("otlp_spans")
