"""Reservations: a reviewer's lease on a review item, its skips and its unsent draft (issue 26).

One table, `review_assignments`, serves the default queue (`queue_id` None: everything pending,
one reviewer per item) and the team queues of `lib.queues`. A row is one reviewer's relation to
one item: `reserved` while they hold it (the lease runs to `expires_at` and every action renews
it), then `done`, `skipped`, `released` (they moved on) or `expired` (their lease ran out and
someone else claimed the item). Skips and the draft live in the row, so a reload, a new tab or
another device continues where the reviewer was.

Run-out leases are not swept by a timer: whoever claims the item next marks the old row
`expired` with a compare-and-set (`status = 'reserved' AND expires_at <= now`), so each lapsed
lease is taken back exactly once, however many reviewers race for it. Every function takes `now`
so tests move a clock instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, update
from sqlmodel import Session, col, select

from lib.config import get_settings
from lib.models import ReviewAssignment, utcnow

RESERVED, DONE, SKIPPED, RELEASED, EXPIRED = "reserved", "done", "skipped", "released", "expired"
# A reviewer's rows in these states keep the item from being handed to them again.
HANDLED = (RESERVED, DONE, SKIPPED)
MAX_DRAFT_CHARS = 20_000


class ItemTaken(Exception):
    """The item is held by as many reviewers as it needs (or has all its labels); nothing changed."""

    def __init__(self, message: str, *, holders: tuple[str, ...] = (), until: datetime | None = None):
        super().__init__(message)
        self.holders, self.until = holders, until


def lease() -> timedelta:
    """How long a reservation lasts without activity (`OVERRULE_RESERVATION_MINUTES`)."""
    return timedelta(minutes=get_settings().reservation_minutes)


def _queue_is(queue_id: int | None) -> Any:
    column = col(ReviewAssignment.queue_id)
    return column.is_(None) if queue_id is None else column == queue_id


def find(session: Session, *, queue_id: int | None, item_key: str, reviewer: str) -> ReviewAssignment | None:
    """The reviewer's row for an item, whatever its state."""
    return session.exec(
        select(ReviewAssignment).where(
            _queue_is(queue_id),
            col(ReviewAssignment.item_key) == item_key,
            col(ReviewAssignment.reviewer) == reviewer,
        )
    ).first()


def held(session: Session, *, queue_id: int | None, reviewer: str) -> ReviewAssignment | None:
    """The item the reviewer holds in this queue (a lease that ran out counts until someone else
    claims the item: nobody needed it meanwhile, so the reviewer simply continues)."""
    return session.exec(
        select(ReviewAssignment)
        .where(
            col(ReviewAssignment.reviewer) == reviewer,
            _queue_is(queue_id),
            col(ReviewAssignment.status) == RESERVED,
        )
        .order_by(col(ReviewAssignment.reserved_at).desc(), col(ReviewAssignment.id).desc())
        .limit(1)
    ).first()


def keys_with_status(session: Session, *, queue_id: int | None, reviewer: str, status: str) -> list[str]:
    """Item keys of the reviewer's rows in one state (e.g. their skipped items), oldest first."""
    return list(
        session.exec(
            select(ReviewAssignment.item_key)
            .where(
                col(ReviewAssignment.reviewer) == reviewer,
                _queue_is(queue_id),
                col(ReviewAssignment.status) == status,
            )
            .order_by(col(ReviewAssignment.id))
        ).all()
    )


def live_holders(
    session: Session, *, queue_id: int | None, item_key: str, now: datetime
) -> list[ReviewAssignment]:
    """Who holds an item on a live lease right now."""
    return list(
        session.exec(
            select(ReviewAssignment).where(
                _queue_is(queue_id),
                col(ReviewAssignment.item_key) == item_key,
                col(ReviewAssignment.status) == RESERVED,
                col(ReviewAssignment.expires_at) > now,
            )
        ).all()
    )


def reserved_by_others(session: Session, *, queue_id: int | None, reviewer: str, now: datetime) -> set[str]:
    """Item keys other reviewers hold on a live lease (few: about one per reviewer at work)."""
    return set(
        session.exec(
            select(ReviewAssignment.item_key).where(
                col(ReviewAssignment.status) == RESERVED,
                _queue_is(queue_id),
                col(ReviewAssignment.expires_at) > now,
                col(ReviewAssignment.reviewer) != reviewer,
            )
        ).all()
    )


def expire_lapsed(
    session: Session, *, queue_id: int | None, item_key: str, reviewer: str, now: datetime
) -> int:
    """Take back other reviewers' run-out leases on an item; returns how many (each exactly once)."""
    result = session.execute(
        update(ReviewAssignment)
        .where(
            _queue_is(queue_id),
            col(ReviewAssignment.item_key) == item_key,
            col(ReviewAssignment.status) == RESERVED,
            col(ReviewAssignment.expires_at) <= now,
            col(ReviewAssignment.reviewer) != reviewer,
        )
        .values(status=EXPIRED)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def reserve(
    session: Session,
    *,
    queue_id: int | None,
    item_key: str,
    reviewer: str,
    now: datetime,
    item_id: int | None = None,
    row: ReviewAssignment | None = None,
    found: bool = False,
) -> ReviewAssignment:
    """Give the reviewer a fresh lease on the item (their earlier row, with its draft, is reused).

    The caller has checked that the item may go to them. In the default queue a second live
    reservation of the same item is refused by a unique index (IntegrityError on PostgreSQL, when
    two reviewers race for it): the caller retries with another item. `found`: the caller has
    looked their row up already (`find`, in this transaction): it is `row`, or there is none.
    """
    if not found:
        row = find(session, queue_id=queue_id, item_key=item_key, reviewer=reviewer)
    if row is None:
        row = ReviewAssignment(queue_id=queue_id, item_id=item_id, item_key=item_key, reviewer=reviewer)
    row.status, row.reserved_at, row.expires_at, row.finished_at = RESERVED, now, now + lease(), None
    session.add(row)
    session.flush()
    return row


def renew(row: ReviewAssignment, now: datetime) -> ReviewAssignment:
    """Extend a held lease from now (the reviewer is still at work on it)."""
    row.expires_at = now + lease()
    return row


def _close(row: ReviewAssignment, status: str, now: datetime) -> ReviewAssignment:
    """End a hold: the time it lasted (up to when its lease ran out) counts as time at work."""
    if row.status == RESERVED:
        until = min(now, row.expires_at)
        row.active_seconds += max(0.0, (until - row.reserved_at).total_seconds())
    row.status, row.finished_at = status, now
    return row


def finish(row: ReviewAssignment, now: datetime) -> ReviewAssignment:
    """The reviewer labelled or reviewed everything of the item."""
    return _close(row, DONE, now)


def release(row: ReviewAssignment, now: datetime, *, status: str = RELEASED) -> ReviewAssignment:
    """The reviewer lets the item go (moved on, or skipped it with `status=SKIPPED`)."""
    return _close(row, status, now)


def bring_back_skipped(session: Session, *, queue_id: int | None, reviewer: str) -> int:
    """Turn the reviewer's skipped items back into ones the queue may hand them; returns how many."""
    result = session.execute(
        update(ReviewAssignment)
        .where(
            and_(
                col(ReviewAssignment.reviewer) == reviewer,
                _queue_is(queue_id),
                col(ReviewAssignment.status) == SKIPPED,
            )
        )
        .values(status=RELEASED)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def check_draft(draft: Mapping[str, Any]) -> dict[str, Any]:
    """A draft as stored: a JSON object of modest size (it is the reviewer's unsent typing)."""
    import json

    if not isinstance(draft, Mapping):
        raise ValueError("a draft is a JSON object")
    text = json.dumps(dict(draft), ensure_ascii=False, default=str)
    if len(text) > MAX_DRAFT_CHARS:
        raise ValueError(f"the draft is over {MAX_DRAFT_CHARS:,} characters")
    return json.loads(text)


def save_draft(
    session: Session,
    *,
    queue_id: int | None,
    item_key: str,
    reviewer: str,
    draft: Mapping[str, Any],
    now: datetime | None = None,
) -> ReviewAssignment | None:
    """Keep the reviewer's unsent input for an item they have a row for; None when they have none.
    Typing is work on the item: a held lease is renewed."""
    row = find(session, queue_id=queue_id, item_key=item_key, reviewer=reviewer)
    if row is None:
        return None
    row.draft = check_draft(draft)
    if row.status == RESERVED:
        renew(row, utc(now))
    session.add(row)
    session.flush()
    return row


def utc(now: datetime | None) -> datetime:
    """`now`, or the current time: every function here takes the clock as an argument."""
    return now if now is not None else utcnow()
