"""The review queue: which unreviewed judgments a reviewer sees next, one evaluation at a time.

An item is an evaluation (all its still-unreviewed judgments, in the rubric's metric order) or, for
judgments that belong to no evaluation (an imported seed-004 cache), a single judgment. Items come
oldest first or largest-gap first; judgments of archived evaluations never appear. Every query is
filtered and limited in SQL, so the queue stays fast however many judgments wait.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, or_
from sqlmodel import Session, col, select

from lib.corrections import sort_by_rubric
from lib.models import EvaluationSnapshot, Judgment

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
    open_items: int = field(default=0)

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
    # Both columns: an imported judgment may carry a decision without a review time.
    return and_(col(Judgment.reviewed_at).is_(None), col(Judgment.user_decision).is_(None))


def _scoped(stmt: Any, filters: QueueFilter) -> Any:
    """Join evaluations (left: stand-alone judgments stay), drop archived ones, apply the filters."""
    stmt = stmt.outerjoin(EvaluationSnapshot, col(Judgment.snapshot_id) == col(EvaluationSnapshot.id)).where(
        or_(col(Judgment.snapshot_id).is_(None), col(EvaluationSnapshot.deleted_at).is_(None))
    )
    if filters.product is not None:
        stmt = stmt.where(col(Judgment.product) == filters.product)
    if filters.metric is not None:
        stmt = stmt.where(col(Judgment.metric) == filters.metric)
    if filters.language is not None:
        stmt = stmt.where(col(EvaluationSnapshot.language) == filters.language)
    return stmt


def _ordered(stmt: Any, order: str) -> Any:
    if order == "oldest":
        return stmt.order_by(col(Judgment.timestamp), col(Judgment.id))
    if order == "largest_gap":
        gap = col(EvaluationSnapshot.max_metric_gap)
        # Portable NULLS LAST: evaluations without a gap (and stand-alone judgments) come after.
        return stmt.order_by(gap.is_(None), gap.desc(), col(Judgment.timestamp), col(Judgment.id))
    raise ValueError(f"unknown queue order {order!r}; choose one of {', '.join(ORDERS)}")


def _open_judgments(session: Session, filters: QueueFilter, key: str) -> QueueItem | None:
    """The item `key` with its judgments still open under `filters`, or None when nothing is left."""
    stmt = _scoped(select(Judgment), filters).where(_unreviewed())
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


def next_item(*, session: Session, filters: QueueFilter, skipped: Collection[str] = ()) -> QueueItem | None:
    """The first open item in the chosen order, leaving out the items the reviewer skipped."""
    stmt = _scoped(select(Judgment), filters).where(_unreviewed())
    skipped_snapshots, skipped_judgments = _split_keys(skipped)
    if skipped_snapshots:
        stmt = stmt.where(
            or_(col(Judgment.snapshot_id).is_(None), col(Judgment.snapshot_id).not_in(skipped_snapshots))
        )
    if skipped_judgments:
        stmt = stmt.where(
            or_(col(Judgment.snapshot_id).is_not(None), col(Judgment.id).not_in(skipped_judgments))
        )
    first = session.exec(_ordered(stmt, filters.order).limit(1)).first()
    if first is None:
        return None
    return _open_judgments(session, filters, item_key(first))


def queue_progress(*, session: Session, filters: QueueFilter) -> QueueProgress:
    """Reviewed vs all judgments under the filters, and how many items are still open."""
    reviewed = func.coalesce(func.sum(case((_unreviewed(), 0), else_=1)), 0)
    total_stmt = _scoped(select(func.count(col(Judgment.id)), reviewed).select_from(Judgment), filters)
    total, done = session.exec(total_stmt).one()
    standalone = func.coalesce(func.sum(case((col(Judgment.snapshot_id).is_(None), 1), else_=0)), 0)
    open_stmt = _scoped(
        select(func.count(func.distinct(col(Judgment.snapshot_id))), standalone).select_from(Judgment),
        filters,
    ).where(_unreviewed())
    evaluations, singles = session.exec(open_stmt).one()
    open_items = int(evaluations or 0) + int(singles or 0)
    return QueueProgress(reviewed=int(done or 0), total=int(total or 0), open_items=open_items)


def queue_options(*, session: Session) -> dict[str, list[str]]:
    """Products, metrics and languages that have judgments, for the queue filters."""
    products = session.exec(select(Judgment.product).distinct().order_by(Judgment.product)).all()
    metrics = session.exec(
        select(Judgment.metric).distinct().where(col(Judgment.metric).is_not(None)).order_by(Judgment.metric)
    ).all()
    languages = session.exec(
        select(EvaluationSnapshot.language).distinct().order_by(EvaluationSnapshot.language)
    ).all()
    return {"products": list(products), "metrics": [m for m in metrics if m], "languages": list(languages)}


def evidence_for(snapshot: EvaluationSnapshot | None, metric: str | None) -> list[dict[str, Any]]:
    """The judge's evidence items for one metric of an evaluation (either stored shape)."""
    if snapshot is None or not metric or not isinstance(snapshot.evidence_json, dict):
        return []
    items = snapshot.evidence_json.get(metric) or []
    if isinstance(items, dict):  # the seed shape {"evidence": [...]}
        items = items.get("evidence") or []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
