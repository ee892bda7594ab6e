"""PostgreSQL: the live list's order with the normalised question, for a deep page of a common text (issue 27).

Page 400 of a text in a fifth of the questions puts ~10,000 matches in list order. PostgreSQL read
them from the table: the trigram index's ~20,000 matches at 100k evaluations are ~13,600 pages of a
327 MB table (the answers make rows wide), then a sort; a walk of the list index tested each entry's
row (~42,000 buffers). 70-85 ms a render where 1k took 19. `search_text` is the normalised question
only, short, so `ix_snapshot_live_short_text` is the list's newest-first order (`deleted_at,
created_at, id`, as the page orders the live list) with `search_text` as an INCLUDE column: 13 MB at
100k, walked and tested on its entries without reading a row (an Index Only Scan).

A btree entry is at most 2,704 bytes and a question may be longer (migration 0014 gave up an index
like this for that reason), so the index holds the live rows whose text is at most 2,000 bytes
(`lib.search.SHORT_TEXT_BYTES`). `ix_snapshot_search_text_bytes` is the text's length in bytes:
`lib.inspector` reads its (normally empty) range above 2,000 to tell whether the short rows are the
whole live list (then it states the index's predicate and PostgreSQL may walk it) or not (then the
long live rows, found through this index, are read beside the walk and merged in list order: since
45645f3, before which one long question turned the walk off); and ANALYZE keeps statistics of that
expression. Without them the
planner takes the predicate to keep a third of the rows: on a table not vacuumed since a load it
then intersected the whole short-text index with the trigram matches (170-190 ms for that page,
worse than before; with them it keeps its earlier plan until the rows are all-visible). ANALYZE
runs here so that the statistics exist at once.

SQLite: nothing (its `ix_snapshot_live_text` holds the question already, and has no size limit).

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

TABLE = "evaluation_snapshots"
# lib.search.LIST_SHORT_TEXT_INDEX, TEXT_BYTES_INDEX and SHORT_TEXT_BYTES as of this revision.
_SHORT, _BYTES = "ix_snapshot_live_short_text", "ix_snapshot_search_text_bytes"
_SHORT_WHERE = sa.text("deleted_at IS NULL AND octet_length(search_text) <= 2000")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_index(
        _SHORT,
        TABLE,
        ["deleted_at", "created_at", "id"],
        postgresql_include=["search_text"],
        postgresql_where=_SHORT_WHERE,
    )
    op.create_index(_BYTES, TABLE, [sa.text("octet_length(search_text)")])
    op.execute(f"ANALYZE {TABLE}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(_BYTES, table_name=TABLE)
    op.drop_index(_SHORT, table_name=TABLE)
