"""Counts of live reviewed judgments per judge version (issue 28), kept on write by `lib.counters`.

Agreement by judge version compares each version's decision on a judgment with the judgment's
resolved reviewer decision (`user_decision`; with team queues only a resolved or adjudicated
decision sets it). A version's decisions are the judgments' own (`judgments.decision` with its
`judge_version_id`) and the `judge_verdicts` rows (a decision a re-judge replaced, or one the
seed-004 rule did not let replace a reviewed entry). `judge_version_counts` holds, per version ×
product × language × metric × week judged × (version decision, reviewer decision), how many live
reviewed judgments there are, so Analytics reads rows in proportion to versions × metrics × weeks ×
score cells, never judgments. `judge_version_pair_counts` holds, per pair of versions that both
judged a judgment × product × language × metric × (A's decision, B's decision, reviewer decision),
how many such judgments there are: "same items only" (a paired comparison of two versions) is a
function of that joint table, so it too reads cells, never judgments. A pair is two of a judgment's
decisions by different versions (its own and a verdict, or two verdicts), A the lower version id.

The definitions are here and nowhere else: "live" is an evaluation not archived (a stand-alone
judgment is live), "reviewed" is `reviewed_at` and `user_decision` set, the week is the Monday of
the decision's UTC day (the judgment's `timestamp`, a verdict's `judged_at`).

`lib.counters` calls `shift` wherever it moves the other judgment counters (so every write path
that keeps those keeps these), `move_review` from a review's known change, and `rebuild` and
`rebuild_pairs` from `recount`; this module imports nothing that imports it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, Table, and_, case, delete, func, literal, select, true, type_coerce, union_all
from sqlalchemy.orm import aliased
from sqlalchemy.sql import ColumnElement
from sqlmodel import Session, col

from lib.bulk import dialect_insert
from lib.models import (
    UNVERSIONED,
    EvaluationSnapshot,
    JudgeVerdict,
    JudgeVersionCount,
    JudgeVersionPairCount,
    Judgment,
)

_J = Judgment
_S = EvaluationSnapshot
_V = JudgeVerdict
COUNTS: Table = JudgeVersionCount.__table__  # type: ignore[attr-defined]
KEY = ("judge_version_id", "product", "language", "metric", "week", "decision", "human")
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


def _sources(
    session: Session, where: Any, *, sign: int, human: Any = None, verdicts_only: bool = False
) -> list[Any]:
    """SELECTs of (key…, n) for the judgments matching `where`: their own decisions and their verdicts.

    `human` None takes the stored reviewer decision of reviewed judgments; a literal stands for a
    known decision (a review's before or after) and counts the judgment whatever its stored state.
    """
    label = col(_J.user_decision) if human is None else type_coerce(literal(human), COUNTS.c.human.type)
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


def _pair_source(where: Any, *, sign: int, human: Any = None) -> Any:
    """SELECT of (pair key…, n) for the judgments matching `where`: every two of a judgment's
    decisions by different versions (its own with each verdict, and each two verdicts).

    `human` as in `_sources`. A is the lower version id, so each pair is one row whichever version
    judged first; a version's own decision and its verdict on one judgment are no pair.
    """
    label = col(_J.user_decision) if human is None else type_coerce(literal(human), PAIRS.c.human.type)
    conditions = [_live(), where, *([reviewed()] if human is None else [])]
    common = (
        col(_J.product).label("product"),
        func.coalesce(col(_S.language), "").label("language"),
        func.coalesce(col(_J.metric), "").label("metric"),
    )
    own = func.coalesce(col(_J.judge_version_id), literal(UNVERSIONED, Integer))
    other = col(_V.judge_version_id)
    own_first = own < other
    own_with_verdict = (
        select(
            case((own_first, own), else_=other).label("version_a"),
            case((own_first, other), else_=own).label("version_b"),
            *common,
            case((own_first, col(_J.decision)), else_=col(_V.decision)).label("decision_a"),
            case((own_first, col(_V.decision)), else_=col(_J.decision)).label("decision_b"),
            label.label("human"),
        )
        .select_from(_J)
        .join(_V, col(_V.judgment_id) == col(_J.id))
        .outerjoin(_S, col(_S.id) == col(_J.snapshot_id))
        .where(*conditions, own != other)
    )
    first, second = aliased(_V), aliased(_V)
    two_verdicts = (
        select(
            col(first.judge_version_id).label("version_a"),
            col(second.judge_version_id).label("version_b"),
            *common,
            col(first.decision).label("decision_a"),
            col(second.decision).label("decision_b"),
            label.label("human"),
        )
        .select_from(_J)
        .join(first, col(first.judgment_id) == col(_J.id))
        .join(
            second,
            and_(
                col(second.judgment_id) == col(_J.id),
                col(first.judge_version_id) < col(second.judge_version_id),
            ),
        )
        .outerjoin(_S, col(_S.id) == col(_J.snapshot_id))
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


def _upsert(session: Session, source: Any, table: Table = COUNTS, key: tuple[str, ...] = KEY) -> None:
    stmt = dialect_insert(session, table).from_select([*key, "n"], source)
    stmt = stmt.on_conflict_do_update(index_elements=list(key), set_={"n": table.c.n + stmt.excluded.n})
    session.execute(stmt)


def _any_verdicts(session: Session) -> bool:
    """Whether any judgment has a second version's decision: without one there is no pair to count.

    Re-judges are rare, and most databases have none: this probe (~0.25 ms on SQLite) spares the
    pair upsert (~1.8 ms) on every write of judgments there. It reads what that upsert's own SELECT
    would: a verdict this transaction cannot see would add no pair there either.
    """
    return session.execute(select(literal(1)).select_from(_V).limit(1)).first() is not None


def _shift(session: Session, where: Any, sign: int, human: Any = None) -> None:
    for source in _sources(session, where, sign=sign, human=human):
        _upsert(session, source)
    if _any_verdicts(session):
        _upsert(session, _pair_source(where, sign=sign, human=human), PAIRS, PAIR_KEY)


def shift(session: Session, where: Any, sign: int) -> None:
    """Add (`sign` 1) or retract (−1) the contribution of the live judgments matching `where`."""
    _shift(session, where, sign)


def move_review(session: Session, judgment_id: int, before: str | None, after: str | None) -> None:
    """A review's known change of one judgment's reviewer decision (None: unreviewed), after its UPDATE."""
    if before == after:
        return
    one = col(_J.id) == judgment_id
    if before is not None:
        _shift(session, one, -1, before)
    if after is not None:
        _shift(session, one, 1, after)


def rebuild(session: Session) -> None:
    """Every per-version count from the judgments and verdicts (`recount`, migration 0023's backfill)."""
    session.execute(delete(COUNTS))
    for source in _sources(session, literal(True), sign=1):
        _upsert(session, source)
    # Rows a retraction left at zero are dropped by a rebuild; none are negative.
    session.execute(delete(COUNTS).where(COUNTS.c.n == 0))


def rebuild_pairs(session: Session) -> None:
    """Every pair count from the judgments and verdicts (`recount`, migration 0024's backfill)."""
    session.execute(delete(PAIRS))
    _upsert(session, _pair_source(literal(True), sign=1), PAIRS, PAIR_KEY)


def nonzero() -> ColumnElement[bool]:
    """Count rows that still hold judgments (a row may fall to 0 and stay)."""
    return COUNTS.c.n > 0


def positive(column: Any) -> Any:
    """`column` where positive, else 0 (sums of counts that include retracted rows)."""
    return case((column > 0, column), else_=0)
