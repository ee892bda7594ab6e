"""Demo precedents (seed 003): expert-reviewed help-center answers and newer ones auto-evaluated."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from difflib import SequenceMatcher
from statistics import mean
from typing import Any

from sqlalchemy import insert, select
from sqlmodel import Session, col

from lib.demo.inputs import DEMO_SEED, _inputs, _rng, demo_anchor
from lib.models import AutoEval, ExpertFeedback, Interaction

QA_THRESHOLD = 0.85


def _similarity(a: str, b: str) -> float:
    return SequenceMatcher(None, a, b).ratio()


def _same_url(a: str | None, b: str | None) -> bool:
    return (a or "").strip().lower() == (b or "").strip().lower()


def _precedent_total(scores: Sequence[float], citation: float | None) -> float:
    """Seed 003: round(mean(sentence scores) × 0.75 + (citation score or 25), 2)."""
    return round(mean(scores) * 0.75 + (citation if citation is not None else 25), 2)


@dataclass
class DemoPrecedents:
    """Interactions, expert feedback (by interaction id) and auto-evaluations (by interaction id)."""

    interactions: list[dict[str, Any]]
    expert: dict[str, dict[str, Any]]
    auto: dict[str, dict[str, Any]]  # interaction id -> AutoEval fields + optional "ai_feedback"


def _auto_evaluation(
    a: Mapping[str, Any],
    iid: str,
    at: datetime,
    expert_by_key: Mapping[str, Mapping[str, Any]],
    expert: Mapping[str, Mapping[str, Any]],
    rng: random.Random,
) -> dict[str, Any]:
    """The seed-003 outcome the input asks for, with the match trace that explains it."""
    outcome, precedent = a["outcome"], expert_by_key.get(a["precedent"] or "")
    answer = " ".join(a["sentences"])
    trace: dict[str, Any] = {"qa_matches": [], "sentences": [], "citation": {}}
    result: dict[str, Any] = {
        "interaction_id": iid,
        "processed": True,
        "has_matches": False,
        "matched_interaction_id": None,
        "no_match_reason": None if outcome == "matched" else outcome,
        "total_score": None,
        "created_at": at,
    }
    if outcome == "no_embeddings":
        trace = {
            "error": "no embedding stored for this interaction; it was created before embeddings were enabled"
        }
    elif outcome == "no_qa_match":
        # The nearest expert-reviewed neighbours, all below the threshold.
        near = sorted(
            (
                (round(0.45 + 0.35 * _similarity(a["question"], e["question"]), 3), e["id"])
                for e in expert_by_key.values()
            ),
            reverse=True,
        )[:3]
        trace["qa_candidates"] = [{"interaction_id": i, "similarity": s} for s, i in near]
    else:
        assert precedent is not None
        qa_sim = round(0.88 + 0.1 * _similarity(answer, precedent["answer"]), 3)
        trace["qa_matches"] = [{"interaction_id": precedent["id"], "similarity": qa_sim}]
        others = [e for e in expert_by_key.values() if e["id"] != precedent["id"]]
        runner_up = max(others, key=lambda e: _similarity(a["question"], e["question"]))
        runner_sim = round(QA_THRESHOLD + 0.03 * rng.random(), 3)
        if rng.random() < 0.5 and runner_sim < qa_sim:
            trace["qa_matches"].append({"interaction_id": runner_up["id"], "similarity": runner_sim})
        copied = []
        for sentence in a["sentences"]:
            best = max(precedent["sentences"], key=lambda s: _similarity(sentence, s["sentence"]))
            ratio = _similarity(sentence, best["sentence"])
            sim = round(0.55 + 0.45 * ratio, 3) if ratio < 0.95 else round(0.95 + 0.05 * ratio, 3)
            trace["sentences"].append(
                {
                    "sentence": sentence,
                    "best_match": best["sentence"] if sim >= QA_THRESHOLD else None,
                    "similarity": sim,
                }
            )
            copied.append({"sentence": sentence, "score": best["score"]})
        trace["citation"] = {
            "expected": precedent["citation_url"],
            "actual": a["citation_url"],
            "match": _same_url(precedent["citation_url"], a["citation_url"]),
        }
        if outcome == "forced_fallback_no_match":
            trace["fallback"] = {
                "candidates": [
                    m["interaction_id"]
                    for m in trace["qa_matches"]
                    if expert[m["interaction_id"]]["total_score"] >= 90
                ],
                "citation_match": trace["citation"]["match"],
                "llm_pass": False,
                "llm_reason": "The answer tells the user to hash the parsed JSON with the API key; the "
                "precedent requires an HMAC of the raw body with the signing secret.",
            }
        if outcome == "matched":
            fb = expert[precedent["id"]]
            total = _precedent_total([c["score"] for c in copied], fb["citation_score"])
            result.update(has_matches=True, total_score=total, matched_interaction_id=precedent["id"])
            result["ai_feedback"] = {
                "interaction_id": iid,
                "type": "ai",
                "total_score": total,
                "citation_score": fb["citation_score"],
                "citation_url": a["citation_url"],
                "sentence_scores": copied,
                "reviewer": None,
                "created_at": result["created_at"],
            }
    result["sentence_match_trace"] = trace
    return result


def build_precedents(seed: int = DEMO_SEED) -> DemoPrecedents:
    """Expert-reviewed help-center answers and newer ones auto-evaluated against them."""
    data = _inputs("precedents.json")
    anchor = demo_anchor()
    rng = _rng(seed, "precedents")
    out = DemoPrecedents([], {}, {})
    expert_by_key: dict[str, dict[str, Any]] = {}
    for n, e in enumerate(data["expert"]):
        iid = f"int_{e['key']}"
        created = (anchor - timedelta(days=62 - n * 2, hours=rng.randint(0, 8))).replace(microsecond=0)
        answer = " ".join(s["sentence"] for s in e["sentences"])
        out.interactions.append(
            {
                "id": iid,
                "product": "acme-support",
                "language": "en",
                "question": e["question"],
                "answer": answer,
                "citation_url": e["citation_url"],
                "citations": [e["citation_url"]],
                "created_at": created,
            }
        )
        scores = [s["score"] for s in e["sentences"]]
        out.expert[iid] = {
            "interaction_id": iid,
            "type": "expert",
            "total_score": _precedent_total(scores, e["citation_score"]),
            "citation_score": e["citation_score"],
            "citation_url": e["citation_url"],
            "sentence_scores": e["sentences"],
            "reviewer": e["reviewer"],
            "created_at": created + timedelta(days=rng.randint(1, 3), hours=rng.randint(0, 7)),
        }
        expert_by_key[e["key"]] = {**e, "id": iid, "answer": answer}

    for n, a in enumerate(data["auto"]):
        iid = f"int_{a['key']}"
        created = (anchor - timedelta(days=27 - n * 1.8, hours=rng.randint(0, 8))).replace(microsecond=0)
        answer = " ".join(a["sentences"])
        out.interactions.append(
            {
                "id": iid,
                "product": "acme-support",
                "language": "en",
                "question": a["question"],
                "answer": answer,
                "citation_url": a["citation_url"],
                "citations": [a["citation_url"]],
                "created_at": created,
            }
        )
        out.auto[iid] = _auto_evaluation(
            a, iid, created + timedelta(minutes=rng.randint(1, 9)), expert_by_key, out.expert, rng
        )
    return out


def _write_precedents(session: Session, data: DemoPrecedents) -> dict[str, int]:
    ids = [i["id"] for i in data.interactions]
    stored = set(session.execute(select(Interaction.id).where(col(Interaction.id).in_(ids))).scalars())
    fresh = [i for i in data.interactions if i["id"] not in stored]
    if not fresh:
        return {"interactions": 0, "expert feedback": 0, "auto evaluations": 0}
    session.execute(insert(Interaction), fresh)
    fresh_ids = {i["id"] for i in fresh}
    expert = [fb for iid, fb in sorted(data.expert.items()) if iid in fresh_ids]
    if expert:
        session.execute(insert(ExpertFeedback), expert)
    autos = 0
    for iid, result in sorted(data.auto.items()):
        if iid not in fresh_ids:
            continue
        fields = {k: v for k, v in result.items() if k != "ai_feedback"}
        if "ai_feedback" in result:
            fb = ExpertFeedback(**result["ai_feedback"])
            session.add(fb)
            session.flush()
            fields["expert_feedback_id"] = fb.id
        session.execute(insert(AutoEval), [fields])
        autos += 1
    return {"interactions": len(fresh), "expert feedback": len(expert), "auto evaluations": autos}
