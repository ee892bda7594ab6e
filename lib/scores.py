"""The narrow scores table and its agreement counts (issue 19 item 2), kept in step on every write.

Analytics compares each snapshot's user scores with its judge scores. Extracting them from the two
JSON columns per render grows with the evaluations (55 s at 1M), so the pairs are extracted once,
when the snapshot is written, into `metric_scores` (one row per metric scored on both sides), and
counted per (product, language, metric, week, user score, judge score) in `agreement_counts` and,
summed over weeks, in `agreement_totals`. The page then reads counts, whose size depends on
products x metrics (x weeks) x score cells only.

This module is the only writer of these tables:

- `add_snapshot_scores` (the importer, per batch) and the ORM events below (every snapshot added,
  changed or deleted through a Session: the judge, the demo, tests) write rows and counts;
- `set_snapshots_live` follows archive and restore;
- `rebuild_scores` recomputes them all from the snapshots (the migration's backfill, the
  recount CLI, and the proof that the maintained counts are right).

Counts change with `n = n + delta` upserts in the caller's transaction, valid on SQLite and
PostgreSQL, so concurrent writers never lose an increment. Reviews do not touch these tables: the
human side of Analytics is the user scores stored with the snapshot, not reviewers' decisions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Table,
    Text,
    delete,
    event,
    func,
    insert,
    inspect,
    literal,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapper
from sqlmodel import Session

from lib import prepared
from lib.bulk import insert_tuples
from lib.metrics import score_of
from lib.models import AgreementCount, AgreementTotal, EvaluationSnapshot, MetricScore

_SCORES = MetricScore.__table__  # type: ignore[attr-defined]
_COUNTS = AgreementCount.__table__  # type: ignore[attr-defined]
_SNAPSHOTS = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
COUNT_KEY = ("product", "language", "metric", "week", "user_score", "judge_score")
_TOTALS = AgreementTotal.__table__  # type: ignore[attr-defined]
# Every count table with its key: the weekly counts, and the same summed over weeks.
COUNT_TABLES: tuple[tuple[Table, tuple[str, ...]], ...] = (
    (_COUNTS, COUNT_KEY),
    (_TOTALS, tuple(name for name in COUNT_KEY if name != "week")),
)
# A snapshot's contribution depends on these columns only; a change to any of them re-derives it.
SCORED_FIELDS = ("user_scores_json", "judge_scores_json", "deleted_at", "product", "language", "created_at")
_ID_SLICE = 500  # ids per IN list: well under SQLite's variable limit
REBUILD_BATCH = 5_000


@dataclass(frozen=True)
class ScoredSnapshot:
    """What the scores of one snapshot are derived from (its columns, JSON already decoded)."""

    id: str
    product: str
    language: str
    created_at: datetime
    live: bool
    user_scores: Mapping[str, Any]
    judge_scores: Mapping[str, Any]


def utc_day(moment: datetime) -> date:
    """The UTC calendar day of a timestamp (naive ones are UTC, the storage convention)."""
    return (moment.astimezone(UTC) if moment.tzinfo else moment).date()


def week_of(day: date) -> date:
    """Monday of the day's ISO week: the week Analytics trends are grouped by."""
    return day - timedelta(days=day.weekday())


class ScoreRow(NamedTuple):
    """One `metric_scores` row, in the table's column order (a plain tuple for bulk inserts)."""

    snapshot_id: str
    metric: str
    product: str
    language: str
    day: date
    week: date
    user_score: float
    judge_score: float
    live: bool


SCORE_COLUMNS = ScoreRow._fields


def score_rows(snapshots: Iterable[ScoredSnapshot]) -> list[ScoreRow]:
    """`metric_scores` rows: one per metric both sides scored with a number (`lib.metrics.score_of`'s rule)."""
    rows: list[ScoreRow] = []
    for snap in snapshots:
        day = utc_day(snap.created_at)
        week = week_of(day)
        judge = snap.judge_scores if isinstance(snap.judge_scores, Mapping) else {}
        user = snap.user_scores if isinstance(snap.user_scores, Mapping) else {}
        for metric, entry in user.items():
            u = score_of(entry)
            j = score_of(judge.get(metric)) if u is not None else None
            if j is not None:
                rows.append(
                    ScoreRow(snap.id, metric, snap.product, snap.language, day, week, u, j, snap.live)
                )
    return rows


def _count_deltas(rows: Sequence[ScoreRow], key: Sequence[str]) -> Counter[tuple[Any, ...]]:
    at = [SCORE_COLUMNS.index(name) for name in key]
    return Counter(tuple(row[i] for i in at) for row in rows if row.live)


def _insert_rows(connection: Connection, rows: Sequence[ScoreRow]) -> None:
    """Plain tuples through `lib.bulk` (COPY on PostgreSQL): the rebuild writes millions at 1M."""
    if rows:
        insert_tuples(connection, _SCORES, SCORE_COLUMNS, rows)


def add_snapshot_scores(*, session: Session, snapshots: Iterable[ScoredSnapshot]) -> int:
    """Write the score rows and count increments of newly inserted snapshots; returns the rows."""
    return _add(session.connection(), snapshots)


def replace_snapshot_scores(
    *, session: Session, before: Sequence[ScoredSnapshot], after: Sequence[ScoredSnapshot]
) -> None:
    """The rows and counts of stored snapshots whose scores a Core UPDATE changed from `before` to
    `after` (late judge verdicts, `lib.importer.add_source_verdicts`): the old ones out, the new in,
    as the ORM hook below does for one snapshot. Only snapshots whose rows differ are touched: a
    judge score for a metric no user scored adds no row (an OTLP call has no user scores at all)."""
    changed = [new for old, new in zip(before, after, strict=True) if score_rows([old]) != score_rows([new])]
    if changed:
        _replace(session.connection(), changed)


def _replace(connection: Connection, snapshots: Sequence[ScoredSnapshot]) -> None:
    _remove(connection, [snap.id for snap in snapshots])
    _add(connection, snapshots)


def set_snapshots_live(*, session: Session, snapshot_ids: Sequence[str], live: bool) -> None:
    """Archive (live=False) or restore (True) the snapshots' scores: flag and counts, set-based."""
    _set_live(session.connection(), snapshot_ids, live)


def rebuild_scores(*, session: Session) -> int:
    """Recompute both tables from every snapshot; returns the score rows written."""
    return rebuild_scores_on(session.connection())


def rebuild_scores_on(connection: Connection, *, count_tables: Collection[str] | None = None) -> int:
    """`rebuild_scores` on a plain connection (the Alembic backfill has no Session).

    `count_tables` limits the count tables rebuilt: a migration names those that exist at its revision.
    """
    tables = [(t, k) for t, k in COUNT_TABLES if count_tables is None or t.name in count_tables]
    for table, _key in tables:
        connection.execute(delete(table))
    connection.execute(delete(_SCORES))
    written = 0
    last = ""
    s = _SNAPSHOTS.c
    while True:
        # Keyset pages over the primary key: bounded memory, and no cursor left open across writes.
        batch = connection.execute(
            select(
                s.id, s.product, s.language, s.created_at, s.deleted_at,
                type_coerce(s.user_scores_json, Text), type_coerce(s.judge_scores_json, Text),
            )
            .where(s.id > last)
            .order_by(s.id)
            .limit(REBUILD_BATCH)
        ).all()  # fmt: skip
        if not batch:
            break
        rows = score_rows(
            ScoredSnapshot(r[0], r[1], r[2], r[3], r[4] is None, _decoded(r[5]), _decoded(r[6]))
            for r in batch
        )
        _insert_rows(connection, rows)
        written += len(rows)
        last = batch[-1].id
    _count_scores(connection, tables)
    return written


def recount_agreement(*, session: Session) -> None:
    """Rebuild the count tables from the stored score rows (a bulk load that wrote `score_rows` itself)."""
    connection = session.connection()
    for table, _key in COUNT_TABLES:
        connection.execute(delete(table))
    _count_scores(connection, COUNT_TABLES)


def _count_scores(connection: Connection, tables: Iterable[tuple[Table, Sequence[str]]]) -> None:
    """Fill empty count tables from the live score rows: the weekly counts with one grouped pass over
    them, a coarser table (the totals) by summing the weekly counts (far fewer rows) when they are
    filled too."""
    filled: set[Table] = set()
    for table, names in tables:
        if _COUNTS in filled and set(names) <= set(COUNT_KEY):
            key = [_COUNTS.c[name] for name in names]
            rows = select(*key, func.sum(_COUNTS.c.n)).group_by(*key)
        else:
            key = [_SCORES.c[name] for name in names]
            rows = select(*key, func.count()).where(_SCORES.c.live.is_(True)).group_by(*key)
        connection.execute(insert(table).from_select([*names, "n"], rows))
        filled.add(table)


def _decoded(value: Any) -> Any:
    """A JSON column read as text (SQLite) or already decoded by the driver (psycopg)."""
    return json.loads(value) if isinstance(value, str) else value


def _add(connection: Connection, snapshots: Iterable[ScoredSnapshot]) -> int:
    rows = score_rows(snapshots)
    _insert_rows(connection, rows)
    for table, key in COUNT_TABLES:
        _upsert_counts(connection, table, key, _count_deltas(rows, key))
    return len(rows)


def _upsert(connection: Connection, table: Table) -> Any:
    """The dialect's INSERT for a count table (both spell ON CONFLICT the same way)."""
    return (postgresql if connection.dialect.name == "postgresql" else sqlite).insert(table)


def _on_conflict_add(stmt: Any, table: Table, key: Sequence[str]) -> Any:
    return stmt.on_conflict_do_update(index_elements=list(key), set_={"n": table.c.n + stmt.excluded.n})


def _upsert_counts(
    connection: Connection, table: Table, key: Sequence[str], deltas: Mapping[tuple[Any, ...], int]
) -> None:
    """Add each delta to its count row, creating the row when it is new."""
    # In key order (lib.counters._upsert_add); by repr, since a key may hold None.
    ordered = sorted(deltas.items(), key=lambda item: repr(item[0]))
    params = [{**dict(zip(key, k, strict=True)), "n": n} for k, n in ordered if n]
    if params:
        stmt = prepared.built(  # every evaluation written through the ORM runs these (flush hook)
            connection,
            ("score counts", table.name),
            lambda: _on_conflict_add(_upsert(connection, table), table, key),
        )
        connection.execute(stmt, params)


def _shift_counts(connection: Connection, ids: Sequence[str], *, live: bool, sign: int) -> None:
    """Add `sign` x the snapshots' rows whose live flag is `live` to every count table, set-based."""
    for table, names in COUNT_TABLES:
        key = [_SCORES.c[name] for name in names]
        rows = (
            select(*key, func.count() * literal(sign))
            .where(_SCORES.c.snapshot_id.in_(ids), _SCORES.c.live.is_(live))
            .group_by(*key)
            .order_by(*key)  # key order (lib.counters._upsert_add)
        )
        stmt = _upsert(connection, table).from_select([*names, "n"], rows)
        connection.execute(_on_conflict_add(stmt, table, names))


def _slices(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(ids), _ID_SLICE):
        yield ids[i : i + _ID_SLICE]


def _set_live(connection: Connection, snapshot_ids: Sequence[str], live: bool) -> None:
    for ids in _slices(list(snapshot_ids)):
        # Rows already in the wanted state are left alone, so a repeated archive changes nothing.
        _shift_counts(connection, ids, live=not live, sign=1 if live else -1)
        connection.execute(
            update(_SCORES)
            .where(_SCORES.c.snapshot_id.in_(ids), _SCORES.c.live.is_(not live))
            .values(live=live)
        )


def _remove(connection: Connection, snapshot_ids: Sequence[str]) -> None:
    for ids in _slices(list(snapshot_ids)):
        _shift_counts(connection, ids, live=True, sign=-1)
        connection.execute(delete(_SCORES).where(_SCORES.c.snapshot_id.in_(ids)))


def _of(target: EvaluationSnapshot) -> ScoredSnapshot:
    return ScoredSnapshot(
        id=target.id,
        product=target.product,
        language=target.language,
        created_at=target.created_at,
        live=target.deleted_at is None,
        user_scores=target.user_scores_json,
        judge_scores=target.judge_scores_json,
    )


# Snapshots written through a Session (the judge, the demo, the coach, tests) keep their scores in
# step here, in the flush's own transaction; Core bulk writes call the functions above instead.


@event.listens_for(EvaluationSnapshot, "after_insert")
def _snapshot_inserted(_mapper: Mapper[Any], connection: Connection, target: EvaluationSnapshot) -> None:
    _add(connection, [_of(target)])


@event.listens_for(EvaluationSnapshot, "after_update")
def _snapshot_updated(_mapper: Mapper[Any], connection: Connection, target: EvaluationSnapshot) -> None:
    state = inspect(target)
    if any(state.attrs[name].history.has_changes() for name in SCORED_FIELDS):
        _replace(connection, [_of(target)])


@event.listens_for(EvaluationSnapshot, "before_delete")
def _snapshot_deleted(_mapper: Mapper[Any], connection: Connection, target: EvaluationSnapshot) -> None:
    _remove(connection, [target.id])
