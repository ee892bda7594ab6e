"""The Evaluations text filter's own queries at each size: the capped count, the first page, the next page.

    .venv/bin/python bench/bench_text_filter.py /work/bench-data/pages_1k_0014_g5.db \\
        /work/bench-data/pages_100k_0014_g5.db /work/bench-data/pages_1M_0014_g5.db
    .venv/bin/python bench/bench_text_filter.py postgresql://overrule:overrule@127.0.0.1:5432/overrule_pages_1k_0014_g5 ...

Each argument is a database built by `bench/gen.py` (a SQLite file, opened read-only, or a PostgreSQL
URL) already at the Alembic head: the script never migrates. For each query it times
`inspector.count_evaluations` (what "10,000+" comes from), `inspector.fetch_page` (first page) and
the keyset page after it, in one session as the page does (median of `--repeat` after a warm-up),
and prints milliseconds of wall and of this process's CPU (PostgreSQL's server time is in the wall
only), then each figure's ratio to the first database's. The queries span the plans of `lib.search`:
gen.py's questions are five templates plus "(case N)", so "case 1234" is in ~111 rows per million,
"case 12" in ~1.1% of rows and "reset my password" (bench_pages' phrase) in a fifth.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine  # noqa: E402
from sqlmodel import Session  # noqa: E402

from lib import inspector  # noqa: E402
from lib.db import normalize_url  # noqa: E402

QUERIES = ("reset my password", "case 12", "case 1234", "zzz no such text")
STEPS = ("count", "page 1", "page 2")


def _url(target: str) -> str:
    return target if "://" in target else f"sqlite:///file:{Path(target).resolve()}?mode=ro&uri=true"


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    result = fn()  # warm-up
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def _measure_query(session: Session, query: str, repeat: int) -> dict[str, tuple[float, float]]:
    filters = inspector.EvaluationFilters(text=query)
    count = partial(inspector.count_evaluations, session=session, filters=filters)
    first = partial(inspector.fetch_page, session=session, filters=filters)
    wall_c, cpu_c, total = _timed(count, repeat)
    wall_1, cpu_1, rows = _timed(first, repeat)
    after = inspector.page_key(rows[-1], filters.sort) if rows else None
    wall_2, cpu_2, _ = _timed(partial(first, after=after), repeat)
    print(f"  {query!r}: {inspector.count_label(total)} matches", file=sys.stderr)
    return {"count": (wall_c, cpu_c), "page 1": (wall_1, cpu_1), "page 2": (wall_2, cpu_2)}


def measure(target: str, queries: tuple[str, ...], repeat: int) -> dict[tuple[str, str], tuple[float, float]]:
    """(query, step) -> (wall s, cpu s) on one database."""
    engine = create_engine(normalize_url(_url(target)))
    out: dict[tuple[str, str], tuple[float, float]] = {}
    try:
        with Session(engine) as session:
            for query in queries:
                for step, figures in _measure_query(session, query, repeat).items():
                    out[(query, step)] = figures
    finally:
        engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure every database, print ms and ratios to the first."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "databases", nargs="+", help="SQLite files (read-only) or PostgreSQL URLs, smallest first"
    )
    parser.add_argument(
        "--query", action="append", help="a query to time (repeatable; default: four of them)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    queries = tuple(args.query) if args.query else QUERIES
    results = []
    for target in args.databases:
        print(f"measuring {target}", file=sys.stderr)
        results.append(measure(target, queries, args.repeat))
    names = [Path(t).name if "://" not in t else t.rsplit("/", 1)[-1] for t in args.databases]
    head = "| query | step | " + " | ".join(f"{n} ms (cpu)" for n in names)
    head += "".join(f" | {n} / first (cpu)" for n in names[1:]) + " |"
    print(head)
    print("|" + "---|" * (2 + 2 * len(names) - 1))
    for query in queries:
        for step in STEPS:
            cells = [f"{r[(query, step)][0] * 1000:.1f} ({r[(query, step)][1] * 1000:.1f})" for r in results]
            first = results[0][(query, step)]
            for r in results[1:]:
                wall, cpu = r[(query, step)]
                cells.append(f"{wall / max(first[0], 1e-9):.2f}x ({cpu / max(first[1], 1e-9):.2f}x)")
            print(f"| {query} | {step} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
