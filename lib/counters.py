"""Counters maintained on write: what the Overview, Corrections and review-queue figures read.

Counting a million judgments on every page rerun grows with the data (issue 19: 40 s on Overview
at 1M). Instead, every write path adjusts small tables in its own transaction, and the pages read
rows in proportion to products × metrics × days, never to evaluations or judgments:

- `product_counts`: per product, live and archived evaluations and their evidence by state;
- `judgment_day_counts`: per product × metric × day judged, judgments, reviewed, corrected and
  second-opinion outcomes (trends, Corrections' statistics);
- `judgment_language_counts`: the same per product × metric × language (Overview totals and the
  queue's progress, which filters by language);
- `judgment_reviewer_counts`: the same per reviewer × product × metric × day (the Corrections
  page's statistics and list count under its Reviewer filter);
- per evaluation, `judgments_total`, `judgments_reviewed`, `judgments_corrected` and
  `judged_metrics` on `evaluation_snapshots` itself, inside the Evaluations list index, so the
  list's review-state and metric filters read the index instead of probing judgments per row;
- per evaluation, `reviewer_decisions` (its reviewers' decisions as one JSON object, latest review
  first: `reviewer_decisions_sql`), which the wide CSV export reads with the row instead of
  reading the evaluation's judgments (issue 27: a third of the 1M export's CPU);
- `evaluation_counts`: evaluations per combination of every value the Evaluations list filters on
  but dates and text (product, language, model, category, judged metrics, largest gap in halves,
  review and evidence state, archived), so the list counts any such combination exactly from a few
  hundred rows (issue 27). The states are `EVALUATION_STATES`, defined here once for the list's
  filters and these rows alike.

Only live judgments count (seed 002 AD-13: an archived evaluation's judgments drop out), and
"reviewed" means `reviewed_at` is set, "corrected" reviewed and `was_corrected`. These definitions
live here and in `rebuild_*` below; nowhere else.

How writers keep them right: a write that may change judgments runs inside `judgments_change`
(retract the rows' contribution, write, add it back: set-based `INSERT … SELECT … GROUP BY … ON
CONFLICT DO UPDATE SET n = n + excluded.n`, atomic on SQLite and PostgreSQL alike, so concurrent
writers never lose an increment); a review, the hot path, adds its known delta (`bump_review`).
Archive and restore run inside `snapshots_change`. Bulk inserts call `judgments_added` once per batch;
the evaluation importer writes new evaluations with their own counters already stated
(`new_evaluation_counters`) and adds only their judgments (`include_judgments`), once per batch (a
large SQLite load that dropped its indexes calls `rebuild_counts` once after it instead). Any
judgment or evaluation written through an ORM flush (the judge, re-judging, second opinions, the
coach, tests) is counted by the flush hooks at the end of this module, so no ORM writer can forget.

`python -m lib recount` rebuilds everything derived from scratch by calling every function in
`REBUILDS`, in registration order. **Another derived table registers its own rebuild with
`@register_rebuild("name")`** and `recount` picks it up; nothing else needs to change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    Table,
    and_,
    bindparam,
    case,
    cast,
    delete,
    event,
    func,
    inspect,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import ColumnElement
from sqlmodel import Session, col

from lib import bulk, prepared, scores, version_counts
from lib.bulk import dialect_name
from lib.locks import PG_REVIEW_COUNTERS_LOCK, one_writer_per_product
from lib.models import (
    EvaluationCount,
    EvaluationSnapshot,
    JudgeVerdict,
    Judgment,
    JudgmentDayCount,
    JudgmentLanguageCount,
    JudgmentOutcomeCounts,
    JudgmentReviewerCount,
    ProductCount,
    all_reviewed,
)

_S = EvaluationSnapshot
_J = Judgment
_DAY: Table = JudgmentDayCount.__table__  # type: ignore[attr-defined]
_LANGUAGE: Table = JudgmentLanguageCount.__table__  # type: ignore[attr-defined]
_REVIEWER: Table = JudgmentReviewerCount.__table__  # type: ignore[attr-defined]
_JUDGMENT_TABLES = (_DAY, _LANGUAGE, _REVIEWER)
_PRODUCT: Table = ProductCount.__table__  # type: ignore[attr-defined]
_EVALUATIONS: Table = EvaluationCount.__table__  # type: ignore[attr-defined]

CORRECTED_OF_REVIEWED_LABEL = "Corrected of reviewed"
CORRECTED_OF_REVIEWED_HELP = (
    "Corrected of reviewed = corrected ÷ reviewed: the share of the judgments reviewers looked at "
    "that they overruled. Unreviewed judgments are not counted."
)
JUDGMENT_VALUES: tuple[str, ...] = tuple(JudgmentOutcomeCounts.model_fields)
SECOND_OPINION_OUTCOMES = ("validated", "improved", "questioned")


# Where counters cannot answer a filter, lists count at most this many matches and say "10,000+".
COUNT_CAP = 10_000
# A text-filtered list stops lower ("1,000+"; issue 19): its count reads one index entry per match
# (SQLite's FTS rowids, PostgreSQL's walk testing each row's text), and a phrase in a fifth of 1M
# rows would otherwise read 10,001 of them on every rerun, growing with the data up to the cap.
TEXT_COUNT_CAP = 1_000


def count_label(total: int, cap: int | None = None) -> str:
    """ "1,234", or "10,000+" for a count that stopped at `cap` (a capped count returns `cap` + 1)."""
    cap = COUNT_CAP if cap is None else cap
    return f"{cap:,}+" if total > cap else f"{total:,}"


def count_is_capped(total: int, cap: int | None = None) -> bool:
    """True for a count that stopped at `cap`: more rows match, so a pager pages on past it."""
    return total > (COUNT_CAP if cap is None else cap)


def corrected_of_reviewed(corrected: int, reviewed: int) -> float | None:
    """What the pages show (issue 15): corrected ÷ reviewed; None before anything is reviewed.

    Not seed 004's `correction_rate` (corrected ÷ every judgment, `lib.corrections.stats`), which
    unreviewed judgments dilute: the pages label this one "Corrected of reviewed" (issue 25).
    """
    return corrected / reviewed if reviewed else None


# ---------------------------------------------------------------------------------------------
# The definitions: a judgment's key and contribution


def day_of(session: Session, column: Any) -> Any:
    """The UTC day of a timestamp column as 'YYYY-MM-DD' text, in this session's SQL dialect."""
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD")
    return func.substr(column, 1, 10)  # SQLite stores UTC text "YYYY-MM-DD HH:MM:SS.ffffff"


def reviewed_judgment() -> ColumnElement[bool]:
    """The one "reviewed" predicate (a review time is set): the counters, the Corrections list and
    the queue all filter by it, so a count and the list under it cannot disagree."""
    return col(_J.reviewed_at).is_not(None)


def _judgment_values(sign: int) -> dict[str, Any]:
    """Each counter's aggregate over a group of judgments, times `sign` (−1 retracts)."""
    reviewed = reviewed_judgment()

    def count_if(cond: Any) -> Any:
        return func.coalesce(func.sum(case((cond, sign), else_=0)), 0)

    action = col(_J.second_opinion_action)
    return {
        "judgments": func.count() * sign,
        "reviewed": count_if(reviewed),
        "corrected": count_if(reviewed & col(_J.was_corrected)),
        "opinion_validated": count_if(action == "validated"),
        "opinion_improved": count_if(action == "improved"),
        "opinion_questioned": count_if(action == "questioned"),
    }


def _judgment_keys(session: Session, table: Table) -> dict[str, Any]:
    metric = func.coalesce(col(_J.metric), "")
    if table is _DAY:
        return {"product": col(_J.product), "metric": metric, "day": day_of(session, col(_J.timestamp))}
    if table is _REVIEWER:
        return {
            "reviewer": func.coalesce(col(_J.reviewer), ""),
            "product": col(_J.product),
            "metric": metric,
            "day": day_of(session, col(_J.timestamp)),
        }
    return {"product": col(_J.product), "metric": metric, "language": func.coalesce(col(_S.language), "")}


def _insert(session: Session, table: Table) -> Any:
    return (postgresql if session.get_bind().dialect.name == "postgresql" else sqlite).insert(table)


def _upsert_add(
    session: Session, table: Table, keys: dict[str, Any], values: dict[str, Any], where: Any
) -> None:
    """INSERT … SELECT keys, aggregates … GROUP BY keys ON CONFLICT DO UPDATE SET v = v + excluded.v.

    Key order: PostgreSQL locks each counter row as the upsert reaches it, in the order the SELECT
    yields them, which without an ORDER BY is the aggregate's (a hash order, not the same in a
    custom and a generic plan of one prepared statement). Every multi-row counter upsert here, in
    lib.scores and in lib.version_counts orders by its key, so one statement never locks rows in
    another's reverse order. Across statements that is not enough: reviews, which move counters
    once per judgment, serialise on `PG_REVIEW_COUNTERS_LOCK`, taken before their judgment's UPDATE
    (`lib.corrections._write_review_state`).
    """
    session.execute(_upsert_add_statement(session, table, keys, values, where))


def _upsert_add_statement(
    session: Session, table: Table, keys: dict[str, Any], values: dict[str, Any], where: Any
) -> Any:
    source = (
        select(*(e.label(k) for k, e in keys.items()), *(e.label(k) for k, e in values.items()))
        .select_from(_J)
        .outerjoin(_S, col(_S.id) == col(_J.snapshot_id))
        .where(col(_S.deleted_at).is_(None), where)  # a WHERE is required: SQLite's upsert parse rule
        .group_by(*keys.values())
        .order_by(*keys.values())  # key order (_upsert_add)
    )
    stmt = _insert(session, table).from_select([*keys, *values], source)
    return stmt.on_conflict_do_update(
        index_elements=list(keys), set_={k: table.c[k] + stmt.excluded[k] for k in values}
    )


def _shift_judgments(session: Session, where: Any, sign: int, *, unreviewed: bool = False) -> None:
    """Add (`sign` 1) or retract (−1) the contribution of the live judgments matching `where`
    (`unreviewed`: none of them is reviewed, `version_counts.shift`)."""
    for table in _JUDGMENT_TABLES:
        prepared.run(
            session, where, ("judgments", table.name, sign),
            lambda w, table=table: _upsert_add_statement(
                session, table, _judgment_keys(session, table), _judgment_values(sign), w
            ),
        )  # fmt: skip
    version_counts.shift(session, where, sign, unreviewed=unreviewed)


def include_judgments(*, session: Session, where: Any, unreviewed: bool = False) -> None:
    """Count the live judgments matching `where` (after they were written). `unreviewed`: the
    caller wrote them unreviewed (an import's new judgments), which the per-version tables do not
    count (`version_counts.shift`)."""
    _shift_judgments(session, where, 1, unreviewed=unreviewed)


def retract_judgments(*, session: Session, where: Any) -> None:
    """Uncount the live judgments matching `where` (before they change or go)."""
    _shift_judgments(session, where, -1)


def metrics_spelled(dialect: str, column: str) -> str:
    """The SQL aggregate that spells `judged_metrics`: `,slug,slug,` of the distinct, non-null
    `column` values of a group, sorted as the database sorts; '' when there are none.

    The one spelling of that column: the per-evaluation update, the rebuild and an import's new
    evaluations all aggregate through it, so they cannot disagree (the list's metric filter,
    `metric_judged`, reads what they write). SQLite's group_concat keeps its input's order, so the
    rows it aggregates must come distinct and sorted by `column`; PostgreSQL sorts (its collation
    may not be code-point order).
    """
    if dialect == "postgresql":
        return f"COALESCE(',' || string_agg({column}, ',' ORDER BY {column}) || ',', '')"
    return f"COALESCE(',' || group_concat({column}, ',') || ',', '')"


def _metrics_list(session: Session) -> Any:
    """An evaluation's `judged_metrics` from its judgments (correlated to `evaluation_snapshots`)."""
    return text(
        f"(SELECT {metrics_spelled(dialect_name(session), 'm')} FROM (SELECT DISTINCT j.metric AS m "
        "FROM judgments j WHERE j.snapshot_id = evaluation_snapshots.id AND j.metric IS NOT NULL "
        "ORDER BY m) AS judged)"
    )


def reviewer_decisions_sql(dialect: str, evaluation_id: str = "evaluation_snapshots.id") -> str:
    """The SQL (a correlated scalar subquery) of `reviewer_decisions`: the reviewed decisions of the
    evaluation whose id is `evaluation_id`, as one JSON object text (metric: decision), latest review
    first (a later entry of the same metric is an older review); NULL before any reviewed decision.

    The one definition of that column: a review (`bump_review`), a recompute (`refresh_snapshots`)
    and the rebuild all write it, so they cannot disagree. The wide export hands the column to DuckDB,
    whose `json_extract_string` takes a metric's first entry: the last review, as the in-session
    path's `lib.inspector._decision_columns` has it. A review order ties on its time, then puts an
    overrule before a confirmation, then orders by metric and id, as the export has always read it
    (through `ix_judgment_snapshot_state`, whose columns these are). SQLite's json_group_object keeps
    its input's order (the inner ORDER BY); PostgreSQL orders inside the aggregate.
    """
    reviewed = (
        f"j.snapshot_id = {evaluation_id} AND j.reviewed_at IS NOT NULL AND j.metric IS NOT NULL "
        "AND j.user_decision IS NOT NULL"
    )
    latest_first = "j.reviewed_at DESC, j.was_corrected DESC, j.metric DESC, j.id DESC"
    if dialect == "postgresql":
        return (
            f"(SELECT CAST(json_object_agg(j.metric, j.user_decision ORDER BY {latest_first}) AS text) "
            f"FROM judgments AS j WHERE {reviewed})"
        )
    return (
        "(SELECT NULLIF(json_group_object(d.metric, d.user_decision), '{}') FROM (SELECT j.metric, "
        f"j.user_decision FROM judgments AS j WHERE {reviewed} ORDER BY {latest_first}) AS d)"
    )


def _reviewer_decisions(session: Session) -> Any:
    """An evaluation's `reviewer_decisions` from its judgments (correlated to `evaluation_snapshots`)."""
    return text(reviewer_decisions_sql(dialect_name(session)))


def _locks_rows(session: Session) -> bool:
    """Row locks matter on PostgreSQL only: SQLite serialises writers on the database file."""
    return session.get_bind().dialect.name == "postgresql"


def lock_judgments(*, session: Session, where: Any) -> None:
    """`SELECT … FOR UPDATE` the judgments matching `where`, in id order (PostgreSQL).

    The one lock order of every counter writer: judgments, then their evaluations (`lock_snapshots`),
    then counter rows, these too in one order: the product's (`product_counts`), the evaluations'
    (`evaluation_counts`), then the judgments' (day, language, reviewer, judge-version rows). A review takes them in that order too (its versioned UPDATE, `bump_review`),
    after `PG_REVIEW_COUNTERS_LOCK`, which only reviews take, so two writers wait for each other
    instead of deadlocking.
    """
    if _locks_rows(session):
        prepared.run(
            session,
            where,
            ("lock judgments",),
            lambda w: select(_J.id).where(w).order_by(col(_J.id)).with_for_update(),
        )


def lock_snapshots(*, session: Session, where: Any) -> None:
    """`SELECT … FOR UPDATE` the evaluations matching `where`, in id order (PostgreSQL; see lock_judgments)."""
    if _locks_rows(session):
        prepared.run(
            session,
            where,
            ("lock evaluations",),
            lambda w: select(_S.id).where(w).order_by(col(_S.id)).with_for_update(),
        )


def _snapshots_of(where: Any) -> Any:
    """The evaluations of the judgments matching `where`."""
    return col(_S.id).in_(select(_J.snapshot_id).where(where, col(_J.snapshot_id).is_not(None)))


def refresh_snapshots(*, session: Session, where: Any) -> None:
    """Recompute the per-evaluation counters of the evaluations matching `where` from their judgments.

    Used by the rarer writes (imports, the judge, re-judging, clearing a product); a review adds
    its delta instead (`bump_review`), so concurrent reviews of one evaluation stay exact. Its
    `reviewer_decisions` too: whatever may change a judgment's review state comes through here or
    through `bump_review` (archive and restore change no decision: they keep theirs).
    """
    # Lock the rows in a statement of their own first (PostgreSQL): an UPDATE that waits on a
    # review's `bump_review` re-checks only the row, not its subqueries, and would write counts from
    # before that review committed over its +1. The next statement sees the review committed.
    lock_snapshots(session=session, where=where)
    _shift_evaluations(session, where, -1)
    _recount_rows(session, where)
    _shift_evaluations(session, where, 1)


def _recount_rows(session: Session, where: Any) -> None:
    """The UPDATE of `refresh_snapshots`: the evaluations' counter columns from their judgments (their
    `evaluation_counts` rows moved around it by the caller)."""
    prepared.run(
        session, where, ("refresh evaluations",),
        lambda w: update(_S).where(w).values(refreshed_columns(session)).execution_options(synchronize_session=False),
    )  # fmt: skip


def refreshed_columns(session: Session) -> dict[str, Any]:
    """The per-evaluation counter columns recomputed from the evaluation's judgments, as SQL
    correlated to `evaluation_snapshots`: what `refresh_snapshots` sets. A writer that updates the
    evaluations' rows anyway once it has added their judgments sets these in that same UPDATE,
    inside `gaps_change` (which moves their `evaluation_counts` and locks them as a refresh does),
    instead of a refresh after it (lib.importer's late verdicts: three statements fewer a request)."""

    def count(*conds: Any) -> Any:
        return (
            select(func.count())
            .select_from(_J)
            .where(col(_J.snapshot_id) == col(_S.id), *conds)
            .scalar_subquery()
        )

    return {
        "judgments_total": count(),
        "judgments_reviewed": count(reviewed_judgment()),
        "judgments_corrected": count(reviewed_judgment(), col(_J.was_corrected)),
        "judged_metrics": _metrics_list(session),
        "reviewer_decisions": _reviewer_decisions(session),
    }


def new_evaluation_counters(
    *, session: Session, metrics_by_snapshot: Mapping[str, Sequence[str | None]]
) -> dict[str, dict[str, Any]]:
    """The per-evaluation counter columns of evaluations about to be inserted with their judgments,
    stated in the rows themselves (snapshot id → column values), so that a bulk insert needs no
    `refresh_snapshots` afterwards: one UPDATE of every new row, through every list index.

    `metrics_by_snapshot` names each new evaluation's judgments by metric. They are all new and
    unreviewed (an import's), and the evaluation is new, so they are all it has (the foreign key
    lets no stored judgment point at an evaluation not stored yet): total = their count, reviewed
    and corrected 0, `judged_metrics` spelled by the database (`metrics_spelled`, `_spelled`), once
    per distinct set of metrics, and no `reviewer_decisions` (NULL, the column's default: nothing
    reviewed), so an import writes no more than before for it.
    """
    sets = {snapshot_id: frozenset(m for m in metrics if m is not None) for snapshot_id, metrics in
            metrics_by_snapshot.items()}  # fmt: skip
    spelled = _spelled(session, set(sets.values()))
    return {
        snapshot_id: {
            "judgments_total": len(metrics_by_snapshot[snapshot_id]),
            "judgments_reviewed": 0,
            "judgments_corrected": 0,
            "judged_metrics": spelled[metrics],
        }
        for snapshot_id, metrics in sets.items()
    }


# The dialect's attribute holding its database's spellings of metric sets (`_spelled`): per engine.
_SPELLINGS = "_overrule_judged_metrics_spellings"
SPELLINGS_KEPT = 4096  # distinct metric sets remembered per engine (a handful per product in practice)


def _spelled(session: Session, metric_sets: set[frozenset[str]]) -> dict[frozenset[str], str]:
    """Each set's `judged_metrics` as the database spells it (`metrics_spelled`), asked once per
    set and engine: the spelling depends on the set and the database's ordering only, and every
    import of a product repeats the same few sets, so asking again cost a statement an import
    (issue 29: an OTLP log request is an import of ~100 evaluations, 98 of them per 10,000).

    Kept on the engine's dialect object (one per engine, so per database: PostgreSQL orders by the
    database's collation), as `lib.bulk.row_binder` keeps its binders; bounded by SPELLINGS_KEPT.
    """
    dialect = bulk.dialect_of(session)
    kept: dict[frozenset[str], str] = bulk.kept_on(dialect, _SPELLINGS)
    found: dict[frozenset[str], str] = {}
    missing: list[frozenset[str]] = []
    for metrics in metric_sets:
        spelling = kept.get(metrics)
        if spelling is None:
            missing.append(metrics)
        else:
            found[metrics] = spelling
    if missing:
        name = dialect.name
        spell = prepared.built(session, ("spell judged metrics",), lambda: _spell_statement(name))
        if len(kept) + len(missing) > SPELLINGS_KEPT:
            kept.clear()
        for metrics in missing:
            given = sorted(metrics) if name == "postgresql" else json.dumps(sorted(metrics))
            found[metrics] = kept[metrics] = session.execute(spell, {"metrics": given}).scalar_one()
    return found


def _spell_statement(dialect: str) -> Any:
    rows = (
        "SELECT DISTINCT m FROM unnest(CAST(:metrics AS VARCHAR[])) AS given(m) ORDER BY m"
        if dialect == "postgresql"
        else "SELECT DISTINCT value AS m FROM json_each(:metrics) ORDER BY m"
    )
    return text(f"SELECT {metrics_spelled(dialect, 'm')} FROM ({rows}) AS judged")


@contextmanager
def judgments_change(*, session: Session, where: Any, snapshots: Any = None) -> Iterator[None]:
    """Around a write that may change or delete the judgments matching `where`: counters follow it.

    `snapshots` selects the evaluations whose counters to recompute afterwards; by default those
    of the judgments matching `where` (pass it when the write deletes them). The write must leave
    the judgments in their evaluations: those are taken out of `evaluation_counts` before it.

    PostgreSQL: a review of several judgments at once (a bulk review; clearing a product), so it
    takes the reviews' lock first (`PG_REVIEW_COUNTERS_LOCK`): it moved the judgments' day and
    language rows, then the evaluations' `evaluation_counts` rows, while a review moves the
    evaluation's row before its judgment's rows: a lock cycle in locks1's hammer. Its counter rows
    go in the one order (`lock_judgments`): the evaluations' `evaluation_counts` rows before the
    judgments' rows, as an import and an archive take them; the rows the evaluations join after the
    write are the one exception (they are not known before it), and with the reviews' lock held no
    review waits on them.
    """
    evaluations = _snapshots_of(where) if snapshots is None else snapshots
    if _locks_rows(session):  # the reviews' lock of each product the judgments are of
        products = session.execute(select(_J.product).where(where).distinct()).scalars()
        one_writer_per_product(session, PG_REVIEW_COUNTERS_LOCK, list(products))
    # Lock the rows first (PostgreSQL): a concurrent review then commits before we count, or after we wrote.
    lock_judgments(session=session, where=where)
    lock_snapshots(session=session, where=evaluations)
    _shift_evaluations(session, evaluations, -1)
    retract_judgments(session=session, where=where)
    try:
        yield
    except BaseException:
        _restore(
            session,
            lambda: (
                include_judgments(session=session, where=where),
                _shift_evaluations(session, evaluations, 1),
            ),
        )
        raise
    session.flush()
    _recount_rows(session, evaluations)
    _shift_evaluations(session, evaluations, 1)
    include_judgments(session=session, where=where)


def _restore(session: Session, undo: Callable[[], Any]) -> None:
    """Give back a retraction when the write failed: a caller that catches the error and commits
    must not commit half a change. A transaction the database already aborted is left as it is."""
    with suppress(Exception):  # the original error is the one to report
        undo()


def judgments_added(*, session: Session, where: Any, snapshots: Any = None) -> None:
    """After a bulk insert of judgments (one set-based statement per counter table, per batch).

    `snapshots` (evaluations matching it) is the batch's evaluations when the caller knows them.
    The evaluations' rows and `evaluation_counts` first, the judgments' counter rows after: the one
    order of counter rows (`lock_judgments`), which a review and an import keep too.
    """
    if snapshots is None:
        snapshots = prepared.derived(where, "evaluations of", _snapshots_of)
    refresh_snapshots(session=session, where=snapshots)
    include_judgments(session=session, where=where)


_BATCH_TEMPLATES: dict[tuple[str, str, str], Any] = {}


def batch(session: Session, column: Any, ids: Sequence[Any]) -> Any:
    """`lib.bulk.among(column, ids)` (an import's batch) as a template (lib.prepared): the counters'
    statements for a batch are built once, not for every batch. The ids are one array (PostgreSQL)
    or JSON (SQLite) parameter however many there are: an IN list of one parameter each failed past
    psycopg's 65,535 parameters a statement (late verdicts for a large project, review12 F0)."""
    key = (dialect_name(session), column.table.name, column.key)
    template = _BATCH_TEMPLATES.get(key)
    if template is None:
        template = _BATCH_TEMPLATES[key] = bulk.among_template(session, column, "batch_ids")
    return prepared.Among(("batch", *key[1:]), template, {"batch_ids": bulk.among_value(session, ids)})


@dataclass(frozen=True)
class ReviewSide:
    """A judgment's review side as the counters key and count it: who, and whether reviewed / corrected."""

    reviewer: str | None
    reviewed: bool
    corrected: bool  # reviewed and overruled
    decision: str | None = None  # the reviewer's decision when reviewed (agreement by judge version)


def bump_review(
    *, session: Session, judgment_id: int, snapshot_id: str | None, before: ReviewSide, after: ReviewSide
) -> None:
    """A review's known change (`before` → `after`), after its UPDATE succeeded, by atomic increments.

    The evaluation's row is updated before any counter row (the lock order of `lock_judgments`):
    on PostgreSQL that lock orders a review behind a concurrent archive or restore of the same
    evaluation, whose retraction then sees the review committed. The judge-version counts move
    last, like every other counter row: moved before that lock, they read the evaluation as live
    while an archive of it was uncommitted and kept the review of an archived evaluation (review8
    F1). A review that changes the judgment's reviewer moves it between two reviewer rows. The
    evaluation's `reviewer_decisions` is recomputed in the same UPDATE (`_bump_snapshot`).
    """
    # PostgreSQL: the caller holds PG_REVIEW_COUNTERS_LOCK from before its first judgment UPDATE to
    # commit (lib.corrections._write_review_state, the one write of a review state). A transaction
    # that settles several judgments (a queue item's metrics) moves rows of version_counts,
    # evaluation_counts and the judgment counters once per judgment, so two such transactions took
    # shared rows (one product x metric x day, one evaluation state) in interleaved orders: 3
    # reviewers x 100 two-metric items x 2 labels deadlocked in 1 run of 4.
    reviewed = int(after.reviewed) - int(before.reviewed)
    corrected = int(after.corrected) - int(before.corrected)
    if snapshot_id is not None:
        _bump_snapshot(session, snapshot_id, reviewed, corrected)
    if reviewed or corrected:
        for table in (_DAY, _LANGUAGE):
            upsert = prepared.built(
                session,
                (table.name, reviewed, corrected),
                lambda table=table: _upsert_add_statement(
                    session, table, _judgment_keys(session, table),
                    {"reviewed": func.count() * reviewed, "corrected": func.count() * corrected},
                    col(_J.id) == bindparam("judgment_id"),
                ),
            )  # fmt: skip
            session.execute(upsert, {"judgment_id": judgment_id})
    old, new = before.reviewer or "", after.reviewer or ""
    if old == new:
        if reviewed or corrected:
            _add_to_row(session, new, {"reviewed": reviewed, "corrected": corrected}, judgment_id)
    else:
        # Another reviewer: the whole judgment moves rows, its second-opinion outcome with it (a
        # review leaves that as it was, so the row's current value is the one to move).
        _add_to_row(
            session, old,
            {"judgments": -1, "reviewed": -int(before.reviewed), "corrected": -int(before.corrected)},
            judgment_id, opinions=-1,
        )  # fmt: skip
        _add_to_row(
            session, new,
            {"judgments": 1, "reviewed": int(after.reviewed), "corrected": int(after.corrected)},
            judgment_id, opinions=1,
        )  # fmt: skip
    version_counts.move_review(
        session,
        judgment_id,
        before.decision if before.reviewed else None,
        after.decision if after.reviewed else None,
    )


def _bump_snapshot(session: Session, snapshot_id: str, reviewed: int, corrected: int) -> None:
    """A review's change on its evaluation's row: the counters plus the review's delta, and its
    `reviewer_decisions` recomputed, in one UPDATE (every review, also one that moves no counter:
    an overrule of a reviewed judgment, or its undo, changes the decisions alone).

    PostgreSQL: the row is locked first, in a statement of its own, as `refresh_snapshots` does.
    The UPDATE then starts after every writer that held the row committed, and its recompute sees
    their judgments: an UPDATE that waited on the row would re-check the row only, not its
    subquery, and write decisions from before that writer's commit. Concurrent reviews are already
    serialised (`PG_REVIEW_COUNTERS_LOCK`) and each adds its counters' delta to the row as written.
    """
    params = {"snapshot_id": snapshot_id}
    if _locks_rows(session):
        lock = prepared.built(
            session,
            ("lock evaluation",),
            # FOR NO KEY UPDATE: the UPDATE below changes no key, so a transaction that inserted a row
            # referencing this evaluation (a queue item, a chat message: their foreign keys take FOR KEY
            # SHARE) need not finish first; FOR UPDATE waited on it, holding every review behind it.
            lambda: (
                select(_S.id).where(col(_S.id) == bindparam("snapshot_id")).with_for_update(key_share=True)
            ),
        )
        session.execute(lock, params)
    counted = bool(reviewed or corrected)
    # When the evaluation changes review state (most reviews leave it as it was: the UPDATE
    # returns whether it did, no second statement), it moves between `evaluation_counts` rows,
    # stated from the row this UPDATE locked (before: the counters minus this review's change),
    # so concurrent reviews add up. The write lock is held as briefly as before (SQLite: one writer).
    returning = counted and prepared.update_returning(session)
    update_snapshot = prepared.built(
        session,
        ("snapshot", reviewed, corrected, returning),
        lambda: _snapshot_bump(session, reviewed, corrected, returning=returning),
    )
    moved = session.execute(update_snapshot, params)
    if not counted:
        return  # no counter moved: the review state cannot have
    if not returning:
        moved = session.execute(
            prepared.built(
                session, ("snapshot moved", reviewed, corrected), lambda: _snapshot_moved(reviewed, corrected)
            ),
            params,
        )
    if moved.scalar():
        for sign, offsets in ((-1, (reviewed, corrected)), (1, (0, 0))):
            shift = prepared.built(
                session,
                ("evaluations", sign, *offsets),
                lambda sign=sign, offsets=offsets: _shift_evaluations_statement(
                    session, col(_S.id) == bindparam("snapshot_id"), sign,
                    reviewed_offset=offsets[0], corrected_offset=offsets[1],
                ),
            )  # fmt: skip
            session.execute(shift, params)


def _snapshot_bump(session: Session, reviewed: int, corrected: int, *, returning: bool) -> Any:
    """The evaluation's counters plus a review's change and its decisions recomputed, returning
    whether its review state moved (`returning`; else `_snapshot_moved` reads it after the UPDATE,
    in the same transaction)."""
    values: dict[str, Any] = {"reviewer_decisions": _reviewer_decisions(session)}
    if reviewed:
        values["judgments_reviewed"] = col(_S.judgments_reviewed) + reviewed
    if corrected:
        values["judgments_corrected"] = col(_S.judgments_corrected) + corrected
    stmt = (
        update(_S.__table__)  # type: ignore[attr-defined]
        .where(col(_S.id) == bindparam("snapshot_id"))
        .values(**values)
    )
    return stmt.returning(_review_state_moved(reviewed, corrected)) if returning else stmt


def _snapshot_moved(reviewed: int, corrected: int) -> Any:
    """Whether the evaluation's review state moved with the review just added to its counters."""
    moved = _review_state_moved(reviewed, corrected)
    return select(moved).where(col(_S.id) == bindparam("snapshot_id"))


def _review_state_moved(reviewed: int, corrected: int) -> Any:
    """True when the counters as written (after the review) and as they were (minus its change) give
    the evaluation different review states."""
    offsets = {"reviewed_offset": reviewed, "corrected_offset": corrected}
    return or_(*(review_state(s, **offsets) != review_state(s) for s in REVIEW_STATE_NAMES))


def _opinions(sign: int) -> dict[str, Any]:
    """A judgment's second-opinion outcome as one row's counter values, times `sign`."""
    action = col(_J.second_opinion_action)
    return {f"opinion_{o}": case((action == o, sign), else_=0) for o in SECOND_OPINION_OUTCOMES}


def _add_to_row(
    session: Session, reviewer: str, numbers: dict[str, int], judgment_id: int, *, opinions: int = 0
) -> None:
    """Add `numbers` (and, with `opinions` ±1, the judgment's second-opinion outcome) to the reviewer
    counter row of the one live judgment `judgment_id`, keyed by `reviewer` as given rather than
    read from the judgment: a review writes its reviewer before its counters move."""

    def build() -> Any:
        keys = {**_judgment_keys(session, _REVIEWER), "reviewer": bindparam("reviewer", type_=String())}
        values = {**{k: literal(v) for k, v in numbers.items()}, **(_opinions(opinions) if opinions else {})}
        source = (
            select(*(e.label(k) for k, e in keys.items()), *(v.label(k) for k, v in values.items()))
            .select_from(_J)
            .outerjoin(_S, col(_S.id) == col(_J.snapshot_id))
            .where(col(_S.deleted_at).is_(None), col(_J.id) == bindparam("judgment_id"))
        )
        stmt = _insert(session, _REVIEWER).from_select([*keys, *values], source)
        return stmt.on_conflict_do_update(
            index_elements=list(keys), set_={k: _REVIEWER.c[k] + stmt.excluded[k] for k in values}
        )

    stmt = prepared.built(session, ("reviewer", tuple(numbers.items()), opinions), build)
    session.execute(stmt, {"reviewer": reviewer, "judgment_id": judgment_id})


# ---------------------------------------------------------------------------------------------
# The Evaluations list's states and its counts per filter combination (`evaluation_counts`)

# Each review and evidence state the list filters on, as a condition on an evaluation's own
# counters (inside the list index): the list's filters and `evaluation_counts` both use these.
REVIEW_STATE_NAMES = ("pending", "reviewed", "corrected")
EVIDENCE_STATE_NAMES = ("unverified", "unlocated", "verified", "none")


def review_state(state: str, *, reviewed_offset: int = 0, corrected_offset: int = 0) -> ColumnElement[bool]:
    """An evaluation is "pending" while a judgment is unreviewed, "reviewed" once it has judgments
    and all are reviewed, "corrected" when a reviewer overruled one (reviewed = a review time is set).

    The offsets state it for the counters as they were before a review added them (`bump_review`).
    """
    total = col(_S.judgments_total)
    reviewed = col(_S.judgments_reviewed) - reviewed_offset if reviewed_offset else col(_S.judgments_reviewed)
    corrected = (
        col(_S.judgments_corrected) - corrected_offset if corrected_offset else col(_S.judgments_corrected)
    )
    if state == "pending":
        return reviewed < total
    if state == "reviewed":
        return all_reviewed(total, reviewed)
    if state == "corrected":
        return corrected > 0
    raise ValueError(f"unknown review state {state!r}; choose one of {', '.join(REVIEW_STATE_NAMES)}")


def evidence_state(state: str) -> ColumnElement[bool]:
    """Evidence "unverified" / "unlocated": some item is; "verified": there is some and none is
    unverified; "none": no item recorded."""
    count, unverified = col(_S.evidence_count), col(_S.evidence_unverified)
    if state == "unverified":
        return unverified > 0
    if state == "unlocated":
        return col(_S.evidence_unlocated) > 0
    if state == "verified":
        return and_(count > 0, unverified == 0)
    if state == "none":
        return count == 0
    raise ValueError(f"unknown evidence state {state!r}; choose one of {', '.join(EVIDENCE_STATE_NAMES)}")


def metric_judged(column: Any, metric: str) -> ColumnElement[bool]:
    """`column` (an evaluation's `,slug,slug,` of judged metrics) names `metric`."""
    return col(column).contains(f",{metric},", autoescape=True)


def gap_halves(session: Session) -> Any:
    """floor(2 × the evaluation's largest metric gap), -1 without a gap: `evaluation_counts`' gap key,
    exact for the list's minimum gaps in steps of 0.5 (`gap_halves_at_least`)."""
    gap = col(_S.max_metric_gap)
    # Gaps are >= 0, so SQLite's CAST (truncation) is floor; PostgreSQL's CAST would round.
    halves = func.floor(gap * 2) if session.get_bind().dialect.name == "postgresql" else gap * 2
    return case((gap.is_(None), -1), else_=cast(halves, Integer))


def gap_halves_at_least(min_gap: float) -> int | None:
    """The `gap_halves` key that "largest gap >= min_gap" means, or None when `min_gap` is no step
    of 0.5 (then the counts cannot answer it)."""
    halves = min_gap * 2
    return int(halves) if halves == int(halves) else None


def _evaluation_keys(
    session: Session, *, reviewed_offset: int = 0, corrected_offset: int = 0
) -> dict[str, Any]:
    offsets = {"reviewed_offset": reviewed_offset, "corrected_offset": corrected_offset}
    return {
        "archived": col(_S.deleted_at).is_not(None),
        "product": col(_S.product),
        "language": col(_S.language),
        "model_name": func.coalesce(col(_S.model_name), ""),
        "category": func.coalesce(col(_S.category), ""),
        "judged_metrics": col(_S.judged_metrics),
        "gap_halves": gap_halves(session),
        "has_weighted_gap": col(_S.weighted_gap).is_not(None),
        **{f"review_{s}": review_state(s, **offsets) for s in REVIEW_STATE_NAMES},
        **{f"evidence_{s}": evidence_state(s) for s in EVIDENCE_STATE_NAMES},
    }


def _shift_evaluations(
    session: Session, where: Any, sign: int, *, reviewed_offset: int = 0, corrected_offset: int = 0
) -> None:
    """Add (`sign` 1) or retract (−1) the evaluations matching `where` in `evaluation_counts`."""
    prepared.run(
        session, where, ("evaluations", sign, reviewed_offset, corrected_offset),
        lambda w: _shift_evaluations_statement(
            session, w, sign, reviewed_offset=reviewed_offset, corrected_offset=corrected_offset
        ),
    )  # fmt: skip


def _shift_evaluations_statement(
    session: Session, where: Any, sign: int, *, reviewed_offset: int = 0, corrected_offset: int = 0
) -> Any:
    keys = _evaluation_keys(session, reviewed_offset=reviewed_offset, corrected_offset=corrected_offset)
    source = (
        select(*(e.label(k) for k, e in keys.items()), (func.count() * sign).label("n"))
        .select_from(_S)
        .where(where)
        .group_by(*keys.values())
        .order_by(*keys.values())  # key order (_upsert_add)
    )
    stmt = _insert(session, _EVALUATIONS).from_select([*keys, "n"], source)
    return stmt.on_conflict_do_update(
        index_elements=list(keys), set_={"n": _EVALUATIONS.c.n + stmt.excluded.n}
    )


def evaluation_count(*, session: Session, where: Sequence[ColumnElement[bool]]) -> int:
    """How many evaluations the `evaluation_counts` rows matching `where` hold (conditions on
    `evaluation_counts_table()`'s columns)."""
    stmt = select(func.coalesce(func.sum(_EVALUATIONS.c.n), 0)).where(*where)
    return int(session.execute(stmt).scalar_one())


def evaluation_counts_table() -> Table:
    """`evaluation_counts`, for callers that state conditions on its columns."""
    return _EVALUATIONS


# ---------------------------------------------------------------------------------------------
# Evaluations per product


def _snapshot_values(sign: int) -> dict[str, Any]:
    live = col(_S.deleted_at).is_(None)

    def total(cond: Any, value: Any = 1) -> Any:
        return func.coalesce(func.sum(case((cond, value), else_=0)), 0) * sign

    return {
        "evaluations": total(live),
        "archived": total(~live),
        "evidence_total": total(live, col(_S.evidence_count)),
        "evidence_highlighted": total(live, col(_S.evidence_highlighted)),
        "evidence_unlocated": total(live, col(_S.evidence_unlocated)),
        "evidence_unverified": total(live, col(_S.evidence_unverified)),
    }


def _shift_snapshots(session: Session, where: Any, sign: int) -> None:
    def build(where: Any) -> Any:
        values = _snapshot_values(sign)
        source = select(col(_S.product).label("product"), *(e.label(k) for k, e in values.items()))
        # In key order (_upsert_add).
        source = source.where(where).group_by(col(_S.product)).order_by(col(_S.product))
        stmt = _insert(session, _PRODUCT).from_select(["product", *values], source)
        return stmt.on_conflict_do_update(
            index_elements=["product"], set_={k: _PRODUCT.c[k] + stmt.excluded[k] for k in values}
        )

    prepared.run(session, where, ("products", sign), build)


def _shift_snapshot_rows(session: Session, where: Any, sign: int) -> None:
    """The evaluations matching `where` in every per-evaluation counter table, times `sign`."""
    _shift_snapshots(session, where, sign)
    _shift_evaluations(session, where, sign)


def snapshots_added(*, session: Session, where: Any) -> None:
    """After inserting the evaluations matching `where` (before or after their judgments)."""
    _shift_snapshot_rows(session, where, 1)


@contextmanager
def snapshots_change(*, session: Session, where: Any) -> Iterator[None]:
    """Around archiving or restoring the evaluations matching `where`: they and their judgments move."""
    judgments = prepared.derived(
        where, "judgments of", lambda w: col(_J.snapshot_id).in_(select(_S.id).where(w))
    )
    # No reviews' lock here (PostgreSQL): an archive waits on its product's row while an import of
    # that product is open, and holding the one lock every review takes meanwhile stalled every
    # reviewer of every product for the rest of the import (review15 F1). The cycle an archive can
    # close with a bulk review or a re-judge is survived instead: lib.db.write_retrying runs the
    # victim again (docs/internals.md, Counters).
    # Lock the evaluations first (PostgreSQL): a concurrent review's `bump_review` waits for us or
    # has committed before we count, never in between.
    prepared.run(session, where, ("lock for change",), lambda w: select(_S.id).where(w).with_for_update())
    _shift_snapshot_rows(session, where, -1)
    retract_judgments(session=session, where=judgments)
    try:
        yield
    except BaseException:
        _restore(
            session,
            lambda: (
                _shift_snapshot_rows(session, where, 1),
                include_judgments(session=session, where=judgments),
            ),
        )
        raise
    session.flush()
    _shift_snapshot_rows(session, where, 1)
    include_judgments(session=session, where=judgments)


@contextmanager
def gaps_change(*, session: Session, where: Any) -> Iterator[None]:
    """Around a Core UPDATE of the gap columns (`weighted_gap`, `max_metric_gap`) of the evaluations
    matching `where` (`lib.snapshots.rederive_gaps`; late verdicts, with `refreshed_columns`):
    `evaluation_counts` keys an evaluation by its largest gap and whether it has a weighted gap, so
    they leave their old rows and join their new ones. Nothing else counted here depends on a gap
    (the scores tables keep raw scores)."""
    lock_snapshots(session=session, where=where)
    _shift_evaluations(session, where, -1)
    yield
    _shift_evaluations(session, where, 1)


# ---------------------------------------------------------------------------------------------
# Reads: rows in proportion to products × metrics × (days | languages)


@dataclass(frozen=True)
class JudgmentTotals:
    """Live judgments and their review outcomes, summed over some counter rows."""

    judgments: int = 0
    reviewed: int = 0
    corrected: int = 0
    opinion_validated: int = 0
    opinion_improved: int = 0
    opinion_questioned: int = 0

    @property
    def pending(self) -> int:
        return self.judgments - self.reviewed

    @property
    def second_opinions(self) -> int:
        return self.opinion_validated + self.opinion_improved + self.opinion_questioned

    @property
    def corrected_of_reviewed(self) -> float | None:
        return corrected_of_reviewed(self.corrected, self.reviewed)


def _sums(table: Table) -> list[Any]:
    return [func.coalesce(func.sum(table.c[k]), 0) for k in JUDGMENT_VALUES]


def _where(table: Table, **equal: str | None) -> list[Any]:
    return [table.c[k] == v for k, v in equal.items() if v is not None]


def judgment_totals(
    *,
    session: Session,
    product: str | None = None,
    metric: str | None = None,
    language: str | None = None,
    reviewer: str | None = None,
) -> JudgmentTotals:
    """Totals under optional product / metric / language or reviewer filters (None: any).

    `reviewer` is a judgment's reviewer ('' for judgments nobody reviewed); it cannot be combined
    with `language` (no counter row holds both).
    """
    if reviewer is not None:
        if language is not None:
            raise ValueError("judgment_totals counts by language or by reviewer, not both")
        where = _where(_REVIEWER, reviewer=reviewer, product=product, metric=metric)
        row = session.execute(select(*_sums(_REVIEWER)).where(*where)).one()
    else:
        where = _where(_LANGUAGE, product=product, metric=metric, language=language)
        row = session.execute(select(*_sums(_LANGUAGE)).where(*where)).one()
    return JudgmentTotals(*(int(v) for v in row))


@dataclass(frozen=True)
class ReviewerSummary:
    """One reviewer's live judgments (under optional product / metric filters): totals, products, days."""

    totals: JudgmentTotals
    products: list[str]
    first_day: str | None
    last_day: str | None


def reviewer_summary(
    *, session: Session, reviewer: str, product: str | None = None, metric: str | None = None
) -> ReviewerSummary:
    """Everything the Corrections statistics show under a Reviewer filter, in one pass over the
    reviewer's counter rows (products × metrics × days, whatever the judgments)."""
    has = _REVIEWER.c.judgments > 0
    rows = session.execute(
        select(
            _REVIEWER.c.product,
            *_sums(_REVIEWER),
            func.min(case((has, _REVIEWER.c.day))),
            func.max(case((has, _REVIEWER.c.day))),
        )
        .where(*_where(_REVIEWER, reviewer=reviewer, product=product, metric=metric))
        .group_by(_REVIEWER.c.product)
        .order_by(_REVIEWER.c.product)
    ).all()
    live = [(r[0], JudgmentTotals(*(int(v) for v in r[1:-2])), r[-2], r[-1]) for r in rows if int(r[1])]
    summed = [sum(getattr(t, k) for _, t, _, _ in live) for k in JUDGMENT_VALUES]
    return ReviewerSummary(
        totals=JudgmentTotals(*summed),
        products=[name for name, *_ in live],
        first_day=min((first for _, _, first, _ in live), default=None),
        last_day=max((last for _, _, _, last in live), default=None),
    )


def judgment_totals_by_product(*, session: Session) -> dict[str, JudgmentTotals]:
    """Totals per product that has (or had) live judgments."""
    rows = session.execute(
        select(_LANGUAGE.c.product, *_sums(_LANGUAGE))
        .group_by(_LANGUAGE.c.product)
        .order_by(_LANGUAGE.c.product)
    ).all()
    return {r[0]: JudgmentTotals(*(int(v) for v in r[1:])) for r in rows if int(r[1])}


def judgment_days(
    *, session: Session, product: str | None = None, metric: str | None = None
) -> list[tuple[str, str, int, int, int]]:
    """(product, day, judgments, reviewed, corrected) per product and day judged."""
    rows = session.execute(
        select(
            _DAY.c.product,
            _DAY.c.day,
            func.sum(_DAY.c.judgments),
            func.sum(_DAY.c.reviewed),
            func.sum(_DAY.c.corrected),
        )
        .where(*_where(_DAY, product=product, metric=metric), _DAY.c.judgments > 0)
        .group_by(_DAY.c.product, _DAY.c.day)
        .order_by(_DAY.c.product, _DAY.c.day)
    ).all()
    return [(p, d, int(n), int(r), int(c)) for p, d, n, r, c in rows]


def judged_products(*, session: Session) -> list[str]:
    """Products with live judgments, sorted."""
    stmt = (
        select(_LANGUAGE.c.product).where(_LANGUAGE.c.judgments > 0).distinct().order_by(_LANGUAGE.c.product)
    )
    return [str(p) for p in session.execute(stmt).scalars()]


def judged_metric_slugs(*, session: Session, products: Sequence[str]) -> list[str]:
    """Metrics judged (live) for any of these products, sorted."""
    stmt = (
        select(_LANGUAGE.c.metric)
        .where(_LANGUAGE.c.product.in_(list(products)), _LANGUAGE.c.judgments > 0, _LANGUAGE.c.metric != "")
        .distinct()
        .order_by(_LANGUAGE.c.metric)
    )
    return [str(m) for m in session.execute(stmt).scalars()]


def judged_languages(*, session: Session) -> list[str]:
    """Languages of evaluations with live judgments, sorted (stand-alone judgments have none)."""
    stmt = (
        select(_LANGUAGE.c.language)
        .where(_LANGUAGE.c.judgments > 0, _LANGUAGE.c.language != "")
        .distinct()
        .order_by(_LANGUAGE.c.language)
    )
    return [str(language) for language in session.execute(stmt).scalars()]


def judged_day_range(
    *, session: Session, product: str | None = None, metric: str | None = None
) -> tuple[str | None, str | None]:
    """The first and last day (UTC, 'YYYY-MM-DD') with live judgments."""
    first, last = session.execute(
        select(func.min(_DAY.c.day), func.max(_DAY.c.day)).where(
            *_where(_DAY, product=product, metric=metric), _DAY.c.judgments > 0
        )
    ).one()
    return first, last


@dataclass(frozen=True)
class EvaluationTotals:
    """Evaluations of one product (or all) and their evidence by verification state."""

    evaluations: int = 0
    archived: int = 0
    evidence_total: int = 0
    evidence_highlighted: int = 0
    evidence_unlocated: int = 0
    evidence_unverified: int = 0


_SNAPSHOT_VALUES = tuple(EvaluationTotals.__dataclass_fields__)


def evaluation_totals_by_product(*, session: Session) -> dict[str, EvaluationTotals]:
    """Per product with evaluations (live or archived)."""
    rows = session.execute(
        select(_PRODUCT.c.product, *(_PRODUCT.c[k] for k in _SNAPSHOT_VALUES)).order_by(_PRODUCT.c.product)
    ).all()
    return {r[0]: EvaluationTotals(*(int(v) for v in r[1:])) for r in rows if int(r[1]) or int(r[2])}


# ---------------------------------------------------------------------------------------------
# Rebuilding from scratch (`python -m lib recount`, the migration's backfill)

Rebuild = Callable[[Session], None]
REBUILDS: dict[str, Rebuild] = {}


def register_rebuild(name: str) -> Callable[[Rebuild], Rebuild]:
    """Register a derived table's rebuild under `name` for `recount` (any module may add one)."""

    def register(rebuild: Rebuild) -> Rebuild:
        REBUILDS[name] = rebuild
        return rebuild

    return register


@register_rebuild("product_counts")
def rebuild_product_counts(session: Session) -> None:
    """Per-product evaluation counters from every evaluation."""
    session.execute(delete(_PRODUCT))
    _shift_snapshots(session, literal(True), 1)


@register_rebuild("judgment_counts")
def rebuild_judgment_counts(session: Session) -> None:
    """Per product × metric × day and × language judgment counters from every live judgment.

    One grouped scan of the judgments (a few thousand groups come back), summed here into both
    tables: a 10M-judgment database is read once, not once per table.
    """
    session.execute(delete(_DAY))
    session.execute(delete(_LANGUAGE))
    keys = {**_judgment_keys(session, _DAY), "language": _judgment_keys(session, _LANGUAGE)["language"]}
    values = _judgment_values(1)
    grouped = session.execute(
        select(*(e.label(k) for k, e in keys.items()), *(e.label(k) for k, e in values.items()))
        .select_from(_J)
        .outerjoin(_S, col(_S.id) == col(_J.snapshot_id))
        .where(col(_S.deleted_at).is_(None))
        .group_by(*keys.values())
    ).mappings()
    days: dict[tuple[str, str, str], list[int]] = {}
    languages: dict[tuple[str, str, str], list[int]] = {}
    for row in grouped:
        numbers = [int(row[k]) for k in JUDGMENT_VALUES]
        for table, key in ((days, (row["product"], row["metric"], row["day"])),
                           (languages, (row["product"], row["metric"], row["language"]))):  # fmt: skip
            table[key] = [a + b for a, b in zip(table.get(key, [0] * len(numbers)), numbers, strict=True)]
    for table, found, names in ((_DAY, days, ("product", "metric", "day")),
                                (_LANGUAGE, languages, ("product", "metric", "language"))):  # fmt: skip
        rows = [
            dict(zip((*names, *JUDGMENT_VALUES), (*key, *numbers), strict=True))
            for key, numbers in found.items()
        ]
        for start in range(0, len(rows), 5000):
            session.execute(table.insert(), rows[start : start + 5000])


@register_rebuild("evaluation_review_counts")
def rebuild_evaluation_review_counts(session: Session) -> None:
    """Every evaluation's review counts and judged metrics from its judgments, in one grouped scan;
    only rows whose counts are wrong are written (a recount of a right database writes nothing)."""
    metrics = metrics_spelled(dialect_name(session), "metric")  # the inner rows come sorted by metric
    session.execute(
        text(
            f"""
            UPDATE evaluation_snapshots SET judgments_total = a.n, judgments_reviewed = a.r,
                judgments_corrected = a.c, judged_metrics = a.m
            FROM (
                SELECT snapshot_id, SUM(n) AS n, SUM(r) AS r, SUM(c) AS c, {metrics} AS m
                FROM (
                    SELECT snapshot_id, metric, COUNT(*) AS n,
                        SUM(CASE WHEN reviewed_at IS NOT NULL THEN 1 ELSE 0 END) AS r,
                        SUM(CASE WHEN reviewed_at IS NOT NULL AND was_corrected THEN 1 ELSE 0 END) AS c
                    FROM judgments WHERE snapshot_id IS NOT NULL
                    GROUP BY snapshot_id, metric ORDER BY snapshot_id, metric
                ) AS per_metric
                GROUP BY snapshot_id
            ) AS a
            WHERE evaluation_snapshots.id = a.snapshot_id AND (
                evaluation_snapshots.judgments_total != a.n OR evaluation_snapshots.judgments_reviewed != a.r
                OR evaluation_snapshots.judgments_corrected != a.c OR evaluation_snapshots.judged_metrics != a.m)
            """  # the one dialect-dependent piece is the string aggregate above, from fixed SQL
        )
    )
    session.execute(
        text(
            """
            UPDATE evaluation_snapshots SET judgments_total = 0, judgments_reviewed = 0,
                judgments_corrected = 0, judged_metrics = ''
            WHERE (judgments_total != 0 OR judgments_reviewed != 0 OR judgments_corrected != 0
                   OR judged_metrics != '')
              AND NOT EXISTS (SELECT 1 FROM judgments j WHERE j.snapshot_id = evaluation_snapshots.id)
            """
        )
    )


@register_rebuild("reviewer_decisions")
def rebuild_reviewer_decisions(session: Session) -> None:
    """Every evaluation's `reviewer_decisions` from its judgments (`reviewer_decisions_sql`); only
    rows whose value is wrong are written (a recount of a right database writes nothing).

    Every evaluation is read, whatever its counters say: a repair must not trust the counters that
    the same hand-made write may have left wrong (`recount reviewer_decisions` is run alone too).
    """
    dialect = dialect_name(session)
    differs = "IS DISTINCT FROM" if dialect == "postgresql" else "IS NOT"
    session.execute(
        text(
            f"""
            UPDATE evaluation_snapshots SET reviewer_decisions = fresh.d
            FROM (
                SELECT s.id AS id, {reviewer_decisions_sql(dialect, "s.id")} AS d
                FROM evaluation_snapshots AS s
            ) AS fresh
            WHERE evaluation_snapshots.id = fresh.id AND evaluation_snapshots.reviewer_decisions {differs} fresh.d
            """  # fixed SQL: the dialect picks one of two spellings
        )
    )


@register_rebuild("metric_scores")
def rebuild_metric_scores(session: Session) -> None:
    """The narrow scores table and its agreement counts (Analytics' source; `lib.scores`)."""
    scores.rebuild_scores(session=session)


@register_rebuild("reviewer_counts")
def rebuild_reviewer_counts(session: Session) -> None:
    """Per reviewer × product × metric × day judgment counters from every live judgment (one grouped scan)."""
    session.execute(delete(_REVIEWER))
    _upsert_add(session, _REVIEWER, _judgment_keys(session, _REVIEWER), _judgment_values(1), literal(True))


@register_rebuild("evaluation_counts")
def rebuild_evaluation_counts(session: Session) -> None:
    """Evaluations per filter combination from every evaluation (one grouped scan); after
    `evaluation_review_counts`, whose per-evaluation counters it reads."""
    session.execute(delete(_EVALUATIONS))
    _shift_evaluations(session, literal(True), 1)


@register_rebuild("judge_version_counts")
def rebuild_judge_version_counts(session: Session) -> None:
    """Reviewed judgments per judge version × product × language × metric × week × decisions, then
    `judge_version_totals`, their sums over weeks (lib.version_counts).

    One name for both, as `metric_scores` rebuilds the agreement counts with their totals: rebuilt
    alone, the weekly rows would leave the totals (what the tab reads) as wrong as before, and the
    table and the timeline disagreeing (review8 F3)."""
    version_counts.rebuild(session)
    version_counts.rebuild_totals(session)


# Names a recount accepts for a table rebuilt under another table's name (no second rebuild).
_REBUILT_WITH = {"judge_version_totals": "judge_version_counts"}


@register_rebuild("judge_version_pair_counts")
def rebuild_judge_version_pair_counts(session: Session) -> None:
    """Reviewed judgments two versions both judged, per pair × product × language × metric × decisions."""
    version_counts.rebuild_pairs(session)


def rebuild_counts(*, session: Session) -> None:
    """This module's own tables and columns from scratch (a bulk load's end)."""
    rebuild_product_counts(session)
    rebuild_judgment_counts(session)
    rebuild_evaluation_review_counts(session)
    # Not `reviewer_decisions`: a load writes new evaluations with unreviewed judgments only (their
    # decisions are NULL as inserted, `new_evaluation_counters`) and leaves the stored ones as they
    # were, so reading every reviewed evaluation's judgments again would only slow the load.
    rebuild_reviewer_counts(session)
    rebuild_evaluation_counts(session)
    rebuild_judge_version_counts(session)
    rebuild_judge_version_pair_counts(session)


def recount(*, session: Session, only: Iterator[str] | list[str] | None = None) -> list[str]:
    """Rebuild every registered derived table (or the named ones) in the caller's transaction.

    A table rebuilt with another (`_REBUILT_WITH`) names that one; each rebuild runs once."""
    names = list(REBUILDS) if only is None else list(dict.fromkeys(_REBUILT_WITH.get(n, n) for n in only))
    unknown = [n for n in names if n not in REBUILDS]
    if unknown:
        known = ", ".join([*REBUILDS, *_REBUILT_WITH])
        raise ValueError(f"unknown counters {', '.join(unknown)}; known: {known}")
    for name in names:
        REBUILDS[name](session)
    session.flush()
    return names


# ---------------------------------------------------------------------------------------------
# ORM writes: any judgment or evaluation added, changed or deleted through a Session flush is
# counted here, so no ORM writer (the judge, re-judging, second opinions, coach, tests) can forget.
# Core statements (bulk inserts, record_review's versioned UPDATE, archive) call the functions above.

_JUDGMENT_KEYS = (
    "product", "metric", "timestamp", "snapshot_id", "reviewed_at", "was_corrected", "user_decision",
    "decision", "second_opinion_action", "reviewer", "judge_version_id",
)  # fmt: skip
_SNAPSHOT_KEYS = (
    "product", "language", "deleted_at", "evidence_count", "evidence_highlighted", "evidence_unlocated",
    "evidence_unverified", "model_name", "category", "max_metric_gap", "judgments_total",
    "judgments_reviewed", "judgments_corrected", "judged_metrics",
)  # fmt: skip
_PENDING = "lib.counters.pending"


def _changed(obj: Any, keys: tuple[str, ...]) -> bool:
    state = inspect(obj)
    return any(state.attrs[k].history.has_changes() for k in keys)


def _committed(obj: Any, name: str) -> Any:
    history = inspect(obj).attrs[name].history
    return history.deleted[0] if history.deleted else getattr(obj, name)


@event.listens_for(Session, "before_flush")
def _before_flush(session: Session, _context: Any, _instances: Any) -> None:
    """Retract what the flush is about to change, while the database still holds the old rows."""
    judgment_ids: set[int] = set()
    snapshot_ids: set[str] = set()  # evaluations changing: their product row and their judgments move
    refresh: set[str] = set()  # evaluations whose per-evaluation counters to recompute after
    for obj in session.new:
        if isinstance(obj, Judgment) and obj.snapshot_id is not None:
            refresh.add(obj.snapshot_id)
        elif isinstance(obj, JudgeVerdict):
            judgment_ids.add(obj.judgment_id)  # its judgment's counts move with it (lib.version_counts)
    for obj in (*session.dirty, *session.deleted):
        deleted = obj in session.deleted
        if isinstance(obj, JudgeVerdict):
            judgment_ids.add(obj.judgment_id)
        elif isinstance(obj, Judgment) and obj.id is not None and (deleted or _changed(obj, _JUDGMENT_KEYS)):
            judgment_ids.add(obj.id)
            for sid in (_committed(obj, "snapshot_id"), obj.snapshot_id):
                if sid is not None:
                    refresh.add(sid)
        elif isinstance(obj, EvaluationSnapshot) and (deleted or _changed(obj, _SNAPSHOT_KEYS)):
            snapshot_ids.add(_committed(obj, "id"))
    if not (
        judgment_ids or snapshot_ids or refresh or any(isinstance(o, EvaluationSnapshot) for o in session.new)
    ):
        return
    where = _pending_where(judgment_ids, snapshot_ids)
    # Lock before retracting (PostgreSQL), in the one order: a concurrent review of these judgments
    # commits first and the retraction then sees it, instead of retracting the row as it was.
    if where is not None:
        lock_judgments(session=session, where=where)
    evaluations = _evaluations_to_lock(where, snapshot_ids | refresh)
    if evaluations is not None:
        lock_snapshots(session=session, where=evaluations)
    # Counter rows in the one order (lock_judgments): the product's and the evaluations'
    # (`evaluation_counts`: those it changes and those it recounts after, as stored now) before the
    # judgments'. A re-judge retracted its judgment's day and language rows first and moved its
    # evaluation's `evaluation_counts` row after the flush: a lock cycle with every import, review
    # and archive of the product, which take them the other way round (locks1's hammer).
    # PostgreSQL: the `evaluation_counts` rows of every evaluation it locked, also those of judgments
    # whose counts alone move (the −1 here and the +1 after cancel): a re-judge by another version
    # flushes the replaced decision's verdict first, and its judgment's flush, later in the
    # transaction, then finds the evaluation's row already held instead of taking it after the
    # day and language rows the first flush took.
    if snapshot_ids:
        _shift_snapshots(session, _evaluations_among(snapshot_ids), -1)
    if _locks_rows(session):
        counted = evaluations
    else:
        counted = _evaluations_among(snapshot_ids | refresh) if snapshot_ids | refresh else None
    if counted is not None:
        _shift_evaluations(session, counted, -1)
    if where is not None:
        retract_judgments(session=session, where=where)
    session.info[_PENDING] = (judgment_ids, snapshot_ids, refresh)


# The flush hooks' conditions as templates (lib.prepared): their statements are built once, the
# ids passed each flush (building them was most of a flush's cost: 50-75 CPU ms for an evaluation
# with two judgments on SQLite).
_BY_ID = prepared.template(col(_J.id), "judgment_ids")
_BY_EVALUATION = prepared.template(col(_J.snapshot_id), "judgments_of")
_JUDGMENTS_AMONG = {
    (True, False): _BY_ID,
    (False, True): _BY_EVALUATION,
    (True, True): or_(_BY_ID, _BY_EVALUATION),
}
_EVALUATIONS_AMONG = prepared.template(col(_S.id), "evaluation_ids")


def _pending_where(judgment_ids: set[int], snapshot_ids: set[str]) -> Any:
    """The judgments with these ids or of these evaluations (None for none)."""
    shape = (bool(judgment_ids), bool(snapshot_ids))
    if not any(shape):
        return None
    ids = {"judgment_ids": judgment_ids} if judgment_ids else {}
    if snapshot_ids:
        ids["judgments_of"] = snapshot_ids  # type: ignore[assignment]
    return prepared.bind_ids(("judgments", *shape), _JUDGMENTS_AMONG[shape], **ids)


def _evaluations_among(snapshot_ids: set[str]) -> Any:
    return prepared.bind_ids("evaluations", _EVALUATIONS_AMONG, evaluation_ids=snapshot_ids)


def _evaluations_to_lock(judgments: Any, snapshot_ids: set[str]) -> Any:
    """The evaluations a flush locks before it retracts (None for none): these ids, and those of the
    judgments it retracts, in one statement (so in one id order).

    The judgments' own evaluations too: a flush that writes only a verdict (a re-judge that keeps a
    reviewed entry) retracts and re-adds its judgment reading the evaluation's `deleted_at` twice,
    and a restore committed in between counted the judgment once more (review8 F7). Locked, the
    restore waits for the flush's commit and counts what it left."""
    parts: list[Any] = []
    params: dict[str, Any] = {}
    shape: list[Any] = []
    if judgments is not None:
        parts.append(_snapshots_of(judgments.where))
        params.update(judgments.params)
        shape.append(judgments.shape)
    if snapshot_ids:
        parts.append(_EVALUATIONS_AMONG)
        params["evaluation_ids"] = sorted(snapshot_ids)
        shape.append("evaluations")
    if not parts:
        return None
    return prepared.Among(("flush locks", *shape), or_(*parts), params)


_ONE_EVALUATION = col(_S.id) == bindparam("evaluation_id")


def one_evaluation(snapshot_id: str) -> Any:
    """`evaluation_snapshots.id = snapshot_id` for `snapshots_change`, as a template (lib.prepared):
    archiving or restoring one evaluation runs its ten statements without building them again."""
    return prepared.Among("one evaluation", _ONE_EVALUATION, {"evaluation_id": snapshot_id})


@event.listens_for(Session, "after_flush")
def _after_flush(session: Session, context: Any) -> None:
    """Count the flushed rows as they are now (new ones have their ids by now)."""
    judgment_ids, snapshot_ids, refresh = session.info.pop(_PENDING, (set(), set(), set()))
    new_snapshots: set[str] = set()
    for obj in session.new:
        if isinstance(obj, Judgment) and obj.id is not None:
            judgment_ids.add(obj.id)
        elif isinstance(obj, EvaluationSnapshot):
            new_snapshots.add(obj.id)
    live_snapshots = snapshot_ids - {o.id for o in session.deleted if isinstance(o, EvaluationSnapshot)}
    # The evaluations first, as _before_flush retracted them: locked there (new ones only this
    # transaction sees), recounted from their judgments, then counted in their rows as they are now.
    if live_snapshots | new_snapshots:
        _shift_snapshots(session, _evaluations_among(live_snapshots | new_snapshots), 1)
    if refresh | new_snapshots:
        _recount_rows(session, _evaluations_among(refresh | new_snapshots))
    where = _pending_where(judgment_ids, live_snapshots)
    evaluations = live_snapshots | refresh | new_snapshots
    counted = (
        _evaluations_to_lock(where, evaluations)
        if _locks_rows(session)
        else (_evaluations_among(evaluations) if evaluations else None)
    )
    if counted is not None:
        _shift_evaluations(session, counted, 1)
    if where is not None:
        include_judgments(session=session, where=where)
