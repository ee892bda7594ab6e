"""Demo team review queues (issue 26): a team queue with overlap 2 over three reviewers and a
blind-first queue, worked part of the way through lib.queues itself — labels that agree and
resolve, disagreements a lead adjudicated and some still waiting, items nobody has taken yet — so
the queue pages and the agreement figures have real rows on first start. Deterministic: a seeded
random stream and a clock right after the demo's anchor."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlmodel import Session, col, select

from lib import queues
from lib.auth import Actor
from lib.corrections import decision_scale, format_score, parse_score
from lib.demo.inputs import DEMO_SEED, _rng, demo_anchor
from lib.models import Judgment, ReviewQueue, ReviewQueueJudgment

# Reasons by which way a label goes from the judge's score (a label set: "lower").
REASONS = {
    "lower": (
        "Misses a step the user needs to finish the task.",
        "States a limit the documentation does not give.",
        "Cites a passage that says something else.",
    ),
    "higher": (
        "The judge is too harsh: every claim checks out.",
        "Right answer; the extra context is useful, not padding.",
    ),
    "same": ("Agree with the judge.", "Reads fine to me.", ""),
}


def _reason(judge: str, label: str, rng: random.Random) -> str:
    a, b = parse_score(judge), parse_score(label)
    way = "same" if label == judge else ("lower" if a is None or b is None or b < a else "higher")
    return rng.choice(REASONS[way])


@dataclass(frozen=True)
class DemoQueue:
    """A queue to create and how far to work it."""

    spec: queues.QueueSpec
    lead: str
    labelled_items: int  # items both reviewers finish
    adjudicate: int  # disputes the lead decides (the rest keep waiting)
    agree: float  # chance a reviewer keeps the judge's score
    anchoring: float = 0.0  # blind-first: chance a final label moves to the judge's score


DEMO_QUEUES = (
    DemoQueue(
        spec=queues.QueueSpec(
            name="Acme support — second reviewer",
            description="The newest Acme support evaluations, each reviewed by two of the team.",
            product="acme-support",
            metrics=("truthfulness", "helpfulness", "clarity"),
            size=16,
            overlap=2,
            reviewers=("ben", "carla", "ayse"),
        ),
        lead="deniz",
        labelled_items=10,
        adjudicate=4,
        agree=0.8,
    ),
    DemoQueue(
        spec=queues.QueueSpec(
            name="Docsearch blind-first",
            description="Scored before the judge is shown: how far does seeing it move us?",
            product="docsearch-rag",
            size=8,
            order="random",
            seed=DEMO_SEED,
            overlap=2,
            mode="blind",
            tolerance=0.1,
            reviewers=("carla", "ben", "deniz"),
        ),
        lead="ayse",
        labelled_items=5,
        adjudicate=1,
        agree=0.55,
        anchoring=0.4,
    ),
)


def _neighbour(session: Session, judgment: Judgment, rng: random.Random) -> str:
    """A score next to the judge's on its scale (a label: another label)."""
    scale = decision_scale(session=session, judgment=judgment)
    if scale.spec is None:
        return rng.choice(
            [label for label in scale.labels if label != judgment.decision] or list(scale.labels)
        )
    judge = parse_score(judgment.decision) or scale.spec.min_value
    step = 1.0 if scale.spec.integer_scale else 0.2
    options = [v for v in (judge - step, judge + step) if scale.spec.min_value <= v <= scale.spec.max_value]
    return format_score(rng.choice(options) if options else judge)


def _work(session: Session, plan: DemoQueue, queue_id: int, rng: random.Random, start: int) -> int:
    """Reviewers take items in queue order and label them; returns how many labels were given."""
    reviewers = list(plan.spec.reviewers)
    given = 0
    minute = start
    for turn in range(plan.labelled_items):
        pair = [reviewers[turn % 3], reviewers[(turn + 1) % 3]]
        for name in pair:
            minute += rng.randint(4, 8)
            now = demo_anchor() + timedelta(minutes=minute)
            actor = Actor(name, "reviewer")
            got = queues.next_assignment(session=session, queue_id=queue_id, reviewer=actor, now=now)
            assert got is not None, f"demo queue {plan.spec.name}: no item for {name}"
            now += timedelta(seconds=rng.randint(40, 240))  # reading and scoring
            judgments = _judgments(session, got.item_id)
            chosen = {
                j.id: (j.decision if rng.random() < plan.agree else _neighbour(session, j, rng))
                for j in judgments
            }
            reasons = {j.id: _reason(j.decision, chosen[j.id], rng) for j in judgments}
            if got.blind:
                queues.label_item(
                    session=session, queue_id=queue_id, item_id=got.item_id, reviewer=actor, now=now,
                    labels=[queues.LabelInput(j.id or 0, chosen[j.id], reasons[j.id]) for j in judgments],
                )  # fmt: skip
                now += timedelta(minutes=1)
                chosen = {
                    j.id: (j.decision if rng.random() < plan.anchoring else chosen[j.id]) for j in judgments
                }
                reasons = {j.id: reasons[j.id] or _reason(j.decision, chosen[j.id], rng) for j in judgments}
            queues.label_item(
                session=session, queue_id=queue_id, item_id=got.item_id, reviewer=actor, now=now,
                labels=[queues.LabelInput(j.id or 0, chosen[j.id], reasons[j.id]) for j in judgments],
            )  # fmt: skip
            given += len(judgments)
    lead = Actor(plan.lead, "lead")
    for n, dispute in enumerate(queues.disputes(session=session, queue_id=queue_id, limit=plan.adjudicate)):
        decision = (
            (dispute.labels[n % len(dispute.labels)].decision or dispute.judgment.decision)
            if dispute.labels
            else dispute.judgment.decision
        )
        queues.adjudicate(
            session=session, queue_id=queue_id, judgment_id=dispute.judgment.id or 0, actor=lead,
            decision=decision, reason="Read both labels against the rubric.",
            now=demo_anchor() + timedelta(minutes=minute + 30 + n),
        )  # fmt: skip
    return given


def _judgments(session: Session, item_id: int) -> Sequence[Judgment]:
    ids = select(ReviewQueueJudgment.judgment_id).where(col(ReviewQueueJudgment.item_id) == item_id)
    return session.exec(select(Judgment).where(col(Judgment.id).in_(ids)).order_by(col(Judgment.id))).all()


def write_team_queues(session: Session, seed: int = DEMO_SEED) -> dict[str, int]:
    """Create and work the demo queues that do not exist yet; counts of what was added (the queue
    decisions are reviews of their judgments)."""
    rng = _rng(seed, "team-queues")
    counts = {"team queues": 0, "queue labels": 0, "queue decisions": 0}
    for n, plan in enumerate(DEMO_QUEUES):
        if (
            session.exec(select(ReviewQueue.id).where(col(ReviewQueue.name) == plan.spec.name)).first()
            is not None
        ):
            continue
        queue = queues.create_queue(session=session, actor=Actor(plan.lead, "lead"), spec=plan.spec)
        queue.created_at = demo_anchor() + timedelta(minutes=n)
        session.add(queue)
        counts["team queues"] += 1
        counts["queue labels"] += _work(session, plan, queue.id or 0, rng, start=10 + 200 * n)
        progress = queues.queue_progress(session=session, queue_id=queue.id or 0)
        counts["queue decisions"] += progress.decided
    session.flush()
    return counts
