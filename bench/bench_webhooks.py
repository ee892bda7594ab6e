"""Review latency with webhooks on vs off (issue 29.3: goal ≤ 1.1x).

    .venv/bin/python bench/bench_webhooks.py --sizes 1k,100k
    .venv/bin/python bench/bench_webhooks.py --sizes 1k --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres

On bench_pages.py's databases (bench/gen.py; a size is a number of judgments, built when missing),
in one transaction rolled back at the end: `corrections.record_review` overrules unreviewed
judgments one at a time, alternating between webhooks off (none active) and on (`--hooks` active
webhooks, each wanting every event, so an overrule writes 2 × hooks outbox rows in the review's
transaction). Deliveries are not attempted: they run in the worker thread, never in a review.
Prints the median ms (wall and CPU) of a review off and on, and on/off; rerun on a quiet machine
before quoting (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import OUT, label, parse_sizes, pg_database, sqlite_database  # noqa: E402

GOAL = 1.1


def measure(url: str, reviews: int, hooks: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of a review with webhooks off and on; everything rolled back."""
    from sqlalchemy import update
    from sqlmodel import Session, col, select

    from lib import corrections, webhooks
    from lib.auth import Actor
    from lib.db import init_db
    from lib.models import WEBHOOK_EVENTS, Judgment, Webhook

    os.environ.setdefault("OVERRULE_WEBHOOK_KEY", webhooks.new_key())
    engine = init_db(url)
    lead, reviewer = Actor("bench-lead", "lead"), Actor("bench-reviewer", "reviewer")
    times: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    with Session(engine) as session:
        for i in range(hooks):
            webhooks.register_webhook(
                session=session, actor=lead, url=f"https://hooks{i}.example/overrule", events=WEBHOOK_EVENTS
            )
        pending = session.exec(
            select(Judgment.id, Judgment.version, Judgment.decision)
            .where(col(Judgment.reviewed_at).is_(None), col(Judgment.snapshot_id).is_not(None))
            .limit(2 * (reviews + 1))
        ).all()
        if len(pending) < 2 * (reviews + 1):
            raise SystemExit(f"only {len(pending)} unreviewed judgments; lower --reviews")
        for n, (judgment_id, version, decision) in enumerate(pending):
            mode = "on" if n % 2 else "off"
            session.execute(update(Webhook).values(active=mode == "on"))
            session.flush()
            start, cpu = time.perf_counter(), time.process_time()
            corrections.record_review(
                session=session, judgment_id=judgment_id or 0, expected_version=version, action="overrule",
                user_decision="1" if decision != "1" else "2", reviewer=reviewer, reason="bench",
            )  # fmt: skip
            times[mode].append((time.perf_counter() - start, time.process_time() - cpu))
        session.rollback()
    engine.dispose()
    return {
        mode: (statistics.median(t[0] for t in ts[1:]), statistics.median(t[1] for t in ts[1:]))
        for mode, ts in times.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1k,100k", help="judgments per database, e.g. 1k,100k")
    parser.add_argument("--reviews", type=int, default=150, help="reviews per mode (default 150)")
    parser.add_argument("--hooks", type=int, default=3, help="active webhooks when on (default 3)")
    parser.add_argument("--db-dir", type=Path, default=OUT)
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL: measure there instead of SQLite")
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args(argv)
    worst = 0.0
    print(
        f"{'size':>6}  {'off ms':>8}  {'on ms':>8}  {'on/off':>6}   {'off CPU':>8}  {'on CPU':>8}  {'on/off':>6}"
    )
    for size in parse_sizes(args.sizes):
        evaluations = size // 10
        if args.pg:
            url = pg_database(args.pg, evaluations, build=not args.no_build)
        else:
            url = sqlite_database(args.db_dir, evaluations, build=not args.no_build)
        result = measure(url, args.reviews, args.hooks)
        (off, off_cpu), (on, on_cpu) = result["off"], result["on"]
        worst = max(worst, on / off)
        print(
            f"{label(size):>6}  {off * 1000:8.2f}  {on * 1000:8.2f}  {on / off:6.2f}   "
            f"{off_cpu * 1000:8.2f}  {on_cpu * 1000:8.2f}  {on_cpu / off_cpu:6.2f}",
            flush=True,
        )
    print(f"\nworst wall ratio on/off: {worst:.2f} (goal ≤ {GOAL})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
