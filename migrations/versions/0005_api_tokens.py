"""API tokens for the pipeline API (issue 13): name, role, sha256 of the secret, who/when, revocation.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("role", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("secret_hash", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("created_by", sqlmodel.sql.sqltypes.AutoString(length=320), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("revoked_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"], unique=True)
    op.create_index("ix_api_tokens_secret_hash", "api_tokens", ["secret_hash"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_api_tokens_secret_hash", table_name="api_tokens")
    op.drop_index("ix_api_tokens_name", table_name="api_tokens")
    op.drop_table("api_tokens")
