"""Overview figures, read from the counters lib.counters keeps on write (never by counting rows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
from sqlalchemy import func
from sqlmodel import Session, col, select

from lib import counters
from lib.display import (
    CORRECTIONS_PATH,
    EVALUATIONS_PATH,
    NOTES_PATH,
    TITLE_CHARS,
    evaluation_title,
    evaluation_url,
    evaluations_list_url,
    judgment_url,
    page_url,
)
from lib.evidence import HIGHLIGHT_STAGES, STAGES
from lib.metrics import DEFAULT_METRICS, metrics_for_product, products_with_rubrics
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent
from lib.notes import notes_health


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
    def corrected_of_reviewed(self) -> float | None:
        """lib.counters.corrected_of_reviewed: corrected ÷ reviewed (issue 15; labelled so, issue 25)."""
        return counters.corrected_of_reviewed(self.corrected, self.reviewed)

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
    "pending": FigureLink("pages/corrections.py", CORRECTIONS_PATH, {"state": "unreviewed"}, "Unreviewed"),
    "agreement": FigureLink("pages/corrections.py", CORRECTIONS_PATH, {"state": "confirmed"}, "Confirmed"),
    "correction": FigureLink("pages/corrections.py", CORRECTIONS_PATH, {"state": "corrected"}, "Corrected"),
    "evidence": FigureLink(
        "pages/evaluations.py", EVALUATIONS_PATH, {"evidence": "unverified"}, "With unverified evidence"
    ),
    "notes": FigureLink("pages/notes.py", NOTES_PATH, {}, "Notes"),
}


PRODUCTS_HELP = "Products with live evaluations or judgments: one row each in the per-product table"


@dataclass(frozen=True)
class ProductTotals:
    """One product's live evaluations and judgments (either may be missing)."""

    product: str
    evaluations: counters.EvaluationTotals | None
    judgments: counters.JudgmentTotals | None


def live_products(*, session: Session) -> list[ProductTotals]:
    """The products the Overview counts and lists, by name: those with live evaluations or live
    judgments. A product of judgments alone (a judgment cache imported without evaluations) counts;
    one whose evaluations are all archived and that has no judgment does not. One rule for the
    "Products" figure and the per-product table, so the two always agree."""
    evaluations = counters.evaluation_totals_by_product(session=session)
    judgments = counters.judgment_totals_by_product(session=session)
    found = []
    for product in sorted(set(evaluations) | set(judgments)):
        ev, jud = evaluations.get(product), judgments.get(product)
        if (ev is not None and ev.evaluations) or jud is not None:
            found.append(ProductTotals(product, ev, jud))
    return found


def overview_stats(*, session: Session) -> OverviewStats:
    """Counts for the overview page, read from lib.counters: rows per product and metric, never per judgment."""
    by_product = counters.evaluation_totals_by_product(session=session)
    jud = counters.judgment_totals(session=session)
    notes = notes_health(session=session)  # the Notes page's figures: sessions capped, index reads only

    def total(name: str) -> int:
        return sum(getattr(t, name) for t in by_product.values())

    return OverviewStats(
        evaluations=total("evaluations"),
        archived=total("archived"),
        products=len(live_products(session=session)),
        evidence_total=total("evidence_total"),
        evidence_by_state={
            "highlighted": total("evidence_highlighted"),
            "unlocated": total("evidence_unlocated"),
            "unverified": total("evidence_unverified"),
        },
        judgments=jud.judgments,
        pending_reviews=jud.pending,
        reviewed=jud.reviewed,
        corrected=jud.corrected,
        second_opinions=jud.second_opinions,
        second_opinion_validated=jud.opinion_validated,
        second_opinion_improved=jud.opinion_improved,
        second_opinion_questioned=jud.opinion_questioned,
        notes=notes["total_notes"],
        note_sessions=notes["sessions"],
        latest_note=notes["latest_note"],
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
    """Evaluations and review progress per product (`live_products`), from lib.counters; each row
    links to where the product's rows are: its evaluations, or its judgments when it has none."""
    rows = []
    for totals in live_products(session=session):
        ev, jud = totals.evaluations, totals.judgments
        evaluations = ev.evaluations if ev else 0
        rows.append(
            {
                "product": totals.product,
                "evaluations": evaluations,
                "judgments": jud.judgments if jud else 0,
                "pending": jud.pending if jud else 0,
                "corrected_of_reviewed": jud.corrected_of_reviewed if jud else None,
                "link": evaluations_list_url({"product": totals.product})
                if evaluations
                else page_url(CORRECTIONS_PATH, {"product": totals.product}),
            }
        )
    return pd.DataFrame(
        rows, columns=["product", "evaluations", "judgments", "pending", "corrected_of_reviewed", "link"]
    )
