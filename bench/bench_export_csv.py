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

The export's DuckDB worker is a second process (`lib.wide_scan.EXPORT_WORKERS`: a fresh interpreter
with DuckDB and Arrow only, started before the clock): its CPU counts in the method's, and "PSS sum
MiB" is the peak of the proportional set size summed over the child's whole process tree (the app
and its export worker; before 28 Nov also multiprocessing's resource tracker), sampled from this
process: shared pages count once,
so it is what the export costs the machine. On PostgreSQL the CPU of the
server processes serving the bench database counts too ("PG server s").

`--scenarios` measures the filtered views instead: every filter of the Evaluations page alone (the
values `bench_pages.py` picks), each sort and `EXPORT_PAIRS`, each as the link's export then pandas
of the same rows in one process per size, printed worst (lowest CPU ratio) first.

    nice -n 10 .venv/bin/python bench/bench_export_csv.py --db 1000=sqlite:///bench/out/e_1k.db \\
        --db 100000=sqlite:////work/bench-data/e_100k.db --db 1000000=sqlite:////work/bench-data/e_1M.db
    nice -n 10 .venv/bin/python bench/bench_export_csv.py --sizes 1000       # generates bench/out/export_csv_1000.db
    nice -n 10 .venv/bin/python bench/bench_export_csv.py --db 100000=sqlite:///… --scenarios
    nice -n 10 .venv/bin/python bench/bench_export_csv.py --db 1000000=sqlite:///… --scenarios "all,archived"
    .venv/bin/python bench/bench_export_csv.py --scale-from e_100k.db --factor 10 --out e_1M.db

`--cold` (root, Linux) drops the OS page cache before each method, so each reads the SQLite file
from disk: in a plain run the first method's reads warm the cache for the second, or the first's
memory (pandas' 9 GiB at 1M) empties it for the next run, and a 1M run's link CPU moves by a third
with that alone.

`--scale-from` builds a large SQLite database in minutes from a `bench/gen.py` one: its evaluations
and judgments copied `--factor` times under new ids (the search index and the derived counters are
not extended: good for exports, not for page benches). `bench/gen.py --evaluations 1000000` makes a
real one (about an hour on two cores).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import backend_cpu, cpu_of  # noqa: E402

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


def _pandas(engine, out: Path, filters=None) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd
    from sqlmodel import col

    from lib.inspector import EvaluationFilters, _list_select
    from lib.models import EvaluationSnapshot as S

    stmt = _list_select(filters or EvaluationFilters()).add_columns(
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


def _tree(root: int) -> list[int]:
    """`root` and every live process below it (the fork server of `lib.duck`, its workers, the
    resource tracker), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [root], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def _pss_mib(pids: list[int]) -> float:
    """The proportional set size of these processes together (smaps_rollup): each page shared by n
    processes counts 1/n in each, so the sum counts the libraries they share once and whatever the
    fork server's children still share with it once: what the machine gives the export."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def drop_page_cache() -> None:
    """Write back and drop the OS page cache (`--cold`), so the next method reads the database file
    from disk as the one before it did: in a plain run the first method pays for the reads and the
    second finds them cached (or finds the cache emptied by the first's memory, as pandas' 9 GiB at
    1M does). Linux, as root; PostgreSQL's own shared buffers are not touched."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise SystemExit(f"--cold: cannot drop the page cache ({exc}); it needs root on Linux") from None


def _run_sampled(
    command: list[str], database: str | None = None
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run a child, sampling the summed PSS of its process tree every 0.2 s from here (this process's
    CPU, not the child's); returns the completed run, the peak of that sum and, for a PostgreSQL
    `database`, the CPU its server processes spent meanwhile (found every 2 s, read every 0.25 s: a
    connection that lived under 2 s can be missed, and the last 0.25 s of one that closed)."""
    before = backend_cpu(database) if database else {}
    seen: dict[int, float] = {}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        pids: list[int] = []
        for tick in itertools.count():
            if done.wait(0.25):
                return
            if tick % 8 == 0:  # walking /proc costs more than reading a few files: every 2 s
                pids = _tree(proc.pid)
                if database:
                    seen.update(backend_cpu(database))
            elif seen:  # the backends known so far, every tick: a closing connection's last CPU counts
                seen.update(cpu_of(list(seen)))
            peak = max(peak, _pss_mib(pids))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    if database:
        seen.update(backend_cpu(database))
    server = sum(spent - before.get(pid, 0.0) for pid, spent in seen.items())
    return subprocess.CompletedProcess(command, proc.returncode, out, err), peak, server


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
    from lib.export import evaluations_csv_chunks, export_evaluations_csv
    from lib.inspector import EvaluationFilters
    from lib.wide_scan import start_export_workers

    engine = create_db_engine(url)
    if method != "pandas":
        start_export_workers()  # the app starts its export worker once, not per export
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


# Pairs measured besides every filter alone (bench_pages.py's option labels; a sort as "sort=KEY"):
# the filters a reviewer combines most, and the ones that change the plan (a gap, a text, a review
# state) with a gap sort.
EXPORT_PAIRS = (
    ("product", "language"),
    ("product", "text=common"),
    ("model", "category"),
    ("metric", "evidence=unverified"),
    ("min_gap=2", "review=pending"),
    ("from=last 30 days", "product"),
    ("min_gap=2", "sort=weighted_gap"),
    ("review=reviewed", "sort=weighted_gap"),
    ("text=common", "sort=max_gap"),
    ("archived", "sort=max_gap"),
)


def export_scenarios(url: str, evaluations: int) -> dict[str, Any]:
    """The filtered views a user exports, by name: every filter of the Evaluations page alone (the
    values `bench_pages.py` picks on this database), each sort, and `EXPORT_PAIRS`; "all" first."""
    from bench.bench_pages import evaluation_options, read_context
    from lib.inspector import SORTS, EvaluationFilters

    ctx = read_context(url, evaluations)
    picks: dict[str, dict[str, Any]] = {o.label: {o.name: o.value(ctx)} for o in evaluation_options()}
    picks |= {f"sort={key}": {"sort": key} for key in SORTS if key != "newest"}
    found = {"all": EvaluationFilters()}
    found |= {label: EvaluationFilters(**chosen) for label, chosen in picks.items()}
    found |= {f"{a} + {b}": EvaluationFilters(**picks[a], **picks[b]) for a, b in EXPORT_PAIRS}
    return found


def child_scenarios(url: str, size: int, names: list[str]) -> None:
    """Each scenario's link export, then pandas of the same rows, in this one process: one JSON line each."""
    from lib.db import create_db_engine
    from lib.export import evaluations_csv_chunks
    from lib.wide_scan import start_export_workers

    engine = create_db_engine(url)
    start_export_workers()
    every = export_scenarios(url, size)
    for name in names or list(every):
        filters = every[name]
        result: dict[str, Any] = {"scenario": name}
        for method in ("link", "pandas"):
            before = _descendants()
            wall, cpu = time.perf_counter(), time.process_time()
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "e.csv"
                if method == "pandas":
                    _pandas(engine, out, filters)
                    size_mb = out.stat().st_size / 1e6
                else:
                    chunks = evaluations_csv_chunks(engine=engine, filters=filters, form="wide")
                    size_mb = sum(len(chunk) for chunk in chunks) / 1e6
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            after = _descendants()
            cpu += sum(spent - before.get(pid, (0.0, 0.0))[0] for pid, (spent, _) in after.items())
            result[method] = {"wall": wall, "cpu": cpu, "mb": size_mb}
        print(json.dumps(result), flush=True)


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


def run_scenarios(urls: dict[int, str], names: str) -> int:
    """Every size's scenarios in one child process each, printed worst (lowest CPU ratio) first."""
    rows = []
    for size, url in sorted(urls.items()):
        done = subprocess.run(
            [sys.executable, __file__, "--child-scenarios", url, str(size), names],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                rows.append((size, json.loads(line)))
    print(
        f"{'size':>9} {'scenario':<40} {'CSV MB':>8} {'link CPU s':>10} {'pandas CPU s':>12}"
        f" {'x CPU':>6} {'link wall s':>11} {'pandas wall s':>13} {'x wall':>6}"
    )
    for size, r in sorted(rows, key=lambda item: item[1]["pandas"]["cpu"] / item[1]["link"]["cpu"]):
        link, pandas = r["link"], r["pandas"]
        print(
            f"{size:>9,} {r['scenario']:<40} {link['mb']:>8.2f} {link['cpu']:>10.2f} {pandas['cpu']:>12.2f}"
            f" {pandas['cpu'] / link['cpu']:>6.2f} {link['wall']:>11.2f} {pandas['wall']:>13.2f}"
            f" {pandas['wall'] / link['wall']:>6.2f}"
        )
    return 0


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
    parser.add_argument(
        "--scenarios",
        nargs="?",
        const="*",
        metavar="NAMES",
        help="instead of the methods: the link export of filtered views against pandas of the same rows "
        "(every filter alone, each sort, a few pairs; or the comma-separated names given), worst first",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="drop the OS page cache before each method (root only; SQLite: the file is read from disk "
        "by both sides, not by the first method alone while the second reads what it left cached)",
    )
    parser.add_argument("--scale-from", type=Path, help="build --out from this SQLite database, then stop")
    parser.add_argument("--factor", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "URL"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--child-scenarios", nargs=3, metavar=("URL", "SIZE", "NAMES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if args.child_scenarios:
        url, size, names = args.child_scenarios
        child_scenarios(url, int(size), [n for n in names.split(",") if n])
        return 0
    if args.scale_from:
        scale(args.scale_from, args.out, args.factor)
        return 0
    urls = {int(k): v for k, v in (item.split("=", 1) for item in args.db)}
    if not urls:
        urls = {size: ensure_db(size) for size in map(int, args.sizes.split(","))}
    if args.scenarios is not None:
        return run_scenarios(urls, "" if args.scenarios == "*" else args.scenarios)
    methods = [m for m in args.methods.split(",") if m in METHODS]
    print(
        f"{'size':>9} {'method':<10} {'wall s':>8} {'CPU s':>8} {'of it worker':>12} {'peak MiB':>9} {'+MiB':>6}"
        f" {'worker MiB':>10} {'PSS sum MiB':>11} {'PG server s':>11} {'CSV MB':>8} {'x wall':>7} {'x CPU':>6}"
    )
    for size, url in sorted(urls.items()):
        results = {}
        for method in methods:
            database = url.rsplit("/", 1)[1].split("?")[0] if url.startswith("postgresql") else None
            if args.cold:
                drop_page_cache()
            done, pss, server = _run_sampled([sys.executable, __file__, "--child", method, url], database)
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            # PostgreSQL's server CPU for this database counts on both sides (pandas' plain read, the
            # scanner's query); shown apart too.
            results[method] = result | {"pss": pss, "server": server, "cpu": result["cpu"] + server}
        base = results.get("pandas")
        for method, r in results.items():
            ratio = f"{base['wall'] / r['wall']:>7.2f} {base['cpu'] / r['cpu']:>6.2f}" if base else ""
            print(
                f"{size:>9,} {method:<10} {r['wall']:>8.2f} {r['cpu']:>8.2f} {r['worker_cpu']:>12.2f}"
                f" {r['peak']:>9.0f} {r['above']:>6.0f} {r['worker_peak']:>10.0f} {r['pss']:>11.0f}"
                f" {r['server']:>11.2f} {r['mb']:>8.1f} {ratio}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
