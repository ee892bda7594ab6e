"""Hunt flaky tests: run a test tier N times, optionally with every CPU kept busy, and print each
test's pass rate. Started by `scripts/test --repeat N [--load[=K]] [pytest args]`.

The default selection is the browser tier (`-m browser`): the tests that wait on a real page and are
the first to fail by chance on a loaded machine. Pass pytest arguments to pick others (`-m "not
browser" tests/pages`, `-k coach`). `--load` starts one busy process per CPU (or K) at normal priority
for the whole time, as the CI machine is when other jobs share it. The exit status is 0 only when
every test passed in every run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY = "while True: pass"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="scripts/test --repeat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, required=True, metavar="N", help="how many runs")
    parser.add_argument(
        "--load",
        action="store_true",
        help="keep one busy process per CPU running meanwhile (--load=K: K processes)",
    )
    parser.add_argument(
        "--keep", type=Path, help="directory for each run's log and JUnit XML (default: a temp dir)"
    )
    # `--load=K` is spelled with "=" only, so that `--load tests/...` never reads a path as K.
    procs = [int(a.split("=", 1)[1]) for a in argv if a.startswith("--load=")]
    args, pytest_args = parser.parse_known_args(["--load" if a.startswith("--load=") else a for a in argv])
    args.load = (procs[-1] if procs else os.cpu_count() or 1) if args.load else 0
    if args.repeat < 1:
        parser.error("--repeat needs N >= 1")
    if not any(a.startswith("-m") for a in pytest_args):
        pytest_args = ["-m", "browser", *pytest_args]
    return args, pytest_args


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Each test id in a JUnit XML report with passed, failed or skipped, and a failure's first line."""
    found: dict[str, tuple[str, str]] = {}
    if not junit.exists():
        return found
    # The report is the one pytest just wrote here, not data from elsewhere.
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314
        test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        failure = next((child for child in case if child.tag in {"failure", "error"}), None)
        if failure is not None:
            # A test that also fails in setup or teardown counts once, as failed.
            message = (failure.get("message") or "").strip().splitlines()
            found[test_id] = ("failed", message[0][:160] if message else "")
        elif any(child.tag == "skipped" for child in case):
            found.setdefault(test_id, ("skipped", ""))
        else:
            found.setdefault(test_id, ("passed", ""))
    return found


def start_load(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(count)]


def stop_load(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def main(argv: list[str]) -> int:
    args, pytest_args = parse_args(argv)
    keep = args.keep or Path(tempfile.mkdtemp(prefix="overrule-repeat-"))
    keep.mkdir(parents=True, exist_ok=True)
    workers = os.environ.get("OVERRULE_TEST_WORKERS", "2")
    results: dict[str, list[str]] = defaultdict(list)
    failures: dict[str, list[tuple[int, str]]] = defaultdict(list)
    print(
        f"{args.repeat} runs of pytest -n {workers} {' '.join(pytest_args)}"
        f"{f' with {args.load} busy processes' if args.load else ''}; logs in {keep}",
        flush=True,
    )
    load = start_load(args.load)
    started = time.monotonic()
    try:
        for run in range(1, args.repeat + 1):
            junit = keep / f"run-{run:02d}.xml"
            log = keep / f"run-{run:02d}.log"
            began = time.monotonic()
            with log.open("wb") as out:
                status = subprocess.call(
                    [sys.executable, "-m", "pytest", "-n", workers, "-p", "no:cacheprovider", "-q",
                     f"--junitxml={junit}", *pytest_args],
                    cwd=ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            seen = outcomes(junit)
            for test_id, (outcome, line) in seen.items():
                results[test_id].append(outcome)
                if outcome == "failed":
                    failures[test_id].append((run, line))
            failed = sorted(t for t, (o, _) in seen.items() if o == "failed")
            passed = sum(o == "passed" for o, _ in seen.values())
            print(
                f"run {run}/{args.repeat}: {passed} passed, {len(failed)} failed "
                f"in {time.monotonic() - began:.0f} s (pytest exit {status}, load average "
                f"{os.getloadavg()[0]:.1f})",
                flush=True,
            )
            for test_id in failed:
                print(f"    FAILED {test_id}", flush=True)
            if status not in (0, 1) or not seen:
                print(f"    pytest did not report tests (exit {status}): see {log}", flush=True)
    finally:
        stop_load(load)

    print(f"\npass rate per test over {args.repeat} runs ({time.monotonic() - started:.0f} s in all):")
    width = max((len(t) for t in results), default=10)
    flaky = 0
    for test_id, seen_outcomes in sorted(results.items(), key=lambda kv: (_rate(kv[1]), kv[0])):
        ran = [o for o in seen_outcomes if o != "skipped"]
        passed = ran.count("passed")
        if passed < len(ran) or len(seen_outcomes) < args.repeat:
            flaky += 1
        rate = f"{passed}/{len(ran)}" if ran else "skipped"
        print(f"  {test_id:<{width}}  {rate:>7}  {100 * passed / len(ran) if ran else 0:5.1f}%")
        for run, line in failures.get(test_id, []):
            print(f"      run {run}: {line}")
    print(
        f"\n{len(results)} tests, {flaky} not passing every run" + (f" (logs: {keep})" if flaky else ""),
        flush=True,
    )
    return 1 if flaky or not results else 0


def _rate(seen: list[str]) -> float:
    ran = [o for o in seen if o != "skipped"]
    return ran.count("passed") / len(ran) if ran else 1.0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
