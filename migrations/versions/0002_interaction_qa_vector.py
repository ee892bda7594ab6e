"""interactions: QA embedding as packed float32 (qa_vector) instead of a JSON list

The precedent search loads every expert-reviewed interaction's vector into one numpy matrix per
run. Packed float32 is 4 bytes a dimension and loads with one `frombuffer`; the JSON list was
~20 bytes a dimension and had to be parsed number by number. Vectors are a cache (recomputed from
the question and answer whenever missing), so the old JSON column is dropped, not converted.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("interactions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("qa_vector", sa.LargeBinary(), nullable=True))
        batch_op.drop_column("embedding")


def downgrade() -> None:
    with op.batch_alter_table("interactions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("embedding", sa.JSON(), nullable=True))
        batch_op.drop_column("qa_vector")
