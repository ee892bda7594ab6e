"""Demo judge versions (issue 28): three versions of acme-support's judge, one better, one worse.

- `v1: launch rubric` is the configuration the demo's acme-support evaluations were judged with
  (their import names it, so every one of them carries it);
- `v2: stricter rubric` is a rubric edit (`lib.judge_changes.save_rubric`, the page's own path, so
  its diff is recorded) whose re-judge agrees with reviewers more often;
- `v3: small model, no history` switches to a smaller model without correction history and agrees
  less often.

v2 and v3 re-judged samples of the reviewed acme-support judgments in the last weeks before the
demo's anchor; their decisions are written as verdicts beside the judgments' own (the seed-004
"kept" outcome of a re-judge), so "same items only" has items to compare and the timeline marks
where each version started. The decisions come from a seeded policy, not an LLM.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import insert
from sqlmodel import Session, col, select

from lib import judge_changes, judge_versions, version_counts
from lib.auth import system_actor
from lib.config import get_settings
from lib.corrections import format_score, parse_score
from lib.demo.inputs import DEMO_AUTHOR, DEMO_SEED, _read_input, _rng, demo_anchor
from lib.metrics import metrics_for_product
from lib.models import JudgeVerdict, Judgment
from lib.scores import utc_day, week_of

PRODUCT = "acme-support"
V1 = "v1: launch rubric"
V2 = "v2: stricter rubric"
V3 = "v3: small model, no history"
STRICTER = " Be strict: a claim the answer does not support lowers the score, however fluent the text."
SAMPLE = 140  # reviewed judgments each later version re-judged


def ensure_first_version(session: Session) -> str:
    """Record acme-support's launch configuration as v1 (before the import that names it)."""
    config = replace(
        judge_changes.current_config(session, PRODUCT, get_settings()),
        judge_model=_read_input("products.json")["judge_model"],
    )
    if judge_versions.version_by_name(session, PRODUCT, V1) is None:
        judge_versions.ensure_version(
            session=session,
            product=PRODUCT,
            config=config,
            created_by=DEMO_AUTHOR,
            origin="demo",
            name=V1,
            description="the rubric the product launched with",
        )
    return V1


def with_first_version(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """acme-support's demo evaluations naming v1 as their judge version, as a team's pipeline would."""
    return [{**r, "judge_version": V1} if r.get("product") == PRODUCT else r for r in records]


def write_later_versions(session: Session, seed: int = DEMO_SEED) -> int:
    """v2 (rubric edit, better) and v3 (smaller model, worse) with their re-judge verdicts; returns verdicts written."""
    if judge_versions.version_by_name(session, PRODUCT, V2) is not None:
        return 0
    metrics = metrics_for_product(session=session, product=PRODUCT)
    edited = [
        {
            "slug": m.slug,
            "display_name": m.display_name,
            "min": m.min_value,
            "max": m.max_value,
            "integer_scale": m.integer_scale,
            "description": (m.description + STRICTER) if i == 0 else m.description,
        }
        for i, m in enumerate(metrics)
    ]
    actor = system_actor(DEMO_AUTHOR)
    v2 = judge_changes.save_rubric(
        session=session,
        product=PRODUCT,
        metrics=edited,
        actor=actor,
        name=V2,
        description="the first metric's rubric asks for strictness on unsupported claims",
    ).version
    v3 = judge_versions.ensure_version(
        session=session,
        product=PRODUCT,
        config=replace(judge_versions.JudgeConfig.of(v2), judge_model="gpt-4o-mini", history_entries=0),
        created_by=DEMO_AUTHOR,
        origin="demo",
        name=V3,
        description="a cheaper model without the correction history",
    ).version
    anchor = demo_anchor()
    v2.created_at, v3.created_at = anchor - timedelta(days=21), anchor - timedelta(days=8)
    session.add_all([v2, v3])
    scales = {m.slug: m for m in metrics}
    reviewed = session.exec(
        select(Judgment)
        .where(
            col(Judgment.product) == PRODUCT,
            col(Judgment.user_decision).is_not(None),
            col(Judgment.reviewed_at).is_not(None),
            col(Judgment.metric).is_not(None),
        )
        .order_by(col(Judgment.id))
    ).all()
    rng = _rng(seed, "judge versions")
    rows: list[dict[str, Any]] = []
    for version, better, start_days, span in ((v2, True, 21, 13), (v3, False, 8, 7)):
        chosen = rng.sample(list(reviewed), min(SAMPLE, len(reviewed)))
        for j in chosen:
            spec = scales.get(str(j.metric))
            decision = _policy(rng, j.decision, str(j.user_decision), spec, better=better)
            if decision is None:
                continue
            judged_at = anchor - timedelta(days=start_days) + timedelta(hours=rng.uniform(0, span * 24))
            rows.append(
                {
                    "judgment_id": j.id,
                    "judge_version_id": version.id,
                    "decision": decision,
                    "confidence": None,
                    "reasoning": "re-judged (demo)",
                    "judged_at": judged_at,
                    "week": week_of(utc_day(judged_at)),
                }
            )
    if rows:
        session.execute(insert(JudgeVerdict.__table__), rows)  # type: ignore[attr-defined]
        version_counts.rebuild(session)
        version_counts.rebuild_totals(session)
        version_counts.rebuild_pairs(session)
    return len(rows)


def _policy(rng: random.Random, judged: str, human: str, spec: Any, *, better: bool) -> str | None:
    """The version's decision: a better one moves to the reviewer's decision more often, a worse one away."""
    d, h = parse_score(judged), parse_score(human)
    if d is None or h is None or spec is None:
        return None
    step = 1.0 if spec.integer_scale else (spec.max_value - spec.min_value) / 4
    if better:
        value = h if rng.random() < 0.7 else d
    elif rng.random() < 0.55:
        away = -1.0 if h > d else 1.0 if h < d else rng.choice((-1.0, 1.0))
        value = min(spec.max_value, max(spec.min_value, d + away * step))
    else:
        value = d
    return format_score(round(value, 2))
