"""judgment_events: (reviewer, id) index, so Undo finds a reviewer's latest decisions without a scan

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_judgment_event_reviewer", "judgment_events", ["reviewer", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_judgment_event_reviewer", table_name="judgment_events")
