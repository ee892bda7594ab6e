"""Auto-evaluation by precedent (seed 003): copy an expert's scores onto a near-identical answer.

An interaction is scored only when an expert already scored a question/answer pair that is nearly the
same (QA similarity ≥ 0.85), every answer sentence has a near-identical expert-scored sentence
(≥ 0.85) and the cited URL is the same. Anything less leaves a no-match AutoEval whose reason code
and trace say which gate failed, so a reviewer can see why no score was given.

Embeddings are offline by default: a deterministic hashing embedding (word and character-3-gram
features hashed into 256 signed dimensions, L2-normalised), so no model is ever downloaded. With
`OVERRULE_EMBEDDING_MODEL` set they come from the configured server through `lib.llm.embed`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from lib import llm
from lib.config import Settings, get_settings
from lib.models import AutoEval, ExpertFeedback, Interaction

log = logging.getLogger(__name__)

EMBEDDING_DIM = 256
FALLBACK_MIN_TOTAL = 90.0
FALLBACK_CANDIDATES = 5
MISSING_SENTENCE_SCORE = 100.0
DEFAULT_CITATION_SCORE = 25.0
SENTENCE_WEIGHT = 0.75

NO_EMBEDDINGS = "no_embeddings"
NO_QA_MATCH = "no_qa_match"
NO_SENTENCE_MATCH = "no_sentence_match"
NO_CITATION_MATCH = "no_citation_match"
FORCED_FALLBACK_NO_MATCH = "forced_fallback_no_match"
# Not a seed reason: the evaluation itself raised (a bug, a lost database); --redo retries it.
EVALUATION_ERROR = "evaluation_error"
REASON_CODES = (
    NO_EMBEDDINGS,
    NO_QA_MATCH,
    NO_SENTENCE_MATCH,
    NO_CITATION_MATCH,
    FORCED_FALLBACK_NO_MATCH,
    EVALUATION_ERROR,
)

_WORD = re.compile(r"\w+", re.UNICODE)
# Sentence ends: terminal punctuation followed by space, or a line break (lists, paragraphs).
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")


# ---------------------------------------------------------------------------------------------
# Embeddings and similarity


def _bucket(feature: str) -> tuple[int, float]:
    """Stable (not PYTHONHASHSEED-dependent) bucket and sign, so stored vectors stay comparable."""
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "big")
    return value % EMBEDDING_DIM, (1.0 if (value >> 63) & 1 else -1.0)


def hashing_embedding(text: str) -> list[float]:
    """The offline embedding: signed feature hashing, so unrelated texts sit near zero similarity."""
    normalised = unicodedata.normalize("NFKC", text).casefold()
    words = _WORD.findall(normalised)
    vector = [0.0] * EMBEDDING_DIM
    for word in words:
        index, sign = _bucket(f"w:{word}")
        vector[index] += sign
    # Character 3-grams within the word sequence tolerate inflections and small edits.
    joined = f" {' '.join(words)} "
    for start in range(len(joined) - 2):
        index, sign = _bucket(f"c:{joined[start : start + 3]}")
        vector[index] += 0.5 * sign
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


def embed_texts(texts: Sequence[str], *, settings: Settings | None = None) -> list[list[float]]:
    """One vector per text: the configured embedding model when set, else the offline hashing one."""
    settings = settings or get_settings()
    if not texts:
        return []
    if settings.embedding_model:
        return llm.embed(list(texts), settings=settings)
    return [hashing_embedding(t) for t in texts]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity; 0.0 for an empty, zero or mismatched vector (nothing to compare)."""
    if not a or len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def split_sentences(text: str) -> list[str]:
    """An answer's sentences, the unit experts score; blank pieces dropped."""
    return [part.strip() for part in _SENTENCE_END.split(text or "") if part and part.strip()]


def qa_text(interaction: Interaction) -> str:
    """What the QA embedding covers: the question and its answer together."""
    return f"{interaction.question or ''}\n{interaction.answer or ''}".strip()


def citation_matches(a: str | None, b: str | None) -> bool:
    """Seed 003: the same URL, ignoring case and surrounding whitespace."""
    return (a or "").strip().lower() == (b or "").strip().lower()


def total_score(sentence_scores: Sequence[float], citation_score: float | None) -> float:
    """Seed 003: round(mean(sentence scores) × 0.75 + (citation score or 25), 2)."""
    if not sentence_scores:
        raise ValueError("total_score needs at least one sentence score")
    citation = DEFAULT_CITATION_SCORE if citation_score is None else citation_score
    return round(mean(float(s) for s in sentence_scores) * SENTENCE_WEIGHT + citation, 2)


# ---------------------------------------------------------------------------------------------
# QA matches


@dataclass
class QAMatch:
    """A neighbour interaction above the QA threshold and the expert feedback that scored it."""

    interaction: Interaction
    feedback: ExpertFeedback
    similarity: float

    @property
    def citation_url(self) -> str | None:
        """The URL the expert accepted: the feedback's, else the neighbour's own."""
        return self.feedback.citation_url or self.interaction.citation_url

    def scored_sentences(self) -> list[tuple[str, float | None]]:
        """The expert's (sentence, score) pairs; the answer's sentences unscored when none were given."""
        pairs = [
            (str(s.get("sentence") or "").strip(), s.get("score"))
            for s in self.feedback.sentence_scores or []
            if isinstance(s, Mapping)
        ]
        pairs = [(text, score) for text, score in pairs if text]
        return pairs or [(s, None) for s in split_sentences(self.interaction.answer)]


def _ensure_embedding(session: Session, interactions: Sequence[Interaction], dim: int | None) -> None:
    """Compute (and store) QA embeddings that are missing or of another model's dimension."""
    stale = [i for i in interactions if not i.embedding or (dim is not None and len(i.embedding) != dim)]
    stale = [i for i in stale if qa_text(i)]
    if not stale:
        return
    vectors = embed_texts([qa_text(i) for i in stale])
    for interaction, vector in zip(stale, vectors, strict=True):
        interaction.embedding = vector
        session.add(interaction)


def _latest_expert_feedback(session: Session, exclude_id: str) -> dict[str, ExpertFeedback]:
    """Each expert-reviewed interaction's newest expert feedback (AI copies are never precedents)."""
    rows = session.execute(
        select(ExpertFeedback)
        .where(ExpertFeedback.type == "expert", ExpertFeedback.interaction_id != exclude_id)
        .order_by(col(ExpertFeedback.created_at), col(ExpertFeedback.id))
    ).scalars()
    return {fb.interaction_id: fb for fb in rows}


def find_qa_matches(
    session: Session, interaction: Interaction, limit: int = 10, threshold: float | None = None
) -> list[QAMatch]:
    """Up to `limit` expert-reviewed neighbours at or above the QA threshold, most similar first."""
    threshold = get_settings().qa_threshold if threshold is None else threshold
    _ensure_embedding(session, [interaction], None)
    if not interaction.embedding:
        return []
    feedback = _latest_expert_feedback(session, interaction.id)
    if not feedback:
        return []
    neighbours = list(
        session.execute(select(Interaction).where(col(Interaction.id).in_(list(feedback)))).scalars()
    )
    _ensure_embedding(session, neighbours, len(interaction.embedding))
    scored = [
        QAMatch(n, feedback[n.id], cosine(interaction.embedding, n.embedding or []))
        for n in neighbours
        if n.id != interaction.id
    ]
    scored.sort(key=lambda m: (-m.similarity, m.interaction.id))
    return [m for m in scored[:limit] if m.similarity >= threshold]


# ---------------------------------------------------------------------------------------------
# Sentence matches


@dataclass
class SentenceMatch:
    """An answer sentence and the expert-scored sentence it was matched to (None when unmatched)."""

    sentence: str
    best_match: str | None
    similarity: float
    interaction_id: str | None = None
    score: float | None = None

    def as_trace(self) -> dict[str, Any]:
        return {
            "sentence": self.sentence,
            "best_match": self.best_match,
            "similarity": round(self.similarity, 4),
        }


# Picks one of several qualifying candidates: (sentence, candidates) -> index into candidates.
Chooser = Callable[[str, Sequence[tuple[str, float]]], int]


def _llm_chooser(settings: Settings) -> Chooser | None:
    """The seed's LLM pick among several qualifying sentences; None without an LLM."""
    if not settings.llm_configured:
        return None

    def choose(sentence: str, candidates: Sequence[tuple[str, float]]) -> int:
        listing = "\n".join(f"{n}. {text}" for n, (text, _) in enumerate(candidates))
        reply = llm.chat_json(
            [
                {
                    "role": "system",
                    "content": "You pick the expert-reviewed sentence that says the same thing as the "
                    "given sentence. Reply as JSON.",
                },
                {"role": "user", "content": f"Sentence:\n{sentence}\n\nCandidates:\n{listing}"},
            ],
            model=settings.eval_model,
            schema_hint='{"index": <number of the best candidate>}',
            settings=settings,
        )
        return int(reply.get("index", 0))

    return choose


def match_sentences(
    sentences: Sequence[str],
    qa_matches: Sequence[QAMatch],
    threshold: float | None = None,
    choose: Chooser | None = None,
) -> list[SentenceMatch]:
    """Per answer sentence, the best expert sentence ≥ threshold; stops at the first unmatched one."""
    threshold = get_settings().sentence_threshold if threshold is None else threshold
    pool = [(text, score, m.interaction.id) for m in qa_matches for text, score in m.scored_sentences()]
    if not pool or not sentences:
        return [SentenceMatch(s, None, 0.0) for s in sentences[:1]]
    pool_vectors = embed_texts([p[0] for p in pool])
    sentence_vectors = embed_texts(list(sentences))
    out: list[SentenceMatch] = []
    for sentence, vector in zip(sentences, sentence_vectors, strict=True):
        ranked = sorted(
            ((cosine(vector, pv), n) for n, pv in enumerate(pool_vectors)), key=lambda x: (-x[0], x[1])
        )
        qualifying = [(sim, n) for sim, n in ranked if sim >= threshold]
        if not qualifying:
            best_sim = ranked[0][0] if ranked else 0.0
            out.append(SentenceMatch(sentence, None, best_sim))
            break  # seed 003: one unmatched sentence ends sentence matching
        pick = 0
        if len(qualifying) > 1 and choose is not None:
            try:
                chosen = choose(sentence, [(pool[n][0], sim) for sim, n in qualifying])
                pick = chosen if 0 <= chosen < len(qualifying) else 0
            except (llm.LLMError, llm.LLMNotConfigured, ValueError, TypeError) as exc:
                log.warning("sentence pick by LLM failed, using the most similar: %s", exc)
        sim, n = qualifying[pick]
        text, score, iid = pool[n]
        out.append(SentenceMatch(sentence, text, sim, iid, score))
    return out


def _copied_score(score: Any) -> float:
    """The expert's sentence score, or 100 when the expert left it blank (seed 003)."""
    try:
        return MISSING_SENTENCE_SCORE if score is None else float(score)
    except (TypeError, ValueError):
        return MISSING_SENTENCE_SCORE


# ---------------------------------------------------------------------------------------------
# Fallback


def _llm_compare(settings: Settings, interaction: Interaction, precedent: QAMatch) -> tuple[bool, str]:
    """Seed 003's compare agent: does the new answer say what the high-scoring precedent said?"""
    reply = llm.chat_json(
        [
            {
                "role": "system",
                "content": "You compare a new answer with an expert-approved answer to the same question. "
                "Pass only if the new answer is equally correct and complete. Reply as JSON.",
            },
            {
                "role": "user",
                "content": f"Question:\n{interaction.question}\n\nExpert-approved answer:\n"
                f"{precedent.interaction.answer}\n\nNew answer:\n{interaction.answer}",
            },
        ],
        model=settings.eval_model,
        schema_hint='{"pass": true|false, "reason": "<one sentence>"}',
        settings=settings,
    )
    return reply.get("pass") is True, str(reply.get("reason") or "")


def _run_fallback(
    interaction: Interaction, qa_matches: Sequence[QAMatch], settings: Settings
) -> tuple[QAMatch | None, dict[str, Any]]:
    """High-score fallback: top 5 QA matches with expert total ≥ 90 and the same citation, LLM-approved."""
    candidates = [
        m
        for m in qa_matches[:FALLBACK_CANDIDATES]
        if (m.feedback.total_score or 0) >= FALLBACK_MIN_TOTAL
        and citation_matches(interaction.citation_url, m.citation_url)
    ]
    trace: dict[str, Any] = {
        "candidates": [m.interaction.id for m in candidates],
        "llm_pass": None,
        "llm_reason": None,
    }
    if not candidates:
        return None, trace
    if not settings.llm_configured:
        trace["llm_reason"] = "no LLM configured; the fallback cannot pass without one"
        return None, trace
    for candidate in candidates:
        try:
            passed, reason = _llm_compare(settings, interaction, candidate)
        except (llm.LLMError, llm.LLMNotConfigured) as exc:
            passed, reason = False, f"LLM comparison failed: {exc}"
        trace["llm_pass"], trace["llm_reason"] = passed, reason
        if passed:
            trace["passed_interaction_id"] = candidate.interaction.id
            return candidate, trace
    return None, trace


# ---------------------------------------------------------------------------------------------
# Evaluation: decide (reads only) then store (one short write)


@dataclass
class Outcome:
    """What evaluating one interaction decided, before anything is written.

    Deciding reads only, so a worker pool can decide many interactions at once and hold the
    database's write lock only for `store`, one short transaction per interaction.
    """

    interaction_id: str
    reason: str | None  # None: matched, scores copied
    trace: dict[str, Any]
    embedding: list[float] | None = None  # the interaction's QA vector, stored with the result
    processed: bool = True
    matched_interaction_id: str | None = None
    total: float | None = None
    citation_score: float | None = None
    citation_url: str | None = None
    sentence_scores: list[dict[str, Any]] | None = None

    @property
    def matched(self) -> bool:
        return self.reason is None


def _precedent_of(matches: Sequence[SentenceMatch], qa_matches: Sequence[QAMatch]) -> QAMatch:
    """The QA match most sentences were matched to; ties go to the more similar QA match."""
    counts: dict[str, int] = {}
    for m in matches:
        if m.interaction_id:
            counts[m.interaction_id] = counts.get(m.interaction_id, 0) + 1
    return max(qa_matches, key=lambda q: (counts.get(q.interaction.id, 0), q.similarity))


def _citation_precedent(
    interaction: Interaction, qa_matches: Sequence[QAMatch], preferred: QAMatch
) -> QAMatch | None:
    """The QA match whose accepted URL is the interaction's: `preferred` first, then the most similar.

    Seed 003 checks the source URL against the expert URL of any QA match above the threshold,
    not only of the precedent most sentences came from.
    """
    ordered = [preferred, *(m for m in qa_matches if m is not preferred)]
    return next((m for m in ordered if citation_matches(interaction.citation_url, m.citation_url)), None)


def decide(
    session: Session,
    interaction: Interaction,
    *,
    force_fallback: bool = False,
    settings: Settings | None = None,
) -> Outcome:
    """Seed 003's flow diagram for one interaction; reads the database, never writes it."""
    settings = settings or get_settings()
    iid = interaction.id
    trace: dict[str, Any] = {"qa_matches": [], "sentences": [], "citation": {}}
    if force_fallback:
        trace["forced_fallback"] = True
    try:
        qa_matches = find_qa_matches(session, interaction, threshold=settings.qa_threshold)
    except (llm.LLMError, llm.LLMNotConfigured) as exc:
        return Outcome(iid, NO_EMBEDDINGS, {"error": f"embedding failed: {exc}"})
    if not interaction.embedding:
        return Outcome(iid, NO_EMBEDDINGS, {"error": "the interaction has no text to embed"})
    embedding = list(interaction.embedding)
    trace["qa_matches"] = [
        {"interaction_id": m.interaction.id, "similarity": round(m.similarity, 4)} for m in qa_matches
    ]
    if not qa_matches:
        return Outcome(iid, NO_QA_MATCH, trace, embedding)

    sentences = split_sentences(interaction.answer)
    all_matched = False
    if not force_fallback:
        matches = match_sentences(sentences, qa_matches, settings.sentence_threshold, _llm_chooser(settings))
        trace["sentences"] = [m.as_trace() for m in matches]
        all_matched = (
            bool(sentences) and len(matches) == len(sentences) and all(m.best_match for m in matches)
        )

    if all_matched:
        precedent = _precedent_of(matches, qa_matches)
        scores = [_copied_score(m.score) for m in matches]
    else:
        chosen, fallback_trace = _run_fallback(interaction, qa_matches, settings)
        trace["fallback"] = fallback_trace
        if chosen is None:
            reason = FORCED_FALLBACK_NO_MATCH if force_fallback else NO_SENTENCE_MATCH
            return Outcome(iid, reason, trace, embedding)
        precedent = chosen
        # Each sentence takes the score of its nearest sentence in the approved precedent.
        own = match_sentences(sentences, [precedent], threshold=-1.0)
        trace["sentences"] = [m.as_trace() for m in own]
        scores = [_copied_score(m.score) for m in own]

    cited = _citation_precedent(interaction, qa_matches, precedent)
    trace["citation"] = {
        "expected": (cited or precedent).citation_url,
        "actual": interaction.citation_url,
        "match": cited is not None,
        "interaction_id": cited.interaction.id if cited else None,
        "accepted": sorted({m.citation_url or "" for m in qa_matches}),
    }
    if cited is None:
        return Outcome(iid, NO_CITATION_MATCH, trace, embedding)

    citation_score = cited.feedback.citation_score
    citation_score = DEFAULT_CITATION_SCORE if citation_score is None else float(citation_score)
    return Outcome(
        iid,
        None,
        trace,
        embedding,
        matched_interaction_id=precedent.interaction.id,
        total=total_score(scores, citation_score),
        citation_score=citation_score,
        citation_url=interaction.citation_url,
        sentence_scores=[{"sentence": s, "score": v} for s, v in zip(sentences, scores, strict=True)],
    )


def failed_outcome(interaction_id: str, error: BaseException | str) -> Outcome:
    """The outcome of an evaluation that raised: stored so the interaction never stays silent."""
    return Outcome(interaction_id, EVALUATION_ERROR, {"error": str(error)[:2000]}, processed=False)


def store(session: Session, outcome: Outcome) -> AutoEval:
    """Write one outcome: the AutoEval row and, for a match, the copied `type='ai'` feedback."""
    if outcome.embedding is not None:
        interaction = session.get(Interaction, outcome.interaction_id)
        if interaction is not None and interaction.embedding != outcome.embedding:
            interaction.embedding = outcome.embedding
            session.add(interaction)
    feedback_id = None
    if outcome.matched:
        feedback = ExpertFeedback(
            interaction_id=outcome.interaction_id,
            type="ai",
            total_score=outcome.total,
            citation_score=outcome.citation_score,
            citation_url=outcome.citation_url,
            sentence_scores=outcome.sentence_scores or [],
        )
        session.add(feedback)
        session.flush()
        feedback_id = feedback.id
    row = AutoEval(
        interaction_id=outcome.interaction_id,
        processed=outcome.processed,
        has_matches=outcome.matched,
        expert_feedback_id=feedback_id,
        matched_interaction_id=outcome.matched_interaction_id,
        sentence_match_trace=outcome.trace,
        no_match_reason=outcome.reason,
        total_score=outcome.total,
    )
    session.add(row)
    session.flush()
    return row


def _existing_auto_eval(session: Session, interaction_id: str) -> AutoEval | None:
    return session.execute(
        select(AutoEval).where(AutoEval.interaction_id == interaction_id)
    ).scalar_one_or_none()


def evaluate_interaction(session: Session, interaction_id: str, *, force_fallback: bool = False) -> AutoEval:
    """Auto-evaluate one interaction by precedent; an already evaluated one is returned unchanged."""
    existing = _existing_auto_eval(session, interaction_id)
    if existing is not None:
        return existing
    interaction = session.get(Interaction, interaction_id)
    if interaction is None:
        raise LookupError(f"No interaction with id {interaction_id!r}")
    return store(session, decide(session, interaction, force_fallback=force_fallback))


def pending_interaction_ids(session: Session, limit: int | None = None) -> list[str]:
    """Interactions with neither an auto-evaluation nor an expert review, oldest first."""
    evaluated = select(AutoEval.interaction_id)
    reviewed = select(ExpertFeedback.interaction_id).where(ExpertFeedback.type == "expert")
    query = (
        select(Interaction.id)
        .where(col(Interaction.id).not_in(evaluated), col(Interaction.id).not_in(reviewed))
        .order_by(col(Interaction.created_at), col(Interaction.id))
    )
    if limit is not None:
        query = query.limit(limit)
    return list(session.execute(query).scalars())


def evaluate_pending(engine: Engine, limit: int | None = None) -> dict[str, Any]:
    """Auto-evaluate pending interactions, one transaction each so one failure never loses the rest."""
    with Session(engine) as session:
        ids = pending_interaction_ids(session, limit)
    summary: dict[str, Any] = {"evaluated": 0, "matched": 0, "skipped": 0, "reasons": {}}
    for interaction_id in ids:
        with Session(engine) as session:
            try:
                row = evaluate_interaction(session, interaction_id)
                session.commit()
            except IntegrityError:
                # Another worker evaluated it first; its result stands.
                session.rollback()
                summary["skipped"] += 1
                continue
            summary["evaluated"] += 1
            if row.has_matches:
                summary["matched"] += 1
            else:
                reason = row.no_match_reason or "unknown"
                summary["reasons"][reason] = summary["reasons"].get(reason, 0) + 1
    return summary
