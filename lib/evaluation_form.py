"""Helpers of the New evaluation page's form: pickers' choices, score inputs, and the scores they give.

Kept out of `lib.judge` (the pipeline) so the judge holds one job; no streamlit here, the page
reads its widgets and passes the values in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlmodel import Session, select

from lib import counters, inspector
from lib.metrics import MetricSpec
from lib.models import MetricDefinition


def known_products(*, session: Session) -> list[str]:
    """Products that have a rubric or evaluations, for the page's product picker."""
    defined = set(session.exec(select(MetricDefinition.product).distinct()).all())
    # From the per-product counters, not DISTINCT over every evaluation (0.2–0.6 s at 1M rows).
    totals = counters.evaluation_totals_by_product(session=session)
    judged = {product for product, counts in totals.items() if counts.evaluations}
    return sorted(p for p in defined | judged if p)


def known_languages(*, session: Session) -> list[str]:
    """Languages of stored evaluations plus English and Turkish, for the page's language picker.

    A loose index scan (`inspector.distinct_languages`), not `SELECT DISTINCT` over every evaluation:
    the cost is the number of languages, not of rows (PostgreSQL has no skip scan).
    """
    stored = inspector.distinct_languages(session=session)
    return sorted({"en", "tr", *(lang for lang in stored if lang)})


def score_bounds(spec: MetricSpec) -> tuple[int, int, int] | tuple[float, float, float]:
    """(min, max, step) for a score input on the metric's scale: whole numbers, or hundredths."""
    if spec.integer_scale and float(spec.min_value).is_integer() and float(spec.max_value).is_integer():
        return int(spec.min_value), int(spec.max_value), 1
    return float(spec.min_value), float(spec.max_value), 0.01


def user_scores_from_form(
    metrics: Sequence[MetricSpec], values: Mapping[str, Any], reasons: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """The page's per-metric inputs as user_scores; metrics left empty are not scored."""
    out: dict[str, dict[str, Any]] = {}
    for spec in metrics:
        value = values.get(spec.slug)
        reason = (reasons.get(spec.slug) or "").strip() or None
        if value is None and reason is None:
            continue
        out[spec.slug] = {"score": value, "reason": reason}
    return out
