"""The figures read from lib.counters, 1k vs 100k evaluations: do they stay flat as the data grows?

    .venv/bin/python bench/bench_counters.py --sizes 1k,100k --db-dir /tmp/bench
    .venv/bin/python bench/bench_counters.py --sizes 1k,100k --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres

Times the lib calls behind Overview (overview_stats, per_product_frame), Corrections (stats, also
under a reviewer, the trend, the pager's count), the review queue's progress and the Evaluations list (capped counts,
review-state / metric filters, a deep page by keyset vs by OFFSET), in-process, median of
`--repeat` runs after one warm-up, on the databases `bench/bench_pages.py` builds with
`bench/gen.py` (10 judgments per evaluation). Prints seconds per call and size, the ratio to the
smallest size (goal ≤ 1.5), and, for reference, a full recount (what every page did before: it
grows with the rows). SQLite's EXPLAIN QUERY PLAN of the hot statements is printed with `--plans`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import OUT, label, parse_sizes, pg_database, sqlite_database  # noqa: E402


def calls() -> dict[str, Callable[[Any], Any]]:
    """Each measured call, given a session."""
    from lib import corrections, counters, inspector, overview, review_queue
    from lib.corrections import JudgmentFilter
    from lib.inspector import EvaluationFilters
    from lib.review_queue import QueueFilter

    def deep_page_keyset(s: Any) -> Any:
        filters = EvaluationFilters()
        first = inspector.fetch_page(session=s, filters=filters, offset=0, limit=25)
        return inspector.fetch_page(
            session=s, filters=filters, limit=25, after=inspector.page_key(first[-1], "newest")
        )

    return {
        "overview_stats": lambda s: overview.overview_stats(session=s),
        "per_product_frame": lambda s: overview.per_product_frame(session=s),
        "corrections.stats": lambda s: corrections.stats(session=s),
        "corrected_of_reviewed_over_time W": lambda s: corrections.corrected_of_reviewed_over_time(
            session=s, freq="W"
        ),
        "count_judgments (state)": lambda s: corrections.count_judgments(
            session=s, filters=JudgmentFilter(state="corrected")
        ),
        "corrections.stats reviewer": lambda s: corrections.stats(session=s, reviewer="ayse"),
        "corrections.stats reviewer+product+metric": lambda s: corrections.stats(
            session=s, reviewer="ayse", product="Acme Fungear", metric="clarity"
        ),
        "count_judgments reviewer+state": lambda s: corrections.count_judgments(
            session=s, filters=JudgmentFilter(reviewer="ayse", state="corrected")
        ),
        "list_judgments reviewer page 1": lambda s: corrections.list_judgments(
            session=s, filters=JudgmentFilter(reviewer="ayse")
        ),
        "queue_progress": lambda s: review_queue.queue_progress(session=s, filters=QueueFilter()),
        "queue_progress product+metric+lang": lambda s: review_queue.queue_progress(
            session=s, filters=QueueFilter(product="Acme Fungear", metric="clarity", language="en")
        ),
        "count_evaluations (none)": lambda s: inspector.count_evaluations(
            session=s, filters=EvaluationFilters()
        ),
        "count_evaluations review=pending": lambda s: inspector.count_evaluations(
            session=s, filters=EvaluationFilters(review="pending")
        ),
        "fetch_page review=corrected": lambda s: inspector.fetch_page(
            session=s, filters=EvaluationFilters(review="corrected")
        ),
        "fetch_page metric=clarity": lambda s: inspector.fetch_page(
            session=s, filters=EvaluationFilters(metric="clarity")
        ),
        "page 2 by keyset": deep_page_keyset,
        "page 200 by OFFSET (ref.)": lambda s: inspector.fetch_page(
            session=s, filters=EvaluationFilters(), offset=25 * 199, limit=25
        ),
        "full recount (ref.)": lambda s: counters.recount(session=s, only=["judgment_counts"]),
    }


def measure(url: str, repeat: int) -> dict[str, float]:
    """Median seconds per call on one database (the recount is rolled back: nothing changes)."""
    from sqlmodel import Session

    from lib.db import init_db

    engine = init_db(url)
    out: dict[str, float] = {}
    for name, call in calls().items():
        times = []
        for i in range(repeat + 1):
            with Session(engine) as session:
                start = time.perf_counter()
                call(session)
                elapsed = time.perf_counter() - start
                session.rollback()
            if i:
                times.append(elapsed)
        out[name] = statistics.median(times)
    engine.dispose()
    return out


def print_plans(url: str) -> None:
    """EXPLAIN QUERY PLAN of the list's filtered page query and a counters read (SQLite)."""
    from sqlmodel import Session, col, select

    from lib import inspector
    from lib.db import init_db
    from lib.models import EvaluationSnapshot, JudgmentLanguageCount

    engine = init_db(url)
    with Session(engine) as s:
        for review in ("pending", "corrected"):
            stmt = (
                select(EvaluationSnapshot.id)
                .where(*inspector.filter_conditions(inspector.EvaluationFilters(review=review)))  # type: ignore[arg-type]
                .order_by(col(EvaluationSnapshot.created_at).desc(), col(EvaluationSnapshot.id).desc())
                .limit(25)
            )
            _plan(s, f"list review={review}", stmt)
        _plan(
            s,
            "queue progress",
            select(JudgmentLanguageCount.judgments).where(JudgmentLanguageCount.product == "x"),
        )
    engine.dispose()


def _plan(s: Any, title: str, stmt: Any) -> None:
    sql = str(stmt.compile(dialect=s.get_bind().dialect, compile_kwargs={"literal_binds": True}))
    rows = s.connection().exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}").all()
    print(f"{title}: " + " | ".join(str(r[-1]) for r in rows))


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the databases, time every call per size, print the table of ratios."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1k,100k"))
    parser.add_argument("--db-dir", type=Path, default=OUT)
    parser.add_argument("--pg", metavar="ADMIN_URL", help="measure PostgreSQL instead of SQLite")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--plans", action="store_true", help="print SQLite query plans of the hot statements")
    parser.add_argument(
        "--db", action="append", default=[], metavar="SIZE=FILE", help="measure this SQLite file as SIZE"
    )
    args = parser.parse_args(argv)
    given = {
        parse_sizes(size)[0]: f"sqlite:///{Path(file).resolve()}"
        for size, file in (d.split("=", 1) for d in args.db)
    }
    if given:
        args.sizes = sorted(given)
    urls = {
        n: given.get(n)
        or (pg_database(args.pg, n, build=True) if args.pg else sqlite_database(args.db_dir, n, build=True))
        for n in args.sizes
    }
    results = {n: measure(url, args.repeat) for n, url in urls.items()}
    base = args.sizes[0]
    head = "".join(f"{label(n):>10}" for n in args.sizes)
    ratios = "".join(f"{label(n) + '/' + label(base):>12}" for n in args.sizes[1:])
    print(f"{'call':<38}{head}{ratios}")
    for name in results[base]:
        cells = "".join(f"{results[n][name] * 1000:>8.2f}ms" for n in args.sizes)
        ratio = "".join(f"{results[n][name] / results[base][name]:>11.2f}x" for n in args.sizes[1:])
        print(f"{name:<38}{cells}{ratio}")
    if args.plans and not args.pg:
        print_plans(urls[args.sizes[-1]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
