"""Changing a product's judge (issue 28): rubric edits, promotions from the lab, re-judging a sample.

Each change that alters the judge's configuration makes (or finds) a judge version
(`lib.judge_versions.ensure_version`), so the next judgments say which judge made them:

- **Rubric edit** (`save_rubric`): a lead edits each metric's display name, scale and text; the
  product's metric definitions are updated and the new configuration becomes a version (origin
  "rubric") whose diff against the previous one is its record. The configuration before the first
  edit is recorded too, so even the first edit has something to differ from.
- **Promotion** (`promote_arm`): a winning alignment-lab arm becomes the product's judge in one
  step: its context switches (history, notes, tag relevance) and, for the `rubric` arm, its edited
  rubric text; the version records the experiment and arm it came from.
- **Re-judge** (`rejudge_sample`): a seeded sample of a product's evaluations is judged again by a
  chosen version (or the current configuration). Each new decision goes through the seed-004 rule
  of `lib.corrections.add_judgment`: an unreviewed judgment takes the new decision, a reviewer's
  decision is never lost, and the decision a re-judge does not put in place is kept as that
  version's verdict, so agreement by version sees both versions on the same items. The evaluation's
  own judge scores (Stage 1 at creation, and its mentor feedback) are not rewritten.

Permissions: all three are judge runs (`Permission.JUDGE`, a lead). A rubric save that makes a
version, a promotion and a version made current are written to the audit trail ("judge_changed").
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from lib import judge, judge_versions
from lib.auth import Actor, Permission, authorize
from lib.config import Settings, get_settings
from lib.corrections import add_judgment, format_score, require_reviewer, same_decision
from lib.db import session_scope, write_retrying
from lib.judge_versions import Ensured, JudgeConfig, VersionError
from lib.locks import PG_IMPORT_LOCK, one_writer_at_a_time
from lib.metrics import MetricSpec, metrics_for_product, parse_metric_definition, upsert_metric_definitions
from lib.models import AlignmentExperiment, EvaluationSnapshot, Judgment, MetricDefinition, utcnow
from lib.snapshots import gaps_follow_scales

log = logging.getLogger(__name__)

# What each alignment-lab arm switches (lib.alignment's arms), as judge options.
ARM_OPTIONS: dict[str, dict[str, Any]] = {
    "bare": {"history_entries": 0, "notes_limit": 0},
    "history": {"notes_limit": 0},
    "notes": {"history_entries": 0, "relevance": False},
    "full": {},
    "rubric": {},
}
REJUDGE_LIMIT = 5000  # one re-judge run's most evaluations (each is an LLM call)
AUDIT_ACTION = judge_versions.AUDIT_ACTION


def current_config(session: Session, product: str, settings: Settings) -> JudgeConfig:
    """The configuration the product's next built-in judge run uses (rubric, options, templates)."""
    metrics = metrics_for_product(session=session, product=product)
    return judge.builtin_config(settings, metrics, judge_versions.current_options(session, product))


def _record_current(session: Session, product: str, settings: Settings, by: str) -> None:
    """Make sure the configuration before a change is a version (the diff's left side)."""
    judge_versions.ensure_version(
        session=session, product=product, config=current_config(session, product, settings), created_by=by
    )


# ---------------------------------------------------------------------------------------------
# Rubric edits


def check_rubric(product: str, metrics: Sequence[Mapping[str, Any]]) -> list[MetricSpec]:
    """Edited metrics ({slug, display_name, min, max, integer_scale, description}) validated; ValueError says what.

    Each metric goes through `lib.metrics.parse_metric_definition`, the one rule for a metric's slug,
    name and scale, so a metric added here obeys the same rules as one imported with `--kind metrics`.
    """
    if not metrics:
        raise ValueError("a rubric needs at least one metric: keep one, or add one before removing the last")
    specs: list[MetricSpec] = []
    for raw in metrics:
        try:
            specs.append(parse_metric_definition({**raw, "product": product}))
        except ValueError as exc:
            raise ValueError(f"metric {raw.get('slug')!r}: {exc}") from None
    seen: set[str] = set()
    for spec in specs:
        if spec.slug in seen:
            raise ValueError(f"metric {spec.slug!r} is in the rubric already; a slug can appear only once")
        seen.add(spec.slug)
    return specs


def save_rubric(
    *,
    session: Session,
    product: str,
    metrics: Sequence[Mapping[str, Any]],
    actor: Actor | str | None,
    name: str | None = None,
    description: str = "",
    settings: Settings | None = None,
) -> Ensured:
    """Write the product's edited rubric and record it as a judge version (found again when unchanged).

    Metrics may be edited, added (a slug not in the rubric) or removed (left out of `metrics`). A
    removed metric's judgments and scores stay as they are, shown under the version that judged them;
    the new version simply does not judge it. ValueError (VersionError for a name) says what is
    wrong, and nothing is written.
    """
    settings = settings or get_settings()
    by = require_reviewer(actor, Permission.JUDGE, bind=session)
    product = product.strip()
    if not product:
        raise ValueError("choose a product")
    specs = check_rubric(product, metrics)
    # The importers' lock before any write, as an import takes it: the scale change below waits for
    # an open import (`lib.snapshots.gaps_follow_scales`), and must not hold rows that import needs.
    one_writer_at_a_time(session, PG_IMPORT_LOCK)
    if name:
        name = judge_versions.check_name(name)
    _record_current(session, product, settings, by)
    _write_definitions(session, product, specs)
    config = current_config(session, product, settings)
    made = judge_versions.ensure_version(
        session=session,
        product=product,
        config=config,
        created_by=by,
        origin="rubric",
        name=name or None,
        description=description,
    )
    if made.created:
        judge_versions.record_change(
            session=session,
            identity=by,
            product=product,
            what=f"rubric saved as {made.version.name}{metric_changes_text(session, made)}",
        )
    return made


def metric_changes_text(session: Session, made: Ensured) -> str:
    """The metrics a version added or removed, as " (added tone; removed fluency)", else ""."""
    changes = judge_versions.changes_since_previous(session, made.version)
    parts = [
        f"{verb} {', '.join(c.metric for c in changes if c.label == label)}"
        for verb, label in (
            ("added", judge_versions.METRIC_ADDED),
            ("removed", judge_versions.METRIC_REMOVED),
        )
        if any(c.label == label for c in changes)
    ]
    return f" ({'; '.join(parts)})" if parts else ""


def _write_definitions(session: Session, product: str, specs: Sequence[MetricSpec]) -> None:
    """The product's metric definitions become exactly `specs`, in their order. A scale an import
    inferred stays inferred (it keeps growing with later imports) while the edit leaves it as it
    was; a scale the lead changed is theirs from then on."""
    with gaps_follow_scales(session, [product]):  # a scale the edit changes re-derives the gaps
        _replace_definitions(session, product, specs)


def _replace_definitions(session: Session, product: str, specs: Sequence[MetricSpec]) -> None:
    keep = {s.slug for s in specs}
    inferred: dict[str, tuple[float, float, bool]] = {}  # slug → its stored inferred scale
    for row in session.exec(select(MetricDefinition).where(col(MetricDefinition.product) == product)).all():
        if row.slug not in keep:
            session.delete(row)
        elif row.scale_inferred:
            inferred[row.slug] = (row.min_value, row.max_value, row.integer_scale)
    upsert_metric_definitions(
        session,
        [
            {
                "product": product,
                "slug": s.slug,
                "display_name": s.display_name,
                "min": s.min_value,
                "max": s.max_value,
                "integer_scale": s.integer_scale,
                "description": s.description,
                "position": i,
                # Unchanged: the union `upsert_metric_definitions` takes is the stored scale itself.
                "scale_inferred": inferred.get(s.slug) == (s.min_value, s.max_value, s.integer_scale),
            }
            for i, s in enumerate(specs)
        ],
    )
    session.flush()


# ---------------------------------------------------------------------------------------------
# Promotion from the alignment lab


def promote_arm(
    *,
    session: Session,
    experiment_id: int,
    arm: str,
    actor: Actor | str | None,
    name: str | None = None,
    settings: Settings | None = None,
) -> Ensured:
    """Make an experiment's arm the product's judge: a version recording the experiment, made current.

    The arm's switches become the judge's options (no history for `bare`/`notes`, no notes for
    `bare`/`history`, notes without tag relevance for `notes`); the `rubric` arm's edited text
    becomes the product's rubric. The judge model is the one the experiment ran with.
    """
    settings = settings or get_settings()
    by = require_reviewer(actor, Permission.JUDGE, bind=session)
    experiment = session.get(AlignmentExperiment, experiment_id)
    if experiment is None:
        raise VersionError(f"there is no alignment experiment #{experiment_id}")
    if arm not in (experiment.arms or []):
        raise VersionError(
            f"experiment #{experiment_id} has no arm {arm!r} (its arms: {', '.join(experiment.arms)})"
        )
    if name:
        name = judge_versions.check_name(name)
    product = experiment.product
    _record_current(session, product, settings, by)
    metrics = metrics_for_product(session=session, product=product)
    if arm == "rubric" and experiment.edited_rubric:
        edits = experiment.edited_rubric
        metrics = [replace(m, description=str(edits[m.slug])) if edits.get(m.slug) else m for m in metrics]
        _write_definitions(session, product, metrics)
    base = current_config(session, product, settings)
    options = dict(ARM_OPTIONS.get(arm, {}))
    if experiment.judge_model and not experiment.judge_model.startswith("scripted: "):
        options["judge_model"] = experiment.judge_model
    config = replace(base, **options)
    made = judge_versions.ensure_version(
        session=session,
        product=product,
        config=config,
        created_by=by,
        origin="lab",
        name=name or None,
        description=f"promoted from alignment experiment #{experiment_id}, arm {arm!r}",
        experiment_id=experiment_id,
        experiment_arm=arm,
    )
    judge_versions.set_current_options(session=session, version=made.version, set_by=by)
    judge_versions.record_change(
        session=session,
        identity=by,
        product=product,
        what=f"experiment #{experiment_id} arm {arm} promoted as {made.version.name}",
    )
    return made


# ---------------------------------------------------------------------------------------------
# Re-judging a sample with a version


@dataclass
class RejudgeReport:
    """What one re-judge run did, evaluation by evaluation."""

    product: str
    version: str
    sampled: int = 0
    replaced: int = 0  # unreviewed judgments that now carry the version's decision
    kept: int = 0  # reviewed judgments left as they were (the version's decision kept beside them)
    conflicts: int = 0  # reviewed judgments whose reviewer decision now corrects the new decision
    failed: list[tuple[str, str]] = field(default_factory=list)  # (snapshot id, why)

    def summary(self) -> str:
        return (
            f"re-judged {self.sampled - len(self.failed)} of {self.sampled} evaluations of {self.product} with "
            f"{self.version}: {self.replaced} judgments replaced, {self.kept} reviewed judgments kept, "
            f"{self.conflicts} kept with the reviewer's decision over the new one, {len(self.failed)} failed"
        )


def sample_evaluations(
    session: Session, product: str, size: int, *, seed: int = 0, reviewed_only: bool = True
) -> list[str]:
    """A seeded sample of the product's live evaluations that have judgments (reviewed ones by default)."""
    stmt = (
        select(EvaluationSnapshot.id)
        .join(Judgment, col(Judgment.snapshot_id) == col(EvaluationSnapshot.id))
        .where(col(EvaluationSnapshot.product) == product, col(EvaluationSnapshot.deleted_at).is_(None))
        .distinct()
        .order_by(col(EvaluationSnapshot.id))
    )
    if reviewed_only:
        stmt = stmt.where(col(Judgment.reviewed_at).is_not(None), col(Judgment.user_decision).is_not(None))
    ids = [str(i) for i in session.exec(stmt).all()]
    if size >= len(ids):
        return ids
    return sorted(random.Random(seed).sample(ids, size))


def rejudge_sample(
    *,
    engine: Engine,
    product: str,
    reviewer: Actor | str | None,
    version: str | None = None,
    size: int = 50,
    seed: int = 0,
    reviewed_only: bool = True,
    settings: Settings | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RejudgeReport:
    """Judge a sample of the product's evaluations again with `version` (default: the current judge).

    VersionError when the version cannot be run; an evaluation that fails is reported and skipped.
    """
    settings = settings or get_settings()
    actor = authorize(engine, reviewer, Permission.JUDGE)
    if not settings.llm_configured:
        raise VersionError(judge.llm.NOT_CONFIGURED_MESSAGE)
    if not 1 <= size <= REJUDGE_LIMIT:
        raise ValueError(f"a re-judge sample is 1 to {REJUDGE_LIMIT:,} evaluations, not {size}")
    product = product.strip()
    with session_scope(engine, read_only=True) as session:
        plan = judge.plan_run(session=session, product=product, settings=settings, version=version)
        chosen = sample_evaluations(session, product, size, seed=seed, reviewed_only=reviewed_only)
    version_id = judge.run_version_id(engine, plan, actor.identity)
    with session_scope(engine, read_only=True) as session:
        stored = session.get(judge_versions.JudgeVersion, version_id)
        label = judge_versions.version_label(stored)
    report = RejudgeReport(product=product, version=label, sampled=len(chosen))
    if progress:
        progress(0, len(chosen))
    for done, snapshot_id in enumerate(chosen, start=1):
        try:
            _rejudge_one(engine, snapshot_id, plan, version_id, actor, report)
        except (judge.JudgeFailed, ValueError, SQLAlchemyError) as exc:
            log.warning("re-judge of %s failed: %s", snapshot_id, exc)
            report.failed.append((snapshot_id, str(exc)))
        if progress:
            progress(done, len(chosen))
    return report


def _rejudge_one(
    engine: Engine,
    snapshot_id: str,
    plan: judge.RunPlan,
    version_id: int,
    actor: Actor,
    report: RejudgeReport,
) -> None:
    with session_scope(engine, read_only=True) as session:
        snapshot = session.get(EvaluationSnapshot, snapshot_id)
        if snapshot is None or snapshot.deleted_at is not None:
            raise ValueError("the evaluation was archived or deleted meanwhile")
        context = judge.load_context(
            session=session,
            evaluation=judge.blind_input(snapshot),
            settings=plan.settings,
            ranked_notes=plan.relevance,
            exclude_snapshot=snapshot_id,  # its own judgments are not its history
            metrics=plan.metrics,
        )
    result = judge.run_stage1(
        context.prepared,
        history_block=context.history_block,
        notes_block=context.notes_block,
        settings=plan.settings,
        eval_id=f"rejudge-{snapshot_id}",
    )
    now = utcnow()

    def store(session: Session) -> tuple[int, int, int]:
        """The verdicts as new judgments; (replaced, kept, conflicts), counted per attempt: a
        deadlock's victim runs again whole (`write_retrying`) and must not count twice."""
        replaced = kept = conflicts = 0
        # Checked again here: the judge ran for seconds since the first check, and an evaluation
        # archived meanwhile gets no new judgments (review10 L5).
        live = session.exec(
            select(EvaluationSnapshot.id).where(
                col(EvaluationSnapshot.id) == snapshot_id, col(EvaluationSnapshot.deleted_at).is_(None)
            )
        ).first()
        if live is None:
            raise ValueError("the evaluation was archived or deleted while the judge ran")
        stored = {
            j.metric: j
            for j in session.exec(select(Judgment).where(col(Judgment.snapshot_id) == snapshot_id)).all()
        }
        for slug, verdict in result.scores.items():
            existing = stored.get(slug)
            if existing is None or verdict.score is None:
                continue  # a re-judge re-decides what was judged; it adds no new metric
            fresh = Judgment(
                change_id=existing.change_id,
                product=existing.product,
                metric=slug,
                snapshot_id=snapshot_id,
                decision=format_score(verdict.score),
                confidence=verdict.confidence,
                reasoning=verdict.rationale,
                timestamp=now,
                url=existing.url,
                description=existing.description,
                ai_provider=existing.ai_provider,
                judge_model=plan.settings.judge_model,
                judge_version_id=version_id,
            )
            if existing.user_decision is None:
                replaced += 1
            elif same_decision(existing.user_decision, fresh.decision):
                kept += 1
            else:
                conflicts += 1
            session.expunge(existing)
            add_judgment(session=session, judgment=fresh, reviewer=actor)
        return replaced, kept, conflicts

    replaced, kept, conflicts = write_retrying(engine, store)
    report.replaced += replaced
    report.kept += kept
    report.conflicts += conflicts
