"""Evaluations text search: the trigram index (lib.search) vs the old `lower(question) LIKE '%…%'` scan.

Builds a database of N evaluations (default 100,000) whose questions are 6–12 words drawn from a
vocabulary of 20,000 made-up words plus Turkish ones, then times, for queries that match few,
some and many rows (and one of two characters, which has no trigram and is a LIKE by design):

- `count`: the match count (`count_evaluations`, what the page shows above the list);
- `page`: the first page of 25 ids, newest first (`fetch_page`).

"old" is the condition before the index (SQLAlchemy `icontains`: `lower(question) LIKE lower(?)`,
ASCII-only case folding, a scan of every live row); "new" is `lib.search.text_match`. Median of 5
runs after a warm-up; prints seconds and the old/new ratio.

    .venv/bin/python bench/bench_search.py                        # SQLite, 100k rows
    .venv/bin/python bench/bench_search.py --rows 10000
    .venv/bin/python bench/bench_search.py --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, func, insert, select  # noqa: E402
from sqlmodel import Session, col  # noqa: E402

from bench.common import drop_pg_database, fresh_pg_database  # noqa: E402
from lib.db import init_db  # noqa: E402
from lib.inspector import EvaluationFilters, filter_conditions  # noqa: E402
from lib.models import EvaluationSnapshot  # noqa: E402
from lib.search import normalize_search_text, text_match  # noqa: E402

CHUNK = 5_000
RUNS = 5
TURKISH = ["İstanbul", "Ödülü", "Işık", "çocuk", "şehir", "ağaç", "güneş", "İzmir", "sınav", "öğretmen"]
RARE = "Zeytinyağlı"  # in exactly 10 rows
QUERIES = {
    "rare word (10 rows)": "zeytinyağlı",
    "turkish word (~2%)": "istanbul",
    "common word (~25%)": "the",
    "two characters": "iz",
}


def _vocabulary(rng: random.Random) -> list[str]:
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "be", "fi", "ho"]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(20_000)]


def _rows(count: int, seed: int = 0) -> Any:
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    rare = set(rng.sample(range(count), 10))
    start = datetime(2025, 1, 1, tzinfo=UTC)
    for i in range(count):
        words = rng.sample(vocab, rng.randint(6, 12))
        if rng.random() < 0.25:
            words.insert(0, "the")
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), rng.choice(TURKISH))
        if i in rare:
            words.append(RARE)
        question = " ".join(words).capitalize() + "?"
        yield {
            "id": f"snap_{i:07d}",
            "created_at": start + timedelta(seconds=i * 30),
            "question": question,
            "search_text": normalize_search_text(question),
            "model_answer": "answer",
            "product": "acme",
            "language": "tr",
            "bonus_metrics": [],
            "user_scores_json": {},
            "judge_scores_json": {},
            "deleted_at": None,
            "source_key": f"k{i}",
        }


def build(engine: Engine, count: int, *, analyze: bool = True) -> None:
    batch: list[dict[str, Any]] = []
    with engine.begin() as conn:
        for row in _rows(count):
            batch.append(row)
            if len(batch) == CHUNK:
                conn.execute(insert(EvaluationSnapshot), batch)
                batch = []
        if batch:
            conn.execute(insert(EvaluationSnapshot), batch)
    if not analyze:
        return
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    else:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")


def _old(query: str) -> list[Any]:
    conds = filter_conditions(EvaluationFilters())
    return [*conds, col(EvaluationSnapshot.question).icontains(query, autoescape=True)]


def _new(query: str) -> list[Any]:
    return [*filter_conditions(EvaluationFilters()), text_match(EvaluationSnapshot.__table__, query)]


def _median(fn: Callable[[], Any]) -> tuple[float, Any]:
    result = fn()  # warm-up
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def measure(engine: Engine, label: str) -> None:
    s = EvaluationSnapshot
    print(f"\n{label}")
    print(f"{'query':<22} {'step':<6} {'old s':>8} {'new s':>8} {'ratio':>7}  matches old/new")
    with Session(engine) as session:
        for name, query in QUERIES.items():
            for step in ("count", "page"):

                def run(conds: list[Any], step: str = step) -> Any:
                    if step == "count":
                        return session.exec(select(func.count()).select_from(s).where(*conds)).one()
                    stmt = (
                        select(col(s.id))
                        .where(*conds)
                        .order_by(col(s.created_at).desc(), col(s.id).desc())
                        .limit(25)
                    )
                    return len(session.exec(stmt).all())

                old_s, old_n = _median(lambda run=run, q=query: run(_old(q)))
                new_s, new_n = _median(lambda run=run, q=query: run(_new(q)))
                print(
                    f"{name:<22} {step:<6} {old_s:>8.4f} {new_s:>8.4f} {old_s / new_s:>6.1f}x  {old_n}/{new_n}"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument(
        "--no-analyze", action="store_true", help="skip ANALYZE: SQLite then plans without statistics"
    )
    parser.add_argument("--pg", help="PostgreSQL admin URL: also measure there (database bench_search)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        engine = init_db(f"sqlite:///{Path(tmp) / 'search.db'}")
        t0 = time.perf_counter()
        build(engine, args.rows, analyze=not args.no_analyze)
        print(f"SQLite: built {args.rows:,} evaluations in {time.perf_counter() - t0:.1f} s")
        measure(engine, f"SQLite, {args.rows:,} evaluations")
        engine.dispose()
    if args.pg:
        url = fresh_pg_database(args.pg, "bench_search")
        engine = init_db(url)
        try:
            t0 = time.perf_counter()
            build(engine, args.rows, analyze=not args.no_analyze)
            print(f"PostgreSQL: built {args.rows:,} evaluations in {time.perf_counter() - t0:.1f} s")
            measure(engine, f"PostgreSQL, {args.rows:,} evaluations")
        finally:
            engine.dispose()
            drop_pg_database(args.pg, "bench_search")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
