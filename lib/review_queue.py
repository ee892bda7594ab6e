"""The review queue: which unreviewed judgments a reviewer sees next, one evaluation at a time.

An item is an evaluation (all its still-unreviewed judgments, in the rubric's metric order) or, for
judgments that belong to no evaluation (an imported seed-004 cache), a single judgment. Items come
oldest first or largest-gap first; judgments of archived evaluations never appear, nor judgments a
team review queue holds (lib.queues: they wait for that queue's reviewers). Every query is
filtered and limited in SQL, so the queue stays fast however many judgments wait.

This is the default queue: one reviewer per item, open mode. `reserve_next` hands each reviewer
an item nobody else holds (lib.reservations), remembers their skips and drafts in the database,
and gives them back the item they held after a reload.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from lib import counters, reservations
from lib.corrections import (
    DecisionScale,
    decision_scale,
    distinct_metrics,
    distinct_products,
    format_score,
    parse_score,
    sort_by_rubric,
)
from lib.evidence import EvidenceItem
from lib.highlight import Span
from lib.inspector import build_cards, highlight_spans, judged_under_rubric
from lib.metrics import metrics_for_product
from lib.models import EvaluationSnapshot, Judgment, ReviewAssignment, ReviewQueueJudgment

ORDERS: dict[str, str] = {"oldest": "Oldest first", "largest_gap": "Largest gap first"}
_SNAPSHOT_PREFIX = "snapshot:"
_JUDGMENT_PREFIX = "judgment:"


@dataclass(frozen=True)
class QueueFilter:
    """What the reviewer wants to work on; None means "any"."""

    product: str | None = None
    metric: str | None = None
    language: str | None = None
    order: str = "oldest"


@dataclass
class QueueItem:
    """One unit of review: an evaluation with its open judgments, or one stand-alone judgment."""

    key: str
    judgments: list[Judgment]
    snapshot: EvaluationSnapshot | None = None

    @property
    def title(self) -> str:
        if self.snapshot is not None:
            return f"Evaluation {self.snapshot.id}"
        return f"Judgment {self.judgments[0].change_id}"


@dataclass(frozen=True)
class QueueProgress:
    """How much of the filtered queue is done."""

    reviewed: int
    total: int

    @property
    def fraction(self) -> float:
        return self.reviewed / self.total if self.total else 1.0

    @property
    def label(self) -> str:
        """ "12 of 240 reviewed"."""
        return f"{self.reviewed:,} of {self.total:,} reviewed"


def item_key(judgment: Judgment) -> str:
    """The queue key of the item a judgment belongs to."""
    if judgment.snapshot_id is not None:
        return _SNAPSHOT_PREFIX + judgment.snapshot_id
    return f"{_JUDGMENT_PREFIX}{judgment.id}"


def _split_keys(keys: Collection[str]) -> tuple[list[str], list[int]]:
    snapshots = [k[len(_SNAPSHOT_PREFIX) :] for k in keys if k.startswith(_SNAPSHOT_PREFIX)]
    judgments = [int(k[len(_JUDGMENT_PREFIX) :]) for k in keys if k.startswith(_JUDGMENT_PREFIX)]
    return snapshots, judgments


def _unreviewed() -> Any:
    # The one definition (lib.counters), as the Overview, Corrections and Evaluations pages use;
    # and not held by a team queue, whose own reviewers decide it (lib.queues).
    return and_(~counters.reviewed_judgment(), ~held_by_team_queue())


def held_by_team_queue() -> Any:
    """A judgment a team review queue holds (one probe of its partial unique index per row)."""
    return exists().where(
        col(ReviewQueueJudgment.judgment_id) == col(Judgment.id), col(ReviewQueueJudgment.held)
    )


def _live(stmt: Any) -> Any:
    """Join evaluations (left: stand-alone judgments stay) and drop archived ones."""
    return stmt.outerjoin(EvaluationSnapshot, col(Judgment.snapshot_id) == col(EvaluationSnapshot.id)).where(
        or_(col(Judgment.snapshot_id).is_(None), col(EvaluationSnapshot.deleted_at).is_(None))
    )


def _filtered(stmt: Any, filters: QueueFilter, *, product: str | None) -> Any:
    if product is not None:
        stmt = stmt.where(col(Judgment.product) == product)
    if filters.metric is not None:
        stmt = stmt.where(col(Judgment.metric) == filters.metric)
    if filters.language is not None:
        stmt = stmt.where(col(EvaluationSnapshot.language) == filters.language)
    return stmt


def _not_skipped(stmt: Any, skipped: Collection[str]) -> Any:
    skipped_snapshots, skipped_judgments = _split_keys(skipped)
    if skipped_snapshots:
        stmt = stmt.where(
            or_(col(Judgment.snapshot_id).is_(None), col(Judgment.snapshot_id).not_in(skipped_snapshots))
        )
    if skipped_judgments:
        stmt = stmt.where(
            or_(col(Judgment.snapshot_id).is_not(None), col(Judgment.id).not_in(skipped_judgments))
        )
    return stmt


def _open_judgments(session: Session, filters: QueueFilter, key: str) -> QueueItem | None:
    """The item `key` with its judgments still open under `filters`, or None when nothing is left."""
    stmt = _filtered(_live(select(Judgment)), filters, product=filters.product).where(_unreviewed())
    snapshot: EvaluationSnapshot | None = None
    if key.startswith(_SNAPSHOT_PREFIX):
        snapshot_id = key[len(_SNAPSHOT_PREFIX) :]
        stmt = stmt.where(col(Judgment.snapshot_id) == snapshot_id)
        snapshot = session.get(EvaluationSnapshot, snapshot_id)
    elif key.startswith(_JUDGMENT_PREFIX):
        stmt = stmt.where(col(Judgment.id) == int(key[len(_JUDGMENT_PREFIX) :]))
    else:
        raise ValueError(f"not a queue key: {key!r}")
    judgments = list(session.exec(stmt.order_by(col(Judgment.id))).all())
    if not judgments:
        return None
    if snapshot is not None:
        sort_by_rubric(session=session, judgments=judgments)
    return QueueItem(key=key, judgments=judgments, snapshot=snapshot)


def load_item(*, session: Session, key: str, filters: QueueFilter) -> QueueItem | None:
    """The reviewer's current item again, while it still has open judgments under the filters."""
    return _open_judgments(session, filters, key)


def _oldest_open(
    session: Session, filters: QueueFilter, skipped: Collection[str], *, without_gap: bool = False
) -> Judgment | None:
    """The oldest open judgment (ties: lowest id): one seek per product on `ix_judgment_open`.

    That index holds open judgments only, as (product, timestamp, id): `_unreviewed()` selects it
    and the ORDER BY is its own order, so SQLite and PostgreSQL read its first entry per product
    (then probe the evaluation by primary key) instead of sorting every open judgment.
    """
    products = [filters.product] if filters.product is not None else distinct_products(session=session)
    best: Judgment | None = None
    for product in products:
        stmt = _not_skipped(_filtered(_live(select(Judgment)), filters, product=product), skipped)
        stmt = stmt.where(_unreviewed())
        if without_gap:
            stmt = stmt.where(col(EvaluationSnapshot.max_metric_gap).is_(None))
        first = session.exec(stmt.order_by(col(Judgment.timestamp), col(Judgment.id)).limit(1)).first()
        if first is not None and (
            best is None or (first.timestamp, first.id or 0) < (best.timestamp, best.id or 0)
        ):
            best = first
    return best


def _largest_gap_open(session: Session, filters: QueueFilter, skipped: Collection[str]) -> str | None:
    """The evaluation with the largest gap that still has open judgments: a walk down the gap index."""
    gap = col(EvaluationSnapshot.max_metric_gap)
    open_judgment = select(Judgment.id).where(
        col(Judgment.snapshot_id) == col(EvaluationSnapshot.id), _unreviewed()
    )
    if filters.product is not None:
        open_judgment = open_judgment.where(col(Judgment.product) == filters.product)
    if filters.metric is not None:
        open_judgment = open_judgment.where(col(Judgment.metric) == filters.metric)
    stmt = select(EvaluationSnapshot.id).where(
        col(EvaluationSnapshot.deleted_at).is_(None), gap.is_not(None), open_judgment.exists()
    )
    if filters.language is not None:
        stmt = stmt.where(col(EvaluationSnapshot.language) == filters.language)
    skipped_snapshots, _ = _split_keys(skipped)
    if skipped_snapshots:
        stmt = stmt.where(col(EvaluationSnapshot.id).not_in(skipped_snapshots))
    # Ties newest first: the order of ix_snapshot_live_max_gap read backwards, so no sort at all.
    # `deleted_at` leads it although it is always NULL here: PostgreSQL does not count `IS NULL`
    # as fixing the index's first column, and without it sorted every live evaluation instead.
    stmt = stmt.order_by(
        col(EvaluationSnapshot.deleted_at).desc(),
        gap.desc(),
        col(EvaluationSnapshot.created_at).desc(),
        col(EvaluationSnapshot.id).desc(),
    )
    stmt = stmt.limit(1)
    return session.exec(stmt).first()


def next_item(*, session: Session, filters: QueueFilter, skipped: Collection[str] = ()) -> QueueItem | None:
    """The first open item in the chosen order, leaving out the items the reviewer skipped.

    Largest gap first: evaluations by their largest metric gap; then, oldest first, the ones
    without a gap and stand-alone judgments.
    """
    if filters.order not in ORDERS:
        raise ValueError(f"unknown queue order {filters.order!r}; choose one of {', '.join(ORDERS)}")
    if filters.order == "largest_gap":
        snapshot_id = _largest_gap_open(session, filters, skipped)
        if snapshot_id is not None:
            return _open_judgments(session, filters, _SNAPSHOT_PREFIX + snapshot_id)
        first = _oldest_open(session, filters, skipped, without_gap=True)
    else:
        first = _oldest_open(session, filters, skipped)
    return None if first is None else _open_judgments(session, filters, item_key(first))


# Items tried per call when other reviewers claim the same ones at the same moment (PostgreSQL).
MAX_CLAIM_ATTEMPTS = 20


def _claim(session: Session, key: str, reviewer: str, now: datetime) -> bool:
    """Reserve a default-queue item for the reviewer unless someone else got it first.

    A run-out lease on it is taken back first; a live one of another reviewer, or a claim that
    committed meanwhile (the unique index on live reservations), leaves the item to them.
    """
    try:
        with session.begin_nested():
            reservations.expire_lapsed(session, queue_id=None, item_key=key, reviewer=reviewer, now=now)
            reservations.reserve(session, queue_id=None, item_key=key, reviewer=reviewer, now=now)
        return True
    except IntegrityError:
        return False


def _settle_held(
    session: Session, row: ReviewAssignment, filters: QueueFilter, now: datetime
) -> QueueItem | None:
    """The reviewer's held item when it still has open judgments under the filters (lease renewed);
    else it is let go: forgotten when nothing of it is open any more, released when the filters
    left it out (its draft stays for when they come back to it)."""
    item = _open_judgments(session, filters, row.item_key)
    if item is not None:
        reservations.renew(row, now)
        session.add(row)
        return item
    if _open_judgments(session, QueueFilter(), row.item_key) is None:
        session.delete(row)  # reviewed: its audit events are the record, the row has done its work
    else:
        reservations.release(row, now)
        session.add(row)
    session.flush()
    return None


def reserve_next(
    *, session: Session, reviewer: str, filters: QueueFilter, now: datetime | None = None
) -> QueueItem | None:
    """The reviewer's item in the default queue, reserved for them (lease renewed on every call).

    The item they hold comes back while it has open judgments under the filters (a reload, a new
    tab or another device continues there); otherwise the first item in the chosen order that no
    one else holds on a live lease and that they did not skip. Two reviewers are never handed the
    same item: SQLite serialises the claims, PostgreSQL's unique index on live reservations
    refuses the second and it moves on to the next item.
    """
    now = reservations.utc(now)
    mine = reservations.held(session, queue_id=None, reviewer=reviewer)
    if mine is not None:
        item = _settle_held(session, mine, filters, now)
        if item is not None:
            return item
    exclude = set(reservations.keys_with_status(session, queue_id=None, reviewer=reviewer, status="skipped"))
    exclude |= reservations.reserved_by_others(session, queue_id=None, reviewer=reviewer, now=now)
    for _ in range(MAX_CLAIM_ATTEMPTS):
        item = next_item(session=session, filters=filters, skipped=exclude)
        if item is None:
            return None
        if _claim(session, item.key, reviewer, now):
            return item
        exclude.add(item.key)
    return None


def reserve_item(
    *,
    session: Session,
    reviewer: str,
    key: str,
    filters: QueueFilter | None = None,
    now: datetime | None = None,
) -> QueueItem | None:
    """Open one item of the default queue by its key (a link to it): reserved for the reviewer, who
    lets go of the one they held. None when nothing of it is open (any more) under the filters;
    `reservations.ItemTaken` when another reviewer holds it on a live lease."""
    now = reservations.utc(now)
    item = _open_judgments(session, filters or QueueFilter(), key)
    if item is None:
        return None
    mine = reservations.held(session, queue_id=None, reviewer=reviewer)
    if mine is not None and mine.item_key == key:
        reservations.renew(mine, now)
        session.add(mine)
        return item
    others = [r for r in reservations.live_holders(session, queue_id=None, item_key=key, now=now)
              if r.reviewer != reviewer]  # fmt: skip
    if others:
        raise reservations.ItemTaken(
            f"{others[0].reviewer} is reviewing this item (reserved until {others[0].expires_at:%H:%M} UTC)",
            holders=(others[0].reviewer,),
            until=others[0].expires_at,
        )
    if mine is not None:
        reservations.release(mine, now)
        session.add(mine)
    if not _claim(session, key, reviewer, now):
        raise reservations.ItemTaken("another reviewer took this item a moment ago")
    return item


def current_item(
    *,
    session: Session,
    reviewer: str | None,
    filters: QueueFilter,
    current: str | None = None,
    skipped: Collection[str] = (),
    now: datetime | None = None,
) -> tuple[QueueItem | None, str | None]:
    """The item the review page shows, and a note when the one asked for went to someone else.

    A reviewer gets a reserved item: `current` (the page's item, e.g. reopened by an undo) when no
    one else holds it, else the one they hold or the next (`reserve_next`). Without a reviewer (no
    name yet, or a role that may only read) nothing is reserved: the next item past `skipped`.
    """
    if not reviewer:
        item = load_item(session=session, key=current, filters=filters) if current else None
        return item or next_item(session=session, filters=filters, skipped=skipped), None
    notice = None
    if current:
        try:
            item = reserve_item(session=session, reviewer=reviewer, key=current, filters=filters, now=now)
            if item is not None:
                return item, None
        except reservations.ItemTaken as exc:
            notice = f"{exc}; here is the next item."
    return reserve_next(session=session, reviewer=reviewer, filters=filters, now=now), notice


def skip_item(*, session: Session, reviewer: str, key: str, now: datetime | None = None) -> None:
    """The reviewer passes over an item of the default queue: it goes to others, not back to them
    until they bring their skipped items back (kept in the database, so a reload remembers)."""
    now = reservations.utc(now)
    row = reservations.find(session, queue_id=None, item_key=key, reviewer=reviewer)
    if row is None:
        row = ReviewAssignment(
            queue_id=None, item_key=key, reviewer=reviewer, reserved_at=now, expires_at=now
        )
        row.status = "released"
    reservations.release(row, now, status="skipped")
    session.add(row)
    session.flush()


def save_draft(*, session: Session, reviewer: str, key: str, draft: dict[str, Any]) -> bool:
    """Keep the reviewer's unsent input for the default-queue item they hold (e.g. a typed reason),
    so a reload, a new tab or another device shows it again; False when they do not hold it."""
    return (
        reservations.save_draft(session, queue_id=None, item_key=key, reviewer=reviewer, draft=draft)
        is not None
    )


def draft_of(*, session: Session, reviewer: str, key: str) -> dict[str, Any]:
    """The reviewer's saved draft for a default-queue item ({} when none)."""
    row = reservations.find(session, queue_id=None, item_key=key, reviewer=reviewer)
    return dict(row.draft or {}) if row is not None else {}


def skipped_items(*, session: Session, reviewer: str) -> list[str]:
    """The keys of the items the reviewer skipped in the default queue, in the order skipped."""
    return reservations.keys_with_status(session, queue_id=None, reviewer=reviewer, status="skipped")


def bring_back_skipped(*, session: Session, reviewer: str) -> int:
    """The reviewer's skipped default-queue items come back into their queue; returns how many."""
    return reservations.bring_back_skipped(session, queue_id=None, reviewer=reviewer)


def queue_progress(*, session: Session, filters: QueueFilter) -> QueueProgress:
    """Reviewed vs all judgments under the filters (archived evaluations left out).

    Read from lib.counters (per product × metric × language), so it costs the same after every
    review at a thousand or a million judgments.
    """
    totals = counters.judgment_totals(
        session=session, product=filters.product, metric=filters.metric, language=filters.language
    )
    return QueueProgress(reviewed=totals.reviewed, total=totals.judgments)


def queue_options(*, session: Session) -> dict[str, list[str]]:
    """Products, metrics and languages that have judgments, for the queue filters."""
    products = distinct_products(session=session)
    return {
        "products": products,
        "metrics": distinct_metrics(session=session, products=products),
        # From lib.counters like the others: a DISTINCT over every evaluation grew with the data.
        "languages": counters.judged_languages(session=session),
    }


# ---------------------------------------------------------------------------------------------
# The workspace: one item as the queue page lays it out (answer with highlights, compact rows)

# Score keys: at most this many evenly spaced points of a scale that has no small whole-number range.
_SCALE_POINTS = 5


def score_keys(scale: DecisionScale) -> dict[str, str]:
    """The keys ("1", "2", ...) a reviewer presses to give a decision, and the decision each gives.

    A whole-number scale inside 0–9 uses its own numbers (1–5 → keys 1–5); a label set numbers its
    labels from 1; any other bounded scale offers five evenly spaced points (0–1 → 0, 0.25, … 1);
    an unbounded scale has no keys (the reviewer types the score).
    """
    if not scale.is_score:
        return {str(i): label for i, label in enumerate(scale.labels[:9], start=1)}
    spec = scale.spec
    assert spec is not None
    lo, hi = spec.min_value, spec.max_value
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return {}
    if spec.integer_scale and float(lo).is_integer() and float(hi).is_integer() and lo >= 0 and hi <= 9:
        return {str(v): str(v) for v in range(int(lo), int(hi) + 1)}
    points = [lo + (hi - lo) * i / (_SCALE_POINTS - 1) for i in range(_SCALE_POINTS)]
    if spec.integer_scale:
        points = [float(round(p)) for p in points]
    return {str(i): format_score(p) for i, p in enumerate(dict.fromkeys(points), start=1)}


@dataclass(frozen=True)
class MetricRow:
    """One compact row: an open judgment with the judge's and the user's score, the gap, and why."""

    judgment: Judgment
    title: str
    scale: DecisionScale
    user_score: float | None
    gap: float | None  # |user − judge| on the metric's own scale
    judge_reason: str
    evidence: tuple[EvidenceItem, ...]
    keys: dict[str, str]
    user_reason: str = ""  # the evaluated user's reason for their score, when they gave one


@dataclass(frozen=True)
class Workspace:
    """What the queue shows for one item: the highlighted answer's spans and the open metric rows."""

    item: QueueItem
    rows: list[MetricRow]
    spans: list[Span]
    labels: dict[str, str]  # metric slug -> display name, for the highlight titles and legend
    metrics: list[str]  # every metric of the evaluation, in card order: the palette's input

    @property
    def highlighted_metrics(self) -> list[str]:
        """Metrics with at least one highlight, in card order (for the legend)."""
        used = {span.metric for span in self.spans}
        return [slug for slug in self.metrics if slug in used]


def load_workspace(*, session: Session, item: QueueItem) -> Workspace:
    """The item's open judgments as rows, largest gap first, with the evaluation's verified highlights.

    The rows and highlights come from `lib.inspector`'s cards, the same ones the evaluation detail
    view draws, so the queue and the detail never disagree on a score, a gap or a highlight.
    """
    snapshot = item.snapshot
    if snapshot is None:
        rows = [_bare_row(session, j) for j in item.judgments]
        return Workspace(item=item, rows=rows, spans=[], labels={}, metrics=[])
    specs = metrics_for_product(session=session, product=snapshot.product)
    cards = build_cards(snapshot, specs, item.judgments, judged_under_rubric(session, snapshot, specs))
    ranked: list[tuple[tuple[int, float, int], MetricRow]] = []
    for position, card in enumerate(cards):
        judgment = card.judgment
        if judgment is None:
            continue
        scale = (
            DecisionScale(spec=card.spec)
            if card.in_rubric
            else decision_scale(session=session, judgment=judgment)
        )
        # The judge's score is the judgment's decision: the value a confirmation stores.
        judge, user = parse_score(judgment.decision), card.user_score
        gap: float | None = None
        rescaled: float | None = None
        if judge is not None and user is not None:
            gap, rescaled = abs(user - judge), card.spec.rescaled_gap(user, judge)
        row = MetricRow(
            judgment=judgment,
            title=card.spec.display_name,
            scale=scale,
            user_score=user,
            gap=gap,
            judge_reason=card.judge_reason or judgment.reasoning or "",
            evidence=card.evidence,
            keys=score_keys(scale),
            user_reason=card.user_reason,
        )
        # Largest gap first, rescaled so scales compare; rows without a gap last, in rubric order.
        ranked.append(((1, 0.0, position) if rescaled is None else (0, -rescaled, position), row))
    rows = [row for _, row in sorted(ranked, key=lambda pair: pair[0])]
    shown = {row.judgment.id for row in rows}
    rows += [_bare_row(session, j) for j in item.judgments if j.id not in shown]  # metric without a card
    return Workspace(
        item=item,
        rows=rows,
        spans=highlight_spans(cards),
        labels={card.spec.slug: card.spec.display_name for card in cards},
        metrics=[card.spec.slug for card in cards],
    )


def _bare_row(session: Session, judgment: Judgment) -> MetricRow:
    """A row for a judgment outside any evaluation's cards (a seed-004 cache entry)."""
    scale = decision_scale(session=session, judgment=judgment)
    return MetricRow(
        judgment=judgment,
        # A stand-alone judgment's subject (its change id) heads the item already: the row is its decision.
        title=judgment.metric or "Decision",
        scale=scale,
        user_score=None,
        gap=None,
        judge_reason=judgment.reasoning or "",
        evidence=(),
        keys=score_keys(scale),
    )
