"""Each evaluation's reviewer decisions stored on its row (issue 27): the wide CSV export reads them.

The export read every evaluation's reviewed decisions with a correlated subquery (a seek into
`ix_judgment_snapshot_state`, a sort and a JSON aggregate per row): about a third of the CPU of the
1M export. `evaluation_snapshots.reviewer_decisions` holds that JSON object (metric: decision,
latest review first; NULL before any reviewed decision), kept on write by lib.counters like the
per-evaluation counters, and backfilled here by its registered rebuild (the one definition,
`lib.counters.reviewer_decisions_sql`), which reads every evaluation's reviewed judgments.

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlmodel import Session

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("evaluation_snapshots", sa.Column("reviewer_decisions", sa.Text(), nullable=True))
    from lib import counters  # this revision's column only, not every registered rebuild

    counters.rebuild_reviewer_decisions(Session(bind=op.get_bind()))


def downgrade() -> None:
    op.drop_column("evaluation_snapshots", "reviewer_decisions")
