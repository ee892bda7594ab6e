"""Export benchmark: DuckDB `COPY` (lib.export) vs `pandas.read_sql(...).to_csv()`, judgments table.

    python bench/bench_export.py [--sizes 1000 100000 1000000] [--repeat 3]

Each measurement runs in a fresh process, so the peak memory printed is that method's alone.
Databases are generated once by bench/gen.py into bench/out/ and reused (same seed, same data).
The DuckDB side does strictly more work than the baseline: it neutralises formula cells and
writes ISO 8601 UTC timestamps; pandas writes the raw values. Goal (issue): DuckDB >= 5x at 1M.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from bench.gen import generate  # noqa: E402
from lib.db import create_db_engine, init_db  # noqa: E402
from lib.models import Judgment  # noqa: E402

OUT = ROOT / "bench" / "out"


def bench_db(rows: int) -> Path:
    """The benchmark database with `rows` judgments, generated on first use."""
    path = OUT / f"bench_{rows}.db"
    if path.exists():
        engine = create_db_engine(f"sqlite:///{path}")
        with engine.connect() as conn:
            have = conn.execute(select(func.count()).select_from(Judgment)).scalar_one()
        engine.dispose()
        if have == rows:
            return path
        for suffix in ("", "-wal", "-shm"):  # a run interrupted while generating
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    engine = init_db(f"sqlite:///{path}")
    generate(engine, judgments=rows)
    engine.dispose()
    print(f"  generated {path.name} in {time.perf_counter() - started:.0f} s", flush=True)
    return path


def _run(method: str, db: str, out: str) -> tuple[float, float]:
    """One export in this (fresh) process: seconds, peak RSS in MB."""
    import pandas as pd  # imports stay outside the timed part

    from lib.export import export_table

    engine = create_db_engine(f"sqlite:///{db}")
    started = time.perf_counter()
    if method == "duckdb_csv":
        export_table(engine=engine, table="judgments", fmt="csv", out=Path(out))
    elif method == "duckdb_parquet":
        export_table(engine=engine, table="judgments", fmt="parquet", out=Path(out))
    else:
        pd.read_sql("SELECT * FROM judgments", engine).to_csv(out, index=False)
    seconds = time.perf_counter() - started
    engine.dispose()
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(method: str, db: Path, repeat: int) -> tuple[float, float]:
    """Best time and its peak memory over `repeat` fresh-process runs."""
    ctx = multiprocessing.get_context("spawn")
    results = []
    suffix = "parquet" if method.endswith("parquet") else "csv"
    for _ in range(repeat):
        with ctx.Pool(1) as pool:
            results.append(pool.apply(_run, (method, str(db), str(OUT / f"export_{method}.{suffix}"))))
    return min(results)


def main(argv: list[str] | None = None) -> int:
    """Print seconds, peak memory and the DuckDB/pandas ratio per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3, help="runs per method (1 above 100k rows)")
    args = parser.parse_args(argv)
    header = (
        f"{'rows':>10} | {'duckdb csv s':>12} | {'pandas csv s':>12} | {'ratio':>6} | "
        f"{'duckdb MB':>9} | {'pandas MB':>9} | {'parquet s':>9}"
    )
    lines = [header, "-" * len(header)]
    for rows in args.sizes:
        db = bench_db(rows)
        repeat = args.repeat if rows <= 100_000 else 1
        duck_s, duck_mb = measure("duckdb_csv", db, repeat)
        pandas_s, pandas_mb = measure("pandas_csv", db, repeat)
        parquet_s, _ = measure("duckdb_parquet", db, repeat)
        line = (
            f"{rows:>10,} | {duck_s:>12.2f} | {pandas_s:>12.2f} | {pandas_s / duck_s:>5.1f}x | "
            f"{duck_mb:>9.0f} | {pandas_mb:>9.0f} | {parquet_s:>9.2f}"
        )
        lines.append(line)
        print(line, flush=True)
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
