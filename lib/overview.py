"""Overview figures, each computed by one SQL aggregation (never by loading tables)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
from sqlalchemy import case, func
from sqlmodel import Session, col, select

from lib.corrections import live_judgment
from lib.display import (
    CORRECTIONS_PATH,
    EVALUATIONS_PATH,
    NOTES_PATH,
    TITLE_CHARS,
    evaluation_title,
    evaluation_url,
    evaluations_list_url,
    judgment_url,
)
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


@dataclass(frozen=True)
class FigureLink:
    """Where an Overview figure's rows are listed: the page and the filter that selects exactly them."""

    page: str  # the page file, for st.page_link
    path: str  # its URL path (lib.display), for a plain link
    params: dict[str, str]
    label: str


# Each figure links to the list it counts, filtered by the query parameters the target page reads
# (Evaluations: lib.inspector.filters_from_params; Corrections: lib.corrections.filter_params).
FIGURE_LINKS: dict[str, FigureLink] = {
    "evaluations": FigureLink("pages/evaluations.py", EVALUATIONS_PATH, {}, "All evaluations"),
    "archived": FigureLink("pages/evaluations.py", EVALUATIONS_PATH, {"archived": "1"}, "Archived"),
    "pending": FigureLink("pages/corrections.py", CORRECTIONS_PATH, {"state": "unreviewed"}, "Unreviewed"),
    "agreement": FigureLink("pages/corrections.py", CORRECTIONS_PATH, {"state": "confirmed"}, "Confirmed"),
    "correction": FigureLink("pages/corrections.py", CORRECTIONS_PATH, {"state": "corrected"}, "Corrected"),
    "evidence": FigureLink(
        "pages/evaluations.py", EVALUATIONS_PATH, {"evidence": "unverified"}, "With unverified evidence"
    ),
    "notes": FigureLink("pages/notes.py", NOTES_PATH, {}, "Notes"),
}


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


ACTIVITY_COLUMNS = ["when", "who", "what", "link"]


def recent_activity(*, session: Session, limit: int = 10) -> pd.DataFrame:
    """The latest review events and evaluations, newest first, each with a link to what changed.

    A review event links to its evaluation's detail (where the judgment's card and audit trail
    are), or to the judgment on Corrections when it belongs to no evaluation; a new evaluation
    links to its detail and reads as its question's first line, not its id.
    """
    events = session.exec(
        select(
            JudgmentEvent.at,
            JudgmentEvent.reviewer,
            JudgmentEvent.action,
            JudgmentEvent.change_id,
            JudgmentEvent.from_decision,
            JudgmentEvent.to_decision,
            Judgment.snapshot_id,
        )
        .join(Judgment, col(Judgment.id) == col(JudgmentEvent.judgment_id))
        .order_by(col(JudgmentEvent.at).desc())
        .limit(limit)
    ).all()
    snaps = session.exec(
        select(
            EvaluationSnapshot.created_at,
            EvaluationSnapshot.created_by,
            EvaluationSnapshot.id,
            EvaluationSnapshot.product,
            func.substr(EvaluationSnapshot.question, 1, TITLE_CHARS * 3),
        )
        .where(col(EvaluationSnapshot.deleted_at).is_(None))
        .order_by(col(EvaluationSnapshot.created_at).desc())
        .limit(limit)
    ).all()
    rows: list[dict[str, Any]] = [
        {
            "when": e.at,
            "who": e.reviewer,
            "what": f"{e.action} {e.change_id}: {e.from_decision or '—'} → {e.to_decision or '—'}",
            "link": evaluation_url(e.snapshot_id) if e.snapshot_id else judgment_url(e.change_id),
        }
        for e in events
    ]
    rows += [
        {
            "when": created_at,
            "who": created_by,
            "what": f"new evaluation ({product}): {evaluation_title(question)}",
            "link": evaluation_url(snapshot_id),
        }
        for created_at, created_by, snapshot_id, product, question in snaps
    ]
    frame = pd.DataFrame(rows, columns=ACTIVITY_COLUMNS)
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
        [
            {"product": p, **v, "link": evaluations_list_url({"product": p})}
            for p, v in sorted(by_product.items())
        ],
        columns=["product", "evaluations", "judgments", "pending", "correction_rate", "link"],
    )
    return frame.fillna({"evaluations": 0, "judgments": 0, "pending": 0})
