"""SQLModel tables for Overrule (SPEC §2), with the seeds' column names, constraints and indexes.

Timestamps are timezone-aware UTC (SQLModel's UTCDateTime refuses naive values): SQLite stores
them as UTC text, PostgreSQL as timestamptz. `utcnow()` is the one place that produces "now".
"""

from __future__ import annotations

import secrets
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Index,
    LargeBinary,
    Text,
    UniqueConstraint,
    and_,
    column,
    event,
    literal,
    text,
)
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Field, SQLModel

from lib.search import (
    LIST_REVIEWED_INDEX,
    LIST_SHORT_TEXT_INDEX,
    LIST_TEXT_INDEX,
    SEARCH_COLUMN,
    TEXT_BYTES_INDEX,
    normalize_search_text,
    short_text,
    text_bytes,
)

SNAPSHOT_STATUSES = ("active", "completed", "archived")
NOTE_TYPES = ("SUCCESS", "FAILURE", "PATTERN", "STRATEGY", "TIP")
CACHE_DECISIONS = ("INCLUDE", "EXCLUDE", "UNCERTAIN")
# A judge's label longer than this is free text, not a category: kept in the reasoning only.
LABEL_MAX = 200


def utcnow() -> datetime:
    """Now, as aware UTC (the storage convention of every table)."""
    return datetime.now(UTC)


def new_prefixed_id(prefix: str, at: datetime | None = None) -> str:
    """Seed-002 ids: `<prefix>_YYYYMMDD_HHMMSS_randomhex`."""
    moment = at or utcnow()
    return f"{prefix}_{moment:%Y%m%d_%H%M%S}_{secrets.token_hex(4)}"


def _search_column(source: str) -> Column[str]:
    """A `search_text` column: Core inserts that leave it out get it computed from `source`."""

    def default(context: Any) -> str:
        return normalize_search_text(context.get_current_parameters().get(source))

    return Column(Text, nullable=False, default=default, server_default="")


# The Evaluations list's filter columns, carried by each of its ordered indexes after the order's own
# columns. lib.counters keeps the last four: the review-state and metric filters read the index.
LIST_FILTER_COLUMNS = (
    "product", "language", "model_name", "category", "weighted_gap", "max_metric_gap", "evidence_count",
    "evidence_unlocated", "evidence_unverified", "judgments_total", "judgments_reviewed",
    "judgments_corrected", "judged_metrics",
)  # fmt: skip


def all_reviewed(total: Any, reviewed: Any) -> ColumnElement[bool]:
    """An evaluation with judgments, every one reviewed, from its counters: the one statement of
    lib.counters.review_state("reviewed") and of LIST_REVIEWED_INDEX's rows, so the list's filter
    states the index's predicate term by term (SQLite and PostgreSQL match a partial index only
    so). The 0 is written into the SQL, not bound: PostgreSQL's generic plans cannot match a
    parameter to the index's constant."""
    return and_(total > literal(0, literal_execute=True), reviewed == total)


# The rows of LIST_REVIEWED_INDEX: the live evaluations in review state "reviewed". Its DDL reads
# "deleted_at IS NULL AND judgments_total > 0 AND judgments_reviewed = judgments_total", as
# migration 0027 wrote it (tests/test_db.py compares the two).
REVIEWED_WHERE = and_(
    column("deleted_at").is_(None), all_reviewed(column("judgments_total"), column("judgments_reviewed"))
)


class EvaluationSnapshot(SQLModel, table=True):
    """One evaluation frozen at the end of judging (seed 002 AD-3), plus product and language."""

    __tablename__ = "evaluation_snapshots"
    __table_args__ = (
        # The Evaluations list: live rows newest first, with every filter column, so the match count
        # and the page's ids come from this index alone and never read the wide rows (answer, JSON).
        Index("ix_snapshot_live_created", "deleted_at", "created_at", "id", *LIST_FILTER_COLUMNS),
        # The list's gap sorts, with the filter columns too (issue 27): a page walks the index in
        # the sort's order and tests every filter on its entries, never reading a row to skip it.
        Index(
            "ix_snapshot_live_weighted_gap",
            "deleted_at",
            "weighted_gap",
            "created_at",
            "id",
            *(c for c in LIST_FILTER_COLUMNS if c != "weighted_gap"),
        ),
        Index(
            "ix_snapshot_live_max_gap",
            "deleted_at",
            "max_metric_gap",
            "created_at",
            "id",
            *(c for c in LIST_FILTER_COLUMNS if c != "max_metric_gap"),
        ),
        Index("ix_snapshot_product_language", "product", "language"),
        # SQLite only: the list index with the normalised question too, so a text filter that matches
        # many rows is tested on the entries of a newest-first walk, never on a row it reads (a page
        # 400 of a phrase in a fifth of 1M rows read 50k rows). PostgreSQL's btrees cannot hold every
        # text (lib.search); its trigram index, row tests and LIST_SHORT_TEXT_INDEX serve it there.
        Index(LIST_TEXT_INDEX, "deleted_at", "created_at", "id", *LIST_FILTER_COLUMNS, "search_text").ddl_if(
            dialect="sqlite"
        ),
        # The fully reviewed live evaluations only, newest first (issue 27): "all reviewed" compares
        # two counters, so no other index holds it as a range, and where reviews lag it keeps few
        # rows (0.4% of gen.py's), which a walk of the whole list tested one by one. With the
        # question on SQLite, as LIST_TEXT_INDEX; PostgreSQL's btrees cannot hold it.
        Index(
            LIST_REVIEWED_INDEX, "deleted_at", "created_at", "id", *LIST_FILTER_COLUMNS, "search_text",
            sqlite_where=REVIEWED_WHERE,
        ).ddl_if(dialect="sqlite"),
        Index(
            LIST_REVIEWED_INDEX, "deleted_at", "created_at", "id", *LIST_FILTER_COLUMNS,
            postgresql_where=REVIEWED_WHERE,
        ).ddl_if(dialect="postgresql"),
        # PostgreSQL: the live list newest first with the normalised question (INCLUDE), for the
        # rows whose question fits a btree entry, and the question's length: a deep page of a
        # common text walks the first and tests the text on its entries, reading no row, when the
        # second finds no longer live question (lib.search, migration 0028). Both are written by
        # lib.search's expressions, which lib.inspector states in its queries.
        Index(
            LIST_SHORT_TEXT_INDEX, "deleted_at", "created_at", "id", postgresql_include=["search_text"],
            postgresql_where=and_(column("deleted_at").is_(None), short_text(column(SEARCH_COLUMN))),
        ).ddl_if(dialect="postgresql"),
        Index(TEXT_BYTES_INDEX, text_bytes(column(SEARCH_COLUMN))).ddl_if(dialect="postgresql"),
    )  # fmt: skip

    id: str = Field(primary_key=True, max_length=64)
    created_at: datetime = Field(default_factory=utcnow, index=True)
    question_id: str | None = Field(default=None, max_length=128)
    question: str = Field(sa_column=Column(Text, nullable=False))
    model_answer: str = Field(sa_column=Column(Text, nullable=False))
    model_name: str | None = Field(default=None, max_length=200, index=True)
    judge_model: str | None = Field(default=None, max_length=200)
    product: str = Field(max_length=200, index=True)
    language: str = Field(default="en", max_length=16, index=True)
    category: str | None = Field(default=None, max_length=200, index=True)
    primary_metric: str | None = Field(default=None, max_length=64)
    bonus_metrics: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    user_scores_json: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    judge_scores_json: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    evidence_json: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    judge_meta_score: int | None = None
    weighted_gap: float | None = None  # sorted through ix_snapshot_live_weighted_gap
    # Largest |user - judge| over the metrics, rescaled to 1-5: lets the list sort by it in SQL.
    max_metric_gap: float | None = None  # sorted through ix_snapshot_live_max_gap
    # Evidence verification summary, so the list can filter by verification state in SQL.
    evidence_count: int = 0
    evidence_highlighted: int = 0
    evidence_unlocated: int = 0
    evidence_unverified: int = 0
    # Its judgments: how many, reviewed, corrected, and `,slug,slug,` of the metrics judged. Kept on
    # write by lib.counters (rebuilt by `python -m lib recount`), so the list never counts judgments.
    judgments_total: int = 0
    judgments_reviewed: int = 0
    judgments_corrected: int = 0
    judged_metrics: str = Field(default="", max_length=1000)
    # Its reviewers' decisions as one JSON object (metric: decision), the latest review first; None
    # before any reviewed decision. Kept on write by lib.counters (`reviewer_decisions_sql`), so the
    # wide CSV export reads it with the row instead of reading the judgments per evaluation.
    reviewer_decisions: str | None = Field(default=None, sa_column=Column(Text))
    overall_feedback: str | None = Field(default=None, sa_column=Column(Text))
    user_evaluation_id: str | None = Field(default=None, max_length=128)
    judge_evaluation_id: str | None = Field(default=None, max_length=128)
    chat_turn_count: int = 0
    max_chat_turns: int = 15
    status: str = Field(default="active", max_length=16, index=True)
    deleted_at: datetime | None = Field(default=None)
    # Who last archived or restored the evaluation, and when (every write records its reviewer).
    status_changed_by: str | None = Field(default=None, max_length=200)
    status_changed_at: datetime | None = Field(default=None)
    # Identity for idempotent re-import: a hash of product, question, answer and model.
    source_key: str | None = Field(default=None, max_length=64, unique=True)
    created_by: str | None = Field(default=None, max_length=200)
    # The question under lib.search's normalisation (Unicode case folding, Turkish i), trigram-indexed.
    search_text: str = Field(default="", sa_column=_search_column("question"))
    # The judge version whose scores `judge_scores_json` holds (lib.judge_versions); None: unversioned.
    judge_version_id: int | None = None


class MetricScore(SQLModel, table=True):
    """One metric of one snapshot that both the user and the judge scored (issue 19): the narrow
    copy of the two JSON score columns that Analytics reads instead of extracting JSON per render.

    Written with the snapshot (importer, judge), its `live` flag follows archive and restore;
    `lib.scores` is the only writer and keeps `AgreementCount` in step in the same transaction.
    """

    __tablename__ = "metric_scores"
    # Date filters that cut a week read the cut days' rows here (a range on day), never a scan.
    __table_args__ = (Index("ix_metric_score_day", "day", "product", "language"),)

    snapshot_id: str = Field(foreign_key="evaluation_snapshots.id", primary_key=True, max_length=64)
    metric: str = Field(primary_key=True, max_length=64)
    product: str = Field(max_length=200)
    language: str = Field(max_length=16)
    day: date  # UTC day of the snapshot's created_at
    week: date  # Monday of that day's ISO week (DuckDB's date_trunc('week'))
    user_score: float
    judge_score: float
    live: bool = True  # false while the snapshot is archived


class AgreementCount(SQLModel, table=True):
    """How many live (user score, judge score) pairs each (product, language, metric, week) holds.

    Every agreement measure on the Analytics page is a function of these counts, so the page reads
    rows in proportion to products x metrics x weeks x score cells, never to evaluations. Rows are
    upserted with `n = n + delta`; a row may fall to 0 and stay.
    """

    __tablename__ = "agreement_counts"
    # The weekly trend groups by (product, week): a covering index in that order streams the
    # aggregate instead of sorting every count row into a temporary b-tree.
    __table_args__ = (
        Index("ix_agreement_count_week", "product", "week", "metric", "user_score", "judge_score", "n"),
    )

    product: str = Field(primary_key=True, max_length=200)
    language: str = Field(primary_key=True, max_length=16)
    metric: str = Field(primary_key=True, max_length=64)
    week: date = Field(primary_key=True)
    user_score: float = Field(primary_key=True)
    judge_score: float = Field(primary_key=True)
    n: int = 0


class AgreementTotal(SQLModel, table=True):
    """`AgreementCount` summed over weeks: what a render without a date filter reads (a few hundred
    rows whatever the data's age, where the weekly table keeps growing with every new week)."""

    __tablename__ = "agreement_totals"

    product: str = Field(primary_key=True, max_length=200)
    language: str = Field(primary_key=True, max_length=16)
    metric: str = Field(primary_key=True, max_length=64)
    user_score: float = Field(primary_key=True)
    judge_score: float = Field(primary_key=True)
    n: int = 0


class ChatMessage(SQLModel, table=True):
    """A coach chat message (seed 002 AD-3/AD-4); user and assistant share `client_message_id`."""

    __tablename__ = "chat_messages"
    __table_args__ = (
        UniqueConstraint("snapshot_id", "client_message_id", "role", name="uq_chat_turn"),
        Index("ix_chat_snapshot_created", "snapshot_id", "created_at"),
    )

    id: str = Field(primary_key=True, max_length=64)
    # Several chats per evaluation (each with its own fixed metrics); the turn budget is the snapshot's.
    chat_id: str = Field(default="", max_length=64)
    client_message_id: str = Field(max_length=128)
    is_complete: bool = False
    snapshot_id: str = Field(foreign_key="evaluation_snapshots.id", max_length=64)
    role: str = Field(max_length=16)
    content: str = Field(default="", sa_column=Column(Text, nullable=False))
    selected_metrics: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    token_count: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    reviewer: str | None = Field(default=None, max_length=200)


class Judgment(SQLModel, table=True):
    """One AI decision a reviewer can confirm or overrule (seed 004), optionally a snapshot's metric."""

    __tablename__ = "judgments"
    __table_args__ = (
        # Serves select_history: equality on product (+metric) and was_corrected, newest first.
        Index("ix_judgment_history", "product", "was_corrected", "timestamp"),
        Index("ix_judgment_history_metric", "product", "metric", "was_corrected", "timestamp"),
        # The review queue's "oldest open judgment of a product": open judgments only, in exactly the
        # queue's order (timestamp, then id). Partial, because PostgreSQL does not treat
        # `reviewed_at IS NULL` as fixing a leading column: (reviewed_at, product, timestamp) gave it
        # no order, so it sorted every open judgment per product instead of reading one entry.
        Index(
            "ix_judgment_open",
            "product",
            "timestamp",
            "id",
            sqlite_where=text("reviewed_at IS NULL"),
            postgresql_where=text("reviewed_at IS NULL"),
        ),
        # The Evaluations list's review-state and metric filters: one covering probe per snapshot;
        # the decision too, for the Evaluations CSV's decisions (migration 0025).
        Index(
            "ix_judgment_snapshot_state",
            "snapshot_id",
            "reviewed_at",
            "was_corrected",
            "metric",
            "user_decision",
        ),
        # The Corrections list by metric or by reviewer (issue 27): its id order within the value,
        # and the evaluation whose liveness it tests, so a deep page skips entries, not rows.
        Index("ix_judgment_metric_id", "metric", "id", "snapshot_id"),
        Index(
            "ix_judgment_reviewer_id",
            "reviewer",
            "id",
            "snapshot_id",
            sqlite_where=text("reviewer IS NOT NULL"),
            postgresql_where=text("reviewer IS NOT NULL"),
        ),
        # The score a product's metric already gives a judge's label (lib.importer._stored_label_scores,
        # for a label sent without a number): one index read of the labelled judgments only (migration
        # 0032). Partial, so the many judgments without a label cost a write nothing here.
        Index(
            "ix_judgment_label",
            "product",
            "metric",
            "label",
            "decision",
            sqlite_where=text("label IS NOT NULL"),
            postgresql_where=text("label IS NOT NULL"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    change_id: str = Field(max_length=300, unique=True)
    product: str = Field(max_length=200)
    metric: str | None = Field(default=None, max_length=64)
    snapshot_id: str | None = Field(default=None, foreign_key="evaluation_snapshots.id", max_length=64)
    decision: str = Field(max_length=64)
    confidence: float | None = None
    reasoning: str | None = Field(default=None, sa_column=Column(Text))
    # The judge's label when its source sent one (Phoenix, Langfuse, promptfoo pass/fail, OTLP
    # `gen_ai.evaluation.score.label`), as labels are compared: stripped, lower case
    # (`lib.source_records.label_key`). The reasoning shows it too, but free text there is no label.
    label: str | None = Field(default=None, max_length=LABEL_MAX)
    user_decision: str | None = Field(default=None, max_length=64)
    user_reasoning: str | None = Field(default=None, sa_column=Column(Text))
    reviewer: str | None = Field(default=None, max_length=200)
    timestamp: datetime = Field(default_factory=utcnow)
    reviewed_at: datetime | None = None
    version: int = 1
    was_corrected: bool = Field(default=False)
    # Optional seed-004 cache fields, kept on import and export.
    url: str | None = Field(default=None, sa_column=Column(Text))
    description: str | None = Field(default=None, sa_column=Column(Text))
    ai_provider: str | None = Field(default=None, max_length=200)
    judge_model: str | None = Field(default=None, max_length=200)
    # Second opinion (seed 000 evaluation layer).
    second_opinion_action: str | None = Field(default=None, max_length=32)
    second_opinion_valid: bool | None = None
    second_opinion_decision: str | None = Field(default=None, max_length=64)
    second_opinion_confidence: float | None = None
    second_opinion_text: str | None = Field(default=None, sa_column=Column(Text))
    second_opinion_model: str | None = Field(default=None, max_length=200)
    second_opinion_at: datetime | None = None
    # The judge version whose decision `decision` is (lib.judge_versions); None: unversioned.
    judge_version_id: int | None = None


def compute_was_corrected(decision: str | None, user_decision: str | None) -> bool:
    """Seed 004: corrected when the reviewer set a decision that differs from the judge's."""
    return user_decision is not None and user_decision != decision


@event.listens_for(Judgment, "before_insert")
@event.listens_for(Judgment, "before_update")
def _judgment_invariants(_mapper, _connection, target: Judgment) -> None:  # type: ignore[no-untyped-def]
    """Keep `was_corrected` true to its definition for every ORM write, whoever builds the row."""
    target.was_corrected = compute_was_corrected(target.decision, target.user_decision)


class ProductCount(SQLModel, table=True):
    """Per product: evaluations (live, archived) and live evidence by state. Kept by lib.counters."""

    __tablename__ = "product_counts"

    product: str = Field(primary_key=True, max_length=200)
    evaluations: int = 0
    archived: int = 0
    evidence_total: int = 0
    evidence_highlighted: int = 0
    evidence_unlocated: int = 0
    evidence_unverified: int = 0


class EvaluationCount(SQLModel, table=True):
    """Evaluations per combination of the values the Evaluations list filters on (issue 27), so that
    any combination of product, language, model, category, judged metric, largest gap (in halves),
    review state, evidence state and archived is counted exactly by summing a few hundred rows,
    never by reading evaluations. Kept by lib.counters wherever `product_counts` and the
    per-evaluation review counters move; the flags are lib.counters' definitions of the list's states.
    """

    __tablename__ = "evaluation_counts"

    archived: bool = Field(primary_key=True)
    product: str = Field(primary_key=True, max_length=200)
    language: str = Field(primary_key=True, max_length=16)
    model_name: str = Field(primary_key=True, max_length=200)  # '' for none
    category: str = Field(primary_key=True, max_length=200)  # '' for none
    judged_metrics: str = Field(primary_key=True, max_length=1000)  # `,slug,slug,` as on the evaluation
    gap_halves: int = Field(primary_key=True)  # floor(2 × max_metric_gap); -1 without a gap
    has_weighted_gap: bool = Field(primary_key=True)  # sorted by it, the gapless rows come last
    # The list's review and evidence states (lib.counters.EVALUATION_STATES), each true or false.
    review_pending: bool = Field(primary_key=True)
    review_reviewed: bool = Field(primary_key=True)
    review_corrected: bool = Field(primary_key=True)
    evidence_unverified: bool = Field(primary_key=True)
    evidence_unlocated: bool = Field(primary_key=True)
    evidence_verified: bool = Field(primary_key=True)
    evidence_none: bool = Field(primary_key=True)
    n: int = 0


class JudgmentOutcomeCounts(SQLModel):
    """The outcome columns every judgment counter table keeps (`lib.counters.JUDGMENT_VALUES` reads
    them from here): live judgments, how many are reviewed and corrected, and second-opinion results."""

    judgments: int = 0
    reviewed: int = 0
    corrected: int = 0
    opinion_validated: int = 0
    opinion_improved: int = 0
    opinion_questioned: int = 0


class JudgmentDayCount(JudgmentOutcomeCounts, table=True):
    """Live judgments per product × metric ('' for none) × UTC day judged. Kept by lib.counters."""

    __tablename__ = "judgment_day_counts"

    product: str = Field(primary_key=True, max_length=200)
    metric: str = Field(primary_key=True, max_length=64)
    day: str = Field(primary_key=True, max_length=10)  # YYYY-MM-DD


class JudgmentLanguageCount(JudgmentOutcomeCounts, table=True):
    """Live judgments per product × metric × evaluation language ('' stand-alone). Kept by lib.counters."""

    __tablename__ = "judgment_language_counts"

    product: str = Field(primary_key=True, max_length=200)
    metric: str = Field(primary_key=True, max_length=64)
    language: str = Field(primary_key=True, max_length=16)


class JudgmentReviewerCount(JudgmentOutcomeCounts, table=True):
    """Live judgments per product × metric × reviewer ('' for none) × UTC day judged. Kept by lib.counters.

    The Corrections page's statistics under its Reviewer filter read these rows (issue 25), as
    they read `judgment_day_counts` without one: rows in proportion to products × metrics ×
    reviewers × days, never to judgments.
    """

    __tablename__ = "judgment_reviewer_counts"

    reviewer: str = Field(primary_key=True, max_length=200)
    product: str = Field(primary_key=True, max_length=200)
    metric: str = Field(primary_key=True, max_length=64)
    day: str = Field(primary_key=True, max_length=10)  # YYYY-MM-DD


class JudgmentEvent(SQLModel, table=True):
    """Append-only audit trail of every change to a judgment."""

    __tablename__ = "judgment_events"
    # A reviewer's own latest decisions (what Undo offers): a walk back through their events only.
    __table_args__ = (Index("ix_judgment_event_reviewer", "reviewer", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    judgment_id: int = Field(foreign_key="judgments.id", index=True)
    change_id: str = Field(max_length=300)
    action: str = Field(max_length=32)
    reviewer: str = Field(max_length=200)
    at: datetime = Field(default_factory=utcnow, index=True)
    from_decision: str | None = Field(default=None, max_length=64)
    to_decision: str | None = Field(default=None, max_length=64)
    reason: str | None = Field(default=None, sa_column=Column(Text))
    version: int = 1
    # Set on a change made through a team review queue (lib.queues): its resolution of agreeing
    # labels, a lead's adjudication, or their undo. Such a change is undone through the queue,
    # which also reopens the labels behind it, never by the plain review undo.
    queue_id: int | None = None


class SessionNote(SQLModel, table=True):
    """A cross-session note (seed 000 schema and indexes); the "lesson" of seed 001."""

    __tablename__ = "session_notes"
    # Seed 000's indexes, each widened (migration 0026, issue 27): its filter, then the list's order
    # (newest first: `timestamp`, `id`), then the other filter columns, so that a page is a walk that
    # stops after it, an age a range of it, and the other filters are tested on its entries.
    __table_args__ = (
        Index("idx_language", "language", "timestamp", "id", "note_type", "session_id"),
        Index("idx_type", "note_type", "timestamp", "id", "language", "session_id"),
        Index("idx_timestamp", "timestamp", "id", "note_type", "language", "session_id"),
        Index("idx_session", "session_id", "timestamp", "id", "note_type", "language"),
    )

    id: int | None = Field(default=None, primary_key=True)
    timestamp: datetime = Field(default_factory=utcnow)
    language: str = Field(default="", max_length=10)
    note_type: str = Field(max_length=20)
    content: str = Field(sa_column=Column(Text, nullable=False))
    phelps_code: str | None = Field(default=None, max_length=20)
    confidence: float | None = None
    session_id: str = Field(max_length=100)
    # Seed 001 pinning: manual pins and relevance-driven auto-pins are told apart.
    pinned: bool = False
    auto_pinned: bool = False
    prerequisites: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_by: str | None = Field(default=None, max_length=200)
    # The content under lib.search's normalisation, trigram-indexed.
    search_text: str = Field(default="", sa_column=_search_column("content"))


@event.listens_for(EvaluationSnapshot, "before_insert")
@event.listens_for(EvaluationSnapshot, "before_update")
def _snapshot_search_text(_mapper, _connection, target: EvaluationSnapshot) -> None:  # type: ignore[no-untyped-def]
    """ORM writes: the search text follows the question, whoever builds the object."""
    target.search_text = normalize_search_text(target.question)


@event.listens_for(SessionNote, "before_insert")
@event.listens_for(SessionNote, "before_update")
def _note_search_text(_mapper, _connection, target: SessionNote) -> None:  # type: ignore[no-untyped-def]
    """ORM writes: the search text follows the content."""
    target.search_text = normalize_search_text(target.content)


class SessionAudit(SQLModel, table=True):
    """Which notes a judge run showed, with its env tags (seed 001 `session_audit`)."""

    __tablename__ = "session_audit"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(max_length=100, unique=True)
    shown_lesson_ids: list[int] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    env_tags: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    repo: str | None = Field(default=None, max_length=200)  # seed name; holds the product
    snapshot_id: str | None = Field(default=None, max_length=64, index=True)
    timestamp: datetime = Field(default_factory=utcnow, index=True)
    transcript_path: str | None = Field(default=None, sa_column=Column(Text))
    transcript: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))
    recorded_by: str | None = Field(default=None, max_length=320)  # a token's name or a signed-in user


class ProcessedRelevanceSession(SQLModel, table=True):
    """Audits already scored by the evaluator, so a rerun never double counts (seed 001)."""

    __tablename__ = "processed_relevance_sessions"

    session_id: str = Field(primary_key=True, max_length=100)
    processed_at: datetime = Field(default_factory=utcnow)
    retry_count: int = 0
    status: str = Field(default="completed", max_length=32)


class LessonTagRelevance(SQLModel, table=True):
    """EMA relevance of a note under one context tag (seed 001 `lesson_tag_relevance`)."""

    __tablename__ = "lesson_tag_relevance"

    lesson_id: int = Field(foreign_key="session_notes.id", primary_key=True)
    tag: str = Field(primary_key=True, max_length=200)
    score: float = 0.0
    positive_evals: int = 0
    negative_evals: int = 0
    last_evaluated: datetime | None = None


class TagRelevanceEvent(SQLModel, table=True):
    """One applied relevance score: the history behind the EMA chart."""

    __tablename__ = "tag_relevance_events"
    __table_args__ = (Index("ix_tag_event_lesson_tag_at", "lesson_id", "tag", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    lesson_id: int = Field(foreign_key="session_notes.id")
    tag: str = Field(max_length=200)
    at: datetime = Field(default_factory=utcnow)
    raw_score: float
    weight: float = 1.0
    old_score: float = 0.0
    new_score: float = 0.0
    source: str = Field(default="evaluator", max_length=32)  # evaluator | reviewer
    session_id: str | None = Field(default=None, max_length=100)
    reviewer: str | None = Field(default=None, max_length=200)


class LessonMatchStat(SQLModel, table=True):
    """How often a note was shown under a tag set (seed 001 match-count auto-pin, threshold 15)."""

    __tablename__ = "lesson_match_stats"

    lesson_id: int = Field(foreign_key="session_notes.id", primary_key=True)
    tag_set: str = Field(primary_key=True, max_length=1000)  # sorted tags joined by ","
    times_matched: int = 0
    last_matched: datetime | None = None


class MetricDefinition(SQLModel, table=True):
    """A product's rubric entry: slug, display name, scale and rubric text (SPEC §2)."""

    __tablename__ = "metric_definitions"
    __table_args__ = (UniqueConstraint("product", "slug", name="uq_metric_product_slug"),)

    id: int | None = Field(default=None, primary_key=True)
    product: str = Field(max_length=200, index=True)
    slug: str = Field(max_length=64)
    display_name: str = Field(max_length=200)
    min_value: float = 1.0
    max_value: float = 5.0
    integer_scale: bool = True
    description: str = Field(default="", sa_column=Column(Text, nullable=False))
    position: int = 0
    # The scale was inferred by an import from its scores (no user, rubric editor or source stated
    # it): later imports widen it to cover their scores (lib.metrics.upsert_metric_definitions).
    scale_inferred: bool = False


JUDGE_VERSION_ORIGINS = ("judge", "rubric", "lab", "import", "api", "cli", "demo")
UNVERSIONED = 0  # the judge-version id of judgments no version is known for, in counts and verdicts


class JudgeConfigFields(SQLModel):
    """The configuration a judge version records (issue 28), declared once: `JudgeVersion` inherits
    these as its columns and `lib.judge_versions.JudgeConfig` is generated from them, so a field
    added here is stored, hashed, compared and shown with no second list to extend. In the order
    tables and diffs show them; each title is the field's label there. None: a judge that runs
    elsewhere did not name the field."""

    judge_model: str | None = Field(default=None, max_length=200, title="Judge model")
    # [{slug, display_name, min, max, integer_scale, description}] in the rubric's order.
    rubric: list[dict[str, Any]] | None = Field(default=None, sa_type=JSON, title="Rubric")
    prompt_hash: str | None = Field(default=None, max_length=64, title="Prompt templates")
    history_entries: int | None = Field(default=None, title="History entries")
    history_ratio: float | None = Field(default=None, title="History correction ratio")
    notes_limit: int | None = Field(default=None, title="Notes limit")
    relevance: bool | None = Field(default=None, title="Tag relevance")
    temperature: float | None = Field(default=None, title="Temperature")
    max_tokens_judge: int | None = Field(default=None, title="Reply cap (scoring)")
    max_tokens_mentor: int | None = Field(default=None, title="Reply cap (mentoring)")


class JudgeVersion(JudgeConfigFields, table=True):
    """One configuration of a product's judge (issue 28): model, rubric as it was, prompt templates,
    history and notes settings, temperature and reply caps (`JudgeConfigFields`). Content-addressed
    (lib.judge_versions): the same configuration is the same row. A judge that runs elsewhere may
    name only some fields."""

    __tablename__ = "judge_versions"
    __table_args__ = (
        UniqueConstraint("product", "name", name="uq_judge_version_name"),
        UniqueConstraint("product", "content_hash", name="uq_judge_version_hash"),
    )

    id: int | None = Field(default=None, primary_key=True)
    product: str = Field(max_length=200)
    name: str = Field(max_length=200)
    content_hash: str = Field(max_length=64)
    complete: bool = False  # every field known: the built-in judge can run it
    origin: str = Field(default="judge", max_length=16)
    description: str = Field(default="", sa_column=Column(Text, nullable=False))
    previous_id: int | None = None  # the product's newest version when this one was made (its diff)
    experiment_id: int | None = None  # promoted from this alignment experiment's arm
    experiment_arm: str | None = Field(default=None, max_length=16)
    created_by: str = Field(max_length=320)
    created_at: datetime = Field(default_factory=utcnow)


class ProductJudge(SQLModel, table=True):
    """A product's judge options made current by a lead (a rubric edit, a promotion, `versions use`):
    the built-in judge takes model, history, notes, temperature and caps from this version instead of
    the server's settings. The rubric always comes from the product's metric definitions."""

    __tablename__ = "product_judges"

    product: str = Field(primary_key=True, max_length=200)
    judge_version_id: int = Field(foreign_key="judge_versions.id")
    set_by: str = Field(max_length=320)
    set_at: datetime = Field(default_factory=utcnow)


class JudgeVerdict(SQLModel, table=True):
    """A judge version's decision on a judgment that is not the judgment's own `decision`: the one a
    re-judge replaced, or a re-judge's that the seed-004 rule did not let replace a reviewed entry.
    With the judgments' own decisions these are every version's verdicts (lib.version_agreement)."""

    __tablename__ = "judge_verdicts"

    judgment_id: int = Field(foreign_key="judgments.id", primary_key=True)
    judge_version_id: int = Field(primary_key=True)  # UNVERSIONED (0) for a decision of no known version
    decision: str = Field(max_length=64)
    confidence: float | None = None
    reasoning: str | None = Field(default=None, sa_column=Column(Text))
    judged_at: datetime
    week: date  # Monday of judged_at's ISO week (UTC)


class JudgeVersionCount(SQLModel, table=True):
    """Live reviewed judgments per judge version × product × language × metric × week judged ×
    (the version's decision, the resolved reviewer decision). Kept by lib.counters; Analytics'
    agreement by judge version reads these rows, never judgments."""

    __tablename__ = "judge_version_counts"
    # The reads that need the week (the timeline's weekly pairs and sums, first and last week) group
    # by (version, product, week): a covering index in that order streams the aggregate instead of
    # sorting every row (108k at 1M evaluations) into a temporary b-tree (migration 0030).
    # SQLite only (migration 0032, review8 F6): PostgreSQL plans those reads as a sequential scan
    # and a hashed aggregate with or without it (93k rows at 100k evaluations: the same server CPU
    # for the tab's reads with this index, without `n`, or none), and an index holding `n`, which
    # every review changes, made none of the reviews' count updates HOT (100% -> 0%).
    __table_args__ = (
        Index(
            "ix_judge_version_count_week",
            "judge_version_id", "product", "week", "language", "metric", "decision", "human", "n",
        ).ddl_if(dialect="sqlite"),
    )  # fmt: skip

    judge_version_id: int = Field(primary_key=True)
    product: str = Field(primary_key=True, max_length=200)
    language: str = Field(primary_key=True, max_length=16)
    metric: str = Field(primary_key=True, max_length=64)
    week: date = Field(primary_key=True)
    decision: str = Field(primary_key=True, max_length=64)
    human: str = Field(primary_key=True, max_length=64)
    n: int = 0


class JudgeVersionTotal(SQLModel, table=True):
    """`JudgeVersionCount` summed over weeks: what Analytics' agreement by version reads when it needs
    no week (a few thousand rows whatever the data's age, where the weekly table keeps growing with
    every week judged: 4.7k rows at 1k evaluations, 108k at 1M). Kept with it by lib.version_counts."""

    __tablename__ = "judge_version_totals"

    judge_version_id: int = Field(primary_key=True)
    product: str = Field(primary_key=True, max_length=200)
    language: str = Field(primary_key=True, max_length=16)
    metric: str = Field(primary_key=True, max_length=64)
    decision: str = Field(primary_key=True, max_length=64)
    human: str = Field(primary_key=True, max_length=64)
    n: int = 0


class JudgeVersionPairCount(SQLModel, table=True):
    """Live reviewed judgments that two judge versions both judged, per version pair × product ×
    language × metric × (A's decision, B's decision, the resolved reviewer decision); A is the
    version of the lower id. Kept by lib.counters; "same items only" reads these rows, never
    judgments (lib.version_agreement)."""

    __tablename__ = "judge_version_pair_counts"

    version_a: int = Field(primary_key=True)
    version_b: int = Field(primary_key=True)
    product: str = Field(primary_key=True, max_length=200)
    language: str = Field(primary_key=True, max_length=16)
    metric: str = Field(primary_key=True, max_length=64)
    decision_a: str = Field(primary_key=True, max_length=64)
    decision_b: str = Field(primary_key=True, max_length=64)
    human: str = Field(primary_key=True, max_length=64)
    n: int = 0


class Interaction(SQLModel, table=True):
    """A question/answer pair with citations, candidate for auto-evaluation by precedent (seed 003)."""

    __tablename__ = "interactions"

    id: str = Field(primary_key=True, max_length=64)
    product: str = Field(default="", max_length=200, index=True)
    language: str = Field(default="en", max_length=16)
    question: str = Field(sa_column=Column(Text, nullable=False))
    answer: str = Field(sa_column=Column(Text, nullable=False))
    citation_url: str | None = Field(default=None, sa_column=Column(Text))
    citations: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # The QA embedding as packed little-endian float32 (lib.precedents.pack_vector): a cache,
    # recomputed from question and answer when missing or of another model's dimension.
    qa_vector: bytes | None = Field(default=None, sa_column=Column(LargeBinary))
    created_at: datetime = Field(default_factory=utcnow, index=True)


class ExpertFeedback(SQLModel, table=True):
    """Scores an expert (or the auto-evaluator, type 'ai') gave an interaction (seed 003)."""

    __tablename__ = "expert_feedback"

    id: int | None = Field(default=None, primary_key=True)
    interaction_id: str = Field(foreign_key="interactions.id", index=True)
    type: str = Field(default="expert", max_length=16)
    total_score: float | None = None
    citation_score: float | None = None
    citation_url: str | None = Field(default=None, sa_column=Column(Text))
    sentence_scores: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False)
    )
    reviewer: str | None = Field(default=None, max_length=200)
    created_at: datetime = Field(default_factory=utcnow)


class AutoEval(SQLModel, table=True):
    """The auto-evaluation result of an interaction, with its match trace (seed 003 `Eval`)."""

    __tablename__ = "auto_evals"

    id: int | None = Field(default=None, primary_key=True)
    interaction_id: str = Field(foreign_key="interactions.id", unique=True)
    processed: bool = True
    has_matches: bool = False
    expert_feedback_id: int | None = Field(default=None, foreign_key="expert_feedback.id")
    matched_interaction_id: str | None = Field(default=None, max_length=64)
    sentence_match_trace: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    no_match_reason: str | None = Field(default=None, max_length=64, index=True)
    total_score: float | None = None
    created_at: datetime = Field(default_factory=utcnow)


ALIGNMENT_ARMS = ("bare", "history", "notes", "full", "rubric")
EXPERIMENT_STATUSES = ("pending", "running", "finished", "incomplete", "cancelled")
CALL_STATUSES = ("pending", "done", "failed")


class AlignmentExperiment(SQLModel, table=True):
    """A judge-alignment experiment (issue 16): a sample of reviewed judgments re-judged per arm."""

    __tablename__ = "alignment_experiments"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(default="", max_length=200)
    product: str = Field(max_length=200, index=True)
    metrics: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    language: str | None = Field(default=None, max_length=16)
    start_date: datetime | None = None
    end_date: datetime | None = None
    sample_size: int = 200
    seed: int = 0
    arms: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # {metric slug: rubric text} for the `rubric` arm (full context with an edited rubric).
    edited_rubric: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    judge_model: str | None = Field(default=None, max_length=200)
    status: str = Field(default="pending", max_length=16)
    cancel_requested: bool = False
    created_at: datetime = Field(default_factory=utcnow)
    created_by: str | None = Field(default=None, max_length=200)
    finished_at: datetime | None = None


class AlignmentItem(SQLModel, table=True):
    """One sampled reviewed judgment: the reviewer's final score is what every arm is measured against."""

    __tablename__ = "alignment_items"
    __table_args__ = (UniqueConstraint("experiment_id", "judgment_id", name="uq_alignment_item"),)

    id: int | None = Field(default=None, primary_key=True)
    experiment_id: int = Field(foreign_key="alignment_experiments.id", index=True)
    judgment_id: int = Field(foreign_key="judgments.id")
    snapshot_id: str = Field(max_length=64)
    metric: str = Field(max_length=64)
    reviewer_score: float
    original_score: float | None = None
    # The judged evaluation's creation: history and notes are taken as of this moment.
    as_of: datetime


class AlignmentCall(SQLModel, table=True):
    """One arm's Stage-1 re-judging of one sampled evaluation (scores for all its metrics)."""

    __tablename__ = "alignment_calls"
    __table_args__ = (UniqueConstraint("experiment_id", "arm", "snapshot_id", name="uq_alignment_call"),)

    id: int | None = Field(default=None, primary_key=True)
    experiment_id: int = Field(foreign_key="alignment_experiments.id", index=True)
    arm: str = Field(max_length=16)
    snapshot_id: str = Field(max_length=64)
    status: str = Field(default="pending", max_length=16)
    scores: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    error: str | None = Field(default=None, sa_column=Column(Text))
    prompt: str | None = Field(default=None, sa_column=Column(Text))
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0
    finished_at: datetime | None = None


class UserRole(SQLModel, table=True):
    """A signed-in identity's role (lib.auth); identities without a row get OVERRULE_DEFAULT_ROLE."""

    __tablename__ = "user_roles"

    identity: str = Field(primary_key=True, max_length=320)  # lower-cased e-mail, else the OIDC sub
    role: str = Field(max_length=16)
    updated_by: str | None = Field(default=None, max_length=320)
    updated_at: datetime = Field(default_factory=utcnow)


class AuditEvent(SQLModel, table=True):
    """Append-only access trail: sign-ins, role changes and refused attempts (lib.auth)."""

    __tablename__ = "audit_events"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, index=True)
    identity: str = Field(max_length=320, index=True)
    action: str = Field(max_length=32, index=True)  # sign_in | role_change | denied
    detail: str = Field(default="", sa_column=Column(Text, nullable=False))


class BrowserSession(SQLModel, table=True):
    """One sign-in of a browser (lib.auth, issue 24.3): live until signed out, ended by an admin or a
    role removal, or OVERRULE_SESSION_HOURS after `started_at`. Streamlit's identity cookie has no
    server-side state; this row is what "Sign out" can end."""

    __tablename__ = "browser_sessions"

    id: str = Field(primary_key=True, max_length=64)  # sha256 of the ID token's iss, sub, iat, nonce
    identity: str = Field(max_length=320, index=True)
    started_at: datetime = Field(index=True)  # the ID token's issue time (or first sight, if earlier)
    last_seen_at: datetime
    ended_at: datetime | None = Field(default=None)
    ended_by: str | None = Field(default=None, max_length=320)
    end_reason: str | None = Field(default=None, max_length=32)  # sign_out | admin | role_removed


class ApiToken(SQLModel, table=True):
    """A bearer token for the pipeline API (lib.tokens): only the sha256 of its secret is stored."""

    __tablename__ = "api_tokens"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, unique=True, index=True)  # the actor a token's writes record
    role: str = Field(max_length=16)
    secret_hash: str = Field(max_length=64, unique=True, index=True)
    created_by: str = Field(max_length=320)
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = Field(default=None)
    expires_at: datetime | None = Field(default=None)  # None: until revoked
    last_used_at: datetime | None = Field(default=None)  # written at most once a minute


QUEUE_MODES = ("open", "blind")
QUEUE_ORDERS = ("oldest", "largest_gap", "random")
QUEUE_STATUSES = ("active", "closed")
# A queue judgment: open (collecting labels), resolved (the labels agreed), disputed (awaiting a
# lead), adjudicated (a lead decided), released (its queue closed before it was decided).
QUEUE_JUDGMENT_STATES = ("open", "resolved", "disputed", "adjudicated", "released")
# A reviewer's hold on an item: reserved (lease running or run out), done, skipped, released, expired.
ASSIGNMENT_STATUSES = ("reserved", "done", "skipped", "released", "expired")


class ReviewQueue(SQLModel, table=True):
    """A lead's team review queue (issue 26): a frozen selection of items, each reviewed by
    `overlap` reviewers; open or blind-first; agreeing labels resolve, others go to adjudication."""

    __tablename__ = "review_queues"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=200, unique=True)
    description: str = Field(default="", sa_column=Column(Text, nullable=False))
    # The filter it was built from (kept for the record; the items are frozen at creation).
    product: str | None = Field(default=None, max_length=200)
    metrics: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    language: str | None = Field(default=None, max_length=16)
    since: datetime | None = None
    until: datetime | None = None
    review_state: str | None = Field(default=None, max_length=16)
    item_order: str = Field(default="oldest", max_length=16)
    seed: int = 0
    size: int = 0  # items asked for; `items` is how many it holds
    overlap: int = 1
    mode: str = Field(default="open", max_length=16)
    tolerance: float | None = None  # continuous scales: labels this close agree
    reviewers: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    status: str = Field(default="active", max_length=16)
    items: int = 0
    judgments: int = 0
    created_by: str = Field(max_length=320)
    created_at: datetime = Field(default_factory=utcnow)
    closed_by: str | None = Field(default=None, max_length=320)
    closed_at: datetime | None = None


class ReviewQueueItem(SQLModel, table=True):
    """One item of a team queue: an evaluation (its judgments in the queue's metrics) or one
    stand-alone judgment, with how many reviewers hold or finished it."""

    __tablename__ = "review_queue_items"
    __table_args__ = (
        UniqueConstraint("queue_id", "position", name="uq_queue_item_position"),
        UniqueConstraint("queue_id", "item_key", name="uq_queue_item_key"),
        # "Next item": the first item in queue order that still wants a reviewer, one index seek
        # however many items before it are taken (`available` is `claimed < overlap`).
        Index("ix_queue_item_available", "queue_id", "available", "position"),
    )

    id: int | None = Field(default=None, primary_key=True)
    queue_id: int = Field(foreign_key="review_queues.id")
    position: int
    item_key: str = Field(max_length=100)  # lib.review_queue's key: "snapshot:<id>" | "judgment:<id>"
    snapshot_id: str | None = Field(default=None, foreign_key="evaluation_snapshots.id", max_length=64)
    claimed: int = 0  # reviewers holding it (a lease, even one run out until reclaimed) or done
    done: int = 0  # reviewers who labelled every judgment of it
    available: bool = True


class ReviewQueueJudgment(SQLModel, table=True):
    """One judgment of a team queue item and where it stands: collecting labels, resolved,
    disputed or adjudicated. While `held`, no other queue (nor the default queue) hands it out."""

    __tablename__ = "review_queue_judgments"
    __table_args__ = (
        Index("ix_queue_judgment_state", "queue_id", "state"),
        Index("ix_queue_judgment_item", "item_id"),
        # A judgment is held by at most one queue at a time, enforced by the database.
        Index(
            "uq_queue_judgment_held",
            "judgment_id",
            unique=True,
            sqlite_where=text("held"),
            postgresql_where=text("held"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    queue_id: int = Field(foreign_key="review_queues.id")
    item_id: int = Field(foreign_key="review_queue_items.id")
    judgment_id: int = Field(foreign_key="judgments.id")
    state: str = Field(default="open", max_length=16)
    held: bool = True
    labels: int = 0  # final labels so far
    decision: str | None = Field(default=None, max_length=64)  # resolved or adjudicated
    decided_by: str | None = Field(default=None, max_length=320)
    decided_at: datetime | None = None


class ReviewLabel(SQLModel, table=True):
    """One reviewer's label of one judgment in a team queue: the blind label (blind-first queues)
    and the final one, each with its reason. Only the queue's resolution reaches the judgment."""

    __tablename__ = "review_labels"
    __table_args__ = (
        UniqueConstraint("queue_id", "judgment_id", "reviewer", name="uq_review_label"),
        Index("ix_review_label_item", "item_id", "reviewer"),
        Index("ix_review_label_reviewer", "queue_id", "reviewer"),
    )

    id: int | None = Field(default=None, primary_key=True)
    queue_id: int = Field(foreign_key="review_queues.id")
    item_id: int = Field(foreign_key="review_queue_items.id")
    judgment_id: int = Field(foreign_key="judgments.id")
    reviewer: str = Field(max_length=320)
    blind_decision: str | None = Field(default=None, max_length=64)
    blind_reason: str | None = Field(default=None, sa_column=Column(Text))
    blind_at: datetime | None = None
    decision: str | None = Field(default=None, max_length=64)  # final; None until given
    reason: str | None = Field(default=None, sa_column=Column(Text))
    labelled_at: datetime | None = None
    withdrawn_at: datetime | None = None  # set by an undo until the reviewer labels again


class ReviewAssignment(SQLModel, table=True):
    """A reviewer's hold on a queue item: the reservation lease, skips, the unsent draft and the
    blind-first reveal. `queue_id` None is the default queue (everything pending, one reviewer)."""

    __tablename__ = "review_assignments"
    __table_args__ = (
        UniqueConstraint("queue_id", "item_key", "reviewer", name="uq_assignment"),
        # The default queue (queue_id NULL, where the constraint above does not bite): one row per
        # reviewer and item, and at most one reservation per item.
        Index(
            "uq_default_assignment",
            "item_key",
            "reviewer",
            unique=True,
            sqlite_where=text("queue_id IS NULL"),
            postgresql_where=text("queue_id IS NULL"),
        ),
        Index(
            "uq_default_reservation",
            "item_key",
            unique=True,
            sqlite_where=text("queue_id IS NULL AND status = 'reserved'"),
            postgresql_where=text("queue_id IS NULL AND status = 'reserved'"),
        ),
        # Live and run-out reservations (few: about one per reviewer at work) and a reviewer's rows.
        Index("ix_assignment_status", "status", "queue_id", "expires_at"),
        Index("ix_assignment_reviewer", "reviewer", "queue_id", "status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    queue_id: int | None = Field(default=None, foreign_key="review_queues.id")
    item_id: int | None = Field(default=None, foreign_key="review_queue_items.id")
    item_key: str = Field(max_length=100)
    reviewer: str = Field(max_length=320)
    status: str = Field(default="reserved", max_length=16)
    reserved_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    active_seconds: float = 0.0  # time spent holding it, each hold capped at the lease
    revealed_at: datetime | None = None  # blind-first: when the judge's side was shown
    draft: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


_DATETIME_FIELDS: dict[type, tuple[str, ...]] = {}


def _datetime_fields(model: type) -> tuple[str, ...]:
    if model not in _DATETIME_FIELDS:
        table = getattr(model, "__table__", None)
        names = []
        for column in table.columns if table is not None else ():
            if isinstance(getattr(column.type, "impl", column.type), DateTime):
                names.append(column.key)
        _DATETIME_FIELDS[model] = tuple(names)
    return _DATETIME_FIELDS[model]


@event.listens_for(OrmSession, "before_flush")
def _naive_datetimes_are_utc(session: OrmSession, _context, _instances) -> None:  # type: ignore[no-untyped-def]
    """Naive datetimes handed to a model are taken as UTC rather than refused at flush time."""
    for obj in (*session.new, *session.dirty):
        for name in _datetime_fields(type(obj)):
            value = getattr(obj, name, None)
            if isinstance(value, datetime) and value.tzinfo is None:
                setattr(obj, name, value.replace(tzinfo=UTC))


class OtlpSpan(SQLModel, table=True):
    """What the OTLP receiver (lib.otlp) knows of one GenAI span: the call (question, answer,
    model, product) and the evaluation events received for it, joined whichever came first.

    Keyed by `<trace id>:<span id>` (hex), or `response:<gen_ai.response.id>` for events that name
    only the response. Once the span and an evaluation have met, `snapshot_id` is the evaluation
    they became, `span_json` is NULL and `pending_json` empty; later events for the span add their
    metrics to that evaluation, and re-sent ones find it and add nothing.
    """

    __tablename__ = "otlp_spans"
    __table_args__ = (
        # What waits (no evaluation yet), oldest first: the sweep's range and the waiting list's
        # order (lib.otlp_waiting). Partial (migration 0033): a link row, which is most rows, is
        # never in it, so linking a waiting row takes its entry out and a span joined at once
        # writes none (the full index on snapshot_id it replaces was read for nothing else).
        Index(
            "ix_otlp_spans_waiting",
            "received_at",
            "key",
            sqlite_where=text("snapshot_id IS NULL"),
            postgresql_where=text("snapshot_id IS NULL"),
        ),
    )

    key: str = Field(primary_key=True, max_length=300)
    response_id: str | None = Field(default=None, max_length=256, index=True)
    snapshot_id: str | None = Field(default=None, max_length=64)
    span_json: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    pending_json: list[Any] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    received_at: datetime = Field(default_factory=utcnow)


class ReviewerPreference(SQLModel, table=True):
    """A reviewer's remembered choice on a page (lib.preferences), e.g. the review page's queue and
    filters: kept in the database so a reload, a new tab or another device starts where they were."""

    __tablename__ = "reviewer_preferences"
    __table_args__ = (UniqueConstraint("reviewer", "name", name="uq_reviewer_preference"),)

    id: int | None = Field(default=None, primary_key=True)
    reviewer: str = Field(max_length=320)
    name: str = Field(max_length=64)  # which choice, e.g. "review"
    value: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    updated_at: datetime = Field(default_factory=utcnow)


WEBHOOK_EVENTS = ("judgment.reviewed", "judgment.overruled", "judgment.undone", "judgment.adjudicated")
DELIVERY_STATUSES = ("pending", "delivered", "failed")


class Webhook(SQLModel, table=True):
    """A URL a lead registered to hear about reviews (lib.webhooks); its signing secret is encrypted."""

    __tablename__ = "webhooks"

    id: int | None = Field(default=None, primary_key=True)
    url: str = Field(max_length=2000)
    events: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    description: str = Field(default="", max_length=200)
    secret_encrypted: str = Field(sa_column=Column(Text, nullable=False))  # Fernet token (lib.webhooks)
    active: bool = True
    created_by: str = Field(max_length=320)
    created_at: datetime = Field(default_factory=utcnow)
    disabled_at: datetime | None = Field(default=None)


class WebhookDelivery(SQLModel, table=True):
    """One event for one webhook: the outbox row written with the review, then its delivery state.

    The worker picks rows by (status, next_attempt_at); each attempt is a `WebhookAttempt`.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)

    id: int | None = Field(default=None, primary_key=True)
    webhook_id: int = Field(foreign_key="webhooks.id", index=True)
    event: str = Field(max_length=64)
    event_id: str = Field(max_length=64)  # the same for every webhook told of one event
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    status: str = Field(default="pending", max_length=16)
    attempts: int = 0
    next_attempt_at: datetime | None = Field(default=None)
    last_status_code: int | None = None
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow)
    delivered_at: datetime | None = Field(default=None)


class WebhookAttempt(SQLModel, table=True):
    """One HTTP attempt of a delivery: when, the response code (None: no response), how long it took."""

    __tablename__ = "webhook_attempts"

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: int = Field(foreign_key="webhook_deliveries.id", index=True)
    at: datetime = Field(default_factory=utcnow)
    status_code: int | None = None
    error: str | None = Field(default=None, sa_column=Column(Text))
    duration_ms: int = 0
