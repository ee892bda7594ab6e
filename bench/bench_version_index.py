"""review8 F6 on PostgreSQL: the weekly judge-version count index, reads against review writes.

    python bench/bench_version_index.py postgresql://overrule:overrule@127.0.0.1:5432/MY_COPY [--pairs 200] [--repeats 20]

ON A COPY ONLY (`CREATE DATABASE my_copy TEMPLATE overrule_pages_100k_<tag>`): it drops and recreates
`ix_judge_version_count_week` and writes reviews (each confirm undone, audit rows stay). For each
definition of the index (0030's with `n`, without `n`, (version, product, week) only, none) it
times the Analytics judge-version reads that group the weekly counts (`version_agreement.read_counts`
and `timeline`, all products and one product in one language: median wall, and the server backend's
CPU from /proc averaged, so the server must be local), then `--pairs` review + undo pairs on 40
unreviewed judgments (client and server CPU, and how many of the weekly table's updates were HOT,
from pg_stat_user_tables). The database is left with no such index, as migration 0032 leaves it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Connection, create_engine, text  # noqa: E402
from sqlalchemy.pool import StaticPool  # noqa: E402
from sqlmodel import Session, select  # noqa: E402

from lib import version_agreement  # noqa: E402
from lib.corrections import record_review, undo_review  # noqa: E402
from lib.db import normalize_url, session_scope  # noqa: E402
from lib.models import Judgment  # noqa: E402

VARIANTS = {
    "with n (0030)": "judge_version_id, product, week, language, metric, decision, human, n",
    "without n": "judge_version_id, product, week, language, metric, decision, human",
    "(version, product, week)": "judge_version_id, product, week",
    "none (0032)": None,
}


def backend_cpu(conn: Connection) -> float:
    pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def updates(conn: Connection) -> tuple[int, int]:
    """The weekly table's (updates, HOT updates) so far, with this session's counts flushed."""
    conn.execute(text("SELECT pg_stat_force_next_flush()"))
    conn.commit()
    time.sleep(1.2)
    conn.execute(text("SELECT pg_stat_clear_snapshot()"))
    row = conn.execute(
        text(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'judge_version_counts'"
        )
    ).one()
    return int(row[0]), int(row[1])


def reads(engine: Any, repeats: int, product: str) -> dict[str, tuple[float, float]]:
    every = version_agreement.VersionFilters()
    one = version_agreement.VersionFilters(products=(product,), language="en")
    calls = {
        "read_counts": lambda s: version_agreement.read_counts(s, every),
        "timeline": lambda s: version_agreement.timeline(session=s, filters=every),
        "timeline, one product": lambda s: version_agreement.timeline(session=s, filters=one),
    }
    walls: dict[str, list[float]] = {name: [] for name in calls}
    cpus: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        with Session(engine) as session:
            conn = session.connection()
            for name, call in calls.items():
                cpu, wall = backend_cpu(conn), time.perf_counter()
                call(session)
                walls[name].append(time.perf_counter() - wall)
                cpus[name].append(backend_cpu(conn) - cpu)
    # The server's CPU ticks are 10 ms: the mean over the repeats, not a median of ticks.
    return {name: (statistics.median(walls[name]), sum(cpus[name]) / repeats) for name in calls}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", help="a PostgreSQL copy of a bench database (it is changed)")
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    engine = create_engine(normalize_url(args.url), poolclass=StaticPool)
    with session_scope(engine) as s:
        ids = s.exec(
            select(Judgment.id).where(Judgment.reviewed_at.is_(None)).order_by(Judgment.id).limit(40)
        ).all()
        product = s.exec(select(Judgment.product).order_by(Judgment.id).limit(1)).one()
    for name, columns in VARIANTS.items():
        with engine.begin() as conn:
            conn.execute(text("DROP INDEX IF EXISTS ix_judge_version_count_week"))
            if columns:
                conn.execute(
                    text(f"CREATE INDEX ix_judge_version_count_week ON judge_version_counts ({columns})")
                )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE judge_version_counts"))
        timed = reads(engine, args.repeats, product)
        with engine.connect() as conn:
            before, server = updates(conn), backend_cpu(conn)
        client = time.process_time()
        for k in range(args.pairs):
            judgment_id = ids[k % len(ids)]
            with session_scope(engine) as s:
                version = s.get(Judgment, judgment_id).version
                record_review(session=s, judgment_id=judgment_id, expected_version=version, action="confirm", reviewer="bench")  # fmt: skip
            with session_scope(engine) as s:
                version = s.get(Judgment, judgment_id).version
                undo_review(session=s, judgment_id=judgment_id, expected_version=version, reviewer="bench")
        client = time.process_time() - client
        with engine.connect() as conn:
            server = backend_cpu(conn) - server
            after = updates(conn)
        upd, hot = after[0] - before[0], after[1] - before[1]
        shown = ", ".join(f"{k} {wall:.4f} s / {cpu:.3f} CPU s" for k, (wall, cpu) in timed.items())
        print(
            f"{name}: reads (median wall / server CPU) {shown} | {args.pairs} review+undo pairs: client "
            f"{client:.2f} CPU s, server {server:.2f} CPU s, weekly-count updates {upd}, HOT {hot} "
            f"({100 * hot / max(upd, 1):.0f}%)",
            flush=True,
        )


if __name__ == "__main__":
    main()
