"""Agreement between reviewers (issue 26 point 5): how reliable the human labels of team queues are.

Every figure is read from the labels of team review queues (`review_labels`, lib.queues): one row
per reviewer and judgment in a queue, with the blind label (blind-first queues) and the final one.

- **Reliability per metric** (and per queue): Krippendorff's alpha at the metric's level of
  measurement (nominal for labels such as INCLUDE, ordinal for whole-number scales, interval for
  continuous ones), exact and within-1 agreement over all pairs of labels on the same item, and the
  mean of the reviewer pairs' Cohen's kappas (Light's kappa). A *unit* is one judgment in one queue,
  so each reviewer labels a unit at most once.
- **Reviewer pairs**: for each two reviewers who labelled the same items, their kappa (quadratic
  weights on whole-number scales, unweighted on labels, as judge-vs-human kappa in lib.analytics),
  exact and within-1 agreement.
- **Calibration**: each reviewer's final labels against the decision their items were resolved to
  (agreement or a lead's adjudication): the mean signed difference (positive: they score higher),
  how often they differ, and how often adjudication went against them.
- **Anchoring** (blind-first queues): after the judge's score is revealed, how often and how far
  reviewers moved their blind label toward it, or away.
- **Human ceiling** for Analytics: on items two or more reviewers labelled, how well reviewers agree
  with each other, beside how well the judge agrees with them on the same items.

The statistics are lib.reliability's (checked against reference implementations) with seeded
bootstrap intervals over units, Wilson intervals for shares and normal intervals for means. The
database returns the filtered label rows once, narrow and ordered by unit; everything after that is
numpy over arrays of codes (no per-row Python beyond the fetch, no DataFrame of labels).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import and_, func, or_
from sqlmodel import Session, col, select

from lib import reliability
from lib.analytics import AnalyticsFilters, spearman_of_counts
from lib.metrics import MetricSpec, metrics_for_product
from lib.models import EvaluationSnapshot, Judgment, ReviewLabel, ReviewQueue, ReviewQueueJudgment
from lib.reliability import Crosstab, Estimate, ValueCounts

BASES = ("final", "blind")
BASIS_LABELS = {"final": "Final labels", "blind": "Blind labels (blind-first queues)"}
DECIDED_STATES = ("resolved", "adjudicated")
BLIND_MODE = "blind"
_EPSILON = 1e-9  # the within-1 rule's float allowance, as in lib.analytics
_JUDGMENT_BITS = 0xFFFFFFFF  # a unit is (queue id << 32) | judgment id

METRIC_COLUMNS = [
    "product", "metric", "metric_name", "scale", "level", "items", "single_label_items", "labels",
    "reviewers", "alpha", "alpha_lo", "alpha_hi", "exact_agreement", "exact_agreement_lo",
    "exact_agreement_hi", "within_1_agreement", "within_1_agreement_lo", "within_1_agreement_hi",
    "mean_pairwise_kappa", "kappa_weights",
]  # fmt: skip
QUEUE_COLUMNS = ["queue_id", "queue", *METRIC_COLUMNS]
PAIR_COLUMNS = [
    "product", "metric", "metric_name", "reviewer_a", "reviewer_b", "items", "exact_agreement",
    "within_1_agreement", "kappa", "kappa_lo", "kappa_hi", "kappa_weights",
]  # fmt: skip
CALIBRATION_COLUMNS = [
    "reviewer", "product", "metric", "metric_name", "decided", "mean_signed_difference",
    "mean_signed_difference_lo", "mean_signed_difference_hi", "mean_signed_difference_rescaled",
    "mean_signed_difference_rescaled_lo", "mean_signed_difference_rescaled_hi", "differs_from_decision",
    "adjudicated", "adjudicated_against", "adjudicated_against_share", "adjudicated_against_share_lo",
    "adjudicated_against_share_hi",
]  # fmt: skip
ANCHORING_COLUMNS = [
    "reviewer", "product", "metric", "metric_name", "labels", "changed", "changed_share",
    "could_move", "moved_toward_judge", "toward_share", "toward_share_lo", "toward_share_hi",
    "moved_away", "mean_shift_toward_judge", "mean_shift_toward_judge_lo", "mean_shift_toward_judge_hi",
    "blind_exact_with_judge", "final_exact_with_judge",
]  # fmt: skip
CEILING_COLUMNS = [
    "product", "metric", "metric_name", "items", "human_pairs", "human_exact_agreement",
    "human_within_1_agreement", "human_weighted_kappa", "human_spearman", "judge_pairs",
    "judge_exact_agreement", "judge_within_1_agreement", "judge_weighted_kappa", "judge_spearman",
]  # fmt: skip
# Sufficient sums kept beside the per-metric rows so the per-reviewer totals need no rows; dropped
# before a table is shown.
_CALIBRATION_SUMS = ["_rn", "_r1", "_r2"]
_ANCHORING_SUMS = ["_sn", "_s1", "_s2", "_blind_exact", "_final_exact"]
ALL_REVIEWERS = "(all reviewers)"
ALL_METRICS = "(all metrics)"


class AgreementError(ValueError):
    """An agreement request that cannot be answered as asked (unknown basis, queue...)."""


@dataclass(frozen=True)
class AgreementFilters:
    """Which labels the figures read: products and queues (empty = all) and which label of each.

    `basis` "final" reads every queue's final labels; "blind" reads the blind labels of blind-first
    queues, given before the judge was shown (their agreement is the reviewers' own, unanchored).
    """

    products: tuple[str, ...] = ()
    queue_ids: tuple[int, ...] = ()
    basis: str = "final"
    resamples: int = reliability.BOOTSTRAP_RESAMPLES
    seed: int = 0


def _frame(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(columns))


@dataclass
class ReviewerAgreement:
    """Every reviewer-agreement table, already computed; each is what a page shows and a CSV holds."""

    metrics: pd.DataFrame = field(default_factory=lambda: _frame([], METRIC_COLUMNS))
    queues: pd.DataFrame = field(default_factory=lambda: _frame([], QUEUE_COLUMNS))
    pairs: pd.DataFrame = field(default_factory=lambda: _frame([], PAIR_COLUMNS))
    calibration: pd.DataFrame = field(default_factory=lambda: _frame([], CALIBRATION_COLUMNS))
    anchoring: pd.DataFrame = field(default_factory=lambda: _frame([], ANCHORING_COLUMNS))
    labels: int = 0

    @property
    def empty(self) -> bool:
        return self.labels == 0


# ---------------------------------------------------------------------------------------------
# Reading the labels


@dataclass(frozen=True)
class _Scale:
    """How a (product, metric)'s labels compare: level of measurement, span for within-1, kappa weights."""

    level: reliability.Level
    metric_name: str
    scale: str
    span: float | None  # None for labels and for numbers off any rubric (no within-1 there)

    @property
    def numeric(self) -> bool:
        return self.level != "nominal"

    @property
    def kappa_weights(self) -> reliability.Weights | None:
        """Quadratic on whole-number scales, none on labels, n/a on continuous (as judge-vs-human)."""
        return {"nominal": "none", "ordinal": "quadratic"}.get(self.level)  # type: ignore[return-value]

    @property
    def within_one(self) -> float | None:
        """One step of the 1–5 span on this metric's own scale: |a - b| at most this is within-1."""
        return None if self.span is None else self.span / 4.0

    def rescale(self, difference: np.ndarray) -> np.ndarray:
        """Differences on the 1–5 span (as Analytics' gaps), NaN where the scale has no span."""
        if not self.span:
            return np.full(np.shape(difference), np.nan)
        return np.asarray(difference, dtype=float) * 4.0 / self.span


def scale_of(spec: MetricSpec | None, metric: str | None) -> _Scale:
    """The level of measurement of a metric's labels: ordinal on whole-number scales, interval on
    continuous ones, nominal for a stand-alone judgment's label (INCLUDE / EXCLUDE / UNCERTAIN)."""
    if metric is None:
        return _Scale("nominal", "decision (label)", "labels", None)
    if spec is None:  # a metric no rubric defines any more: any number
        return _Scale("interval", metric, "any number", None)
    return _Scale(
        "ordinal" if spec.integer_scale else "interval", spec.display_name, spec.scale_label(), spec.span
    )


@dataclass
class _Group:
    """The label rows of one (product, metric), as arrays ordered by unit."""

    product: str
    metric: str | None
    scale: _Scale
    unit: np.ndarray  # int64: queue id << 32 | judgment id
    queue: np.ndarray  # int64
    reviewer: np.ndarray  # object (text)
    blind: np.ndarray  # float (numeric) or object (labels); NaN / None when missing
    final: np.ndarray
    judge: np.ndarray
    resolved: np.ndarray
    state: np.ndarray  # object
    blind_queue: np.ndarray  # bool: the label is from a blind-first queue
    tolerance: np.ndarray  # float: the queue's tolerance (0 when none)


def _numbers(values: np.ndarray) -> np.ndarray:
    """Decision texts as floats, NaN for missing (and for labels, which only nominal groups read)."""
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)


def _label_query(filters: AgreementFilters) -> Any:
    """The filtered label rows, narrow and unsorted (numpy groups them): one query serves every figure.

    The queues' mode and tolerance come from a small query of their own, not a join per label.
    """
    label, judgment, qj = ReviewLabel, Judgment, ReviewQueueJudgment
    # Every live label; the basis picks its values later, so calibration and anchoring read the same rows.
    where: list[Any] = [
        col(label.withdrawn_at).is_(None),
        or_(col(label.decision).is_not(None), col(label.blind_decision).is_not(None)),
    ]
    if filters.products:
        where.append(col(judgment.product).in_(filters.products))
    if filters.queue_ids:
        where.append(col(label.queue_id).in_(filters.queue_ids))
    return (
        select(
            judgment.product,
            judgment.metric,
            label.queue_id,
            label.judgment_id,
            label.reviewer,
            label.blind_decision,
            label.decision,
            judgment.decision,
            qj.state,
            qj.decision,
        )
        .join(judgment, col(judgment.id) == col(label.judgment_id))
        # Through the item (indexed: ix_queue_judgment_item; an item holds a few judgments): joining on
        # the queue id alone would read every judgment of the queue for each label.
        .join(qj, and_(col(qj.item_id) == col(label.item_id), col(qj.judgment_id) == col(label.judgment_id)))
        .where(*where)
    )


def _groups(session: Session, filters: AgreementFilters) -> list[_Group]:
    if filters.basis not in BASES:
        raise AgreementError(f"unknown basis {filters.basis!r}; choose from {', '.join(BASES)}")
    # Core rows (no ORM row processing); each column becomes one array, split per group by index.
    rows = session.connection().execute(_label_query(filters)).all()
    if not rows:
        return []
    cols = [np.array(c, dtype=object) for c in zip(*rows, strict=True)]
    queue_ids = cols[2].astype(np.int64)
    settings = {
        int(i): (str(mode), float(tolerance or 0.0))
        for i, mode, tolerance in session.execute(
            select(ReviewQueue.id, ReviewQueue.mode, ReviewQueue.tolerance).where(
                col(ReviewQueue.id).in_([int(q) for q in np.unique(queue_ids)])
            )
        )
    }
    distinct_queues = np.unique(queue_ids)
    queue_index = np.searchsorted(distinct_queues, queue_ids)
    blind_queue = np.array([settings[int(q)][0] == BLIND_MODE for q in distinct_queues], dtype=bool)[
        queue_index
    ]
    tolerance = np.array([settings[int(q)][1] for q in distinct_queues], dtype=float)[queue_index]
    unit = (queue_ids << 32) | cols[3].astype(np.int64)
    numbers = {c: _numbers(cols[c]) for c in (5, 6, 7, 9)}  # NaN for labels: only numeric groups read these
    keys: dict[tuple[str, str | None], int] = {}
    group_of = np.array([keys.setdefault((p, m), len(keys)) for p, m in zip(cols[0], cols[1], strict=True)])
    specs: dict[str, dict[str, MetricSpec]] = {}
    groups: list[_Group] = []
    for (product, metric), code in sorted(keys.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        mine = np.flatnonzero(group_of == code)
        if product not in specs:
            specs[product] = {s.slug: s for s in metrics_for_product(session=session, product=product)}
        scale = scale_of(specs[product].get(metric) if metric else None, metric)
        values = numbers if scale.numeric else {c: cols[c] for c in numbers}
        groups.append(
            _Group(
                product=str(product),
                metric=metric,
                scale=scale,
                unit=unit[mine],
                queue=queue_ids[mine],
                reviewer=cols[4][mine],
                blind=values[5][mine],
                final=values[6][mine],
                judge=values[7][mine],
                resolved=values[9][mine],
                state=cols[8][mine],
                blind_queue=blind_queue[mine],
                tolerance=tolerance[mine],
            )
        )
    return groups


def _present(values: np.ndarray) -> np.ndarray:
    if values.dtype == object:
        return np.array([v is not None for v in values], dtype=bool)
    return ~np.isnan(values)


# ---------------------------------------------------------------------------------------------
# Reliability per metric, queue and reviewer pair


def load_agreement(*, session: Session, filters: AgreementFilters | None = None) -> ReviewerAgreement:
    """Every reviewer-agreement table for the labels the filters select (READ)."""
    filters = filters or AgreementFilters()
    groups = _groups(session, filters)
    metric_rows, queue_rows, pair_rows, calibration_rows, anchoring_rows = [], [], [], [], []
    queue_names = _queue_names(session, {int(q) for g in groups for q in np.unique(g.queue)})
    labels = 0
    for group in groups:
        if filters.basis == "blind":
            values, keep = group.blind, _present(group.blind) & group.blind_queue
        else:
            values, keep = group.final, _present(group.final)
        labels += int(keep.sum())
        unit, reviewer, value = group.unit[keep], group.reviewer[keep], values[keep]
        if len(unit):
            head = _head(group)
            crosstabs = _crosstabs(unit, reviewer, value)
            metric_rows.append(head | _reliability(group.scale, unit, reviewer, value, filters, crosstabs))
            for queue_id in np.unique(group.queue[keep]):
                mine = group.queue[keep] == queue_id
                queue_rows.append(
                    {"queue_id": int(queue_id), "queue": queue_names.get(int(queue_id), str(queue_id))}
                    | head
                    | _reliability(group.scale, unit[mine], reviewer[mine], value[mine], filters)
                )
            pair_rows.extend(head | row for row in _pairs(group.scale, crosstabs, filters))
        calibration_rows.extend(_calibration(group))
        anchoring_rows.extend(_anchoring(group))
    return ReviewerAgreement(
        metrics=_frame(metric_rows, METRIC_COLUMNS),
        queues=_frame(queue_rows, QUEUE_COLUMNS).sort_values(["queue", "product"], kind="stable"),
        pairs=_frame(pair_rows, PAIR_COLUMNS),
        calibration=_with_totals(
            _frame(calibration_rows, CALIBRATION_COLUMNS + _CALIBRATION_SUMS), _calibration_total
        ),
        anchoring=_with_totals(_frame(anchoring_rows, ANCHORING_COLUMNS + _ANCHORING_SUMS), _anchoring_total),
        labels=labels,
    )


def _queue_names(session: Session, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    rows = session.execute(select(ReviewQueue.id, ReviewQueue.name).where(col(ReviewQueue.id).in_(ids)))
    return {int(i): str(n) for i, n in rows}


def _head(group: _Group) -> dict[str, Any]:
    return {
        "product": group.product,
        "metric": group.metric or "",
        "metric_name": group.scale.metric_name,
        "scale": group.scale.scale,
        "level": group.scale.level,
    }


def _reliability(
    scale: _Scale,
    unit: np.ndarray,
    reviewer: np.ndarray,
    value: np.ndarray,
    filters: AgreementFilters,
    crosstabs: Sequence[tuple[str, str, Crosstab]] | None = None,
) -> dict[str, Any]:
    """Alpha, exact and within-1 agreement with intervals, and Light's kappa for one set of labels."""
    counts = ValueCounts.from_labels(unit, value)
    boot = {"resamples": filters.resamples, "seed": filters.seed}
    within = scale.within_one
    row: dict[str, Any] = {
        "items": counts.pairable_units,
        "single_label_items": counts.single_units,
        "labels": len(value),
        "reviewers": len(set(reviewer.tolist())),
        **reliability.alpha_estimate(counts, scale.level, **boot).as_dict("alpha"),
        **reliability.percent_agreement_estimate(counts, **boot).as_dict("exact_agreement"),
        **(
            reliability.percent_agreement_estimate(counts, tolerance=within, **boot)
            if within is not None
            else Estimate(float("nan"))
        ).as_dict("within_1_agreement"),
        "kappa_weights": scale.kappa_weights or "n/a",
    }
    if crosstabs is None:
        crosstabs = _crosstabs(unit, reviewer, value)
    weights = scale.kappa_weights
    kappas = [reliability.cohen_kappa(crosstab, weights) for _, _, crosstab in crosstabs] if weights else []
    finite = [k for k in kappas if np.isfinite(k)]
    row["mean_pairwise_kappa"] = float(np.mean(finite)) if finite else float("nan")
    return row


def _pair_indices(unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices (first, second) of every unordered pair of labels on the same unit, in label order.

    Units are grouped by their number of labels m; each group's pairs come from the C(m, 2)
    position pairs at once, so the work is a few array operations per distinct m.
    """
    order = np.argsort(unit, kind="stable")
    ordered = unit[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) else ordered
    sizes = np.diff(np.r_[starts, len(ordered)])
    first: list[np.ndarray] = []
    second: list[np.ndarray] = []
    for m in np.unique(sizes[sizes >= 2]):
        rows = order[starts[sizes == m][:, None] + np.arange(m)]
        for i, j in itertools.combinations(range(int(m)), 2):
            first.append(rows[:, i])
            second.append(rows[:, j])
    if not first:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(first), np.concatenate(second)


def _crosstabs(unit: np.ndarray, reviewer: np.ndarray, value: np.ndarray) -> list[tuple[str, str, Crosstab]]:
    """Each two reviewers' paired labels on the units both labelled (reviewer_a < reviewer_b)."""
    names, codes = np.unique(reviewer.astype(str), return_inverse=True)
    first, second = _pair_indices(unit)
    swap = codes[first] > codes[second]
    first, second = np.where(swap, second, first), np.where(swap, first, second)
    pair_key = codes[first] * len(names) + codes[second]
    out = []
    for key in np.unique(pair_key):
        mine = pair_key == key
        crosstab = Crosstab.of(value[first[mine]], value[second[mine]])
        out.append((str(names[key // len(names)]), str(names[key % len(names)]), crosstab))
    return out


def _pairs(
    scale: _Scale, crosstabs: Sequence[tuple[str, str, Crosstab]], filters: AgreementFilters
) -> list[dict[str, Any]]:
    rows = []
    for a, b, crosstab in crosstabs:
        weights = scale.kappa_weights
        estimate = (
            reliability.kappa_estimate(crosstab, weights, resamples=filters.resamples, seed=filters.seed)
            if weights
            else Estimate(float("nan"))
        )
        within = scale.within_one
        rows.append(
            {
                "reviewer_a": a,
                "reviewer_b": b,
                "items": crosstab.items,
                "exact_agreement": reliability.crosstab_agreement(crosstab),
                "within_1_agreement": float("nan")
                if within is None
                else reliability.crosstab_agreement(crosstab, tolerance=within),
                **estimate.as_dict("kappa"),
                "kappa_weights": weights or "n/a",
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Calibration against the resolved decision


def _differs(scale: _Scale, a: np.ndarray, b: np.ndarray, tolerance: np.ndarray) -> np.ndarray:
    if not scale.numeric:
        return a != b
    allowance = np.where(scale.level == "interval", tolerance, 0.0) + _EPSILON
    return np.abs(a - b) > allowance


def _calibration(group: _Group) -> list[dict[str, Any]]:
    """Per reviewer: final labels against the decision their item was resolved to."""
    decided = np.isin(group.state, DECIDED_STATES) & _present(group.final) & _present(group.resolved)
    rows = []
    for reviewer in sorted(set(group.reviewer[decided].tolist())):
        mine = decided & (group.reviewer == reviewer)
        final, resolved = group.final[mine], group.resolved[mine]
        differs = _differs(group.scale, final, resolved, group.tolerance[mine])
        adjudicated = group.state[mine] == "adjudicated"
        row: dict[str, Any] = {
            "reviewer": reviewer,
            "product": group.product,
            "metric": group.metric or "",
            "metric_name": group.scale.metric_name,
            "decided": int(mine.sum()),
            "differs_from_decision": float(differs.mean()),
            "adjudicated": int(adjudicated.sum()),
            "adjudicated_against": int((differs & adjudicated).sum()),
            "_rn": 0, "_r1": 0.0, "_r2": 0.0,
        }  # fmt: skip
        if group.scale.numeric:
            d = (final - resolved).astype(float)
            r = group.scale.rescale(d)
            row |= reliability.mean_estimate(len(d), d.sum(), (d * d).sum()).as_dict("mean_signed_difference")
            rescaled = Estimate(float("nan"))
            if group.scale.span:
                row |= {"_r1": float(r.sum()), "_r2": float((r * r).sum()), "_rn": len(r)}
                rescaled = reliability.mean_estimate(row["_rn"], row["_r1"], row["_r2"])
            row |= rescaled.as_dict("mean_signed_difference_rescaled")
        else:
            row |= Estimate(float("nan")).as_dict("mean_signed_difference")
            row |= Estimate(float("nan")).as_dict("mean_signed_difference_rescaled")
        row |= reliability.share_estimate(row["adjudicated_against"], row["adjudicated"]).as_dict(
            "adjudicated_against_share"
        )
        rows.append(row)
    return rows


def _calibration_total(reviewer: str, part: pd.DataFrame) -> dict[str, Any]:
    """One reviewer over every metric: counts summed, the signed difference on the 1–5 span."""
    rn, r1, r2 = float(part["_rn"].sum()), float(part["_r1"].sum()), float(part["_r2"].sum())
    mean = reliability.mean_estimate(rn, r1, r2)
    decided, adjudicated = int(part["decided"].sum()), int(part["adjudicated"].sum())
    against = int(part["adjudicated_against"].sum())
    differs = float((part["differs_from_decision"] * part["decided"]).sum() / decided) if decided else np.nan
    return {
        "reviewer": reviewer, "product": "", "metric": "", "metric_name": ALL_METRICS, "decided": decided,
        "mean_signed_difference": float("nan"), "mean_signed_difference_lo": float("nan"),
        "mean_signed_difference_hi": float("nan"), **mean.as_dict("mean_signed_difference_rescaled"),
        "differs_from_decision": differs, "adjudicated": adjudicated, "adjudicated_against": against,
        **reliability.share_estimate(against, adjudicated).as_dict("adjudicated_against_share"),
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Anchoring in blind-first queues


def _anchoring(group: _Group) -> list[dict[str, Any]]:
    """Per reviewer: blind label -> final label, measured against the judge's score."""
    both = group.blind_queue & _present(group.blind) & _present(group.final) & _present(group.judge)
    rows = []
    for reviewer in sorted(set(group.reviewer[both].tolist())):
        mine = both & (group.reviewer == reviewer)
        blind, final, judge = group.blind[mine], group.final[mine], group.judge[mine]
        if group.scale.numeric:
            gap_blind, gap_final = np.abs(blind - judge), np.abs(final - judge)
            changed = np.abs(final - blind) > _EPSILON
            toward, away = gap_final < gap_blind - _EPSILON, gap_final > gap_blind + _EPSILON
            could_move = gap_blind > _EPSILON
            shift = group.scale.rescale(gap_blind - gap_final)
        else:
            gap_blind, gap_final = (blind != judge).astype(float), (final != judge).astype(float)
            changed = blind != final
            toward, away = (gap_blind > 0) & (gap_final == 0), (gap_blind == 0) & (gap_final > 0)
            could_move = gap_blind > 0
            shift = np.full(len(blind), np.nan)
        rows.append(
            _anchoring_row(
                reviewer,
                group.product,
                group.metric or "",
                group.scale.metric_name,
                labels=len(blind),
                changed=int(changed.sum()),
                could_move=int(could_move.sum()),
                toward=int(toward.sum()),
                away=int(away.sum()),
                shift=shift,
                blind_exact=int((gap_blind <= _EPSILON).sum()),
                final_exact=int((gap_final <= _EPSILON).sum()),
            )
        )
    return rows


def _anchoring_row(
    reviewer: str,
    product: str,
    metric: str,
    metric_name: str,
    *,
    labels: int,
    changed: int,
    could_move: int,
    toward: int,
    away: int,
    shift: np.ndarray,
    blind_exact: int,
    final_exact: int,
) -> dict[str, Any]:
    finite = shift[np.isfinite(shift)]
    shift_sums = (float(len(finite)), float(finite.sum()), float((finite * finite).sum()))
    return {
        "reviewer": reviewer, "product": product, "metric": metric, "metric_name": metric_name,
        "labels": labels, "changed": changed, "changed_share": changed / labels if labels else np.nan,
        "could_move": could_move, "moved_toward_judge": toward,
        **reliability.share_estimate(toward, could_move).as_dict("toward_share"),
        "moved_away": away,
        **reliability.mean_estimate(*shift_sums).as_dict("mean_shift_toward_judge"),
        "blind_exact_with_judge": blind_exact / labels if labels else np.nan,
        "final_exact_with_judge": final_exact / labels if labels else np.nan,
        "_sn": shift_sums[0], "_s1": shift_sums[1], "_s2": shift_sums[2],
        "_blind_exact": blind_exact, "_final_exact": final_exact,
    }  # fmt: skip


def _anchoring_total(reviewer: str, part: pd.DataFrame) -> dict[str, Any]:
    labels = int(part["labels"].sum())
    row = _anchoring_row(
        reviewer, "", "", ALL_METRICS,
        labels=labels, changed=int(part["changed"].sum()), could_move=int(part["could_move"].sum()),
        toward=int(part["moved_toward_judge"].sum()), away=int(part["moved_away"].sum()), shift=np.array([]),
        blind_exact=int(part["_blind_exact"].sum()), final_exact=int(part["_final_exact"].sum()),
    )  # fmt: skip
    return row | reliability.mean_estimate(
        float(part["_sn"].sum()), float(part["_s1"].sum()), float(part["_s2"].sum())
    ).as_dict("mean_shift_toward_judge")


def _with_totals(frame: pd.DataFrame, total: Any) -> pd.DataFrame:
    """Per-metric rows, then one "(all metrics)" row per reviewer and one for all reviewers together.

    The helper columns (`_...`, sufficient sums) are summed for the totals and then dropped.
    """
    if frame.empty:
        return frame[[c for c in frame.columns if not c.startswith("_")]]
    rows = [total(str(reviewer), part) for reviewer, part in frame.groupby("reviewer", sort=True)]
    rows.append(total(ALL_REVIEWERS, frame))
    out = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
    return out[[c for c in out.columns if not c.startswith("_")]]


# ---------------------------------------------------------------------------------------------
# The human ceiling beside judge-vs-human agreement (Analytics)


def human_ceiling(*, session: Session, filters: AnalyticsFilters) -> pd.DataFrame:
    """Per metric, on the items two or more reviewers labelled (final labels, every queue): how well
    reviewers agree with each other, and how well the judge agrees with those same reviewers.

    Judge-vs-human agreement can only be as high as humans agree among themselves; the first half is
    that ceiling, the second the judge measured on exactly the same items. Items follow Analytics'
    filters (the evaluation's product, language and creation day).
    """
    groups = _groups(session, AgreementFilters(products=filters.products))
    allowed = _items_matching(session, filters, groups)
    rows = []
    for group in groups:
        if not group.scale.numeric or group.scale.span is None:
            continue  # Analytics shows rubric metrics (numbers) only
        keep = _present(group.final) & np.isin(group.unit & _JUDGMENT_BITS, allowed)
        unit, value, judge = group.unit[keep], group.final[keep], group.judge[keep]
        if not len(unit):
            continue
        first, second = _pair_indices(unit)
        if not len(first):
            continue
        a, b = value[first], value[second]
        multi = np.isin(unit, unit[first])
        rows.append(
            {
                "product": group.product,
                "metric": group.metric or "",
                "metric_name": group.scale.metric_name,
                "items": len(np.unique(unit[multi])),
                **_pair_measures("human", group.scale, np.r_[a, b], np.r_[b, a], pairs=len(a)),
                **_pair_measures("judge", group.scale, value[multi], judge[multi], pairs=int(multi.sum())),
            }
        )
    return _frame(rows, CEILING_COLUMNS)


def _items_matching(session: Session, filters: AnalyticsFilters, groups: Sequence[_Group]) -> np.ndarray:
    """Judgment ids among the groups' whose evaluation is live and matches the Analytics filters."""
    ids = (
        np.unique(np.concatenate([g.unit & _JUDGMENT_BITS for g in groups]))
        if groups
        else np.zeros(0, np.int64)
    )
    if not len(ids) or (filters.language is None and filters.start is None and filters.end is None):
        return ids
    snapshot = EvaluationSnapshot
    where: list[Any] = [col(snapshot.deleted_at).is_(None)]
    if filters.language:
        where.append(col(snapshot.language) == filters.language)
    if filters.start is not None:
        where.append(col(snapshot.created_at) >= datetime.combine(filters.start, time.min, tzinfo=UTC))
    if filters.end is not None:
        end = datetime.combine(filters.end, time.min, tzinfo=UTC) + timedelta(days=1)
        where.append(col(snapshot.created_at) < end)
    found: list[int] = []
    for start in range(0, len(ids), 1000):
        chunk = [int(i) for i in ids[start : start + 1000]]
        found.extend(
            session.execute(
                select(Judgment.id)
                .join(snapshot, col(snapshot.id) == col(Judgment.snapshot_id))
                .where(col(Judgment.id).in_(chunk), *where)
            ).scalars()
        )
    return np.array(sorted(found), dtype=np.int64)


def _pair_measures(prefix: str, scale: _Scale, a: np.ndarray, b: np.ndarray, *, pairs: int) -> dict[str, Any]:
    """Exact, within-1, quadratic kappa (whole-number scales) and Spearman of paired scores."""
    crosstab = Crosstab.of(a, b)
    within = scale.within_one
    return {
        f"{prefix}_pairs": pairs,
        f"{prefix}_exact_agreement": reliability.crosstab_agreement(crosstab),
        f"{prefix}_within_1_agreement": float("nan")
        if within is None
        else reliability.crosstab_agreement(crosstab, tolerance=within),
        f"{prefix}_weighted_kappa": reliability.cohen_kappa(crosstab, "quadratic")
        if scale.level == "ordinal"
        else float("nan"),
        f"{prefix}_spearman": spearman_of_counts(a, b, np.ones(len(a))),
    }


# ---------------------------------------------------------------------------------------------
# What the filters offer, and the tables as people read them


def labels_version(*, session: Session) -> tuple[Any, ...]:
    """A fingerprint that changes whenever a figure could: a label given, changed or withdrawn, an
    item resolved or adjudicated (or undone). Pages cache the figures under it (two aggregates)."""
    label, qj = ReviewLabel, ReviewQueueJudgment
    labels = session.execute(
        select(
            func.count(label.id),
            func.max(label.id),
            func.max(label.labelled_at),
            func.max(label.blind_at),
            func.max(label.withdrawn_at),
        )
    ).one()
    decided = session.execute(
        select(func.count(qj.id), func.max(qj.decided_at)).where(col(qj.state).in_(DECIDED_STATES))
    ).one()
    return tuple(str(v) for v in (*labels, *decided))


@dataclass(frozen=True)
class QueueChoice:
    """A queue that has labels: what the Reviewers tab's queue picker lists."""

    id: int
    name: str
    mode: str


@dataclass(frozen=True)
class LabelOptions:
    products: list[str]
    queues: list[QueueChoice]

    @property
    def any_blind(self) -> bool:
        return any(q.mode == BLIND_MODE for q in self.queues)


def label_options(*, session: Session) -> LabelOptions:
    """Products and queues with at least one label (two small DISTINCT reads)."""
    label = ReviewLabel
    products = session.execute(
        select(Judgment.product)
        .join(label, col(label.judgment_id) == col(Judgment.id))
        .where(col(label.withdrawn_at).is_(None))
        .distinct()
        .order_by(Judgment.product)
    ).scalars()
    queues = session.execute(
        select(ReviewQueue.id, ReviewQueue.name, ReviewQueue.mode)
        .where(select(label.id).where(col(label.queue_id) == col(ReviewQueue.id)).exists())
        .order_by(ReviewQueue.name)
    ).all()
    return LabelOptions(
        products=[str(p) for p in products],
        queues=[QueueChoice(int(i), str(n), str(m)) for i, n, m in queues],
    )


PERCENT_MEASURES = ("exact_agreement", "within_1_agreement")


def reliability_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The per-metric (or per-queue) table as shown: alpha and agreement with their intervals in one cell."""
    shown = reliability.with_interval_text(
        frame, ("alpha", *PERCENT_MEASURES), percent=PERCENT_MEASURES, decimals=2
    )
    shown["mean_pairwise_kappa"] = [
        reliability.Estimate(float(v)).text() for v in frame["mean_pairwise_kappa"]
    ]
    return shown


def pairs_display(frame: pd.DataFrame) -> pd.DataFrame:
    return reliability.with_interval_text(frame, ("kappa",))


def calibration_display(frame: pd.DataFrame) -> pd.DataFrame:
    return reliability.with_interval_text(
        frame,
        ("mean_signed_difference", "mean_signed_difference_rescaled", "adjudicated_against_share"),
        percent=("adjudicated_against_share",),
    )


def anchoring_display(frame: pd.DataFrame) -> pd.DataFrame:
    return reliability.with_interval_text(
        frame, ("toward_share", "mean_shift_toward_judge"), percent=("toward_share",)
    )


TABLES = ("metrics", "queues", "pairs", "calibration", "anchoring")
_DISPLAY = {
    "metrics": reliability_display,
    "queues": reliability_display,
    "pairs": pairs_display,
    "calibration": calibration_display,
    "anchoring": anchoring_display,
}


def parse_tables(text: str) -> tuple[str, ...]:
    """`all` or a comma-separated list of TABLES; AgreementError names an unknown one."""
    if text.strip() in ("", "all"):
        return TABLES
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in names if t not in TABLES]
    if unknown:
        raise AgreementError(f"unknown table(s) {', '.join(unknown)}; choose from all, {', '.join(TABLES)}")
    return names


def agreement_record(result: ReviewerAgreement, tables: Sequence[str] = TABLES) -> dict[str, Any]:
    """The figures as JSON-ready data (the API's and `queue agreement --format json`'s): one list of
    row objects per table, undefined values as null."""
    out: dict[str, Any] = {"labels": result.labels}
    for name in tables:
        frame: pd.DataFrame = getattr(result, name)
        out[name] = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return out


def display_table(result: ReviewerAgreement, name: str) -> pd.DataFrame:
    """One table as people read it (intervals as "value [low, high]" text), for the CLI's text output."""
    return _DISPLAY[name](getattr(result, name))
