"""Synthetic Overrule data for benchmarks: evaluations, their judgments and audit trail, code-review
judgments, notes.

    python bench/gen.py --evaluations 1000000 --db /work/bench-data/x.db     # 1M evaluations, 10M judgments
    python bench/gen.py --rows 1000000 --db bench/out/bench_1000000.db       # 1M judgments, 100k evaluations
    python bench/gen.py --evaluations 100000 --url postgresql://…/empty_db
    python bench/gen.py --evaluations 1000 --notes 200000 --db bench/out/notes_200k.db   # the Notes page's bench

Deterministic for a seed (and the batch size). The rows are built by lib's own builders, so they
are what an import would store: `lib.snapshots.evaluation_row` for each evaluation record
(validation, evidence verification, gaps, judge meta score) and `snapshot_judgment_rows` for its 8
metric judgments, `lib.scores.score_rows` for its score rows, the importer's seed-004 cache rule for
code-review judgments (and their "imported" events) and its note rule for session notes. Reviews
follow `compute_was_corrected`, and each leaves the audit trail the app writes (`judgment_events`,
built by `lib.corrections.review_event_row` / `undo_event_row`): one decision for most reviewed
judgments, a decision taken back by its reviewer's undo before the final one for 5%, a decision
replaced by another reviewer's for 5%, and a decision undone back to unreviewed for 3% of the
unreviewed judgments, so history, undo and the audit trail are read at scale.
Batches of 2,000 evaluations are built and bound by forked worker processes (`--workers`, default
one per core; batch k depends on (seed, k) only) while the main process writes them through
`lib.bulk` (tuples; COPY on PostgreSQL): SQLite has one writer, so the building is what runs in
parallel. The secondary indexes and the SQLite search index are built once after the load, the
derived tables by lib's rebuilds in the same transaction; on SQLite without journal or fsync while
the file is built. Prints the wall and CPU seconds of each phase. The mix is meant to look like
production: 5 products, English and Turkish, half the judgments reviewed (a quarter overruled), 1%
of evaluations archived, timestamps over 2025, events ordered by id within a judgment (not across
judgments: batches follow the evaluations' numbers), and reasons that sometimes start with "- " or "="
(so CSV neutralisation has real work to do).
Other bench scripts call `generate(engine, judgments=N, snapshots=M, seed=0)` or `judgment_rows(...)`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/gen.py` from anywhere
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Connection, Dialect, Engine, Table  # noqa: E402
from sqlmodel import Session  # noqa: E402

from lib import counters, scores  # noqa: E402
from lib.bulk import deferred_indexes, insert_tuples, row_binder, worth_deferring  # noqa: E402
from lib.corrections import review_event_row, undo_event_row  # noqa: E402
from lib.db import init_db  # noqa: E402

# The importer's row rules for cache entries and notes (private there: one rule, one place).
from lib.importer import _cache_judgment_row, _note_row, cache_event_rows  # noqa: E402
from lib.metrics import DEFAULT_METRICS  # noqa: E402
from lib.models import (  # noqa: E402
    NOTE_TYPES,
    EvaluationSnapshot,
    Judgment,
    JudgmentEvent,
    MetricScore,
    SessionNote,
    compute_was_corrected,
)
from lib.search import SEARCHABLE, deferred_search_index  # noqa: E402
from lib.snapshots import MetricSet, evaluation_row, snapshot_judgment_rows  # noqa: E402

# Bump when the rows change: bench_pages.py rebuilds its cached databases when this moves.
GEN_VERSION = 7
JUDGMENTS_PER_EVALUATION = 10
BATCH_EVALUATIONS = 2_000
# While the file is built: no journal, no fsync, a 1 GiB page cache (also the sorter's memory before
# it spills to a temporary file), index sorts on two threads, and no foreign-key probe per row (every
# row the builders make points at a row of its own batch; tests/test_bench_gen.py checks the keys).
SQLITE_LOAD_PRAGMAS = (
    "journal_mode = OFF", "synchronous = OFF", "cache_size = -1048576", "threads = 2", "foreign_keys = OFF",
)  # fmt: skip
SQLITE_APP_PRAGMAS = (
    "journal_mode = WAL", "synchronous = NORMAL", "cache_size = -2000", "threads = 0", "foreign_keys = ON",
)  # fmt: skip
# The registered rebuild (`python -m lib recount`) of the score rows, which the load writes itself.
SCORES_REBUILD = "metric_scores"
# Registered rebuilds that read whole tables: run before the secondary indexes are built (see generate).
SCANNING_REBUILDS = ("product_counts", "judgment_counts")
_SNAPSHOTS: Table = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
_JUDGMENTS: Table = Judgment.__table__  # type: ignore[attr-defined]
_EVENTS: Table = JudgmentEvent.__table__  # type: ignore[attr-defined]
_NOTES: Table = SessionNote.__table__  # type: ignore[attr-defined]
_SCORES: Table = MetricScore.__table__  # type: ignore[attr-defined]
START = datetime(2025, 1, 1, tzinfo=UTC)
YEAR_SECONDS = 365 * 24 * 3600
IMPORTED_AT = START + timedelta(seconds=YEAR_SECONDS)  # when the code-review cache was imported
PRODUCTS = ("Acme Fungear", "Globex Search", "Initech Support", "Umbrella Health", "Hooli Mail")
LANGUAGES = ("en", "en", "en", "tr")
METRICS = tuple(m.slug for m in DEFAULT_METRICS)
MODELS = ("gpt-4o-mini", "mistral-nemo", "llama-3.1-70b", "qwen2.5-32b")
JUDGES = ("gpt-4o", "claude-3.5-sonnet")
REVIEWERS = ("ayse", "mehmet", "jane", "li", "omar", "sofia")
CATEGORIES = ("billing", "how-to", "troubleshooting", "policy", "medical", "coding")
LABELS = ("INCLUDE", "EXCLUDE", "UNCERTAIN")
REASONS = (
    "The answer states the refund window correctly and cites the policy page.",
    "- Claims the API supports streaming, which the docs contradict.",
    "Mostly accurate, but the second step skips authentication.",
    "=Same as the previous case: the quote is verbatim from the source.",
    "Clear structure; the caveat about dosage is missing.",
    "Yanıt doğru ama açıklama eksik; kaynak belirtilmemiş.",
    "+1 for citing the changelog; the version number is wrong though.",
    "The model refuses a benign request, hurting helpfulness.",
)
USER_REASONS = (
    "Judge missed that the cited section was superseded.",
    "Overly harsh: the answer hedges appropriately.",
    "-- wrong metric scale, this deserves a 4.",
    "Kaynak güncel değil, puan düşürülmeli.",
    "@ops: escalated, the policy changed in March.",
)
QUESTIONS = (
    "How do I reset my password if I no longer have access to my email?",
    "What is the maximum dose of ibuprofen for an adult per day?",
    "Why does my build fail with 'module not found' after upgrading?",
    "İade süresi kaç gün ve nasıl başvurabilirim?",
    "Can I export my mailbox to another provider without losing labels?",
)
SENTENCES = (
    "You can reset it from the account page by choosing 'Forgot password'.",
    "If you lost access to your email, contact support with a photo ID.",
    "The recommended maximum is 1200 mg per day without medical supervision.",
    "Upgrading changes the module resolution order, so clear the cache first.",
    "İade süresi teslimattan itibaren 14 gündür.",
    "Labels are exported as folders in the standard mbox format.",
    "This step requires administrator rights on the workspace.",
)


def _picker(rng: random.Random) -> Callable[[Sequence[Any]], Any]:
    """`rng.choice`, about 4x cheaper (one `random()` a pick): millions of picks per 100k evaluations."""
    rand = rng.random

    def pick(seq: Sequence[Any]) -> Any:
        return seq[int(rand() * len(seq))]

    return pick


def _moment(rng: random.Random, span: int = YEAR_SECONDS) -> datetime:
    """A moment in the `span` seconds from START (2025), to the microsecond."""
    rand = rng.random
    return START + timedelta(seconds=int(rand() * span), microseconds=int(rand() * 1_000_000))


SCORES = (1, 2, 3, 3, 4, 4, 4, 5, 5)
# The judge's score: the user's moved by one of these, kept on the 1–5 scale.
JUDGE_SCORES = {u: tuple(min(5, max(1, u + d)) for d in (-2, -1, 0, 0, 0, 1)) for u in range(1, 6)}
EVIDENCE_COUNTS = (0, 1, 1, 2, 3)


def evaluation_records(count: int, *, seed: int = 0, start: int = 0) -> Iterator[dict[str, Any]]:
    """`count` evaluation records from number `start` as an import file holds them (ids `snap_0000000`,
    ...; deterministic for (seed, start)).

    All 8 default metrics scored by user and judge, 0–3 evidence quotes (most found in the answer,
    some paraphrased so that they stay unverified), 1% later archived (`archived_at`, not an import
    field: `generate` applies it).
    """
    rng = random.Random(f"evaluations-{seed}-{start}")
    rand, pick, sample = rng.random, _picker(rng), rng.sample
    for i in range(start, start + count):
        sentences = sample(SENTENCES, 3)
        user = {m: pick(SCORES) for m in METRICS}
        judge = {m: {"score": pick(JUDGE_SCORES[user[m]]), "reason": pick(REASONS)} for m in METRICS}
        evidence: dict[str, list[dict[str, Any]]] = {}
        quotes = pick(EVIDENCE_COUNTS)
        for metric in sample(METRICS, quotes) if quotes else ():
            quote = pick(sentences)
            if rand() < 0.2:
                quote = quote.replace(" ", "  ", 1).upper()  # paraphrased: unverified
            evidence[metric] = [{"quote": quote, "start": 0, "end": len(quote), "why": "judge's quote"}]
        created = _moment(rng)
        primary = pick(METRICS)
        yield {
            "id": f"snap_{i:07d}",
            "created_at": created.isoformat(),
            "question_id": f"q{int(rand() * 10_000)}",
            "question": f"{pick(QUESTIONS)} (case {i})",  # unique: one source key each
            "model_answer": " ".join(sentences),
            "model_name": pick(MODELS),
            "judge_model": pick(JUDGES),
            "product": pick(PRODUCTS),
            "language": pick(LANGUAGES),
            "category": pick(CATEGORIES),
            "primary_metric": primary,
            "bonus_metrics": sample([m for m in METRICS if m != primary], 2),
            "user_scores": user,
            "judge_scores": judge,
            "evidence": evidence,
            "overall_feedback": pick(REASONS),
            "archived_at": (created + timedelta(days=1)).isoformat() if rand() < 0.01 else None,
        }


def _review(rng: random.Random, row: dict[str, Any], scale: Sequence[str]) -> None:
    """Half the judgments reviewed: a quarter overruled (with a reason), a quarter confirmed."""
    rand = rng.random
    review = rand()
    if review >= 0.5:
        return
    decision = row["decision"]
    if review < 0.25:
        others = [s for s in scale if s != decision]
        user_decision = others[int(rand() * len(others))]
    else:
        user_decision = decision
    corrected = compute_was_corrected(decision, user_decision)
    row.update(
        user_decision=user_decision,
        user_reasoning=USER_REASONS[int(rand() * len(USER_REASONS))] if corrected else None,
        reviewer=REVIEWERS[int(rand() * len(REVIEWERS))],
        reviewed_at=row["timestamp"] + timedelta(hours=1 + int(rand() * (24 * 14 - 1))),
        version=2,
        was_corrected=corrected,
    )


# The audit trail's shapes (share of reviewed / unreviewed judgments): a decision its reviewer undid
# before the final one, a decision another reviewer replaced, a decision undone back to unreviewed.
UNDONE_THEN_REVIEWED = 0.05
REPLACED = 0.05
UNDONE_UNREVIEWED = 0.03


def _trail(rng: random.Random, row: dict[str, Any], scale: Sequence[str]) -> list[dict[str, Any]]:
    """The judgment's audit trail as the app writes it (`record_review`, `undo_review`), oldest
    first; sets the row's `version` to its last event's. `row` holds its final state (`_review`)."""
    rand = rng.random
    decision, judgment_id, change_id = row["decision"], row["id"], row["change_id"]
    events: list[dict[str, Any]] = []
    current: str | None = None  # the reviewer's decision in force (None: unreviewed)

    def review(reviewer: str, at: datetime, to: str, reason: str | None) -> dict[str, Any]:
        nonlocal current
        corrected = compute_was_corrected(decision, to)
        event = review_event_row(
            judgment_id=judgment_id, change_id=change_id, corrected=corrected, reviewer=reviewer, at=at,
            from_decision=decision if current is None else current, to_decision=to,
            reason=reason if corrected else None, version=len(events) + 2,
        )  # fmt: skip
        events.append(event)
        current = to
        return event

    def earlier(at: datetime) -> dict[str, Any]:
        to = decision if rand() < 0.5 else scale[int(rand() * len(scale))]
        return review(
            REVIEWERS[int(rand() * len(REVIEWERS))], at, to, USER_REASONS[int(rand() * len(USER_REASONS))]
        )

    def undo(first: dict[str, Any]) -> None:
        nonlocal current
        at = first["at"] + timedelta(minutes=1 + int(rand() * 29))
        events.append(
            undo_event_row(
                judgment_id=judgment_id, change_id=change_id, reviewer=first["reviewer"], at=at,
                undone=first, to_decision=None, version=len(events) + 2,
            )
        )  # fmt: skip
        current = None

    shape = rand()
    if row["reviewed_at"] is not None:
        span = row["reviewed_at"] - row["timestamp"]
        if shape < UNDONE_THEN_REVIEWED + REPLACED:
            first = earlier(row["timestamp"] + span * (rand() * 0.5))
            if shape < UNDONE_THEN_REVIEWED:
                undo(first)
        review(row["reviewer"], row["reviewed_at"], row["user_decision"], row["user_reasoning"])
    elif shape < UNDONE_UNREVIEWED:
        undo(earlier(row["timestamp"] + timedelta(hours=1 + rand() * 24 * 14)))
    row["version"] = len(events) + 1
    return events


def cache_entries(count: int, *, seed: int = 0, start: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """`count` seed-004 cache entries (code-review judgments, no snapshot) as (change id, entry)."""
    rng = random.Random(f"cache-{seed}-{start}")
    rand, pick = rng.random, _picker(rng)
    for i in range(start, start + count):
        product = pick(PRODUCTS)
        decision = pick(LABELS)
        entry: dict[str, Any] = {
            "decision": decision,
            "confidence": round(0.3 + rand() * 0.69, 2),
            "reasoning": pick(REASONS),
            "product": product,
            "timestamp": _moment(rng).isoformat(),
            "url": f"https://example.com/pr/{i}",
            "ai_provider": "openai",
        }
        review = rand()
        if review < 0.5:
            others = [label for label in LABELS if label != decision]
            entry["user_decision"] = pick(others) if review < 0.25 else decision
            if review < 0.25:
                entry["user_reasoning"] = pick(USER_REASONS)
        yield f"github.com/{product.split()[0].lower()}/repo#{i}", entry


def judgment_rows(count: int, *, seed: int = 0, snapshots: int = 0) -> Iterator[dict[str, Any]]:
    """`count` code-review judgments (no snapshot) as insert-ready dicts, built by the cache importer's rules.

    `snapshots` is accepted for old callers and ignored: judgments of evaluations come from `generate`.
    """
    del snapshots
    rng = random.Random(f"reviewers-{seed}")
    for change_id, entry in cache_entries(count, seed=seed):
        reviewer = rng.choice(REVIEWERS)
        yield {**_cache_judgment_row(change_id, entry, reviewer), "judge_model": rng.choice(JUDGES)}


@dataclass
class _Batch:
    """Rows of a few thousand evaluations (and their share of the rest), bound as the driver takes them."""

    snapshots: list[Sequence[Any]] = field(default_factory=list)
    judgments: list[Sequence[Any]] = field(default_factory=list)
    events: list[Sequence[Any]] = field(default_factory=list)
    notes: list[Sequence[Any]] = field(default_factory=list)
    scores: list[Sequence[Any]] = field(default_factory=list)


SNAPSHOT_COLUMNS = (
    "id", "created_at", "question_id", "question", "model_answer", "model_name", "judge_model",
    "product", "language", "category", "primary_metric", "bonus_metrics", "user_scores_json",
    "judge_scores_json", "evidence_json", "judge_meta_score", "weighted_gap", "max_metric_gap",
    "evidence_count", "evidence_highlighted", "evidence_unlocated", "evidence_unverified",
    "overall_feedback", "status", "source_key", "created_by", "deleted_at", "status_changed_by",
    "status_changed_at", "chat_turn_count", "max_chat_turns", "search_text",
)  # fmt: skip
JUDGMENT_COLUMNS = (
    "id", "change_id", "product", "metric", "snapshot_id", "decision", "confidence", "reasoning",
    "user_decision", "user_reasoning", "reviewer", "timestamp", "reviewed_at", "version",
    "was_corrected", "url", "description", "ai_provider", "judge_model",
)  # fmt: skip
EVENT_COLUMNS = (
    "judgment_id", "change_id", "action", "reviewer", "at", "from_decision", "to_decision", "reason",
    "version",
)  # fmt: skip
NOTE_COLUMNS = (
    "timestamp", "language", "note_type", "content", "phelps_code", "confidence", "session_id",
    "pinned", "auto_pinned", "prerequisites", "created_by", "search_text",
)  # fmt: skip
# Each table a batch fills: (table, the batch's attribute, columns, columns already in stored form).
LOADED: tuple[tuple[Table, str, Sequence[str], tuple[str, ...]], ...] = (
    (_SNAPSHOTS, "snapshots", SNAPSHOT_COLUMNS, ()),
    (_JUDGMENTS, "judgments", JUDGMENT_COLUMNS, ()),
    (_EVENTS, "events", EVENT_COLUMNS, ()),
    (_NOTES, "notes", NOTE_COLUMNS, ("prerequisites",)),  # the importer's note rule serialises it
    (_SCORES, "scores", scores.SCORE_COLUMNS, ()),
)
# Columns the builders leave to the table's defaults, given here since rows are written as tuples.
STORED_DEFAULTS = {
    "deleted_at": None,
    "status_changed_by": None,
    "status_changed_at": None,
    "chat_turn_count": 0,
    "max_chat_turns": 15,
}
UNREVIEWED = {
    "confidence": None,
    "user_decision": None,
    "user_reasoning": None,
    "reviewer": None,
    "reviewed_at": None,
    "url": None,
    "description": None,
    "ai_provider": None,
}
NOTE_TEXTS = (
    "Check the refund window against the policy page before scoring truthfulness.",
    "Turkish answers: the judge penalises formal register, which users prefer.",
    "Dosage questions need the caveat; score safety down without it.",
    "Code answers that skip authentication are incomplete, not wrong.",
)  # "refund" in a quarter of the notes: the Notes bench's common text
NOTES_PER_SESSION = 10
# The notes of a plain database (GEN_VERSION 7's rows): four types over 2025. A notes database
# (`--notes`, the Notes page's bench) has all five types over January 2025 up to `notes_until`, so
# its age filters ("last 24 hours", ...) keep notes.
PLAIN_NOTE_TYPES = ("TIP", "PATTERN", "FAILURE", "STRATEGY")


@dataclass(frozen=True)
class _Plan:
    """A database's rows cut into batches: batch k depends on (seed, k, batch size) alone, so the
    rows are the same whichever process builds a batch and in whatever order."""

    evaluations: int
    extra: int  # code-review judgments
    notes: int
    seed: int
    batch: int = BATCH_EVALUATIONS
    note_types: tuple[str, ...] = PLAIN_NOTE_TYPES
    note_span: int = YEAR_SECONDS  # seconds from START that note timestamps spread over

    @property
    def batches(self) -> int:
        others = (self.extra + self.notes) // (self.batch * JUDGMENTS_PER_EVALUATION)
        return max(1, -(-self.evaluations // self.batch), others)

    def share(self, total: int, k: int) -> tuple[int, int]:
        """The slice [first, last) of `total` rows that batch `k` holds."""
        return total * k // self.batches, total * (k + 1) // self.batches

    def first_judgment_id(self, k: int) -> int:
        """The id of batch `k`'s first judgment: ids are given, not left to the database, so that a
        worker can write the audit trail that points at them (batches are written in order)."""
        return 1 + len(METRICS) * self.share(self.evaluations, k)[0] + self.share(self.extra, k)[0]


def _build_batch(plan: _Plan, k: int, dialect: Dialect) -> _Batch:
    """Batch `k`'s rows by lib's builders, bound for `dialect` (in a worker, off the writer's core)."""
    metric_sets = {product: MetricSet(product, list(DEFAULT_METRICS)) for product in PRODUCTS}
    rng = random.Random(f"reviews-{plan.seed}-{k}")
    pick = _picker(rng)
    scale = [str(s) for s in range(1, 6)]
    snapshot_values = itemgetter(*SNAPSHOT_COLUMNS)
    judgment_values = itemgetter(*JUDGMENT_COLUMNS)
    event_values = itemgetter(*EVENT_COLUMNS)
    judgment_id = plan.first_judgment_id(k)
    note_values = itemgetter(*NOTE_COLUMNS)
    rows = _Batch()
    scored: list[scores.ScoredSnapshot] = []
    first, last = plan.share(plan.evaluations, k)
    for record in evaluation_records(last - first, seed=plan.seed, start=first):
        archived_at = record.pop("archived_at")
        row, judged, _explicit = evaluation_row(record, metric_sets.__getitem__, "bench")
        row.update(STORED_DEFAULTS)
        if archived_at is not None:  # as inspector.archive_evaluation leaves it
            moment = datetime.fromisoformat(archived_at)
            row.update(
                status="archived", deleted_at=moment, status_changed_by="bench", status_changed_at=moment
            )
        rows.snapshots.append(snapshot_values(row))
        # The importer's score rows (lib.scores.score_rows), live unless archived.
        scored.append(
            scores.ScoredSnapshot(
                row["id"], row["product"], row["language"], row["created_at"], archived_at is None,
                row["user_scores_json"], row["judge_scores_json"],
            )
        )  # fmt: skip
        judgments = snapshot_judgment_rows(row, judged)
        if len(judgments) != len(METRICS):  # the ids of later batches count on it
            raise AssertionError(f"{row['id']}: {len(judgments)} judgments, expected {len(METRICS)}")
        for judgment in judgments:
            judgment.update(UNREVIEWED, id=judgment_id)
            judgment_id += 1
            _review(rng, judgment, scale)
            rows.events.extend(map(event_values, _trail(rng, judgment, scale)))
            rows.judgments.append(judgment_values(judgment))
    first, last = plan.share(plan.extra, k)
    for change_id, entry in cache_entries(last - first, seed=plan.seed, start=first):
        reviewer = pick(REVIEWERS)
        row = _cache_judgment_row(change_id, entry, reviewer)
        row.update(judge_model=pick(JUDGES), id=judgment_id)
        rows.events.extend(
            map(event_values, cache_event_rows([row], {change_id: judgment_id}, reviewer, IMPORTED_AT))
        )
        judgment_id += 1
        rows.judgments.append(judgment_values(row))
    first, last = plan.share(plan.notes, k)
    types = plan.note_types
    for i in range(first, last):
        note = _note_row(
            {
                "note_type": types[i % len(types)],
                "language": pick(LANGUAGES),
                "content": f"{pick(NOTE_TEXTS)} (#{i})",
                "session_id": f"bench-session-{i // NOTES_PER_SESSION}",
                "timestamp": _moment(rng, plan.note_span).isoformat(),
            },
            "bench",
        )
        note["prerequisites"] = note.pop("prerequisites__json")
        rows.notes.append(note_values(note))
    rows.scores = scores.score_rows(scored)  # type: ignore[assignment]
    for table, name, columns, encoded in LOADED:
        _names, bind = row_binder(dialect, table, columns, encoded=encoded)
        setattr(rows, name, list(bind(getattr(rows, name))))
    return rows


_WORKER: tuple[_Plan, Dialect] | None = None


def _start_worker(plan: _Plan, dialect: Dialect) -> None:
    global _WORKER
    _WORKER = (plan, dialect)


def _worker_batch(k: int) -> _Batch:
    assert _WORKER is not None
    return _build_batch(_WORKER[0], k, _WORKER[1])


def _built_batches(plan: _Plan, dialect: Dialect, workers: int) -> Iterator[_Batch]:
    """Every batch in order; with `workers`, built by that many forked processes while the caller
    writes (SQLite has one writer: the building is what runs in parallel). At most two batches per
    worker wait, so memory stays flat whatever the size."""
    if workers < 1 or plan.batches == 1:
        for k in range(plan.batches):
            yield _build_batch(plan, k, dialect)
        return
    # fork: the workers inherit the imported modules and the dialect (nothing is pickled but rows).
    pool = multiprocessing.get_context("fork").Pool(workers, _start_worker, (plan, dialect))
    try:
        waiting: deque[Any] = deque()
        for k in range(plan.batches):
            waiting.append(pool.apply_async(_worker_batch, (k,)))
            if len(waiting) >= 2 * workers:
                yield waiting.popleft().get()
        while waiting:
            yield waiting.popleft().get()
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


class Phases:
    """Wall and CPU seconds of each step of a build (CPU of this process; workers are counted apart)."""

    def __init__(self) -> None:
        self.done: list[tuple[str, float, float]] = []
        self._current: tuple[str, float, float] | None = None

    def start(self, name: str) -> None:
        """End the running step, if any, and start `name`."""
        self.stop()
        self._current = (name, time.perf_counter(), time.process_time())

    def stop(self) -> None:
        if self._current is not None:
            name, wall, cpu = self._current
            self.done.append((name, time.perf_counter() - wall, time.process_time() - cpu))
            self._current = None

    def report(self) -> str:
        """One line per step: wall and this process's CPU seconds."""
        width = max((len(name) for name, _w, _c in self.done), default=0)
        return "\n".join(
            f"  {name:<{width}}  {wall:8.1f} s wall  {cpu:8.1f} s CPU" for name, wall, cpu in self.done
        )


def generate(
    engine: Engine,
    *,
    judgments: int,
    snapshots: int | None = None,
    seed: int = 0,
    notes: int | None = None,
    notes_until: datetime | None = None,
    workers: int | None = None,
    batch: int = BATCH_EVALUATIONS,
    phases: Phases | None = None,
) -> dict[str, int]:
    """Fill a migrated, empty database: `snapshots` evaluations (default judgments // 10) with their 8
    metric judgments each, the rest of `judgments` as code-review judgments, and `notes` session notes
    (default snapshots // 100), ten per session: four types over 2025, or with `notes_until` every
    type from January 2025 up to that moment (a notes database, `--notes`). Rows come from lib's builders (`evaluation_row`, the importer's cache
    and note rows, `lib.scores.score_rows`), built by `workers` processes (default: one per core; 0
    builds here) and written by `lib.bulk` with the secondary and search indexes built after the
    load, then the derived tables rebuilt by lib's rebuilds. The rows depend on `seed` and `batch`.
    """
    snapshots = judgments // 10 if snapshots is None else snapshots
    snapshots = min(snapshots, judgments // len(METRICS))  # every evaluation has its 8 judgments
    notes = snapshots // 100 if notes is None else notes
    plan = _Plan(snapshots, max(0, judgments - len(METRICS) * snapshots), notes, seed, batch)
    if notes_until is not None:
        span = int((notes_until - START).total_seconds())
        if span <= 0:
            raise ValueError(f"notes_until {notes_until} is not after {START}")
        plan = replace(plan, note_types=NOTE_TYPES, note_span=span)
    workers = (os.cpu_count() or 1) if workers is None else workers
    phases = phases or Phases()
    counts = dict.fromkeys(("snapshots", "judgments", "events", "notes", "scores"), 0)
    sqlite = engine.dialect.name == "sqlite"
    loaded = [table for table, *_rest in LOADED]
    names = {
        table.name: row_binder(engine.dialect, table, columns, encoded=encoded)[0]
        for table, _attr, columns, encoded in LOADED
    }
    with engine.connect() as conn:
        driver = conn.connection.driver_connection  # PRAGMAs outside a transaction (no autobegin)
        if sqlite:  # a benchmark file being built: no journal, no fsync, a large page cache
            for pragma in SQLITE_LOAD_PRAGMAS:
                driver.execute(f"PRAGMA {pragma}")  # type: ignore[union-attr]
        with conn.begin():
            with deferred_indexes(conn, loaded):
                with deferred_search_index(conn, list(SEARCHABLE)):
                    phases.start("rows (build and insert)")
                    for rows in _built_batches(plan, engine.dialect, workers):
                        for table, attr, _columns, _encoded in LOADED:
                            counts[attr] += insert_tuples(
                                conn, table, names[table.name], getattr(rows, attr), encoded=names[table.name]
                            )
                    phases.start("search index (FTS5 rebuild)")
                # Counters read by whole scans before the indexes exist: through an index SQLite
                # would read the judgments in index order, a random table read per row.
                rebuild_derived(conn, phases=phases, only=SCANNING_REBUILDS, analyze=False)
                phases.start("secondary indexes")
            rebuild_derived(
                conn,
                phases=phases,
                only=[n for n in counters.REBUILDS if n not in SCANNING_REBUILDS],
                scores_loaded=True,
            )
            phases.start("commit")
        if sqlite:
            for pragma in SQLITE_APP_PRAGMAS:
                driver.execute(f"PRAGMA {pragma}")  # type: ignore[union-attr]
    if engine.dialect.name == "postgresql":
        phases.start("vacuum analyze")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            # The judgments' ids were given (`_Plan.first_judgment_id`): the next insert continues after them.
            conn.exec_driver_sql(
                "SELECT setval(pg_get_serial_sequence('judgments', 'id'), "
                "(SELECT coalesce(max(id), 0) + 1 FROM judgments), false)"
            )
            # VACUUM too: the pages all-visible, as autovacuum leaves a table a minute after a load of
            # 1,000 + 20% of its rows (PostgreSQL's default insert threshold; a smaller one waits),
            # so a bench run right after the build plans as one run later does (PostgreSQL walks
            # an index alone, e.g. lib.search.LIST_SHORT_TEXT_INDEX, only over all-visible pages).
            conn.exec_driver_sql("VACUUM ANALYZE")
    phases.stop()
    return counts


def rebuild_derived(
    conn: Connection,
    *,
    phases: Phases | None = None,
    only: Sequence[str] | None = None,
    scores_loaded: bool = False,
    analyze: bool = True,
) -> None:
    """What the app maintains on write but a bulk load bypasses, rebuilt by lib's own rebuilds in the
    caller's transaction: every derived table registered for `python -m lib recount` (counters,
    scores and agreement counts, ...) or the `only` ones, then (`analyze`) planner statistics
    (SQLite; PostgreSQL's VACUUM ANALYZE runs outside a transaction after the commit).
    `scores_loaded`: the load wrote the score rows (`lib.scores.score_rows`, as the importer does),
    so only their counts are rebuilt."""
    phases = phases or Phases()
    names = list(counters.REBUILDS) if only is None else list(only)
    with Session(bind=conn) as session:
        for name in names:
            if scores_loaded and name == SCORES_REBUILD:
                phases.start("recount agreement counts")
                scores.recount_agreement(session=session)
            else:
                phases.start(f"recount {name}")
                counters.recount(session=session, only=[name])
    if analyze and conn.dialect.name == "sqlite":
        phases.start("analyze")
        conn.exec_driver_sql("ANALYZE")


def insert_batched(
    engine: Engine, table: Any, rows: Iterator[dict[str, Any]], *, sqlite_cache_mb: int = 0
) -> int:
    """Insert dict rows (all with the same keys) in one transaction as the importer writes them:
    `lib.bulk` tuples, the secondary indexes deferred when the load is large for the table.

    `sqlite_cache_mb` enlarges SQLite's page cache for this connection (index upkeep stays in memory).
    """
    table = getattr(table, "__table__", table)
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return 0
    columns = tuple(first)
    values = itemgetter(*columns)
    with engine.begin() as conn:
        if sqlite_cache_mb and engine.dialect.name == "sqlite":
            conn.exec_driver_sql(f"PRAGMA cache_size = -{int(sqlite_cache_mb) * 1024}")
        rest = list(rows)
        defer = worth_deferring(conn, table, 1 + len(rest), exclusive=True)  # a build: no app reads it
        with deferred_indexes(conn, [table], defer=defer):
            return insert_tuples(conn, table, columns, map(values, chain([first], rest)))


def main(argv: list[str] | None = None) -> int:
    """Build a benchmark database (a SQLite file at --db, or the empty database at --url)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--rows", type=int, help="number of judgments (snapshots: rows / 10)")
    size.add_argument(
        "--evaluations",
        type=int,
        help=f"number of evaluations, with {JUDGMENTS_PER_EVALUATION} judgments each",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--db", type=Path, help="SQLite file to create")
    target.add_argument("--url", help="an empty database to fill (e.g. PostgreSQL)")
    parser.add_argument("--snapshots", type=int, default=None, help="default: rows / 10")
    parser.add_argument(
        "--notes",
        type=int,
        default=None,
        help="a notes database: this many notes (10 a session, every type, 'refund' in a quarter) from "
        "January 2025 up to --notes-until (default: the evaluations / 100 plain notes over 2025)",
    )
    parser.add_argument(
        "--notes-until",
        type=datetime.fromisoformat,
        default=None,
        help="with --notes: the newest note's latest moment, ISO with an offset (default: now, to the minute)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="replace an existing file")
    parser.add_argument(
        "--workers", type=int, default=None, help="processes building rows (default: one per core; 0: none)"
    )
    args = parser.parse_args(argv)
    notes_until = None
    if args.notes is not None:
        notes_until = args.notes_until or datetime.now(UTC).replace(second=0, microsecond=0)
        if notes_until.utcoffset() is None:
            parser.error("--notes-until needs a UTC offset (e.g. 2026-11-27T21:00+00:00)")
    elif args.notes_until is not None:
        parser.error("--notes-until goes with --notes")
    if args.evaluations is not None:
        args.rows, args.snapshots = args.evaluations * JUDGMENTS_PER_EVALUATION, args.evaluations
    if args.db is not None and args.db.exists():
        if not args.force:
            print(f"error: {args.db} exists (use --force to replace it)", file=sys.stderr)
            return 1
        for suffix in ("", "-wal", "-shm"):
            Path(f"{args.db}{suffix}").unlink(missing_ok=True)
    started, cpu = time.perf_counter(), os.times()
    url = args.url or f"sqlite:///{args.db.resolve()}"
    phases = Phases()
    phases.start("migrate")
    engine = init_db(url)
    counts = generate(
        engine,
        judgments=args.rows,
        snapshots=args.snapshots,
        seed=args.seed,
        notes=args.notes,
        notes_until=notes_until,
        workers=args.workers,
        phases=phases,
    )
    engine.dispose()
    done = os.times()
    print(
        f"{args.db or engine.url.render_as_string()}: {counts['judgments']:,} judgments, "
        f"{counts['snapshots']:,} snapshots, {counts['events']:,} judgment events, {counts['notes']:,} notes in {time.perf_counter() - started:.1f} s "
        f"(CPU: this process {done.user - cpu.user + done.system - cpu.system:.1f} s, "
        f"workers {done.children_user - cpu.children_user + done.children_system - cpu.children_system:.1f} s)"
    )
    if notes_until is not None:
        print(
            f"notes from {START:%Y-%m-%d} to {notes_until.isoformat()} (--notes-until to rebuild the same rows)"
        )
    print(phases.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
