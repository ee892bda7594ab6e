"""Interaction records (seed 003) as the importer reads them: one JSONL line → rows, or InvalidField.

A line is `{id?, product, language?, question, answer, citation_url?, created_at?, expert?}`;
`expert` = `{sentence_scores: [{sentence, score 0–100 or null}], citation_score?, citation_url?,
reviewer?}` makes the line an expert-reviewed precedent.

Identity across re-imports: the line's `id`; a line without one gets `int_` + the first 40 hex of
its content key (SHA-256 of product, question, answer and citation URL), so re-importing it finds
it again. Two lines with their own ids are two interactions even when their texts are equal (two
users can ask the same question), unlike evaluations, where equal content is one evaluation.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Table

from lib import precedents
from lib.models import ExpertFeedback, Interaction, utcnow
from lib.records import InvalidField, number_field, record_object, text_field, timestamp_field, type_name

_INTERACTIONS: Table = Interaction.__table__  # type: ignore[attr-defined]
_FEEDBACK: Table = ExpertFeedback.__table__  # type: ignore[attr-defined]
MAX_SENTENCES = 500


def interaction_content_key(product: str, question: str, answer: str, citation_url: str | None) -> str:
    """The identity of an id-less interaction across re-imports: SHA-256 of product, question, answer, URL."""
    payload = json.dumps([product, question, answer, citation_url or ""], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _score(value: Any, label: str, high: float) -> float | None:
    if value is None:
        return None
    number = number_field(value, label)
    if not 0 <= number <= high:
        raise InvalidField(label, f"{number:g} is outside 0–{high:g}")
    return value if isinstance(value, int) else number


def expert_feedback_fields(raw: Any, *, reviewer: str, label: str = "expert") -> dict[str, Any]:
    """An `expert` object → ExpertFeedback fields (type 'expert', total computed by seed 003's rule)."""
    if not isinstance(raw, dict):
        raise InvalidField(label, f"must be an object, got {type_name(raw)}")
    items = raw.get("sentence_scores")
    if not isinstance(items, list) or not items:
        raise InvalidField(f"{label}.sentence_scores", "must be a non-empty list of {sentence, score}")
    if len(items) > MAX_SENTENCES:
        raise InvalidField(f"{label}.sentence_scores", f"has {len(items)} items; at most {MAX_SENTENCES}")
    scores = []
    for i, item in enumerate(items):
        where = f"{label}.sentence_scores[{i}]"
        if not isinstance(item, dict):
            raise InvalidField(where, f"must be an object, got {type_name(item)}")
        sentence = text_field(item, "sentence", required=True, path=f"{where}.sentence")
        scores.append(
            {"sentence": sentence.strip(), "score": _score(item.get("score"), f"{where}.score", 100)}
        )  # type: ignore[union-attr]
    citation_score = _score(
        raw.get("citation_score"), f"{label}.citation_score", precedents.MAX_CITATION_SCORE
    )
    who = text_field(raw, "reviewer", table=_FEEDBACK, path=f"{label}.reviewer")
    return {
        "type": "expert",
        "total_score": precedents.expert_total(scores, citation_score),
        "citation_score": citation_score,
        "citation_url": text_field(raw, "citation_url", path=f"{label}.citation_url"),
        "sentence_scores": scores,
        "reviewer": (who or "").strip() or reviewer,
    }


def interaction_rows(record: Any, reviewer: str) -> tuple[dict[str, Any], dict[str, Any] | None, bool]:
    """One line → (interaction row, expert feedback row or None, whether the id was given)."""
    record = record_object(record)
    product = text_field(record, "product", table=_INTERACTIONS, required=True).strip()  # type: ignore[union-attr]
    question = text_field(record, "question", required=True)
    answer = text_field(record, "answer", required=True)
    assert question is not None and answer is not None
    citation_url = text_field(record, "citation_url")
    citation_url = citation_url.strip() or None if citation_url is not None else None
    given_id = text_field(record, "id", table=_INTERACTIONS)
    if given_id is not None and not given_id.strip():
        raise InvalidField("id", "must not be empty")
    key = interaction_content_key(product, question, answer, citation_url)
    created = timestamp_field(record.get("created_at"), "created_at", required=False) or utcnow()
    row = {
        "id": given_id.strip() if given_id else f"int_{key[:40]}",
        "product": product,
        "language": (text_field(record, "language", table=_INTERACTIONS) or "en").strip() or "en",
        "question": question,
        "answer": answer,
        "citation_url": citation_url,
        "citations": [citation_url] if citation_url else [],
        "qa_vector": None,
        "created_at": created,
    }
    expert = None
    if record.get("expert") is not None:
        expert = {
            "interaction_id": row["id"],
            "created_at": created,
            **expert_feedback_fields(record["expert"], reviewer=reviewer),
        }
    return row, expert, given_id is not None
