"""Browser sessions (issue 24.3): one row per sign-in, so sign-out, an admin or a role removal can end
it and OVERRULE_SESSION_HOURS can bound it (Streamlit's identity cookie alone lasts 30 days).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel  # noqa: F401  (sqlmodel's AutoString and UTCDateTime)
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "browser_sessions",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("identity", sqlmodel.sql.sqltypes.AutoString(length=320), nullable=False),
        sa.Column("started_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("ended_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("ended_by", sqlmodel.sql.sqltypes.AutoString(length=320), nullable=True),
        sa.Column("end_reason", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_browser_sessions_identity", "browser_sessions", ["identity"])
    op.create_index("ix_browser_sessions_started_at", "browser_sessions", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_browser_sessions_started_at", table_name="browser_sessions")
    op.drop_index("ix_browser_sessions_identity", table_name="browser_sessions")
    op.drop_table("browser_sessions")
