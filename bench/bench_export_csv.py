"""The Evaluations CSV of every match against pandas `read_sql` + `to_csv` of the same rows (issue 27).

For each database size the methods run side by side in this one bench run, each in a fresh child
process (so peaks do not mix: a child reports its own `VmHWM`), and the bench prints wall seconds,
CPU seconds, peak resident memory (whole process, and above the process after its imports) and the
CSV's size, then each method's speed as a ratio to the pandas baseline of the same size:

- `pandas`: `pd.read_sql` of the export's rows (the list's columns, question, review counters,
  answer and both score objects, in list order, through SQLAlchemy) then `DataFrame.to_csv` to a
  file: what a user would write by hand without the app;
- `link wide` / `link long`: `lib.export.evaluations_csv_chunks`, what "Download CSV (all matches)"
  streams through its link (`lib.downloads`) and the API's `/exports/evaluations?form=` sends;
- `file wide`: `lib.export.export_evaluations_csv`, what `python -m lib export evaluations --form
  wide` writes.

    nice -n 19 .venv/bin/python bench/bench_export_csv.py --db 1000=sqlite:///bench/out/e_1k.db \\
        --db 100000=sqlite:////work/bench-data/e_100k.db --db 1000000=sqlite:////work/bench-data/e_1M.db
    nice -n 19 .venv/bin/python bench/bench_export_csv.py --sizes 1000       # generates bench/out/export_csv_1000.db
    .venv/bin/python bench/bench_export_csv.py --scale-from e_100k.db --factor 10 --out e_1M.db

`--scale-from` builds a large SQLite database in minutes from a `bench/gen.py` one: its evaluations
and judgments copied `--factor` times under new ids (the search index and the derived counters are
not extended: good for exports, not for page benches). `bench/gen.py --evaluations 1000000` makes a
real one (about an hour on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out"
METHODS = ("pandas", "link wide", "file wide", "link long")


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    """This process's own peak RSS (VmHWM); `ru_maxrss` would carry the parent's across exec."""
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _pandas(engine, out: Path) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd
    from sqlmodel import col

    from lib.inspector import EvaluationFilters, _list_select
    from lib.models import EvaluationSnapshot as S

    stmt = _list_select(EvaluationFilters()).add_columns(
        col(S.judgments_total).label("judged"),
        col(S.judgments_reviewed).label("reviewed"),
        col(S.judgments_corrected).label("corrected"),
        col(S.model_answer).label("answer"),
        col(S.user_scores_json).label("user_scores"),
        col(S.judge_scores_json).label("judge_scores"),
    )
    with engine.connect() as conn:
        frame = pd.read_sql(stmt, conn)
    frame.to_csv(out, index=False)


def _descendants() -> dict[int, tuple[float, float]]:
    """{pid: (CPU seconds so far, peak RSS MiB)} of every live process below this one (the fork
    server of `lib.duck` and its workers), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                frontier.append(pid)
                try:
                    with open(f"/proc/{pid}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                    with open(f"/proc/{pid}/status") as fh:
                        hwm = next(line for line in fh if line.startswith("VmHWM:"))
                except (OSError, StopIteration):
                    continue
                ticks = os.sysconf("SC_CLK_TCK")
                found[pid] = ((int(fields[11]) + int(fields[12])) / ticks, int(hwm.split()[1]) / 1024)
    return found


def child(method: str, url: str) -> None:
    from lib.db import create_db_engine
    from lib.duck import start_isolated_workers
    from lib.export import evaluations_csv_chunks, export_evaluations_csv
    from lib.inspector import EvaluationFilters

    engine = create_db_engine(url)
    if method != "pandas":
        start_isolated_workers()  # the app starts its fork server once, not per export
    base = _rss_mib()
    before = _descendants()
    wall, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "e.csv"
        if method == "pandas":
            _pandas(engine, out)
            size = out.stat().st_size
        elif method.startswith("link"):
            chunks = evaluations_csv_chunks(
                engine=engine, filters=EvaluationFilters(), form=method.split()[1]
            )
            size = sum(len(chunk) for chunk in chunks)
        else:
            export_evaluations_csv(engine=engine, out=out, form=method.split()[1])
            size = out.stat().st_size
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # The export's DuckDB worker (lib.duck.submit_isolated) works in another process: its CPU during
    # the export counts, and its own peak is reported beside this process's.
    after = _descendants()
    worker_cpu = sum(spent - before.get(pid, (0.0, 0.0))[0] for pid, (spent, _) in after.items())
    result = {
        "wall": wall,
        "cpu": cpu + worker_cpu,
        "worker_cpu": worker_cpu,
        "worker_peak": max((peak for _, peak in after.values()), default=0.0),
        "peak": _peak_mib(),
        "above": _peak_mib() - base,
        "mb": size / 1e6,
    }
    print(json.dumps(result))


def scale(source: Path, out: Path, factor: int) -> None:
    """Copy `source` to `out` with its evaluations and judgments repeated `factor` times (new ids)."""
    partial = out.with_name(out.name + ".partial")
    shutil.copyfile(source, partial)
    con = sqlite3.connect(partial, isolation_level=None)
    for pragma in ("journal_mode = OFF", "synchronous = OFF", "cache_size = -524288", "foreign_keys = OFF"):
        con.execute(f"PRAGMA {pragma}")
    tables = ("evaluation_snapshots", "judgments")
    marks = ", ".join("?" * len(tables))
    derived = con.execute(
        f"SELECT type, name, sql FROM sqlite_master WHERE tbl_name IN ({marks}) "
        "AND type IN ('index', 'trigger') AND sql IS NOT NULL",
        tables,
    ).fetchall()
    renamed = {
        "evaluation_snapshots": {"id": "id || '-{k}'", "source_key": "source_key || '-{k}'"},
        "judgments": {"snapshot_id": "snapshot_id || '-{k}'", "change_id": "change_id || '-{k}'"},
    }
    con.execute("BEGIN")
    for kind, name, _ in derived:  # rebuilt once at the end; the search index is not extended
        con.execute(f'DROP {kind.upper()} "{name}"')
    for table in tables:
        names = [
            r[1] for r in con.execute(f"PRAGMA table_info({table})") if r[1] != "id" or table != "judgments"
        ]
        last = con.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
        for k in range(1, factor):
            exprs = [renamed[table].get(n, f'"{n}"').replace("{k}", str(k)) for n in names]
            con.execute(
                f"INSERT INTO {table} ({', '.join(chr(34) + n + chr(34) for n in names)}) "
                f"SELECT {', '.join(exprs)} FROM {table} WHERE rowid <= {last}"
            )
    for _, _, sql in derived:
        con.execute(sql)
    con.execute("COMMIT")
    con.execute("ANALYZE")
    con.close()
    partial.rename(out)


def ensure_db(size: int) -> str:
    path = OUT / f"export_csv_{size}.db"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / "gen.py"), "--evaluations", str(size), "--db", str(path)],
            check=True,
        )
    return f"sqlite:///{path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="1000", help="sizes to generate under bench/out when no --db names them"
    )
    parser.add_argument(
        "--db", action="append", default=[], metavar="SIZE=URL", help="a database of SIZE evaluations"
    )
    parser.add_argument(
        "--methods", default="pandas,link wide,file wide", help=f"comma-separated of {METHODS}"
    )
    parser.add_argument("--scale-from", type=Path, help="build --out from this SQLite database, then stop")
    parser.add_argument("--factor", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if args.scale_from:
        scale(args.scale_from, args.out, args.factor)
        return 0
    urls = {int(k): v for k, v in (item.split("=", 1) for item in args.db)}
    if not urls:
        urls = {size: ensure_db(size) for size in map(int, args.sizes.split(","))}
    methods = [m for m in args.methods.split(",") if m in METHODS]
    print(
        f"{'size':>9} {'method':<10} {'wall s':>8} {'CPU s':>8} {'of it worker':>12} {'peak MiB':>9} {'+MiB':>6}"
        f" {'worker MiB':>10} {'CSV MB':>8} {'x wall':>7} {'x CPU':>6}"
    )
    for size, url in sorted(urls.items()):
        results = {}
        for method in methods:
            done = subprocess.run(
                [sys.executable, __file__, "--child", method, url],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                continue
            results[method] = json.loads(done.stdout.strip().splitlines()[-1])
        base = results.get("pandas")
        for method, r in results.items():
            ratio = f"{base['wall'] / r['wall']:>7.2f} {base['cpu'] / r['cpu']:>6.2f}" if base else ""
            print(
                f"{size:>9,} {method:<10} {r['wall']:>8.2f} {r['cpu']:>8.2f} {r['worker_cpu']:>12.2f}"
                f" {r['peak']:>9.0f} {r['above']:>6.0f} {r['worker_peak']:>10.0f} {r['mb']:>8.1f} {ratio}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
