"""A judgment's label, structured: the stored-label lookup reads it, not the reasoning's first word;
and no weekly-count index on PostgreSQL.

A Phoenix or Langfuse result that sends a label and no number gets the score the product's stored
judgments of that metric already give the label (review7 F9, `lib.importer._stored_label_scores`).
That lookup matched the start of `judgments.reasoning` ("label" or "label: explanation", as
`lib.source_records.verdict_reason` writes it): a scan of the metric's judgments (0.04-0.11 s a
label at 100k evaluations), and any free text starting "factual: " counted as the label "factual".
`judgments.label` holds the label its source sent (stripped, lower case: `label_key`), written by
every import of another tool's results (promptfoo pass/fail, Langfuse, Phoenix, OTLP); the partial
index `ix_judgment_label` (product, metric, label, decision) WHERE label IS NOT NULL makes the
lookup one index read and costs the judgments without a label nothing on write.

Backfill, a best effort: before this revision no column said whether a reasoning began with a label,
and the text cannot say it for sure ("label: explanation" and an explanation that starts
"Note: ..." look alike; a label alone and a one-word explanation are the same text). So a judgment
is labelled here only when both hold: its metric was defined by an import of another tool's results
(the definition's description is "Imported evaluation 'NAME'.", as `lib.source_records` writes it;
for those metrics the reasoning was written by `verdict_reason`), and its reasoning is one word
(letters, digits, "_" or "-", at most 64 characters), alone or followed by ": ". Judgments of a
rubric's own metrics, or with a label of several words, stay unlabelled: a later label-only result
for them falls back to the file's own scored verdicts and the known labels' numbers, as for a
product with no stored judgments.

Known blind spot, left as it is (review12 F2): the reasoning of a judgment the LLM judge re-judged
(or first judged, `lib.corrections.add_judgment`: a judgment_events row "judged", "rejudged" or
"rejudge_conflict") is the judge's rationale, not `verdict_reason`'s; one that reads "Word: ..." or
is one word is labelled here with the judge's decision, and the lookup then gives that label the
judge's number. Narrowing the rule (skip judgments with such an event) would change what this
landed revision did to databases already past it, so it is not done: it needs the LLM judge run on
an import-defined metric (a Phoenix or Langfuse eval) before this upgrade and a rationale of that
shape, and its cost is a later label-only file of that metric refused as ambiguous or scored by its
known labels (nothing stored is changed). Such labels can be cleared with `UPDATE judgments SET
label = NULL WHERE label IS NOT NULL AND id IN (SELECT judgment_id FROM judgment_events WHERE action
IN ('judged', 'rejudged', 'rejudge_conflict'))`: add_judgment never writes a label, so a label there
never names its judgment's decision. (Since review12 a re-judge clears the label it replaces.)

Also (review8 F6): `ix_judge_version_count_week` (0030) is dropped on PostgreSQL. It holds `n`, which
every review changes, so no update of the weekly counts was HOT there (97% -> 0%); and PostgreSQL
reads those rows by a sequential scan and a hashed aggregate whatever the index (measured at 100k:
the Analytics judge-version reads cost the same server CPU with it, without `n`, or with none).
SQLite keeps it: it streams the grouped read in index order instead of sorting into a temporary
b-tree (41 -> 7 ms at 100k, docs/benchmarks.md), and SQLite has no HOT to lose.

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

import re

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

# A reasoning that is a label alone or a label and its explanation (`verdict_reason`), one word long.
_LABELLED = re.compile(r"([A-Za-z0-9_-]{1,64})(?:: .*)?", re.DOTALL)
_BATCH = 1000


def upgrade() -> None:
    op.add_column(
        "judgments", sa.Column("label", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True)
    )
    conn = op.get_bind()
    defs = sa.table(
        "metric_definitions",
        sa.column("product", sa.String()),
        sa.column("slug", sa.String()),
        sa.column("description", sa.Text()),
    )
    judgments = sa.table(
        "judgments",
        sa.column("id", sa.Integer()),
        sa.column("product", sa.String()),
        sa.column("metric", sa.String()),
        sa.column("reasoning", sa.Text()),
        sa.column("label", sa.String()),
    )
    imported = conn.execute(
        sa.select(defs.c.product, defs.c.slug).where(defs.c.description.like("Imported evaluation %"))
    ).all()
    update = (
        sa.update(judgments)
        .where(judgments.c.id == sa.bindparam("judgment_id"))
        .values(label=sa.bindparam("new_label"))
    )
    for product, slug in imported:
        last = 0
        while True:  # by id within the metric (ix_judgment_metric_id): memory bounded by a page
            rows = conn.execute(
                sa.select(judgments.c.id, judgments.c.reasoning)
                .where(judgments.c.metric == slug, judgments.c.id > last, judgments.c.product == product)
                .order_by(judgments.c.id)
                .limit(_BATCH)
            ).all()
            if not rows:
                break
            last = rows[-1][0]
            labelled = [
                {"judgment_id": judgment_id, "new_label": match.group(1).lower()}
                for judgment_id, reasoning in rows
                if reasoning is not None and (match := _LABELLED.fullmatch(reasoning)) is not None
            ]
            if labelled:
                conn.execute(update, labelled)
    op.create_index(
        "ix_judgment_label",
        "judgments",
        ["product", "metric", "label", "decision"],
        sqlite_where=sa.text("label IS NOT NULL"),
        postgresql_where=sa.text("label IS NOT NULL"),
    )
    if conn.dialect.name == "postgresql":
        op.drop_index("ix_judge_version_count_week", table_name="judge_version_counts")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(
            "ix_judge_version_count_week",
            "judge_version_counts",
            ["judge_version_id", "product", "week", "language", "metric", "decision", "human", "n"],
        )
    op.drop_index("ix_judgment_label", table_name="judgments")
    op.drop_column("judgments", "label")
