"""Which PostgreSQL test variants repeat what other PostgreSQL tests already prove? (docs/development.md)

The suite runs its database tests on SQLite and on PostgreSQL. A PostgreSQL variant earns its CPU
when it sends PostgreSQL a statement shape, or runs a lib line only because it is on PostgreSQL (a
line its own SQLite variant does not run: a dialect branch), that no other kept PostgreSQL test of
its file does; or when its point is dialect behaviour. The others carry `@pytest.mark.pg_repeats`
(conftest: their PostgreSQL variant is not collected). This tool measures it:

    python scripts/pg_cover.py check tests/test_x.py [...]           # verify the marks (exit 1 if not)
    python scripts/pg_cover.py run tests/test_x.py [...] --out DIR   # record both variants
    python scripts/pg_cover.py plan DIR [--cpu CPU_LOG_DIR]          # propose: keep / may drop

`run` executes both variants of the files' database tests, the `pg_repeats` ones too, under
`tests/pg_cover.py` (statement shapes sent to PostgreSQL, DuckDB statements over the scanner, lib
lines run). `plan` keeps, per file: every test whose name says it is about dialect behaviour
(`DIALECT_WORDS`), every test whose PostgreSQL work happens in a child process (what a child sends
is not recorded), then greedily the tests that cover most of what is left per CPU second, until the
kept tests send every statement shape and run every PostgreSQL-only line that any PostgreSQL
variant of the file does. `check` fails when a `pg_repeats` test has a shape or PostgreSQL-only
line that no unmarked PostgreSQL test of its file sends or runs, or is one `plan` must keep.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A test named with one of these is about what the dialects do differently: always kept on PostgreSQL.
DIALECT_WORDS = re.compile(
    r"concurren|parallel|race|lock|isolat|transaction|rollback|migrat|alembic|sequence|identity|upsert|"
    r"conflict|json|collat|case_?insensitive|unicode|turkish|accent|ilike|null|float|decimal|rounding|"
    r"timestamp|time_?zone|timezone|aware|utc|large|huge|long_text|duckdb|scanner|advisory|"
    r"two_sessions|two_writers|simultaneous|at_once|same_time|tie|"
    r"sort|order|newest|oldest|missing|case|like|wildcard|escape|literal|metachar|search|index|round|"
    r"precision|long|utf|surrogate|time|date|day|week|month|now|writer",
    re.IGNORECASE,
)


def run(files: list[str], out: str, workers: int, backends: str = "postgresql,sqlite") -> int:
    """Run both variants of `files` under the recording plugin; JSON lines land in `out`."""
    Path(out).mkdir(parents=True, exist_ok=True)
    for old in glob.glob(f"{out}/*.jsonl"):
        os.remove(old)
    env = {**os.environ, "OVERRULE_PG_COVER": out, "OVERRULE_PG_COVER_BACKENDS": backends}
    command = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-p", "tests.pg_cover", "-q",
               "-p", "no:cacheprovider", "-n", str(workers), *files]  # fmt: skip
    if workers == 0:
        command[command.index("-n", 4) : command.index("-n", 4) + 2] = []
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def load(*outs: str) -> tuple[dict[str, dict], set[str]]:
    """The PostgreSQL rows of the records in `outs`, each with `need` and `credit` (see `plan_file`)."""
    rows: dict[str, dict] = {}
    child_fixtures: set[str] = set()
    for path in (p for out in outs for p in glob.glob(f"{out}/*.jsonl")):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if "child_fixtures" in row:
                child_fixtures.update(row["child_fixtures"])
            else:
                rows[row["id"]] = row
    tests = {nodeid: row for nodeid, row in rows.items() if row.get("backend", "postgresql") == "postgresql"}
    for nodeid, row in tests.items():
        statements = {f"SQL {s}" for s in row["sql"]} | {f"DUCK {s}" for s in row["duck"]}
        lines = {f"LINE {s}" for s in row["lines"]}
        sqlite = rows.get(sqlite_id(nodeid))
        on_sqlite = {f"LINE {s}" for s in sqlite["lines"]} if sqlite else set()
        row["credit"] = statements | lines
        row["need"] = statements | (lines - on_sqlite)
    return tests, child_fixtures


def sqlite_id(nodeid: str) -> str:
    """The node id of the SQLite variant of a PostgreSQL variant."""
    head, _, params = nodeid.partition("[")
    return head + "[" + re.sub(r"(?<![^-])postgresql(?=[-\]])", "sqlite", params)


def test_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[1].split("[", 1)[0]


def must_keep(row: dict, child_fixtures: set[str]) -> str | None:
    """Why this PostgreSQL variant is kept whatever it covers, or None."""
    name = test_name(row["id"])
    word = DIALECT_WORDS.search(name)
    if word:
        return f"dialect behaviour ({word.group(0)!r} in its name)"
    if row["child"]:
        return "its PostgreSQL work runs in a child process it starts"
    started = child_fixtures.intersection(row["fixtures"])
    if started:
        return f"its fixture {sorted(started)[0]} runs a child process"
    return None


def cpu_costs(cpu_dir: str | None) -> dict[str, float]:
    costs: dict[str, float] = {}
    if cpu_dir:
        for path in glob.glob(f"{cpu_dir}/*.jsonl"):
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                costs[row["id"]] = row["self"] + row["child"]
    return costs


def plan_file(rows: list[dict], child_fixtures: set[str], costs: dict[str, float]) -> dict[str, str]:
    """nodeid -> why kept ('' = may drop), by a greedy weighted set cover seeded with must-keeps."""
    reasons: dict[str, str] = {}
    covered: set[str] = set()
    for row in rows:
        why = must_keep(row, child_fixtures)
        if why:
            reasons[row["id"]] = why
            covered |= row["credit"]
    left = [row for row in rows if row["id"] not in reasons]
    needed = set().union(*(row["need"] for row in rows))
    while True:
        best, best_gain, best_ratio = None, set(), 0.0
        for row in left:
            gain = (row["credit"] & needed) - covered
            ratio = len(gain) / max(costs.get(row["id"], 0.2), 0.05)
            if gain and ratio > best_ratio:
                best, best_gain, best_ratio = row, gain, ratio
        if best is None:
            break
        reasons[best["id"]] = f"adds {len(best_gain)} shapes/lines no kept test has"
        covered |= best_gain
        left.remove(best)
    # Then the costliest greedy picks that the other kept tests make redundant after all.
    picked = sorted((r for r in rows if r["id"] in reasons and r not in left and not must_keep(r, child_fixtures)),
                    key=lambda r: -costs.get(r["id"], 0.2))  # fmt: skip
    for row in picked:
        others = set().union(
            *(r["credit"] for r in rows if r["id"] in reasons and r is not row and r not in left)
        )
        if needed <= others:
            del reasons[row["id"]]
            left.append(row)
    for row in left:
        reasons[row["id"]] = ""
    return reasons


def covering(row: dict, kept: list[dict]) -> list[str]:
    """A few kept tests that together cover what `row` covers (greedy): names for a mark's reason."""
    need, names = set(row["need"]), []
    while need:
        best = max(kept, key=lambda k: len(k["credit"] & need))
        if not best["credit"] & need:
            return [*names, f"{len(need)} uncovered"]
        names.append(best["id"].split("::", 1)[1])
        need -= best["credit"]
    return names


def by_file(tests: dict[str, dict], together: bool = False) -> dict[str, list[dict]]:
    """The tests per file, or all in one group (`--together`: tests of one file may cover another's)."""
    files: dict[str, list[dict]] = defaultdict(list)
    for nodeid in sorted(tests):
        files["the files together" if together else nodeid.split("::", 1)[0]].append(tests[nodeid])
    return files


def plan(outs: list[str], cpu_dir: str | None, together: bool = False) -> int:
    tests, child_fixtures = load(*outs)
    costs = cpu_costs(cpu_dir)
    total_kept = total_dropped = 0.0
    for file, rows in by_file(tests, together).items():
        reasons = plan_file(rows, child_fixtures, costs)
        kept = [r for r in rows if reasons[r["id"]]]
        dropped = [r for r in rows if not reasons[r["id"]]]
        cpu_kept = sum(costs.get(r["id"], 0) for r in kept)
        cpu_dropped = sum(costs.get(r["id"], 0) for r in dropped)
        total_kept += cpu_kept
        total_dropped += cpu_dropped
        print(
            f"\n{file}: keep {len(kept)} ({cpu_kept:.1f} CPU s), may drop {len(dropped)} ({cpu_dropped:.1f} CPU s)"
        )
        for row in kept:
            marked = "  [marked pg_repeats!]" if row["pg_repeats"] is not None else ""
            print(f"  KEEP {row['id'].split('::', 1)[1]}: {reasons[row['id']]}{marked}")
        for row in dropped:
            print(f"  drop {row['id'].split('::', 1)[1]}  (covered by {', '.join(covering(row, kept))})")
    print(f"\nall files: keep {total_kept:.1f} CPU s, may drop {total_dropped:.1f} CPU s")
    return 0


def check(out: str, together: bool = False) -> int:
    """Every pg_repeats test: no must-keep reason, and all it covers is covered by its file's kept tests."""
    tests, child_fixtures = load(out)
    problems = 0
    for file, rows in by_file(tests, together).items():
        kept = [r for r in rows if r["pg_repeats"] is None]
        covered = set().union(*(r["credit"] for r in kept)) if kept else set()
        marked = [r for r in rows if r["pg_repeats"] is not None]
        for row in marked:
            name = row["id"].split("::", 1)[1]
            why = must_keep(row, child_fixtures)
            missing = sorted(row["need"] - covered)
            if why:
                problems += 1
                print(f"{file}::{name}: marked pg_repeats but must run on PostgreSQL: {why}")
            if missing:
                problems += 1
                print(f"{file}::{name}: marked pg_repeats but only it covers {len(missing)} on PostgreSQL:")
                for item in missing[:10]:
                    print(f"    {item[:300]}")
        print(f"{file}: {len(kept)} PostgreSQL variants kept, {len(marked)} marked pg_repeats")
    print("pg_repeats check:", "FAILED" if problems else "ok", f"({problems} problems)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="record the PostgreSQL variants of test files")
    p_run.add_argument("files", nargs="+")
    p_run.add_argument("--out", required=True)
    p_run.add_argument("-n", type=int, default=2, help="pytest-xdist workers (0: none)")
    p_run.add_argument("--backends", default="postgresql,sqlite", help="variants to record")
    p_plan = sub.add_parser("plan", help="propose which PostgreSQL variants to keep")
    p_plan.add_argument("out", nargs="+", help="directories `run` wrote")
    p_plan.add_argument("--cpu", help="an OVERRULE_CPU_LOG directory: weigh tests by their CPU seconds")
    p_plan.add_argument("--together", action="store_true", help="one pool for all files, not one per file")
    p_check = sub.add_parser("check", help="run the files and verify their pg_repeats marks")
    p_check.add_argument("files", nargs="+")
    p_check.add_argument("--out", help="keep the records here (default: a temporary directory)")
    p_check.add_argument("-n", type=int, default=2)
    p_check.add_argument("--together", action="store_true", help="a kept test of any given file may cover")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.files, args.out, args.n, args.backends)
    if args.command == "plan":
        return plan(args.out, args.cpu, args.together)
    out = args.out or tempfile.mkdtemp(prefix="pg_cover-")
    status = run(args.files, out, args.n, "postgresql,sqlite:marked")
    if status not in (0, 5):
        print(f"the tests failed (pytest exit {status}): fix them before checking", file=sys.stderr)
        return status
    return check(out, args.together)


if __name__ == "__main__":
    sys.exit(main())
