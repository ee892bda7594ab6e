"""Summarise a `-p tests.cpu_timeline` run: where the suite's CPU seconds go and whether a worker
idled. Usage: `.venv/bin/python scripts/suite_cpu.py DIR [--top N]` (docs/development.md).

CPU seconds are the fair measure on a shared machine (wall time grows with other jobs' load); the
per-worker lines show each worker's first start, last end and the share of that span its tests
filled, so a worker that waited at the end (or ran one long test alone) shows up. A session-scoped
fixture's teardown (the browser tier's Chromium) is a line of its own, under the conftest that
defines it, and is not counted as a test. A test's CPU includes the Chromium it drove (`browser`;
logs written before that field have none).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def load(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.open()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="the OVERRULE_CPU_LOG directory of a run")
    parser.add_argument("--top", type=int, default=25, help="how many files and tests to list")
    args = parser.parse_args(argv)
    rows = load(args.directory)
    if not rows:
        parser.error(f"no records in {args.directory} (run pytest with -p tests.cpu_timeline)")

    def cpu(row: dict) -> float:
        return row["self"] + row["child"] + row.get("browser", 0.0)

    def tests(rows: list[dict]) -> int:
        return sum(not r.get("fixture") for r in rows)

    total = sum(cpu(r) for r in rows)
    browser = sum(r.get("browser", 0.0) for r in rows)
    print(
        f"{tests(rows)} tests, {total:.0f} CPU s in the workers, the processes they waited for and the "
        f"Chromium they drove ({browser:.0f} of it)"
    )
    print("\nworker   tests   CPU s   span s   tests filled")
    by_worker: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_worker[row["worker"]].append(row)
    first = min(r["start"] for r in rows)
    for worker, mine in sorted(by_worker.items()):
        start, end = min(r["start"] for r in mine), max(r["end"] for r in mine)
        busy = sum(r["end"] - r["start"] for r in mine)
        print(
            f"{worker:8} {tests(mine):5} {sum(cpu(r) for r in mine):7.0f} {end - start:8.0f}"
            f"   {busy / max(end - start, 1e-9):5.0%}  (from +{start - first:.0f} s to +{end - first:.0f} s)"
        )

    files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for row in rows:
        entry = files[row["id"].split("::")[0]]
        entry[0] += not row.get("fixture")
        entry[1] += cpu(row)
        entry[2] += cpu(row) if "postgresql" in row["id"] else 0.0
        entry[3] += row.get("browser", 0.0)
        entry[4] += row["end"] - row["start"]
    print(f"\n{'file':52} tests   CPU s  of it PG  Chromium   share   wall s")
    for name, (count, seconds, pg, chromium, wall) in sorted(files.items(), key=lambda kv: -kv[1][1])[
        : args.top
    ]:
        print(
            f"{name:52} {count:5} {seconds:7.1f} {pg:9.1f} {chromium:9.1f} {seconds / total:6.1%} {wall:8.0f}"
        )
    print(f"\n{'test':100}   CPU s   wall s")
    for row in sorted(rows, key=lambda r: -cpu(r))[: args.top]:
        print(f"{row['id'][:100]:100} {cpu(row):7.1f} {row['end'] - row['start']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
