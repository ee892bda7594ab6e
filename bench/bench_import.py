"""Import benchmark: the importer's bulk write path vs per-row ORM, for N judgment rows.

    python bench/bench_import.py [--sizes 1000 100000] [--per-row-cap 100000] [--url URL]
                                 [--sqlite-cache-mb MB]

Bulk: one transaction, rows written as `lib.importer` writes them: tuples
through `lib.bulk.insert_tuples` (executemany on SQLite, COPY on PostgreSQL), with the secondary
indexes dropped and rebuilt after the load when it is large for the table (`lib.bulk.worth_deferring`,
50k+ rows into a table at most twice that size; unique indexes always stay), then the counters
(`lib.counters.judgments_added`), which the per-row baseline maintains through the ORM flush hooks.
Per-row baseline, made fair rather than strawman: `session.add(Judgment(...))` and `session.flush()`
per row (each row hits the database, as an importer validating row by row would), a single commit
at the end (not a commit per row, which would mostly measure fsync). Rows come from bench/gen.py.
Above `--per-row-cap` rows the per-row time is measured on the cap and extrapolated linearly (the
output says so). Default database: a fresh SQLite file per measurement in bench/out/; `--url`
runs against another (e.g. PostgreSQL) database, emptied of judgments before each measurement.
Wall-clock and CPU seconds are both printed: on a busy shared machine the wall clock mostly measures
the other jobs; with SQLite everything runs in this process, so CPU time is the method's own cost
(with `--url` PostgreSQL the server's CPU is not counted). `--sqlite-cache-mb` gives both methods a larger SQLite page cache (the app's default is SQLite's
2 MB), to see how much of the bulk time is index upkeep. Goal (issue): bulk >= 20x.
"""

from __future__ import annotations

import argparse
import sys
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, Table, delete, event, literal  # noqa: E402
from sqlmodel import Session  # noqa: E402

from bench.common import OUT, fresh_sqlite_url  # noqa: E402
from bench.gen import judgment_rows  # noqa: E402
from lib import counters  # noqa: E402
from lib.bulk import deferred_indexes, insert_tuples, worth_deferring  # noqa: E402
from lib.db import init_db, session_scope  # noqa: E402
from lib.models import Judgment, JudgmentEvent  # noqa: E402

JUDGMENTS: Table = Judgment.__table__  # type: ignore[attr-defined]


def fresh_engine(url: str | None, sqlite_cache_mb: int = 0) -> Engine:
    """An empty judgments table: a new SQLite file, or the given database with judgments deleted."""
    if url is None:
        engine = init_db(fresh_sqlite_url(OUT / "bench_import.db"))
        if sqlite_cache_mb:

            @event.listens_for(engine, "connect")
            def _cache(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
                dbapi_conn.execute(f"PRAGMA cache_size = -{sqlite_cache_mb * 1024}")

            engine.dispose()  # reconnect so every connection gets the pragma
        return engine
    engine = init_db(url)
    with engine.begin() as conn:
        conn.execute(delete(JudgmentEvent))
        conn.execute(delete(Judgment))
    return engine


def bulk(engine: Engine, rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Wall and CPU seconds for the importer's bulk write path in one transaction, counters included.

    Like `lib.importer`: tuples through `lib.bulk`, secondary indexes deferred when the load is
    large for the table, then the counters every write keeps (`lib.counters`, one set-based update
    over the new rows), which the per-row baseline pays through the ORM flush hooks.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    columns = tuple(rows[0])
    with session_scope(engine) as session:
        conn = session.connection()
        defer = worth_deferring(conn, JUDGMENTS, len(rows))
        with deferred_indexes(conn, [JUDGMENTS], defer=defer):
            insert_tuples(conn, JUDGMENTS, columns, map(itemgetter(*columns), rows))
        counters.judgments_added(session=session, where=literal(True))  # the table was empty
    return time.perf_counter() - started, time.process_time() - cpu_started


def per_row(engine: Engine, rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Wall and CPU seconds for ORM add + flush per row, one commit at the end."""
    started, cpu_started = time.perf_counter(), time.process_time()
    with Session(engine) as session:
        for row in rows:
            session.add(Judgment(**row))
            session.flush()
        session.commit()
    return time.perf_counter() - started, time.process_time() - cpu_started


def main(argv: list[str] | None = None) -> int:
    """Print seconds, rows/s and the bulk/per-row ratio per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000])
    parser.add_argument("--per-row-cap", type=int, default=100_000, help="extrapolate per-row above this")
    parser.add_argument("--url", default=None, help="database URL (default: a fresh SQLite file)")
    parser.add_argument("--sqlite-cache-mb", type=int, default=0, help="SQLite page cache for both methods")
    args = parser.parse_args(argv)
    header = (
        f"{'rows':>10} | {'bulk wall s':>11} | {'per-row wall s':>14} | {'ratio':>6} | "
        f"{'bulk cpu s':>10} | {'per-row cpu s':>13} | {'ratio':>6} | note"
    )
    lines = [header, "-" * len(header)]
    for size in args.sizes:
        rows = list(judgment_rows(size, seed=1))  # built before timing: only the insert is measured
        engine = fresh_engine(args.url, args.sqlite_cache_mb)
        bulk_s, bulk_cpu = bulk(engine, rows)
        engine.dispose()
        measured = min(size, args.per_row_cap)
        engine = fresh_engine(args.url, args.sqlite_cache_mb)
        row_s, row_cpu = per_row(engine, rows[:measured])
        row_s, row_cpu = row_s * size / measured, row_cpu * size / measured
        engine.dispose()
        note = "" if measured == size else f"per-row extrapolated from {measured:,} rows"
        line = (
            f"{size:>10,} | {bulk_s:>11.2f} | {row_s:>14.2f} | {row_s / bulk_s:>5.1f}x | "
            f"{bulk_cpu:>10.2f} | {row_cpu:>13.2f} | {row_cpu / bulk_cpu:>5.1f}x | {note}"
        )
        lines.append(line)
        print(line, flush=True)
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
