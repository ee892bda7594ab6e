"""Counts of live reviewed judgments per judge version (issue 28), kept on write by `lib.counters`.

Agreement by judge version compares each version's decision on a judgment with the judgment's
resolved reviewer decision (`user_decision`; with team queues only a resolved or adjudicated
decision sets it). A version's decisions are the judgments' own (`judgments.decision` with its
`judge_version_id`) and the `judge_verdicts` rows (a decision a re-judge replaced, or one the
seed-004 rule did not let replace a reviewed entry). `judge_version_counts` holds, per version ×
product × language × metric × week judged × (version decision, reviewer decision), how many live
reviewed judgments there are, so Analytics reads rows in proportion to versions × metrics × weeks ×
score cells, never judgments. `judge_version_totals` holds the same summed over weeks (as
`agreement_totals` beside `agreement_counts`, `lib.scores`): everything Analytics shows that needs no
week reads it, a few thousand rows where the weekly table keeps growing with every week (108k rows
at 1M evaluations). Both are written from the same source rows, one statement per table (`COUNT_TABLES`), and rebuilt
together (`counters.rebuild_judge_version_counts`). `judge_version_pair_counts` holds, per pair of versions that both
judged a judgment × product × language × metric × (A's decision, B's decision, reviewer decision),
how many such judgments there are: "same items only" (a paired comparison of two versions) is a
function of that joint table, so it too reads cells, never judgments. A pair is two of a judgment's
decisions by different versions (its own and a verdict, or two verdicts), A the lower version id.

The definitions are here and nowhere else: "live" is an evaluation not archived (a stand-alone
judgment is live), "reviewed" is `reviewed_at` and `user_decision` set, the week is the Monday of
the decision's UTC day (the judgment's `timestamp`, a verdict's `judged_at`).

`lib.counters` calls `shift` wherever it moves the other judgment counters (so every write path
that keeps those keeps these), `move_review` from a review's known change, and `rebuild`,
`rebuild_totals` and `rebuild_pairs` from `recount`; this module imports nothing that imports it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Integer,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    true,
    type_coerce,
    union_all,
)
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.elements import BindParameter
from sqlmodel import Session, col

from lib import prepared
from lib.bulk import dialect_insert
from lib.models import (
    UNVERSIONED,
    EvaluationSnapshot,
    JudgeVerdict,
    JudgeVersionCount,
    JudgeVersionPairCount,
    JudgeVersionTotal,
    Judgment,
)

_J = Judgment
_S = EvaluationSnapshot
_V = JudgeVerdict
COUNTS: Table = JudgeVersionCount.__table__  # type: ignore[attr-defined]
KEY = ("judge_version_id", "product", "language", "metric", "week", "decision", "human")
TOTALS: Table = JudgeVersionTotal.__table__  # type: ignore[attr-defined]
TOTAL_KEY = tuple(name for name in KEY if name != "week")
# Every per-version count table with its key: by week judged, and the same summed over weeks. Each
# write adds to both with the same source rows, grouped by the table's key.
COUNT_TABLES: tuple[tuple[Table, tuple[str, ...]], ...] = ((COUNTS, KEY), (TOTALS, TOTAL_KEY))
PAIRS: Table = JudgeVersionPairCount.__table__  # type: ignore[attr-defined]
PAIR_KEY = ("version_a", "version_b", "product", "language", "metric", "decision_a", "decision_b", "human")


def week_start(session: Session, column: Any) -> Any:
    """The Monday (UTC) of a timestamp column's week as a date, in this session's SQL dialect."""
    if session.get_bind().dialect.name == "postgresql":
        return func.cast(func.date_trunc("week", func.timezone("UTC", column)), type_=COUNTS.c.week.type)
    # SQLite stores UTC text "YYYY-MM-DD HH:MM:SS.ffffff"; six days back, then on to a Monday.
    return func.date(func.substr(column, 1, 10), "-6 days", "weekday 1")


def reviewed() -> ColumnElement[bool]:
    """A judgment with a resolved reviewer decision (the human label)."""
    return col(_J.reviewed_at).is_not(None) & col(_J.user_decision).is_not(None)


def _live() -> ColumnElement[bool]:
    return col(_S.deleted_at).is_(None)


def _human(human: Any, table: Table) -> Any:
    """A known reviewer decision as a column of `table`'s type: a value, or a statement's parameter."""
    return human if isinstance(human, BindParameter) else type_coerce(literal(human), table.c.human.type)


def _sources(
    session: Session,
    where: Any,
    *,
    sign: int,
    human: Any = None,
    verdicts_only: bool = False,
    key: tuple[str, ...] = KEY,
) -> list[Any]:
    """SELECTs of (key…, n) for the judgments matching `where`: their own decisions and their verdicts.

    `human` None takes the stored reviewer decision of reviewed judgments; a literal stands for a
    known decision (a review's before or after) and counts the judgment whatever its stored state.
    `key` is the count table's (`COUNT_TABLES`): the week-less totals group without the week.
    """
    label = col(_J.user_decision) if human is None else _human(human, COUNTS)
    conditions = [_live(), where, *([reviewed()] if human is None else [])]
    common = {
        "product": col(_J.product),
        "language": func.coalesce(col(_S.language), ""),
        "metric": func.coalesce(col(_J.metric), ""),
    }
    n = (func.count() * sign).label("n")
    out = []
    if not verdicts_only:
        own = {
            "judge_version_id": func.coalesce(col(_J.judge_version_id), literal(UNVERSIONED, Integer)),
            **common,
            "week": week_start(session, col(_J.timestamp)),
            "decision": col(_J.decision),
            "human": label,
        }
        own = {k: own[k] for k in key}
        out.append(
            select(*(e.label(k) for k, e in own.items()), n)
            .select_from(_J)
            .outerjoin(_S, col(_S.id) == col(_J.snapshot_id))
            .where(*conditions)
            .group_by(*own.values())
            .order_by(*own.values())  # key order (lib.counters._upsert_add)
        )
    other = {
        "judge_version_id": col(_V.judge_version_id),
        **common,
        "week": col(_V.week),
        "decision": col(_V.decision),
        "human": label,
    }
    other = {k: other[k] for k in key}
    out.append(
        select(*(e.label(k) for k, e in other.items()), n)
        .select_from(_V)
        .join(_J, col(_J.id) == col(_V.judgment_id))
        .outerjoin(_S, col(_S.id) == col(_J.snapshot_id))
        .where(*conditions)
        .group_by(*other.values())
        .order_by(*other.values())  # key order (lib.counters._upsert_add)
    )
    return out


# Core tables, not ORM entities: the pair statement is built on every write of judgments, and ORM
# aliases and attribute adaptation cost ~4 ms a build (the query itself, by primary keys, ~0.1 ms).
_TJ: Table = Judgment.__table__  # type: ignore[attr-defined]
_TS: Table = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
_TV: Table = JudgeVerdict.__table__  # type: ignore[attr-defined]
_FIRST, _SECOND = _TV.alias("first_verdict"), _TV.alias("second_verdict")


def _pair_source(where: Any, *, sign: int, human: Any = None) -> Any:
    """SELECT of (pair key…, n) for the judgments matching `where`: every two of a judgment's
    decisions by different versions (its own with each verdict, and each two verdicts).

    `human` as in `_sources`. A is the lower version id, so each pair is one row whichever version
    judged first; a version's own decision and its verdict on one judgment are no pair.
    """
    j, v = _TJ.c, _TV.c
    label = j.user_decision if human is None else _human(human, PAIRS)
    conditions = [_TS.c.deleted_at.is_(None), where, *([reviewed()] if human is None else [])]
    common = (
        j.product.label("product"),
        func.coalesce(_TS.c.language, "").label("language"),
        func.coalesce(j.metric, "").label("metric"),
    )
    own = func.coalesce(j.judge_version_id, literal(UNVERSIONED, Integer))
    own_first = own < v.judge_version_id
    own_with_verdict = (
        select(
            case((own_first, own), else_=v.judge_version_id).label("version_a"),
            case((own_first, v.judge_version_id), else_=own).label("version_b"),
            *common,
            case((own_first, j.decision), else_=v.decision).label("decision_a"),
            case((own_first, v.decision), else_=j.decision).label("decision_b"),
            label.label("human"),
        )
        .select_from(_TJ.join(_TV, v.judgment_id == j.id).outerjoin(_TS, _TS.c.id == j.snapshot_id))
        .where(*conditions, own != v.judge_version_id)
    )
    first, second = _FIRST.c, _SECOND.c
    two_verdicts = (
        select(
            first.judge_version_id.label("version_a"),
            second.judge_version_id.label("version_b"),
            *common,
            first.decision.label("decision_a"),
            second.decision.label("decision_b"),
            label.label("human"),
        )
        .select_from(
            _TJ.join(_FIRST, first.judgment_id == j.id)
            .join(_SECOND, and_(second.judgment_id == j.id, first.judge_version_id < second.judge_version_id))
            .outerjoin(_TS, _TS.c.id == j.snapshot_id)
        )
        .where(*conditions)
    )
    pairs = union_all(own_with_verdict, two_verdicts).subquery()
    keys = [pairs.c[k] for k in PAIR_KEY]
    return (
        select(*keys, (func.count() * sign).label("n"))
        .where(true())  # SQLite's upsert parse rule: an INSERT … SELECT … ON CONFLICT needs a WHERE
        .group_by(*keys)
        .order_by(*keys)  # key order (lib.counters._upsert_add)
    )


def _counts_upsert(session: Session, source: Any, table: Table, key: tuple[str, ...]) -> Any:
    stmt = dialect_insert(session, table).from_select([*key, "n"], source)
    return stmt.on_conflict_do_update(index_elements=list(key), set_={"n": table.c.n + stmt.excluded.n})


def _upserts(session: Session, where: Any, **how: Any) -> list[Any]:
    """The upserts adding the judgments matching `where` to every count table (`_sources`' options):
    the one path every kept write takes (full rebuilds: `rebuild` then `rebuild_totals`), so the
    totals cannot miss a write the weekly counts see. One statement per table: a review writes both
    tables without sending more statements than the weekly counts alone took (tests/test_queues.py's
    statement budget)."""
    return [
        _counts_upsert(session, _summed(_sources(session, where, key=key, **how), key), table, key)
        for table, key in COUNT_TABLES
    ]


def _summed(sources: list[Any], key: tuple[str, ...]) -> Any:
    """The judgments' own decisions and their verdicts as one SELECT, summed per key: an upsert may
    not touch a row twice (PostgreSQL refuses it), and a version's own decision and another's
    verdict can share a key."""
    if len(sources) == 1:
        return sources[0]
    both = union_all(*(source.order_by(None) for source in sources)).subquery()
    keys = [both.c[k] for k in key]
    return (
        select(*keys, func.sum(both.c.n).label("n"))
        .where(true())  # SQLite's upsert parse rule: an INSERT … SELECT … ON CONFLICT needs a WHERE
        .group_by(*keys)
        .order_by(*keys)  # key order (lib.counters._upsert_add)
    )


def _any_verdicts(session: Session) -> bool:
    """Whether any judgment has a second version's decision: without one there is no pair to count.

    Re-judges are rare, and most databases have none: this probe (~0.25 ms on SQLite) spares the
    pair upsert (~1.8 ms) on every write of judgments there. It reads what that upsert's own SELECT
    would: a verdict this transaction cannot see would add no pair there either. Built once
    (lib.prepared): building it cost more than running it.
    """
    probe = prepared.built(session, ("any verdicts",), lambda: select(literal(1)).select_from(_V).limit(1))
    return session.execute(probe).first() is not None


def _pair_upsert(session: Session, source: Any) -> Any:
    stmt = dialect_insert(session, PAIRS).from_select([*PAIR_KEY, "n"], source)
    return stmt.on_conflict_do_update(index_elements=list(PAIR_KEY), set_={"n": PAIRS.c.n + stmt.excluded.n})


# A review's upserts per (dialect, sign, with pairs), the judgment and the reviewer decision as
# parameters: built once, since building them costs ~2.5 ms (per version) and ~5 ms (pairs) each
# time, against ~0.1 ms to run them, and every review runs them once or twice. Constant SQL, no data.
_REVIEW_UPSERTS: dict[tuple[str, int, bool], list[Any]] = {}


def _review_upserts(session: Session, sign: int, pairs: bool) -> list[Any]:
    key = (session.get_bind().dialect.name, sign, pairs)
    if key not in _REVIEW_UPSERTS:
        one = col(_J.id) == bindparam("judgment_id")
        human = bindparam("human", type_=COUNTS.c.human.type)
        out = _upserts(session, one, sign=sign, human=human)
        if pairs:
            human = bindparam("human", type_=PAIRS.c.human.type)
            out.append(_pair_upsert(session, _pair_source(one, sign=sign, human=human)))
        _REVIEW_UPSERTS[key] = out
    return _REVIEW_UPSERTS[key]


def shift(session: Session, where: Any, sign: int, *, unreviewed: bool = False) -> None:
    """Add (`sign` 1) or retract (−1) the contribution of the live judgments matching `where`.

    `unreviewed`: the caller knows none of them is reviewed (an import's new judgments,
    `lib.snapshots.snapshot_judgment_rows`). Every table here counts reviewed judgments only
    (`reviewed()`, for a judgment's own decision, its verdicts and its pairs alike), so there is
    nothing to add, and the two upserts and the verdicts' probe are not sent: an import of ~100
    evaluations (an OTLP log request, 98 per 10,000) spent ~0.4 ms on them (issue 29)."""
    if unreviewed:
        return
    prepared.run_all(
        session, where, ("version counts", sign),
        lambda w: _upserts(session, w, sign=sign),
    )  # fmt: skip
    if _any_verdicts(session):
        prepared.run(
            session,
            where,
            ("version pairs", sign),
            lambda w: _pair_upsert(session, _pair_source(w, sign=sign)),
        )


def move_review(session: Session, judgment_id: int, before: str | None, after: str | None) -> None:
    """A review's known change of one judgment's reviewer decision (None: unreviewed), after its UPDATE."""
    if before == after:
        return
    pairs = _any_verdicts(session)
    for sign, human in ((-1, before), (1, after)):
        if human is not None:
            for stmt in _review_upserts(session, sign, pairs):
                session.execute(stmt, {"judgment_id": judgment_id, "human": human})


def rebuild(session: Session) -> None:
    """Every weekly per-version count from the judgments and verdicts (`recount`, migration 0023's
    backfill); `rebuild_totals` must follow it (`counters.rebuild_judge_version_counts` runs both)."""
    session.execute(delete(COUNTS))
    for source in _sources(session, literal(True), sign=1):
        session.execute(_counts_upsert(session, source, COUNTS, KEY))
    # Rows a retraction left at zero are dropped by a rebuild; none are negative.
    session.execute(delete(COUNTS).where(COUNTS.c.n == 0))


def rebuild_totals(session: Session) -> None:
    """The totals from the weekly counts (`recount`, after `rebuild`): summing them over weeks is the
    totals' definition, and they are far fewer than the judgments (108k rows at 1M evaluations, 10M
    judgments), so no second pass over the judgments. Migration 0030 backfills with the same sum."""
    session.execute(delete(TOTALS))
    weekly = [COUNTS.c[name] for name in TOTAL_KEY]
    session.execute(
        TOTALS.insert().from_select(
            [*TOTAL_KEY, "n"], select(*weekly, func.sum(COUNTS.c.n)).where(COUNTS.c.n > 0).group_by(*weekly)
        )
    )


def rebuild_pairs(session: Session) -> None:
    """Every pair count from the judgments and verdicts (`recount`, migration 0024's backfill)."""
    session.execute(delete(PAIRS))
    session.execute(_pair_upsert(session, _pair_source(literal(True), sign=1)))
