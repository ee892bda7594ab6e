"""Synthetic Overrule data for benchmarks: judgments and evaluation snapshots at any scale.

    python bench/gen.py --rows 1000000 --db bench/out/bench_1000000.db

Deterministic for a seed; bulk Core inserts in batches, so a million judgments take about a minute.
The mix is meant to look like production: several products and languages, the default metrics,
a quarter of the judgments corrected, another quarter confirmed, timestamps spread over a year, and
reasons that sometimes start with "- " or "=" (so CSV neutralisation has real work to do).
Other bench scripts call `generate(engine, judgments=N, snapshots=M, seed=0)` or `judgment_rows(...)`.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/gen.py` from anywhere
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, insert  # noqa: E402

from lib.db import init_db  # noqa: E402
from lib.metrics import DEFAULT_METRICS  # noqa: E402
from lib.models import EvaluationSnapshot, Judgment  # noqa: E402

BATCH_ROWS = 20_000
# Bump when the rows change: bench_pages.py rebuilds its cached databases when this moves.
GEN_VERSION = 1
JUDGMENTS_PER_EVALUATION = 10
GEN_CACHE_MB = 256
START = datetime(2025, 1, 1, tzinfo=UTC)
YEAR_SECONDS = 365 * 24 * 3600
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


def _moment(rng: random.Random) -> datetime:
    return START + timedelta(seconds=rng.randrange(YEAR_SECONDS), microseconds=rng.randrange(1_000_000))


def _score(rng: random.Random) -> int:
    return rng.choice((1, 2, 3, 3, 4, 4, 4, 5, 5))


def snapshot_rows(count: int, *, seed: int = 0) -> Iterator[dict[str, Any]]:
    """`count` evaluation snapshots as insert-ready dicts, ids `snap_0000000`, ... (deterministic)."""
    rng = random.Random(f"snapshots-{seed}")
    for i in range(count):
        product = rng.choice(PRODUCTS)
        metrics = rng.sample(METRICS, 4)
        user = {m: _score(rng) for m in metrics}
        judge = {m: min(5, max(1, user[m] + rng.choice((-2, -1, 0, 0, 0, 1)))) for m in metrics}
        gaps = [abs(user[m] - judge[m]) for m in metrics]
        question = rng.choice(QUESTIONS)
        answer = " ".join(rng.sample(SENTENCES, 3))
        yield {
            "id": f"snap_{i:07d}",
            "created_at": _moment(rng),
            "question_id": f"q{rng.randrange(10_000)}",
            "question": question,
            "model_answer": answer,
            "model_name": rng.choice(MODELS),
            "judge_model": rng.choice(JUDGES),
            "product": product,
            "language": rng.choice(LANGUAGES),
            "category": rng.choice(CATEGORIES),
            "primary_metric": metrics[0],
            "bonus_metrics": metrics[1:3],
            "user_scores_json": user,
            "judge_scores_json": judge,
            "evidence_json": None,
            "judge_meta_score": rng.randint(1, 5),
            "weighted_gap": round(sum(gaps) / len(gaps), 3),
            "max_metric_gap": float(max(gaps)),
            "evidence_count": 0,
            "evidence_highlighted": 0,
            "evidence_unlocated": 0,
            "evidence_unverified": 0,
            "overall_feedback": rng.choice(REASONS),
            "user_evaluation_id": None,
            "judge_evaluation_id": None,
            "chat_turn_count": 0,
            "max_chat_turns": 15,
            "status": rng.choice(("active", "active", "completed", "archived")),
            "deleted_at": None,
            "source_key": hashlib.sha256(f"{seed}:{i}".encode()).hexdigest(),
            "created_by": "bench",
        }


def judgment_rows(count: int, *, seed: int = 0, snapshots: int = 0) -> Iterator[dict[str, Any]]:
    """`count` judgments as insert-ready dicts; the first `8 * snapshots` are those snapshots' metrics.

    A quarter are corrected (user decision differs), a quarter confirmed, half not yet reviewed.
    """
    rng = random.Random(f"judgments-{seed}")
    linked = min(count, len(METRICS) * snapshots)
    for i in range(count):
        product = rng.choice(PRODUCTS)
        if i < linked:
            snapshot_id = f"snap_{i // len(METRICS):07d}"
            metric: str | None = METRICS[i % len(METRICS)]
            change_id = f"{snapshot_id}:{metric}"
            decision = str(_score(rng))
            alternatives = [str(s) for s in range(1, 6) if str(s) != decision]
        else:
            snapshot_id, metric = None, None
            change_id = f"github.com/{product.split()[0].lower()}/repo#{i}"
            decision = rng.choice(LABELS)
            alternatives = [label for label in LABELS if label != decision]
        judged_at = _moment(rng)
        review = rng.random()
        user_decision = user_reasoning = reviewer = reviewed_at = None
        if review < 0.5:
            reviewer = rng.choice(REVIEWERS)
            reviewed_at = judged_at + timedelta(hours=rng.randrange(1, 24 * 14))
            if review < 0.25:
                user_decision = rng.choice(alternatives)
                user_reasoning = rng.choice(USER_REASONS)
            else:
                user_decision = decision
        yield {
            "change_id": change_id,
            "product": product,
            "metric": metric,
            "snapshot_id": snapshot_id,
            "decision": decision,
            "confidence": round(rng.uniform(0.3, 0.99), 2),
            "reasoning": rng.choice(REASONS),
            "user_decision": user_decision,
            "user_reasoning": user_reasoning,
            "reviewer": reviewer,
            "timestamp": judged_at,
            "reviewed_at": reviewed_at,
            "version": 1 if reviewer is None else 2,
            "was_corrected": user_decision is not None and user_decision != decision,
            "url": None if metric else f"https://example.com/pr/{i}",
            "description": None,
            "ai_provider": "openai",
            "judge_model": rng.choice(JUDGES),
        }


def insert_batched(
    engine: Engine, table: Any, rows: Iterator[dict[str, Any]], *, sqlite_cache_mb: int = 0
) -> int:
    """Bulk Core inserts (executemany) in batches inside one transaction; returns the row count.

    `sqlite_cache_mb` enlarges SQLite's page cache for this connection: index upkeep on a growing
    table then stays in memory (about 30% faster at 100k rows, more at 1M).
    """
    total = 0
    with engine.begin() as conn:
        if sqlite_cache_mb and engine.dialect.name == "sqlite":
            conn.exec_driver_sql(f"PRAGMA cache_size = -{int(sqlite_cache_mb) * 1024}")
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) == BATCH_ROWS:
                conn.execute(insert(table), batch)
                total += len(batch)
                batch = []
        if batch:
            conn.execute(insert(table), batch)
            total += len(batch)
    return total


def generate(
    engine: Engine, *, judgments: int, snapshots: int | None = None, seed: int = 0
) -> dict[str, int]:
    """Fill a migrated, empty database: `snapshots` (default judgments // 10) snapshots, then judgments."""
    snapshots = judgments // 10 if snapshots is None else snapshots
    made_snapshots = insert_batched(
        engine,
        EvaluationSnapshot.__table__,
        snapshot_rows(snapshots, seed=seed),
        sqlite_cache_mb=GEN_CACHE_MB,
    )
    made_judgments = insert_batched(
        engine,
        Judgment.__table__,
        judgment_rows(judgments, seed=seed, snapshots=snapshots),
        sqlite_cache_mb=GEN_CACHE_MB,
    )
    return {"snapshots": made_snapshots, "judgments": made_judgments}


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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="replace an existing file")
    args = parser.parse_args(argv)
    if args.evaluations is not None:
        args.rows, args.snapshots = args.evaluations * JUDGMENTS_PER_EVALUATION, args.evaluations
    if args.db is not None and args.db.exists():
        if not args.force:
            print(f"error: {args.db} exists (use --force to replace it)", file=sys.stderr)
            return 1
        for suffix in ("", "-wal", "-shm"):
            Path(f"{args.db}{suffix}").unlink(missing_ok=True)
    started = time.perf_counter()
    url = args.url or f"sqlite:///{args.db.resolve()}"
    engine = init_db(url)
    counts = generate(engine, judgments=args.rows, snapshots=args.snapshots, seed=args.seed)
    engine.dispose()
    print(
        f"{args.db or engine.url.render_as_string()}: {counts['judgments']:,} judgments, "
        f"{counts['snapshots']:,} snapshots in {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
