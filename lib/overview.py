"""Overview figures, each computed by one SQL aggregation (never by loading tables)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
from sqlalchemy import case, func
from sqlmodel import Session, col, select

from lib.corrections import live_judgment
from lib.evidence import HIGHLIGHT_STAGES, STAGES
from lib.metrics import DEFAULT_METRICS, metrics_for_product, products_with_rubrics
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, SessionNote


@dataclass(frozen=True)
class OverviewStats:
    """The headline numbers of the overview page."""

    evaluations: int = 0
    archived: int = 0
    products: int = 0
    judgments: int = 0
    pending_reviews: int = 0
    reviewed: int = 0
    corrected: int = 0
    evidence_total: int = 0
    evidence_by_state: dict[str, int] = field(default_factory=dict)
    notes: int = 0
    note_sessions: int = 0
    latest_note: datetime | None = None
    second_opinions: int = 0
    second_opinion_validated: int = 0
    second_opinion_improved: int = 0
    second_opinion_questioned: int = 0

    @property
    def correction_rate(self) -> float | None:
        return self.corrected / self.reviewed if self.reviewed else None

    @property
    def agreement_rate(self) -> float | None:
        return (self.reviewed - self.corrected) / self.reviewed if self.reviewed else None

    @property
    def second_opinion_agreement(self) -> float | None:
        """Share of second opinions that validated the judge (seed 000 VALID: YES without a better answer)."""
        return self.second_opinion_validated / self.second_opinions if self.second_opinions else None

    @property
    def verification_rate(self) -> float | None:
        if not self.evidence_total:
            return None
        return (self.evidence_total - self.evidence_by_state.get("unverified", 0)) / self.evidence_total


def overview_stats(*, session: Session) -> OverviewStats:
    """Counts for the overview page: three aggregate queries, whatever the table sizes."""
    live = col(EvaluationSnapshot.deleted_at).is_(None)
    snap = session.exec(
        select(
            func.count().filter(live),
            func.count().filter(~live),
            func.count(func.distinct(case((live, EvaluationSnapshot.product)))),
            func.coalesce(func.sum(case((live, EvaluationSnapshot.evidence_count), else_=0)), 0),
            func.coalesce(func.sum(case((live, EvaluationSnapshot.evidence_highlighted), else_=0)), 0),
            func.coalesce(func.sum(case((live, EvaluationSnapshot.evidence_unlocated), else_=0)), 0),
            func.coalesce(func.sum(case((live, EvaluationSnapshot.evidence_unverified), else_=0)), 0),
        )
    ).one()
    reviewed = col(Judgment.reviewed_at).is_not(None)
    action = col(Judgment.second_opinion_action)
    jud = session.exec(
        select(
            func.count(),
            func.count().filter(~reviewed),
            func.count().filter(reviewed),
            func.count().filter(reviewed & col(Judgment.was_corrected)),
            func.count().filter(action.in_(("validated", "improved", "questioned"))),
            func.count().filter(action == "validated"),
            func.count().filter(action == "improved"),
            func.count().filter(action == "questioned"),
        ).where(live_judgment())
    ).one()
    notes = session.exec(
        select(
            func.count(), func.count(func.distinct(SessionNote.session_id)), func.max(SessionNote.timestamp)
        )
    ).one()
    return OverviewStats(
        evaluations=snap[0],
        archived=snap[1],
        products=snap[2],
        evidence_total=int(snap[3]),
        evidence_by_state={
            "highlighted": int(snap[4]),
            "unlocated": int(snap[5]),
            "unverified": int(snap[6]),
        },
        judgments=jud[0],
        pending_reviews=jud[1],
        reviewed=jud[2],
        corrected=jud[3],
        second_opinions=jud[4],
        second_opinion_validated=jud[5],
        second_opinion_improved=jud[6],
        second_opinion_questioned=jud[7],
        notes=notes[0],
        note_sessions=notes[1],
        latest_note=notes[2],
    )


def evidence_state_frame(stats: OverviewStats) -> pd.DataFrame:
    """Evidence items by verification outcome, for a small bar chart."""
    labels = {
        "highlighted": f"Verified, highlighted ({', '.join(s for s in STAGES if s in HIGHLIGHT_STAGES)})",
        "unlocated": "Verified, position not located (whitespace)",
        "unverified": "Could not be verified",
    }
    return pd.DataFrame(
        [{"state": labels[k], "items": v} for k, v in stats.evidence_by_state.items()],
        columns=["state", "items"],
    )


def recent_activity(*, session: Session, limit: int = 10) -> pd.DataFrame:
    """The latest review events and evaluations, newest first."""
    events = session.exec(
        select(
            JudgmentEvent.at,
            JudgmentEvent.reviewer,
            JudgmentEvent.action,
            JudgmentEvent.change_id,
            JudgmentEvent.from_decision,
            JudgmentEvent.to_decision,
        )
        .order_by(col(JudgmentEvent.at).desc())
        .limit(limit)
    ).all()
    snaps = session.exec(
        select(
            EvaluationSnapshot.created_at,
            EvaluationSnapshot.created_by,
            EvaluationSnapshot.id,
            EvaluationSnapshot.product,
        )
        .where(col(EvaluationSnapshot.deleted_at).is_(None))
        .order_by(col(EvaluationSnapshot.created_at).desc())
        .limit(limit)
    ).all()
    rows: list[dict[str, Any]] = [
        {
            "when": e.at,
            "who": e.reviewer,
            "what": f"{e.action} {e.change_id}: {e.from_decision} → {e.to_decision}",
        }
        for e in events
    ]
    rows += [
        {"when": s.created_at, "who": s.created_by, "what": f"evaluation {s.id} ({s.product})"} for s in snaps
    ]
    frame = pd.DataFrame(rows, columns=["when", "who", "what"])
    return frame.sort_values("when", ascending=False).head(limit).reset_index(drop=True)


def metric_sets_frame(*, session: Session) -> pd.DataFrame:
    """Every product's metric set with scales; products without one use the default set."""
    rows = []
    for product in products_with_rubrics(session=session):
        for spec in metrics_for_product(session=session, product=product):
            rows.append(
                {
                    "product": product,
                    "metric": spec.display_name,
                    "slug": spec.slug,
                    "scale": spec.scale_label(),
                    "rubric": spec.description,
                }
            )
    for spec in DEFAULT_METRICS:
        rows.append(
            {
                "product": "(default set)",
                "metric": spec.display_name,
                "slug": spec.slug,
                "scale": spec.scale_label(),
                "rubric": spec.description,
            }
        )
    return pd.DataFrame(rows, columns=["product", "metric", "slug", "scale", "rubric"])


def per_product_frame(*, session: Session) -> pd.DataFrame:
    """Evaluations and review progress per product (live evaluations only)."""
    snaps = session.exec(
        select(EvaluationSnapshot.product, func.count())
        .where(col(EvaluationSnapshot.deleted_at).is_(None))
        .group_by(EvaluationSnapshot.product)
    ).all()
    reviewed = col(Judgment.reviewed_at).is_not(None)
    jud = session.exec(
        select(
            Judgment.product,
            func.count(),
            func.count().filter(~reviewed),
            func.count().filter(reviewed & col(Judgment.was_corrected)),
            func.count().filter(reviewed),
        )
        .where(live_judgment())
        .group_by(Judgment.product)
    ).all()
    by_product: dict[str, dict[str, Any]] = {}
    for product, n in snaps:
        by_product.setdefault(product, {})["evaluations"] = n
    for product, total, pending, corrected, done in jud:
        by_product.setdefault(product, {}).update(
            judgments=total, pending=pending, correction_rate=(corrected / done) if done else None
        )
    frame = pd.DataFrame(
        [{"product": p, **v} for p, v in sorted(by_product.items())],
        columns=["product", "evaluations", "judgments", "pending", "correction_rate"],
    )
    return frame.fillna({"evaluations": 0, "judgments": 0, "pending": 0})
