"""Demo precedents (seed 003): expert-reviewed help-center answers, and newer ones that the
auto-evaluator itself scores during the demo build (`lib.precedents`, offline embeddings, no LLM).

Nothing here writes an outcome by hand: each newer interaction goes through
`precedents.evaluate_interaction`, so re-running the evaluator on the demo changes nothing. The
inputs are chosen so the build shows every outcome possible without an LLM: matched,
`no_qa_match`, `no_sentence_match`, `no_citation_match`, `no_embeddings` (a turn logged without
its text) and `forced_fallback_no_match` (one interaction evaluated in force-fallback mode).
They are dated in the order of `auto` in precedents.json: the text-less turn first (oldest), a
matched one last, so the Precedents page opens on a full match trace (issue 25).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlmodel import Session, col

from lib import precedents
from lib.demo.inputs import DEMO_SEED, _inputs, _rng, demo_anchor
from lib.models import ExpertFeedback, Interaction


@dataclass
class PendingEvaluation:
    """A newer interaction to auto-evaluate during the build, and when its result is dated."""

    interaction_id: str
    at: datetime
    force_fallback: bool = False


@dataclass
class DemoPrecedents:
    """Interactions, expert feedback (by interaction id) and the interactions to auto-evaluate."""

    interactions: list[dict[str, Any]]
    expert: dict[str, dict[str, Any]]
    auto: list[PendingEvaluation]


def _interaction(iid: str, question: str, answer: str, url: str, created: datetime) -> dict[str, Any]:
    return {
        "id": iid,
        "product": "acme-support",
        "language": "en",
        "question": question,
        "answer": answer,
        "citation_url": url,
        "citations": [url],
        "created_at": created,
    }


def build_precedents(seed: int = DEMO_SEED) -> DemoPrecedents:
    """Expert-reviewed help-center answers, and newer ones to auto-evaluate against them."""
    data = _inputs("precedents.json")
    anchor = demo_anchor()
    rng = _rng(seed, "precedents")
    out = DemoPrecedents([], {}, [])
    for n, e in enumerate(data["expert"]):
        iid = f"int_{e['key']}"
        created = (anchor - timedelta(days=62 - n * 2, hours=rng.randint(0, 8))).replace(microsecond=0)
        answer = " ".join(s["sentence"] for s in e["sentences"])
        out.interactions.append(_interaction(iid, e["question"], answer, e["citation_url"], created))
        out.expert[iid] = {
            "interaction_id": iid,
            "type": "expert",
            "total_score": precedents.expert_total(e["sentences"], e["citation_score"]),
            "citation_score": e["citation_score"],
            "citation_url": e["citation_url"],
            "sentence_scores": e["sentences"],
            "reviewer": e["reviewer"],
            "created_at": created + timedelta(days=rng.randint(1, 3), hours=rng.randint(0, 7)),
        }
    for n, a in enumerate(data["auto"]):
        iid = f"int_{a['key']}"
        created = (anchor - timedelta(days=27 - n * 1.8, hours=rng.randint(0, 8))).replace(microsecond=0)
        out.interactions.append(
            _interaction(iid, a["question"], " ".join(a["sentences"]), a["citation_url"], created)
        )
        at = created + timedelta(minutes=rng.randint(1, 9))
        out.auto.append(PendingEvaluation(iid, at, bool(a.get("force_fallback"))))
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
    with precedents.offline():
        index = precedents.PrecedentIndex.load(session=session)
        for pending in data.auto:
            if pending.interaction_id not in fresh_ids:
                continue
            row = precedents.evaluate_interaction(
                session, pending.interaction_id, force_fallback=pending.force_fallback, index=index
            )
            # Dated in the demo's past, like everything else the demo writes.
            row.created_at = pending.at
            if row.expert_feedback_id is not None:
                copy = session.get(ExpertFeedback, row.expert_feedback_id)
                if copy is not None:
                    copy.created_at = pending.at
            autos += 1
        session.flush()
    return {"interactions": len(fresh), "expert feedback": len(expert), "auto evaluations": autos}
