"""Team review queues (issue 26): queues, their items and judgments, labels, and reservations.

`review_assignments` also holds the default queue's reservations (`queue_id` NULL), so two
reviewers on the plain review page are never handed the same evaluation. `judgment_events` gains
`queue_id`: the changes a queue made (a resolution, an adjudication, their undo).

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_STR = sqlmodel.sql.sqltypes.AutoString
_TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    op.add_column("judgment_events", sa.Column("queue_id", sa.Integer(), nullable=True))
    op.create_table(
        "review_queues",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", _STR(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("product", _STR(length=200), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("language", _STR(length=16), nullable=True),
        sa.Column("since", _TIME(), nullable=True),
        sa.Column("until", _TIME(), nullable=True),
        sa.Column("review_state", _STR(length=16), nullable=True),
        sa.Column("item_order", _STR(length=16), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("overlap", sa.Integer(), nullable=False),
        sa.Column("mode", _STR(length=16), nullable=False),
        sa.Column("tolerance", sa.Float(), nullable=True),
        sa.Column("reviewers", sa.JSON(), nullable=False),
        sa.Column("status", _STR(length=16), nullable=False),
        sa.Column("items", sa.Integer(), nullable=False),
        sa.Column("judgments", sa.Integer(), nullable=False),
        sa.Column("created_by", _STR(length=320), nullable=False),
        sa.Column("created_at", _TIME(), nullable=False),
        sa.Column("closed_by", _STR(length=320), nullable=True),
        sa.Column("closed_at", _TIME(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "review_queue_items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item_key", _STR(length=100), nullable=False),
        sa.Column("snapshot_id", _STR(length=64), nullable=True),
        sa.Column("claimed", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("available", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["queue_id"], ["review_queues.id"]),
        sa.ForeignKeyConstraint(["snapshot_id"], ["evaluation_snapshots.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("queue_id", "position", name="uq_queue_item_position"),
        sa.UniqueConstraint("queue_id", "item_key", name="uq_queue_item_key"),
    )
    op.create_index("ix_queue_item_available", "review_queue_items", ["queue_id", "available", "position"])
    op.create_table(
        "review_queue_judgments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue_id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("judgment_id", sa.Integer(), nullable=False),
        sa.Column("state", _STR(length=16), nullable=False),
        sa.Column("held", sa.Boolean(), nullable=False),
        sa.Column("labels", sa.Integer(), nullable=False),
        sa.Column("decision", _STR(length=64), nullable=True),
        sa.Column("decided_by", _STR(length=320), nullable=True),
        sa.Column("decided_at", _TIME(), nullable=True),
        sa.ForeignKeyConstraint(["queue_id"], ["review_queues.id"]),
        sa.ForeignKeyConstraint(["item_id"], ["review_queue_items.id"]),
        sa.ForeignKeyConstraint(["judgment_id"], ["judgments.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_queue_judgment_state", "review_queue_judgments", ["queue_id", "state"])
    op.create_index("ix_queue_judgment_item", "review_queue_judgments", ["item_id"])
    op.create_index(
        "uq_queue_judgment_held",
        "review_queue_judgments",
        ["judgment_id"],
        unique=True,
        sqlite_where=sa.text("held"),
        postgresql_where=sa.text("held"),
    )
    op.create_table(
        "review_labels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue_id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("judgment_id", sa.Integer(), nullable=False),
        sa.Column("reviewer", _STR(length=320), nullable=False),
        sa.Column("blind_decision", _STR(length=64), nullable=True),
        sa.Column("blind_reason", sa.Text(), nullable=True),
        sa.Column("blind_at", _TIME(), nullable=True),
        sa.Column("decision", _STR(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("labelled_at", _TIME(), nullable=True),
        sa.Column("withdrawn_at", _TIME(), nullable=True),
        sa.ForeignKeyConstraint(["queue_id"], ["review_queues.id"]),
        sa.ForeignKeyConstraint(["item_id"], ["review_queue_items.id"]),
        sa.ForeignKeyConstraint(["judgment_id"], ["judgments.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("queue_id", "judgment_id", "reviewer", name="uq_review_label"),
    )
    op.create_index("ix_review_label_item", "review_labels", ["item_id", "reviewer"])
    op.create_index("ix_review_label_reviewer", "review_labels", ["queue_id", "reviewer"])
    op.create_table(
        "review_assignments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue_id", sa.Integer(), nullable=True),
        sa.Column("item_id", sa.Integer(), nullable=True),
        sa.Column("item_key", _STR(length=100), nullable=False),
        sa.Column("reviewer", _STR(length=320), nullable=False),
        sa.Column("status", _STR(length=16), nullable=False),
        sa.Column("reserved_at", _TIME(), nullable=False),
        sa.Column("expires_at", _TIME(), nullable=False),
        sa.Column("finished_at", _TIME(), nullable=True),
        sa.Column("active_seconds", sa.Float(), nullable=False),
        sa.Column("revealed_at", _TIME(), nullable=True),
        sa.Column("draft", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["queue_id"], ["review_queues.id"]),
        sa.ForeignKeyConstraint(["item_id"], ["review_queue_items.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("queue_id", "item_key", "reviewer", name="uq_assignment"),
    )
    op.create_index(
        "uq_default_assignment",
        "review_assignments",
        ["item_key", "reviewer"],
        unique=True,
        sqlite_where=sa.text("queue_id IS NULL"),
        postgresql_where=sa.text("queue_id IS NULL"),
    )
    op.create_index(
        "uq_default_reservation",
        "review_assignments",
        ["item_key"],
        unique=True,
        sqlite_where=sa.text("queue_id IS NULL AND status = 'reserved'"),
        postgresql_where=sa.text("queue_id IS NULL AND status = 'reserved'"),
    )
    op.create_index("ix_assignment_status", "review_assignments", ["status", "queue_id", "expires_at"])
    op.create_index("ix_assignment_reviewer", "review_assignments", ["reviewer", "queue_id", "status"])


def downgrade() -> None:
    op.drop_table("review_assignments")
    op.drop_table("review_labels")
    op.drop_table("review_queue_judgments")
    op.drop_table("review_queue_items")
    op.drop_table("review_queues")
    op.drop_column("judgment_events", "queue_id")
