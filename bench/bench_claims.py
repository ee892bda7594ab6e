"""CPU per request of the temp folder an API request makes (`lib.claims.TempFolder`) in a temp dir
of many entries: every folder sweeping the whole temp dir (as before the throttle, interval 0) vs
at most one sweep a minute (`SWEEP_INTERVAL_SECONDS`).

    .venv/bin/python bench/bench_claims.py --entries 100000 --requests 300

Fills `--dir` (default bench/out/claims-tmp, made afresh and removed at the end) with `--entries`
files of other programs' names and `--ours` fresh `overrule-api-*` folders of other requests (read
by every sweep, kept by it), makes and removes `--requests` folders in each mode, and prints the
CPU (and wall) ms per request and the ratio. Rerun on a quiet machine before quoting.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import OUT  # noqa: E402
from lib import claims  # noqa: E402


def per_request(requests: int) -> tuple[float, float]:
    """The mean (CPU, wall) ms of making and removing one request's folder."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(requests):
        with claims.TempFolder("api"):
            pass
    return (time.process_time() - cpu) * 1000 / requests, (time.perf_counter() - wall) * 1000 / requests


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--ours", type=int, default=100)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=OUT / "claims-tmp")
    args = parser.parse_args()
    root: Path = args.dir
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        for i in range(args.entries):
            (root / f"tmp{i:08x}").touch()
        for i in range(args.ours):
            (root / f"overrule-api-{i:08x}").mkdir()
        tempfile.tempdir = str(root)
        print(f"{args.entries:,} entries + {args.ours} live overrule-api-* folders, {args.requests} requests")
        results = {}
        for mode, interval in (("every request sweeps", 0.0), ("throttled", claims.SWEEP_INTERVAL_SECONDS)):
            claims.SWEEP_INTERVAL_SECONDS = interval
            claims._last_sweeps.clear()
            per_request(5)  # warm the directory cache
            results[mode] = per_request(args.requests)
            print(f"{mode:>22}: {results[mode][0]:8.3f} ms CPU, {results[mode][1]:8.3f} ms wall a request")
        before, after = results["every request sweeps"], results["throttled"]
        print(f"{'before / after':>22}: {before[0] / after[0]:8.1f}x CPU, {before[1] / after[1]:8.1f}x wall")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
