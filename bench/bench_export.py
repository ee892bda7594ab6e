"""Export benchmark: DuckDB `COPY` (lib.export) vs `pandas.read_sql(...).to_csv()`, judgments table.

    python bench/bench_export.py [--sizes 1000 100000 1000000] [--repeat 3] [--pg ADMIN_URL]

Each measurement runs in a fresh process, so the peak memory printed is that method's alone. Both
wall-clock and CPU seconds are printed: on a shared, busy machine the wall clock mostly measures the
other jobs, while CPU time (all threads of the process, so DuckDB's parallel threads count against
it) is what the method itself costs.
Databases are generated once by bench/gen.py and reused (same seed, same data): SQLite files in
bench/out/, or with `--pg postgresql://user:pw@host/postgres` PostgreSQL databases
`overrule_bench_<rows>` created through that admin URL. On PostgreSQL the CPU column counts this
process only (the server's work is not in it), so read the wall clock there.
The DuckDB side does strictly more work than the baseline: it neutralises formula cells and
writes ISO 8601 UTC timestamps; pandas writes the raw values. Goal (issue): DuckDB >= 5x at 1M.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402
from sqlalchemy.exc import SQLAlchemyError  # noqa: E402

from bench.common import OUT, fresh_pg_database, fresh_sqlite_url  # noqa: E402
from bench.gen import generate  # noqa: E402
from lib.db import create_db_engine, init_db  # noqa: E402
from lib.models import Judgment  # noqa: E402


def _count_judgments(url: str) -> int:
    engine = create_db_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(Judgment)).scalar_one()
    except SQLAlchemyError:
        return -1  # not migrated yet
    finally:
        engine.dispose()


def _fresh_database(rows: int, pg_admin: str | None) -> str:
    """Drop whatever a previous (interrupted) run left and return the URL of an empty database."""
    if pg_admin is None:
        return fresh_sqlite_url(OUT / f"bench_{rows}.db")
    return fresh_pg_database(pg_admin, f"overrule_bench_{rows}")


def bench_db(rows: int, pg_admin: str | None = None) -> str:
    """The URL of the benchmark database with `rows` judgments, generated on first use."""
    if pg_admin is None:
        url = f"sqlite:///{OUT / f'bench_{rows}.db'}"
    else:
        url = f"{pg_admin.rpartition('/')[0]}/overrule_bench_{rows}"
    if (pg_admin is not None or Path(url.split("///", 1)[1]).exists()) and _count_judgments(url) == rows:
        return url
    url = _fresh_database(rows, pg_admin)
    started = time.perf_counter()
    engine = init_db(url)
    generate(engine, judgments=rows)
    engine.dispose()
    print(f"  generated {rows:,} judgments in {time.perf_counter() - started:.0f} s", flush=True)
    return url


def _export_here(method: str, url: str, out: str) -> tuple[float, float, float]:
    """One export in this process: wall seconds, CPU seconds, peak RSS in MB."""
    import pandas as pd  # imports stay outside the timed part

    from lib.export import export_table

    engine = create_db_engine(url)
    started, cpu_started = time.perf_counter(), time.process_time()
    if method == "duckdb_csv":
        export_table(engine=engine, table="judgments", fmt="csv", out=Path(out))
    elif method == "duckdb_parquet":
        export_table(engine=engine, table="judgments", fmt="parquet", out=Path(out))
    else:
        pd.read_sql("SELECT * FROM judgments", engine).to_csv(out, index=False)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    engine.dispose()
    return seconds, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run(method: str, url: str, out: str) -> tuple[float, float, float]:
    """One export in this (fresh) process: wall seconds, CPU seconds, peak RSS in MB.

    A DuckDB export of SQLite runs in a child forked by `lib.duck.run_isolated` (issue #17): the
    wall time is measured here, around the fork; CPU and memory are the child's own, where the work is.
    """
    from bench.bench_export import _export_here as export_here  # by module name: the worker imports it
    from lib.duck import run_isolated, start_isolated_workers, stop_isolated_workers

    if method.startswith("duckdb") and url.startswith("sqlite"):
        start_isolated_workers()  # the fork server starts once per app process, not per export
        started = time.perf_counter()
        _, cpu, rss = run_isolated(export_here, method, url, out)
        seconds = time.perf_counter() - started
        stop_isolated_workers()
        return seconds, cpu, rss
    return _export_here(method, url, out)


def measure(method: str, url: str, repeat: int) -> tuple[float, float, float]:
    """Best wall time, best CPU time and the largest peak memory over `repeat` fresh-process runs."""
    ctx = multiprocessing.get_context("spawn")
    results = []
    suffix = "parquet" if method.endswith("parquet") else "csv"
    for _ in range(repeat):
        # Not multiprocessing.Pool: its daemonic workers may not start the export's own child process.
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            results.append(pool.submit(_run, method, url, str(OUT / f"export_{method}.{suffix}")).result())
    return min(r[0] for r in results), min(r[1] for r in results), max(r[2] for r in results)


def main(argv: list[str] | None = None) -> int:
    """Print seconds, peak memory and the DuckDB/pandas ratio per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3, help="runs per method (1 above 100k rows)")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL: benchmark PostgreSQL instead")
    args = parser.parse_args(argv)
    header = (
        f"{'rows':>10} | {'duckdb wall s':>13} | {'pandas wall s':>13} | {'ratio':>6} | "
        f"{'duckdb cpu s':>12} | {'pandas cpu s':>12} | {'ratio':>6} | "
        f"{'duckdb MB':>9} | {'pandas MB':>9} | {'parquet wall s':>14}"
    )
    lines = [header, "-" * len(header)]
    for rows in args.sizes:
        db = bench_db(rows, args.pg)
        repeat = args.repeat if rows <= 100_000 else 1
        duck_s, duck_cpu, duck_mb = measure("duckdb_csv", db, repeat)
        pandas_s, pandas_cpu, pandas_mb = measure("pandas_csv", db, repeat)
        parquet_s, _, _ = measure("duckdb_parquet", db, repeat)
        line = (
            f"{rows:>10,} | {duck_s:>13.2f} | {pandas_s:>13.2f} | {pandas_s / duck_s:>5.1f}x | "
            f"{duck_cpu:>12.2f} | {pandas_cpu:>12.2f} | {pandas_cpu / duck_cpu:>5.1f}x | "
            f"{duck_mb:>9.0f} | {pandas_mb:>9.0f} | {parquet_s:>14.2f}"
        )
        lines.append(line)
        print(line, flush=True)
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
