"""Demo reviews: reviewers' verdicts on the evaluations' judgments, and the seed-004 judgments."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import false, insert, select
from sqlmodel import Session, col

from lib import counters
from lib.corrections import BulkReview, format_score, record_reviews, review_event_row
from lib.demo.evaluations import DemoEvaluations, _scales
from lib.demo.inputs import DEMO_SEED, _choose, _inputs, _read_input, _rng, demo_anchor
from lib.evaluation_layer import EvaluationVerdict, apply_evaluation
from lib.models import Judgment, JudgmentEvent, compute_was_corrected
from lib.second_opinion import ACTION as SECOND_OPINION_ACTION


@dataclass(frozen=True)
class PlannedReview:
    """A reviewer's verdict on one judgment, decided from the evaluation's truth."""

    change_id: str
    reviewer: str
    user_decision: str
    reason: str | None
    reviewed_at: datetime


def _reviewer_language(reviewer: str, language: str, config: Mapping[str, Any]) -> str:
    return language if language in config["reviewer_languages"][reviewer] else "en"


def _review_chance(age: timedelta) -> float:
    """Reviewers work through the queue oldest first, so older evaluations are mostly reviewed."""
    for days, chance in ((21, 0.75), (7, 0.55), (2, 0.3)):
        if age > timedelta(days=days):
            return chance
    return 0.1


def plan_reviews(evaluations: DemoEvaluations, seed: int = DEMO_SEED) -> list[PlannedReview]:
    """Which judgments reviewers confirmed or overruled: older evaluations are mostly reviewed."""
    config = _read_input("products.json")
    phrases = _read_input("phrases.json")
    anchor = demo_anchor()
    rng = _rng(seed, "reviews")
    scales = {p["name"]: {s.slug: s for s in _scales(p)} for p in config["products"]}
    plan: list[PlannedReview] = []
    for snapshot_id in sorted(evaluations.truths):
        t = evaluations.truths[snapshot_id]
        p_review = _review_chance(anchor - t.created_at)
        if rng.random() >= p_review:
            continue
        reviewer = _choose(rng, config["reviewers"][t.product])
        lang = _reviewer_language(reviewer, t.language, config)
        metrics = sorted(t.judge)
        if rng.random() < 0.15:  # a review interrupted half-way
            metrics = sorted(rng.sample(metrics, max(1, len(metrics) // 2)))
        # Reviews happen within four days, and (one metric every few minutes) before the anchor.
        room = max(0.0, (anchor - t.created_at).total_seconds() - 3600)
        at = t.created_at + timedelta(seconds=rng.uniform(0.2, 0.9) * min(room, 4 * 86400) + 60)
        for slug in metrics:
            scale = scales[t.product][slug]
            judge, truth = t.judge[slug], t.truth[slug]
            verdict = truth
            if rng.random() < 0.14:
                verdict = scale.clamp(truth + rng.choice([-1, 1]) * scale.step())
            if not scale.integer and abs(verdict - judge) <= 0.1:
                verdict = judge  # on a continuous scale reviewers let small differences pass
            decision = format_score(judge)
            if verdict == judge:
                reason = _choose(rng, phrases["confirm"][lang]) if rng.random() < 0.3 else None
                plan.append(PlannedReview(f"{snapshot_id}:{slug}", reviewer, decision, reason, at))
            else:
                corrections = phrases["corrections"][lang]
                if slug in t.missed and verdict < judge:
                    reason = _choose(rng, phrases["missed"][lang]).format(feedback=t.missed[slug])
                else:
                    direction = "too_high" if verdict < judge else "too_low"
                    pool = corrections[direction].get(slug) or phrases["corrections"]["en"][direction][slug]
                    reason = _choose(rng, pool)
                plan.append(
                    PlannedReview(f"{snapshot_id}:{slug}", reviewer, format_score(verdict), reason, at)
                )
            at += timedelta(seconds=rng.randint(20, 240))
    return plan


def _apply_reviews(session: Session, plan: Sequence[PlannedReview]) -> int:
    """Write planned reviews onto judgments nobody has reviewed yet; one audit event each."""
    return record_reviews(
        session=session,
        reviews=[BulkReview(p.change_id, p.user_decision, p.reviewer, p.reason, p.reviewed_at) for p in plan],
    ).applied


# ---------------------------------------------------------------------------------------------
# Seed-004 judgments (product "Acme Fungear")


def build_cache_judgments(seed: int = DEMO_SEED) -> list[dict[str, Any]]:
    """Judgment rows in the seed-004 shape (INCLUDE/EXCLUDE/UNCERTAIN), some reviewed or corrected."""
    config = _read_input("products.json")
    anchor = demo_anchor()
    rng = _rng(seed, "cache-judgments")
    rows = []
    entries = _inputs("fungear_judgments.json")
    for i, entry in enumerate(entries):
        # Monthly report runs: entries spread over the span in the order the PRs were merged.
        age = config["span_days"] * (1 - (i + rng.random()) / (len(entries) + 1))
        stamp = (anchor - timedelta(days=age)).replace(microsecond=0)
        number = entry["change_id"].rsplit("#", 1)[-1].rsplit("!", 1)[-1]
        repo = entry["change_id"].split("#")[0].split("!")[0]
        kind = "pull" if "#" in entry["change_id"] else "merge_requests"
        row: dict[str, Any] = {
            "change_id": entry["change_id"],
            "product": "Acme Fungear",
            "metric": None,
            "snapshot_id": None,
            "decision": entry["decision"],
            "confidence": entry["confidence"],
            "reasoning": entry["reasoning"],
            "timestamp": stamp,
            "version": 1,
            "was_corrected": False,
            "url": f"https://{repo}/{'-/' if kind == 'merge_requests' else ''}{kind}/{number}",
            "description": entry["description"],
            "ai_provider": "openai" if rng.random() < 0.8 else "gemini",
            "judge_model": "gpt-4o",
            "user_decision": None,
            "user_reasoning": None,
            "reviewer": None,
            "reviewed_at": None,
        }
        review = entry.get("review")
        if review is not None:
            room = min((anchor - stamp).total_seconds() * 0.9, 6 * 86400)
            row.update(
                user_decision=review["decision"],
                user_reasoning=review["reason"],
                reviewer=_choose(rng, config["reviewers"]["Acme Fungear"]),
                reviewed_at=stamp + timedelta(seconds=rng.uniform(0.1, 1.0) * room),
                version=2,
                was_corrected=compute_was_corrected(entry["decision"], review["decision"]),
            )
        if entry.get("second_opinion"):
            row.update(_second_opinion(entry, row, config, rng))
        rows.append(row)
    return rows


def _second_opinion(
    entry: Mapping[str, Any], row: Mapping[str, Any], config: Mapping[str, Any], rng: random.Random
) -> dict[str, Any]:
    """The seed-000 evaluation layer's verdict on a judgment, as lib.second_opinion stores it.

    Asked for by a reviewer shortly after the judgment and before any review (`_opinion_by` names
    who asked; it is the event's reviewer, not a column).
    """
    op = entry["second_opinion"]
    verdict = EvaluationVerdict(
        valid=op["valid"],
        improved_code=op["improved"],
        improved_confidence=op["improved_confidence"],
        improved_reasoning=op["improved_reasoning"],
        evaluation=op["evaluation"],
    )
    decision, confidence, action = apply_evaluation(entry["decision"], entry["confidence"], verdict)
    text = op["evaluation"]
    if op["improved"] and op["improved_reasoning"]:
        text += f"\n\nImproved decision {op['improved']}: {op['improved_reasoning']}"
    stamp: datetime = row["timestamp"]
    window = (row["reviewed_at"] - stamp) / 2 if row["reviewed_at"] else timedelta(hours=2)
    return {
        "second_opinion_action": action,
        "second_opinion_valid": op["valid"],
        "second_opinion_decision": decision,
        "second_opinion_confidence": confidence,
        "second_opinion_text": text,
        "second_opinion_model": config["eval_model"],
        "second_opinion_at": stamp + min(window, timedelta(minutes=rng.randint(5, 40))),
        "_opinion_by": _choose(rng, config["reviewers"]["Acme Fungear"]),
    }


def _write_cache_judgments(session: Session, rows: list[dict[str, Any]]) -> tuple[int, int]:
    stored = set(
        session.execute(
            select(Judgment.change_id).where(col(Judgment.change_id).in_([r["change_id"] for r in rows]))
        ).scalars()
    )
    fresh = [r for r in rows if r["change_id"] not in stored]
    if not fresh:
        return 0, 0
    columns = set(Judgment.model_fields)
    session.execute(insert(Judgment), [{k: v for k, v in r.items() if k in columns} for r in fresh])
    counters.judgments_added(
        session=session, where=col(Judgment.change_id).in_([r["change_id"] for r in fresh]), snapshots=false()
    )
    ids = dict(
        session.execute(
            select(Judgment.change_id, Judgment.id).where(
                col(Judgment.change_id).in_([r["change_id"] for r in fresh])
            )
        ).all()
    )
    events = [
        review_event_row(
            judgment_id=ids[r["change_id"]], change_id=r["change_id"], corrected=r["was_corrected"],
            reviewer=r["reviewer"], at=r["reviewed_at"], from_decision=r["decision"],
            to_decision=r["user_decision"], reason=r["user_reasoning"], version=2,
        )
        for r in fresh
        if r["reviewed_at"] is not None
    ]  # fmt: skip
    opinions = [
        {
            "judgment_id": ids[r["change_id"]],
            "change_id": r["change_id"],
            "action": SECOND_OPINION_ACTION,
            "reviewer": r["_opinion_by"],
            "at": r["second_opinion_at"],
            "from_decision": r["decision"],
            "to_decision": r["second_opinion_decision"],
            "reason": f"{r['second_opinion_action']} by {r['second_opinion_model']}: {r['second_opinion_text']}",
            "version": 1,
        }
        for r in fresh
        if r.get("second_opinion_action")
    ]
    if events or opinions:
        session.execute(insert(JudgmentEvent), opinions + events)
    return len(fresh), len(events)
