"""Review queues at 1k / 100k / 1M judgments: do "next item" and "save label" stay flat?

    .venv/bin/python bench/bench_queues.py --sizes 1k,100k,1m
    .venv/bin/python bench/bench_queues.py --sizes 1k,100k --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres

The databases are bench_pages.py's (bench/gen.py, 10 judgments per evaluation, half of them
reviewed), built when missing; a size is a number of judgments. On each, everything runs in one
transaction that is rolled back at the end, so the database is left as it was:

1. the default queue (the plain review page): a fresh reviewer takes the next evaluation
   (`review_queue.reserve_next`, which reserves it) and confirms its first judgment
   (`corrections.record_review`);
2. a lead creates a team queue of `--items` (40) pending items with overlap 2 in each order (seeded
   random sample, largest gap, oldest; timed once each: creation reads the filter's matches, it is
   not a per-click cost; the first two are closed again); on the oldest-first one fresh reviewers
   in turn take the next item
   (`queues.next_assignment`), open it blind (`queues.load_blind_item`) and save a label for each
   of its judgments (`queues.label_item`; every second save completes an item, so half the saves
   also resolve or dispute its judgments through `record_review`);
3. the default queue again, now that the team queue holds the oldest pending evaluations;
4. a lead's progress views (`queue_progress`, `reviewer_progress`).

Prints the median milliseconds per call and size and the ratio to the smallest size (goal ≤ 1.5
for next item and save label). Wall clock of a shared machine: rerun before quoting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import OUT, label, parse_sizes, pg_database, sqlite_database  # noqa: E402

GOAL = 1.5
FLAT = ("default next item", "default save review", "team next item", "team save label")


def _timed(
    times: dict[str, list[tuple[float, float]]], name: str, fn: Callable[..., Any], **kwargs: Any
) -> Any:
    """Call `fn`, recording (wall, CPU) seconds: on a loaded machine the CPU time of the calling
    process (all of SQLite's work; PostgreSQL's is in its server) moves far less than the wall."""
    start, cpu = time.perf_counter(), time.process_time()
    result = fn(**kwargs)
    times.setdefault(name, []).append((time.perf_counter() - start, time.process_time() - cpu))
    return result


def measure(url: str, repeat: int, items: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call on one database; every write is rolled back at the end."""
    from sqlmodel import Session

    from lib import corrections, queues, review_queue
    from lib.auth import Actor
    from lib.db import init_db
    from lib.queues import LabelInput, QueueSpec
    from lib.review_queue import QueueFilter

    engine = init_db(url)
    times: dict[str, list[tuple[float, float]]] = {}
    lead = Actor("bench-lead", "lead")
    with Session(engine) as session:

        def default_round(tag: str, n: int) -> None:
            reviewer = f"default-{tag}-{n}"
            item = _timed(
                times,
                f"default next item{tag}",
                review_queue.reserve_next,
                session=session,
                reviewer=reviewer,
                filters=QueueFilter(),
            )
            assert item is not None, "the default queue is empty"
            first = item.judgments[0]
            _timed(
                times,
                f"default save review{tag}",
                corrections.record_review,
                session=session, judgment_id=first.id or 0, expected_version=first.version,
                action="confirm", reviewer=reviewer,
            )  # fmt: skip

        for n in range(repeat + 1):
            default_round("", n)
        for order in ("random", "largest_gap", "oldest"):
            spec = QueueSpec(name=f"bench {order}", size=items, order=order, seed=1, overlap=2)
            queue = _timed(
                times,
                f"create {order} ({items} items)",
                queues.create_queue,
                session=session,
                actor=lead,
                spec=spec,
            )
            if order != "oldest":  # let its items go for the next order; oldest first is measured
                queues.close_queue(session=session, actor=lead, queue_id=queue.id or 0)
        queue_id = queue.id or 0
        for n in range(2 * (repeat + 1)):
            reviewer = Actor(f"team-{n // 2}-{n % 2}", "reviewer")
            got = _timed(
                times,
                "team next item",
                queues.next_assignment,
                session=session,
                queue_id=queue_id,
                reviewer=reviewer,
            )
            assert got is not None, "the team queue ran out; raise --items"
            blind = _timed(
                times,
                "team open item (blind)",
                queues.load_blind_item,
                session=session,
                queue_id=queue_id,
                item_id=got.item_id,
                reviewer=reviewer,
            )
            labels = [
                LabelInput(m.judgment_id, next(iter(m.keys.values()), "1"), "bench") for m in blind.metrics
            ]
            _timed(
                times,
                "team save label",
                queues.label_item,
                session=session,
                queue_id=queue_id,
                item_id=got.item_id,
                reviewer=reviewer,
                labels=labels,
            )
        for n in range(repeat + 1):
            default_round(" (team queue holds the oldest)", n)
        for _ in range(repeat + 1):
            _timed(times, "queue progress", queues.queue_progress, session=session, queue_id=queue_id)
            _timed(times, "reviewer progress", queues.reviewer_progress, session=session, queue_id=queue_id)
        session.rollback()
    engine.dispose()
    # The first call of each kind warms caches; creation is timed once per order.
    out = {}
    for name, ts in times.items():
        kept = ts[1:] if len(ts) > 1 else ts
        out[name] = (statistics.median(t[0] for t in kept), statistics.median(t[1] for t in kept))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1k,100k", help="judgments per database, e.g. 1k,100k,1m")
    # The smallest database (1k judgments) has 100 evaluations: the default-queue rounds before and
    # after, and the team queue's items, must fit in its pending ones.
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--items", type=int, default=40, help="items of the team queue (default 40)")
    parser.add_argument("--db-dir", type=Path, default=OUT)
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL: measure there instead of SQLite")
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    if any(size % 10 for size in sizes):
        raise SystemExit("sizes are judgments, 10 per evaluation: use multiples of 10")
    results: dict[int, dict[str, tuple[float, float]]] = {}
    for size in sizes:
        evaluations = size // 10
        if args.pg:
            url = pg_database(args.pg, evaluations, build=not args.no_build)
        else:
            url = sqlite_database(args.db_dir, evaluations, build=not args.no_build)
        print(f"measuring {label(size)} judgments ({url.rsplit('/', 1)[-1]}) …", flush=True)
        results[size] = measure(url, args.repeat, args.items)
    base = sizes[0]
    names = list(results[base])
    width = max(len(n) for n in names)
    worst = {"wall": 0.0, "CPU": 0.0}
    for kind, index in (("wall", 0), ("CPU", 1)):
        head = "  ".join(f"{label(s):>8}" for s in sizes)
        ratios = "  ".join(f"{label(s) + '/' + label(base):>9}" for s in sizes[1:])
        print(f"\n{'ms per call, ' + kind + ' (median)':<{width}}  {head}  {ratios}")
        for name in names:
            row = "  ".join(f"{results[s][name][index] * 1000:8.2f}" for s in sizes)
            rel = [results[s][name][index] / max(results[base][name][index], 1e-9) for s in sizes[1:]]
            if name.startswith(FLAT):
                worst[kind] = max([worst[kind], *rel])
            print(f"{name:<{width}}  {row}  " + "  ".join(f"{r:9.2f}" for r in rel))
    print(
        f"\nworst ratio of next item / save label / save review: wall {worst['wall']:.2f}, "
        f"CPU {worst['CPU']:.2f} (goal ≤ {GOAL})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
