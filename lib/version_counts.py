"""Counts of live reviewed judgments per judge version (issue 28), kept on write by `lib.counters`.

Agreement by judge version compares each version's decision on a judgment with the judgment's
resolved reviewer decision (`user_decision`; with team queues only a resolved or adjudicated
decision sets it). A version's decisions are the judgments' own (`judgments.decision` with its
`judge_version_id`) and the `judge_verdicts` rows (a decision a re-judge replaced, or one the
seed-004 rule did not let replace a reviewed entry). `judge_version_counts` holds, per version ×
product × language × metric × week judged × (version decision, reviewer decision), how many live
reviewed judgments there are, so Analytics reads rows in proportion to versions × metrics × weeks ×
score cells, never judgments.

The definitions are here and nowhere else: "live" is an evaluation not archived (a stand-alone
judgment is live), "reviewed" is `reviewed_at` and `user_decision` set, the week is the Monday of
the decision's UTC day (the judgment's `timestamp`, a verdict's `judged_at`).

`lib.counters` calls `shift` wherever it moves the other judgment counters (so every write path
that keeps those keeps these), `move_review` from a review's known change, and `rebuild` from
`recount`; this module imports nothing that imports it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, Table, case, delete, func, literal, select, type_coerce
from sqlalchemy.sql import ColumnElement
from sqlmodel import Session, col

from lib.bulk import dialect_insert
from lib.models import UNVERSIONED, EvaluationSnapshot, JudgeVerdict, JudgeVersionCount, Judgment

_J = Judgment
_S = EvaluationSnapshot
_V = JudgeVerdict
COUNTS: Table = JudgeVersionCount.__table__  # type: ignore[attr-defined]
KEY = ("judge_version_id", "product", "language", "metric", "week", "decision", "human")


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


def _upsert(session: Session, source: Any) -> None:
    stmt = dialect_insert(session, COUNTS).from_select([*KEY, "n"], source)
    stmt = stmt.on_conflict_do_update(index_elements=list(KEY), set_={"n": COUNTS.c.n + stmt.excluded.n})
    session.execute(stmt)


def shift(session: Session, where: Any, sign: int) -> None:
    """Add (`sign` 1) or retract (−1) the contribution of the live judgments matching `where`."""
    for source in _sources(session, where, sign=sign):
        _upsert(session, source)


def move_review(session: Session, judgment_id: int, before: str | None, after: str | None) -> None:
    """A review's known change of one judgment's reviewer decision (None: unreviewed), after its UPDATE."""
    if before == after:
        return
    one = col(_J.id) == judgment_id
    if before is not None:
        for source in _sources(session, one, sign=-1, human=before):
            _upsert(session, source)
    if after is not None:
        for source in _sources(session, one, sign=1, human=after):
            _upsert(session, source)


def rebuild(session: Session) -> None:
    """Every count from the judgments and verdicts (the `recount` CLI and the migration's backfill)."""
    session.execute(delete(COUNTS))
    shift(session, literal(True), 1)
    # Rows a retraction left at zero are dropped by a rebuild; none are negative.
    session.execute(delete(COUNTS).where(COUNTS.c.n == 0))


def nonzero() -> ColumnElement[bool]:
    """Count rows that still hold judgments (a row may fall to 0 and stay)."""
    return COUNTS.c.n > 0


def positive(column: Any) -> Any:
    """`column` where positive, else 0 (sums of counts that include retracted rows)."""
    return case((column > 0, column), else_=0)
