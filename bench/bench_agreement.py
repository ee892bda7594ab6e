"""Agreement between reviewers (lib.agreement.load_agreement) at 1k, 10k and 100k labelled items.

    .venv/bin/python bench/bench_agreement.py                         # 1k,10k,100k items, SQLite
    .venv/bin/python bench/bench_agreement.py --sizes 1k,100k,1m --resamples 1000
    .venv/bin/python bench/bench_agreement.py --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres

Each size is a fresh database holding one team queue per mode (open and blind-first) over N items
in total, each item one judgment on a 1-5 scale labelled by two of three reviewers (blind and final
labels in the blind-first queue, final labels in the other), a third of the items resolved, a tenth
adjudicated. Every figure of the Reviewers tab is computed (per metric, per queue, reviewer pairs,
calibration, anchoring, 1,000 bootstrap resamples each) and timed as a whole and by phase: the one
label query, and the statistics in numpy. Prints the median seconds and the ratio against the
smallest size, measured in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from sqlalchemy import Engine, insert  # noqa: E402
from sqlmodel import Session  # noqa: E402

from bench.common import fresh_pg_database, parse_size  # noqa: E402
from lib import agreement  # noqa: E402
from lib.agreement import AgreementFilters  # noqa: E402
from lib.db import init_db  # noqa: E402
from lib.models import Judgment, ReviewLabel, ReviewQueue, ReviewQueueItem, ReviewQueueJudgment  # noqa: E402

REVIEWERS = ("ana", "ben", "cem")
CHUNK = 20_000


def fill(engine: Engine, items: int, seed: int = 0) -> None:
    """Two queues (open, blind-first) sharing `items` judgments, two labels per judgment."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(1, 6, size=items)
    noise = rng.integers(-1, 2, size=(items, 2)) * (rng.random((items, 2)) < 0.4)
    finals = np.clip(truth[:, None] + noise, 1, 5)
    judge = np.clip(truth + rng.integers(-1, 2, size=items), 1, 5)
    blinds = np.clip(finals + rng.integers(-1, 2, size=(items, 2)) * (rng.random((items, 2)) < 0.3), 1, 5)
    pair = rng.integers(0, 3, size=items)
    state = rng.choice(["open", "resolved", "adjudicated", "disputed"], p=[0.5, 0.33, 0.1, 0.07], size=items)
    with engine.begin() as con:
        for mode, queue_id in (("open", 1), ("blind", 2)):
            con.execute(
                insert(ReviewQueue),
                [{"id": queue_id, "name": f"bench-{mode}", "overlap": 2, "mode": mode, "created_by": "bench",
                  "metrics": [], "reviewers": [], "description": ""}],
            )  # fmt: skip
        for start in range(0, items, CHUNK):
            ids = range(start, min(items, start + CHUNK))
            con.execute(
                insert(Judgment),
                [{"id": i + 1, "change_id": f"j{i}", "product": "acme", "metric": "clarity",
                  "decision": str(int(judge[i])), "version": 1, "was_corrected": False} for i in ids],
            )  # fmt: skip
            con.execute(
                insert(ReviewQueueItem),
                [{"id": i + 1, "queue_id": 1 + i % 2, "position": i + 1, "item_key": f"judgment:{i + 1}",
                  "claimed": 2, "done": 2, "available": False} for i in ids],
            )  # fmt: skip
            con.execute(
                insert(ReviewQueueJudgment),
                [{"id": i + 1, "queue_id": 1 + i % 2, "item_id": i + 1, "judgment_id": i + 1, "state": str(state[i]),
                  "held": state[i] == "open", "labels": 2,
                  "decision": None if state[i] in ("open", "disputed") else str(int(finals[i, 0]))} for i in ids],
            )  # fmt: skip
            con.execute(
                insert(ReviewLabel),
                [{"queue_id": 1 + i % 2, "item_id": i + 1, "judgment_id": i + 1,
                  "reviewer": REVIEWERS[(pair[i] + k) % 3], "decision": str(int(finals[i, k])),
                  "blind_decision": str(int(blinds[i, k])) if i % 2 else None} for i in ids for k in (0, 1)],
            )  # fmt: skip


def median_seconds(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1k,10k,100k")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--pg", help="a PostgreSQL admin URL; each size gets a fresh database on it")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    filters = AgreementFilters(resamples=args.resamples)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            if args.pg:
                url = fresh_pg_database(args.pg, f"bench_agreement_{size}")
            else:
                url = f"sqlite:///{tmp}/agreement_{size}.db"
            engine = init_db(url)
            start = time.perf_counter()
            fill(engine, size)
            filled = time.perf_counter() - start

            def whole(engine: Engine = engine) -> None:
                with Session(engine) as session:
                    agreement.load_agreement(session=session, filters=filters)

            def query(engine: Engine = engine) -> None:
                with Session(engine) as session:
                    session.execute(agreement._label_query(filters)).all()

            rows.append((size, filled, median_seconds(query, args.runs), median_seconds(whole, args.runs)))
            print(f"{size:>9,} items: filled in {filled:.1f} s; query {rows[-1][2]:.3f} s, all figures {rows[-1][3]:.3f} s",
                  flush=True)  # fmt: skip
            engine.dispose()
    base = rows[0]
    print(f"\n{'items':>9} {'labels':>9} {'query s':>9} {'all s':>9} {'all/base':>9} {'per label µs':>13}")
    for size, _filled, query_s, whole_s in rows:
        print(f"{size:>9,} {2 * size:>9,} {query_s:>9.3f} {whole_s:>9.3f} {whole_s / base[3]:>9.2f} "
              f"{whole_s / (2 * size) * 1e6:>13.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
