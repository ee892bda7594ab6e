"""Who recorded a relevance audit (issue 13): a remote judge's token name, so its writes carry an actor.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session_audit") as batch:
        batch.add_column(sa.Column("recorded_by", sqlmodel.sql.sqltypes.AutoString(length=320), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("session_audit") as batch:
        batch.drop_column("recorded_by")
