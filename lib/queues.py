"""Team review queues (issue 26): several reviewers per item, blind-first review, adjudication.

A lead creates a queue over a filter (product, metrics, language, date range, review state), a size
and an order (oldest, largest gap, seeded random sample). Its items are frozen at creation: each is
an evaluation (its judgments of the queue's metrics) or one stand-alone judgment, and while the
queue holds a judgment no other queue holds it and the default queue does not hand it out.

- **Reservations** (lib.reservations): `next_assignment` hands a reviewer the first item in queue
  order that still needs a reviewer, that they have not labelled or skipped; it is theirs for a
  lease, renewed by every action, and an item is never held by more reviewers than `overlap`. A
  lapsed lease returns the item. Claims lock the item row (PostgreSQL) or run in SQLite's single
  writer, and always in increasing queue position, so concurrent reviewers never deadlock.
- **Labels**: each reviewer's label of each judgment is a row of its own (`review_labels`): in a
  blind-first queue first the blind label (`load_blind_item` shows the item without the judge's
  score, reason or evidence), then, once every judgment of the item has one, the reveal and the
  final label. A label is parsed by the one review rule (`corrections.review_decision`).
- **Resolution**: when a judgment has `overlap` final labels, they agree (exactly for labels and
  whole-number scales, within the queue's `tolerance` for continuous ones: the mean is the
  decision) and the decision is written through `corrections.record_review`, the one write of a
  review, so only resolved decisions reach the judgment, its counters, the correction history and
  everything downstream. Otherwise the judgment waits for a lead (`adjudicate`). With overlap 1 a
  label resolves at once, exactly as a review does.
- **Undo**: a reviewer withdraws their own label until its judgment is decided (or, when their
  label resolved it, while that resolution is still the judgment's latest change); a lead takes
  back their adjudication. A queue's decisions carry `queue_id` in the audit trail and are
  undone only here, so the labels behind them reopen too.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import Integer, String, and_, bindparam, exists, func, insert, or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from lib import counters, prepared, reservations
from lib.auth import (
    Actor,
    Permission,
    PermissionDenied,
    authorize,
    identity_of,
    normalize_identity,
    role_allows,
)
from lib.corrections import (
    REVIEW_STATES,
    DecisionScale,
    MissingReviewer,
    NothingToUndo,
    announce_review,
    decision_scale,
    format_score,
    parse_score,
    record_review,
    review_decision,
    same_decision,
    sort_by_rubric,
    undo_review,
)
from lib.locks import PG_REVIEW_COUNTERS_LOCK, one_writer_per_product_of_judgment
from lib.metrics import MetricSpec, metrics_for_product, rubrics_read_once
from lib.models import (
    CACHE_DECISIONS,
    QUEUE_MODES,
    QUEUE_ORDERS,
    EvaluationSnapshot,
    Judgment,
    JudgmentEvent,
    ReviewAssignment,
    ReviewLabel,
    ReviewQueue,
    ReviewQueueItem,
    ReviewQueueJudgment,
    UserRole,
)
from lib.review_queue import QueueItem, held_by_team_queue, score_keys

ORDER_LABELS: dict[str, str] = {
    "oldest": "Oldest first",
    "largest_gap": "Largest gap first",
    "random": "Random sample (seeded)",
}
MODE_LABELS: dict[str, str] = {"open": "Open (judge shown)", "blind": "Blind-first"}
# The review-state filter: lib.corrections' states, plus "reviewed" (confirmed or corrected); None = any.
QUEUE_REVIEW_STATES: tuple[str, ...] = (*REVIEW_STATES, "reviewed")
MAX_QUEUE_ITEMS = 100_000
MAX_OVERLAP = 20
MAX_NAME_CHARS = 200
MAX_CLAIM_ATTEMPTS = 50
_CHUNK = 500
assert set(ORDER_LABELS) == set(QUEUE_ORDERS) and set(MODE_LABELS) == set(QUEUE_MODES)

OPEN, RESOLVED, DISPUTED, ADJUDICATED, RELEASED = "open", "resolved", "disputed", "adjudicated", "released"
DECIDED = (RESOLVED, ADJUDICATED)


class QueueError(ValueError):
    """A queue request that cannot be done as asked; the message says why. Nothing was changed."""


class QueueNotFound(LookupError):
    """No queue (or item, or queue judgment) has this id or name."""


class NotAssigned(PermissionDenied):
    """The queue is assigned to other reviewers."""


class NotRevealed(PermissionError):
    """Blind-first: the judge's side of an item is asked for before the reviewer's blind labels."""


ItemTaken = reservations.ItemTaken


# ---------------------------------------------------------------------------------------------
# Creating, listing and changing queues


@dataclass(frozen=True)
class QueueSpec:
    """What a lead asks for: the filter, how many items in which order, and how they are reviewed."""

    name: str
    product: str | None = None
    metrics: tuple[str, ...] = ()
    language: str | None = None
    since: date | datetime | None = None  # judged on or after (a date: from its start, UTC)
    until: date | datetime | None = None  # judged on or before a date (to its end, UTC), or before a datetime
    review_state: str | None = "unreviewed"  # QUEUE_REVIEW_STATES, None = any
    size: int = 100
    order: str = "oldest"
    seed: int = 0
    overlap: int = 1
    mode: str = "open"
    tolerance: float | None = None
    reviewers: tuple[str, ...] = ()
    description: str = ""


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _as_start(value: date | datetime | None) -> datetime | None:
    """The inclusive start of the range: a date's midnight (UTC), a datetime itself."""
    if value is None or isinstance(value, datetime):
        return None if value is None else _aware(value)
    return datetime.combine(value, time.min, tzinfo=UTC)


def _as_end(value: date | datetime | None) -> datetime | None:
    """The exclusive end of the range: a date's next midnight (the date is included), a datetime itself."""
    if value is None or isinstance(value, datetime):
        return None if value is None else _aware(value)
    return datetime.combine(value + timedelta(days=1), time.min, tzinfo=UTC)


def _clean_reviewers(reviewers: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(r.strip() for r in reviewers if r and r.strip()))


def _check_spec(spec: QueueSpec) -> QueueSpec:
    """The spec with its text trimmed, or QueueError naming the first thing wrong with it."""
    name = (spec.name or "").strip()
    if not name:
        raise QueueError("name the queue")
    if len(name) > MAX_NAME_CHARS:
        raise QueueError(f"a queue name has at most {MAX_NAME_CHARS} characters")
    if spec.order not in QUEUE_ORDERS:
        raise QueueError(f"unknown order {spec.order!r}; choose one of {', '.join(QUEUE_ORDERS)}")
    if spec.mode not in QUEUE_MODES:
        raise QueueError(f"unknown mode {spec.mode!r}; choose one of {', '.join(QUEUE_MODES)}")
    if spec.review_state is not None and spec.review_state not in QUEUE_REVIEW_STATES:
        raise QueueError(
            f"unknown review state {spec.review_state!r}; choose one of {', '.join(QUEUE_REVIEW_STATES)}"
        )
    if isinstance(spec.size, bool) or not isinstance(spec.size, int) or not 1 <= spec.size <= MAX_QUEUE_ITEMS:
        raise QueueError(f"the size must be a whole number from 1 to {MAX_QUEUE_ITEMS:,}")
    if (
        isinstance(spec.overlap, bool)
        or not isinstance(spec.overlap, int)
        or not 1 <= spec.overlap <= MAX_OVERLAP
    ):
        raise QueueError(f"the overlap (reviewers per item) must be a whole number from 1 to {MAX_OVERLAP}")
    if spec.tolerance is not None and not (
        isinstance(spec.tolerance, int | float) and 0 <= float(spec.tolerance) < float("inf")
    ):
        raise QueueError("the tolerance must be a number of 0 or more (on the metric's own scale)")
    start, end = _as_start(spec.since), _as_end(spec.until)
    if start is not None and end is not None and start >= end:
        raise QueueError("the date range is empty: 'since' is after 'until'")
    reviewers = _clean_reviewers(spec.reviewers)
    if reviewers and spec.overlap > len(reviewers):
        raise QueueError(
            f"each item needs {spec.overlap} reviewers but only {len(reviewers)} are assigned; "
            "assign more reviewers or lower the overlap"
        )
    metrics = tuple(dict.fromkeys(m.strip() for m in spec.metrics if m and m.strip()))
    return QueueSpec(
        name=name, product=(spec.product or "").strip() or None, metrics=metrics,
        language=(spec.language or "").strip() or None, since=start, until=end,
        review_state=spec.review_state, size=spec.size, order=spec.order, seed=int(spec.seed),
        overlap=spec.overlap, mode=spec.mode,
        tolerance=None if spec.tolerance is None else float(spec.tolerance),
        reviewers=tuple(reviewers), description=(spec.description or "").strip(),
    )  # fmt: skip


def _judgment_conditions(spec: QueueSpec) -> list[Any]:
    """The spec's conditions on a judgment's own columns (and held by no queue)."""
    conditions: list[Any] = [~held_by_team_queue()]
    if spec.product is not None:
        conditions.append(col(Judgment.product) == spec.product)
    if spec.metrics:
        conditions.append(col(Judgment.metric).in_(spec.metrics))
    if spec.since is not None:
        conditions.append(col(Judgment.timestamp) >= spec.since)
    if spec.until is not None:
        conditions.append(col(Judgment.timestamp) < spec.until)
    reviewed = counters.reviewed_judgment()
    state = spec.review_state
    if state == "unreviewed":
        conditions.append(~reviewed)
    elif state == "reviewed":
        conditions.append(reviewed)
    elif state == "confirmed":
        conditions += [reviewed, col(Judgment.was_corrected) == False]  # noqa: E712
    elif state == "corrected":
        conditions += [reviewed, col(Judgment.was_corrected) == True]  # noqa: E712
    return conditions


def _candidates(spec: QueueSpec, *columns: Any) -> Any:
    """Judgments the spec selects: live, matching every filter, held by no queue."""
    stmt = (
        select(*columns)
        .select_from(Judgment)
        .outerjoin(EvaluationSnapshot, col(Judgment.snapshot_id) == col(EvaluationSnapshot.id))
        .where(
            or_(col(Judgment.snapshot_id).is_(None), col(EvaluationSnapshot.deleted_at).is_(None)),
            *_judgment_conditions(spec),
        )
    )
    if spec.language is not None:
        stmt = stmt.where(col(EvaluationSnapshot.language) == spec.language)
    return stmt


def _every_item_key(session: Session, spec: QueueSpec) -> list[str]:
    """Every item the spec selects, sorted: live evaluations with a matching judgment (one probe of
    the judgments' snapshot index each, not a join per judgment) and matching stand-alone judgments."""
    matching = (
        select(Judgment.id)
        .where(col(Judgment.snapshot_id) == col(EvaluationSnapshot.id), *_judgment_conditions(spec))
        .exists()
    )
    evaluations = select(EvaluationSnapshot.id).where(col(EvaluationSnapshot.deleted_at).is_(None), matching)
    if spec.product is not None:
        evaluations = evaluations.where(col(EvaluationSnapshot.product) == spec.product)
    if spec.language is not None:
        evaluations = evaluations.where(col(EvaluationSnapshot.language) == spec.language)
    keys = [f"snapshot:{sid}" for (sid,) in session.execute(evaluations)]
    if spec.language is None:  # stand-alone judgments have no language
        singles = select(Judgment.id).where(col(Judgment.snapshot_id).is_(None), *_judgment_conditions(spec))
        keys += [f"judgment:{jid}" for (jid,) in session.execute(singles)]
    return sorted(keys)


def _key(snapshot_id: str | None, judgment_id: int) -> str:
    return f"snapshot:{snapshot_id}" if snapshot_id is not None else f"judgment:{judgment_id}"


def _oldest_keys(session: Session, spec: QueueSpec, limit: int, *, without_gap: bool = False) -> list[str]:
    """The oldest items by their oldest matching judgment (ties: lowest id), as the default queue
    orders them. Pending judgments of every product: one walk of `ix_judgment_open` (product,
    timestamp, id) per product, merged, so it reads about as many index entries as items it keeps
    instead of sorting every pending judgment (1M judgments: 6 s before); a page at a time.
    `without_gap`: only stand-alone judgments and evaluations without a gap (largest gap's tail)."""
    if spec.review_state != "unreviewed" or spec.product is not None:
        streams = [_oldest_walk(session, spec, without_gap)]  # one product, or a state no index orders
    else:
        streams = [
            _oldest_walk(session, replace(spec, product=product), without_gap)
            for product in counters.judged_products(session=session)
        ]
    keys: dict[str, None] = {}
    for _, judgment_id, snapshot_id in heapq.merge(*streams, key=lambda row: (row[0], row[1])):
        keys[_key(snapshot_id, judgment_id)] = None
        if len(keys) >= limit:
            break
    return list(keys)


def _oldest_walk(session: Session, spec: QueueSpec, without_gap: bool, page: int = 500) -> Iterator[Any]:
    """(timestamp, id, snapshot_id) of the spec's judgments, oldest first, read a page at a time
    after the last one (a LIMIT per page keeps PostgreSQL on the index walk; a cursor over the
    whole match made it plan for every row)."""
    after: tuple[datetime, int] | None = None
    while True:
        stmt = _candidates(spec, Judgment.timestamp, Judgment.id, Judgment.snapshot_id)
        if without_gap:
            stmt = stmt.where(
                or_(col(Judgment.snapshot_id).is_(None), col(EvaluationSnapshot.max_metric_gap).is_(None))
            )
        if after is not None:
            stmt = stmt.where(
                or_(
                    col(Judgment.timestamp) > after[0],
                    and_(col(Judgment.timestamp) == after[0], col(Judgment.id) > after[1]),
                )
            )
        rows = session.execute(stmt.order_by(col(Judgment.timestamp), col(Judgment.id)).limit(page)).all()
        yield from rows
        if len(rows) < page:
            return
        after = (rows[-1][0], rows[-1][1])


def _select_keys(session: Session, spec: QueueSpec) -> list[str]:
    """The item keys of a new queue, in queue order."""
    if spec.order == "oldest":
        return _oldest_keys(session, spec, spec.size)
    if spec.order == "largest_gap":
        gap = col(EvaluationSnapshot.max_metric_gap)
        matching = _candidates(spec, Judgment.id).where(
            col(Judgment.snapshot_id) == col(EvaluationSnapshot.id)
        )
        ranked = session.exec(
            select(EvaluationSnapshot.id)
            .where(col(EvaluationSnapshot.deleted_at).is_(None), gap.is_not(None), matching.exists())
            .order_by(
                gap.desc(), col(EvaluationSnapshot.created_at).desc(), col(EvaluationSnapshot.id).desc()
            )
            .limit(spec.size)
        ).all()
        keys = [f"snapshot:{s}" for s in ranked]
        if len(keys) < spec.size:  # then the items without a gap, oldest first
            keys += _oldest_keys(session, spec, spec.size - len(keys), without_gap=True)
        return keys
    every = _every_item_key(session, spec)
    return random.Random(spec.seed).sample(every, min(spec.size, len(every)))


def _chunks(values: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(values), size):
        yield values[i : i + size]


def _judgments_of(session: Session, spec: QueueSpec, keys: Sequence[str]) -> dict[str, list[int]]:
    """Per item key, the ids of its judgments the spec selects."""
    snapshots = [k.removeprefix("snapshot:") for k in keys if k.startswith("snapshot:")]
    singles = [int(k.removeprefix("judgment:")) for k in keys if k.startswith("judgment:")]
    found: dict[str, list[int]] = {k: [] for k in keys}
    base = _candidates(spec, Judgment.id, Judgment.snapshot_id)
    for part in _chunks(snapshots):
        for judgment_id, snapshot_id in session.execute(
            base.where(col(Judgment.snapshot_id).in_(part)).order_by(col(Judgment.id))
        ):
            found[_key(snapshot_id, judgment_id)].append(judgment_id)
    for part in _chunks(singles):
        for judgment_id, snapshot_id in session.execute(
            base.where(col(Judgment.id).in_(part), col(Judgment.snapshot_id).is_(None))
        ):
            found[_key(snapshot_id, judgment_id)].append(judgment_id)
    return found


def create_queue(*, session: Session, actor: Actor | str | None, spec: QueueSpec) -> ReviewQueue:
    """Create a team queue and freeze its items (lead). QueueError when the spec is wrong, the name
    is taken or nothing matches; judgments another queue holds are left out."""
    lead = authorize(session, actor, Permission.MANAGE_QUEUES)
    spec = _check_spec(spec)
    if session.exec(select(ReviewQueue.id).where(col(ReviewQueue.name) == spec.name)).first() is not None:
        raise QueueError(f"a queue named {spec.name!r} exists; choose another name")
    keys = _select_keys(session, spec)
    judgments = _judgments_of(session, spec, keys)
    keys = [k for k in keys if judgments[k]]
    if not keys:
        raise QueueError("no judgments match these filters (judgments already in a queue are left out)")
    queue = ReviewQueue(
        name=spec.name, description=spec.description, product=spec.product, metrics=list(spec.metrics),
        language=spec.language, since=_as_start(spec.since), until=_as_end(spec.until),
        review_state=spec.review_state, item_order=spec.order, seed=spec.seed, size=spec.size,
        overlap=spec.overlap, mode=spec.mode, tolerance=spec.tolerance, reviewers=list(spec.reviewers),
        items=len(keys), judgments=sum(len(judgments[k]) for k in keys), created_by=lead.identity,
    )  # fmt: skip
    try:
        with session.begin_nested():
            session.add(queue)
            session.flush()
            assert queue.id is not None
            for part in _chunks(list(enumerate(keys, start=1)), 5000):
                session.execute(
                    insert(ReviewQueueItem),
                    [
                        {"queue_id": queue.id, "position": position, "item_key": key,
                         "snapshot_id": key.removeprefix("snapshot:") if key.startswith("snapshot:") else None,
                         "claimed": 0, "done": 0, "available": True}
                        for position, key in part
                    ],
                )  # fmt: skip
            item_ids = dict(
                session.execute(
                    select(ReviewQueueItem.item_key, ReviewQueueItem.id).where(
                        col(ReviewQueueItem.queue_id) == queue.id
                    )
                ).all()
            )
            rows = [
                {"queue_id": queue.id, "item_id": item_ids[key], "judgment_id": judgment_id, "state": OPEN,
                 "held": True, "labels": 0}
                for key in keys
                for judgment_id in judgments[key]
            ]  # fmt: skip
            for part in _chunks(rows, 5000):
                session.execute(insert(ReviewQueueJudgment), list(part))
    except IntegrityError:
        raise QueueError(
            "another queue was created over some of the same judgments a moment ago, or took this name; "
            "create the queue again"
        ) from None
    return queue


def get_queue(*, session: Session, queue: int | str) -> ReviewQueue:
    """A queue by id or by name; QueueNotFound otherwise."""
    found: ReviewQueue | None = None
    if isinstance(queue, int) or (isinstance(queue, str) and queue.strip().isdigit()):
        found = session.get(ReviewQueue, int(queue))
    if found is None and isinstance(queue, str):
        found = session.exec(select(ReviewQueue).where(col(ReviewQueue.name) == queue.strip())).first()
    if found is None:
        raise QueueNotFound(f"no review queue {queue!r}")
    return found


def _locked_queue(session: Session, queue_id: int | str, *, change: bool = False) -> ReviewQueue:
    """The queue row, locked first by every write (PostgreSQL): shared by reviewers' writes, which
    never wait for each other on it, exclusive for a lead's change (closing, assigning), which
    waits for them. So the queue row always comes before an item's lock and closing never
    deadlocks with labelling; and a label saved after a close sees the queue closed."""
    locked: ReviewQueue | None = None
    if isinstance(queue_id, int) or queue_id.strip().isdigit():  # get_queue's lookup, one statement
        locked = session.exec(_queue_lock(session, "id", change), params={"key": int(queue_id)}).first()
    if locked is None and isinstance(queue_id, str):
        locked = session.exec(_queue_lock(session, "name", change), params={"key": queue_id.strip()}).first()
    if locked is None:
        raise QueueNotFound(f"no review queue {queue_id!r}")
    return locked


# The hot statements of a reviewer's writes (every next item, every label), the values as parameters:
# built once (lib.prepared), as building each cost 1-4 ms against a fraction of that to run it.
def _queue_lock(session: Session, by: str, change: bool) -> Any:
    return prepared.built(
        session,
        ("queue lock", by, change),
        lambda: (
            select(ReviewQueue)
            .where(getattr(ReviewQueue, by) == bindparam("key"))
            .with_for_update(read=not change)
            .execution_options(populate_existing=True)
        ),
    )


def _item_lock(session: Session, of_queue: bool) -> Any:
    def build() -> Any:
        stmt = select(ReviewQueueItem).where(col(ReviewQueueItem.id) == bindparam("item_id"))
        if of_queue:
            stmt = stmt.where(col(ReviewQueueItem.queue_id) == bindparam("queue_id"))
        return stmt.with_for_update().execution_options(populate_existing=True)

    return prepared.built(session, ("item lock", of_queue), build)


def is_assigned(queue: ReviewQueue, reviewer: str | None) -> bool:
    """True when the queue is assigned to this reviewer by name (identities compare case-insensitively)."""
    who = normalize_identity(reviewer or "")
    return bool(who) and who in {normalize_identity(r) for r in queue.reviewers or []}


def may_label(queue: ReviewQueue, reviewer: str | None) -> bool:
    """True when the queue is open to every reviewer or assigned to this one."""
    return not queue.reviewers or is_assigned(queue, reviewer)


def list_queues(
    *, session: Session, reviewer: str | None = None, include_closed: bool = False
) -> list[ReviewQueue]:
    """Queues for a reviewer: active before closed; theirs (assigned to them) first, then those open
    to everyone, then the rest; newest first within each."""
    stmt = select(ReviewQueue)
    if not include_closed:
        stmt = stmt.where(col(ReviewQueue.status) == "active")
    queues = list(session.exec(stmt.order_by(col(ReviewQueue.id).desc())).all())

    def rank(q: ReviewQueue) -> tuple[int, int]:
        mine = 0 if is_assigned(q, reviewer) else (1 if not q.reviewers else 2)
        return (0 if q.status == "active" else 1, mine)

    return sorted(queues, key=rank)


def update_queue(
    *,
    session: Session,
    actor: Actor | str | None,
    queue_id: int,
    reviewers: Sequence[str] | None = None,
    description: str | None = None,
    name: str | None = None,
) -> ReviewQueue:
    """Assign reviewers, rename or describe a queue (lead). Reviewers already at work keep their
    labels; a reviewer taken off the list can no longer take items."""
    authorize(session, actor, Permission.MANAGE_QUEUES)
    queue = _locked_queue(session, queue_id, change=True)
    if reviewers is not None:
        cleaned = _clean_reviewers(reviewers)
        if cleaned and queue.overlap > len(cleaned):
            raise QueueError(
                f"each item needs {queue.overlap} reviewers but only {len(cleaned)} would be assigned"
            )
        queue.reviewers = cleaned
    if description is not None:
        queue.description = description.strip()
    if name is not None:
        new = name.strip()
        if not new or len(new) > MAX_NAME_CHARS:
            raise QueueError(f"a queue name has 1 to {MAX_NAME_CHARS} characters")
        taken = session.exec(
            select(ReviewQueue.id).where(col(ReviewQueue.name) == new, col(ReviewQueue.id) != queue.id)
        ).first()
        if taken is not None:
            raise QueueError(f"a queue named {new!r} exists; choose another name")
        queue.name = new
    session.add(queue)
    session.flush()
    return queue


def close_queue(
    *, session: Session, actor: Actor | str | None, queue_id: int, now: datetime | None = None
) -> ReviewQueue:
    """Close a queue (lead): its undecided judgments are released (back in the default queue, free
    for other queues), reservations end; labels and decisions stay."""
    lead = authorize(session, actor, Permission.MANAGE_QUEUES)
    now = reservations.utc(now)
    queue = _locked_queue(session, queue_id, change=True)
    if queue.status == "closed":
        return queue
    session.execute(
        update(ReviewQueueJudgment)
        .where(col(ReviewQueueJudgment.queue_id) == queue.id, col(ReviewQueueJudgment.held))
        .values(held=False, state=RELEASED)
        .execution_options(synchronize_session=False)
    )
    for row in session.exec(
        select(ReviewAssignment).where(
            col(ReviewAssignment.queue_id) == queue.id, col(ReviewAssignment.status) == reservations.RESERVED
        )
    ).all():
        reservations.release(row, now)
        session.add(row)
    queue.status, queue.closed_by, queue.closed_at = "closed", lead.identity, now
    session.add(queue)
    session.flush()
    return queue


# ---------------------------------------------------------------------------------------------
# Reservations


@dataclass(frozen=True)
class Assignment:
    """A reviewer's hold on one item, as plain data: nothing of the judge's side is in it."""

    queue_id: int
    queue_name: str
    item_id: int
    item_key: str
    position: int
    items: int
    reviewer: str
    status: str
    expires_at: datetime
    blind: bool  # the queue is blind-first
    revealed: bool  # blind-first: the reviewer's blind labels are in, the judge's side may be shown
    draft: dict[str, Any] = field(default_factory=dict)

    @property
    def snapshot_id(self) -> str | None:
        return self.item_key.removeprefix("snapshot:") if self.item_key.startswith("snapshot:") else None

    @property
    def stage(self) -> str:
        """ "blind" (label before the reveal), "final" (label with the judge shown) or "done"."""
        if self.status == reservations.DONE:
            return "done"
        return "blind" if self.blind and not self.revealed else "final"


def _assignment(queue: ReviewQueue, item: ReviewQueueItem, row: ReviewAssignment) -> Assignment:
    assert queue.id is not None and item.id is not None
    return Assignment(
        queue_id=queue.id, queue_name=queue.name, item_id=item.id, item_key=item.item_key,
        position=item.position, items=queue.items, reviewer=row.reviewer, status=row.status,
        expires_at=row.expires_at, blind=queue.mode == "blind", revealed=row.revealed_at is not None,
        draft=dict(row.draft or {}),
    )  # fmt: skip


def _labeller(session: Session, queue: ReviewQueue, reviewer: Actor | str | None) -> Actor:
    """The reviewer, allowed to label in this queue: REVIEW permission, assigned (when the queue
    is assigned), queue active."""
    if not identity_of(reviewer):
        raise MissingReviewer("every label records its reviewer; none was given")
    actor = authorize(session, reviewer, Permission.REVIEW)
    if not may_label(queue, actor.identity):
        raise NotAssigned(
            f"queue {queue.name!r} is assigned to {', '.join(queue.reviewers)}; ask a lead to add "
            f"{actor.identity}",
            actor=actor,
            permission=Permission.REVIEW,
        )
    if queue.status != "active":
        raise QueueError(f"queue {queue.name!r} is closed")
    return actor


def _handled_by(queue_id: Any, reviewer: Any) -> Any:
    """The item is the reviewer's already: held, done or skipped by them."""
    theirs = aliased(ReviewAssignment)  # the lapsed-lease query joins assignments itself
    return exists().where(
        col(theirs.queue_id) == queue_id,
        col(theirs.item_id) == col(ReviewQueueItem.id),
        col(theirs.reviewer) == reviewer,
        col(theirs.status).in_(reservations.HANDLED),
    )


def _live_item() -> Any:
    """Its evaluation is not archived (stand-alone judgments always are live)."""
    return or_(
        col(ReviewQueueItem.snapshot_id).is_(None),
        exists().where(
            col(EvaluationSnapshot.id) == col(ReviewQueueItem.snapshot_id),
            col(EvaluationSnapshot.deleted_at).is_(None),
        ),
    )


def _first_candidate(
    session: Session, queue: ReviewQueue, reviewer: str, now: datetime, tried: set[int]
) -> int | None:
    """The first item (by position) that may go to the reviewer: one that still wants a reviewer,
    or one whose holder's lease ran out; never one they hold, labelled or skipped."""
    assert queue.id is not None
    params: dict[str, Any] = {"queue_id": queue.id, "reviewer": reviewer, "now": now}
    if tried:
        params["tried"] = sorted(tried)
    statements = _candidates_of(session, bool(tried))
    found = [row for stmt in statements for row in session.execute(stmt, params).all()]
    return min(found, key=lambda r: r[1])[0] if found else None


def _candidates_of(session: Session, with_tried: bool) -> tuple[Any, Any]:
    """`_first_candidate`'s two statements (an open item, a lapsed one), built once (lib.prepared)."""
    return prepared.built(session, ("queue candidates", with_tried), lambda: _build_candidates(with_tried))


def _build_candidates(with_tried: bool) -> tuple[Any, Any]:
    queue_id = bindparam("queue_id", type_=Integer())
    reviewer = bindparam("reviewer", type_=String())
    now = bindparam("now", type_=ReviewAssignment.__table__.c.expires_at.type)  # type: ignore[attr-defined]
    mine = _handled_by(queue_id, reviewer)
    open_items = (
        select(ReviewQueueItem.id, ReviewQueueItem.position)
        .where(col(ReviewQueueItem.queue_id) == queue_id, col(ReviewQueueItem.available) == True, ~mine)  # noqa: E712
        .where(_live_item())
    )
    lapsed = (
        select(ReviewQueueItem.id, ReviewQueueItem.position)
        .join(ReviewAssignment, col(ReviewAssignment.item_id) == col(ReviewQueueItem.id))
        .where(
            col(ReviewAssignment.status) == reservations.RESERVED,
            col(ReviewAssignment.queue_id) == queue_id,
            col(ReviewAssignment.expires_at) <= now,
            col(ReviewAssignment.reviewer) != reviewer,
            ~mine,
        )
        .where(_live_item())
    )
    if with_tried:
        tried = bindparam("tried", expanding=True)
        open_items = open_items.where(col(ReviewQueueItem.id).not_in(tried))
        lapsed = lapsed.where(col(ReviewQueueItem.id).not_in(tried))
    order = col(ReviewQueueItem.position)
    return open_items.order_by(order).limit(1), lapsed.order_by(order).limit(1)


def _locked_item(session: Session, item_id: int, queue: ReviewQueue | None = None) -> ReviewQueueItem:
    """The item row, locked for this transaction (PostgreSQL; SQLite's writer lock covers it).
    With `queue`, an item of that queue only (as `_item_of`), in the same one statement."""
    params = {"item_id": item_id} if queue is None else {"item_id": item_id, "queue_id": queue.id}
    item = session.exec(_item_lock(session, queue is not None), params=params).first()
    if item is None:
        if queue is not None:
            raise QueueNotFound(f"queue {queue.name!r} has no item {item_id}")
        raise QueueNotFound(f"no queue item {item_id}")
    return item


def _claim(
    session: Session,
    queue: ReviewQueue,
    item: ReviewQueueItem,
    reviewer: str,
    now: datetime,
    *,
    asked: bool = False,
) -> ReviewAssignment | None:
    """Reserve a locked item for the reviewer when it has room (lapsed leases are taken back first).
    `asked`: they opened or labelled this very item, so an item they once skipped is theirs again."""
    assert queue.id is not None and item.id is not None
    row = reservations.find(session, queue_id=queue.id, item_key=item.item_key, reviewer=reviewer)
    if row is not None and asked and row.status == reservations.SKIPPED:
        row.status = reservations.RELEASED
    if row is not None and row.status in reservations.HANDLED:
        return row if row.status == reservations.RESERVED else None
    if item.claimed >= queue.overlap:
        item.claimed -= reservations.expire_lapsed(
            session, queue_id=queue.id, item_key=item.item_key, reviewer=reviewer, now=now
        )
    open_judgments = session.exec(
        select(func.count()).where(
            col(ReviewQueueJudgment.item_id) == item.id, col(ReviewQueueJudgment.state) == OPEN
        )
    ).one()
    if item.claimed >= queue.overlap or not open_judgments:
        item.available = False
        session.add(item)
        session.flush()
        return None
    row = reservations.reserve(
        session, queue_id=queue.id, item_key=item.item_key, reviewer=reviewer, now=now, item_id=item.id,
        row=row, found=True,
    )  # fmt: skip
    item.claimed += 1
    item.available = item.claimed < queue.overlap
    session.add(item)
    session.flush()
    return row


def next_assignment(
    *, session: Session, queue_id: int, reviewer: Actor | str | None, now: datetime | None = None
) -> Assignment | None:
    """The reviewer's item in a team queue, reserved for them; None when nothing is left for them.

    The item they hold comes back (lease renewed): a reload, a new tab or another device continues
    there. Otherwise the first item in queue order with room for another reviewer, or whose
    holder's lease ran out, that they have not labelled or skipped.
    """
    now = reservations.utc(now)
    queue = _locked_queue(session, queue_id)
    name = _labeller(session, queue, reviewer).identity
    mine = reservations.held(session, queue_id=queue.id, reviewer=name)
    if mine is not None and mine.item_id is not None:
        item = session.get(ReviewQueueItem, mine.item_id)
        assert item is not None
        reservations.renew(mine, now)
        session.add(mine)
        session.flush()
        return _assignment(queue, item, mine)
    tried: set[int] = set()
    for _ in range(MAX_CLAIM_ATTEMPTS):
        item_id = _first_candidate(session, queue, name, now, tried)
        if item_id is None:
            return None
        item = _locked_item(session, item_id)
        row = _claim(session, queue, item, name, now)
        if row is not None:
            return _assignment(queue, item, row)
        tried.add(item_id)
    return None


def _item_of(session: Session, queue: ReviewQueue, item_id: int) -> ReviewQueueItem:
    item = session.get(ReviewQueueItem, item_id)
    if item is None or item.queue_id != queue.id:
        raise QueueNotFound(f"queue {queue.name!r} has no item {item_id}")
    return item


def open_assignment(
    *,
    session: Session,
    queue_id: int,
    item_id: int,
    reviewer: Actor | str | None,
    now: datetime | None = None,
) -> Assignment:
    """Open one item by its id (a link `/review?queue=…&item=…`): the reviewer's own row when they
    hold or labelled it, else a reservation when it has room (they let go of the item they held).
    ItemTaken when it has all the reviewers it needs; nothing changes then."""
    now = reservations.utc(now)
    queue = _locked_queue(session, queue_id)
    name = _labeller(session, queue, reviewer).identity
    item = _item_of(session, queue, item_id)
    row = reservations.find(session, queue_id=queue.id, item_key=item.item_key, reviewer=name)
    if row is not None and row.status in (reservations.RESERVED, reservations.DONE):
        if row.status == reservations.RESERVED:
            reservations.renew(row, now)
            session.add(row)
            session.flush()
        return _assignment(queue, item, row)
    current = reservations.held(session, queue_id=queue.id, reviewer=name)
    item = _locked_item(session, item_id)
    claimed = _claim(session, queue, item, name, now, asked=True)
    if claimed is None:
        raise ItemTaken(
            f"item {item.position} of {queue.name!r} has the {queue.overlap} reviewer(s) it needs; "
            "take the next item instead"
        )
    if current is not None and current.item_id != item.id:
        _let_go(session, queue, current, now)
    return _assignment(queue, item, claimed)


def _let_go(
    session: Session, queue: ReviewQueue, row: ReviewAssignment, now: datetime, *, status: str = "released"
) -> None:
    """End the reviewer's hold on an item: the item has room for someone else again."""
    assert row.item_id is not None
    item = _locked_item(session, row.item_id)
    if row.status == reservations.RESERVED:
        item.claimed = max(0, item.claimed - 1)
        item.available = item.claimed < queue.overlap
        session.add(item)
    reservations.release(row, now, status=status)
    session.add(row)
    session.flush()


def skip_item(
    *,
    session: Session,
    queue_id: int,
    item_id: int,
    reviewer: Actor | str | None,
    now: datetime | None = None,
) -> None:
    """The reviewer passes over an item: it goes to others, and not back to them until they bring
    their skipped items back. Their labels of it (unless decided) are withdrawn."""
    now = reservations.utc(now)
    queue = _locked_queue(session, queue_id)
    name = _labeller(session, queue, reviewer).identity
    item = _locked_item(session, item_id, queue)
    row = reservations.find(session, queue_id=queue.id, item_key=item.item_key, reviewer=name)
    if row is None:
        row = ReviewAssignment(
            queue_id=queue.id, item_id=item.id, item_key=item.item_key, reviewer=name, status="released",
            reserved_at=now, expires_at=now,
        )  # fmt: skip
    if row.status == reservations.DONE:
        raise QueueError("you labelled every judgment of this item; undo a label to change it")
    _let_go(session, queue, row, now, status=reservations.SKIPPED)


def skipped_items(*, session: Session, queue_id: int, reviewer: str) -> list[int]:
    """The ids of the items the reviewer skipped in this queue, in the order skipped."""
    keys = reservations.keys_with_status(
        session, queue_id=queue_id, reviewer=reviewer, status=reservations.SKIPPED
    )
    if not keys:
        return []
    ids = dict(
        session.execute(
            select(ReviewQueueItem.item_key, ReviewQueueItem.id).where(
                col(ReviewQueueItem.queue_id) == queue_id, col(ReviewQueueItem.item_key).in_(keys)
            )
        ).all()
    )
    return [ids[k] for k in keys if k in ids]


def bring_back_skipped(*, session: Session, queue_id: int, reviewer: str) -> int:
    """The reviewer's skipped items of this queue come back to them; returns how many."""
    return reservations.bring_back_skipped(session, queue_id=queue_id, reviewer=reviewer)


def save_draft(
    *, session: Session, queue_id: int, item_id: int, reviewer: str, draft: Mapping[str, Any]
) -> None:
    """Keep the reviewer's unsent input for an item they hold (typed scores and reasons per
    judgment id), so a reload, a new tab or another device shows it again."""
    queue = get_queue(session=session, queue=queue_id)
    item = _item_of(session, queue, item_id)
    if (
        reservations.save_draft(
            session, queue_id=queue.id, item_key=item.item_key, reviewer=reviewer, draft=draft
        )
        is None
    ):
        raise QueueError("open the item before saving a draft of it")


# ---------------------------------------------------------------------------------------------
# What a reviewer sees of an item


@dataclass(frozen=True)
class BlindMetric:
    """One judgment to label blind: what it is about and its scale, nothing the judge said."""

    judgment_id: int
    metric: str | None
    title: str
    scale: DecisionScale
    keys: dict[str, str]
    blind_decision: str | None = None
    blind_reason: str | None = None


@dataclass(frozen=True)
class BlindItem:
    """An item of a blind-first queue before the reveal: the question and the plain answer (no
    highlights), or a stand-alone judgment's subject. Built from selected columns only, so no
    judge score, reason, evidence or other reviewer's score can reach the page."""

    queue_id: int
    item_id: int
    item_key: str
    position: int
    product: str
    snapshot_id: str | None
    question: str
    answer: str
    language: str | None
    change_id: str | None  # stand-alone judgments: their subject instead of a question
    description: str | None
    url: str | None
    metrics: tuple[BlindMetric, ...]


def _blind_scale(spec: MetricSpec | None, is_label: bool, metric: str | None) -> DecisionScale:
    """The scale of a blind label: the rubric's, else the label set, else any number — never
    derived from the judge's decision itself (decision_scale adds an unusual judge label)."""
    if spec is not None:
        return DecisionScale(spec=spec)
    if is_label:
        return DecisionScale(labels=CACHE_DECISIONS)
    slug = metric or "score"
    return DecisionScale(
        spec=MetricSpec(
            slug=slug, display_name=slug, min_value=-float("inf"), max_value=float("inf"), integer_scale=False
        )
    )


def _reviewer_row(
    session: Session, queue: ReviewQueue, item: ReviewQueueItem, reviewer: str
) -> ReviewAssignment | None:
    return reservations.find(session, queue_id=queue.id, item_key=item.item_key, reviewer=reviewer)


def load_blind_item(
    *, session: Session, queue_id: int, item_id: int, reviewer: Actor | str | None
) -> BlindItem:
    """The item as a reviewer of a blind-first queue sees it before the reveal (READ permission)."""
    authorize(session, reviewer, Permission.READ)
    queue = get_queue(session=session, queue=queue_id)
    item = _item_of(session, queue, item_id)
    name = str(reviewer) if not isinstance(reviewer, Actor) else reviewer.identity
    rows = session.execute(
        select(Judgment.id, Judgment.metric, Judgment.product, Judgment.change_id, Judgment.description,
               Judgment.url, Judgment.decision)
        .join(ReviewQueueJudgment, col(ReviewQueueJudgment.judgment_id) == col(Judgment.id))
        .where(col(ReviewQueueJudgment.item_id) == item.id)
        .order_by(col(Judgment.id))
    ).all()  # fmt: skip
    if not rows:
        raise QueueNotFound(f"item {item.position} of {queue.name!r} has no judgments any more")
    product = rows[0].product
    specs = {s.slug: (i, s) for i, s in enumerate(metrics_for_product(session=session, product=product))}
    own = {
        label.judgment_id: label
        for label in session.exec(
            select(ReviewLabel).where(col(ReviewLabel.item_id) == item.id, col(ReviewLabel.reviewer) == name)
        ).all()
    }
    metrics = []
    for row in rows:
        position, spec = specs.get(row.metric or "", (len(specs), None))
        scale = _blind_scale(spec, parse_score(row.decision) is None, row.metric)
        label = own.get(row.id)
        metrics.append(
            (
                (position, row.metric or "", row.id),
                BlindMetric(
                    judgment_id=row.id, metric=row.metric,
                    title=spec.display_name if spec else (row.metric or row.change_id), scale=scale,
                    keys=score_keys(scale), blind_decision=label.blind_decision if label else None,
                    blind_reason=label.blind_reason if label else None,
                ),
            )
        )  # fmt: skip
    question = answer = ""
    language = None
    if item.snapshot_id is not None:
        snap = session.execute(
            select(
                EvaluationSnapshot.question, EvaluationSnapshot.model_answer, EvaluationSnapshot.language
            ).where(col(EvaluationSnapshot.id) == item.snapshot_id)
        ).one()
        question, answer, language = snap
    single = rows[0] if item.snapshot_id is None else None
    assert queue.id is not None and item.id is not None
    return BlindItem(
        queue_id=queue.id, item_id=item.id, item_key=item.item_key, position=item.position, product=product,
        snapshot_id=item.snapshot_id, question=question, answer=answer, language=language,
        change_id=single.change_id if single else None, description=single.description if single else None,
        url=single.url if single else None, metrics=tuple(m for _, m in sorted(metrics, key=lambda p: p[0])),
    )  # fmt: skip


@dataclass
class TeamItem:
    """An item with the judge's side (open mode, or blind-first after the reveal): the judgments as
    the review page lays them out (`review_queue.load_workspace(item=...)`), the reviewer's own
    labels and each judgment's state in the queue."""

    queue: ReviewQueue
    item_id: int
    position: int
    item: QueueItem
    labels: dict[int, ReviewLabel]
    states: dict[int, str]


def load_item(*, session: Session, queue_id: int, item_id: int, reviewer: Actor | str | None) -> TeamItem:
    """The item with the judge's side. In a blind-first queue NotRevealed for anyone who may still
    label it and has not saved a blind label for each of its judgments (then `load_blind_item`):
    a reviewer must not see the judge by opening an item before taking it. Viewers, reviewers the
    queue is not assigned to, and anyone once the item has all its reviewers see it whole."""
    actor = authorize(session, reviewer, Permission.READ)
    queue = get_queue(session=session, queue=queue_id)
    item = _item_of(session, queue, item_id)
    row = _reviewer_row(session, queue, item, actor.identity)
    revealed = row is not None and (row.revealed_at is not None or row.status == reservations.DONE)
    could_label = (
        queue.status == "active"
        and actor.can(Permission.REVIEW)
        and may_label(queue, actor.identity)
        and item.done < queue.overlap
    )
    if queue.mode == "blind" and could_label and not revealed:
        raise NotRevealed("label every metric of this item first; the judge's side is shown after that")
    qjs = session.exec(select(ReviewQueueJudgment).where(col(ReviewQueueJudgment.item_id) == item.id)).all()
    judgments = list(
        session.exec(select(Judgment).where(col(Judgment.id).in_([q.judgment_id for q in qjs]))).all()
    )
    snapshot = session.get(EvaluationSnapshot, item.snapshot_id) if item.snapshot_id else None
    sort_by_rubric(session=session, judgments=judgments)
    labels = {
        label.judgment_id: label
        for label in session.exec(
            select(ReviewLabel).where(
                col(ReviewLabel.item_id) == item.id, col(ReviewLabel.reviewer) == actor.identity
            )
        ).all()
    }
    assert item.id is not None
    return TeamItem(
        queue=queue, item_id=item.id, position=item.position,
        item=QueueItem(key=item.item_key, judgments=judgments, snapshot=snapshot), labels=labels,
        states={q.judgment_id: q.state for q in qjs},
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Labels and their resolution


@dataclass(frozen=True)
class LabelInput:
    """One label: a decision on the judgment's scale (the judge's own decision confirms it)."""

    judgment_id: int
    decision: Any
    reason: str | None = None


@dataclass(frozen=True)
class LabelOutcome:
    """What saving labels did: the stage they were saved in, whether the judge's side may now be
    shown (blind-first), whether the reviewer is done with the item, and each judgment's state."""

    stage: str  # "blind" or "final"
    revealed: bool
    item_done: bool
    states: dict[int, str]


def _equals_judge(judgment: Judgment, value: Any) -> bool:
    text = str(value if value is not None else "").strip()
    return same_decision(judgment.decision, text) or text.upper() == judgment.decision


def agreed_decision(scale: DecisionScale, decisions: Sequence[str], tolerance: float | None) -> str | None:
    """The decision k labels agree on, or None: labels and whole-number scores must be equal;
    continuous scores agree when they lie within `tolerance` of each other, and their mean decides."""
    if not decisions:
        return None
    if scale.spec is None:
        return decisions[0] if all(d == decisions[0] for d in decisions) else None
    numbers = [parse_score(d) for d in decisions]
    if any(n is None for n in numbers):
        return None
    values = [float(n) for n in numbers if n is not None]
    if scale.spec.integer_scale:
        return format_score(values[0]) if all(v == values[0] for v in values) else None
    if max(values) - min(values) > (tolerance or 0.0) + 1e-9:
        return None
    # Nine decimals: the mean of 0.3, 0.35 and 0.4 is 0.35, not 0.35000000000000003.
    return format_score(round(math.fsum(values) / len(values), 9))


def _final_labels(session: Session, queue_id: int, judgment_id: int) -> list[ReviewLabel]:
    return list(
        session.exec(
            select(ReviewLabel)
            .where(
                col(ReviewLabel.queue_id) == queue_id,
                col(ReviewLabel.judgment_id) == judgment_id,
                col(ReviewLabel.decision).is_not(None),
            )
            .order_by(col(ReviewLabel.labelled_at), col(ReviewLabel.id))
        ).all()
    )


def _joined_reasons(labels: Sequence[ReviewLabel]) -> str | None:
    reasons = list(dict.fromkeys(r for r in ((label.reason or "").strip() for label in labels) if r))
    return " | ".join(reasons) or None


def _write_decision(
    session: Session,
    queue: ReviewQueue,
    qj: ReviewQueueJudgment,
    decision: str,
    reason: str | None,
    actor: Actor,
    state: str,
    now: datetime,
) -> None:
    """The queue's decision reaches the judgment through `record_review` (its one write)."""
    # PostgreSQL: the review lock before the judgment's row, the order every review takes them
    # (lib.corrections._write_review_state): a lone review of this judgment holding the lock while
    # it waits for the row deadlocked with a settlement that held the row. FOR NO KEY UPDATE: a
    # transaction that merely inserted a row pointing at the judgment (its FOR KEY SHARE) must not
    # hold this settlement, and every review behind its lock (review6 R1).
    one_writer_per_product_of_judgment(session, PG_REVIEW_COUNTERS_LOCK, qj.judgment_id)
    judgment = session.exec(
        select(Judgment)
        .where(col(Judgment.id) == qj.judgment_id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    ).one()
    assert judgment.id is not None
    record_review(
        session=session, judgment_id=judgment.id, expected_version=judgment.version,
        action="confirm" if same_decision(judgment.decision, decision) else "overrule",
        user_decision=decision, reviewer=actor, reason=reason, require_reason=False, queue_id=queue.id, at=now,
    )  # fmt: skip
    qj.state, qj.held, qj.decision, qj.decided_by, qj.decided_at = state, False, decision, actor.identity, now
    session.add(qj)


def _settle(
    session: Session,
    queue: ReviewQueue,
    qj: ReviewQueueJudgment,
    judgment: Judgment,
    actor: Actor,
    now: datetime,
) -> None:
    """A judgment with all its labels: resolved when they agree, else disputed (for a lead)."""
    assert queue.id is not None
    labels = _final_labels(session, queue.id, qj.judgment_id)
    scale = decision_scale(session=session, judgment=judgment)
    agreed = agreed_decision(scale, [label.decision or "" for label in labels], queue.tolerance)
    if agreed is None:
        qj.state = DISPUTED
        session.add(qj)
        return
    _write_decision(session, queue, qj, agreed, _joined_reasons(labels), actor, RESOLVED, now)


def _blind_value(session: Session, judgment: Judgment, value: Any) -> str:
    spec = None
    if judgment.metric:
        spec = next(
            (
                s
                for s in metrics_for_product(session=session, product=judgment.product)
                if s.slug == judgment.metric
            ),
            None,
        )
    scale = _blind_scale(spec, parse_score(judgment.decision) is None, judgment.metric)
    return scale.parse(value)


def label_item(
    *,
    session: Session,
    queue_id: int,
    item_id: int,
    reviewer: Actor | str | None,
    labels: Sequence[LabelInput],
    now: datetime | None = None,
) -> LabelOutcome:
    """Save the reviewer's labels of some or all judgments of an item they hold, all or nothing.

    Blind-first before the reveal they are blind labels (any score on the scale; a reason is
    welcome); when every judgment has one the item is revealed. Otherwise they are final labels,
    parsed by the one review rule (a label that differs from the judge needs a reason; in a
    blind-first queue the blind reason serves). A judgment with all its labels is settled at once.
    A reviewer may change their label until its judgment is decided.
    """
    with rubrics_read_once(session):  # each judgment's scale is asked for up to three times
        return _label_item(
            session=session, queue_id=queue_id, item_id=item_id, reviewer=reviewer, labels=labels, now=now
        )


def _label_item(
    *,
    session: Session,
    queue_id: int,
    item_id: int,
    reviewer: Actor | str | None,
    labels: Sequence[LabelInput],
    now: datetime | None,
) -> LabelOutcome:
    now = reservations.utc(now)
    if not labels:
        raise QueueError("give at least one label")
    queue = _locked_queue(session, queue_id)
    actor = _labeller(session, queue, reviewer)
    name = actor.identity
    assert queue.id is not None
    item = _locked_item(session, item_id, queue)
    row = _reviewer_row(session, queue, item, name)
    if row is None or row.status not in (reservations.RESERVED, reservations.DONE):
        had_it = row is not None and row.status == reservations.EXPIRED
        row = _claim(session, queue, item, name, now, asked=True)
        if row is None:
            raise ItemTaken(
                f"item {item.position} of {queue.name!r} went to other reviewers"
                + (
                    " (your reservation ran out); your draft is kept"
                    if had_it
                    else "; take the next item instead"
                )
            )
    qjs = {
        q.judgment_id: q
        for q in session.exec(
            select(ReviewQueueJudgment).where(col(ReviewQueueJudgment.item_id) == item.id)
        ).all()
    }
    own = {
        label.judgment_id: label
        for label in session.exec(
            select(ReviewLabel).where(col(ReviewLabel.item_id) == item.id, col(ReviewLabel.reviewer) == name)
        ).all()
    }
    blind = queue.mode == "blind" and row.revealed_at is None
    # The labelled judgments in one read, not one each.
    wanted = sorted({given.judgment_id for given in labels if given.judgment_id in qjs})
    judgments = (
        {j.id: j for j in session.exec(select(Judgment).where(col(Judgment.id).in_(wanted))).all()}
        if wanted
        else {}
    )
    seen: set[int] = set()
    for given in sorted(labels, key=lambda x: x.judgment_id):
        if given.judgment_id in seen:
            raise QueueError(f"judgment {given.judgment_id} is labelled twice")
        seen.add(given.judgment_id)
        qj = qjs.get(given.judgment_id)
        if qj is None:
            raise QueueError(
                f"judgment {given.judgment_id} is not part of item {item.position} of {queue.name!r}"
            )
        if qj.state != OPEN:
            raise QueueError(
                f"judgment {given.judgment_id} is {qj.state} already; undo your label to change it"
            )
        judgment = judgments.get(qj.judgment_id)
        if judgment is None:
            raise QueueNotFound(f"judgment {qj.judgment_id} is gone")
        label = own.get(qj.judgment_id)
        if label is None:
            label = ReviewLabel(
                queue_id=queue.id, item_id=item.id or 0, judgment_id=qj.judgment_id, reviewer=name
            )
            own[qj.judgment_id] = label
        reason = (given.reason or "").strip() or None
        if blind:
            label.blind_decision, label.blind_reason, label.blind_at = (
                _blind_value(session, judgment, given.decision),
                reason,
                now,
            )
        else:
            action = "confirm" if _equals_judge(judgment, given.decision) else "overrule"
            decided, reason = review_decision(
                session=session, judgment=judgment, action=action, user_decision=given.decision,
                reason=reason or label.blind_reason, require_reason=True,
            )  # fmt: skip
            newly = label.decision is None
            label.decision, label.reason, label.labelled_at, label.withdrawn_at = decided, reason, now, None
            session.add(label)
            session.flush()
            if newly:
                qj.labels += 1
            if qj.labels >= queue.overlap:
                _settle(session, queue, qj, judgment, actor, now)
        session.add(label)
    session.flush()
    if blind and all(own.get(j) is not None and own[j].blind_decision is not None for j in qjs):
        row.revealed_at = now
    done = not blind and all(own.get(j) is not None and own[j].decision is not None for j in qjs)
    if done and row.status != reservations.DONE:
        reservations.finish(row, now)
        item.done += 1
        session.add(item)
    elif row.status == reservations.RESERVED:
        reservations.renew(row, now)
    session.add(row)
    session.flush()
    return LabelOutcome(
        stage="blind" if blind else "final",
        revealed=row.revealed_at is not None,
        item_done=row.status == reservations.DONE,
        states={j: q.state for j, q in qjs.items()},
    )


def label(
    *,
    session: Session,
    queue_id: int,
    judgment_id: int,
    reviewer: Actor | str | None,
    decision: Any,
    reason: str | None = None,
    now: datetime | None = None,
) -> LabelOutcome:
    """Label one judgment of a queue (its item found for you): `label_item` with one label."""
    qj = _queue_judgment(session, queue_id, judgment_id)
    return label_item(
        session=session, queue_id=queue_id, item_id=qj.item_id, reviewer=reviewer,
        labels=[LabelInput(judgment_id=judgment_id, decision=decision, reason=reason)], now=now,
    )  # fmt: skip


def _queue_judgment(session: Session, queue_id: int, judgment_id: int) -> ReviewQueueJudgment:
    qj = session.exec(
        select(ReviewQueueJudgment).where(
            col(ReviewQueueJudgment.queue_id) == queue_id, col(ReviewQueueJudgment.judgment_id) == judgment_id
        )
    ).first()
    if qj is None:
        raise QueueNotFound(f"judgment {judgment_id} is not in queue {queue_id}")
    return qj


def adjudicate(
    *,
    session: Session,
    queue_id: int,
    judgment_id: int,
    actor: Actor | str | None,
    decision: Any,
    reason: str | None = None,
    now: datetime | None = None,
) -> ReviewQueueJudgment:
    """A lead decides a disputed judgment: the decision reaches the judgment as a review does
    (overruling the judge needs a reason)."""
    now = reservations.utc(now)
    lead = authorize(session, actor, Permission.ADJUDICATE)
    queue = _locked_queue(session, queue_id)
    assert queue.id is not None
    found = _queue_judgment(session, queue.id, judgment_id)
    _locked_item(session, found.item_id)  # the item first: the same lock order as labelling
    qj = session.exec(
        select(ReviewQueueJudgment)
        .where(col(ReviewQueueJudgment.id) == found.id)
        .execution_options(populate_existing=True)
    ).one()
    if qj.state != DISPUTED:
        raise QueueError(f"judgment {judgment_id} is {qj.state}; only a disputed judgment is adjudicated")
    judgment = session.get(Judgment, judgment_id)
    assert judgment is not None
    action = "confirm" if _equals_judge(judgment, decision) else "overrule"
    decided, reason = review_decision(
        session=session,
        judgment=judgment,
        action=action,
        user_decision=decision,
        reason=reason,
        require_reason=True,
    )
    _write_decision(session, queue, qj, decided, reason, lead, ADJUDICATED, now)
    session.flush()
    latest = session.exec(
        select(JudgmentEvent)
        .where(col(JudgmentEvent.judgment_id) == judgment_id)
        .order_by(col(JudgmentEvent.id).desc())
    ).first()
    if latest is not None:
        announce_review(session=session, judgment=judgment, event=latest.model_dump(), adjudicated=True)
    return qj


def _rehold(session: Session, qj: ReviewQueueJudgment) -> None:
    """Hold a judgment again after its decision is undone, unless another queue took it meanwhile."""
    other = session.exec(
        select(ReviewQueueJudgment.queue_id).where(
            col(ReviewQueueJudgment.judgment_id) == qj.judgment_id,
            col(ReviewQueueJudgment.held),
            col(ReviewQueueJudgment.id) != qj.id,
        )
    ).first()
    if other is not None:
        raise QueueError(
            f"judgment {qj.judgment_id} is in queue {other} now; its decision here cannot be undone"
        )
    qj.held = True


def _undo_decision(
    session: Session, queue: ReviewQueue, qj: ReviewQueueJudgment, actor: Actor, now: datetime
) -> None:
    """Take back the queue's decision on the judgment through `corrections.undo_review`."""
    judgment = session.get(Judgment, qj.judgment_id, populate_existing=True)
    assert judgment is not None and judgment.id is not None
    _rehold(session, qj)
    try:
        undo_review(
            session=session, judgment_id=judgment.id, expected_version=judgment.version, reviewer=actor,
            queue_id=queue.id, at=now,
        )  # fmt: skip
    except NothingToUndo:
        raise QueueError(
            f"the decision on judgment {qj.judgment_id} was changed since (it is not this queue's latest "
            "change any more), so it cannot be undone here"
        ) from None
    qj.decision = qj.decided_by = qj.decided_at = None


def undo_label(
    *,
    session: Session,
    queue_id: int,
    judgment_id: int,
    reviewer: Actor | str | None,
    now: datetime | None = None,
) -> ReviewLabel:
    """Withdraw the reviewer's own label of a judgment (its value goes into their draft).

    Allowed while the judgment collects labels or is disputed; when their label resolved it, also
    while that resolution is the judgment's latest change (the judgment's review is undone with
    it). An adjudicated judgment is the lead's to undo.
    """
    now = reservations.utc(now)
    queue = _locked_queue(session, queue_id)
    actor = _labeller(session, queue, reviewer)
    assert queue.id is not None
    found = _queue_judgment(session, queue.id, judgment_id)
    item = _locked_item(session, found.item_id)
    qj = session.exec(
        select(ReviewQueueJudgment)
        .where(col(ReviewQueueJudgment.id) == found.id)
        .execution_options(populate_existing=True)
    ).one()
    own = session.exec(
        select(ReviewLabel).where(
            col(ReviewLabel.queue_id) == queue.id, col(ReviewLabel.judgment_id) == judgment_id,
            col(ReviewLabel.reviewer) == actor.identity,
        )
    ).first()  # fmt: skip
    if own is None or (own.decision is None and own.blind_decision is None):
        raise NothingToUndo(f"you have no label of judgment {judgment_id} in {queue.name!r}")
    if qj.state in (ADJUDICATED, RELEASED):
        raise QueueError(f"judgment {judgment_id} is {qj.state}; a lead can change it")
    if qj.state == RESOLVED:
        if qj.decided_by != actor.identity:
            raise QueueError(
                f"judgment {judgment_id} was resolved when {qj.decided_by}'s label agreed with yours; "
                "only the label that resolved it can be withdrawn"
            )
        _undo_decision(session, queue, qj, actor, now)
    row = _reviewer_row(session, queue, item, actor.identity)
    if own.decision is not None:
        qj.labels = max(0, qj.labels - 1)
        if row is not None:
            row.draft = {
                **(row.draft or {}),
                str(judgment_id): {"decision": own.decision, "reason": own.reason},
            }
        own.decision, own.reason, own.labelled_at = None, None, None
    else:  # a blind label before the reveal
        if row is not None:
            row.draft = {
                **(row.draft or {}),
                str(judgment_id): {"decision": own.blind_decision, "reason": own.blind_reason},
            }
        own.blind_decision, own.blind_reason, own.blind_at = None, None, None
    own.withdrawn_at = now
    qj.state = OPEN
    if row is not None and row.status == reservations.DONE:
        row.status, row.finished_at, row.reserved_at = reservations.RESERVED, None, now
        item.done = max(0, item.done - 1)
    if row is not None and row.status == reservations.RESERVED:
        reservations.renew(row, now)
        session.add(row)
    session.add_all([qj, own, item])
    session.flush()
    return own


def undo_adjudication(
    *,
    session: Session,
    queue_id: int,
    judgment_id: int,
    actor: Actor | str | None,
    now: datetime | None = None,
) -> ReviewQueueJudgment:
    """The lead takes back their adjudication while it is the judgment's latest change: disputed again."""
    now = reservations.utc(now)
    lead = authorize(session, actor, Permission.ADJUDICATE)
    queue = _locked_queue(session, queue_id)
    assert queue.id is not None
    found = _queue_judgment(session, queue.id, judgment_id)
    _locked_item(session, found.item_id)
    qj = session.exec(
        select(ReviewQueueJudgment)
        .where(col(ReviewQueueJudgment.id) == found.id)
        .execution_options(populate_existing=True)
    ).one()
    if qj.state != ADJUDICATED:
        raise QueueError(f"judgment {judgment_id} is {qj.state}, not adjudicated")
    if qj.decided_by != lead.identity:
        raise QueueError(f"{qj.decided_by} adjudicated judgment {judgment_id}; only they can undo it")
    _undo_decision(session, queue, qj, lead, now)
    qj.state = DISPUTED
    session.add(qj)
    session.flush()
    return qj


# ---------------------------------------------------------------------------------------------
# Adjudication list and progress


@dataclass(frozen=True)
class LabelView:
    """One reviewer's label as a lead sees it beside the others."""

    reviewer: str
    blind_decision: str | None
    blind_reason: str | None
    decision: str | None
    reason: str | None
    labelled_at: datetime | None


@dataclass(frozen=True)
class Dispute:
    """A judgment whose labels disagree (or one already decided, for review): all its labels."""

    queue_id: int
    item_id: int
    position: int
    judgment: Judgment
    state: str
    labels: tuple[LabelView, ...]
    decision: str | None
    decided_by: str | None


def disputes(
    *, session: Session, queue_id: int, state: str = DISPUTED, offset: int = 0, limit: int = 50
) -> list[Dispute]:
    """The queue's judgments in a state (awaiting adjudication by default), in queue order, each with
    every reviewer's labels and reasons side by side (READ; adjudicating needs a lead)."""
    queue = get_queue(session=session, queue=queue_id)
    rows = session.execute(
        select(ReviewQueueJudgment, ReviewQueueItem.position, Judgment)
        .join(ReviewQueueItem, col(ReviewQueueItem.id) == col(ReviewQueueJudgment.item_id))
        .join(Judgment, col(Judgment.id) == col(ReviewQueueJudgment.judgment_id))
        .where(col(ReviewQueueJudgment.queue_id) == queue.id, col(ReviewQueueJudgment.state) == state)
        .order_by(col(ReviewQueueItem.position), col(Judgment.id))
        .offset(offset)
        .limit(limit)
    ).all()
    ids = [qj.judgment_id for qj, _, _ in rows]
    by_judgment: dict[int, list[LabelView]] = {}
    for lab in session.exec(
        select(ReviewLabel)
        .where(col(ReviewLabel.queue_id) == queue.id, col(ReviewLabel.judgment_id).in_(ids))
        .order_by(col(ReviewLabel.labelled_at), col(ReviewLabel.id))
    ).all():
        if lab.decision is None:
            continue
        by_judgment.setdefault(lab.judgment_id, []).append(
            LabelView(
                lab.reviewer, lab.blind_decision, lab.blind_reason, lab.decision, lab.reason, lab.labelled_at
            )
        )
    assert queue.id is not None
    return [
        Dispute(
            queue_id=queue.id,
            item_id=qj.item_id,
            position=position,
            judgment=judgment,
            state=qj.state,
            labels=tuple(by_judgment.get(qj.judgment_id, [])),
            decision=qj.decision,
            decided_by=qj.decided_by,
        )
        for qj, position, judgment in rows
    ]


@dataclass(frozen=True)
class QueueProgress:
    """Where a queue stands: items done (every reviewer it needs labelled it), reserved right now,
    remaining; judgments resolved by agreement, awaiting adjudication, adjudicated."""

    items: int
    items_done: int
    reserved: int
    judgments: int
    open: int
    resolved: int
    disputed: int
    adjudicated: int
    released: int
    labels: int

    @property
    def remaining(self) -> int:
        return self.items - self.items_done

    @property
    def decided(self) -> int:
        return self.resolved + self.adjudicated

    @property
    def fraction(self) -> float:
        return self.items_done / self.items if self.items else 1.0


def queue_progress(*, session: Session, queue_id: int, now: datetime | None = None) -> QueueProgress:
    """Counts of one queue, read from its own rows (proportional to the queue, not the database)."""
    now = reservations.utc(now)
    queue = get_queue(session=session, queue=queue_id)
    states = dict(
        session.execute(
            select(ReviewQueueJudgment.state, func.count())
            .where(col(ReviewQueueJudgment.queue_id) == queue.id)
            .group_by(col(ReviewQueueJudgment.state))
        ).all()
    )
    done = session.execute(
        select(func.count()).where(
            col(ReviewQueueItem.queue_id) == queue.id, col(ReviewQueueItem.done) >= queue.overlap
        )
    ).scalar_one()
    reserved = session.execute(
        select(func.count()).where(
            col(ReviewAssignment.status) == reservations.RESERVED,
            col(ReviewAssignment.queue_id) == queue.id,
            col(ReviewAssignment.expires_at) > now,
        )
    ).scalar_one()
    labels = session.execute(
        select(func.count()).where(
            col(ReviewLabel.queue_id) == queue.id, col(ReviewLabel.decision).is_not(None)
        )
    ).scalar_one()
    return QueueProgress(
        items=queue.items, items_done=int(done), reserved=int(reserved), judgments=queue.judgments,
        open=states.get(OPEN, 0), resolved=states.get(RESOLVED, 0), disputed=states.get(DISPUTED, 0),
        adjudicated=states.get(ADJUDICATED, 0), released=states.get(RELEASED, 0), labels=int(labels),
    )  # fmt: skip


@dataclass(frozen=True)
class ReviewerProgress:
    """One reviewer in one queue: items done, held now, skipped, labels given, labels of theirs
    awaiting adjudication, items per hour (time holding items, each hold up to its lease)."""

    reviewer: str
    assigned: bool
    done: int
    reserved: int
    skipped: int
    labels: int
    awaiting_adjudication: int
    active_seconds: float
    last_at: datetime | None

    @property
    def items_per_hour(self) -> float | None:
        return self.done * 3600.0 / self.active_seconds if self.done and self.active_seconds > 0 else None


def reviewer_progress(
    *, session: Session, queue_id: int, now: datetime | None = None
) -> list[ReviewerProgress]:
    """Per reviewer of a queue (assigned ones even before they start), most items done first."""
    now = reservations.utc(now)
    queue = get_queue(session=session, queue=queue_id)
    stats: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return stats.setdefault(
            name,
            {"done": 0, "reserved": 0, "skipped": 0, "labels": 0, "awaiting": 0, "active": 0.0, "last": None},
        )

    for name in queue.reviewers or []:
        entry(name)
    for row in session.execute(
        select(
            ReviewAssignment.reviewer, ReviewAssignment.status, ReviewAssignment.expires_at,
            ReviewAssignment.active_seconds, ReviewAssignment.finished_at, ReviewAssignment.reserved_at,
        ).where(col(ReviewAssignment.queue_id) == queue.id)
    ).all():  # fmt: skip
        e = entry(row.reviewer)
        if row.status == reservations.DONE:
            e["done"] += 1
        elif row.status == reservations.SKIPPED:
            e["skipped"] += 1
        elif row.status == reservations.RESERVED and row.expires_at > now:
            e["reserved"] += 1
        e["active"] += row.active_seconds or 0.0
        moments = [m for m in (row.finished_at, row.reserved_at) if m is not None]
        if moments and (e["last"] is None or max(moments) > e["last"]):
            e["last"] = max(moments)
    for reviewer, state, n in session.execute(
        select(ReviewLabel.reviewer, ReviewQueueJudgment.state, func.count())
        .join(
            ReviewQueueJudgment,
            and_(
                col(ReviewQueueJudgment.queue_id) == col(ReviewLabel.queue_id),
                col(ReviewQueueJudgment.judgment_id) == col(ReviewLabel.judgment_id),
            ),
        )
        .where(col(ReviewLabel.queue_id) == queue.id, col(ReviewLabel.decision).is_not(None))
        .group_by(col(ReviewLabel.reviewer), col(ReviewQueueJudgment.state))
    ).all():
        e = entry(reviewer)
        e["labels"] += n
        if state == DISPUTED:
            e["awaiting"] += n
    assigned = {normalize_identity(r) for r in queue.reviewers or []}
    out = [
        ReviewerProgress(
            reviewer=name,
            assigned=normalize_identity(name) in assigned,
            done=e["done"],
            reserved=e["reserved"],
            skipped=e["skipped"],
            labels=e["labels"],
            awaiting_adjudication=e["awaiting"],
            active_seconds=e["active"],
            last_at=e["last"],
        )
        for name, e in stats.items()
    ]
    return sorted(out, key=lambda p: (-p.done, p.reviewer))


PROGRESS_COLUMNS = [
    "reviewer", "assigned", "done", "reserved", "skipped", "labels", "awaiting_adjudication", "items_per_hour",
    "last_active",
]  # fmt: skip


def reviewer_progress_frame(rows: Sequence[ReviewerProgress]) -> pd.DataFrame:
    """Per-reviewer progress as the lead's table and its CSV."""
    return pd.DataFrame(
        [
            {
                "reviewer": p.reviewer,
                "assigned": p.assigned,
                "done": p.done,
                "reserved": p.reserved,
                "skipped": p.skipped,
                "labels": p.labels,
                "awaiting_adjudication": p.awaiting_adjudication,
                "items_per_hour": None if p.items_per_hour is None else round(p.items_per_hour, 1),
                "last_active": p.last_at,
            }
            for p in rows
        ],
        columns=PROGRESS_COLUMNS,
    )


def queue_record(queue: ReviewQueue, progress: QueueProgress | None = None) -> dict[str, Any]:
    """A queue as JSON (API, CLI): its settings and, when given, its progress."""
    record: dict[str, Any] = {
        "id": queue.id, "name": queue.name, "description": queue.description, "status": queue.status,
        "mode": queue.mode, "order": queue.item_order, "seed": queue.seed, "overlap": queue.overlap,
        "tolerance": queue.tolerance, "reviewers": list(queue.reviewers or []), "size": queue.size,
        "items": queue.items, "judgments": queue.judgments,
        "filter": {
            "product": queue.product, "metrics": list(queue.metrics or []), "language": queue.language,
            "since": queue.since, "until": queue.until, "review_state": queue.review_state,
        },
        "created_by": queue.created_by, "created_at": queue.created_at, "closed_at": queue.closed_at,
    }  # fmt: skip
    if progress is not None:
        record["progress"] = {
            "items_done": progress.items_done, "reserved": progress.reserved, "remaining": progress.remaining,
            "open": progress.open, "resolved": progress.resolved, "awaiting_adjudication": progress.disputed,
            "adjudicated": progress.adjudicated, "released": progress.released, "labels": progress.labels,
        }  # fmt: skip
    return record


def dispute_record(dispute: Dispute) -> dict[str, Any]:
    """A judgment with its labels side by side as JSON (the adjudication list of the API and CLI)."""
    j = dispute.judgment
    return {
        "judgment_id": j.id, "item_id": dispute.item_id, "position": dispute.position, "change_id": j.change_id,
        "metric": j.metric, "judge_decision": j.decision, "judge_reasoning": j.reasoning, "state": dispute.state,
        "decision": dispute.decision, "decided_by": dispute.decided_by,
        "labels": [
            {"reviewer": lv.reviewer, "blind_decision": lv.blind_decision, "blind_reason": lv.blind_reason,
             "decision": lv.decision, "reason": lv.reason, "labelled_at": lv.labelled_at}
            for lv in dispute.labels
        ],
    }  # fmt: skip


DISPUTE_COLUMNS = [
    "position", "judgment_id", "change_id", "metric", "judge_decision", "state", "decision", "decided_by",
    "labels", "judge_reasoning",
]  # fmt: skip


def disputes_frame(rows: Sequence[Dispute]) -> pd.DataFrame:
    """The adjudication list as a table and its CSV: one row per judgment, its labels in one cell
    ("ana: 3 (reason); ben: 5"), so it reads side by side in a spreadsheet."""
    records = []
    for d in rows:
        record = dispute_record(d)
        record["labels"] = "; ".join(
            f"{lv['reviewer']}: {lv['decision']}"
            + (
                f" (blind {lv['blind_decision']})"
                if lv["blind_decision"] not in (None, lv["decision"])
                else ""
            )
            + (f" — {lv['reason']}" if lv["reason"] else "")
            for lv in record["labels"]
        )
        records.append({c: record[c] for c in DISPUTE_COLUMNS})
    return pd.DataFrame(records, columns=DISPUTE_COLUMNS)


def assignment_record(assignment: Assignment) -> dict[str, Any]:
    """An assignment as JSON: which item, until when, which stage."""
    return {
        "queue_id": assignment.queue_id, "queue": assignment.queue_name, "item_id": assignment.item_id,
        "item_key": assignment.item_key, "position": assignment.position, "items": assignment.items,
        "reviewer": assignment.reviewer, "status": assignment.status, "stage": assignment.stage,
        "expires_at": assignment.expires_at, "draft": assignment.draft,
    }  # fmt: skip


def blind_item_record(item: BlindItem) -> dict[str, Any]:
    """A blind item as JSON: nothing the judge said is in it to begin with."""
    return {
        "queue_id": item.queue_id, "item_id": item.item_id, "item_key": item.item_key, "position": item.position,
        "product": item.product, "snapshot_id": item.snapshot_id, "question": item.question,
        "answer": item.answer, "language": item.language, "change_id": item.change_id,
        "description": item.description, "url": item.url,
        "metrics": [
            {"judgment_id": m.judgment_id, "metric": m.metric, "title": m.title, "scale": m.scale.describe(),
             "blind_decision": m.blind_decision, "blind_reason": m.blind_reason}
            for m in item.metrics
        ],
    }  # fmt: skip


def team_item_record(item: TeamItem) -> dict[str, Any]:
    """An item with the judge's side as JSON: each judgment with the judge's decision and reason,
    the reviewer's own label and its queue state."""
    judgments = []
    for j in item.item.judgments:
        assert j.id is not None
        own = item.labels.get(j.id)
        judgments.append(
            {
                "judgment_id": j.id,
                "change_id": j.change_id,
                "metric": j.metric,
                "decision": j.decision,
                "reasoning": j.reasoning,
                "state": item.states.get(j.id),
                "blind_decision": own.blind_decision if own else None,
                "label": own.decision if own else None,
                "reason": own.reason if own else None,
            }
        )
    snapshot = item.item.snapshot
    return {
        "queue_id": item.queue.id, "item_id": item.item_id, "item_key": item.item.key, "position": item.position,
        "snapshot_id": snapshot.id if snapshot else None, "question": snapshot.question if snapshot else None,
        "answer": snapshot.model_answer if snapshot else None, "judgments": judgments,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Recount: the item counters from the rows they count


@counters.register_rebuild("review_queue_items")
def rebuild_queue_counts(session: Session) -> None:
    """Each queue item's claimed / done / available and each queue judgment's label count, from the
    reservations and labels (what `python -m lib recount` runs)."""
    for queue in session.exec(select(ReviewQueue)).all():
        assert queue.id is not None
        by_item: dict[int, list[int]] = {}
        for item_id, status in session.execute(
            select(ReviewAssignment.item_id, ReviewAssignment.status).where(
                col(ReviewAssignment.queue_id) == queue.id
            )
        ).all():
            counts = by_item.setdefault(item_id, [0, 0])
            if status in (reservations.RESERVED, reservations.DONE):
                counts[0] += 1
            if status == reservations.DONE:
                counts[1] += 1
        open_items = {
            item_id
            for (item_id,) in session.execute(
                select(ReviewQueueJudgment.item_id)
                .where(col(ReviewQueueJudgment.queue_id) == queue.id, col(ReviewQueueJudgment.state) == OPEN)
                .distinct()
            ).all()
        }
        for item in session.exec(
            select(ReviewQueueItem).where(col(ReviewQueueItem.queue_id) == queue.id)
        ).all():
            claimed, done = by_item.get(item.id or 0, [0, 0])
            available = claimed < queue.overlap and item.id in open_items
            if (item.claimed, item.done, item.available) != (claimed, done, available):
                item.claimed, item.done, item.available = claimed, done, available
                session.add(item)
        labels = dict(
            session.execute(
                select(ReviewLabel.judgment_id, func.count())
                .where(col(ReviewLabel.queue_id) == queue.id, col(ReviewLabel.decision).is_not(None))
                .group_by(col(ReviewLabel.judgment_id))
            ).all()
        )
        for qj in session.exec(
            select(ReviewQueueJudgment).where(col(ReviewQueueJudgment.queue_id) == queue.id)
        ).all():
            if qj.labels != labels.get(qj.judgment_id, 0):
                qj.labels = labels.get(qj.judgment_id, 0)
                session.add(qj)
    session.flush()


# ---------------------------------------------------------------------------------------------
# For the lead's page: what a queue would take, and who could review it

PREVIEW_CAP = MAX_QUEUE_ITEMS * 10  # judgments counted at most by a preview


@dataclass(frozen=True)
class QueuePreview:
    """How much a queue spec matches before it is created: items (evaluations and stand-alone
    judgments) and their judgments, counted up to PREVIEW_CAP judgments (`capped`: there are more)."""

    items: int
    judgments: int
    capped: bool

    def taken(self, size: int) -> int:
        """How many items a queue of `size` takes from these."""
        return min(size, self.items)


def preview_queue(*, session: Session, spec: QueueSpec, cap: int = PREVIEW_CAP) -> QueuePreview:
    """What `create_queue` would draw from with this spec (QueueError when the spec is wrong; the
    name is not checked): one count over the matching judgments, stopped at `cap`."""
    spec = _check_spec(QueueSpec(**{**spec.__dict__, "name": spec.name or "preview"}))
    matching = _candidates(spec, Judgment.id, Judgment.snapshot_id).limit(cap + 1).subquery()
    judgments, evaluations, singles = session.execute(
        select(
            func.count(),
            func.count(func.distinct(matching.c.snapshot_id)),
            func.count().filter(matching.c.snapshot_id.is_(None)),
        ).select_from(matching)
    ).one()
    return QueuePreview(
        items=int(evaluations) + int(singles), judgments=int(judgments), capped=judgments > cap
    )


def reviewer_names(*, session: Session) -> list[str]:
    """Names a lead can assign a queue to: identities with a role that may review, and everyone
    who has labelled, reserved or been assigned in a queue (sorted, without duplicates)."""
    names = {
        identity
        for identity, role in session.execute(select(UserRole.identity, UserRole.role)).all()
        if role_allows(role, Permission.REVIEW)
    }
    names |= set(session.exec(select(ReviewLabel.reviewer).distinct()).all())
    names |= set(session.exec(select(ReviewAssignment.reviewer).distinct()).all())
    for assigned in session.exec(select(ReviewQueue.reviewers)).all():
        names |= set(assigned or [])
    return sorted(n for n in names if n)


OVERVIEW_COLUMNS = [
    "id", "name", "status", "mode", "overlap", "reviewers", "items", "items_done", "reserved", "remaining",
    "awaiting_adjudication", "resolved", "adjudicated", "progress", "created_by", "created_at",
]  # fmt: skip


def queue_overview_frame(rows: Sequence[tuple[ReviewQueue, QueueProgress]]) -> pd.DataFrame:
    """Every queue with its progress, one row each: the lead's list of queues and its CSV."""
    return pd.DataFrame(
        [
            {
                "id": q.id, "name": q.name, "status": q.status, "mode": MODE_LABELS.get(q.mode, q.mode),
                "overlap": q.overlap, "reviewers": ", ".join(q.reviewers or []) or "anyone",
                "items": p.items, "items_done": p.items_done, "reserved": p.reserved, "remaining": p.remaining,
                "awaiting_adjudication": p.disputed, "resolved": p.resolved, "adjudicated": p.adjudicated,
                "progress": p.fraction, "created_by": q.created_by, "created_at": q.created_at,
            }
            for q, p in rows
        ],
        columns=OVERVIEW_COLUMNS,
    )  # fmt: skip
