"""One evaluation record → its snapshot row and judgment rows, validated (SPEC §6 evaluations).

The importer (every line of a file) and the judge (the evaluation it just scored) build rows here,
so both refuse the same records with the same messages and compute the same derived columns:
source key, seed-002 evidence shape with verified items, weighted gap and judge meta score.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Table, bindparam, or_, select, update
from sqlmodel import Session

from lib import counters
from lib.corrections import format_score
from lib.evidence import HIGHLIGHT_STAGES, STAGES, items_of, verify_evidence_items
from lib.metrics import (
    MetricSpec,
    derived_gaps,
    judge_meta_score,
    metric_gaps,
    metrics_for_product,
    resolve_metric_key,
    score_of,
)
from lib.models import EvaluationSnapshot, utcnow
from lib.records import (
    ImportFailed,
    InvalidField,
    located_failure,
    number_field,
    record_object,
    text_field,
    timestamp_field,
    type_name,
)
from lib.search import normalize_search_text
from lib.source_records import label_key

_SNAPSHOTS: Table = EvaluationSnapshot.__table__  # type: ignore[attr-defined]


def source_key_of(product: str, question: str, model_answer: str, model_name: str | None) -> str:
    """The identity of an evaluation across re-imports: SHA-256 of its product, question, answer, model."""
    payload = json.dumps([product, question, model_answer, model_name or ""], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def text_source_key(product: Any, question: Any, model_answer: Any, model_name: Any) -> str | None:
    """`source_key_of` an evaluation whose product, question and answer are text and model text or
    None (the product stripped, as every importer stores it); None for any other, which the import
    refuses naming the field: the importer's split of a file's stored evaluations and the OTLP
    receiver's check of a re-sent span key content alike."""
    texts = (product, question, model_answer)
    if not all(isinstance(t, str) for t in texts) or not isinstance(model_name, str | None):
        return None
    return source_key_of(product.strip(), question, model_answer, model_name)


class MetricSet:
    """A product's metrics with an exact key → slug lookup (slugs and display names, never lower())."""

    def __init__(self, product: str, specs: list[MetricSpec]) -> None:
        self.product = product
        self.specs = specs
        self.by_slug = {s.slug: s for s in specs}
        self.keys = {s.display_name: s.slug for s in specs} | {s.slug: s.slug for s in specs}

    def resolve(self, key: Any, label: str) -> str:
        if not isinstance(key, str):
            raise InvalidField(label, f"metric name must be a string, got {type_name(key)}")
        slug = self.keys.get(key)
        if slug is None:
            try:
                resolve_metric_key(key, self.specs, self.product)
            except ValueError as exc:
                raise InvalidField(label, str(exc)) from None
        return slug  # type: ignore[return-value]


def _scores(raw: Any, name: str, metrics: MetricSet) -> dict[str, dict[str, Any]]:
    """`{key: number | {"score", "reason"|"rationale", "label"?}}` → `{slug: {"score", "reason",
    "label"?}}`, validated. `label` is the judge's label (a Phoenix or Langfuse category, pass/fail):
    its judgment's `label`, which the stored-label lookup reads (lib.importer._stored_label_scores)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidField(name, f"must be an object of {{metric: score}}, got {type_name(raw)}")
    out: dict[str, dict[str, Any]] = {}
    for key, value in raw.items():
        # Labels are built only on the error paths: this loop runs for every score of every line.
        slug = metrics.keys.get(key) or metrics.resolve(key, f"{name}.{key}")
        if slug in out:
            raise InvalidField(f"{name}.{key}", f"metric {slug!r} is given twice (as slug and display name)")
        reason = label = None
        if value.__class__ is dict:
            if "score" not in value:
                raise InvalidField(f"{name}.{key}.score", "is required when a score is an object")
            reason = value.get("reason")
            reason_key = "reason" if reason is not None else "rationale"
            reason = value.get(reason_key)
            if reason is not None and (
                reason.__class__ is not str or "\x00" in reason or not reason.isascii()
            ):
                reason = text_field(value, reason_key, path=f"{name}.{key}.{reason_key}")
            label = value.get("label")
            if label is not None:
                label = text_field(value, "label", path=f"{name}.{key}.label")
            value = value["score"]
        if value is not None:
            try:
                number = metrics.by_slug[slug].validate(value)
            except ValueError as exc:
                raise InvalidField(f"{name}.{key}", str(exc)) from None
            except OverflowError:
                raise InvalidField(f"{name}.{key}", "score is too large") from None
            value = value if value.__class__ is int else number
        out[slug] = (
            {"score": value, "reason": reason}
            if label is None
            else {"score": value, "reason": reason, "label": label}
        )
    return out


def _evidence_items(raw: Any, metrics: MetricSet) -> dict[str, list[dict[str, Any]]]:
    """Evidence as `{metric: [items]}` or the seed shape `{metric: {"evidence": [items]}}`, checked."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidField("evidence", f"must be an object of {{metric: [items]}}, got {type_name(raw)}")
    out: dict[str, list[dict[str, Any]]] = {}
    for key, value in raw.items():
        label = f"evidence.{key}"
        slug = metrics.resolve(key, label)
        if slug in out:
            raise InvalidField(label, f"metric {slug!r} is given twice (as slug and display name)")
        listed = items_of(value)
        if isinstance(value, dict):
            label += ".evidence"
            value = value.get("evidence")
        if listed is None:
            raise InvalidField(label, f"must be a list of evidence items, got {type_name(value)}")
        items = []
        for i, item in enumerate(listed):
            item_label = f"{label}[{i}]"
            if not isinstance(item, dict):
                raise InvalidField(item_label, f"must be an object, got {type_name(item)}")
            text_field(item, "quote", required=True, path=f"{item_label}.quote")
            for end in ("start", "end"):
                pos = item.get(end)
                if pos is not None and (isinstance(pos, bool) or not isinstance(pos, int)):
                    raise InvalidField(
                        f"{item_label}.{end}", f"must be an integer or null, got {type_name(pos)}"
                    )
            items.append(dict(item))
        out[slug] = items
    return out


def evaluation_row(
    record: Any, metric_set: Callable[[str], MetricSet], reviewer: str
) -> tuple[dict[str, Any], list[tuple[str, Any, str | None]], bool]:
    """One record → (snapshot row, judged metrics, whether the id was given), or InvalidField."""
    record = record_object(record)
    question = text_field(record, "question", required=True)
    answer = text_field(record, "model_answer", required=True)
    product = text_field(record, "product", table=_SNAPSHOTS, required=True).strip()  # type: ignore[union-attr]
    assert question is not None and answer is not None
    if record.get("user_scores") is None and record.get("judge_scores") is None:
        raise InvalidField("user_scores", "is required (user_scores and/or judge_scores)")
    metrics = metric_set(product)
    user = _scores(record.get("user_scores"), "user_scores", metrics)
    judge = _scores(record.get("judge_scores"), "judge_scores", metrics)
    if not user and not judge:
        raise InvalidField("user_scores", "user_scores and judge_scores are both empty")
    evidence = _evidence_items(record.get("evidence"), metrics)

    model_name = text_field(record, "model_name", table=_SNAPSHOTS)
    snapshot_id = text_field(record, "id", table=_SNAPSHOTS)
    if snapshot_id is not None and not snapshot_id.strip():
        raise InvalidField("id", "must not be empty")
    question_id = record.get("question_id")
    if isinstance(question_id, int) and not isinstance(question_id, bool):
        question_id = str(question_id)
    question_id = text_field({"question_id": question_id}, "question_id", table=_SNAPSHOTS)

    primary = record.get("primary_metric")
    primary = metrics.resolve(primary, "primary_metric") if primary is not None else metrics.specs[0].slug
    bonus_raw = record.get("bonus_metrics") or []
    if not isinstance(bonus_raw, list):
        raise InvalidField("bonus_metrics", f"must be a list of metric names, got {type_name(bonus_raw)}")
    bonus: list[str] = []
    for i, key in enumerate(bonus_raw):
        slug = metrics.resolve(key, f"bonus_metrics[{i}]")
        if slug not in bonus:
            bonus.append(slug)

    # Seed-002 evidence shape: every scored or evidenced metric, in the rubric's order, its items
    # verified against the answer (one prepared answer for all quotes of the record).
    evidence_json: dict[str, Any] = {}
    gaps: dict[str, float] = {}
    counts = dict.fromkeys(STAGES, 0)
    empty: dict[str, Any] = {}
    for spec in metrics.specs:
        slug = spec.slug
        if slug not in user and slug not in judge and slug not in evidence:
            continue
        u = user.get(slug, empty)
        j = judge.get(slug, empty)
        us, js = u.get("score"), j.get("score")
        if us is not None and js is not None:
            gaps[slug] = spec.rescaled_gap(us, js)
        items = evidence.get(slug)
        if items:
            items = verify_evidence_items(answer, items)
            for item in items:
                counts[item["stage"]] += 1
        evidence_json[slug] = {
            "user_score": us,
            "judge_score": js,
            "metric_gap": round(abs(us - js), 4) if us is not None and js is not None else None,
            "user_reason": u.get("reason"),
            "judge_reason": j.get("reason"),
            "evidence": items or [],
        }
    derived = derived_gaps(gaps, primary, bonus)

    given_gap = record.get("weighted_gap")
    if given_gap is not None:
        gap: float | None = number_field(given_gap, "weighted_gap")
        if gap < 0:  # type: ignore[operator]
            raise InvalidField("weighted_gap", "must not be negative")
    else:
        gap = derived.weighted_gap
    given_meta = record.get("judge_meta_score")
    if given_meta is not None:
        meta_value = number_field(given_meta, "judge_meta_score")
        if not meta_value.is_integer() or not 1 <= meta_value <= 5:
            raise InvalidField("judge_meta_score", f"must be a whole number from 1 to 5, got {given_meta}")
        meta: int | None = int(meta_value)
    else:
        meta = judge_meta_score(gap) if gap is not None else None

    created = timestamp_field(record.get("created_at"), "created_at", required=False) or utcnow()
    key = source_key_of(product, question, answer, model_name)
    row = {
        "id": snapshot_id,
        "created_at": created,
        "question_id": question_id,
        "question": question,
        "model_answer": answer,
        "model_name": model_name,
        "judge_model": text_field(record, "judge_model", table=_SNAPSHOTS),
        "product": product,
        "language": text_field(record, "language", table=_SNAPSHOTS) or "en",
        "category": text_field(record, "category", table=_SNAPSHOTS),
        "primary_metric": primary,
        "bonus_metrics": bonus,
        "user_scores_json": user,
        "judge_scores_json": judge,
        "evidence_json": evidence_json,
        "judge_meta_score": meta,
        "weighted_gap": gap,
        "max_metric_gap": derived.max_metric_gap,
        "evidence_count": sum(counts.values()),
        "evidence_highlighted": sum(counts[s] for s in HIGHLIGHT_STAGES),
        "evidence_unlocated": counts["whitespace"],
        "evidence_unverified": counts["unverified"],
        "overall_feedback": text_field(record, "overall_feedback"),
        "status": "active",
        "source_key": key,
        "created_by": reviewer,
        "search_text": normalize_search_text(question),
    }
    judged = [
        (slug, s["score"], s["reason"], label_key(s.get("label")))
        for slug, s in judge.items()
        if s["score"] is not None
    ]
    return row, judged, snapshot_id is not None


def snapshot_judgment_rows(
    row: Mapping[str, Any], judged: list[tuple[str, Any, str | None, str | None]]
) -> list[dict[str, Any]]:
    """One unreviewed Judgment per judged metric of a snapshot; the decision is the score as text,
    the label the score entry's (`evaluation_row`'s judged: slug, score, reason, label key)."""
    return [
        {
            "change_id": f"{row['id']}:{slug}",
            "product": row["product"],
            "metric": slug,
            "snapshot_id": row["id"],
            "decision": format_score(score),
            "reasoning": reason,
            "label": label,
            "judge_model": row["judge_model"],
            "timestamp": row["created_at"],
            "version": 1,
            "was_corrected": False,
            "judge_version_id": row.get("judge_version_id"),
        }
        for slug, score, reason, label in judged
    ]


def build_snapshot_rows(
    record: Mapping[str, Any], metrics: Sequence[MetricSpec], *, reviewer: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One evaluation record → (snapshot row, judgment rows), validated as an import would; for the judge.

    The record must carry its `id`. Rows use the model's field names and plain values, ready for
    `EvaluationSnapshot(**row)` and `Judgment(**judgment)`. ImportFailed names the field at fault.
    """
    metric_set = MetricSet(str(record.get("product") or "").strip(), list(metrics))
    try:
        row, judged, _explicit = evaluation_row(record, lambda _product: metric_set, reviewer)
    except InvalidField as exc:
        raise located_failure("evaluation", exc) from None
    if not row["id"]:
        raise ImportFailed("evaluation, field 'id': is required")
    return row, snapshot_judgment_rows(row, judged)


# ---------------------------------------------------------------------------------------------
# Gaps after a scale changes

REGAP_BATCH = 1000  # evaluations per UPDATE batch (and per evaluation_counts shift)


@contextmanager
def gaps_follow_scales(session: Session, products: Iterable[str]) -> Iterator[None]:
    """Around a write of the metric definitions of `products`: afterwards, the stored gaps of their
    evaluations follow every scale the write changed (`rederive_gaps`), in the same transaction.
    Every writer of definitions runs inside it: an import inferring or widening a scale, a
    `--kind metrics` file, the rubric editor.

    It takes the importers' writer lock first (held already by an import): on PostgreSQL a scale
    change beside an open import re-derived the committed evaluations only, and the import's rows
    kept the old span's gaps (review9 R9). SQLite writers are one at a time anyway."""
    from lib.locks import PG_IMPORT_LOCK, one_writer_at_a_time

    one_writer_at_a_time(session, PG_IMPORT_LOCK)
    before = {product: metrics_for_product(session=session, product=product) for product in set(products)}
    yield
    session.flush()
    for product, specs in before.items():
        rederive_gaps(session, product, specs, metrics_for_product(session=session, product=product))


def rederive_gaps(
    session: Session, product: str, before: Sequence[MetricSpec], after: Sequence[MetricSpec]
) -> int:
    """Re-derive `weighted_gap`, `max_metric_gap` and `judge_meta_score` of `product`'s evaluations
    that score, on both sides, a metric whose span differs between the rubrics `before` and `after`
    (review7 F12: a widened 0–1 → 0–4 scale left a gap of 1 ranked as a gap of 4).

    A gap is rescaled to the 1–5 span (`MetricSpec.rescaled_gap`), so a new span changes it. A stored
    figure is re-derived only when it is what `before` derives from the evaluation's scores (the
    same `derived_gaps` rule as on import): a weighted gap or meta score the record gave
    (SPEC §6) is kept, and so is a figure derived under an older rubric that differs in more than
    this change. Only a metric kept with another span counts: a metric added or removed leaves the
    gaps as they are. `evaluation_counts` follows (`counters.gaps_change`). Returns the evaluations
    changed."""
    spans = {spec.slug: spec.span for spec in before}
    rescaled = {spec.slug: spec for spec in after if spec.slug in spans and spans[spec.slug] != spec.span}
    moved = sorted(rescaled)
    if not moved:
        return 0
    c = _SNAPSHOTS.c
    scored = select(
        c.id, c.user_scores_json, c.judge_scores_json, c.primary_metric, c.bonus_metrics,
        c.weighted_gap, c.max_metric_gap, c.judge_meta_score,
    ).where(
        c.product == product,
        c.max_metric_gap.is_not(None),  # no metric scored on both sides: no gap to re-derive
        or_(*(counters.metric_judged(c.judged_metrics, slug) for slug in moved)),
    )  # fmt: skip
    changed: list[dict[str, Any]] = []
    for row in session.execute(scored.execution_options(yield_per=REGAP_BATCH)):
        user, judge = row.user_scores_json or {}, row.judge_scores_json or {}
        if not any(slug in user and slug in judge for slug in moved):
            continue
        bonus = list(row.bonus_metrics or [])
        gaps = metric_gaps(before, user, judge)
        old = derived_gaps(gaps, row.primary_metric, bonus)
        for slug in moved:  # only these gaps change: a metric added or removed is left out of both
            if slug in gaps:
                gaps[slug] = rescaled[slug].rescaled_gap(score_of(user[slug]), score_of(judge[slug]))  # type: ignore[arg-type]
        new = derived_gaps(gaps, row.primary_metric, bonus)
        derived = row.weighted_gap == old.weighted_gap
        values = {
            "b_weighted_gap": new.weighted_gap if derived else row.weighted_gap,
            "b_meta": new.judge_meta_score
            if derived and row.judge_meta_score == old.judge_meta_score
            else row.judge_meta_score,
            "b_max_gap": new.max_metric_gap
            if row.max_metric_gap == old.max_metric_gap
            else row.max_metric_gap,
        }
        if (values["b_weighted_gap"], values["b_meta"], values["b_max_gap"]) != (
            row.weighted_gap, row.judge_meta_score, row.max_metric_gap,
        ):  # fmt: skip
            changed.append({"b_id": row.id, **values})
    write = (
        update(_SNAPSHOTS)
        .where(c.id == bindparam("b_id"))
        .values(
            weighted_gap=bindparam("b_weighted_gap"),
            max_metric_gap=bindparam("b_max_gap"),
            judge_meta_score=bindparam("b_meta"),
        )
    )
    for start in range(0, len(changed), REGAP_BATCH):
        rows = changed[start : start + REGAP_BATCH]
        where = counters.batch(session, c.id, [r["b_id"] for r in rows])
        with counters.gaps_change(session=session, where=where):
            session.connection().execute(write, rows)
    return len(changed)
