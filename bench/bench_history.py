"""select_history at a million judgments vs the seed-004 in-memory algorithm over the same rows.

    .venv/bin/python bench/bench_history.py                      # 1,000,000 judgments, SQLite
    .venv/bin/python bench/bench_history.py --judgments 100000
    .venv/bin/python bench/bench_history.py --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres

The database is filled by `bench/gen.py` (five products, a quarter of the judgments corrected).
The baseline is the seed's `get_history_for_prompt`, verbatim, over every judgment loaded into
Python objects the way the seed's cache holds them (a dict by change_id, loaded once; the load is
timed separately and not counted per call). Both sides must return the same change_ids in the same
order. Prints the median per-call times, their ratio (goal ≥ 100x) and the query plans.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/bench_history.py` from anywhere
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, select, text  # noqa: E402
from sqlmodel import Session  # noqa: E402

from bench.common import drop_pg_database, fresh_pg_database  # noqa: E402
from bench.gen import PRODUCTS, generate  # noqa: E402
from lib.corrections import history_pool_sql, select_history  # noqa: E402
from lib.db import init_db  # noqa: E402
from lib.models import Judgment  # noqa: E402
from tests.seed004 import CachedJudgment, seed_get_history_for_prompt  # noqa: E402


def load_cache(engine: Engine) -> dict[str, CachedJudgment]:
    """Every judgment as a Python object in insertion order, like the seed's loaded JSON cache."""
    cache: dict[str, CachedJudgment] = {}
    columns = (
        Judgment.change_id,
        Judgment.product,
        Judgment.metric,
        Judgment.was_corrected,
        Judgment.timestamp,
    )
    with Session(engine) as session:
        for row in session.execute(select(*columns).order_by(Judgment.id)).yield_per(50_000):
            change_id, product, metric, was_corrected, timestamp = row
            cache[change_id] = CachedJudgment(change_id, product, was_corrected, timestamp, metric)
    return cache


def timings(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median, best) seconds per call after a warm-up; the best shows the cost without machine noise."""
    fn()  # warm-up: caches, statement compilation
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def query_plans(engine: Engine) -> list[str]:
    lines = []
    with Session(engine) as session:
        for metric in (None, "clarity"):
            for corrected in (True, False):
                sql = history_pool_sql(
                    session=session, product=PRODUCTS[0], metric=metric, corrected=corrected, limit=20
                )
                if engine.dialect.name == "sqlite":
                    plan = [r[-1] for r in session.connection().exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
                else:
                    plan = [
                        r[0]
                        for r in session.connection().exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + sql)
                    ]
                label = f"metric={metric or 'any'}, was_corrected={corrected}"
                lines.append(f"  [{label}]")
                lines.extend(f"    {p}" for p in plan)
    return lines


def run(engine: Engine, judgments: int, runs: int) -> None:
    with Session(engine) as session:
        count = session.execute(text("SELECT COUNT(*) FROM judgments")).scalar_one()
    if count == 0:
        start = time.perf_counter()
        made = generate(engine, judgments=judgments, seed=0)
        print(f"generated {made} in {time.perf_counter() - start:.1f} s")
    else:
        print(f"reusing {count:,} judgments")
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("ANALYZE judgments"))
            conn.commit()

    start = time.perf_counter()
    cache = load_cache(engine)
    load_s = time.perf_counter() - start
    print(f"loaded {len(cache):,} judgments into Python objects in {load_s:.1f} s (seed: once per process)")

    print(f"{'product':<18} {'indexed ms (best)':>18} {'in-memory ms (best)':>20} {'ratio':>7}  same result")
    ratios = []
    with Session(engine) as session:
        for product in PRODUCTS:

            def indexed(product: str = product) -> list[Judgment]:
                return select_history(session, product)

            def in_memory(product: str = product) -> list[CachedJudgment]:
                return seed_get_history_for_prompt(cache, product)

            same = [j.change_id for j in indexed()] == [j.change_id for j in in_memory()]
            fast, fast_best = timings(indexed, runs)
            slow, slow_best = timings(in_memory, max(3, runs // 10))
            ratios.append(slow / fast)
            print(
                f"{product:<18} {fast * 1000:>9.2f} ({fast_best * 1000:5.2f}) {slow * 1000:>11.1f} ({slow_best * 1000:6.1f})"
                f" {slow / fast:>6.0f}x  {same}"
            )
            if not same:
                raise SystemExit(f"selection differs from the seed's for {product!r}")
        with_metric, _ = timings(lambda: select_history(session, PRODUCTS[0], metric="clarity"), runs)
    print(f"median ratio (of medians): {statistics.median(ratios):.0f}x (goal >= 100x)")
    print(f"select_history with metric='clarity': {with_metric * 1000:.2f} ms")
    print("query plans of the two pool queries:")
    print("\n".join(query_plans(engine)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judgments", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=50, help="timed calls per product (indexed)")
    parser.add_argument("--db", default=None, help="SQLite file to fill or reuse (default: a temp file)")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL: run on a throw-away database too")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="overrule-bench-") as tmp:
        path = Path(args.db) if args.db else Path(tmp) / "history.db"
        print(f"== SQLite ({path})")
        engine = init_db(f"sqlite:///{path}")
        run(engine, args.judgments, args.runs)
        engine.dispose()

    if args.pg:
        name = f"overrule_bench_{secrets.token_hex(4)}"
        url = fresh_pg_database(args.pg, name)
        try:
            print(f"== PostgreSQL ({name})")
            engine = init_db(url)
            run(engine, args.judgments, args.runs)
            engine.dispose()
        finally:
            drop_pg_database(args.pg, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
