"""Second opinion (seed 000 evaluation layer): the evaluation model validates one judgment.

The evaluation model sees what the judge saw (the question and the model answer, or the item's
description for seed-004 label judgments), the rubric and scale, and the judge's decision, confidence,
reasoning and evidence. It answers in the seed's KEY: value format; `lib.evaluation_layer` parses it
and applies the seed's rules. The outcome is stored beside the judge's own decision in the
`second_opinion_*` columns, never over it: `decision`/`confidence` stay the judge's record (the
correction history learns from them), and a `JudgmentEvent` with action "second_opinion" records who
asked and what changed. If the evaluation model fails, nothing is written and the failure is
returned for the UI to show: the original judgment stands (seed 000 fallback).

A reviewer who asks for one second opinion gets it whatever the seed's thresholds say; batches
honour `should_evaluate` (text over 100 characters, a decision, confidence ≥ 0.30).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from lib import llm
from lib.auth import Actor, Permission, authorize, identity_of
from lib.config import Settings, get_settings
from lib.corrections import DecisionScale, InvalidDecision, decision_scale
from lib.db import session_scope
from lib.evaluation_layer import (
    EvaluationVerdict,
    apply_evaluation,
    parse_evaluation_response,
    should_evaluate,
)
from lib.evidence import metric_entry
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, utcnow

log = logging.getLogger(__name__)

ACTION = "second_opinion"
ACTIONS = ("improved", "validated", "questioned", "unchanged")
_MAX_TEXT = 4000
_PAGE = 500

EVALUATION_SYSTEM = """You are the evaluation layer: a second, independent reviewer who checks another AI
judge's decision. You get the original text, the rubric, and the judge's decision with its confidence,
reasoning and evidence. Decide whether the decision is right for this text under the rubric, whether
its confidence is appropriate, and whether a different decision would be better."""

EVALUATION_FORMAT = """Answer in exactly this format, one key per line:
VALID: YES or NO (is the judge's decision correct?)
CONFIDENCE_APPROPRIATE: YES or NO
IMPROVED_CODE: {allowed}, or NONE if the decision should stand
IMPROVED_CONFIDENCE: your confidence in the improved decision, 0-100 (or NONE)
IMPROVED_REASONING: why the improved decision is better (or NONE)
EVALUATION: your assessment in two to four sentences"""


@dataclass(frozen=True)
class JudgmentContext:
    """Everything the evaluation prompt needs about one judgment, read in one short session."""

    judgment_id: int
    change_id: str
    product: str
    metric: str | None
    decision: str
    confidence: float | None
    reasoning: str | None
    question: str | None
    text: str
    scale: DecisionScale
    evidence: tuple[Mapping[str, Any], ...] = ()

    @property
    def metric_label(self) -> str:
        """ "Truthfulness (truthfulness)" for a metric judgment, else the metric or "decision"."""
        if self.scale.spec is not None and self.metric:
            return f"{self.scale.spec.display_name} ({self.metric})"
        return self.metric or "decision"


class JudgmentMissing(LookupError):
    """No judgment has this id."""


def original_text(judgment: Judgment, snapshot: EvaluationSnapshot | None) -> str:
    """What the judge judged: the model answer, else the item's description (seed-004 judgments)."""
    if snapshot is not None:
        return snapshot.model_answer
    parts = [p for p in (judgment.description, judgment.url) if p]
    return "\n".join(parts)


def load_judgment_context(*, session: Session, judgment_id: int) -> JudgmentContext:
    """Read a judgment with its snapshot text, scale and evidence; JudgmentMissing if there is none."""
    judgment = session.get(Judgment, judgment_id)
    if judgment is None:
        raise JudgmentMissing(f"no judgment with id {judgment_id}")
    snapshot = session.get(EvaluationSnapshot, judgment.snapshot_id) if judgment.snapshot_id else None
    evidence: list[Mapping[str, Any]] = []
    if snapshot is not None and judgment.metric:
        evidence = metric_entry(snapshot.evidence_json, judgment.metric)["evidence"]
    assert judgment.id is not None
    return JudgmentContext(
        judgment_id=judgment.id,
        change_id=judgment.change_id,
        product=judgment.product,
        metric=judgment.metric,
        decision=judgment.decision,
        confidence=judgment.confidence,
        reasoning=judgment.reasoning,
        question=snapshot.question if snapshot is not None else None,
        text=original_text(judgment, snapshot),
        scale=decision_scale(session=session, judgment=judgment),
        evidence=tuple(evidence),
    )


def _allowed(scale: DecisionScale) -> str:
    if scale.spec is None:
        return "one of " + ", ".join(scale.labels)
    return f"a better score on the scale {scale.describe()}"


def _delimited(name: str, body: str) -> str:
    return f"<<<{name}\n{body}\n{name}>>>"


def build_evaluation_messages(ctx: JudgmentContext) -> list[dict[str, str]]:
    """The seed-000 evaluation prompt: original text, the judgment and its reasoning, the format."""
    rubric = f"Metric: {ctx.metric_label}, scale {ctx.scale.describe()}"
    if ctx.scale.spec is not None and ctx.scale.spec.description.strip():
        rubric += f"\nRubric: {' '.join(ctx.scale.spec.description.split())}"
    confidence = f"{ctx.confidence * 100:.0f}%" if ctx.confidence is not None else "not given"
    judgment = [
        f"Decision: {ctx.decision}",
        f"Confidence: {confidence}",
        f"Reasoning: {ctx.reasoning or '(none given)'}",
    ]
    if ctx.evidence:
        judgment.append("Evidence the judge cited:")
        for n, item in enumerate(ctx.evidence, start=1):
            quote = json.dumps(str(item.get("quote") or ""), ensure_ascii=False)
            state = "verified" if item.get("verified") else "not verified in the text"
            line = f"  {n}. {quote} ({state})"
            if item.get("why"):
                line += f" — {item['why']}"
            judgment.append(line)
    sections = [f"Product: {ctx.product}", rubric]
    if ctx.question:
        sections.append("## Question\n" + _delimited("QUESTION", ctx.question))
    sections.append("## Original text\n" + _delimited("TEXT", ctx.text or "(no text recorded)"))
    sections.append("## The judge's decision\n" + "\n".join(judgment))
    sections.append(EVALUATION_FORMAT.format(allowed=_allowed(ctx.scale)))
    return [
        {"role": "system", "content": EVALUATION_SYSTEM},
        {"role": "user", "content": "\n\n".join(sections)},
    ]


def checked_verdict(verdict: EvaluationVerdict, ctx: JudgmentContext) -> EvaluationVerdict:
    """The verdict with an improvement dropped when it is off the scale or is the same decision."""
    if verdict.improved_code is None:
        return verdict
    try:
        improved = ctx.scale.parse(verdict.improved_code)
    except InvalidDecision:
        log.info(
            "second opinion for %s proposed %r, not a valid decision; ignored",
            ctx.change_id,
            verdict.improved_code,
        )
        return replace(verdict, improved_code=None)
    if improved == ctx.decision:
        return replace(verdict, improved_code=None)
    return replace(verdict, improved_code=improved)


def decide(ctx: JudgmentContext, verdict: EvaluationVerdict) -> tuple[str, float | None, str]:
    """(decision, confidence, action) after the seed's rules; without a confidence only an improvement counts."""
    if ctx.confidence is not None:
        return apply_evaluation(ctx.decision, ctx.confidence, verdict)
    # The seed's rules adjust a confidence; with none to adjust, inventing one would be worse.
    if verdict.improved_code is not None and verdict.improved_confidence is not None:
        return verdict.improved_code, verdict.improved_confidence, "improved"
    if verdict.valid is True:
        return ctx.decision, None, "validated"
    if verdict.valid is False:
        return ctx.decision, None, "questioned"
    return ctx.decision, None, "unchanged"


@dataclass(frozen=True)
class SecondOpinion:
    """The outcome of asking for a second opinion; `error` set means nothing was stored."""

    judgment_id: int
    change_id: str = ""
    action: str | None = None
    valid: bool | None = None
    decision: str | None = None
    confidence: float | None = None
    explanation: str | None = None
    model: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the second opinion was obtained and stored."""
        return self.error is None


def _explanation(verdict: EvaluationVerdict, raw: str) -> str:
    parts = [verdict.evaluation]
    if verdict.improved_code is not None and verdict.improved_reasoning:
        parts.append(f"Improved decision {verdict.improved_code}: {verdict.improved_reasoning}")
    text = "\n\n".join(p for p in parts if p) or raw.strip()
    return text.replace("\x00", "")[:_MAX_TEXT]


def store_second_opinion(*, session: Session, opinion: SecondOpinion, reviewer: Actor | str) -> None:
    """Write the second opinion onto the judgment and append its audit event, in the caller's transaction."""
    reviewer = authorize(session, reviewer, Permission.SECOND_OPINION).identity
    judgment = session.get(Judgment, opinion.judgment_id)
    if judgment is None:
        raise JudgmentMissing(f"no judgment with id {opinion.judgment_id}")
    assert judgment.id is not None
    judgment.second_opinion_action = opinion.action
    judgment.second_opinion_valid = opinion.valid
    judgment.second_opinion_decision = opinion.decision
    judgment.second_opinion_confidence = opinion.confidence
    judgment.second_opinion_text = opinion.explanation
    judgment.second_opinion_model = opinion.model
    judgment.second_opinion_at = utcnow()
    # Only the second_opinion_* columns change and `version` stays: a reviewer mid-review of this
    # judgment is not in conflict with it, and their optimistic-locking save must still succeed.
    session.add(judgment)
    session.add(
        JudgmentEvent(
            judgment_id=judgment.id,
            change_id=judgment.change_id,
            action=ACTION,
            reviewer=reviewer,
            from_decision=judgment.decision,
            to_decision=opinion.decision,
            reason=f"{opinion.action} by {opinion.model}: {opinion.explanation or ''}".strip()[:_MAX_TEXT],
            version=judgment.version,
        )
    )
    session.flush()


def request_second_opinion(
    *, engine: Engine, judgment_id: int, reviewer: Actor | str, settings: Settings | None = None
) -> SecondOpinion:
    """Ask the evaluation model about one judgment and store the result; failures come back in `error`.

    A role without the right to ask raises PermissionDenied before the model is called.
    """
    settings = settings or get_settings()
    if not identity_of(reviewer):
        return SecondOpinion(judgment_id, error="Enter your name first: every change records its reviewer.")
    name = authorize(engine, reviewer, Permission.SECOND_OPINION)
    if not settings.llm_configured:
        return SecondOpinion(judgment_id, error=llm.NOT_CONFIGURED_MESSAGE)
    try:
        with session_scope(engine, read_only=True) as session:
            ctx = load_judgment_context(session=session, judgment_id=judgment_id)
    except JudgmentMissing as exc:
        return SecondOpinion(judgment_id, error=str(exc))
    try:
        reply = llm.chat(
            build_evaluation_messages(ctx),
            model=settings.eval_model,
            settings=settings,
            purpose="second_opinion",
        )
    except (llm.LLMError, llm.LLMNotConfigured) as exc:
        return SecondOpinion(
            judgment_id, ctx.change_id, error=f"The evaluation model failed; the judgment is unchanged. {exc}"
        )
    cut = llm.cut_off_error(reply, "second_opinion", settings)
    if cut is not None:
        return SecondOpinion(judgment_id, ctx.change_id, error=f"{cut} The judgment is unchanged.")
    template = EVALUATION_FORMAT.format(allowed=_allowed(ctx.scale))
    verdict = checked_verdict(parse_evaluation_response(reply.text, template), ctx)
    if verdict.valid is None and verdict.improved_code is None and not verdict.evaluation:
        excerpt = reply.text.strip()[:200]
        return SecondOpinion(
            judgment_id,
            ctx.change_id,
            error="The evaluation model's reply has none of VALID, IMPROVED_CODE or EVALUATION, so it "
            f"could not be read; the judgment is unchanged. Reply began: {excerpt!r}",
        )
    decision, confidence, action = decide(ctx, verdict)
    opinion = SecondOpinion(
        judgment_id=judgment_id,
        change_id=ctx.change_id,
        action=action,
        valid=verdict.valid,
        decision=decision,
        confidence=confidence,
        explanation=_explanation(verdict, reply.text),
        model=settings.eval_model,
    )
    try:
        with session_scope(engine) as session:
            store_second_opinion(session=session, opinion=opinion, reviewer=name)
    except (JudgmentMissing, SQLAlchemyError) as exc:
        return replace(opinion, error=f"The second opinion could not be saved ({type(exc).__name__}: {exc}).")
    return opinion


# ---------------------------------------------------------------------------------------------
# Batches


@dataclass
class BatchOutcome:
    """What a batch of second opinions did."""

    evaluated: int = 0
    skipped: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line for a human."""
        actions = ", ".join(f"{self.actions[a]} {a}" for a in ACTIONS if self.actions[a])
        return (
            f"{self.evaluated} second opinions ({actions or 'none'}), "
            f"{self.skipped} below the evaluation threshold (skipped), {len(self.failed)} failed"
        )


def eligible_judgments(
    *, session: Session, product: str, limit: int | None, settings: Settings
) -> tuple[list[int], int]:
    """Ids of the product's judgments without a second opinion that pass `should_evaluate`, newest first.

    Returns (ids, how many candidates the threshold skipped on the way).
    """
    stmt = (
        select(Judgment, EvaluationSnapshot.model_answer)
        .outerjoin(EvaluationSnapshot, col(EvaluationSnapshot.id) == col(Judgment.snapshot_id))
        .where(
            col(Judgment.product) == product,
            col(Judgment.second_opinion_at).is_(None),
            col(EvaluationSnapshot.deleted_at).is_(None),
        )
        .order_by(col(Judgment.timestamp).desc(), col(Judgment.id).desc())
    )
    ids: list[int] = []
    skipped = 0
    offset = 0
    while limit is None or len(ids) < limit:
        rows = session.exec(stmt.offset(offset).limit(_PAGE)).all()
        if not rows:
            break
        offset += len(rows)
        for judgment, answer in rows:
            text = (
                answer
                if answer is not None
                else "\n".join(p for p in (judgment.description, judgment.url) if p)
            )
            if should_evaluate(
                text,
                judgment.decision,
                judgment.confidence,
                min_length=settings.eval_min_text_length,
                min_confidence=settings.eval_min_confidence,
            ):
                assert judgment.id is not None
                ids.append(judgment.id)
                if limit is not None and len(ids) >= limit:
                    break
            else:
                skipped += 1
    return ids, skipped


def second_opinion_batch(
    *,
    engine: Engine,
    product: str,
    reviewer: Actor | str,
    limit: int | None = None,
    settings: Settings | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> BatchOutcome:
    """Second opinions for a product's judgments that have none and pass the seed's threshold."""
    settings = settings or get_settings()
    reviewer = authorize(engine, reviewer, Permission.SECOND_OPINION)
    with session_scope(engine, read_only=True) as session:
        ids, skipped = eligible_judgments(session=session, product=product, limit=limit, settings=settings)
    outcome = BatchOutcome(skipped=skipped)
    if progress:
        progress(0, len(ids))
    with ThreadPoolExecutor(
        max_workers=settings.judge_concurrency, thread_name_prefix="second-opinion"
    ) as pool:
        futures = [
            pool.submit(
                request_second_opinion, engine=engine, judgment_id=i, reviewer=reviewer, settings=settings
            )
            for i in ids
        ]
        for done, future in enumerate(as_completed(futures), start=1):
            opinion = future.result()
            if opinion.ok:
                outcome.evaluated += 1
                outcome.actions[opinion.action or "unchanged"] += 1
            else:
                outcome.failed.append((opinion.change_id or str(opinion.judgment_id), opinion.error or ""))
            if progress:
                progress(done, len(ids))
    outcome.failed.sort()
    return outcome


def opinion_of(judgment: Judgment) -> SecondOpinion | None:
    """The stored second opinion of a judgment, for display; None when it has none."""
    if judgment.second_opinion_at is None or judgment.id is None:
        return None
    return SecondOpinion(
        judgment_id=judgment.id,
        change_id=judgment.change_id,
        action=judgment.second_opinion_action,
        valid=judgment.second_opinion_valid,
        decision=judgment.second_opinion_decision,
        confidence=judgment.second_opinion_confidence,
        explanation=judgment.second_opinion_text,
        model=judgment.second_opinion_model,
    )


def describe(opinion: SecondOpinion, *, decision: str | None = None) -> str:
    """A one-line plain-text summary ("validated: 4 at 90%"), for captions and the CLI."""
    parts = [opinion.action or "unchanged"]
    if opinion.decision is not None:
        changed = decision is not None and opinion.decision != decision
        parts.append(f"→ {opinion.decision}" if changed else f"decision {opinion.decision}")
    if opinion.confidence is not None:
        parts.append(f"confidence {opinion.confidence:.0%}")
    if opinion.model:
        parts.append(f"by {opinion.model}")
    return ", ".join(parts)
