"""Cost of a scale change that re-derives the stored gaps of a product's evaluations (review7 F12).

A `--kind metrics` write (`lib.importer.import_metrics`) sets one product's eight default metrics
with `truthfulness` on 0–10 instead of 1–5, so every evaluation of the product that scores it on
both sides has its weighted gap, largest gap and meta score re-derived (`lib.snapshots.rederive_gaps`,
with `evaluation_counts` following). Each run is rolled back; runs with the re-derivation and
without it (the same write, `rederive_gaps` replaced by a no-op) alternate. Prints process CPU and
wall seconds per run, and how many evaluations the re-derivation changed.

    .venv/bin/python bench/bench_regap.py --db data/copy_of_pages_100k.db --product "Hooli Mail"
    .venv/bin/python bench/bench_regap.py --db postgresql://…/overrule_pages_100k_0031_g7

On PostgreSQL the server's CPU is not counted (wall time shows it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlmodel import Session

from lib import snapshots
from lib.db import create_db_engine
from lib.importer import import_metrics
from lib.metrics import DEFAULT_METRICS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a SQLite file (a copy: never a shared one) or a URL")
    parser.add_argument("--product", default="Hooli Mail")
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode, alternated")
    args = parser.parse_args()
    engine = create_db_engine(args.db if "://" in args.db else f"sqlite:///{args.db}")
    data = [
        {"product": args.product, "slug": m.slug, "display_name": m.display_name, "description": m.description,
         "min": 0 if m.slug == "truthfulness" else 1, "max": 10 if m.slug == "truthfulness" else 5}
        for m in DEFAULT_METRICS
    ]  # fmt: skip
    rederive = snapshots.rederive_gaps
    cpu: dict[str, list[float]] = {"with": [], "without": []}
    for mode in ["with", "without"] * args.runs:
        changed: list[int] = []

        def measured(*a: Any, **k: Any) -> int:
            n = rederive(*a, **k) if mode == "with" else 0  # noqa: B023
            changed.append(n)  # noqa: B023
            return n

        snapshots.rederive_gaps = measured
        with Session(engine) as session:
            session.connection()
            t0, w0 = time.process_time(), time.perf_counter()
            import_metrics(session=session, data=data, source="bench", reviewer="import")
            session.flush()
            seconds, wall = time.process_time() - t0, time.perf_counter() - w0
            session.rollback()
        cpu[mode].append(seconds)
        print(f"{mode:8s} cpu {seconds:.3f} s  wall {wall:.3f} s  evaluations changed {sum(changed)}")
    snapshots.rederive_gaps = rederive
    print(
        f"median CPU s: with {statistics.median(cpu['with']):.3f}, without {statistics.median(cpu['without']):.3f}"
    )


if __name__ == "__main__":
    main()
