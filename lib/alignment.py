"""Judge-alignment lab (issue 16): does the learning loop make the judge agree with reviewers?

An experiment takes a stratified-by-metric sample of reviewed judgments of one product and has
the product's Stage-1 judge (`lib.judge.run_stage1`, LLM only through `lib.llm`) re-judge every
sampled evaluation once per *arm*:

- `bare`: the rubric only;
- `history`: + the correction history (`lib.corrections.select_history`);
- `notes`: + the relevant notes, seed-000 query without tag relevance (`lib.notes.relevant_notes`);
- `full`: history + notes filtered and boosted by tag relevance (what a live judge run sees);
- `rubric`: `full` with the experiment's edited rubric text.

No leakage: history and notes are taken *as of* the judged evaluation's creation, without the
evaluation's own judgments (`as_of` / `exclude_snapshot` of the one selection function each).
Every arm is then measured against the reviewers' final decisions, per metric, with the
definitions of `lib.analytics` and seeded bootstrap intervals.

Runs are batch jobs: every (arm, evaluation) call is a row; a rerun continues with the calls that
are not done; a call that fails after the client's retries is recorded as failed (never a score);
a cancel flag on the experiment is read between calls.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from lib import analytics, llm, reliability
from lib.auth import Actor, Permission, authorize
from lib.config import Settings, get_settings
from lib.corrections import parse_score
from lib.db import session_scope
from lib.display import role_field
from lib.judge import JudgeFailed, blind_input, build_stage1_messages, load_context, run_stage1
from lib.metrics import MetricSpec, metrics_for_product
from lib.models import (
    ALIGNMENT_ARMS,
    AlignmentCall,
    AlignmentExperiment,
    AlignmentItem,
    EvaluationSnapshot,
    Judgment,
    utcnow,
)

log = logging.getLogger(__name__)

ARMS = ALIGNMENT_ARMS
BASELINE = "bare"
ARM_DESCRIPTIONS = {
    "bare": "rubric only",
    "history": "rubric + correction history",
    "notes": "rubric + relevant notes (no tag relevance)",
    "full": "rubric + history + notes filtered and boosted by tag relevance",
    "rubric": "full context with the edited rubric text",
}
# A judge model name with this prefix is a scripted policy (the demo's), not a model: the page says so.
SCRIPTED_JUDGE_PREFIX = "scripted: "
# The item frame's (and its CSV's) name for the reviewer's final score, lib.display's rule.
REVIEWER_DECISION = role_field("reviewer", "decision")
BOOTSTRAP_RESAMPLES = reliability.BOOTSTRAP_RESAMPLES
MEASURES = ("exact_agreement", "within_1_agreement", "weighted_kappa", "spearman", "mean_rescaled_gap")

Progress = Callable[[int, int], None]


class ExperimentError(ValueError):
    """An experiment that cannot be created or run as asked; nothing was changed."""


@dataclass(frozen=True)
class ExperimentSpec:
    """What a lead asks for: which reviewed judgments, how many, which arms."""

    product: str
    sample_size: int = 200
    seed: int = 0
    arms: tuple[str, ...] = ("bare", "full")
    metrics: tuple[str, ...] = ()
    language: str | None = None
    start: date | None = None
    end: date | None = None  # inclusive
    edited_rubric: dict[str, str] = field(default_factory=dict)
    name: str = ""
    created_by: Actor | str | None = None


def parse_arms(text: str) -> tuple[str, ...]:
    """`bare,full` as a tuple of known arms in the order given; ExperimentError names an unknown one."""
    arms = tuple(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ExperimentError(
            f"unknown arm(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(ARMS)}"
        )
    return arms


def rubric_edits(rubric: Sequence[MetricSpec], texts: dict[str, str]) -> dict[str, str]:
    """The `rubric` arm's edits from texts prefilled with the current rubric: only those changed.

    Unchanged or blank texts are dropped, so an untouched form leaves no edit and `create_experiment`
    refuses the arm with the same message as an empty `--rubric-file`.
    """
    current = {m.slug: m.description.strip() for m in rubric}
    return {
        slug: text.strip()
        for slug, text in texts.items()
        if text.strip() and text.strip() != current.get(slug, "")
    }


def _day_start(day: date) -> datetime:
    return datetime.combine(day, dtime.min, tzinfo=UTC)


def _check_spec(session: Session, spec: ExperimentSpec) -> list[MetricSpec]:
    if not spec.product.strip():
        raise ExperimentError("choose a product")
    if not 1 <= spec.sample_size <= 10_000:
        raise ExperimentError("the sample size must be between 1 and 10,000")
    parse_arms(",".join(spec.arms))
    rubric = metrics_for_product(session=session, product=spec.product)
    slugs = {m.slug for m in rubric}
    unknown = [m for m in (*spec.metrics, *spec.edited_rubric) if m not in slugs]
    if unknown:
        raise ExperimentError(f"{', '.join(unknown)}: not a metric of {spec.product!r}")
    if "rubric" in spec.arms and not any(t.strip() for t in spec.edited_rubric.values()):
        raise ExperimentError("the 'rubric' arm needs edited rubric text for at least one metric")
    if spec.start and spec.end and spec.start > spec.end:
        raise ExperimentError("the date range ends before it starts")
    return rubric


def reviewed_pool(session: Session, spec: ExperimentSpec) -> list[tuple[Judgment, EvaluationSnapshot, float]]:
    """Reviewed metric judgments of live evaluations matching the filters, with the reviewer's score."""
    stmt = (
        select(Judgment, EvaluationSnapshot)
        .join(EvaluationSnapshot, col(EvaluationSnapshot.id) == col(Judgment.snapshot_id))
        .where(
            col(Judgment.product) == spec.product,
            col(Judgment.reviewed_at).is_not(None),
            col(Judgment.user_decision).is_not(None),
            col(Judgment.metric).is_not(None),
            col(EvaluationSnapshot.deleted_at).is_(None),
        )
        .order_by(col(Judgment.id))
    )
    if spec.metrics:
        stmt = stmt.where(col(Judgment.metric).in_(spec.metrics))
    if spec.language:
        stmt = stmt.where(col(EvaluationSnapshot.language) == spec.language)
    if spec.start:
        stmt = stmt.where(col(EvaluationSnapshot.created_at) >= _day_start(spec.start))
    if spec.end:
        stmt = stmt.where(col(EvaluationSnapshot.created_at) < _day_start(spec.end + timedelta(days=1)))
    pool = []
    for judgment, snapshot in session.exec(stmt).all():
        score = parse_score(judgment.user_decision)
        if score is not None:
            pool.append((judgment, snapshot, score))
    return pool


def stratified_sample(metrics: Sequence[str], size: int, seed: int) -> list[int]:
    """Indexes of a sample of `size` drawn per metric in proportion to its share (largest remainder).

    Deterministic for a seed: strata in sorted order, numpy's seeded generator within each.
    """
    strata: dict[str, list[int]] = defaultdict(list)
    for i, metric in enumerate(metrics):
        strata[metric].append(i)
    total = len(metrics)
    if size >= total:
        return list(range(total))
    names = sorted(strata)
    exact = {m: size * len(strata[m]) / total for m in names}
    quota = {m: int(exact[m]) for m in names}
    for m in sorted(names, key=lambda m: (-(exact[m] - quota[m]), m))[: size - sum(quota.values())]:
        quota[m] += 1
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for m in names:
        members = strata[m]
        chosen.extend(int(i) for i in rng.choice(members, size=min(quota[m], len(members)), replace=False))
    return sorted(chosen)


def is_scripted(judge_model: str | None) -> bool:
    """True when an experiment's judge was a scripted policy, so its figures say nothing about a model."""
    return str(judge_model or "").startswith(SCRIPTED_JUDGE_PREFIX)


def create_experiment(engine: Engine, spec: ExperimentSpec, *, settings: Settings | None = None) -> int:
    """Sample, then write the experiment, its items and one pending call per arm and evaluation.

    `settings` names the judge model recorded with it (the one `run_experiment` will be given).
    """
    with session_scope(engine) as session:
        created_by = authorize(session, spec.created_by, Permission.JUDGE).identity or None
        _check_spec(session, spec)
        pool = reviewed_pool(session, spec)
        if not pool:
            raise ExperimentError(f"{spec.product!r} has no reviewed judgments matching the filters")
        picked = [
            pool[i]
            for i in stratified_sample([j.metric or "" for j, _, _ in pool], spec.sample_size, spec.seed)
        ]
        experiment = AlignmentExperiment(
            name=spec.name or f"{spec.product} · {', '.join(spec.arms)}",
            product=spec.product,
            metrics=list(spec.metrics),
            language=spec.language,
            start_date=_day_start(spec.start) if spec.start else None,
            end_date=_day_start(spec.end) if spec.end else None,
            sample_size=spec.sample_size,
            seed=spec.seed,
            arms=list(spec.arms),
            edited_rubric=dict(spec.edited_rubric),
            judge_model=(settings or get_settings()).judge_model,
            created_by=created_by,
        )
        session.add(experiment)
        session.flush()
        assert experiment.id is not None
        snapshots: dict[str, None] = {}
        for judgment, snapshot, score in picked:
            assert judgment.id is not None
            snapshots[snapshot.id] = None
            session.add(
                AlignmentItem(
                    experiment_id=experiment.id,
                    judgment_id=judgment.id,
                    snapshot_id=snapshot.id,
                    metric=judgment.metric or "",
                    reviewer_score=score,
                    original_score=parse_score(judgment.decision),
                    as_of=snapshot.created_at,
                )
            )
        session.add_all(
            AlignmentCall(experiment_id=experiment.id, arm=arm, snapshot_id=sid)
            for arm in spec.arms
            for sid in snapshots
        )
        return experiment.id


def find_unfinished(session: Session, spec: ExperimentSpec) -> int | None:
    """The newest unfinished (also cancelled or incomplete) experiment with exactly these parameters.

    Rerunning the same command continues it rather than sampling a new one.
    """
    rows = session.exec(
        select(AlignmentExperiment)
        .where(
            col(AlignmentExperiment.product) == spec.product,
            col(AlignmentExperiment.sample_size) == spec.sample_size,
            col(AlignmentExperiment.seed) == spec.seed,
            col(AlignmentExperiment.status) != "finished",
        )
        .order_by(col(AlignmentExperiment.id).desc())
    ).all()
    for row in rows:
        if (
            tuple(row.arms) == spec.arms
            and tuple(row.metrics) == spec.metrics
            and row.language == spec.language
            and row.edited_rubric == dict(spec.edited_rubric)
            and (row.start_date.date() if row.start_date else None) == spec.start
            and (row.end_date.date() if row.end_date else None) == spec.end
        ):
            return row.id
    return None


def request_cancel(engine: Engine, experiment_id: int, *, by: Actor | str | None) -> None:
    """Ask a running experiment to stop (whoever may start one); workers read the flag before each call."""
    with session_scope(engine) as session:
        authorize(session, by, Permission.JUDGE)
        experiment = session.get(AlignmentExperiment, experiment_id)
        if experiment is None:
            raise ExperimentError(f"no experiment {experiment_id}")
        experiment.cancel_requested = True
        session.add(experiment)


def _cancelled(engine: Engine, experiment_id: int) -> bool:
    """Cancel requested, or the experiment deleted (its product's judgments were cleared)."""
    with session_scope(engine, read_only=True) as session:
        flag = session.exec(
            select(AlignmentExperiment.cancel_requested).where(col(AlignmentExperiment.id) == experiment_id)
        ).first()
    return flag is None or bool(flag)


def call_counts(session: Session, experiment_id: int) -> dict[str, int]:
    """Calls per status (pending / done / failed) of an experiment: its progress."""
    rows = session.exec(
        select(AlignmentCall.status, func.count())
        .where(col(AlignmentCall.experiment_id) == experiment_id)
        .group_by(col(AlignmentCall.status))
    ).all()
    counts = {"pending": 0, "done": 0, "failed": 0}
    counts.update({status: int(n) for status, n in rows})
    return counts


def _arm_metrics(session: Session, experiment: AlignmentExperiment, arm: str) -> list[MetricSpec]:
    rubric = metrics_for_product(session=session, product=experiment.product)
    if arm != "rubric":
        return rubric
    edits = experiment.edited_rubric
    return [replace(m, description=str(edits[m.slug])) if edits.get(m.slug) else m for m in rubric]


def arm_prompt(
    session: Session,
    experiment: AlignmentExperiment,
    arm: str,
    snapshot: EvaluationSnapshot,
    settings: Settings,
) -> Any:
    """The judge context an arm gives one evaluation: what it saw, as of the evaluation's creation."""
    evaluation = blind_input(snapshot)  # as in Stage 1
    return load_context(
        session=session,
        evaluation=evaluation,
        settings=settings,
        notes_block="" if arm in ("bare", "history") else None,
        with_history=arm in ("history", "full", "rubric"),
        ranked_notes=arm != "notes",
        as_of=snapshot.created_at,
        exclude_snapshot=snapshot.id,
        metrics=_arm_metrics(session, experiment, arm),
    )


def run_call(engine: Engine, call_id: int, settings: Settings) -> str:
    """Re-judge one evaluation for one arm and record the outcome; returns the call's new status."""
    with session_scope(engine, read_only=True) as session:
        call = session.get(AlignmentCall, call_id)
        experiment = session.get(AlignmentExperiment, call.experiment_id) if call is not None else None
        if call is None or experiment is None:
            return "deleted"  # the product's judgments were cleared while the run went on
        snapshot = session.get(EvaluationSnapshot, call.snapshot_id)
        prompt_text, context, problem = None, None, None
        if snapshot is None:
            problem = "the evaluation was deleted"
        else:
            try:
                context = arm_prompt(session, experiment, call.arm, snapshot, settings)
            except ValueError as exc:
                problem = f"the evaluation does not fit the judge: {exc}"
    scores: dict[str, Any] = {}
    started = time.monotonic()
    with llm.metered() as usage:
        if context is not None:
            messages = build_stage1_messages(
                context.prepared, history_block=context.history_block, notes_block=context.notes_block
            )
            prompt_text = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
            try:
                result = run_stage1(
                    context.prepared,
                    history_block=context.history_block,
                    notes_block=context.notes_block,
                    settings=settings,
                    eval_id=f"align-{call_id}",
                )
                scores = {slug: j.score for slug, j in result.scores.items()}
            except JudgeFailed as exc:
                problem = f"{exc.stage}: {exc}"
    wall = time.monotonic() - started
    with session_scope(engine) as session:
        row = session.get(AlignmentCall, call_id)
        if row is None:
            return "deleted"
        row.status = "failed" if problem else "done"
        row.error = problem
        row.scores = scores if not problem else {}
        row.prompt = prompt_text
        row.llm_calls = usage.calls
        row.prompt_tokens = usage.prompt_tokens
        row.completion_tokens = usage.completion_tokens
        row.wall_seconds = wall
        row.finished_at = utcnow()
        session.add(row)
        return row.status


@dataclass(frozen=True)
class RunReport:
    """What one run of an experiment did."""

    experiment_id: int
    status: str
    done: int
    failed: int
    pending: int


def run_experiment(
    engine: Engine,
    experiment_id: int,
    *,
    concurrency: int = 1,
    settings: Settings | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Run every call not yet done (failed ones are retried); stops early when cancelled."""
    settings = settings or get_settings()
    if not settings.llm_configured:
        raise ExperimentError(llm.NOT_CONFIGURED_MESSAGE)
    if not 1 <= concurrency <= 64:
        raise ExperimentError("concurrency must be between 1 and 64")
    with session_scope(engine) as session:
        experiment = session.get(AlignmentExperiment, experiment_id)
        if experiment is None:
            raise ExperimentError(f"no experiment {experiment_id}")
        experiment.status, experiment.cancel_requested = "running", False
        session.add(experiment)
        todo = list(
            session.exec(
                select(AlignmentCall.id)
                .where(col(AlignmentCall.experiment_id) == experiment_id, col(AlignmentCall.status) != "done")
                .order_by(col(AlignmentCall.snapshot_id), col(AlignmentCall.arm))
            ).all()
        )
        total = int(
            session.exec(select(func.count()).where(col(AlignmentCall.experiment_id) == experiment_id)).one()
        )
    finished = total - len(todo)
    say = progress or (lambda _done, _total: None)
    say(finished, total)

    def one(call_id: int) -> str | None:
        if _cancelled(engine, experiment_id):
            return None
        return run_call(engine, call_id, settings)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for outcome in pool.map(one, todo):
            if outcome is not None:
                finished += 1
                say(finished, total)
    with session_scope(engine) as session:
        experiment = session.get(AlignmentExperiment, experiment_id)
        counts = call_counts(session, experiment_id)
        if experiment is None:  # deleted with its product's judgments while it ran
            return RunReport(experiment_id, "deleted", counts["done"], counts["failed"], counts["pending"])
        if experiment.cancel_requested:
            experiment.status = "cancelled"
        elif counts["failed"]:
            experiment.status = "incomplete"  # a rerun retries the failed calls
        elif counts["pending"] == 0:
            experiment.status, experiment.finished_at = "finished", utcnow()
        session.add(experiment)
        status = experiment.status
    return RunReport(experiment_id, status, counts["done"], counts["failed"], counts["pending"])


# ---------------------------------------------------------------------------------------------
# Measures


def item_frame(session: Session, experiment_id: int) -> pd.DataFrame:
    """One row per sampled item and arm: reviewer's score, the arm's score (NaN when failed/missing)."""
    items = session.exec(select(AlignmentItem).where(col(AlignmentItem.experiment_id) == experiment_id)).all()
    calls = session.exec(select(AlignmentCall).where(col(AlignmentCall.experiment_id) == experiment_id)).all()
    by_key = {(c.arm, c.snapshot_id): c for c in calls}
    arms = sorted({c.arm for c in calls}, key=ARMS.index)
    rows = []
    for item in items:
        for arm in arms:
            call = by_key.get((arm, item.snapshot_id))
            score = (
                parse_score((call.scores or {}).get(item.metric)) if call and call.status == "done" else None
            )
            rows.append(
                {
                    "item_id": item.id,
                    "snapshot_id": item.snapshot_id,
                    "judgment_id": item.judgment_id,
                    "metric": item.metric,
                    "arm": arm,
                    "call_status": call.status if call else "missing",
                    REVIEWER_DECISION: item.reviewer_score,
                    "original_score": item.original_score,
                    "arm_score": np.nan if score is None else score,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "item_id",
            "snapshot_id",
            "judgment_id",
            "metric",
            "arm",
            "call_status",
            REVIEWER_DECISION,
            "original_score",
            "arm_score",
        ],
    )


def _measures(u: np.ndarray, j: np.ndarray, spec: MetricSpec) -> dict[str, float]:
    gaps = analytics.rescaled_gaps(u, j, spec.min_value, spec.max_value)
    return {
        "exact_agreement": float(np.mean(u == j)),
        "within_1_agreement": float(np.mean(analytics.within_one(gaps))),
        "weighted_kappa": reliability.kappa(u, j, weights="quadratic")
        if spec.integer_scale
        else float("nan"),
        "spearman": analytics.spearman_rho(u, j),
        "mean_rescaled_gap": float(np.mean(gaps)),
    }


def _bootstrap(
    u: np.ndarray, j: np.ndarray, spec: MetricSpec, resamples: int, seed: int
) -> dict[str, tuple[float, float]]:
    """Percentile 95 % intervals from `resamples` seeded resamples of the items.

    Each resample is read as a contingency table of its (reviewer, arm) score pairs, so every
    measure of every resample is computed at once, with the rules `_measures` uses (1000 resamples
    one at a time took ~0.3 s per arm and metric: 8 s for the demo's page on every rerun).
    """
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(u), size=(resamples, len(u)))
    categories = np.unique(np.concatenate([u, j]))
    k = len(categories)
    cells = np.searchsorted(categories, u) * k + np.searchsorted(categories, j)
    offsets = np.arange(resamples)[:, None] * (k * k)
    tables = np.bincount((cells[draws] + offsets).ravel(), minlength=resamples * k * k)
    tables = tables.reshape(resamples, k, k).astype(float)
    gaps = analytics.rescaled_gaps(u, j, spec.min_value, spec.max_value)
    values = {
        "exact_agreement": np.trace(tables, axis1=1, axis2=2) / len(u),
        "within_1_agreement": analytics.within_one(gaps)[draws].mean(axis=1),
        "weighted_kappa": reliability.kappas(tables, categories, "quadratic")
        if spec.integer_scale
        else np.full(resamples, np.nan),
        "spearman": analytics.spearman_of_tables(tables),
        "mean_rescaled_gap": gaps[draws].mean(axis=1),
    }
    return {name: reliability.percentile_interval(values[name]) for name in MEASURES}


@dataclass(frozen=True)
class AlignmentReport:
    """Measures per arm and metric, the paired comparison with `bare`, flipped items and cost."""

    measures: pd.DataFrame
    paired: pd.DataFrame
    flips: pd.DataFrame
    cost: pd.DataFrame


def measure(
    session: Session, experiment_id: int, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> AlignmentReport:
    """Every arm against the reviewers' final decisions (failed calls are left out and counted)."""
    experiment = session.get(AlignmentExperiment, experiment_id)
    if experiment is None:
        raise ExperimentError(f"no experiment {experiment_id}")
    specs = {m.slug: m for m in metrics_for_product(session=session, product=experiment.product)}
    frame = item_frame(session, experiment_id)
    rows = []
    for (arm, metric), group in frame.groupby(["arm", "metric"], sort=False):
        scored = group.dropna(subset=["arm_score"])
        row: dict[str, Any] = {"arm": arm, "metric": metric, "items": len(group), "pairs": len(scored)}
        spec = specs.get(str(metric))
        if spec is not None and len(scored):
            u, j = scored[REVIEWER_DECISION].to_numpy(float), scored["arm_score"].to_numpy(float)
            row.update(_measures(u, j, spec))
            for name, (lo, hi) in _bootstrap(u, j, spec, resamples, seed).items():
                row[f"{name}_lo"], row[f"{name}_hi"] = lo, hi
        rows.append(row)
    columns = ["arm", "metric", "items", "pairs", *[f"{m}{s}" for m in MEASURES for s in ("", "_lo", "_hi")]]
    measures = pd.DataFrame(rows).reindex(columns=columns)
    measures = measures.sort_values(
        ["metric", "arm"], key=lambda s: s.map(ARMS.index) if s.name == "arm" else s
    )

    flips, paired = _paired(frame)
    calls = session.exec(select(AlignmentCall).where(col(AlignmentCall.experiment_id) == experiment_id)).all()
    cost = pd.DataFrame(
        [
            {
                "arm": c.arm,
                "done": int(c.status == "done"),
                "failed": int(c.status == "failed"),
                "llm_calls": c.llm_calls,
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "wall_seconds": c.wall_seconds,
            }
            for c in calls
        ],
        columns=["arm", "done", "failed", "llm_calls", "prompt_tokens", "completion_tokens", "wall_seconds"],
    )
    cost = cost.groupby("arm", sort=False).sum().reset_index() if len(cost) else cost
    return AlignmentReport(measures.reset_index(drop=True), paired, flips, cost)


def display_frame(report: AlignmentReport) -> pd.DataFrame:
    """The comparison table as people read it: each measure with its 95 % interval in one cell."""
    columns = ["arm", "metric", "pairs", *[f"{m}{s}" for m in MEASURES for s in ("", "_lo", "_hi")]]
    return reliability.with_interval_text(report.measures[columns], MEASURES)


def _paired(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per item, each arm against `bare`: flipped to agree (bare wrong, arm exact) or away."""
    empty = pd.DataFrame(columns=["arm", "metric", "pairs", "flipped_to_agree", "flipped_away", "net"])
    if BASELINE not in set(frame["arm"]) or set(frame["arm"]) == {BASELINE}:
        return pd.DataFrame(), empty
    base = frame[frame["arm"] == BASELINE].set_index("item_id")["arm_score"].rename("bare_score")
    others = (
        frame[frame["arm"] != BASELINE].join(base, on="item_id").dropna(subset=["arm_score", "bare_score"])
    )
    if others.empty:
        return pd.DataFrame(), empty
    agree_bare = others["bare_score"] == others[REVIEWER_DECISION]
    agree_arm = others["arm_score"] == others[REVIEWER_DECISION]
    others = others.assign(
        direction=np.select([~agree_bare & agree_arm, agree_bare & ~agree_arm], ["to_agree", "away"], "")
    )
    flips = others[others["direction"] != ""].reset_index(drop=True)
    summary = (
        others.groupby(["arm", "metric"], sort=False)
        .agg(
            pairs=("item_id", "size"),
            flipped_to_agree=("direction", lambda d: int((d == "to_agree").sum())),
            flipped_away=("direction", lambda d: int((d == "away").sum())),
        )
        .reset_index()
    )
    summary["net"] = summary["flipped_to_agree"] - summary["flipped_away"]
    return flips, summary if len(summary) else empty


# ---------------------------------------------------------------------------------------------
# For the page


def experiments_frame(session: Session) -> pd.DataFrame:
    """Every experiment, newest first, with its progress (for the page's selector and table)."""
    rows = session.exec(select(AlignmentExperiment).order_by(col(AlignmentExperiment.id).desc())).all()
    out = []
    for e in rows:
        assert e.id is not None
        counts = call_counts(session, e.id)
        out.append(
            {
                "id": e.id,
                "name": e.name,
                "product": e.product,
                "arms": ", ".join(e.arms),
                "status": e.status,
                "done": counts["done"],
                "failed": counts["failed"],
                "pending": counts["pending"],
                "judge_model": e.judge_model,
                "edited_rubric": dict(e.edited_rubric or {}),
                "created_at": e.created_at,
                "created_by": e.created_by,
            }
        )
    columns = ["id", "name", "product", "arms", "status", "done", "failed", "pending", "judge_model"]
    return pd.DataFrame(out, columns=[*columns, "edited_rubric", "created_at", "created_by"])


CALL_COLUMNS = (
    "arm", "snapshot_id", "status", "error", "scores", "llm_calls", "prompt_tokens",
    "completion_tokens", "wall_seconds", "finished_at", "prompt",
)  # fmt: skip


def calls_frame(session: Session, experiment_id: int) -> pd.DataFrame:
    """Every call of an experiment with the prompt it sent, the scores or error it got and its cost.

    The page's "everything" CSV: with it a reader can redo any measure or check any prompt.
    """
    calls = session.exec(
        select(AlignmentCall)
        .where(col(AlignmentCall.experiment_id) == experiment_id)
        .order_by(col(AlignmentCall.snapshot_id), col(AlignmentCall.arm))
    ).all()
    rows = [{name: getattr(c, name) for name in CALL_COLUMNS} for c in calls]
    for row in rows:
        row["scores"] = json.dumps(row["scores"] or {}, ensure_ascii=False, sort_keys=True)
    return pd.DataFrame(rows, columns=list(CALL_COLUMNS))


def call_prompt(session: Session, experiment_id: int, arm: str, snapshot_id: str) -> AlignmentCall | None:
    """The call of one arm on one evaluation: the prompt it sent and the scores it got."""
    return session.exec(
        select(AlignmentCall).where(
            col(AlignmentCall.experiment_id) == experiment_id,
            col(AlignmentCall.arm) == arm,
            col(AlignmentCall.snapshot_id) == snapshot_id,
        )
    ).first()


def start_in_background(engine: Engine, experiment_id: int, *, concurrency: int = 1) -> threading.Thread:
    """Run an experiment in a daemon thread (the page); progress and results are read from its rows."""

    def work() -> None:
        try:
            run_experiment(engine, experiment_id, concurrency=concurrency)
        except Exception:  # a background run must log, not vanish
            log.exception("alignment experiment %s stopped", experiment_id)

    thread = threading.Thread(target=work, name=f"alignment-{experiment_id}", daemon=True)
    thread.start()
    return thread


def latest_per_product(session: Session) -> dict[str, int]:
    """The newest experiment id of each product (the Analytics page links them)."""
    newest = (
        select(AlignmentExperiment.product, func.max(AlignmentExperiment.id))
        .group_by(col(AlignmentExperiment.product))
        .order_by(col(AlignmentExperiment.product))
    )
    return {product: int(experiment_id) for product, experiment_id in session.exec(newest).all()}
