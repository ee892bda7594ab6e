"""The correction cache (seed 004): reviews of AI judgments and the history the judge learns from.

Two halves:

- **Writes.** A reviewer confirms or overrules a judgment with `record_review`. The write is an
  optimistic-locking `UPDATE ... WHERE id = :id AND version = :expected`: when another reviewer
  changed the judgment first, zero rows match and `ReviewConflict` carries their decision back,
  so nothing is ever silently overwritten. Every write keeps the indexed `was_corrected` column in
  step and appends a `JudgmentEvent` in the same transaction; no write happens without a reviewer.
- **Reads.** `select_history` is the seed-004 selection (two pools newest first, 75/25 slots,
  one-directional fill, interleave starting with a correction). Each pool is one LIMITed query on
  the `(product[, metric], was_corrected, timestamp)` index, so at a million judgments the work is
  two short index range scans plus the seed's arithmetic on at most `max_entries` rows per pool.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd
from sqlalchemy import Engine, bindparam, delete, insert, or_, text, update
from sqlalchemy.orm import aliased, object_session
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session, col, select

from lib import counters, judge_versions, prepared
from lib.auth import Actor, Permission, authorize, identity_of
from lib.display import REVIEWED_BY, evaluation_url, judgment_url, role_field
from lib.judgment_text import format_score as format_score  # their home; imported from here by many
from lib.judgment_text import parse_score as parse_score
from lib.locks import PG_REVIEW_COUNTERS_LOCK, one_writer_per_product
from lib.metrics import MetricSpec, metrics_for_product
from lib.models import (
    CACHE_DECISIONS,
    UNVERSIONED,
    AlignmentCall,
    AlignmentExperiment,
    AlignmentItem,
    EvaluationSnapshot,
    JudgeVerdict,
    JudgeVersion,
    Judgment,
    JudgmentEvent,
    ReviewLabel,
    ReviewQueueJudgment,
    compute_was_corrected,
    utcnow,
)
from lib.scores import utc_day, week_of

log = logging.getLogger(__name__)

HISTORY_EMPTY_TEXT = "No previous judgments available"
REVIEW_STATES = ("unreviewed", "confirmed", "corrected")
# Cap on a filtered CSV download: enough for any spreadsheet, bounded for the server's memory.
CSV_ROW_LIMIT = 100_000
_WHITESPACE_RE = re.compile(r"\s+")


class MissingReviewer(ValueError):
    """A write was attempted without naming the reviewer who makes it."""


class JudgmentNotFound(LookupError):
    """No judgment has this id or change_id."""


class InvalidDecision(ValueError):
    """A reviewer's decision does not fit the judgment's scale or label set, or lacks a reason."""


@dataclass(frozen=True)
class JudgmentState:
    """A judgment's reviewable state as plain data, safe to keep after its session is gone."""

    id: int
    change_id: str
    product: str
    metric: str | None
    decision: str
    user_decision: str | None
    user_reasoning: str | None
    reviewer: str | None
    reviewed_at: datetime | None
    version: int
    was_corrected: bool
    changed_by: str | None = None  # who made the latest change (from the audit trail)
    judge_version: str = judge_versions.UNVERSIONED_NAME  # the version whose decision `decision` is

    @classmethod
    def of(cls, judgment: Judgment, changed_by: str | None = None) -> JudgmentState:
        """Copy the fields a conflict message needs."""
        assert judgment.id is not None
        return cls(
            id=judgment.id,
            change_id=judgment.change_id,
            product=judgment.product,
            metric=judgment.metric,
            decision=judgment.decision,
            user_decision=judgment.user_decision,
            user_reasoning=judgment.user_reasoning,
            reviewer=judgment.reviewer,
            reviewed_at=judgment.reviewed_at,
            version=judgment.version,
            was_corrected=judgment.was_corrected,
            changed_by=changed_by,
            judge_version=_version_name(judgment),
        )


# The judge's and the reviewer's decisions under lib.display's names (the table stores them as
# seed 004's `decision` and `user_decision`).
JUDGE_DECISION, JUDGE_REASON = role_field("judge", "decision"), role_field("judge", "reason")
REVIEWER_DECISION, REVIEWER_REASON = role_field("reviewer", "decision"), role_field("reviewer", "reason")
# API v1 (`/judgments/{change_id}`) names a judgment's fields by lib.display's rule; seed 004's
# names, which v1 used first, stay beside them until API v2 so pipelines written against them keep
# working (docs/api.md, "Field names").
JUDGMENT_API_ALIASES = {
    "decision": JUDGE_DECISION,
    "user_decision": REVIEWER_DECISION,
    "user_reasoning": REVIEWER_REASON,
    "reviewer": REVIEWED_BY,
}


def _version_name(judgment: Judgment) -> str:
    """The name of the judge version whose decision the judgment holds (read in its own session)."""
    session = object_session(judgment)
    if not judgment.judge_version_id or session is None:
        return judge_versions.name_for(judgment.judge_version_id, None)
    found = session.get(JudgeVersion, judgment.judge_version_id)
    return found.name if found is not None else judge_versions.name_for(judgment.judge_version_id, None)


def judgment_state_json(state: JudgmentState) -> dict[str, Any]:
    """A judgment's state as the API sends it: role-named fields, then the deprecated v1 aliases."""
    return {
        "id": state.id,
        "change_id": state.change_id,
        "product": state.product,
        "metric": state.metric,
        JUDGE_DECISION: state.decision,
        REVIEWER_DECISION: state.user_decision,
        REVIEWER_REASON: state.user_reasoning,
        REVIEWED_BY: state.reviewer,
        "reviewed_at": state.reviewed_at,
        "version": state.version,
        "was_corrected": state.was_corrected,
        "changed_by": state.changed_by,
        "judge_version": state.judge_version,
        **{old: getattr(state, old) for old in JUDGMENT_API_ALIASES},
    }


class ReviewConflict(Exception):
    """Another change reached the judgment first; carries its current state so the UI can show it."""

    def __init__(self, current: JudgmentState, expected_version: int) -> None:
        self.current = current
        self.expected_version = expected_version
        super().__init__(self.describe())

    def describe(self) -> str:
        """One paragraph for the reviewer: who changed it, to what, and that nothing was saved."""
        cur = self.current
        who = cur.changed_by or cur.reviewer or "someone else"
        when = f" at {cur.reviewed_at:%Y-%m-%d %H:%M} UTC" if cur.reviewed_at else ""
        if cur.user_decision is None:
            what = f"the judge's decision is now {cur.decision} and it is unreviewed"
        elif cur.was_corrected:
            what = f"overruled the judge ({cur.decision}) with {cur.user_decision}"
        else:
            what = f"confirmed the judge's decision {cur.decision}"
        reason = f' Their reason: "{cur.user_reasoning}".' if cur.user_reasoning else ""
        return (
            f"Not saved: {who} changed {cur.change_id} while you were reviewing it{when} — {what}.{reason} "
            f"(you saw version {self.expected_version}, it is now version {cur.version}). "
            "Review the current state and submit again if you still disagree."
        )


# ---------------------------------------------------------------------------------------------
# Scales: what a reviewer may answer for one judgment


@dataclass(frozen=True)
class DecisionScale:
    """How a judgment's decision is expressed: a score on its metric's scale, or one of a label set."""

    spec: MetricSpec | None = None
    labels: tuple[str, ...] = ()

    @property
    def is_score(self) -> bool:
        return self.spec is not None

    def describe(self) -> str:
        """ "1–5", "0–1 (continuous)", "any number" or "INCLUDE / EXCLUDE / UNCERTAIN"."""
        if self.spec is None:
            return " / ".join(self.labels)
        if not (math.isfinite(self.spec.min_value) and math.isfinite(self.spec.max_value)):
            return "any number"
        return self.spec.scale_label()

    def parse(self, value: Any) -> str:
        """The canonical text of a reviewer's answer, or InvalidDecision saying why it does not fit."""
        if self.spec is None:
            label = str(value or "").strip()
            if label.upper() in self.labels:
                label = label.upper()
            if label not in self.labels:
                raise InvalidDecision(f"decision {label!r} is not one of {', '.join(self.labels)}")
            return label
        number = parse_score(value)
        if number is None:
            raise InvalidDecision(f"score {value!r} for {self.spec.slug!r} is not a number")
        try:
            return format_score(self.spec.validate(number))
        except ValueError as exc:
            raise InvalidDecision(str(exc)) from None


def decision_scale(*, session: Session, judgment: Judgment) -> DecisionScale:
    """The scale a reviewer answers on: the metric's rubric scale for scores (for a metric since removed,
    the scale of the version that judged it), else the label set."""
    if judgment.metric:
        for spec in metrics_for_product(session=session, product=judgment.product):
            if spec.slug == judgment.metric:
                return DecisionScale(spec=spec)
        # A metric since removed from the rubric: the scale of the version that judged it.
        for spec in judge_versions.version_rubric(session, judgment.judge_version_id):
            if spec.slug == judgment.metric:
                return DecisionScale(spec=spec)
    if judgment.decision in CACHE_DECISIONS or parse_score(judgment.decision) is None:
        labels = (
            CACHE_DECISIONS if judgment.decision in CACHE_DECISIONS else (*CACHE_DECISIONS, judgment.decision)
        )
        return DecisionScale(labels=labels)
    # A score whose metric no rubric defines: any number, so the reviewer is never locked out.
    slug = judgment.metric or "score"
    return DecisionScale(
        spec=MetricSpec(
            slug=slug, display_name=slug, min_value=-math.inf, max_value=math.inf, integer_scale=False
        )
    )


def same_decision(judge: str, user: str) -> bool:
    """Scores compare as numbers ("4" equals "4.0"); labels as text."""
    a, b = parse_score(judge), parse_score(user)
    if a is not None and b is not None:
        return a == b
    return judge == user


# ---------------------------------------------------------------------------------------------
# Writes


def require_reviewer(
    reviewer: Actor | str | None, permission: Permission, *, bind: Session | Engine | None
) -> str:
    """The acting reviewer's identity: MissingReviewer when blank (every change records who made it),
    PermissionDenied when their role does not allow `permission` (lib.auth's table)."""
    if not identity_of(reviewer):
        raise MissingReviewer("every change records its reviewer; none was given")
    return authorize(bind, reviewer, permission).identity


REVIEW_ACTIONS = ("confirm", "overrule")


def settle_decision(judge_decision: str, user_decision: str) -> tuple[str, bool]:
    """(decision to store, was_corrected): a confirmation stores the judge's exact text ("4" for 4.0)."""
    decided = judge_decision if same_decision(judge_decision, user_decision) else user_decision
    return decided, compute_was_corrected(judge_decision, decided)


def review_event_row(
    *,
    judgment_id: int,
    change_id: str,
    corrected: bool,
    reviewer: str,
    at: datetime,
    from_decision: str | None,
    to_decision: str,
    reason: str | None,
    version: int,
    queue_id: int | None = None,
) -> dict[str, Any]:
    """The audit-trail row of one review ("overruled" or "confirmed"): the only place one is built.

    `record_review`, `record_reviews`, the cache importer and the demo all write these rows;
    `queue_id` marks a team queue's resolution or adjudication (lib.queues); the key is there only
    then, so bulk inserts that mix these rows with other events keep one set of keys.
    """
    row = {
        "judgment_id": judgment_id,
        "change_id": change_id,
        "action": "overruled" if corrected else "confirmed",
        "reviewer": reviewer,
        "at": at,
        "from_decision": from_decision,
        "to_decision": to_decision,
        "reason": reason,
        "version": version,
    }
    if queue_id is not None:
        row["queue_id"] = queue_id
    return row


@dataclass(frozen=True)
class BulkReview:
    """One review for `record_reviews`: a decision already in the judgment's scale (canonical text)."""

    change_id: str
    user_decision: str
    reviewer: str
    reason: str | None
    reviewed_at: datetime


@dataclass(frozen=True)
class BulkReviewed:
    """What `record_reviews` did: reviews applied, and reviews skipped because their judgment was
    already reviewed (before the call, or by a review that committed while the call waited)."""

    applied: int
    already_reviewed: int


def record_reviews(*, session: Session, reviews: Sequence[BulkReview]) -> BulkReviewed:
    """Bulk-apply reviews to judgments nobody has reviewed yet (loading data, not a reviewer's click).

    Same rows as `record_review` (confirmation keeps the judge's text, version + 1, one audit event
    each), without its per-row version check: already-reviewed judgments are skipped, never
    overwritten. The judgments are read again once locked (`counters.judgments_change`), and that
    read is the one written from: a review committed between the first read and the lock (PostgreSQL;
    SQLite's writers do not overlap) is skipped, where writing from the first read overwrote it and
    gave both events the same version (review8 F5).
    """
    by_change = {r.change_id: r for r in reviews}
    ids = list(by_change)
    unreviewed: list[tuple[str, int]] = []
    found = 0
    for i in range(0, len(ids), 500):
        for judgment_id, change_id, open_ in session.execute(
            select(Judgment.id, Judgment.change_id, col(Judgment.reviewed_at).is_(None)).where(
                col(Judgment.change_id).in_(ids[i : i + 500])
            )
        ).all():
            found += 1
            if open_:
                unreviewed.append((change_id, judgment_id))
    unreviewed.sort()
    applied = 0
    for i in range(0, len(unreviewed), 5000):
        part = col(Judgment.id).in_([judgment_id for _, judgment_id in unreviewed[i : i + 5000]])
        with counters.judgments_change(session=session, where=part):
            rows = session.execute(
                select(Judgment.id, Judgment.change_id, Judgment.decision, Judgment.version)
                .where(part, col(Judgment.reviewed_at).is_(None))
                .order_by(col(Judgment.change_id))
            ).all()
            updates, events = _bulk_review_rows(rows, by_change)
            if updates:
                session.execute(update(Judgment), updates)
        if events:
            session.execute(insert(JudgmentEvent), events)
        applied += len(updates)
    return BulkReviewed(applied=applied, already_reviewed=found - applied)


def _bulk_review_rows(
    rows: Sequence[Any], by_change: Mapping[str, BulkReview]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The judgments' updates and their audit events for `record_reviews`, from rows read under lock."""
    updates, events = [], []
    for judgment_id, change_id, decision, version in rows:
        r = by_change[change_id]
        decided, corrected = settle_decision(decision, r.user_decision)
        updates.append(
            {"id": judgment_id, "user_decision": decided, "user_reasoning": r.reason, "reviewer": r.reviewer,
             "reviewed_at": r.reviewed_at, "version": version + 1, "was_corrected": corrected}
        )  # fmt: skip
        events.append(
            review_event_row(
                judgment_id=judgment_id, change_id=change_id, corrected=corrected, reviewer=r.reviewer,
                at=r.reviewed_at, from_decision=decision, to_decision=decided, reason=r.reason,
                version=version + 1,
            )
        )  # fmt: skip
    return updates, events


def _judgment_at(session: Session, judgment_id: int, expected_version: int) -> Judgment:
    """The judgment as of the version the reviewer saw: the optimistic lock of every review write.

    JudgmentNotFound if it is gone; ReviewConflict, naming who changed it last, if it moved.
    """
    judgment = session.get(Judgment, judgment_id)
    if judgment is None:
        raise JudgmentNotFound(f"no judgment with id {judgment_id}")
    if judgment.version != expected_version:
        raise ReviewConflict(
            JudgmentState.of(judgment, _latest_actor(session, judgment_id)), expected_version
        )
    return judgment


def _latest_actor(session: Session, judgment_id: int) -> str | None:
    return session.exec(
        select(JudgmentEvent.reviewer)
        .where(JudgmentEvent.judgment_id == judgment_id)
        .order_by(col(JudgmentEvent.id).desc())
        .limit(1)
    ).first()


def record_review(
    *,
    session: Session,
    judgment_id: int,
    expected_version: int,
    action: str,
    user_decision: Any = None,
    reviewer: Actor | str | None,
    reason: str | None = None,
    require_reason: bool = True,
    queue_id: int | None = None,
    at: datetime | None = None,
) -> Judgment:
    """Confirm or overrule a judgment as of the version the reviewer saw; ReviewConflict if it moved.

    `action` is "confirm" (stores the judge's decision; `user_decision` is ignored) or "overrule"
    (`user_decision` must parse on the judgment's scale and differ from the judge's). A bad action,
    an unparsable or out-of-scale score and an overrule equal to the judge all raise
    InvalidDecision and change nothing: this is the rule's one home, callers only pass the action.
    `queue_id` marks the decision of a team review queue (lib.queues), undone only through it;
    `at` is when it was decided (default now; a queue passes its own clock).
    """
    name = require_reviewer(reviewer, Permission.REVIEW, bind=session)
    judgment = _judgment_at(session, judgment_id, expected_version)
    decided, reason = review_decision(
        session=session, judgment=judgment, action=action, user_decision=user_decision, reason=reason,
        require_reason=require_reason,
    )  # fmt: skip
    corrected = compute_was_corrected(judgment.decision, decided)
    previous = judgment.user_decision if judgment.user_decision is not None else judgment.decision
    now = at or utcnow()
    event = review_event_row(
        judgment_id=judgment_id, change_id=judgment.change_id, corrected=corrected, reviewer=name, at=now,
        from_decision=previous, to_decision=decided, reason=reason, version=expected_version + 1,
        queue_id=queue_id,
    )  # fmt: skip
    state = ReviewState(user_decision=decided, user_reasoning=reason, reviewer=name, reviewed_at=now)
    return _write_review_state(session, judgment, expected_version, state, event)


def review_decision(
    *,
    session: Session,
    judgment: Judgment,
    action: str,
    user_decision: Any = None,
    reason: str | None = None,
    require_reason: bool = True,
) -> tuple[str, str | None]:
    """(decision to store, reason) for a reviewer's answer on a judgment, or InvalidDecision.

    The one rule for what a reviewer may answer, shared by reviews (`record_review`) and the labels
    of a team queue (lib.queues): "confirm" is the judge's exact decision (allowed even off today's
    rubric); "overrule" must parse on the judgment's scale and differ from the judge's; overruling
    needs a reason unless `require_reason` is False. The reason comes back stripped, or None.
    """
    if action not in REVIEW_ACTIONS:
        raise InvalidDecision(f"action must be one of {', '.join(REVIEW_ACTIONS)}, got {action!r}")
    if action == "confirm":
        decided = judgment.decision
    else:
        decided = decision_scale(session=session, judgment=judgment).parse(user_decision)
        if same_decision(judgment.decision, decided):
            raise InvalidDecision("your decision equals the judge's; confirm the judge instead")
    reason = (reason or "").strip() or None
    if compute_was_corrected(judgment.decision, decided) and require_reason and reason is None:
        raise InvalidDecision("a reason is required when overruling the judge")
    return decided, reason


@dataclass(frozen=True)
class ReviewState:
    """The reviewer's side of a judgment; all None is "unreviewed"."""

    user_decision: str | None = None
    user_reasoning: str | None = None
    reviewer: str | None = None
    reviewed_at: datetime | None = None


def _review_update(session: Session, returning: bool) -> Any:
    """The optimistic-locking UPDATE of a review, returning the row as written (`returning`; SQLite
    before 3.35 has no RETURNING: `_written_row` reads it after): built once (lib.prepared; its
    values are parameters), as building it cost more than running it."""

    def build() -> Any:
        table = Judgment.__table__  # type: ignore[attr-defined]
        c = table.c
        stmt = (
            update(table)
            .where(c.id == bindparam("judgment_id"), c.version == bindparam("expected_version"))
            .values(
                user_decision=bindparam("new_user_decision", type_=c.user_decision.type),
                user_reasoning=bindparam("new_user_reasoning", type_=c.user_reasoning.type),
                reviewer=bindparam("new_reviewer", type_=c.reviewer.type),
                reviewed_at=bindparam("new_reviewed_at", type_=c.reviewed_at.type),
                was_corrected=bindparam("new_was_corrected", type_=c.was_corrected.type),
                version=c.version + 1,
            )
        )
        return stmt.returning(*c) if returning else stmt

    return prepared.built(session, ("review update", returning), build)


def _written_row(session: Session, params: dict[str, Any]) -> Any:
    """The review's UPDATE and the row as written (None when the version check refused it)."""
    returning = prepared.update_returning(session)
    result = session.execute(_review_update(session, returning), params)
    if returning:
        return result.first()
    if result.rowcount != 1:
        return None
    table = Judgment.__table__  # type: ignore[attr-defined]
    return session.execute(select(*table.c).where(table.c.id == params["judgment_id"])).first()


def _write_review_state(
    session: Session, judgment: Judgment, expected_version: int, state: ReviewState, event: dict[str, Any]
) -> Judgment:
    """The one write of a judgment's review state, for a review and for its undo alike.

    An optimistic-locking UPDATE (ReviewConflict when another change got there first) plus the
    audit event, in the caller's transaction. Anything that must stay in step with review states
    (was_corrected here; counters) belongs here, so no path can skip it. `judgment` still holds
    the state before the write until the final refresh.
    """
    assert judgment.id is not None
    judgment_id = judgment.id
    # PostgreSQL: the counters' lock before the judgment's row lock, in every review, so every
    # transaction takes them in one order. A queue item's settlement reviews several judgments in
    # one transaction; had the lock come after the UPDATE, a lone review of its second judgment
    # could hold that row waiting for the lock the settlement held: a deadlock.
    one_writer_per_product(session, PG_REVIEW_COUNTERS_LOCK, [judgment.product])
    written = _written_row(
        session,
        {
            "judgment_id": judgment_id,
            "expected_version": expected_version,
            "new_user_decision": state.user_decision,
            "new_user_reasoning": state.user_reasoning,
            "new_reviewer": state.reviewer,
            "new_reviewed_at": state.reviewed_at,
            "new_was_corrected": compute_was_corrected(judgment.decision, state.user_decision),
        },
    )
    if written is None:
        # Someone committed between our read and our write (PostgreSQL re-checks the WHERE).
        session.expire(judgment)
        current = session.get(Judgment, judgment_id, populate_existing=True)
        if current is None:
            raise JudgmentNotFound(f"judgment {judgment_id} was deleted while you were reviewing it")
        raise ReviewConflict(JudgmentState.of(current, _latest_actor(session, judgment_id)), expected_version)
    # The counters move by this write's known change: `judgment` still holds the replaced state.
    corrected = compute_was_corrected(judgment.decision, state.user_decision)
    was_reviewed, now_reviewed = judgment.reviewed_at is not None, state.reviewed_at is not None
    counters.bump_review(
        session=session,
        judgment_id=judgment_id,
        snapshot_id=judgment.snapshot_id,
        before=counters.ReviewSide(
            judgment.reviewer, was_reviewed, was_reviewed and judgment.was_corrected, judgment.user_decision
        ),
        after=counters.ReviewSide(
            state.reviewer, now_reviewed, now_reviewed and corrected, state.user_decision
        ),
    )
    session.add(JudgmentEvent(**event))
    session.flush()
    # The row as written (what a refresh would read, without reading it again).
    for key, value in written._mapping.items():
        set_committed_value(judgment, key, value)
    announce_review(session=session, judgment=judgment, event=event)
    return judgment


def announce_review(
    *, session: Session, judgment: Judgment, event: Mapping[str, Any], adjudicated: bool = False
) -> int:
    """Queue the webhook deliveries of a review, undo or adjudication (`event`: its audit row) in the
    caller's transaction: the outbox rows commit with the review or not at all (lib.webhooks)."""
    from lib import webhooks

    state = judgment_state_json(JudgmentState.of(judgment, changed_by=event.get("reviewer")))
    at = event.get("at")
    data = {
        "judgment": {
            **{k: v.isoformat() if isinstance(v, datetime) else v for k, v in state.items()},
            "snapshot_id": judgment.snapshot_id,
        },
        "review": {
            "action": "adjudicated" if adjudicated else event.get("action"),
            "reviewer": event.get("reviewer"),
            "at": at.isoformat() if isinstance(at, datetime) else at,
            "from_decision": event.get("from_decision"),
            "to_decision": event.get("to_decision"),
            "reason": event.get("reason"),
            "queue_id": event.get("queue_id"),
        },
    }
    return webhooks.enqueue(
        session=session,
        events=webhooks.review_events(str(event.get("action")), adjudicated=adjudicated),
        data=data,
    )


# ---------------------------------------------------------------------------------------------
# Undo: a reviewer takes back their own latest decision, as a new audit event

UNDO_ACTION = "undone"
REVIEW_EVENT_ACTIONS = ("confirmed", "overruled")


class NothingToUndo(ValueError):
    """The judgment's latest change is not a decision of this reviewer, so there is nothing of theirs to undo."""


def _review_stack(events: Sequence[JudgmentEvent]) -> list[JudgmentEvent]:
    """The decisions in force, oldest first: each review pushes, each undo pops the one it undid.

    Replaying the trail is how an undo finds the state before the decision it takes back (the
    decision before it, or "unreviewed"), however many reviews and undos came before.
    """
    stack: list[JudgmentEvent] = []
    for event in sorted(events, key=lambda e: e.id or 0):
        if event.action in REVIEW_EVENT_ACTIONS:
            stack.append(event)
        elif event.action == UNDO_ACTION and stack:
            stack.pop()
    return stack


def undoable_event(
    events: Sequence[JudgmentEvent], reviewer: str | None, *, queue_id: int | None = None
) -> JudgmentEvent | None:
    """The decision of `reviewer` that an undo would take back: the trail's latest event, when it is
    their confirmation or overrule; else None (someone changed it since, or it is not theirs).

    A team queue's decision (its event carries `queue_id`) is undone only through that queue
    (lib.queues passes `queue_id`), which reopens the labels behind it; a plain undo never sees it.
    """
    if not events or not reviewer:
        return None
    latest = max(events, key=lambda e: e.id or 0)
    if latest.action not in REVIEW_EVENT_ACTIONS or latest.reviewer != reviewer:
        return None
    if latest.queue_id != queue_id:
        return None
    return latest


def undo_review(
    *,
    session: Session,
    judgment_id: int,
    expected_version: int,
    reviewer: Actor | str | None,
    queue_id: int | None = None,
    at: datetime | None = None,
) -> Judgment:
    """Undo the reviewer's own latest decision on a judgment, as of the version they saw.

    The state before that decision comes back (the earlier decision, or unreviewed) and an
    "undone" event is appended: history is never deleted. Same rules as `record_review`: the
    REVIEW permission, ReviewConflict when the judgment moved, one write path. NothingToUndo
    when the latest change is not this reviewer's decision (only your own last decision can go).
    `queue_id`: take back a team queue's decision (lib.queues only); `at`: when (default now).
    """
    name = require_reviewer(reviewer, Permission.REVIEW, bind=session)
    judgment = _judgment_at(session, judgment_id, expected_version)
    events = events_for(session=session, judgment_id=judgment_id)
    target = undoable_event(events, name, queue_id=queue_id)
    if target is None:
        raise NothingToUndo(
            f"the latest change of {judgment.change_id} is not a decision of yours, so there is nothing to undo"
        )
    stack = _review_stack(events)
    before = stack[-2] if len(stack) > 1 else None  # stack[-1] is `target`: nothing came after it
    state = (
        ReviewState(
            user_decision=before.to_decision, user_reasoning=before.reason, reviewer=before.reviewer,
            reviewed_at=before.at,
        )
        if before is not None
        else ReviewState()
    )  # fmt: skip
    event = undo_event_row(
        judgment_id=judgment_id, change_id=judgment.change_id, reviewer=name, at=at or utcnow(),
        undone=target, to_decision=state.user_decision, version=expected_version + 1, queue_id=queue_id,
    )  # fmt: skip
    return _write_review_state(session, judgment, expected_version, state, event)


def undo_event_row(
    *,
    judgment_id: int,
    change_id: str,
    reviewer: str,
    at: datetime,
    undone: JudgmentEvent | Mapping[str, Any],
    to_decision: str | None,
    version: int,
    queue_id: int | None = None,
) -> dict[str, Any]:
    """The audit-trail row of an undo of the decision `undone` (an event or its row): the only place
    one is built (`undo_review`, and bench/gen.py's audit trail)."""
    taken = undone if isinstance(undone, Mapping) else undone.model_dump()
    return {
        "judgment_id": judgment_id,
        "change_id": change_id,
        "action": UNDO_ACTION,
        "reviewer": reviewer,
        "at": at,
        "from_decision": taken["to_decision"],
        "to_decision": to_decision,
        "reason": f"undid the decision of {taken['at']:%Y-%m-%d %H:%M:%S} UTC ({taken['action']})",
        "version": version,
        "queue_id": queue_id,
    }


def undoable_reviews(*, session: Session, reviewer: str, limit: int = 5) -> list[JudgmentEvent]:
    """The reviewer's latest decisions that an undo can still take back, newest first.

    A decision qualifies while it is the latest change of its judgment. Served by the
    (reviewer, id) index: a walk back through this reviewer's events only, each checked with one
    probe of the judgment_id index, however large the audit trail grows.
    """
    if not reviewer:
        return []
    later = aliased(JudgmentEvent)
    newer = (
        select(later.id)
        .where(
            col(later.judgment_id) == col(JudgmentEvent.judgment_id), col(later.id) > col(JudgmentEvent.id)
        )
        .exists()
    )
    stmt = (
        select(JudgmentEvent)
        .where(
            col(JudgmentEvent.reviewer) == reviewer,
            col(JudgmentEvent.action).in_(REVIEW_EVENT_ACTIONS),
            col(JudgmentEvent.queue_id).is_(None),  # a queue's decisions are undone in the queue
            ~newer,
        )
        .order_by(col(JudgmentEvent.id).desc())
        .limit(limit)
    )
    return list(session.exec(stmt).all())


def update_with_user_decision(
    *,
    session: Session,
    change_id: str,
    user_decision: Any,
    user_reasoning: str | None = None,
    reviewer: Actor | str | None,
    expected_version: int | None = None,
) -> Judgment:
    """Seed-004 API: record a reviewer's decision by change_id (reason optional, as in the seed)."""
    judgment = get_judgment(session=session, change_id=change_id)
    if judgment is None:
        raise JudgmentNotFound(f"no judgment with change_id {change_id!r}")
    assert judgment.id is not None
    # The seed API takes a decision, not an action: the judge's own decision is a confirmation.
    confirm = same_decision(judgment.decision, str(user_decision).strip())
    return record_review(
        session=session,
        judgment_id=judgment.id,
        expected_version=judgment.version if expected_version is None else expected_version,
        action="confirm" if confirm else "overrule",
        user_decision=user_decision,
        reviewer=reviewer,
        reason=user_reasoning,
        require_reason=False,
    )


# What a re-judge replaces. `label` names the replaced `decision` (the source's "correct" for its 1):
# kept, the stored-label lookup (lib.importer._stored_label_scores) read the re-judge's number for
# it (review12 F2); the incoming judgment's own label (None from the LLM judge) replaces it.
_JUDGE_FIELDS = (
    "product", "metric", "snapshot_id", "decision", "confidence", "reasoning", "label", "timestamp", "url",
    "description", "ai_provider", "judge_model", "judge_version_id",
)  # fmt: skip
_REVIEW_FIELDS = ("user_decision", "user_reasoning", "reviewer", "reviewed_at")


def _final(decision: str, user_decision: str | None) -> str:
    return user_decision if user_decision is not None else decision


def add_judgment(
    *, session: Session, judgment: Judgment, reviewer: Actor | str | None, expected_version: int | None = None
) -> Judgment:
    """Seed-004 API: add a judgment, or re-judge the stored one with the same change_id.

    A re-judge never loses a reviewer's correction:

    - an entry a reviewer decided is kept as it is when the final decisions agree (the seed's
      rule: the correction stays in the history pool), with a "rejudge_kept" audit event;
    - when they disagree, the judge's fields are replaced but the reviewer's decision stays (it
      still corrects the new decision), and a "rejudge_conflict" event records both sides;
    - an unreviewed entry is simply replaced ("rejudged").

    `expected_version` (when given) is checked like a review's: ReviewConflict if the entry moved.
    """
    name = require_reviewer(reviewer, Permission.IMPORT, bind=session)
    if judgment.user_decision is not None and judgment.reviewed_at is None:
        # A seed-004 entry with a user override is reviewed: give it the review time the counters,
        # list and queue read (the judgment's own time, as the cache importer does).
        judgment.reviewed_at = judgment.timestamp or utcnow()
        judgment.reviewer = judgment.reviewer or name
    # No reviews' lock here (PostgreSQL): the one lock every reviewer of every product waits for
    # must not be held by a writer that may wait on an import's rows (a re-judge's new day row, its
    # evaluation's product row): every reviewer would wait out the import (review15 F1). The cycle
    # a re-judge can close with an archive is survived instead: lib.db.write_retrying runs it again.
    existing = session.exec(
        select(Judgment).where(col(Judgment.change_id) == judgment.change_id).with_for_update()
    ).first()
    if existing is None:
        judgment.was_corrected = compute_was_corrected(judgment.decision, judgment.user_decision)
        judgment.version = 1
        session.add(judgment)
        session.flush()
        assert judgment.id is not None
        return _log_judge_event(session, judgment, name, "judged", None, judgment.decision)
    assert existing.id is not None
    if expected_version is not None and existing.version != expected_version:
        raise ReviewConflict(
            JudgmentState.of(existing, _latest_actor(session, existing.id)), expected_version
        )
    previous = _final(existing.decision, existing.user_decision)
    incoming = _final(judgment.decision, judgment.user_decision)
    if existing.user_decision is None:
        _set_aside_verdict(session, existing, judgment)
        for field in (*_JUDGE_FIELDS, *_REVIEW_FIELDS):
            setattr(existing, field, getattr(judgment, field))
        return _replace(session, existing, name, "rejudged", previous, None)
    if same_decision(existing.user_decision, incoming):
        # The entry stays; the re-judging version's decision is kept beside it (agreement by version).
        _keep_verdict(session, existing.id, judgment.judge_version_id, judgment)
        return _log_judge_event(
            session, existing, name, "rejudge_kept", previous, incoming,
            reason=f"the re-judge ({judgment.decision}) agrees with {existing.reviewer}'s decision; entry kept",
        )  # fmt: skip
    conflict = (
        f"the re-judge decided {incoming}; {existing.reviewer}'s decision {existing.user_decision} "
        + (f'("{existing.user_reasoning}") ' if existing.user_reasoning else "")
        + ("is kept" if judgment.user_decision is None else f"was replaced by {judgment.user_decision}")
    )
    fields = _JUDGE_FIELDS if judgment.user_decision is None else (*_JUDGE_FIELDS, *_REVIEW_FIELDS)
    _set_aside_verdict(session, existing, judgment)
    for field in fields:
        setattr(existing, field, getattr(judgment, field))
    return _replace(session, existing, name, "rejudge_conflict", previous, conflict)


def _keep_verdict(
    session: Session, judgment_id: int | None, version_id: int | None, verdict: Judgment
) -> None:
    """Store a version's decision on a judgment beside the judgment's own (one row per version)."""
    assert judgment_id is not None
    key = (judgment_id, int(version_id or UNVERSIONED))
    row = session.get(JudgeVerdict, key)
    judged_at = verdict.timestamp or utcnow()
    if row is None:
        row = JudgeVerdict(judgment_id=judgment_id, judge_version_id=key[1], decision=verdict.decision,
                           judged_at=judged_at, week=week_of(utc_day(judged_at)))  # fmt: skip
    row.decision, row.confidence, row.reasoning = verdict.decision, verdict.confidence, verdict.reasoning
    row.judged_at, row.week = judged_at, week_of(utc_day(judged_at))
    session.add(row)


def _set_aside_verdict(session: Session, existing: Judgment, incoming: Judgment) -> None:
    """Before a re-judge replaces a judgment's decision: keep the replaced version's decision as a
    verdict, and drop the incoming version's earlier verdict (its decision is now the judgment's)."""
    if int(existing.judge_version_id or UNVERSIONED) == int(incoming.judge_version_id or UNVERSIONED):
        return
    _keep_verdict(session, existing.id, existing.judge_version_id, existing)
    stale = session.get(JudgeVerdict, (existing.id, int(incoming.judge_version_id or UNVERSIONED)))
    if stale is not None:
        session.delete(stale)


def _replace(
    session: Session, stored: Judgment, name: str, action: str, previous: str, reason: str | None
) -> Judgment:
    stored.was_corrected = compute_was_corrected(stored.decision, stored.user_decision)
    stored.version += 1
    session.add(stored)
    session.flush()
    return _log_judge_event(session, stored, name, action, previous, stored.decision, reason=reason)


def _log_judge_event(
    session: Session,
    stored: Judgment,
    name: str,
    action: str,
    previous: str | None,
    to: str,
    *,
    reason: str | None = None,
) -> Judgment:
    assert stored.id is not None
    session.add(
        JudgmentEvent(
            judgment_id=stored.id, change_id=stored.change_id, action=action, reviewer=name,
            from_decision=previous, to_decision=to, reason=reason, version=stored.version,
        )
    )  # fmt: skip
    session.flush()
    return stored


def experiments_on_product(*, session: Session, product: str) -> list[AlignmentExperiment]:
    """The alignment experiments clearing `product` deletes: the product's own, and any that sampled
    one of its judgments. Their items are the reviewers' scores of those judgments, so their measures
    describe data that no longer exists once the judgments go (issue 24)."""
    judgment_ids = select(Judgment.id).where(col(Judgment.product) == product)
    sampled = select(AlignmentItem.experiment_id).where(col(AlignmentItem.judgment_id).in_(judgment_ids))
    return list(
        session.exec(
            select(AlignmentExperiment)
            .where(or_(col(AlignmentExperiment.product) == product, col(AlignmentExperiment.id).in_(sampled)))
            .order_by(col(AlignmentExperiment.id))
        ).all()
    )


def clear_product(*, session: Session, product: str, reviewer: Actor | str | None) -> int:
    """Seed-004 API: remove every judgment of a product (with its audit trail); returns the count.

    In the same transaction the product's alignment experiments go too (`experiments_on_product`,
    with their items and calls): they sampled these judgments, which their rows reference. A run of
    one of them still in progress stops at its next call (it finds its experiment gone).
    """
    name = require_reviewer(reviewer, Permission.CLEAR_CACHE, bind=session)
    experiment_ids = [e.id for e in experiments_on_product(session=session, product=product)]
    if experiment_ids:
        for table in (AlignmentItem, AlignmentCall):
            session.execute(delete(table).where(col(table.experiment_id).in_(experiment_ids)))
        session.execute(delete(AlignmentExperiment).where(col(AlignmentExperiment.id).in_(experiment_ids)))
    ids = select(Judgment.id).where(Judgment.product == product).scalar_subquery()
    with counters.judgments_change(
        session=session,
        where=col(Judgment.product) == product,
        snapshots=col(EvaluationSnapshot.product) == product,
    ):
        session.execute(delete(JudgmentEvent).where(col(JudgmentEvent.judgment_id).in_(ids)))
        session.execute(delete(JudgeVerdict).where(col(JudgeVerdict.judgment_id).in_(ids)))
        # Team queues' labels and holds on them go too (an item left empty is passed over).
        session.execute(delete(ReviewLabel).where(col(ReviewLabel.judgment_id).in_(ids)))
        session.execute(delete(ReviewQueueJudgment).where(col(ReviewQueueJudgment.judgment_id).in_(ids)))
        result = session.execute(delete(Judgment).where(col(Judgment.product) == product))
    removed = int(result.rowcount or 0)  # type: ignore[attr-defined]
    # The events go with their judgments (they reference them); the clearing itself is logged.
    log.warning(
        "%s cleared product %r: %d judgments and their history deleted, and %d alignment experiments",
        name,
        product,
        removed,
        len(experiment_ids),
    )
    return removed


# ---------------------------------------------------------------------------------------------
# Reads


def get_judgment(*, session: Session, change_id: str) -> Judgment | None:
    """Seed-004 API: one judgment by its change_id."""
    return session.exec(select(Judgment).where(Judgment.change_id == change_id)).first()


def live_judgment() -> Any:
    """Seed 002 AD-13: a judgment counts only while its evaluation is live (not archived/deleted).

    "Stand-alone, or not one of the archived evaluations": the archived ids are read once per
    statement (a range of the list index; the database keeps them as a set) and each judgment a
    list walks is tested against that set, where a probe of its evaluation's row per judgment cost
    two index seeks each (issue 27). select_history keeps its plain index walk and drops archived
    rows after it (`_live_pool`).
    """
    archived = select(EvaluationSnapshot.id).where(col(EvaluationSnapshot.deleted_at).is_not(None))
    return or_(col(Judgment.snapshot_id).is_(None), col(Judgment.snapshot_id).not_in(archived))


def _check_history_params(max_entries: int, correction_ratio: float) -> None:
    # Outside these ranges the seed's arithmetic yields negative slot counts (and its loop may
    # never end), so they are refused rather than reproduced.
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"max_entries must be a whole number >= 0, got {max_entries!r}")
    if not (isinstance(correction_ratio, int | float) and 0.0 <= correction_ratio <= 1.0):
        raise ValueError(f"correction_ratio must be between 0 and 1, got {correction_ratio!r}")


def _pool_statement(
    product: str,
    metric: str | None,
    corrected: bool,
    limit: int,
    *,
    as_of: datetime | None = None,
    exclude_snapshot: str | None = None,
) -> Any:
    """The newest `limit` judgments of one pool, straight off the history index.

    `as_of` is the no-leakage rule of the alignment lab: only judgments that existed then, and none
    reviewed after it (its review state then is unknown, so it is left out rather than guessed);
    `exclude_snapshot` drops the judged evaluation's own judgments.
    """
    stmt = select(Judgment).where(col(Judgment.product) == product, col(Judgment.was_corrected) == corrected)
    if metric is not None:
        stmt = stmt.where(col(Judgment.metric) == metric)
    if as_of is not None:
        stmt = stmt.where(
            col(Judgment.timestamp) <= as_of,
            or_(col(Judgment.reviewed_at).is_(None), col(Judgment.reviewed_at) <= as_of),
        )
    if exclude_snapshot is not None:
        stmt = stmt.where(
            or_(col(Judgment.snapshot_id).is_(None), col(Judgment.snapshot_id) != exclude_snapshot)
        )
    # Ties on timestamp keep insertion order, as the seed's stable sort over its dict does.
    return stmt.order_by(col(Judgment.timestamp).desc(), col(Judgment.id)).limit(limit)


def _live_pool(
    session: Session,
    product: str,
    metric: str | None,
    corrected: bool,
    limit: int,
    *,
    as_of: datetime | None = None,
    exclude_snapshot: str | None = None,
) -> list[Judgment]:
    """The newest `limit` judgments of one pool whose evaluation is live (seed 002 AD-13).

    The pool query stays the plain walk of the history index; archived evaluations' judgments are
    dropped after it, with one primary-key probe of their snapshots, and the walk continues (in
    doubling pages) only when some were dropped. A filter inside the query would let PostgreSQL
    trade the index walk for a scan and sort of the whole product (measured: 0.1 ms → 12 ms).
    """
    found: list[Judgment] = []
    offset, page = 0, limit
    while len(found) < limit:
        stmt = _pool_statement(
            product, metric, corrected, page, as_of=as_of, exclude_snapshot=exclude_snapshot
        )
        chunk = list(session.exec(stmt.offset(offset)).all())
        linked = {j.snapshot_id for j in chunk if j.snapshot_id is not None}
        archived = set(
            session.exec(
                select(EvaluationSnapshot.id).where(
                    col(EvaluationSnapshot.id).in_(linked), col(EvaluationSnapshot.deleted_at).is_not(None)
                )
            ).all()
        ) if linked else set()  # fmt: skip
        found.extend(j for j in chunk if j.snapshot_id not in archived)
        if len(chunk) < page:
            break
        offset, page = offset + page, page * 2
    return found[:limit]


def history_pool_sql(
    *, session: Session, product: str, metric: str | None, corrected: bool, limit: int
) -> str:
    """The SQL of one pool query with literals inlined, for EXPLAIN in the benchmark and tests."""
    stmt = _pool_statement(product, metric, corrected, limit)
    bind = session.get_bind()
    return str(stmt.compile(dialect=bind.dialect, compile_kwargs={"literal_binds": True}))


def select_history(
    session: Session,
    product: str,
    max_entries: int = 20,
    correction_ratio: float = 0.75,
    metric: str | None = None,
    *,
    as_of: datetime | None = None,
    exclude_snapshot: str | None = None,
) -> list[Judgment]:
    """Seed 004: past judgments for the next prompt, 75% corrections, interleaved, newest first.

    With `as_of` / `exclude_snapshot` it is the history a judge could have seen when that
    evaluation was created, without the evaluation itself (the alignment lab's re-judging).
    """
    _check_history_params(max_entries, correction_ratio)
    # No slot ever takes more than max_entries rows from one pool, so nothing beyond that is read.
    window = {"as_of": as_of, "exclude_snapshot": exclude_snapshot}
    corrected = _live_pool(session, product, metric, True, max_entries, **window)
    correct = _live_pool(session, product, metric, False, max_entries, **window)

    # From here on: the seed's Steps 4 and 5, line for line.
    target_corrections = int(max_entries * correction_ratio)
    target_correct = max_entries - target_corrections

    actual_corrections = min(len(corrected), target_corrections)
    actual_correct = min(len(correct), target_correct)

    # One-directional fill, as in the seed: if the correction pool is short, only the correct pool
    # fills; the correction pool fills only when it met its target.
    remaining_slots = max_entries - actual_corrections - actual_correct
    if remaining_slots > 0:
        if actual_corrections < target_corrections:
            extra_correct = min(remaining_slots, len(correct) - actual_correct)
            actual_correct += extra_correct
        else:
            extra_corrections = min(remaining_slots, len(corrected) - actual_corrections)
            actual_corrections += extra_corrections

    corr_iter = iter(corrected[:actual_corrections])
    correct_iter = iter(correct[:actual_correct])
    result: list[Judgment] = []
    while len(result) < max_entries:
        try:  # noqa: SIM105 - kept exactly as the seed writes it
            result.append(next(corr_iter))
        except StopIteration:
            pass
        if len(result) < max_entries:
            try:  # noqa: SIM105
                result.append(next(correct_iter))
            except StopIteration:
                pass
        if len(result) == actual_corrections + actual_correct:
            break
    return result


def sort_by_rubric(*, session: Session, judgments: list[Judgment]) -> list[Judgment]:
    """Judgments of one evaluation in its product's rubric order (unknown metrics last)."""
    if judgments:
        order = {
            s.slug: i
            for i, s in enumerate(metrics_for_product(session=session, product=judgments[0].product))
        }
        judgments.sort(key=lambda j: (order.get(j.metric or "", len(order)), j.metric or "", j.id or 0))
    return judgments


def metric_titles(*, session: Session, judgments: Sequence[Judgment]) -> dict[int, str]:
    """Per judgment id, the heading a reviewer sees: the metric's display name, else the change id."""
    names: dict[str, dict[str, str]] = {}
    titles: dict[int, str] = {}
    for j in judgments:
        if j.id is None:
            continue
        if j.metric and j.product not in names:
            names[j.product] = {
                s.slug: s.display_name for s in metrics_for_product(session=session, product=j.product)
            }
        titles[j.id] = names.get(j.product, {}).get(j.metric or "", j.metric or j.change_id)
    return titles


def _one_line(text: str | None) -> str:
    """User and judge text on one line, so an entry can never forge the block's structure."""
    return _WHITESPACE_RE.sub(" ", text or "").strip()


def format_history_for_prompt(judgments: Sequence[Judgment]) -> str:
    """The history block a judge prompt contains; the seed's cold-start note when there is none."""
    if not judgments:
        return HISTORY_EMPTY_TEXT
    lines = [
        "PREVIOUS JUDGMENTS (newest first; learn from what reviewers corrected):",
    ]
    for n, j in enumerate(judgments, start=1):
        if j.was_corrected:
            tag = "CORRECTED"
        elif j.user_decision is not None:
            tag = "CONFIRMED"
        else:
            tag = "NOT REVIEWED"
        subject = _one_line(j.change_id)
        if j.metric:
            subject += f" | metric: {_one_line(j.metric)}"
        if j.description:
            subject += f" | {_one_line(j.description)}"
        lines.append(f"{n}. [{tag}] {subject}")
        judge = f"   AI decision: {_one_line(j.decision)}"
        if j.reasoning:
            judge += f" | AI reasoning: {_one_line(j.reasoning)}"
        lines.append(judge)
        if j.was_corrected:
            user = f"   Reviewer's decision: {_one_line(j.user_decision)}"
            if j.user_reasoning:
                user += f" | Reviewer's reason: {_one_line(j.user_reasoning)}"
            lines.append(user)
        elif j.user_decision is not None and j.user_reasoning:
            lines.append(f"   Reviewer agreed: {_one_line(j.user_reasoning)}")
    return "\n".join(lines)


def stats(
    *, session: Session, product: str | None = None, metric: str | None = None, reviewer: str | None = None
) -> dict[str, Any]:
    """Seed-004 `stats` from lib.counters: totals, corrected vs correct, correction rate, products, days.

    As the seed defines them: `correction_rate` = corrected ÷ every judgment (45 of 150 = 0.30) and
    `correct_count` = total − corrected, so unreviewed judgments count as correct. `reviewed_count`
    is added; corrected ÷ reviewed, which the pages show, is `counters.corrected_of_reviewed`.
    `metric` and `reviewer` narrow the figures as the Corrections page's filters do (a reviewer's
    judgments are those they reviewed last). Oldest and newest are days (UTC), what the counters keep.
    """
    if reviewer is not None:
        mine = counters.reviewer_summary(session=session, reviewer=reviewer, product=product, metric=metric)
        totals, products, oldest, newest = mine.totals, mine.products, mine.first_day, mine.last_day
    else:
        totals = counters.judgment_totals(session=session, product=product, metric=metric)
        oldest, newest = counters.judged_day_range(session=session, product=product, metric=metric)
        if metric is not None:
            products = [p for p in counters.judged_products(session=session)
                        if counters.judgment_totals(session=session, product=p, metric=metric).judgments]  # fmt: skip
        else:
            products = list(counters.judgment_totals_by_product(session=session))
        if product is not None:
            products = [product] if product in products else []
    return {
        "total_judgments": totals.judgments,
        "reviewed_count": totals.reviewed,
        "corrected_count": totals.corrected,
        "correct_count": totals.judgments - totals.corrected,
        "correction_rate": totals.corrected / totals.judgments if totals.judgments else None,
        "products": products,
        "oldest_judgment": oldest,
        "newest_judgment": newest,
    }


def events_for(*, session: Session, judgment_id: int) -> list[JudgmentEvent]:
    """A judgment's audit trail, oldest first."""
    return list(
        session.exec(
            select(JudgmentEvent)
            .where(JudgmentEvent.judgment_id == judgment_id)
            .order_by(col(JudgmentEvent.at), col(JudgmentEvent.id))
        ).all()
    )


def events_frame(events: Sequence[JudgmentEvent]) -> pd.DataFrame:
    """The audit trail as a table: who, when, what, from, to, why."""
    return pd.DataFrame(
        [
            {
                "when": e.at,
                "reviewer": e.reviewer,
                "action": e.action,
                "from": e.from_decision,
                "to": e.to_decision,
                "reason": e.reason,
                "version": e.version,
            }
            for e in events
        ],
        columns=["when", "reviewer", "action", "from", "to", "reason", "version"],
    )


# ---------------------------------------------------------------------------------------------
# The filtered list on the Corrections page


@dataclass(frozen=True)
class JudgmentFilter:
    """Filters of the judgments list; None means "any"."""

    product: str | None = None
    metric: str | None = None
    state: str | None = None  # one of REVIEW_STATES
    reviewer: str | None = None


FILTER_PARAMS = ("product", "metric", "state", "reviewer")


def filter_params(params: Mapping[str, str]) -> dict[str, str]:
    """The list filters a deep link asks for (`corrections?state=corrected&product=acme`), by name.

    Other pages (Overview's figures, activity rows) link here with these names; an unknown review
    state is dropped rather than shown as a filter that would raise.
    """
    wanted = {
        name: str(params[name]).strip() for name in FILTER_PARAMS if str(params.get(name) or "").strip()
    }
    if wanted.get("state") not in (None, *REVIEW_STATES):
        wanted.pop("state")
    return wanted


def _filtered(stmt: Any, filters: JudgmentFilter) -> Any:
    stmt = stmt.where(live_judgment())
    if filters.product is not None:
        stmt = stmt.where(col(Judgment.product) == filters.product)
    if filters.metric is not None:
        stmt = stmt.where(col(Judgment.metric) == filters.metric)
    if filters.reviewer is not None:
        stmt = stmt.where(col(Judgment.reviewer) == filters.reviewer)
    # The counters' definitions (count_judgments reads them): reviewed = a review time is set.
    reviewed = counters.reviewed_judgment()
    if filters.state == "unreviewed":
        stmt = stmt.where(~reviewed)
    elif filters.state == "confirmed":
        stmt = stmt.where(reviewed, col(Judgment.was_corrected) == False)  # noqa: E712
    elif filters.state == "corrected":
        stmt = stmt.where(reviewed, col(Judgment.was_corrected) == True)  # noqa: E712
    elif filters.state is not None:
        raise ValueError(f"unknown review state {filters.state!r}; choose one of {', '.join(REVIEW_STATES)}")
    return stmt


def count_judgments(*, session: Session, filters: JudgmentFilter) -> int:
    """How many judgments match the filters (for the pager), exact from lib.counters for every filter."""
    totals = counters.judgment_totals(
        session=session, product=filters.product, metric=filters.metric, reviewer=filters.reviewer
    )
    by_state = {
        None: totals.judgments,
        "unreviewed": totals.pending,
        "confirmed": totals.reviewed - totals.corrected,
        "corrected": totals.corrected,
    }
    if filters.state not in by_state:
        raise ValueError(f"unknown review state {filters.state!r}; choose one of {', '.join(REVIEW_STATES)}")
    return by_state[filters.state]


# Which index a page of the list walks, by the filter it fixes (lib.models): each holds its column,
# then the id (the list's order) and the evaluation (its liveness), so the walk reads no row to skip.
_ID_INDEXES = {"metric": "ix_judgment_metric_id", "reviewer": "ix_judgment_reviewer_id"}
# A seek that reads n entries, testing the other filters on each judgment's row and sorting what it
# keeps, costs about this many entries' walk per entry.
_SEEK_COST = 4.0


def _page_plan(
    session: Session, filters: JudgmentFilter, offset: int, limit: int, total: int
) -> tuple[str, bool]:
    """How a page is read (SQLite's hint, walk from the oldest end): the judgments in id order (the
    table itself), an index of one filtered column in id order, or, for a filter value held by
    few judgments, its history index read whole and sorted. Costs in entries read, from the counters'
    exact figures: a walk in id order reads about (offset + limit) × its rows ÷ matches, from
    whichever end is nearer."""
    listed = max(1, count_judgments(session=session, filters=JudgmentFilter()))
    matches = max(1, total)
    back = total - offset - limit < offset  # nearer the oldest end
    position = (total - offset if back else offset + limit) / matches
    costs: dict[tuple[str, bool], float] = {("NOT INDEXED", back): position * listed}
    for name, index in _ID_INDEXES.items():
        value = getattr(filters, name)
        if value is not None:
            held = count_judgments(session=session, filters=JudgmentFilter(**{name: value}))
            alone = filters == JudgmentFilter(**{name: value})  # else each entry's row is read
            costs[(f"INDEXED BY {index}", back)] = position * held * (1 if alone else _SEEK_COST)
    if filters.product is not None:
        held = count_judgments(session=session, filters=JudgmentFilter(product=filters.product))
        costs[("INDEXED BY ix_judgment_history", False)] = held * _SEEK_COST
    return min(costs, key=costs.__getitem__)


def list_judgments(
    *, session: Session, filters: JudgmentFilter, offset: int = 0, limit: int = 25
) -> list[Judgment]:
    """One page of matching judgments, most recently added first (id order).

    The page's ids come first (`_page_plan`: a walk in id order from the nearer end, or a seek of a
    rare product), then the rows of just those ids.
    """
    offset, limit = max(0, offset), max(0, limit)
    total = count_judgments(session=session, filters=filters)
    if offset >= total or limit == 0:
        return []
    hint, back = _page_plan(session, filters, offset, limit, total)
    stmt = _filtered(select(Judgment.id), filters).with_hint(Judgment, hint, "sqlite")
    if back:
        count = min(limit, total - offset)
        stmt = stmt.order_by(col(Judgment.id)).offset(total - offset - count).limit(count)
        ids = list(reversed(session.exec(stmt).all()))
    else:
        ids = list(session.exec(stmt.order_by(col(Judgment.id).desc()).offset(offset).limit(limit)).all())
    if not ids:
        return []
    found = {j.id: j for j in session.exec(select(Judgment).where(col(Judgment.id).in_(ids))).all()}
    return [found[i] for i in ids if i in found]


def review_state(judgment: Judgment) -> str:
    """ "unreviewed", "confirmed" or "corrected" (reviewed as in `counters.reviewed_judgment`)."""
    if judgment.reviewed_at is None:
        return "unreviewed"
    return "corrected" if judgment.was_corrected else "confirmed"


JUDGMENT_COLUMNS = [
    "change_id", "product", "metric", JUDGE_DECISION, REVIEWER_DECISION, "state", "was_corrected",
    REVIEWED_BY, "reviewed_at", REVIEWER_REASON, JUDGE_REASON, "confidence", "timestamp", "version",
    "judge_version",
]  # fmt: skip


def judgment_record(j: Judgment, version_names: Mapping[int, str] | None = None) -> dict[str, Any]:
    """One judgment as the table and the CSV show it (JUDGMENT_COLUMNS); `version_names` from
    `judge_versions.names_of` names its judge version."""
    return {
        "judge_version": judge_versions.name_for(j.judge_version_id, version_names),
        "change_id": j.change_id,
        "product": j.product,
        "metric": j.metric,
        JUDGE_DECISION: j.decision,
        REVIEWER_DECISION: j.user_decision,
        "state": review_state(j),
        "was_corrected": j.was_corrected,
        REVIEWED_BY: j.reviewer,
        "reviewed_at": j.reviewed_at,
        REVIEWER_REASON: j.user_reasoning,
        JUDGE_REASON: j.reasoning,
        "confidence": j.confidence,
        "timestamp": j.timestamp,
        "version": j.version,
    }


def judgments_frame(
    judgments: Sequence[Judgment], version_names: Mapping[int, str] | None = None
) -> pd.DataFrame:
    """Judgments as the table reviewers see and download."""
    return pd.DataFrame([judgment_record(j, version_names) for j in judgments], columns=JUDGMENT_COLUMNS)


# Judgments fetched at a time by the CSV download: its memory is one batch, whatever the matches.
CSV_BATCH_ROWS = 1_000


def iter_judgment_rows(
    *, session: Session, filters: JudgmentFilter, limit: int = CSV_ROW_LIMIT
) -> Iterator[tuple[Any, ...]]:
    """Every matching judgment (newest `limit`) as JUDGMENT_COLUMNS tuples, fetched a batch at a time."""
    stmt = _filtered(select(Judgment), filters).order_by(col(Judgment.id).desc()).limit(limit)
    names = judge_versions.names_of(session)
    for judgment in session.exec(stmt.execution_options(yield_per=CSV_BATCH_ROWS)):
        record = judgment_record(judgment, names)
        yield tuple(record[c] for c in JUDGMENT_COLUMNS)


# On screen: the link and what was decided first, the long reasons after (the CSV keeps JUDGMENT_COLUMNS).
JUDGMENT_DISPLAY_COLUMNS = [
    "open", "change_id", "metric", JUDGE_DECISION, REVIEWER_DECISION, "state", REVIEWED_BY, "reviewed_at",
    "product", "confidence", REVIEWER_REASON, JUDGE_REASON, "timestamp", "was_corrected", "version",
    "judge_version",
]  # fmt: skip


def judgments_display_frame(
    judgments: Sequence[Judgment], version_names: Mapping[int, str] | None = None
) -> pd.DataFrame:
    """The judgments table as reviewers see it: each row links to its evaluation's detail (where its
    card and audit trail are), or to itself on this page when it belongs to no evaluation."""
    frame = judgments_frame(judgments, version_names)
    frame.insert(
        0,
        "open",
        [evaluation_url(j.snapshot_id) if j.snapshot_id else judgment_url(j.change_id) for j in judgments],
    )
    return frame


def distinct_products(*, session: Session) -> list[str]:
    """Every product with live judgments, from lib.counters (rows per product × metric, not per judgment)."""
    return counters.judged_products(session=session)


def distinct_metrics(*, session: Session, products: Sequence[str]) -> list[str]:
    """Every metric judged for these products (live judgments), from lib.counters."""
    return counters.judged_metric_slugs(session=session, products=products)


def _reviewers(session: Session) -> list[str]:
    """Everyone with a change in the audit trail, by a loose scan of its (reviewer, id) index: one
    seek per name. It may name someone whose every decision was since replaced (the filter then
    lists nothing); a DISTINCT over judgments would read every judgment on each first render."""
    sql = text(
        """
        WITH RECURSIVE walk(value) AS (
            SELECT (SELECT MIN(reviewer) FROM judgment_events)
            UNION ALL
            SELECT (SELECT MIN(reviewer) FROM judgment_events WHERE reviewer > walk.value)
            FROM walk WHERE walk.value IS NOT NULL
        )
        SELECT value FROM walk WHERE value IS NOT NULL
        """
    )
    return [str(v) for (v,) in session.connection().execute(sql).all() if v]


def filter_options(*, session: Session) -> dict[str, list[str]]:
    """Distinct products, metrics and reviewers, for the filter widgets."""
    products = distinct_products(session=session)
    return {
        "products": products,
        "metrics": distinct_metrics(session=session, products=products),
        "reviewers": _reviewers(session),
    }


def corrected_of_reviewed_over_time(
    *, session: Session, product: str | None = None, metric: str | None = None, freq: str = "W"
) -> pd.DataFrame:
    """Per product and period (by when judged): reviewed, corrected and their ratio.

    Read from lib.counters' per-day rows (products × metrics × days, whatever the judgments), then
    summed per `freq` ("D", "W" or "M") in pandas. The ratio is `counters.corrected_of_reviewed`.
    """
    if freq not in ("D", "W", "M"):
        raise ValueError(f"freq must be D, W or M, got {freq!r}")
    columns = ["product", "period", "reviewed", "corrected", "corrected_of_reviewed"]
    rows = [
        (p, day, reviewed, corrected)
        for p, day, _n, reviewed, corrected in counters.judgment_days(
            session=session, product=product, metric=metric
        )
        if reviewed
    ]
    if not rows:
        return pd.DataFrame(columns=columns)
    daily = pd.DataFrame(rows, columns=["product", "day", "reviewed", "corrected"])
    daily["period"] = pd.to_datetime(daily["day"]).dt.to_period(freq).dt.start_time
    out = daily.groupby(["product", "period"], as_index=False)[["reviewed", "corrected"]].sum()
    out["reviewed"] = out["reviewed"].astype(int)
    out["corrected"] = out["corrected"].astype(int)
    out["corrected_of_reviewed"] = [
        counters.corrected_of_reviewed(c, r) for c, r in zip(out["corrected"], out["reviewed"], strict=True)
    ]
    return out.sort_values(["product", "period"]).reset_index(drop=True)[columns]


def history_block(
    *,
    session: Session,
    product: str,
    metric: str | None = None,
    max_entries: int = 20,
    correction_ratio: float = 0.75,
) -> str:
    """Exactly the history text a judge prompt for this product (and metric) would contain now."""
    chosen = select_history(
        session, product, max_entries=max_entries, correction_ratio=correction_ratio, metric=metric
    )
    return format_history_for_prompt(chosen)


def history_record(judgment: Judgment) -> dict[str, Any]:
    """One selected judgment as JSON for pipelines: the seed-004 fields plus its review state."""
    record: dict[str, Any] = {
        "change_id": judgment.change_id,
        "product": judgment.product,
        "metric": judgment.metric,
        "decision": judgment.decision,
        "reasoning": judgment.reasoning or "",
        "user_decision": judgment.user_decision,
        "user_reasoning": judgment.user_reasoning,
        "was_corrected": judgment.was_corrected,
        "timestamp": judgment.timestamp.isoformat().replace("+00:00", "Z"),
    }
    for optional in ("confidence", "url", "description", "ai_provider"):
        value = getattr(judgment, optional)
        if value not in (None, ""):
            record[optional] = value
    return record
