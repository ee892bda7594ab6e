"""Demo notes, judge-run session audits and tag relevance (seeds 000 and 001)."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlmodel import Session, col

from lib import relevance
from lib.config import get_settings
from lib.demo.evaluations import DemoEvaluations
from lib.demo.inputs import (
    DEFAULT_SLUGS,
    DEMO_SEED,
    _choose,
    _inputs,
    _read_input,
    _rng,
    _short_model,
    _weighted,
    demo_anchor,
)
from lib.models import (
    LessonMatchStat,
    LessonTagRelevance,
    ProcessedRelevanceSession,
    SessionAudit,
    SessionNote,
    TagRelevanceEvent,
)


@dataclass
class DemoSession:
    """One judge run: its seed-000 session id, context, and when it ran."""

    session_id: str
    started: datetime
    language: str
    product: str
    metric: str
    model: str


@dataclass
class DemoNotes:
    """Note records (importer format) with their relevance profiles, and the judge-run sessions."""

    records: list[dict[str, Any]]
    profiles: list[dict[str, Any]]  # helps / hurts / pinned per record, same order
    sessions: list[DemoSession]


_SESSION_PRODUCTS = {"tr": ["mentor-tr"], "en": ["acme-support", "docsearch-rag"], "es": ["acme-support"]}
# Languages of the twelve note-writing sessions, oldest first (seed 000 runs are per language).
_NOTE_SESSION_LANGUAGES = ["en", "tr", "en", "es", "tr", "en", "tr", "en", "es", "tr", "en", "en"]
_EXTRA_RUN_LANGUAGES = ["en", "tr", "en", "tr", "en", "en", "tr", "en", "es", "tr"]


def _session_id(moment: datetime, rng: random.Random) -> str:
    """Seed 000: `YYYYMMDD_HHMMSS_PID_RANDOM`."""
    return f"{moment:%Y%m%d_%H%M%S}_{rng.randint(1200, 64000)}_{rng.randint(100, 999)}"


def build_notes(seed: int = DEMO_SEED) -> DemoNotes:
    """90 notes of all five types over twelve sessions, plus the other judge runs of the period."""
    config = _read_input("products.json")
    anchor = demo_anchor()
    span = config["span_days"]
    rng = _rng(seed, "notes")
    products = {p["name"]: p for p in config["products"]}

    def make_session(started: datetime, language: str) -> DemoSession:
        product = products[_choose(rng, _SESSION_PRODUCTS[language])]
        metrics = [m["slug"] for m in product.get("rubric") or []] or list(DEFAULT_SLUGS)
        return DemoSession(
            session_id=_session_id(started, rng),
            started=started,
            language=language,
            product=product["name"],
            metric=_choose(rng, metrics),
            model=_short_model(_weighted(rng, product["models"])["name"]),
        )

    note_sessions = []
    for k, language in enumerate(_NOTE_SESSION_LANGUAGES):
        day = span - 2 - k * (span - 6) / len(_NOTE_SESSION_LANGUAGES) - rng.uniform(0, 2)
        started = (anchor - timedelta(days=day)).replace(
            hour=rng.randint(9, 16), minute=rng.randint(0, 59), second=rng.randint(0, 59), microsecond=0
        )
        note_sessions.append(make_session(started, language))

    raw = _inputs("notes.json")
    slots: dict[str, list[DemoSession]] = defaultdict(list)
    for s in note_sessions:
        slots[s.language].append(s)
    turn: dict[str, int] = defaultdict(int)
    records, profiles = [], []
    offsets: dict[str, int] = defaultdict(int)
    for note in raw:
        language = note["language"]
        if language:
            pool = slots[language]
            target = pool[turn[language] % len(pool)]
        else:
            target = note_sessions[turn[""] % len(note_sessions)]
        turn[language] += 1
        offsets[target.session_id] += rng.randint(2, 19)
        stamp = target.started + timedelta(minutes=offsets[target.session_id], seconds=rng.randint(0, 59))
        record = {
            "timestamp": stamp.isoformat(),
            "language": language,
            "note_type": note["note_type"],
            "content": note["content"],
            "session_id": target.session_id,
        }
        if note.get("phelps_code"):
            record["phelps_code"] = note["phelps_code"]
            record["confidence"] = note["confidence"]
        records.append(record)
        profiles.append(
            {
                "helps": note.get("helps", []),
                "hurts": note.get("hurts", []),
                "pinned": bool(note.get("pinned")),
            }
        )

    runs = list(note_sessions)
    for k in range(28):
        language = _EXTRA_RUN_LANGUAGES[k % len(_EXTRA_RUN_LANGUAGES)]
        day = span - 8 - k * (span - 9) / 28 - rng.uniform(0, 1.5)
        started = (anchor - timedelta(days=day)).replace(
            hour=rng.randint(8, 19), minute=rng.randint(0, 59), second=rng.randint(0, 59), microsecond=0
        )
        runs.append(make_session(started, language))
    runs.sort(key=lambda s: s.started)
    return DemoNotes(records=records, profiles=profiles, sessions=runs)


def _raw_relevance(
    note: Mapping[str, Any],
    profile: Mapping[str, Any],
    run: DemoSession,
    tags: Sequence[str],
    rng: random.Random,
) -> float:
    """What the evaluator would say about a shown note in this run: helpful, neutral or harmful."""
    if "*" in profile["helps"]:
        base = 0.85
    else:
        language = note["language"]
        base = 0.3 if language == run.language else 0.1 if not language else -0.7
        base += 0.55 * sum(t in profile["helps"] for t in tags) - 0.7 * sum(
            t in profile["hurts"] for t in tags
        )
    return round(max(-1.0, min(1.0, base + rng.uniform(-0.25, 0.25))), 2)


def _transcript(
    run: DemoSession, shown: int, snapshot: str | None, rng: random.Random
) -> list[dict[str, Any]]:
    """A short stand-in for the judge run's conversation, as the session audit keeps it."""
    if run.metric == "groundedness":
        score: float = round(rng.uniform(0.3, 1.0), 2)
    else:
        score = rng.randint(1, 3) if run.product == "docsearch-rag" else rng.randint(2, 5)
    return [
        {
            "role": "system",
            "content": f"You are the evaluation judge for {run.product}. {shown} cross-session notes follow.",
        },
        {"role": "user", "content": f"Score snapshot {snapshot or '(ad-hoc answer)'} on {run.metric}."},
        {
            "role": "assistant",
            "content": json.dumps(
                {run.metric: {"score": score, "reason": "Scored against the rubric; see the evidence items."}}
            ),
        },
    ]


@dataclass
class RelevancePlan:
    """Judge-run audits and, in time order, what the evaluator and reviewers said about the notes."""

    audits: list[dict[str, Any]] = field(default_factory=list)  # lib.relevance.record_audit arguments
    # (when, kind, audit session id, payload): kind "evaluation" {note id: raw}, "feedback"
    # (note id, useful, reviewer) or "failed" (retry count).
    actions: list[tuple[datetime, str, str, Any]] = field(default_factory=list)
    manual_pin: int | None = None


def plan_relevance(
    notes: DemoNotes, note_ids: Sequence[int | None], evaluations: DemoEvaluations, seed: int = DEMO_SEED
) -> RelevancePlan:
    """Which notes each judge run showed, and how the evaluator and reviewers scored them later."""
    config = _read_input("products.json")
    rng = _rng(seed, "relevance")
    plan = RelevancePlan()
    reviewers = sorted(config["reviewer_languages"])
    stamps = [datetime.fromisoformat(r["timestamp"]) for r in notes.records]
    snapshots_by = defaultdict(list)
    for t in sorted(evaluations.truths.values(), key=lambda t: t.created_at):
        snapshots_by[(t.product, t.language)].append(t)
    categories = {r["id"]: r["category"] for r in evaluations.records}
    pending_from = len(notes.sessions) - 4  # the evaluator has not reached the newest runs yet
    failed_at = len(notes.sessions) // 2

    for index, run in enumerate(notes.sessions):
        nearby = [t for t in snapshots_by.get((run.product, run.language), []) if t.created_at <= run.started]
        snapshot = nearby[-1].snapshot_id if nearby else None
        tags = relevance.build_env_tags(
            language=run.language, product=run.product, metric=run.metric, model=run.model,
            category=categories.get(snapshot or ""),
        )  # fmt: skip
        # The seed-000 relevant-notes query (language, language-free, or any STRATEGY/PATTERN; newest
        # 20), of which the run's prompt showed a handful, favouring notes with a known profile.
        candidates = [
            i
            for i, r in enumerate(notes.records)
            if note_ids[i] is not None
            and stamps[i] < run.started
            and (r["language"] in (run.language, "") or r["note_type"] in ("STRATEGY", "PATTERN"))
        ]
        candidates = sorted(candidates, key=lambda i: stamps[i], reverse=True)[:20]
        weight = {
            i: 3.0 if notes.profiles[i]["helps"] or notes.profiles[i]["hurts"] else 1.0 for i in candidates
        }
        size = min(len(candidates), rng.randint(5, 9))
        shown = sorted(candidates, key=lambda i: rng.random() ** (1 / weight[i]), reverse=True)[:size]
        if not shown:
            continue  # a run that showed no notes leaves no audit
        shown.sort(key=lambda i: stamps[i], reverse=True)
        audit_at = run.started + timedelta(minutes=rng.randint(35, 55))
        plan.audits.append(
            {
                "session_id": run.session_id,
                "shown_note_ids": [note_ids[i] for i in shown],
                "env_tags": tags,
                "product": run.product,
                "snapshot_id": snapshot,
                "transcript": _transcript(run, len(shown), snapshot, rng),
                "at": audit_at,
            }
        )
        if index >= pending_from:
            continue
        processed_at = audit_at + timedelta(hours=rng.randint(1, 6))
        if index == failed_at:
            plan.actions.append((processed_at, "failed", run.session_id, 3))
            continue
        scores = {
            note_ids[i]: _raw_relevance(notes.records[i], notes.profiles[i], run, tags, rng) for i in shown
        }
        plan.actions.append((processed_at, "evaluation", run.session_id, scores))
        for note_id, raw in scores.items():
            if raw != 0 and rng.random() < 0.14:
                # A reviewer answered "was this note useful here?" on the evaluation page.
                at = processed_at + timedelta(hours=rng.randint(1, 30))
                plan.actions.append(
                    (at, "feedback", run.session_id, (note_id, raw > 0, _choose(rng, reviewers)))
                )
    plan.actions.sort(key=lambda a: (a[0], a[2], a[1]))
    pinned = [i for i, p in enumerate(notes.profiles) if p["pinned"]]
    plan.manual_pin = note_ids[pinned[0]] if pinned else None
    return plan


@dataclass
class RelevanceReplay:
    """The rows lib.relevance would have written for the plan, computed in memory for a fast load.

    Every step is lib.relevance's own: `tag_step` for a score under a tag, `auto_pin_decision`
    after every score, `manual_pin_state` for a reviewer's pin; only the storage is in memory.
    """

    rows: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    processed: list[dict[str, Any]] = field(default_factory=list)
    pins: dict[int, relevance.PinState] = field(default_factory=dict)

    def score(
        self, note: int, tags: Sequence[str], raw: float, weight: float, at: datetime, **extra: Any
    ) -> None:
        """As lib.relevance.apply_score: one step under every tag, a history event each, then pins."""
        for tag in relevance.normalize_tags(tags):
            row = self.rows.setdefault(
                (note, tag),
                {"lesson_id": note, "tag": tag, "score": 0.0, "positive_evals": 0, "negative_evals": 0},
            )
            old = row["score"]
            row["score"], row["positive_evals"], row["negative_evals"] = relevance.tag_step(
                old, row["positive_evals"], row["negative_evals"], raw, weight
            )
            row["last_evaluated"] = at
            self.events.append(
                {"lesson_id": note, "tag": tag, "at": at, "raw_score": raw, "weight": weight, "old_score": old,
                 "new_score": row["score"], **extra}
            )  # fmt: skip
        rows = [r for (n, _tag), r in self.rows.items() if n == note]
        total = sum(r["positive_evals"] + r["negative_evals"] for r in rows)
        state = self.pins.get(note, relevance.PinState())
        state, change = relevance.auto_pin_decision(state, {r["tag"]: r["score"] for r in rows}, total)
        if change is not None:
            self.pins[note] = state

    def manual_pin(self, note: int, reviewer: str, at: datetime) -> None:
        """As lib.relevance.set_manual_pin."""
        self.pins[note] = relevance.manual_pin_state(
            self.pins.get(note, relevance.PinState()), True, reviewer, at
        )


def replay_relevance(plan: RelevancePlan, anchor: datetime) -> RelevanceReplay:
    """Apply the plan's scores in time order with lib.relevance's arithmetic and pinning rules."""
    settings = get_settings()
    replay = RelevanceReplay()
    tags_of = {a["session_id"]: a["env_tags"] for a in plan.audits}
    actions = list(plan.actions)
    if plan.manual_pin is not None:
        actions.append((anchor - timedelta(days=12), "pin", "", plan.manual_pin))
    for at, kind, session_id, payload in sorted(actions, key=lambda a: (a[0], a[2], a[1])):
        if kind == "evaluation":
            for note, raw in sorted(payload.items()):
                replay.score(note, tags_of[session_id], raw, settings.evaluator_weight, at,
                             source="evaluator", session_id=session_id, reviewer=None)  # fmt: skip
            replay.processed.append({"session_id": session_id, "processed_at": at, "retry_count": 0,
                                     "status": "completed"})  # fmt: skip
        elif kind == "feedback":
            note, useful, reviewer = payload
            replay.score(note, tags_of[session_id], 1.0 if useful else -1.0, settings.feedback_weight, at,
                         source="reviewer", session_id=session_id, reviewer=reviewer)  # fmt: skip
        elif kind == "failed":
            replay.processed.append({"session_id": session_id, "processed_at": at, "retry_count": payload,
                                     "status": "failed"})  # fmt: skip
        else:
            replay.manual_pin(payload, "ayse", at)
    return replay


def _write_relevance(session: Session, plan: RelevancePlan, anchor: datetime) -> int:
    """Bulk-write the audits, match counts, scores, history and pins the app would have produced."""
    replay = replay_relevance(plan, anchor)
    audits, matches = [], {}
    for audit in plan.audits:
        tags = sorted(relevance.normalize_tags(audit["env_tags"]))
        shown = sorted(audit["shown_note_ids"])
        audits.append(
            {"session_id": audit["session_id"], "shown_lesson_ids": shown, "env_tags": tags,
             "repo": audit["product"], "snapshot_id": audit["snapshot_id"], "timestamp": audit["at"],
             "transcript": audit["transcript"], "transcript_path": None}
        )  # fmt: skip
        key = relevance.tag_set_key(tags)
        for note in shown:
            m = matches.setdefault((note, key), {"lesson_id": note, "tag_set": key, "times_matched": 0})
            m["times_matched"] += 1
            m["last_matched"] = audit["at"]
    session.execute(insert(SessionAudit), audits)
    session.execute(insert(LessonMatchStat), [matches[k] for k in sorted(matches)])
    if replay.processed:
        session.execute(insert(ProcessedRelevanceSession), replay.processed)
    if replay.events:
        session.execute(insert(TagRelevanceEvent), replay.events)
    if replay.rows:
        session.execute(insert(LessonTagRelevance), [replay.rows[k] for k in sorted(replay.rows)])
    pinned = [
        {"id": note, "pinned": pin.pinned, "auto_pinned": pin.auto_pinned, "prerequisites": pin.prerequisites}
        for note, pin in sorted(replay.pins.items())
        if pin.pinned or pin.prerequisites
    ]
    if pinned:
        session.execute(update(SessionNote), pinned)
    return len(audits)


def _note_ids(session: Session, records: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """The stored id of each demo note record (None when it is not in the database)."""
    sessions = sorted({r["session_id"] for r in records})
    found: dict[tuple[str, str, str], int] = {}
    rows = session.execute(
        select(SessionNote.id, SessionNote.session_id, SessionNote.note_type, SessionNote.content).where(
            col(SessionNote.session_id).in_(sessions)
        )
    ).all()
    for note_id, session_id, note_type, content in sorted(rows, key=lambda r: r[0]):
        found.setdefault((session_id, note_type, content), note_id)
    return [found.get((r["session_id"], r["note_type"], r["content"])) for r in records]
