"""The judge pipeline (seed 002 AD-1, AD-7, AD-8): Stage 1 scores and evidence, Stage 2 mentoring.

Stage 1 reads the question and the model answer blind (the reviewer's scores are never in its
prompt, AD-1) and returns, per metric of the product's rubric, a score on that metric's scale or
null, a rationale, a confidence and 1–3 evidence quotes. Its prompt carries the product's
correction history (seed 004 selection) and a marked place for cross-session notes.

Stage 2 compares the reviewer's scores with the judge's and writes the mentoring feedback; the
weighted gap and the judge meta score are computed here, in code (SPEC §5), never asked of the LLM.

Atomic write (AD-7): the snapshot and its judgments are written in one transaction, and only when
both stages succeeded; any failure raises `JudgeFailed` naming the stage, and nothing is written.
Stage 1 may call the note tools (`lib.judge_tools`: add, search, clear); the notes it adds are
buffered and written after the snapshot, in their own transaction, so a failed run leaves none.
Evidence that cannot be parsed degrades to "no evidence" with a logged warning while the scores are
kept (AD-8). A score outside its metric's scale, by contrast, fails Stage 1: storing it would put an
impossible number in the data, and turning it into null would make the judge look as if it had
abstained, which it did not.

Small local models (issue 18): both stages send a JSON schema built from the rubric
(`stage1_schema`, `stage2_schema`) through `lib.llm`'s per-server negotiation, with reply caps
`OVERRULE_MAX_TOKENS_JUDGE` / `_MENTOR`. Well-shaped but weak replies (placeholder quotes, reasons
under three words, note lines copied into a reason) are refused by `check_stage1_reply` and get
one repair turn. The Stage 1 prompt is fitted to `OVERRULE_CONTEXT_TOKENS` (`fit_stage1_prompt`:
oldest history first, then the least relevant notes), and what was left out is said.

LLM calls are slow, so `judge_evaluation` takes the engine and opens its own short sessions: one to
read the rubric and history, one to write. Holding a transaction open across an LLM call would keep
SQLite's write lock (or a PostgreSQL connection) for the whole call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from lib import judge_tools, judge_versions, llm, notes, relevance
from lib.auth import Actor, Permission, authorize, identity_of
from lib.config import Settings, env_name, get_settings
from lib.corrections import format_history_for_prompt, format_score, parse_score, select_history
from lib.db import session_scope
from lib.evidence import items_of, verify_evidence_item
from lib.judge_versions import JudgeConfig, VersionError
from lib.metrics import MetricSpec, judge_meta_score, metric_gaps, metrics_for_product, weighted_gap
from lib.models import EvaluationSnapshot, JudgeVersion, Judgment, SessionNote, new_prefixed_id
from lib.records import ImportFailed
from lib.snapshots import build_snapshot_rows, source_key_of

log = logging.getLogger(__name__)

MAX_EVIDENCE_PER_METRIC = 3
STAGE_LABELS: dict[str, str] = {
    "input": "Checking the input",
    "configuration": "LLM configuration",
    "stage1": "The judge's scoring",
    "stage2": "Mentor feedback",
    "save": "Saving the snapshot",
}
NOTES_PLACEHOLDER = "No cross-session notes for this run."
EVIDENCE_PARSE_WARNING = "Evidence parse failed for eval %s, continuing without evidence"
_NULL_WORDS = frozenset({"", "null", "none", "n/a", "na", "-"})
_MAX_LINE_BYTES = 10 * 1024 * 1024
# Column widths of the snapshot table, checked before any LLM call rather than at the write.
_TEXT_LIMITS = {"product": 200, "model_name": 200, "category": 200, "language": 16, "question_id": 128}


class JudgeFailed(Exception):
    """The judge could not produce a snapshot; names the stage, says why, and that nothing was saved."""

    def __init__(self, stage: str, reason: str, *, kind: str | None = None) -> None:
        self.stage = stage
        self.reason = reason
        self.kind = kind
        label = STAGE_LABELS.get(stage, stage)
        super().__init__(f"{label} failed: {reason.rstrip('.')}. Nothing was saved.")


class AlreadyJudged(JudgeFailed):
    """This answer is already an evaluation of the product (same source key as the importer's)."""

    def __init__(self, snapshot_id: str) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(
            "input",
            f"this question and answer (same product and model) are already evaluation {snapshot_id}",
            kind="duplicate",
        )


# ---------------------------------------------------------------------------------------------
# Input


@dataclass(frozen=True)
class EvaluationInput:
    """What a judge run is asked to evaluate, as a reviewer or a JSONL line gives it."""

    question: str
    model_answer: str
    product: str
    language: str = "en"
    model_name: str | None = None
    category: str | None = None
    question_id: str | None = None
    primary_metric: str | None = None
    bonus_metrics: tuple[str, ...] = ()
    # {metric slug or display name: number | {"score": number | None, "reason": str}}
    user_scores: Mapping[str, Any] = field(default_factory=dict)

    @property
    def source_key(self) -> str:
        """The importer's identity of this evaluation: reruns and imports of it are recognised."""
        return source_key_of(self.product, self.question, self.model_answer, self.model_name)

    @classmethod
    def from_record(cls, record: Any) -> EvaluationInput:
        """A JSONL record (the import format's field names) as input; ValueError names the field."""
        if not isinstance(record, Mapping):
            raise ValueError("expected a JSON object")

        def text(name: str, *, required: bool = False) -> str | None:
            value = record.get(name)
            if value is None:
                if required:
                    raise ValueError(f"field {name!r} is required")
                return None
            if isinstance(value, int) and not isinstance(value, bool) and name == "question_id":
                value = str(value)
            if not isinstance(value, str):
                raise ValueError(f"field {name!r} must be a string")
            if required and not value.strip():
                raise ValueError(f"field {name!r} must not be empty")
            return value

        bonus = record.get("bonus_metrics") or []
        if not isinstance(bonus, list) or not all(isinstance(b, str) for b in bonus):
            raise ValueError("field 'bonus_metrics' must be a list of metric names")
        scores = record.get("user_scores") or {}
        if not isinstance(scores, Mapping):
            raise ValueError("field 'user_scores' must be an object of {metric: score}")
        return cls(
            question=text("question", required=True) or "",
            model_answer=text("model_answer", required=True) or "",
            product=(text("product", required=True) or "").strip(),
            language=(text("language") or "en").strip() or "en",
            model_name=text("model_name"),
            category=text("category"),
            question_id=text("question_id"),
            primary_metric=text("primary_metric"),
            bonus_metrics=tuple(bonus),
            user_scores=dict(scores),
        )


def blind_input(snapshot: EvaluationSnapshot) -> EvaluationInput:
    """A stored evaluation as the judge is asked it again (a re-judge, an alignment-lab arm): no user
    scores, since the judge is blind to the reviewer."""
    return EvaluationInput(
        question=snapshot.question,
        model_answer=snapshot.model_answer,
        product=snapshot.product,
        language=snapshot.language,
        model_name=snapshot.model_name,
        category=snapshot.category,
        question_id=snapshot.question_id,
        primary_metric=snapshot.primary_metric,
        bonus_metrics=tuple(snapshot.bonus_metrics or ()),
    )


@dataclass(frozen=True)
class PreparedInput:
    """An input checked against the product's rubric: slugs resolved, user scores on their scales."""

    evaluation: EvaluationInput
    metrics: tuple[MetricSpec, ...]
    primary_metric: str
    bonus_metrics: tuple[str, ...]
    user_scores: dict[str, dict[str, Any]]  # {slug: {"score": float | None, "reason": str | None}}


def _resolve(key: Any, metrics: Sequence[MetricSpec], label: str, product: str) -> str:
    if isinstance(key, str):
        for spec in metrics:
            if key.strip() in (spec.slug, spec.display_name):
                return spec.slug
    known = ", ".join(m.slug for m in metrics)
    raise ValueError(f"{label}: metric {key!r} is not defined for product {product!r} (known: {known})")


def prepare_input(evaluation: EvaluationInput, metrics: Sequence[MetricSpec]) -> PreparedInput:
    """Check an input against the rubric before any LLM call; ValueError says what to fix."""
    if not evaluation.question.strip():
        raise ValueError("the question is empty")
    if not evaluation.model_answer.strip():
        raise ValueError("the model answer is empty")
    if not evaluation.product.strip():
        raise ValueError("the product is empty")
    if not metrics:
        raise ValueError(f"product {evaluation.product!r} has no metrics")
    for name in ("question", "model_answer", *_TEXT_LIMITS):
        if "\x00" in (getattr(evaluation, name) or ""):
            raise ValueError(f"the {name.replace('_', ' ')} contains a NUL character, which cannot be stored")
    for name, limit in _TEXT_LIMITS.items():
        value = getattr(evaluation, name)
        if value is not None and len(value) > limit:
            raise ValueError(f"the {name.replace('_', ' ')} is {len(value)} characters long; at most {limit}")
    product = evaluation.product
    # The importer makes the first rubric metric primary when none is named; so does the judge.
    primary = (
        _resolve(evaluation.primary_metric, metrics, "primary_metric", product)
        if evaluation.primary_metric
        else metrics[0].slug
    )
    bonus: list[str] = []
    for key in evaluation.bonus_metrics:
        slug = _resolve(key, metrics, "bonus_metrics", product)
        if slug != primary and slug not in bonus:
            bonus.append(slug)
    user: dict[str, dict[str, Any]] = {}
    for key, value in evaluation.user_scores.items():
        slug = _resolve(key, metrics, "user_scores", product)
        spec = next(m for m in metrics if m.slug == slug)
        reason = None
        if isinstance(value, Mapping):
            reason = value.get("reason")
            if reason is not None and not isinstance(reason, str):
                raise ValueError(f"user_scores.{key}: the reason must be text")
            value = value.get("score")
        if value is None:
            if reason:
                user[slug] = {"score": None, "reason": reason}
            continue
        number = parse_score(value)
        if number is None:
            raise ValueError(f"user_scores.{key}: {value!r} is not a number")
        try:
            spec.validate(number)
        except ValueError as exc:
            raise ValueError(f"user_scores.{key}: {exc}") from None
        user[slug] = {"score": int(number) if number.is_integer() else number, "reason": reason or None}
    return PreparedInput(evaluation, tuple(metrics), primary, tuple(bonus), user)


# ---------------------------------------------------------------------------------------------
# Stage 1: independent evaluation + evidence (blind to the reviewer's scores)

STAGE1_SYSTEM = """You are an impartial evaluation judge (Stage 1: independent evaluation).
Read the question and the model answer and score the answer on every metric of the rubric, each on
its own scale. You judge independently: you are not shown anyone else's scores.

For every metric give:
- "score": a number on that metric's scale, or null when the metric cannot be judged for this answer;
- "confidence": how sure you are of the score, from 0 to 1;
- "rationale": one or two sentences explaining the score with reference to the rubric.

For every metric also give 1 to 3 evidence items from the model answer:
- "quote": a span copied VERBATIM from the model answer (same characters, same spacing);
- "start" and "end": the character positions of the quote in the model answer (0-based, end exclusive);
- "why": why this span matters for the metric, in terms of the rubric (short);
- "better": a concrete fix (an example sentence or a short rewrite).
Evidence may be an empty list [] for a metric whose score is null.
Use the reviewer corrections in the history below: they show where earlier judgments were wrong.
Write rationale, why and better in the language of the answer ({language})."""

STAGE1_OUTPUT = """Reply with one JSON object exactly in this shape (metric keys are the slugs above):
{{
  "independent_scores": {{"<slug>": {{"score": <number or null>, "confidence": <0-1>, "rationale": "<text>"}}}},
  "evidence": {{"<slug>": [{{"quote": "<verbatim>", "start": <int>, "end": <int>, "why": "<text>", "better": "<text>"}}]}}
}}
Include every metric of the rubric: {slugs}."""


def rubric_block(metrics: Sequence[MetricSpec]) -> str:
    """The rubric as the judge sees it: slug, display name, scale and rubric text per metric."""
    lines = []
    for spec in metrics:
        kind = "whole numbers" if spec.integer_scale else "any number in the range"
        line = f"- {spec.slug} ({spec.display_name}) — scale {spec.scale_label()}, {kind}"
        if spec.description.strip():
            line += f": {' '.join(spec.description.split())}"
        lines.append(line)
    return "\n".join(lines)


def _delimited(name: str, body: str) -> str:
    """Untrusted text between unmistakable markers, so it cannot pose as instructions."""
    return f"<<<{name}\n{body}\n{name}>>>"


def build_stage1_messages(
    prepared: PreparedInput, *, history_block: str, notes_block: str | None = None
) -> list[dict[str, str]]:
    """The Stage 1 prompt: rubric, history, notes, question and answer; never the reviewer's scores."""
    ev = prepared.evaluation
    slugs = ", ".join(m.slug for m in prepared.metrics)
    context = [f"Product: {ev.product}", f"Language: {ev.language}"]
    if ev.category:
        context.append(f"Category: {ev.category}")
    if ev.model_name:
        context.append(f"Answering model: {ev.model_name}")
    user = "\n\n".join(
        [
            "\n".join(context),
            "## Rubric\n" + rubric_block(prepared.metrics),
            "## Correction history for this product\n" + (history_block.strip() or "(none)"),
            # The notes integration fills this section (lib.notes.format_notes_for_prompt).
            "## Cross-session notes\n" + ((notes_block or "").strip() or NOTES_PLACEHOLDER),
            "## Question\n" + _delimited("QUESTION", ev.question),
            "## Model answer (character positions count from the first character after the marker line)\n"
            + _delimited("ANSWER", ev.model_answer),
            STAGE1_OUTPUT.format(slugs=slugs),
        ]
    )
    return [
        {"role": "system", "content": STAGE1_SYSTEM.format(language=ev.language)},
        {"role": "user", "content": user},
    ]


@dataclass(frozen=True)
class MetricJudgment:
    """The judge's verdict on one metric."""

    score: float | None
    rationale: str | None
    confidence: float | None


@dataclass(frozen=True)
class Stage1Result:
    """Scores for every rubric metric; evidence as the judge wrote it, or None when it was unusable."""

    scores: dict[str, MetricJudgment]
    evidence: dict[str, list[dict[str, Any]]] | None
    evidence_problem: str | None = None
    # Notes the judge added through its note tools, written only once the snapshot is saved (AD-7).
    pending_notes: judge_tools.PendingNotes | None = None

    @property
    def judge_scores(self) -> dict[str, dict[str, Any]]:
        """{slug: {"score", "reason"}}: the stored shape of judge_scores_json."""
        return {
            slug: {"score": _plain_number(j.score), "reason": j.rationale} for slug, j in self.scores.items()
        }


def _plain_number(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def _coerce_score(raw: Any, spec: MetricSpec) -> float | None:
    """A judge's score as a number on the metric's scale, None for null; ValueError otherwise."""
    if isinstance(raw, Mapping):
        raw = raw.get("score")
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in _NULL_WORDS):
        return None
    number = parse_score(raw.strip() if isinstance(raw, str) else raw)
    if number is None:
        raise ValueError(f"the score for {spec.slug!r} is {raw!r}, not a number")
    return spec.validate(number)


def _coerce_confidence(raw: Any) -> float | None:
    """0–1; a value above 1 is read as a percentage, anything unusable as unknown."""
    number = parse_score(raw)
    if number is None or number < 0:
        return None
    if number > 1:
        number /= 100.0
    return round(min(1.0, number), 4)


def _rationale(entry: Any) -> str | None:
    if not isinstance(entry, Mapping):
        return None
    for key in ("rationale", "reason", "reasoning", "judge_reason"):
        value = entry.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip().replace("\x00", "")
    return None


def _metric_lookup(metrics: Sequence[MetricSpec]) -> dict[str, str]:
    return {m.display_name: m.slug for m in metrics} | {m.slug: m.slug for m in metrics}


def _position(value: Any) -> int | None:
    number = parse_score(value)
    if number is None or not number.is_integer() or number < 0:
        return None
    return int(number)


def _clean_evidence_item(item: Any) -> dict[str, Any] | None:
    """One evidence item reduced to the seed's fields, or None when it has no quote to check."""
    if not isinstance(item, Mapping):
        return None
    quote = item.get("quote")
    if not isinstance(quote, str) or not quote.strip() or "\x00" in quote:
        return None
    cleaned: dict[str, Any] = {
        "quote": quote,
        "start": _position(item.get("start")),
        "end": _position(item.get("end")),
    }
    for key in ("why", "better"):
        value = item.get(key)
        cleaned[key] = value.replace("\x00", "") if isinstance(value, str) else None
    return cleaned


def parse_stage1_evidence(
    raw: Any, metrics: Sequence[MetricSpec]
) -> tuple[dict[str, list[dict[str, Any]]] | None, str | None, int]:
    """(evidence per slug, problem, items dropped); evidence None when the block is unusable (AD-8)."""
    if raw is None:
        return None, "the reply has no evidence block", 0
    if isinstance(raw, str):
        try:
            raw = llm.parse_json_loose(raw)
        except llm.LLMError:
            return None, "the evidence block is text that is not JSON", 0
    if not isinstance(raw, Mapping):
        return None, f"the evidence block is {type(raw).__name__}, not an object", 0
    lookup = _metric_lookup(metrics)
    out: dict[str, list[dict[str, Any]]] = {}
    dropped = 0
    for key, value in raw.items():
        slug = lookup.get(str(key).strip())
        if slug is None:
            continue  # a metric the rubric does not define: nothing to attach it to
        value = items_of(value)
        if value is None:
            dropped += 1
            continue
        items = [_clean_evidence_item(item) for item in value]
        kept = [i for i in items if i is not None]
        dropped += len(items) - len(kept) + max(0, len(kept) - MAX_EVIDENCE_PER_METRIC)
        out[slug] = kept[:MAX_EVIDENCE_PER_METRIC]
    if dropped and not any(out.values()):
        return None, "no evidence item in the block could be read", dropped
    return out, None, dropped


def parse_stage1_response(data: Mapping[str, Any], metrics: Sequence[MetricSpec]) -> Stage1Result:
    """Scores (validated on each metric's scale) and evidence from a Stage 1 reply; ValueError if unusable."""
    raw_scores = data.get("independent_scores")
    if raw_scores is None:
        raw_scores = data.get("scores", data.get("judge_scores"))
    if not isinstance(raw_scores, Mapping):
        raise ValueError("the reply has no 'independent_scores' object")
    lookup = _metric_lookup(metrics)
    by_slug: dict[str, Any] = {}
    for key, entry in raw_scores.items():
        slug = lookup.get(str(key).strip())
        if slug is None:
            log.info("judge scored %r, which the rubric does not define; ignored", key)
            continue
        by_slug[slug] = entry
    scores: dict[str, MetricJudgment] = {}
    for spec in metrics:
        entry = by_slug.get(spec.slug)
        # A metric the reply leaves out is one the judge did not score: null, like an explicit null.
        score = _coerce_score(entry, spec)
        confidence = _coerce_confidence(entry.get("confidence")) if isinstance(entry, Mapping) else None
        scores[spec.slug] = MetricJudgment(score=score, rationale=_rationale(entry), confidence=confidence)
    if all(j.score is None for j in scores.values()):
        raise ValueError("the judge scored none of the metrics")
    evidence, problem, dropped = parse_stage1_evidence(data.get("evidence"), metrics)
    if dropped and evidence is not None:
        log.info("dropped %d unreadable or surplus evidence items", dropped)
    return Stage1Result(scores=scores, evidence=evidence, evidence_problem=problem)


# Weak-but-well-shaped output (issue 18) is refused, so a small model's template echo or one-word
# reason gets a repair turn instead of being saved as a judgment.
MIN_REASON_CHARS = 12
MIN_REASON_WORDS = 3
_PLACEHOLDER_RE = re.compile(r"^\s*(<[^<>\n]{0,40}>|\.{2,}|…+|\[[^\[\]\n]{0,40}\])\s*$")
# A note line as `lib.notes.format_note_line` writes it: the judge copied its notes, not judged.
_NOTE_LINE_RE = re.compile(r"\[(?:SESSION: |CURRENT SESSION\])|\b[A-Z]{3,8} \(\d+\w* ago\): ")


def _score_schema(spec: MetricSpec) -> dict[str, Any]:
    low, high = float(spec.min_value), float(spec.max_value)
    if spec.integer_scale and low.is_integer() and high.is_integer() and high - low <= 100:
        return {"enum": [*range(int(low), int(high) + 1), None]}
    return {"type": ["number", "null"], "minimum": low, "maximum": high}


def _text_schema(min_chars: int = MIN_REASON_CHARS) -> dict[str, Any]:
    return {"type": "string", "minLength": min_chars}


def stage1_schema(metrics: Sequence[MetricSpec]) -> dict[str, Any]:
    """The JSON schema of a Stage 1 reply, from the rubric: each metric's scale, reasons, ≤ 3 evidence items."""
    slugs = [m.slug for m in metrics]
    evidence_item = {
        "type": "object",
        "properties": {
            "quote": {"type": "string", "minLength": 3},
            "start": {"type": "integer", "minimum": 0},
            "end": {"type": "integer", "minimum": 0},
            "why": _text_schema(),
            "better": _text_schema(),
        },
        "required": ["quote", "start", "end", "why", "better"],
        "additionalProperties": False,
    }
    scores = {
        m.slug: {
            "type": "object",
            "properties": {
                "score": _score_schema(m),
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "rationale": _text_schema(),
            },
            "required": ["score", "confidence", "rationale"],
            "additionalProperties": False,
        }
        for m in metrics
    }
    evidence = {
        slug: {"type": "array", "items": evidence_item, "maxItems": MAX_EVIDENCE_PER_METRIC} for slug in slugs
    }
    return {
        "type": "object",
        "properties": {
            "independent_scores": {
                "type": "object",
                "properties": scores,
                "required": slugs,
                "additionalProperties": False,
            },
            "evidence": {
                "type": "object",
                "properties": evidence,
                "required": slugs,
                "additionalProperties": False,
            },
        },
        "required": ["independent_scores", "evidence"],
        "additionalProperties": False,
    }


def weak_text_problem(label: str, value: str | None, *, min_words: int = MIN_REASON_WORDS) -> str | None:
    """Why a reason is too weak to store (placeholder, echoed note, too short), or None."""
    if value is None or not value.strip():
        return f"{label} is empty"
    if _PLACEHOLDER_RE.match(value):
        return f"{label} is the placeholder {value.strip()!r}, not a reason"
    if _NOTE_LINE_RE.search(value):
        return f"{label} copies a cross-session note line instead of judging the answer"
    if len(value.strip()) < MIN_REASON_CHARS or len(value.split()) < min_words:
        return (
            f"{label} {value.strip()!r} is too short "
            f"(at least {min_words} words and {MIN_REASON_CHARS} characters)"
        )
    return None


def check_stage1_reply(data: Mapping[str, Any], metrics: Sequence[MetricSpec]) -> Stage1Result:
    """`parse_stage1_response` plus the refusal of weak output; ValueError names what to fix."""
    result = parse_stage1_response(data, metrics)
    problems = [
        weak_text_problem(f"the rationale for {slug!r}", j.rationale)
        for slug, j in result.scores.items()
        if j.score is not None
    ]
    for slug, items in (result.evidence or {}).items():
        for n, item in enumerate(items, start=1):
            quote = str(item.get("quote") or "")
            if _PLACEHOLDER_RE.match(quote):
                problems.append(
                    f"evidence {n} for {slug!r} quotes the placeholder {quote.strip()!r}; "
                    "copy a span of the model answer"
                )
            elif _NOTE_LINE_RE.search(quote):
                problems.append(
                    f"evidence {n} for {slug!r} quotes a cross-session note, not the model answer"
                )
    found = [p for p in problems if p]
    if found:
        raise ValueError("; ".join(found[:4]))
    return result


def run_stage1(
    prepared: PreparedInput,
    *,
    history_block: str,
    notes_block: str | None = None,
    settings: Settings | None = None,
    eval_id: str = "?",
    engine: Engine | None = None,
    acting_for: Actor | None = None,
) -> Stage1Result:
    """Ask the judge model for scores and evidence; JudgeFailed("stage1") when that cannot be had.

    With an `engine`, the judge may call the note tools (seed 000) before answering; the notes it
    adds carry `eval_id` as their session id and come back in `pending_notes`, unsaved. Its
    CLEAR_NOTES removes stored notes only as far as `acting_for` (who started the run) may.
    """
    settings = settings or get_settings()
    messages = build_stage1_messages(prepared, history_block=history_block, notes_block=notes_block)
    schema = stage1_schema(prepared.metrics)

    def check(data: dict[str, Any]) -> Stage1Result:
        return check_stage1_reply(data, prepared.metrics)

    # The tolerant parser accepts what the schema would not (display names, "reason", 85 for 0.85);
    # the schema constrains the server, the check decides.
    options: dict[str, Any] = {
        "model": settings.judge_model,
        "settings": settings,
        "schema": schema,
        "check": check,
        "purpose": "judge",
        "validate_schema": False,
        "schema_name": "stage1",
    }
    pending: judge_tools.PendingNotes | None = None
    try:
        if engine is None:
            data = llm.chat_json(messages, **options)
        else:
            run = judge_tools.run_with_tools(
                messages,
                model=settings.judge_model,
                session_factory=lambda: session_scope(engine, read_only=True),
                session_id=eval_id,
                created_by=judge_tools.judge_author(settings.judge_model),
                language=prepared.evaluation.language,
                settings=settings,
                schema=schema,
                purpose="judge",
                acting_for=acting_for,
            )
            pending = run.pending
            data = llm.finish_json(
                run.messages[:-1], llm.ChatResult(text=run.text, finish_reason=run.finish_reason), **options
            )
    except llm.LLMNotConfigured as exc:
        raise JudgeFailed("configuration", str(exc), kind="not_configured") from exc
    except llm.LLMError as exc:
        raise JudgeFailed("stage1", str(exc), kind=exc.kind) from exc
    try:
        result = check_stage1_reply(data, prepared.metrics)
    except ValueError as exc:
        raise JudgeFailed("stage1", f"the judge's reply is unusable: {exc}", kind="invalid_reply") from exc
    if result.evidence is None:
        # AD-8: scores are the value, evidence a bonus; a broken evidence block must not sink the run.
        log.warning(EVIDENCE_PARSE_WARNING, eval_id)
        log.info("evidence problem for eval %s: %s", eval_id, result.evidence_problem)
    return replace(result, pending_notes=pending)


# ---------------------------------------------------------------------------------------------
# Stage 2: mentoring comparison (the reviewer's scores against the judge's)

STAGE2_SYSTEM = """You are a mentor for a human evaluator (Stage 2: mentoring comparison).
An independent judge scored a model answer; the evaluator scored it too. For each metric, explain
where and why the evaluator's score differs from the judge's (or confirm the agreement), referring
only to the evidence given below, and suggest one or two concrete things to look for next time.
Then write short overall feedback. The gaps and the judge meta score are already computed; do not
recompute them. Write in the language of the answer ({language})."""

STAGE2_OUTPUT = """Reply with one JSON object exactly in this shape:
{{"metric_feedback": {{"<slug>": "<comparison for that metric>"}}, "overall_feedback": "<text>"}}
Metric keys: {slugs}."""


# The prompt templates whose hash identifies them in a judge version (lib.judge_versions): editing
# any of them makes the next run's configuration, and so its version, a new one.
PROMPT_TEMPLATES: tuple[str, ...] = (STAGE1_SYSTEM, STAGE1_OUTPUT, STAGE2_SYSTEM, STAGE2_OUTPUT)


def prompt_template_hash() -> str:
    """SHA-256 of the scoring and mentoring prompt templates, as a judge version records it."""
    return hashlib.sha256("\x00".join(PROMPT_TEMPLATES).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Gaps:
    """Stage 2 arithmetic (SPEC §5), computed in code."""

    per_metric: dict[str, float]
    weighted_gap: float | None
    judge_meta_score: int | None


def compute_gaps(prepared: PreparedInput, judge_scores: Mapping[str, Any]) -> Gaps:
    """Rescaled per-metric gaps, the weighted gap and the meta score; None when nothing is comparable."""
    metrics = list(prepared.metrics)
    gaps = metric_gaps(metrics, prepared.user_scores, judge_scores)
    if not gaps:
        # No metric scored on both sides: there is no gap to weigh, which is not a perfect judge.
        return Gaps({}, None, None)
    gap = weighted_gap(
        metrics, prepared.user_scores, judge_scores, prepared.primary_metric, prepared.bonus_metrics
    )
    return Gaps(gaps, gap, judge_meta_score(gap))


def _evidence_lines(items: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for n, item in enumerate(items, start=1):
        state = "verified" if item.get("verified") else "NOT verified in the answer"
        lines.append(f"    {n}. ({state}) quote: {json.dumps(item.get('quote', ''), ensure_ascii=False)}")
        if item.get("why"):
            lines.append(f"       why: {item['why']}")
        if item.get("better"):
            lines.append(f"       better: {item['better']}")
    return lines


def build_stage2_messages(
    prepared: PreparedInput,
    stage1: Stage1Result,
    gaps: Gaps,
    verified_evidence: Mapping[str, Sequence[Mapping[str, Any]]] | None,
) -> list[dict[str, str]]:
    """The Stage 2 prompt: both sides' scores and reasons per metric, the computed gaps, the evidence."""
    ev = prepared.evaluation
    blocks = []
    for spec in prepared.metrics:
        user = prepared.user_scores.get(spec.slug, {})
        judge = stage1.scores[spec.slug]
        role = (
            "primary"
            if spec.slug == prepared.primary_metric
            else ("bonus" if spec.slug in prepared.bonus_metrics else "other")
        )
        user_score = user.get("score")
        lines = [
            f"- {spec.slug} ({spec.display_name}, scale {spec.scale_label()}, {role} metric)",
            f"  evaluator: {format_score(user_score) if user_score is not None else 'not scored'}"
            + (f" — {user['reason']}" if user.get("reason") else ""),
            f"  judge: {format_score(judge.score) if judge.score is not None else 'not scored'}"
            + (f" — {judge.rationale}" if judge.rationale else ""),
        ]
        if spec.slug in gaps.per_metric:
            lines.append(f"  gap (rescaled to 1–5): {gaps.per_metric[spec.slug]:.2f}")
        items = (verified_evidence or {}).get(spec.slug) or []
        lines.append("  evidence:" if items else "  evidence: none")
        lines.extend(_evidence_lines(items))
        blocks.append("\n".join(lines))
    summary = (
        f"Weighted gap: {gaps.weighted_gap:.2f}; judge meta score: {gaps.judge_meta_score}/5"
        if gaps.weighted_gap is not None
        else "No metric was scored by both; there is no gap."
    )
    if verified_evidence is None:
        summary += "\nThe judge's evidence could not be read; say so rather than inventing quotes."
    user_msg = "\n\n".join(
        [
            f"Product: {ev.product}\nLanguage: {ev.language}",
            "## Question\n" + _delimited("QUESTION", ev.question),
            "## Model answer\n" + _delimited("ANSWER", ev.model_answer),
            "## Scores per metric\n" + "\n".join(blocks),
            summary,
            STAGE2_OUTPUT.format(slugs=", ".join(m.slug for m in prepared.metrics)),
        ]
    )
    return [
        {"role": "system", "content": STAGE2_SYSTEM.format(language=ev.language)},
        {"role": "user", "content": user_msg},
    ]


def stage2_schema(metrics: Sequence[MetricSpec]) -> dict[str, Any]:
    """The JSON schema of a Stage 2 reply: a comparison per rubric metric and the overall feedback."""
    slugs = [m.slug for m in metrics]
    return {
        "type": "object",
        "properties": {
            "metric_feedback": {
                "type": "object",
                "properties": {slug: _text_schema() for slug in slugs},
                "required": slugs,
                "additionalProperties": False,
            },
            "overall_feedback": _text_schema(),
        },
        "required": ["metric_feedback", "overall_feedback"],
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Stage2Result:
    """Mentoring text from the LLM and the arithmetic from code."""

    overall_feedback: str | None
    metric_feedback: dict[str, str]
    gaps: Gaps


def parse_stage2_response(
    data: Mapping[str, Any], metrics: Sequence[MetricSpec]
) -> tuple[str, dict[str, str]]:
    """(overall feedback, feedback per slug) from a Stage 2 reply; ValueError when there is no feedback."""
    overall = data.get("overall_feedback", data.get("overall"))
    if not isinstance(overall, str) or not overall.strip():
        raise ValueError("the reply has no 'overall_feedback' text")
    lookup = _metric_lookup(metrics)
    per_metric: dict[str, str] = {}
    raw = data.get("metric_feedback")
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            slug = lookup.get(str(key).strip())
            if isinstance(value, Mapping):
                value = value.get("comparison") or value.get("feedback")
            if slug is not None and isinstance(value, str) and value.strip():
                per_metric[slug] = value.strip().replace("\x00", "")
    return overall.strip().replace("\x00", ""), per_metric


def run_stage2(
    prepared: PreparedInput,
    stage1: Stage1Result,
    verified_evidence: Mapping[str, Sequence[Mapping[str, Any]]] | None,
    *,
    settings: Settings | None = None,
) -> Stage2Result:
    """Mentoring feedback from the judge model plus the gaps from code; JudgeFailed("stage2") on failure.

    With no reviewer scores there is nobody to mentor, so the LLM is not called (batch pipelines).
    """
    settings = settings or get_settings()
    gaps = compute_gaps(prepared, stage1.judge_scores)
    if not any(u.get("score") is not None for u in prepared.user_scores.values()):
        return Stage2Result(overall_feedback=None, metric_feedback={}, gaps=gaps)
    messages = build_stage2_messages(prepared, stage1, gaps, verified_evidence)

    def check(data: dict[str, Any]) -> None:
        overall, _per_metric = parse_stage2_response(data, prepared.metrics)
        problem = weak_text_problem("overall_feedback", overall)
        if problem:
            raise ValueError(problem)

    try:
        data = llm.chat_json(
            messages,
            model=settings.judge_model,
            settings=settings,
            schema=stage2_schema(prepared.metrics),
            check=check,
            purpose="mentor",
            validate_schema=False,
            schema_name="stage2",
        )
    except llm.LLMNotConfigured as exc:
        raise JudgeFailed("configuration", str(exc), kind="not_configured") from exc
    except llm.LLMError as exc:
        raise JudgeFailed("stage2", str(exc), kind=exc.kind) from exc
    try:
        overall, per_metric = parse_stage2_response(data, prepared.metrics)
    except ValueError as exc:
        raise JudgeFailed("stage2", f"the judge's reply is unusable: {exc}", kind="invalid_reply") from exc
    return Stage2Result(overall_feedback=overall, metric_feedback=per_metric, gaps=gaps)


# ---------------------------------------------------------------------------------------------
# The whole run and its atomic write


def verified_evidence_of(
    model_answer: str, evidence: Mapping[str, Sequence[Mapping[str, Any]]] | None
) -> dict[str, list[dict[str, Any]]] | None:
    """Evidence items with the five-stage verification applied, for the Stage 2 prompt."""
    if evidence is None:
        return None
    return {slug: [verify_evidence_item(model_answer, i) for i in items] for slug, items in evidence.items()}


def build_record(
    prepared: PreparedInput,
    stage1: Stage1Result,
    stage2: Stage2Result,
    *,
    snapshot_id: str,
    judge_model: str,
) -> dict[str, Any]:
    """The evaluation in the import format, so the importer's row builder makes the snapshot."""
    ev = prepared.evaluation
    gaps = stage2.gaps
    return {
        "id": snapshot_id,
        "question": ev.question,
        "model_answer": ev.model_answer,
        "model_name": ev.model_name,
        "judge_model": judge_model,
        "product": ev.product,
        "language": ev.language,
        "category": ev.category,
        "question_id": ev.question_id,
        "primary_metric": prepared.primary_metric,
        "bonus_metrics": list(prepared.bonus_metrics),
        "user_scores": prepared.user_scores or None,
        "judge_scores": stage1.judge_scores,
        "evidence": stage1.evidence or None,
        "weighted_gap": gaps.weighted_gap,
        "judge_meta_score": gaps.judge_meta_score,
        "overall_feedback": stage2.overall_feedback,
    }


def snapshot_rows(
    prepared: PreparedInput,
    stage1: Stage1Result,
    stage2: Stage2Result,
    *,
    snapshot_id: str,
    judge_model: str,
    reviewer: str,
    judge_version_id: int | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The snapshot row and its judgment rows, ready for the one transaction that writes them."""
    record = build_record(prepared, stage1, stage2, snapshot_id=snapshot_id, judge_model=judge_model)
    row, judgments = build_snapshot_rows(record, prepared.metrics, reviewer=reviewer)
    row["judge_version_id"] = judge_version_id
    for judgment in judgments:
        judgment["judge_version_id"] = judge_version_id
    if stage1.evidence is None:
        row["evidence_json"] = None  # AD-8: "no evidence", not an empty per-metric shell
    for slug, text in stage2.metric_feedback.items():
        if slug in row["judge_scores_json"]:
            row["judge_scores_json"][slug]["mentoring"] = text
    for judgment in judgments:
        judgment["confidence"] = stage1.scores[judgment["metric"]].confidence
    return row, judgments


def _existing_snapshot(session: Session, source_key: str) -> str | None:
    return session.exec(
        select(EvaluationSnapshot.id).where(col(EvaluationSnapshot.source_key) == source_key)
    ).first()


def write_snapshot(
    *, session: Session, row: Mapping[str, Any], judgments: Sequence[Mapping[str, Any]]
) -> str:
    """Add the snapshot and its judgments in the caller's transaction; AlreadyJudged for a duplicate."""
    existing = _existing_snapshot(session, row["source_key"])
    if existing is not None:
        raise AlreadyJudged(existing)
    session.add(EvaluationSnapshot(**row))
    # The judgments reference the snapshot; flushing it first keeps the insert order right.
    session.flush()
    session.add_all(Judgment(**j) for j in judgments)
    session.flush()
    return str(row["id"])


@dataclass(frozen=True)
class JudgeContext:
    """What a run reads from the database before calling the LLM."""

    prepared: PreparedInput
    history_block: str
    notes_block: str | None
    existing_snapshot: str | None
    # Seed 001: which notes the prompt shows, under which context tags (recorded as the run's audit).
    shown_note_ids: tuple[int, ...] = ()
    env_tags: tuple[str, ...] = ()
    # What the prompt budget left out, said to the reviewer (None when everything fit).
    left_out: str | None = None


# ---------------------------------------------------------------------------------------------
# Judge versions (issue 28): which configuration a run uses, and the version it stamps


def builtin_config(
    settings: Settings, metrics: Sequence[MetricSpec], options: JudgeVersion | None = None
) -> JudgeConfig:
    """The configuration a run of the built-in judge uses: the product's rubric, this build's prompt
    templates, and the options (model, history, notes, temperature, caps) a lead made current for the
    product (`options`), else the server's settings."""
    chosen: dict[str, Any] = {
        option: getattr(options, option) if options is not None else getattr(settings, setting)
        for option, setting in judge_versions.OPTION_SETTINGS.items()
    }
    return JudgeConfig(
        rubric=judge_versions.rubric_entries(metrics),
        prompt_hash=prompt_template_hash(),
        relevance=options.relevance if options is not None else True,
        **chosen,
    )


def settings_for(config: JudgeConfig, settings: Settings) -> Settings:
    """`settings` with a complete configuration's options in place of the server's (each as its
    setting's type: a stored 20.0 runs as 20 where the setting is a whole number)."""
    assert config.complete
    return replace(
        settings,
        **{
            setting: type(getattr(settings, setting))(getattr(config, option))
            for option, setting in judge_versions.OPTION_SETTINGS.items()
        },
    )


def runnable_problem(version: JudgeVersion) -> str | None:
    """Why the built-in judge cannot run this version as it was, or None when it can."""
    if not version.complete:
        return (
            f"version {version.name!r} was recorded by a judge that runs elsewhere and does not name "
            "every field, so this judge cannot reproduce it"
        )
    if version.prompt_hash != prompt_template_hash():
        return (
            f"version {version.name!r} used other prompt templates (hash {str(version.prompt_hash)[:12]}) "
            f"than this build's ({prompt_template_hash()[:12]}), so this judge cannot reproduce it"
        )
    return None


@dataclass(frozen=True)
class RunPlan:
    """A run's configuration: its rubric, the settings it runs with, and its version (when stored)."""

    product: str
    config: JudgeConfig
    metrics: tuple[MetricSpec, ...]
    settings: Settings
    version_id: int | None
    version_name: str | None

    @property
    def relevance(self) -> bool:
        return bool(self.config.relevance)


def plan_run(*, session: Session, product: str, settings: Settings, version: str | None = None) -> RunPlan:
    """How a run of `product` judges: as the named version, else as the product's current configuration.

    VersionError when the named version does not exist or cannot be run by this build.
    """
    product = product.strip()
    if version:
        stored = judge_versions.require_version(session, product, version)
        problem = runnable_problem(stored)
        if problem:
            raise VersionError(problem)
        config = JudgeConfig.of(stored)
        return RunPlan(
            product, config, tuple(config.specs()), settings_for(config, settings), stored.id, stored.name
        )
    metrics = metrics_for_product(session=session, product=product)
    config = builtin_config(settings, metrics, judge_versions.current_options(session, product))
    found = judge_versions.find_version(session, product, config)
    return RunPlan(
        product,
        config,
        tuple(metrics),
        settings_for(config, settings),
        found.id if found else None,
        found.name if found else None,
    )


def run_version_id(engine: Engine, plan: RunPlan, created_by: str) -> int:
    """The version a run stamps on what it writes: the plan's, made now when this configuration is new."""
    if plan.version_id is not None:
        return plan.version_id
    with session_scope(engine) as session:
        return judge_versions.ensure_version(
            session=session, product=plan.product, config=plan.config, created_by=created_by, origin="judge"
        ).id


# Stage 1 instructions added after the budget is checked (note tools or commands, JSON request).
PROMPT_OVERHEAD_TOKENS = 300


def stage1_prompt_budget(settings: Settings) -> int:
    """Tokens the Stage 1 prompt may use: the context window less the reply cap and the instructions."""
    return settings.context_tokens - settings.max_tokens_judge - PROMPT_OVERHEAD_TOKENS


@dataclass(frozen=True)
class FittedPrompt:
    """The history and notes that fit the context window, and what was left out."""

    history: list[Judgment]
    notes: list[SessionNote]
    left_out: str | None


def fit_stage1_prompt(
    prepared: PreparedInput,
    history: Sequence[Judgment],
    shown_notes: Sequence[SessionNote],
    settings: Settings,
    *,
    notes_block: str | None = None,
) -> FittedPrompt:
    """Drop the oldest history entries, then the lowest-ranked notes, until Stage 1 fits `OVERRULE_CONTEXT_TOKENS`.

    Tokens are estimated without a tokenizer (`lib.llm.estimate_tokens`: UTF-8 bytes / 3.5), which
    over-counts a little, so a prompt cut to the estimate fits. ValueError when even the rubric,
    question and answer alone do not fit: a silently truncated prompt would be judged as if whole.
    """
    budget = stage1_prompt_budget(settings)
    kept_history, kept_notes = list(history), list(shown_notes)

    def size() -> int:
        block = notes_block if notes_block is not None else _format_notes(kept_notes)
        messages = build_stage1_messages(
            prepared, history_block=format_history_for_prompt(kept_history), notes_block=block
        )
        return llm.estimate_messages_tokens(messages)

    while kept_history and size() > budget:
        kept_history.pop()  # newest first: the oldest entry goes first
    while kept_notes and size() > budget:
        kept_notes.pop()  # ranked by relevance: the least relevant goes first
    if size() > budget:
        raise ValueError(
            f"the rubric, question and answer alone need about {size()} tokens, more than the "
            f"{max(budget, 0)} that {env_name('context_tokens')}={settings.context_tokens} leaves after "
            f"{env_name('max_tokens_judge')}={settings.max_tokens_judge} for the reply; raise "
            f"{env_name('context_tokens')} (and the server's context size) or shorten the answer"
        )
    dropped = []
    if len(kept_history) < len(history):
        dropped.append(f"{len(history) - len(kept_history)} of {len(history)} history entries (the oldest)")
    if len(kept_notes) < len(shown_notes):
        dropped.append(
            f"{len(shown_notes) - len(kept_notes)} of {len(shown_notes)} notes (the least relevant)"
        )
    left_out = (
        f"To fit {env_name('context_tokens')}={settings.context_tokens} tokens (estimated as UTF-8 bytes / 3.5, "
        f"{settings.max_tokens_judge} kept for the reply), the judge's prompt left out "
        + " and ".join(dropped)
        + "."
        if dropped
        else None
    )
    return FittedPrompt(kept_history, kept_notes, left_out)


def _format_notes(selected: Sequence[SessionNote]) -> str | None:
    # A judge run's own notes carry its snapshot id and are saved only after it succeeds, so no note
    # in its prompt can be from the current session: every line names the session it came from.
    return notes.format_notes_for_prompt(selected, current_session="") or None


def _relevant_notes(
    session: Session,
    prepared: PreparedInput,
    *,
    ranked: bool = True,
    as_of: datetime | None = None,
    limit: int | None = None,
) -> tuple[list[SessionNote], tuple[str, ...]]:
    """Notes for the run's language (seed 000), filtered and ranked by tag relevance for its context (seed 001).

    `ranked=False` is the seed-000 query alone (the alignment lab's `notes` arm); `as_of` keeps
    only notes written by then.
    """
    ev = prepared.evaluation
    limit = get_settings().notes_limit if limit is None else limit
    if not ranked:
        return list(notes.relevant_notes(session=session, language=ev.language, as_of=as_of, limit=limit)), ()
    tags = tuple(
        relevance.build_env_tags(
            language=ev.language,
            product=ev.product,
            metric=prepared.primary_metric,
            model=ev.model_name,
            category=ev.category,
        )
    )
    return (
        list(
            notes.relevant_notes(session=session, language=ev.language, tags=tags, as_of=as_of, limit=limit)
        ),
        tags,
    )


def _record_notes_audit(
    engine: Engine, context: JudgeContext, stage1: Stage1Result, snapshot_id: str, reviewer: str
) -> None:
    """Seed 001: remember which notes this run showed (prompt and reply as transcript); never fails the run."""
    if not context.shown_note_ids:
        return
    messages = build_stage1_messages(
        context.prepared, history_block=context.history_block, notes_block=context.notes_block
    )
    reply = json.dumps(
        {"independent_scores": stage1.judge_scores, "evidence": stage1.evidence}, ensure_ascii=False
    )
    try:
        with session_scope(engine) as session:
            relevance.record_audit(
                session=session,
                session_id=snapshot_id,
                shown_note_ids=context.shown_note_ids,
                env_tags=context.env_tags,
                product=context.prepared.evaluation.product,
                snapshot_id=snapshot_id,
                transcript=[*messages, {"role": "assistant", "content": reply}],
                recorded_by=reviewer,
            )
    except SQLAlchemyError:
        # The snapshot is saved; a missing audit only means this run teaches the evaluator nothing.
        log.warning("could not record which notes judge run %s showed", snapshot_id, exc_info=True)


def load_context(
    *,
    session: Session,
    evaluation: EvaluationInput,
    settings: Settings,
    notes_block: str | None = None,
    with_history: bool = True,
    ranked_notes: bool = True,
    as_of: datetime | None = None,
    exclude_snapshot: str | None = None,
    metrics: Sequence[MetricSpec] | None = None,
) -> JudgeContext:
    """Rubric, correction history and notes for a run; ValueError when the input does not fit the rubric.

    The keyword switches are the alignment lab's arms: no history, notes without tag relevance
    (`notes_block=""` leaves notes out), history and notes as of a moment without one snapshot,
    and an edited rubric (`metrics`).
    """
    if metrics is None:
        metrics = metrics_for_product(session=session, product=evaluation.product.strip())
    prepared = prepare_input(evaluation, metrics)
    # One Stage 1 call scores every metric, so its history is the product's across metrics
    # (each entry names its metric); a per-metric block for 8 metrics would be 8× the tokens.
    history = (
        select_history(
            session,
            evaluation.product,
            max_entries=settings.history_max_entries,
            correction_ratio=settings.history_correction_ratio,
            as_of=as_of,
            exclude_snapshot=exclude_snapshot,
        )
        if with_history
        else []
    )
    selected: list[SessionNote] = []
    tags: tuple[str, ...] = ()
    if notes_block is None and settings.notes_limit <= 0:
        notes_block = ""  # a configuration without notes (a judge version's notes limit 0)
    if notes_block is None:
        selected, tags = _relevant_notes(
            session, prepared, ranked=ranked_notes, as_of=as_of, limit=settings.notes_limit
        )
    fitted = fit_stage1_prompt(prepared, history, selected, settings, notes_block=notes_block)
    if notes_block is None:
        notes_block = _format_notes(fitted.notes)
    return JudgeContext(
        prepared=prepared,
        history_block=format_history_for_prompt(fitted.history),
        notes_block=notes_block,
        existing_snapshot=_existing_snapshot(session, evaluation.source_key),
        shown_note_ids=tuple(n.id for n in fitted.notes if n.id is not None),
        env_tags=tags,
        left_out=fitted.left_out,
    )


Progress = Callable[[str], None]


def judge_evaluation(
    *,
    engine: Engine,
    evaluation: EvaluationInput,
    reviewer: Actor | str,
    settings: Settings | None = None,
    notes_block: str | None = None,
    progress: Progress | None = None,
    version: str | None = None,
) -> str:
    """Judge one answer (Stage 1, Stage 2) and write its snapshot atomically; returns the snapshot id.

    The run uses the product's current configuration, or the judge version named `version`, and
    stamps that version on the snapshot and its judgments.
    """
    settings = settings or get_settings()
    say = progress or (lambda _message: None)
    if not settings.llm_configured:
        raise JudgeFailed("configuration", llm.NOT_CONFIGURED_MESSAGE, kind="not_configured")
    if not identity_of(reviewer):
        raise JudgeFailed("input", "no reviewer was named; every write records who made it", kind="input")
    starter = authorize(engine, reviewer, Permission.JUDGE)
    reviewer = starter.identity
    snapshot_id = new_prefixed_id("snap")
    try:
        with session_scope(engine, read_only=True) as session:
            plan = plan_run(session=session, product=evaluation.product, settings=settings, version=version)
            context = load_context(
                session=session,
                evaluation=evaluation,
                settings=plan.settings,
                notes_block=notes_block,
                ranked_notes=plan.relevance,
                metrics=plan.metrics,
            )
    except VersionError as exc:
        raise JudgeFailed("input", str(exc), kind="version") from exc
    except ValueError as exc:
        raise JudgeFailed("input", str(exc), kind="input") from exc
    except SQLAlchemyError as exc:
        raise JudgeFailed(
            "input", f"the database could not be read ({type(exc).__name__})", kind="database"
        ) from exc
    if context.existing_snapshot is not None:
        raise AlreadyJudged(context.existing_snapshot)
    prepared = context.prepared
    if context.left_out:
        log.warning("%s", context.left_out)
        say(context.left_out)

    settings = plan.settings
    try:
        version_id = run_version_id(engine, plan, reviewer)
    except (VersionError, SQLAlchemyError) as exc:
        raise JudgeFailed("input", f"the judge version could not be recorded: {exc}", kind="version") from exc

    say("The judge scores the answer and collects evidence…")
    stage1 = run_stage1(
        prepared,
        history_block=context.history_block,
        notes_block=context.notes_block,
        settings=settings,
        eval_id=snapshot_id,
        engine=engine,
        acting_for=starter,
    )
    if stage1.evidence is None:
        say("The judge's evidence could not be read; continuing without evidence.")
    verified = verified_evidence_of(prepared.evaluation.model_answer, stage1.evidence)

    if any(u.get("score") is not None for u in prepared.user_scores.values()):
        say("Mentor feedback: the judge compares its scores with yours…")
    stage2 = run_stage2(prepared, stage1, verified, settings=settings)

    say("Saving the evaluation…")
    try:
        row, judgments = snapshot_rows(
            prepared,
            stage1,
            stage2,
            snapshot_id=snapshot_id,
            judge_model=settings.judge_model,
            reviewer=reviewer,
            judge_version_id=version_id,
        )
    except ImportFailed as exc:
        raise JudgeFailed("save", str(exc), kind="invalid_record") from exc
    try:
        with session_scope(engine) as session:
            written = write_snapshot(session=session, row=row, judgments=judgments)
    except JudgeFailed:
        raise
    except SQLAlchemyError as exc:
        raise JudgeFailed(
            "save", f"the database refused the write ({type(exc).__name__})", kind="database"
        ) from exc
    # The judge's own notes are written only now that the snapshot is saved (a failed run writes none).
    judge_tools.save_pending_notes(engine, stage1.pending_notes)
    _record_notes_audit(engine, context, stage1, written, reviewer)
    return written


# ---------------------------------------------------------------------------------------------
# Batches: `python -m lib judge FILE`


class BatchInputError(ValueError):
    """A batch file that cannot be judged at all; names the line. Nothing was sent to the LLM."""


@dataclass
class BatchReport:
    """What a batch run did; `failed` holds (line number, message) for lines to retry."""

    total: int = 0
    judged: int = 0
    skipped: int = 0
    failed: list[tuple[int, str]] = field(default_factory=list)
    snapshot_ids: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for a human."""
        return (
            f"{self.total} lines: {self.judged} judged, {self.skipped} already judged (skipped), "
            f"{len(self.failed)} failed"
        )


def read_batch(path: Path) -> list[tuple[int, EvaluationInput]]:
    """(line number, input) for every non-blank JSONL line; BatchInputError at the first bad line."""
    if not path.is_file():
        raise BatchInputError(f"{path}: no such file")
    out: list[tuple[int, EvaluationInput]] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(_lines(fh), start=1):
            where = f"{path.name} line {lineno}"
            if len(raw) > _MAX_LINE_BYTES:
                raise BatchInputError(f"{where}: the line is longer than the 10 MB limit for one record")
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                raise BatchInputError(f"{where}: not valid UTF-8 text") from None
            if not text.strip():
                continue
            try:
                out.append((lineno, EvaluationInput.from_record(json.loads(text))))
            except json.JSONDecodeError as exc:
                raise BatchInputError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            except (ValueError, RecursionError) as exc:
                raise BatchInputError(f"{where}: {exc}") from None
    return out


def _lines(fh: Any) -> Iterator[bytes]:
    while True:
        raw = fh.readline(_MAX_LINE_BYTES + 1)
        if not raw:
            return
        yield raw


def _pending_lines(
    engine: Engine,
    lines: Sequence[tuple[int, EvaluationInput]],
    source: str,
    *,
    settings: Settings,
    version: str | None = None,
) -> tuple[list[tuple[int, EvaluationInput]], int]:
    """Lines still to judge (every line checked against its rubric first) and how many are skipped."""
    pending: list[tuple[int, EvaluationInput]] = []
    skipped = 0
    seen: set[str] = set()
    rubrics: dict[str, list[MetricSpec]] = {}
    with session_scope(engine, read_only=True) as session:
        for lineno, evaluation in lines:
            product = evaluation.product
            if product not in rubrics:
                try:
                    plan = plan_run(session=session, product=product, settings=settings, version=version)
                except VersionError as exc:
                    raise BatchInputError(f"{source} line {lineno}: {exc}") from None
                rubrics[product] = list(plan.metrics)
            try:
                prepare_input(evaluation, rubrics[product])
            except ValueError as exc:
                raise BatchInputError(f"{source} line {lineno}: {exc}") from None
        keys = [evaluation.source_key for _, evaluation in lines]
        stored: set[str] = set()
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            stored.update(
                session.exec(
                    select(EvaluationSnapshot.source_key).where(col(EvaluationSnapshot.source_key).in_(part))
                ).all()
            )
    for (lineno, evaluation), key in zip(lines, keys, strict=True):
        # Resumable: a line already judged (by an earlier run, an import, or earlier in this file) is skipped.
        if key in stored or key in seen:
            skipped += 1
            continue
        seen.add(key)
        pending.append((lineno, evaluation))
    return pending, skipped


def judge_file(
    path: Path,
    *,
    engine: Engine,
    reviewer: Actor | str = "cli",
    concurrency: int | None = None,
    settings: Settings | None = None,
    progress: Callable[[int, int], None] | None = None,
    version: str | None = None,
) -> BatchReport:
    """Judge every not-yet-judged line of a JSONL file with a bounded pool; rerun it to resume.

    `version` names the judge version every line is judged with (each line's product must have it).
    """
    settings = settings or get_settings()
    reviewer = authorize(engine, reviewer, Permission.JUDGE)
    if not settings.llm_configured:
        raise BatchInputError(llm.NOT_CONFIGURED_MESSAGE)
    workers = max(1, concurrency or settings.judge_concurrency)
    lines = read_batch(path)
    pending, skipped = _pending_lines(engine, lines, path.name, settings=settings, version=version)
    report = BatchReport(total=len(lines), skipped=skipped)
    if progress:
        progress(0, len(pending))

    def one(evaluation: EvaluationInput) -> str:
        return judge_evaluation(
            engine=engine, evaluation=evaluation, reviewer=reviewer, settings=settings, version=version
        )

    # Submitting in a window of 2× the pool keeps memory flat for long files while no worker idles.
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge") as pool:
        queue = iter(pending)
        running: dict[Future[str], int] = {}

        def refill() -> None:
            while len(running) < 2 * workers:
                nxt = next(queue, None)
                if nxt is None:
                    return
                running[pool.submit(one, nxt[1])] = nxt[0]

        refill()
        done_count = 0
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                lineno = running.pop(future)
                try:
                    snapshot_id = future.result()
                except AlreadyJudged:
                    report.skipped += 1  # judged by someone else since the file was read
                except JudgeFailed as exc:
                    report.failed.append((lineno, str(exc)))
                    log.warning("%s line %d: %s", path.name, lineno, exc)
                else:
                    report.judged += 1
                    report.snapshot_ids.append(snapshot_id)
                done_count += 1
                if progress:
                    progress(done_count, len(pending))
            refill()
    report.failed.sort()
    return report
