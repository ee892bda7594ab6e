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
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from statistics import mean
from typing import Any

import numpy as np
from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from lib import llm
from lib.config import Settings, get_settings
from lib.db import session_scope
from lib.models import AutoEval, ExpertFeedback, Interaction

log = logging.getLogger(__name__)

EMBEDDING_DIM = 256
FALLBACK_MIN_TOTAL = 90.0
FALLBACK_CANDIDATES = 5
MISSING_SENTENCE_SCORE = 100.0
DEFAULT_CITATION_SCORE = 25.0
# The citation is a quarter of the total: sentences give at most 75 (mean × 0.75), the citation 25.
MAX_CITATION_SCORE = 25.0
SENTENCE_WEIGHT = 0.75
# Vectors computed (and texts sent to an embedding server) per batch.
VECTOR_BATCH = 500
# A search sorts at most this many × limit candidates above the threshold.
SEARCH_PREFILTER = 8

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


_OFFLINE: ContextVar[bool] = ContextVar("precedents_offline", default=False)


@contextmanager
def offline() -> Iterator[None]:
    """Evaluate with the hashing embedding and without any LLM, whatever is configured (the demo
    build: deterministic, no network). The fallback then cannot pass, as with no LLM configured."""
    token = _OFFLINE.set(True)
    try:
        yield
    finally:
        _OFFLINE.reset(token)


def _llm_usable(settings: Settings) -> bool:
    return settings.llm_configured and not _OFFLINE.get()


def embed_texts(texts: Sequence[str], *, settings: Settings | None = None) -> list[list[float]]:
    """One vector per text: the configured embedding model when set, else the offline hashing one."""
    settings = settings or get_settings()
    if not texts:
        return []
    if settings.embedding_model and not _OFFLINE.get():
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


def expert_total(sentence_scores: Sequence[Mapping[str, Any]], citation_score: float | None) -> float:
    """An expert review's total: the same rule as a copy (a blank sentence score counts 100)."""
    return total_score([_copied_score(s.get("score")) for s in sentence_scores], citation_score)


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


def pack_vector(vector: Sequence[float] | np.ndarray) -> bytes:
    """A vector as stored in `Interaction.qa_vector`: little-endian float32."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack_vector(blob: bytes | None) -> np.ndarray | None:
    """The stored vector back as float32, or None when nothing (or nothing usable) is stored."""
    if not blob or len(blob) % 4:
        return None
    return np.frombuffer(blob, dtype="<f4")


def _normalised(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), so a dot product is the cosine."""
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def embedding_dim(settings: Settings | None = None) -> int:
    """The dimension vectors of the configured model have (one probe call for a server model)."""
    settings = settings or get_settings()
    if not settings.embedding_model or _OFFLINE.get():
        return EMBEDDING_DIM
    return len(embed_texts(["dimension probe"], settings=settings)[0])


def qa_vector(interaction: Interaction, dim: int) -> np.ndarray | None:
    """The interaction's stored QA vector when it has the model's dimension, else None."""
    vector = unpack_vector(interaction.qa_vector)
    return vector if vector is not None and vector.shape[0] == dim else None


def ensure_qa_vectors(*, session: Session, interactions: Sequence[Interaction], dim: int) -> None:
    """Compute (and store, on the caller's commit) QA vectors missing or of another dimension."""
    stale = [i for i in interactions if qa_vector(i, dim) is None and qa_text(i)]
    for start in range(0, len(stale), VECTOR_BATCH):
        part = stale[start : start + VECTOR_BATCH]
        for interaction, vector in zip(part, embed_texts([qa_text(i) for i in part]), strict=True):
            interaction.qa_vector = pack_vector(vector)
            session.add(interaction)


@dataclass
class PrecedentIndex:
    """Every expert-reviewed interaction's QA vector as one normalised float32 matrix.

    Loaded once per run (`load`) and shared read-only by all workers: a neighbour search is one
    matrix-vector product (numpy, BLAS, no Python loop over precedents), then only the few rows
    above the threshold are read from the database. Rows are in id order, so ties break by id.
    """

    ids: list[str]
    matrix: np.ndarray
    dim: int

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def load(cls, *, session: Session, dim: int | None = None) -> PrecedentIndex:
        """Read the vectors, computing the missing ones (stored when the caller commits)."""
        dim = embedding_dim() if dim is None else dim
        reviewed = select(ExpertFeedback.interaction_id).where(ExpertFeedback.type == "expert")
        rows = session.execute(
            select(Interaction.id, Interaction.qa_vector)
            .where(col(Interaction.id).in_(reviewed))
            .order_by(col(Interaction.id))
        ).all()
        stale_ids = [iid for iid, blob in rows if (v := unpack_vector(blob)) is None or v.shape[0] != dim]
        fresh: dict[str, bytes] = {}
        for start in range(0, len(stale_ids), VECTOR_BATCH):
            part = list(
                session.execute(
                    select(Interaction).where(
                        col(Interaction.id).in_(stale_ids[start : start + VECTOR_BATCH])
                    )
                ).scalars()
            )
            ensure_qa_vectors(session=session, interactions=part, dim=dim)
            fresh.update((i.id, i.qa_vector) for i in part if i.qa_vector is not None)
        ids: list[str] = []
        blobs: list[bytes] = []
        for iid, blob in rows:
            blob = fresh.get(iid, blob)
            if blob and len(blob) == 4 * dim:
                ids.append(iid)
                blobs.append(blob)
        matrix = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(ids), dim) if ids else None
        matrix = _normalised(matrix) if matrix is not None else np.zeros((0, dim), dtype=np.float32)
        return cls(ids, matrix, dim)

    def search(
        self, vector: np.ndarray, *, limit: int, threshold: float, exclude: str | None = None
    ) -> list[tuple[str, float]]:
        """Up to `limit` (id, cosine) at or above `threshold`, most similar first, ties by id."""
        if not self.ids or vector.shape[0] != self.dim:
            return []
        query = _normalised(vector.astype(np.float32))
        sims = (self.matrix @ query).astype(np.float64)
        rows = np.flatnonzero(sims >= threshold)
        if rows.size > SEARCH_PREFILTER * limit:
            # Only the best few can be returned; partition before sorting (boundary ties aside).
            keep = np.argpartition(-sims[rows], SEARCH_PREFILTER * limit)[: SEARCH_PREFILTER * limit]
            rows = rows[keep]
        order = rows[np.lexsort((rows, -sims[rows]))]
        out = [(self.ids[r], float(sims[r])) for r in order if self.ids[r] != exclude]
        return out[:limit]


def _latest_expert_feedback(session: Session, ids: Sequence[str]) -> dict[str, ExpertFeedback]:
    """Each given interaction's newest expert feedback (AI copies are never precedents)."""
    rows = session.execute(
        select(ExpertFeedback)
        .where(ExpertFeedback.type == "expert", col(ExpertFeedback.interaction_id).in_(list(ids)))
        .order_by(col(ExpertFeedback.created_at), col(ExpertFeedback.id))
    ).scalars()
    return {fb.interaction_id: fb for fb in rows}


def find_qa_matches(
    *,
    session: Session,
    interaction: Interaction,
    limit: int = 10,
    threshold: float | None = None,
    index: PrecedentIndex | None = None,
) -> list[QAMatch]:
    """Up to `limit` expert-reviewed neighbours at or above the QA threshold, most similar first.

    Pass the run's `index`; without one, it is loaded for this call (fine for one interaction).
    """
    threshold = get_settings().qa_threshold if threshold is None else threshold
    if index is None:
        index = PrecedentIndex.load(session=session)
    ensure_qa_vectors(session=session, interactions=[interaction], dim=index.dim)
    vector = qa_vector(interaction, index.dim)
    if vector is None:
        return []
    found = index.search(vector, limit=limit, threshold=threshold, exclude=interaction.id)
    if not found:
        return []
    ids = [iid for iid, _ in found]
    feedback = _latest_expert_feedback(session, ids)
    neighbours = {
        n.id: n for n in session.execute(select(Interaction).where(col(Interaction.id).in_(ids))).scalars()
    }
    return [
        QAMatch(neighbours[iid], feedback[iid], sim)
        for iid, sim in found
        if iid in neighbours and iid in feedback
    ]


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
    if not _llm_usable(settings):
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
            schema={
                "type": "object",
                "properties": {"index": {"type": "integer", "minimum": 0, "maximum": len(candidates) - 1}},
                "required": ["index"],
                "additionalProperties": False,
            },
            purpose="compare",
            schema_name="sentence_pick",
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
    pool_matrix = _normalised(np.asarray(embed_texts([p[0] for p in pool]), dtype=np.float64))
    sentence_matrix = _normalised(np.asarray(embed_texts(list(sentences)), dtype=np.float64))
    # One product gives every sentence × pool similarity; no Python loop over the pool.
    similarities = (
        sentence_matrix @ pool_matrix.T if pool_matrix.shape[1] == sentence_matrix.shape[1] else None
    )
    out: list[SentenceMatch] = []
    for row, sentence in enumerate(sentences):
        sims = similarities[row] if similarities is not None else np.zeros(len(pool))
        order = np.lexsort((np.arange(len(pool)), -sims))
        ranked = [(float(sims[n]), int(n)) for n in order]
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


COMPARE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"pass": {"type": "boolean"}, "reason": {"type": "string", "minLength": 8}},
    "required": ["pass", "reason"],
    "additionalProperties": False,
}


def _check_compare(reply: dict[str, Any]) -> None:
    """Refuse a compare verdict whose reason is a placeholder or echo of the shape asked for."""
    reason = str(reply.get("reason") or "").strip()
    if reason.startswith("<") or len(reason.split()) < 2:
        raise ValueError(f"the reason {reason!r} is not a sentence about the two answers")


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
        schema=COMPARE_SCHEMA,
        check=_check_compare,
        purpose="compare",
        schema_name="precedent_compare",
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
    if not _llm_usable(settings):
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
    qa_vector: bytes | None = None  # the interaction's QA vector, stored with the result
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


def _cited_review(
    interaction: Interaction,
    sentences: Sequence[str],
    matches: Sequence[SentenceMatch],
    qa_matches: Sequence[QAMatch],
    preferred: QAMatch,
    settings: Settings,
) -> tuple[QAMatch | None, list[SentenceMatch], list[str]]:
    """The one expert review to copy: its URL is the interaction's and it matches every sentence alone.

    Seed 003 checks the source URL against the expert URL of any QA match above the threshold,
    not only of the precedent most sentences came from; the scores copied must then all come
    from that one review (issue 25: sentences of one expert plus the citation of another made a
    total neither gave). Candidates are tried `preferred` first, then by similarity. Returns the
    review, its per-sentence matches, and the ids of reviews whose URL matched but which do not
    match every sentence on their own (for the trace).
    """
    partial: list[str] = []
    for m in [preferred, *(q for q in qa_matches if q is not preferred)]:
        if not citation_matches(interaction.citation_url, m.citation_url):
            continue
        if all(x.interaction_id == m.interaction.id for x in matches):
            return m, list(matches), partial  # every sentence already came from this review
        own = match_sentences(sentences, [m], settings.sentence_threshold, _llm_chooser(settings))
        if len(own) == len(sentences) and all(x.best_match for x in own):
            return m, own, partial
        partial.append(m.interaction.id)
    return None, [], partial


def decide(
    *,
    session: Session,
    interaction: Interaction,
    force_fallback: bool = False,
    index: PrecedentIndex | None = None,
    settings: Settings | None = None,
) -> Outcome:
    """Seed 003's flow diagram for one interaction; reads the database, never writes it.

    `index` is the run's precedent index (loaded here when not given). Vectors computed on the
    way are set on the session's objects but only written by `store`.
    """
    # Computed vectors stay pending on the objects: no autoflush may turn a read into a write.
    with session.no_autoflush:
        return _decide(session, interaction, force_fallback, index, settings or get_settings())


def _decide(
    session: Session,
    interaction: Interaction,
    force_fallback: bool,
    index: PrecedentIndex | None,
    settings: Settings,
) -> Outcome:
    iid = interaction.id
    trace: dict[str, Any] = {"qa_matches": [], "sentences": [], "citation": {}}
    if force_fallback:
        trace["forced_fallback"] = True
    try:
        qa_matches = find_qa_matches(
            session=session, interaction=interaction, threshold=settings.qa_threshold, index=index
        )
    except (llm.LLMError, llm.LLMNotConfigured) as exc:
        return Outcome(iid, NO_EMBEDDINGS, {"error": f"embedding failed: {exc}"})
    if not interaction.qa_vector:
        return Outcome(iid, NO_EMBEDDINGS, {"error": "the interaction has no text to embed"})
    embedding = interaction.qa_vector
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

    partial: list[str] = []
    if all_matched:
        # Sentences matched across the QA matches; the scores come from one review with the URL.
        preferred = _precedent_of(matches, qa_matches)
        cited, own, partial = _cited_review(interaction, sentences, matches, qa_matches, preferred, settings)
        if cited is not None:
            trace["sentences"] = [m.as_trace() for m in own]
    else:
        chosen, fallback_trace = _run_fallback(interaction, qa_matches, settings)
        trace["fallback"] = fallback_trace
        if chosen is None:
            reason = FORCED_FALLBACK_NO_MATCH if force_fallback else NO_SENTENCE_MATCH
            return Outcome(iid, reason, trace, embedding)
        preferred = cited = chosen  # the fallback's candidates have the interaction's URL
        # Each sentence takes the score of its nearest sentence in the approved precedent.
        own = match_sentences(sentences, [chosen], threshold=-1.0)
        trace["sentences"] = [m.as_trace() for m in own]

    trace["citation"] = {
        "expected": (cited or preferred).citation_url,
        "actual": interaction.citation_url,
        "match": cited is not None,
        "interaction_id": cited.interaction.id if cited else None,
        "accepted": sorted({m.citation_url or "" for m in qa_matches}),
    }
    if partial:
        # Reviews with the interaction's URL that do not cover every sentence: not copied from.
        trace["citation"]["not_every_sentence"] = partial
    if cited is None:
        return Outcome(iid, NO_CITATION_MATCH, trace, embedding)

    scores = [_copied_score(m.score) for m in own]
    citation_score = cited.feedback.citation_score
    citation_score = DEFAULT_CITATION_SCORE if citation_score is None else float(citation_score)
    return Outcome(
        iid,
        None,
        trace,
        embedding,
        matched_interaction_id=cited.interaction.id,
        total=total_score(scores, citation_score),
        citation_score=citation_score,
        citation_url=interaction.citation_url,
        sentence_scores=[{"sentence": s, "score": v} for s, v in zip(sentences, scores, strict=True)],
    )


def failed_outcome(interaction_id: str, error: BaseException | str) -> Outcome:
    """The outcome of an evaluation that raised: stored so the interaction never stays silent."""
    return Outcome(interaction_id, EVALUATION_ERROR, {"error": str(error)[:2000]}, processed=False)


def store(*, session: Session, outcome: Outcome) -> AutoEval:
    """Write one outcome: the AutoEval row and, for a match, the copied `type='ai'` feedback."""
    if outcome.qa_vector is not None:
        interaction = session.get(Interaction, outcome.interaction_id)
        if interaction is not None and interaction.qa_vector != outcome.qa_vector:
            interaction.qa_vector = outcome.qa_vector
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


def evaluate_interaction(
    session: Session,
    interaction_id: str,
    *,
    force_fallback: bool = False,
    index: PrecedentIndex | None = None,
) -> AutoEval:
    """Auto-evaluate one interaction by precedent; an already evaluated one is returned unchanged."""
    existing = _existing_auto_eval(session, interaction_id)
    if existing is not None:
        return existing
    interaction = session.get(Interaction, interaction_id)
    if interaction is None:
        raise LookupError(f"No interaction with id {interaction_id!r}")
    outcome = decide(session=session, interaction=interaction, force_fallback=force_fallback, index=index)
    return store(session=session, outcome=outcome)


# ---------------------------------------------------------------------------------------------
# Runs: which interactions, a worker pool, a summary


@dataclass
class RunSummary:
    """What one run did: how many were evaluated and matched, and a count per no-match reason."""

    evaluated: int = 0
    matched: int = 0
    skipped: int = 0  # already evaluated (by another run) when its worker got to it
    reasons: dict[str, int] = field(default_factory=dict)
    deleted: int = 0  # auto-evaluations removed first by --redo
    not_stored: int = 0  # the database refused the result and the error row: still pending

    def add(self, row: AutoEval | str | None) -> None:
        if row is None:
            self.skipped += 1
            return
        if isinstance(row, str):  # NOT_STORED: the database refused even the error row
            self.not_stored += 1
            return
        self.evaluated += 1
        if row.has_matches:
            self.matched += 1
        else:
            reason = row.no_match_reason or "unknown"
            self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "evaluated": self.evaluated,
            "matched": self.matched,
            "skipped": self.skipped,
            "reasons": self.reasons,
        }

    def short(self) -> str:
        """One clause: how many were evaluated, matched, and why the others were not."""
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(self.reasons.items()))
        return f"{self.evaluated}: {self.matched} matched" + (f", {reasons}" if reasons else "")

    def lines(self) -> list[str]:
        """The operator's summary: totals, then one line per no-match reason."""
        out = []
        if self.deleted:
            out.append(f"deleted {self.deleted} earlier auto-evaluations")
        out.append(
            f"evaluated {self.evaluated} interactions: {self.matched} matched, "
            f"{self.evaluated - self.matched} without a match, {self.skipped} already evaluated"
        )
        out.extend(f"  {reason}: {count}" for reason, count in sorted(self.reasons.items()))
        if self.not_stored:
            out.append(f"{self.not_stored} results could not be stored (see the log); they stay pending")
        return out


# What a worker returns when not even the error row could be stored (the database is gone).
NOT_STORED = "not stored"

# Called after each interaction with (done, total), in the caller's thread.
Progress = Callable[[int, int], None]


def _window(query: Any, since: datetime | None, product: str | None) -> Any:
    if since is not None:
        query = query.where(col(Interaction.created_at) >= since)
    if product:
        query = query.where(Interaction.product == product)
    return query


def pending_interaction_ids(
    *,
    session: Session,
    limit: int | None = None,
    since: datetime | None = None,
    product: str | None = None,
    ids: Sequence[str] | None = None,
) -> list[str]:
    """Interactions with neither an auto-evaluation nor an expert review, oldest first."""
    evaluated = select(AutoEval.interaction_id)
    reviewed = select(ExpertFeedback.interaction_id).where(ExpertFeedback.type == "expert")
    query = _window(
        select(Interaction.id).where(
            col(Interaction.id).not_in(evaluated), col(Interaction.id).not_in(reviewed)
        ),
        since,
        product,
    ).order_by(col(Interaction.created_at), col(Interaction.id))
    if ids is not None:
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            found.update(
                session.execute(
                    query.where(col(Interaction.id).in_(list(ids[start : start + 500])))
                ).scalars()
            )
        ordered = [i for i in dict.fromkeys(ids) if i in found]
        return ordered[:limit] if limit is not None else ordered
    if limit is not None:
        query = query.limit(limit)
    return list(session.execute(query).scalars())


def delete_auto_evals(*, session: Session, since: datetime | None = None, product: str | None = None) -> int:
    """Remove the window's auto-evaluations and their `type='ai'` feedback (the seed's deleteEvaluations)."""
    in_window = _window(select(Interaction.id), since, product)
    rows = list(
        session.execute(select(AutoEval).where(col(AutoEval.interaction_id).in_(in_window))).scalars()
    )
    feedback_ids = [r.expert_feedback_id for r in rows if r.expert_feedback_id is not None]
    for row in rows:
        session.delete(row)
    session.flush()
    for start in range(0, len(feedback_ids), 500):
        session.execute(
            delete(ExpertFeedback).where(
                col(ExpertFeedback.id).in_(feedback_ids[start : start + 500]), ExpertFeedback.type == "ai"
            )
        )
    # AI copies left without their AutoEval (an interrupted run) go too: nothing else points at them.
    session.execute(
        delete(ExpertFeedback).where(
            ExpertFeedback.type == "ai",
            col(ExpertFeedback.interaction_id).in_(in_window),
            col(ExpertFeedback.id).not_in(
                select(AutoEval.expert_feedback_id).where(col(AutoEval.expert_feedback_id).is_not(None))
            ),
        )
    )
    return len(rows)


def load_index(engine: Engine) -> PrecedentIndex:
    """The run's precedent index; vectors missing from precedents are computed and stored once."""
    with session_scope(engine) as session:
        return PrecedentIndex.load(session=session)


def _evaluate_one(
    engine: Engine, interaction_id: str, force_fallback: bool, index: PrecedentIndex | None
) -> AutoEval | str | None:
    """One worker's job: decide in a read-only transaction, store in a short write one.

    Never raises: an evaluation that fails still ends with an AutoEval row (`evaluation_error`),
    so one bad interaction never stops the others and never stays silently pending.
    None means another run evaluated it first; NOT_STORED that the database refused both rows.
    """
    try:
        with session_scope(engine, read_only=True) as session:
            if _existing_auto_eval(session, interaction_id) is not None:
                return None
            interaction = session.get(Interaction, interaction_id)
            if interaction is None:
                raise LookupError(f"No interaction with id {interaction_id!r}")
            if index is None:
                outcome = Outcome(
                    interaction_id, NO_EMBEDDINGS, {"error": "the precedent index could not be built"}
                )
            else:
                outcome = decide(
                    session=session, interaction=interaction, force_fallback=force_fallback, index=index
                )
            # Vectors computed while deciding travel in the outcome; this transaction writes nothing.
            session.rollback()
    except Exception as exc:  # any failure is recorded on the interaction, never lost
        log.exception("auto-evaluation of %s failed", interaction_id)
        outcome = failed_outcome(interaction_id, f"{type(exc).__name__}: {exc}")
    for attempt in (outcome, failed_outcome(interaction_id, "the result could not be stored")):
        try:
            with session_scope(engine) as session:
                if _existing_auto_eval(session, interaction_id) is not None:
                    return None
                return store(session=session, outcome=attempt)
        except IntegrityError:
            return None  # another worker stored it between the check and the insert
        except Exception:  # try the error row once, then give up on this one
            log.exception("storing the auto-evaluation of %s failed", interaction_id)
    return NOT_STORED


def evaluate_ids(
    engine: Engine,
    ids: Sequence[str],
    *,
    concurrency: int | None = None,
    force_fallback: bool = False,
    progress: Progress | None = None,
    index: PrecedentIndex | None = None,
) -> RunSummary:
    """Evaluate `ids` through a pool of `concurrency` workers (seed 003's Piscina pool).

    Default `OVERRULE_EVAL_CONCURRENCY` (CPUs − 1, at least 1); 0 runs serially in the caller (the
    seed's "Vercel" mode). Workers are threads sharing one read-only precedent index: the work is
    database reads, numpy products and LLM calls, which release the GIL.
    """
    summary = RunSummary()
    if not ids:
        return summary
    workers = get_settings().eval_concurrency if concurrency is None else concurrency
    if index is None:
        try:
            index = load_index(engine)
        except (llm.LLMError, llm.LLMNotConfigured):
            log.exception("cannot build the precedent index: every interaction gets no_embeddings")
    done = 0
    if workers <= 0:
        for interaction_id in ids:
            summary.add(_evaluate_one(engine, interaction_id, force_fallback, index))
            done += 1
            if progress:
                progress(done, len(ids))
        return summary
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="auto-eval") as pool:
        futures = [pool.submit(_evaluate_one, engine, i, force_fallback, index) for i in ids]
        for future in as_completed(futures):
            summary.add(future.result())
            done += 1
            if progress:
                progress(done, len(ids))
    return summary


def auto_evaluate(
    engine: Engine,
    *,
    since: datetime | None = None,
    product: str | None = None,
    limit: int | None = None,
    concurrency: int | None = None,
    redo: bool = False,
    force_fallback: bool = False,
    progress: Progress | None = None,
) -> RunSummary:
    """The operator's run (seed `processEvaluationsForDuration`): what is pending in the window.

    `redo` first deletes the window's auto-evaluations (and their AI feedback), then runs again.
    """
    deleted = 0
    if redo:
        with session_scope(engine) as session:
            deleted = delete_auto_evals(session=session, since=since, product=product)
    with session_scope(engine, read_only=True) as session:
        ids = pending_interaction_ids(session=session, limit=limit, since=since, product=product)
    summary = evaluate_ids(
        engine, ids, concurrency=concurrency, force_fallback=force_fallback, progress=progress
    )
    summary.deleted = deleted
    return summary


def evaluate_new(engine: Engine, ids: Sequence[str], *, progress: Progress | None = None) -> RunSummary:
    """The trigger: of freshly stored interactions, evaluate those not reviewed and not evaluated."""
    with session_scope(engine, read_only=True) as session:
        pending = pending_interaction_ids(session=session, ids=ids)
    return evaluate_ids(engine, pending, progress=progress)


def evaluate_pending(engine: Engine, limit: int | None = None) -> dict[str, Any]:
    """Auto-evaluate pending interactions (every window); the summary as a plain dict."""
    return auto_evaluate(engine, limit=limit).as_dict()
