"""Evaluations list at 1k vs 100k snapshots: does a page rerun stay flat as the table grows?

Generates its own rows rather than using bench/gen.py, because the list filters on what gen.py
leaves constant: evidence summaries (all 0 there), archived rows with `deleted_at`, 8 judgments each.

Builds two databases with realistic rows (8 judgments per snapshot, evidence summaries, 1% archived),
then times (median of several runs, after a warm-up):

- the queries one list rerun makes (filter options, match count, one page with its review counts),
  for the default view and for common filters and sorts;
- a full render of pages/evaluations.py under Streamlit's AppTest (the reviewer's rerun).

Prints the times and the 100k/1k ratio of each (goal for the page render: ≤ 1.5).

    .venv/bin/python bench/bench_list.py                       # SQLite files in a temp dir
    .venv/bin/python bench/bench_list.py --pg postgresql://user:pw@host/postgres   # PostgreSQL too

(AppTest logs "missing ScriptRunContext" on stderr once per render; add `2>/dev/null` to hide it.)
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, insert, text  # noqa: E402
from sqlmodel import Session  # noqa: E402

from bench.common import drop_pg_database, fresh_pg_database  # noqa: E402
from lib.config import reset_settings  # noqa: E402
from lib.db import init_db  # noqa: E402
from lib.inspector import EvaluationFilters, count_evaluations, fetch_page, filter_options  # noqa: E402
from lib.metrics import DEFAULT_METRICS  # noqa: E402
from lib.models import EvaluationSnapshot, Judgment  # noqa: E402

SLUGS = [m.slug for m in DEFAULT_METRICS]
PRODUCTS = ["acme", "globex", "initech", "umbrella", "hooli"]
MODELS = ["gpt-4o", "mistral-nemo", "llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b", "phi-3"]
CATEGORIES = ["math", "history", "code", "health", "law", "travel", "science", "finance", "sports", "food"]
WORDS = [
    "the",
    "judge",
    "said",
    "answer",
    "model",
    "quote",
    "evidence",
    "clarity",
    "safety",
    "tower",
    "paris",
    "capital",
    "because",
]
CHUNK = 5_000

SCENARIOS: dict[str, EvaluationFilters] = {
    "default (newest)": EvaluationFilters(),
    "product + language": EvaluationFilters(product="globex", language="tr"),
    "sort weighted gap": EvaluationFilters(sort="weighted_gap"),
    "sort max gap, min gap 2": EvaluationFilters(sort="max_gap", min_gap=2.0),
    "has unverified evidence": EvaluationFilters(evidence="unverified"),
    "pending review": EvaluationFilters(review="pending"),
    "metric judged": EvaluationFilters(metric="clarity"),
    "text search": EvaluationFilters(text="paris capital"),
}


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def generate(engine: Engine, snapshots: int, seed: int = 7) -> None:
    """Bulk-insert `snapshots` evaluations and 8 judgments each (Core executemany, chunked)."""
    rng = random.Random(seed)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    snap_table, judgment_table = EvaluationSnapshot.__table__, Judgment.__table__
    with Session(engine) as session:
        for base in range(0, snapshots, CHUNK):
            snaps, judgments = [], []
            for i in range(base, min(base + CHUNK, snapshots)):
                sid = f"snap_{i:07d}"
                created = start + timedelta(seconds=int(i * 31_536_000 / snapshots))
                user = {s: {"score": rng.randint(1, 5), "reason": _sentence(rng, 6)} for s in SLUGS}
                judge = {s: {"score": rng.randint(1, 5), "reason": _sentence(rng, 6)} for s in SLUGS}
                gaps = [abs(user[s]["score"] - judge[s]["score"]) for s in SLUGS]
                evidence = rng.choice([0, 0, 1, 2, 3, 4])
                unverified = rng.choice([0, 0, 0, 1]) if evidence else 0
                unlocated = rng.choice([0, 0, 1]) if evidence - unverified > 0 else 0
                product = rng.choice(PRODUCTS)
                archived = rng.random() < 0.01
                snaps.append(
                    {
                        "id": sid,
                        "created_at": created,
                        "question": f"Question {i}: {_sentence(rng, 12)}?",
                        "model_answer": _sentence(rng, 120),
                        "model_name": rng.choice(MODELS),
                        "judge_model": "gpt-4o",
                        "product": product,
                        "language": rng.choice(["en", "en", "tr"]),
                        "category": rng.choice(CATEGORIES),
                        "primary_metric": SLUGS[0],
                        "bonus_metrics": SLUGS[1:3],
                        "user_scores_json": user,
                        "judge_scores_json": judge,
                        "evidence_json": None,
                        "judge_meta_score": rng.randint(1, 5),
                        "weighted_gap": None if rng.random() < 0.05 else round(rng.random() * 3, 2),
                        "max_metric_gap": float(max(gaps)),
                        "evidence_count": evidence,
                        "evidence_highlighted": evidence - unverified - unlocated,
                        "evidence_unlocated": unlocated,
                        "evidence_unverified": unverified,
                        "status": "archived" if archived else "active",
                        "deleted_at": created if archived else None,
                        "chat_turn_count": 0,
                        "max_chat_turns": 15,
                    }
                )
                reviewed_all = rng.random() < 0.6
                for slug in SLUGS:
                    reviewed = reviewed_all or rng.random() < 0.3
                    corrected = reviewed and rng.random() < 0.2
                    judgments.append(
                        {
                            "change_id": f"{sid}:{slug}",
                            "product": product,
                            "metric": slug,
                            "snapshot_id": sid,
                            "decision": str(judge[slug]["score"]),
                            "user_decision": (
                                str(user[slug]["score"]) if corrected else str(judge[slug]["score"])
                            )
                            if reviewed
                            else None,
                            "reviewer": "bench" if reviewed else None,
                            "timestamp": created,
                            "reviewed_at": created + timedelta(hours=1) if reviewed else None,
                            "version": 1,
                            "was_corrected": corrected,
                        }
                    )
            session.execute(insert(snap_table), snaps)
            session.execute(insert(judgment_table), judgments)
            session.commit()
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of `fn` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def rerun_queries(engine: Engine, filters: EvaluationFilters, page_size: int = 25) -> Callable[[], object]:
    """What one list rerun asks of the database."""

    def run() -> object:
        with Session(engine) as session:
            filter_options(session=session, product=filters.product)
            total = count_evaluations(session=session, filters=filters)
            return total, fetch_page(session=session, filters=filters, offset=0, limit=page_size)

    return run


def page_render(url: str) -> Callable[[], object]:
    """A full AppTest run of the Evaluations page against `url`.

    The component scan every new AppTest makes (~0.25 s, constant) is shared first: inside the
    1k denominator it made the 100k/1k ratio look flatter than the page is.
    """
    from streamlit.testing.v1 import AppTest

    from bench.bench_pages import share_component_scan

    share_component_scan()

    def run() -> object:
        os.environ["OVERRULE_DATABASE_URL"] = url
        os.environ["OVERRULE_LOAD_DEMO"] = "false"
        reset_settings()
        at = AppTest.from_file(str(ROOT / "pages" / "evaluations.py"), default_timeout=120).run()
        if at.exception:
            raise RuntimeError(at.exception[0].message)
        return at

    return run


def bench_backend(label: str, urls: dict[int, str], repeat: int) -> float:
    """Generate, time and print one backend; returns the page-render ratio."""
    engines: dict[int, Engine] = {}
    for size, url in urls.items():
        t0 = time.perf_counter()
        engines[size] = init_db(url)
        generate(engines[size], size)
        print(
            f"[{label}] generated {size:,} snapshots + {size * 8:,} judgments in {time.perf_counter() - t0:.1f}s"
        )
    small, large = sorted(urls)
    print(f"\n[{label}] queries of one list rerun (ms, median of {repeat})")
    print(f"  {'scenario':28} {small:>9,} {large:>9,}   ratio")
    for name, filters in SCENARIOS.items():
        a = median_ms(rerun_queries(engines[small], filters), repeat)
        b = median_ms(rerun_queries(engines[large], filters), repeat)
        print(f"  {name:28} {a:9.2f} {b:9.2f}   {b / a:5.2f}")
    render = {size: median_ms(page_render(url), max(3, repeat // 2)) for size, url in urls.items()}
    ratio = render[large] / render[small]
    print(
        f"\n[{label}] page render (AppTest, ms): {small:,}: {render[small]:.1f}   {large:,}: {render[large]:.1f}"
        f"   ratio {ratio:.2f}  (goal <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})\n"
    )
    for engine in engines.values():
        engine.dispose()
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument(
        "--pg", metavar="ADMIN_URL", help="also run on PostgreSQL (creates and drops two databases)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        urls = {n: f"sqlite:///{tmp}/bench_{n}.db" for n in (args.small, args.large)}
        bench_backend("sqlite", urls, args.repeat)
    if args.pg:
        names = {n: f"overrule_bench_{n}_{secrets.token_hex(3)}" for n in (args.small, args.large)}
        try:
            urls = {n: fresh_pg_database(args.pg, name) for n, name in names.items()}
            bench_backend("postgresql", urls, args.repeat)
        finally:
            for name in names.values():
                drop_pg_database(args.pg, name)


if __name__ == "__main__":
    main()
