"""Every page at 1k, 100k and 1M evaluations: does a render stay flat as the data grows?

    .venv/bin/python bench/bench_pages.py --sizes 1k,100k            # SQLite, DBs cached in bench/out
    .venv/bin/python bench/bench_pages.py --sizes 1k,100k,1m --db-dir /work/bench-data
    .venv/bin/python bench/bench_pages.py --sizes 1k --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres --pg-sizes 1k,100k
    .venv/bin/python bench/bench_pages.py --sizes 1k,100k --pages overview,analytics --repeat 5

A size is a number of evaluations (`1k`, `100k`, `1m` or a plain integer); each database holds
10 judgments per evaluation (8 metrics of the evaluation + 2 code-review judgments), built by
`bench/gen.py` the first time and reused afterwards: the file (or PostgreSQL database) name carries
the size, the Alembic head and `gen.GEN_VERSION`, so a new migration or generator builds afresh.
A database is built under a temporary name and renamed when complete, so an interrupted build is
never mistaken for a finished one.

Each database is measured in a fresh worker process (this script with `--worker`), so one size's
caches and memory never leak into another's. In the worker, every scenario is one page file under
`streamlit.testing.v1.AppTest` (widgets preset through the URL's query parameters or session
state, a reviewer named in the sidebar). Timed: `AppTest.run()` only, i.e. the script run, with

- the installed-components scan (about 0.25 s per new AppTest, the same at any size) done once
  and shared before timing, exactly as `tests/pages/conftest.py` does; the script also prints how
  long an empty page takes, the floor every figure includes;
- `st.cache_data` cleared before every timed run (a first render after the cache expired, the
  reviewer's worst case), `st.cache_resource` (engine, DuckDB connection) kept, as in a server
  that has been up for a while; `--warm-data-cache` keeps it too;
- one untimed warm-up run per scenario, then the median of `--repeat` (3) runs.

Analytics also reports the server's memory: the peak proportional set size (PSS, so pages that
forked children share are counted once) of the worker process plus its children (DuckDB runs
SQLite scans in a forked worker), sampled every 50 ms during its renders, and the same after them.

Prints seconds per scenario and size and the ratio to the smallest size (goal: every page ≤ 1.5),
then the same for the worker's CPU seconds, which other jobs on a shared machine disturb far less
(but which leave out work done in DuckDB's forked worker and in the PostgreSQL server).
A page that raises prints its error instead of a time. Wall clock on a shared machine: run with
`nice` and expect noise from other jobs; `--repeat 5` narrows it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "bench" / "out"
JUDGMENTS_PER_EVALUATION = 10
PAGE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Scenario:
    """One page render: the page file, its query parameters and preset session state."""

    name: str
    page: str
    query: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    rss: bool = False


def scenarios(evaluations: int) -> list[Scenario]:
    """The renders of issue 19's table, then every other page; ids and values exist at any size."""
    middle = f"snap_{evaluations // 2:07d}"  # gen.py's ids: snap_0000000, snap_0000001, ...
    return [
        Scenario("overview", "pages/overview.py"),
        Scenario("corrections", "pages/corrections.py"),
        Scenario("corrections reviewer", "pages/corrections.py", query={"reviewer": "ayse"}),
        Scenario("analytics", "pages/analytics.py", rss=True),
        Scenario("evaluations", "pages/evaluations.py"),
        Scenario("evaluations review=pending", "pages/evaluations.py", query={"review": "pending"}),
        Scenario("evaluations review=corrected", "pages/evaluations.py", query={"review": "corrected"}),
        Scenario("evaluations metric", "pages/evaluations.py", query={"metric": "clarity"}),
        Scenario("evaluations text", "pages/evaluations.py", query={"q": "reset my password"}),
        Scenario("evaluation detail", "pages/evaluations.py", query={"snapshot": middle}),
        Scenario("review queue", "pages/review.py"),
        Scenario("notes", "pages/notes.py"),
        Scenario("tag scores", "pages/tag_scores.py"),
        Scenario("precedents", "pages/precedents.py"),
        Scenario("alignment lab", "pages/alignment.py"),
        Scenario("coach", "pages/coach.py", query={"snapshot": middle}),
        Scenario("new evaluation", "pages/new_evaluation.py"),
        Scenario("import", "pages/import_data.py"),
        Scenario("admin", "pages/admin.py"),
    ]


# ---------------------------------------------------------------------------------------------
# Sizes and databases


def parse_size(text: str) -> int:
    """`1k` → 1000, `100k` → 100000, `1m` → 1000000, `2500` → 2500."""
    text = text.strip().lower().replace("_", "").replace(",", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    value = float(number) * scale
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use 1k, 100k, 1m or an integer)")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes, smallest first (the ratio's denominator)."""
    return sorted({parse_size(part) for part in text.split(",") if part.strip()})


def label(size: int) -> str:
    """1000 → 1k, 1000000 → 1M."""
    if size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    if size % 1_000 == 0:
        return f"{size // 1_000}k"
    return str(size)


def schema_tag() -> str:
    """Alembic head + generator version: a database built for another schema or generator is not reused."""
    from alembic.script import ScriptDirectory

    from bench import gen
    from lib.db import alembic_config

    heads = sorted(ScriptDirectory.from_config(alembic_config()).get_heads())
    return f"{'-'.join(h[:8] for h in heads)}_g{gen.GEN_VERSION}"


def sqlite_database(db_dir: Path, evaluations: int, *, build: bool) -> str:
    """URL of the SQLite benchmark database of this size, built with gen.py when missing."""
    from bench import gen

    path = db_dir / f"pages_{label(evaluations)}_{schema_tag()}.db"
    if not path.exists():
        if not build:
            raise SystemExit(f"{path} does not exist (drop --no-build to build it)")
        db_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        print(f"building {path} ({evaluations:,} evaluations) …", flush=True)
        if gen.main(["--evaluations", str(evaluations), "--db", str(partial), "--force"]) != 0:
            raise SystemExit(f"gen.py failed for {partial}")
        for suffix in ("-wal", "-shm"):
            Path(f"{partial}{suffix}").unlink(missing_ok=True)
        partial.rename(path)
    return f"sqlite:///{path}"


def pg_database(admin_url: str, evaluations: int, *, build: bool) -> str:
    """URL of the PostgreSQL benchmark database of this size, built with gen.py when missing."""
    from sqlalchemy import create_engine, text

    from bench import gen
    from lib.db import normalize_url

    name = f"overrule_pages_{label(evaluations).lower()}_{schema_tag().replace('-', '_')}"
    base = admin_url.rpartition("/")[0]
    admin = create_engine(normalize_url(admin_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
            if exists is None:
                if not build:
                    raise SystemExit(f"PostgreSQL database {name} does not exist (drop --no-build)")
                partial = f"{name}_partial"
                conn.execute(text(f'DROP DATABASE IF EXISTS "{partial}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{partial}"'))
                print(f"building PostgreSQL {name} ({evaluations:,} evaluations) …", flush=True)
                if gen.main(["--evaluations", str(evaluations), "--url", f"{base}/{partial}"]) != 0:
                    raise SystemExit(f"gen.py failed for {partial}")
                conn.execute(text(f'ALTER DATABASE "{partial}" RENAME TO "{name}"'))
    finally:
        admin.dispose()
    return f"{base}/{name}"


# ---------------------------------------------------------------------------------------------
# The worker: one database, every scenario


def share_component_scan() -> None:
    """Scan installed packages for Streamlit components once per process, not once per AppTest.

    Each new AppTest scans every installed package's metadata (about 0.25 s, the same at any data
    size); timed into a 1k render that constant would flatter every ratio. The installed packages
    cannot change during a benchmark, so the first scan serves all (as in tests/pages/conftest.py).
    """
    from functools import cache

    from streamlit.components.v2 import manifest_scanner

    if not hasattr(manifest_scanner.scan_component_manifests, "cache_info"):
        manifest_scanner.scan_component_manifests = cache(manifest_scanner.scan_component_manifests)


def _tree_pss_bytes(pid: int) -> int:
    """Proportional set size of a process plus all its descendants, from /proc (Linux).

    PSS rather than RSS: forked workers share their parent's pages copy-on-write, and summing
    their RSS would count those pages once per process.
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/smaps_rollup", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(children.get(current, []))
    return total


class PeakRss:
    """Samples the memory (PSS) of this process tree in a thread; `peak` is the largest seen."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_pss_bytes(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_pss_bytes(os.getpid()))


def worker(url: str, evaluations: int, names: set[str] | None, repeat: int, warm_data_cache: bool) -> None:
    """Render every scenario against `url`; one JSON line per scenario on stdout."""
    os.environ["OVERRULE_DATABASE_URL"] = url
    os.environ["OVERRULE_LOAD_DEMO"] = "false"
    import logging

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from lib.config import reset_settings

    logging.getLogger("streamlit").setLevel(logging.ERROR)
    reset_settings()
    share_component_scan()

    def render(scenario: Scenario | None) -> tuple[float, float, str | None]:
        if scenario is None:
            at = AppTest.from_string("import streamlit as st\nst.write('empty')", default_timeout=60)
        else:
            at = AppTest.from_file(str(ROOT / scenario.page), default_timeout=PAGE_TIMEOUT_S)
            at.session_state["sidebar_reviewer"] = "bench"
            for key, value in scenario.query.items():
                at.query_params[key] = value
            for key, value in scenario.state.items():
                at.session_state[key] = value
        if not warm_data_cache:
            st.cache_data.clear()
        started, cpu_started = time.perf_counter(), time.process_time()
        at.run()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        error = at.exception[0].message.splitlines()[0][:200] if at.exception else None
        return elapsed, cpu, error

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    render(None)  # warm-up: component registry, AppTest machinery, imports
    floors = [render(None) for _ in range(repeat)]
    emit(
        {
            "scenario": "(empty page)",
            "seconds": statistics.median(f[0] for f in floors),
            "cpu_seconds": statistics.median(f[1] for f in floors),
        }
    )
    for scenario in scenarios(evaluations):
        if names is not None and scenario.name not in names:
            continue
        try:
            sampler = PeakRss() if scenario.rss else None
            if sampler:
                sampler.__enter__()
            try:
                _, _, error = render(scenario)  # warm-up (connections, OS page cache, imports)
                times, cpus = [], []
                for _ in range(repeat if error is None else 0):
                    elapsed, cpu, error = render(scenario)
                    times.append(elapsed)
                    cpus.append(cpu)
                    if error:
                        break
            finally:
                if sampler:
                    sampler.__exit__()
        except Exception as exc:  # a page that cannot even start: report it, measure the others
            error, times, cpus = f"{type(exc).__name__}: {exc}"[:200], [], []
        record: dict[str, Any] = {"scenario": scenario.name, "times": times, "error": error}
        record["seconds"] = statistics.median(times) if times and error is None else None
        record["cpu_seconds"] = statistics.median(cpus) if cpus and error is None else None
        if sampler:
            record["peak_rss_mib"] = round(sampler.peak / 2**20)
            record["rss_after_mib"] = round(_tree_pss_bytes(os.getpid()) / 2**20)
            record["self_max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        emit(record)


def run_worker(url: str, evaluations: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """This script as a fresh `--worker` process on `url`; its records by scenario name."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        url,
        "--evaluations",
        str(evaluations),
    ]
    command += ["--repeat", str(args.repeat)]
    if args.pages:
        command += ["--pages", args.pages]
    if args.warm_data_cache:
        command.append("--warm-data-cache")
    results: dict[str, dict[str, Any]] = {}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            record = json.loads(line)
            results[record["scenario"]] = record
            shown = "error: " + record["error"] if record.get("error") else f"{record['seconds']:.3f} s"
            print(f"    {record['scenario']:32} {shown}", flush=True)
    if proc.returncode:
        print(f"    worker exited with {proc.returncode}", flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# Report


def print_table(title: str, measured: dict[int, dict[str, dict[str, Any]]], key: str = "seconds") -> None:
    """Seconds (`key`) per scenario and size, and each size's ratio to the smallest."""
    sizes = sorted(measured)
    base = sizes[0]
    names: list[str] = []
    for results in measured.values():
        names += [n for n in results if n not in names]
    head = f"| {'page':32} |" + "".join(f" {label(s):>8} |" for s in sizes)
    head += "".join(f" {label(s)}/{label(base)}".rjust(10) + " |" for s in sizes[1:])
    print(
        f"\n{title}\n\n{head}\n|{'-' * 34}|" + "---------:|" * len(sizes) + "---------:|" * (len(sizes) - 1)
    )
    over: list[str] = []
    for name in names:
        cells, seconds = [], {}
        for size in sizes:
            record = measured[size].get(name)
            if record is None:
                cells.append(f" {'—':>8} |")
            elif record.get(key) is None:
                cells.append(f" {'error':>8} |")
            else:
                seconds[size] = record[key]
                cells.append(f" {record[key]:>8.3f} |")
        for size in sizes[1:]:
            if size in seconds and base in seconds and seconds[base] > 0:
                ratio = seconds[size] / seconds[base]
                cells.append(f" {ratio:>8.2f}x |")
                if ratio > 1.5 and not name.startswith("("):
                    over.append(f"{name} at {label(size)} ({ratio:.1f}x)")
            else:
                cells.append(f" {'—':>9} |")
        print(f"| {name:32} |" + "".join(cells))
    print(f"over the 1.5 goal ({key}): " + (", ".join(over) if over else "none"))
    if key != "seconds":
        return
    for size in sizes:
        for name, record in measured[size].items():
            if "peak_rss_mib" in record:
                print(
                    f"{name} at {label(size)}: server memory peak {record['peak_rss_mib']:,} MiB PSS "
                    "(process + children), "
                    f"{record['rss_after_mib']:,} MiB after; the worker's own peak RSS so far "
                    f"{record['self_max_rss_mib']:,} MiB"
                )
            if record.get("error"):
                print(f"{name} at {label(size)}: {record['error']}")


def main(argv: list[str] | None = None) -> int:
    """Build missing databases, measure each in a worker process, print the tables."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=parse_sizes, default=parse_sizes("1k,100k"), help="SQLite sizes, e.g. 1k,100k,1m"
    )
    parser.add_argument(
        "--db-dir", type=Path, default=OUT, help="where SQLite databases are built and reused"
    )
    parser.add_argument(
        "--db",
        action="append",
        default=[],
        metavar="SIZE=FILE",
        help="use this SQLite file for a size (e.g. 1m=/work/bench-data/x.db) instead of the cached one; "
        "an older schema is migrated to head when the worker opens it (in the untimed warm-up)",
    )
    parser.add_argument(
        "--pg", metavar="ADMIN_URL", help="also measure PostgreSQL (databases built on this server)"
    )
    parser.add_argument("--pg-sizes", type=parse_sizes, default=parse_sizes("1k,100k"))
    parser.add_argument("--pages", help="comma-separated scenario names (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per scenario (median)")
    parser.add_argument("--warm-data-cache", action="store_true", help="keep st.cache_data between runs")
    parser.add_argument("--no-build", action="store_true", help="fail instead of building a missing database")
    parser.add_argument("--list", action="store_true", help="print the scenario names and exit")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--evaluations", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = {n.strip() for n in args.pages.split(",")} if args.pages else None
    if args.list:
        print("\n".join(s.name for s in scenarios(1000)))
        return 0
    if args.worker:
        worker(args.worker, args.evaluations, names, args.repeat, args.warm_data_cache)
        return 0
    if names is not None and (unknown := names - {s.name for s in scenarios(1000)}):
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))} (see --list)")

    given: dict[int, str] = {}
    for item in args.db:
        size, _, path = item.partition("=")
        if not path or not Path(path).is_file():
            parser.error(f"--db {item}: expected SIZE=FILE with an existing file")
        given[parse_size(size)] = f"sqlite:///{Path(path).resolve()}"

    def sqlite_url(size: int) -> str:
        return given.get(size) or sqlite_database(args.db_dir, size, build=not args.no_build)

    backends: list[tuple[str, list[int], Callable[[int], str]]] = [("SQLite", args.sizes, sqlite_url)]
    if args.pg:
        backends.append(
            ("PostgreSQL", args.pg_sizes, lambda n: pg_database(args.pg, n, build=not args.no_build))
        )
    tables: list[tuple[str, dict[int, dict[str, dict[str, Any]]]]] = []
    for backend, sizes, database in backends:
        measured: dict[int, dict[str, dict[str, Any]]] = {}
        for size in sizes:
            url = database(size)
            print(f"[{backend} {label(size)}] {url}", flush=True)
            measured[size] = run_worker(url, size, args)
        tables.append((backend, measured))
    for backend, measured in tables:
        print_table(
            f"{backend}: seconds per render (AppTest.run, median of {args.repeat}, "
            f"st.cache_data {'warm' if args.warm_data_cache else 'cleared'}) and ratio to the smallest size",
            measured,
        )
        print_table(
            f"{backend}: CPU seconds of the worker process per render (less sensitive to other jobs; "
            "work in DuckDB's forked worker or the PostgreSQL server is not counted)",
            measured,
            key="cpu_seconds",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
