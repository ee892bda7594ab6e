"""What the OTLP waiting list costs with a week of waiting rows (review11 F4).

    python bench/bench_otlp_waiting.py [--rows 100000] [--pg ADMIN_URL]

Two databases each (a fresh SQLite file in bench/out/, and with `--pg` a fresh PostgreSQL database):
`--rows` waiting VERDICT rows (as lib.otlp keeps them: half under a span that never came, half under
`response:<id>`, one verdict each with a 200-character explanation: the case the list exists for, a
pipeline whose verdicts are emitted in a sampled-out span), and `--rows` waiting CALLS (a span of
about 1.5 KB JSON each, no verdict: an app exporting every call). On each it runs what the
Admin page's section runs closed (`anything_waits` and `swept`) and open (`read(limit=SHOWN,
classed=CLASSED)`, as the API does with its `limit`), what the CLI runs (`lib.otlp_waiting.read(limit=50)`) and the whole
list as CSV (`lib.otlp_waiting.csv_chunks`, the page's streamed link and the CLI's `--csv`, consumed
chunk by chunk): CPU seconds of this process (median of `--runs`; the PostgreSQL server's apart),
then each once more under tracemalloc for the peak of Python memory. On PostgreSQL parallel query is
off (max_parallel_workers_per_gather = 0): a parallel worker's CPU cannot be read once its query ends,
and the plain queries' scans and sorts ran two thirds in workers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import backend_cpu, drop_pg_database, fresh_pg_database, fresh_sqlite_url  # noqa: E402


def fill(engine: Any, rows: int, kind: str) -> None:
    """`rows` waiting rows of `kind` ("verdicts" or "calls"), as lib.otlp writes them."""
    import random

    from sqlalchemy import insert

    from lib.models import OtlpSpan, utcnow

    now = utcnow()
    rnd = random.Random(1)
    answer = "Lima is the capital of Peru. " * 20
    batch: list[dict] = []
    with engine.begin() as conn:
        for i in range(rows):
            key = f"{rnd.getrandbits(128):032x}:{rnd.getrandbits(64):016x}"
            if kind == "verdicts":
                pending = [{"metric": "truthfulness", "score": 4.0, "label": None, "explanation": "x" * 200}]
                row = {
                    "key": key if i % 2 else f"response:r-{i}",
                    "response_id": None if i % 2 else f"r-{i}",
                    "snapshot_id": None,
                    "span_json": None,
                    "pending_json": pending,
                }
            else:
                span = {
                    "key": key,
                    "name": "chat gpt-4o",
                    "response_id": f"chatcmpl-{i}",
                    "question": "What is the capital of Peru? " * 20,
                    "answer": answer,
                    "model": "gpt-4o",
                    "product": "support-bot",
                    "language": "en",
                    "created_at": now.isoformat(),
                    "missing": [],
                }
                row = {
                    "key": key,
                    "response_id": f"chatcmpl-{i}",
                    "snapshot_id": None,
                    "span_json": span,
                    "pending_json": [],
                }
            batch.append({**row, "received_at": now})
            if len(batch) == 5000:
                conn.execute(insert(OtlpSpan.__table__), batch)
                batch = []
        if batch:
            conn.execute(insert(OtlpSpan.__table__), batch)


def measure(work: Callable[[], object], runs: int, database: str | None) -> tuple[float, float, float]:
    """Median CPU seconds of `work` over `runs` (this process, and the PostgreSQL server processes
    serving `database`), then its peak Python memory (MiB) in one traced run."""
    cpu, server = [], []
    for _ in range(runs):
        before = backend_cpu(database) if database else {}
        start = time.process_time()
        work()
        cpu.append(time.process_time() - start)
        after = backend_cpu(database) if database else {}
        server.append(sum(after[pid] - before.get(pid, 0.0) for pid in after))
    tracemalloc.start()
    work()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(cpu), statistics.median(server), peak / 2**20


def _no_parallel_query(dbapi_connection: Any, _record: Any) -> None:
    """Parallel query off for the connection's session (outside a transaction, as lib.db's
    `_plan_each_execution` sets its own: the pool's rollback would undo it)."""
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        dbapi_connection.execute("SET max_parallel_workers_per_gather = 0")
    finally:
        dbapi_connection.autocommit = autocommit


def run(url: str, label: str, rows: int, runs: int) -> None:
    for kind in ("verdicts", "calls"):
        run_kind(url, label, rows, runs, kind)


def run_kind(url: str, label: str, rows: int, runs: int, kind: str) -> None:
    from lib import otlp_waiting
    from lib.db import init_db, session_scope
    from lib.otlp_waiting import CLASSED
    from lib.ui.otlp_waiting import SHOWN

    engine = init_db(url)
    if engine.dialect.name == "postgresql":
        # Every query's work in the backend counted: a parallel worker's CPU is not (its process
        # ends with the query), and a plain query's scan and sort ran two thirds in workers while a
        # server-side cursor's (the streamed CSV's) may not use them.
        from sqlalchemy import event

        event.listen(engine, "connect", _no_parallel_query)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM otlp_spans")
    fill(engine, rows, kind)

    def closed() -> None:  # the Admin page's section closed (lib.ui.otlp_waiting)
        with session_scope(engine, read_only=True) as session:
            otlp_waiting.anything_waits(session)
            otlp_waiting.swept(session)

    def opened() -> None:  # opened: verdicts counted by why among the oldest CLASSED
        with session_scope(engine, read_only=True) as session:
            otlp_waiting.read(session, limit=SHOWN, classed=CLASSED)

    def page() -> None:  # the CLI's: every row classed
        with session_scope(engine, read_only=True) as session:
            otlp_waiting.read(session, limit=50)

    size = 0

    def download() -> None:
        nonlocal size
        size = sum(len(chunk) for chunk in otlp_waiting.csv_chunks(engine))

    database = url.rpartition("/")[2] if url.startswith("postgresql") else None
    cases = (
        ("page, section closed", closed),
        (f"page, section open; API (classed={CLASSED:,})", opened),
        ("read(limit=50) (CLI)", page),
        ("CSV streamed", download),
    )
    for name, work in cases:
        cpu, server, peak = measure(work, runs, database)
        extra = f", {size / 2**20:.1f} MiB of CSV" if name == "CSV streamed" else ""
        served = f" + server {server:.2f}" if database else ""
        print(
            f"{label}\t{rows:,} waiting {kind}\t{name}\t{cpu:.2f}{served} CPU s\tpeak {peak:.0f} MiB{extra}",
            flush=True,
        )
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pg", help="PostgreSQL admin URL: also measure on a fresh database there")
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()
    if not args.skip_sqlite:
        run(fresh_sqlite_url(ROOT / "bench" / "out" / "otlp_waiting.db"), "SQLite", args.rows, args.runs)
    if args.pg:
        name = "overrule_bench_otlp_waiting"
        try:
            run(fresh_pg_database(args.pg, name), "PostgreSQL", args.rows, args.runs)
        finally:
            drop_pg_database(args.pg, name)


if __name__ == "__main__":
    main()
