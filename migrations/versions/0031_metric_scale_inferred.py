"""Which metric scales an import inferred from its scores: later imports widen those (review7 F2).

An import that meets a metric the product's rubric lacks, from a source that states no scale,
defines it as 0 .. the next whole number above its highest score. For an OTLP stream (a handful of
spans a request) the first request's scores froze that scale, and the same judge's later, higher
scores were refused. `metric_definitions.scale_inferred` marks a scale an import inferred: a later
import's scores widen it (never narrow it), in the import's transaction, with an audit row. A scale a
user defined (`--kind metrics`, the Admin rubric editor, the demo) or a source stated stays false
and keeps refusing scores outside it.

Backfill: rows written by an import before this revision carry its description, "Imported
evaluation 'NAME'." (NAME the display name), and a scale an import could have inferred (a whole
lower bound at most 0, a whole upper bound at least 1). The description alone is not enough: a
source's stated scale (promptfoo 0–1) has the same text, and so does a scale a lead edited on the
Admin page without rewriting the text; the shape check leaves out a lead's 1–5 or 0.5–2. A stated
0–1 marked here can only widen when a score outside 0–1 arrives for it, which such sources never send.

Revision ID: 0031
Revises: 0030
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "metric_definitions",
        sa.Column("scale_inferred", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    defs = sa.table(
        "metric_definitions",
        sa.column("id", sa.Integer()),
        sa.column("display_name", sa.String()),
        sa.column("description", sa.Text()),
        sa.column("min_value", sa.Float()),
        sa.column("max_value", sa.Float()),
        sa.column("scale_inferred", sa.Boolean()),
    )
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(defs.c.id, defs.c.display_name, defs.c.description, defs.c.min_value, defs.c.max_value).where(
            defs.c.description.like("Imported evaluation %")
        )
    ).all()
    inferred = [
        row.id
        for row in rows
        if row.description == f"Imported evaluation {row.display_name!r}."
        and float(row.min_value).is_integer()
        and row.min_value <= 0
        and float(row.max_value).is_integer()
        and row.max_value >= 1
    ]
    for start in range(0, len(inferred), 500):
        conn.execute(
            sa.update(defs).where(defs.c.id.in_(inferred[start : start + 500])).values(scale_inferred=True)
        )


def downgrade() -> None:
    op.drop_column("metric_definitions", "scale_inferred")
