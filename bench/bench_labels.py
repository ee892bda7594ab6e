"""Labels sent without a number: the stored-label lookup, and a Langfuse import of label-only scores.

    python bench/bench_labels.py --url sqlite:///COPY.db [--lookups 20] [--import-rows 5000]
    python bench/bench_labels.py --url postgresql://.../overrule_pages_100k_0032_g7 --import-rows 0

A Phoenix or Langfuse result that sends a label and no score gets the score the product's stored
judgments of that metric already give the label (`lib.source_records.score_labels`, review7 F9):
one lookup per distinct (product, metric, label) of the file, `lib.importer._stored_label_scores`.
Part 1 times that lookup on the database at `--url` (read only; a bench database from bench/gen.py,
whose judgments carry no label, is the worst case: every lookup finds nothing), over the first
products' first metrics × a few labels, and prints the CPU seconds a lookup (median, max).
Part 2 imports a Langfuse export of `--import-rows` traces, each with two label-only CATEGORICAL
scores and one NUMERIC, into a fresh SQLite file in bench/out/ (`import_path`, as the CLI does) and
prints its CPU seconds: the import path's own cost of carrying labels; then the lookup again on
that database, where thousands of labelled judgments share each label.

CPU seconds of this process are the figures to read (with PostgreSQL the server's CPU is not counted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import select  # noqa: E402

from bench.common import OUT, fresh_sqlite_url  # noqa: E402
from lib.db import create_db_engine, init_db, session_scope  # noqa: E402
from lib.importer import _stored_label_scores, import_path  # noqa: E402
from lib.models import Judgment  # noqa: E402

LABELS = ("factual", "hallucinated", "pass", "toxic")


def time_lookups(url: str, lookups: int) -> None:
    engine = create_db_engine(url)
    with session_scope(engine, read_only=True) as session:
        keys = session.execute(
            select(Judgment.product, Judgment.metric).where(Judgment.metric.is_not(None)).distinct()
        ).all()
        keys = sorted(keys)[: max(1, lookups // len(LABELS))]
        scores = _stored_label_scores(session)
        times, walls = [], []
        for product, metric in keys:
            for label in LABELS:
                start, wall = time.process_time(), time.perf_counter()
                scores(product, metric, label)
                times.append(time.process_time() - start)
                walls.append(time.perf_counter() - wall)
    print(
        f"lookup: {len(times)} lookups, CPU s a lookup median {statistics.median(times):.4f}, "
        f"max {max(times):.4f}, sum {sum(times):.3f}; wall s median {statistics.median(walls):.4f}"
    )


def langfuse_export(path: Path, rows: int) -> None:
    """`rows` traces of product `labels-bench`, each with two label-only scores and one number."""
    with path.open("w") as out:
        for i in range(rows):
            trace = f"trace-{i:07d}"
            lines = [
                {"id": trace, "timestamp": "2026-11-20T10:01:00.000Z", "name": "labels-bench",
                 "input": f"Question {i}?", "output": f"Answer {i}."},
                {"id": f"{trace}-h", "traceId": trace, "name": "Hallucination", "value": None,
                 "stringValue": ("factual", "hallucinated")[i % 2], "dataType": "CATEGORICAL",
                 "source": "EVAL", "comment": "The answer keeps to the reference."},
                {"id": f"{trace}-t", "traceId": trace, "name": "Toxicity", "value": None,
                 "stringValue": ("non-toxic", "toxic")[i % 3 == 0], "dataType": "CATEGORICAL",
                 "source": "EVAL", "comment": None},
                {"id": f"{trace}-q", "traceId": trace, "name": "Quality", "value": (i % 5) / 4,
                 "dataType": "NUMERIC", "source": "EVAL", "comment": "ok"},
            ]  # fmt: skip
            out.write("".join(json.dumps(line) + "\n" for line in lines))


def time_import(rows: int) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    source = OUT / f"labels_langfuse_{rows}.jsonl"
    langfuse_export(source, rows)
    engine = init_db(fresh_sqlite_url(OUT / "labels_import.db"))
    start, wall = time.process_time(), time.perf_counter()
    report = import_path(engine=engine, path=source, kind="langfuse", reviewer="bench")
    cpu, wall = time.process_time() - start, time.perf_counter() - wall
    print(
        f"import: {report.inserted} evaluations, {report.judgments} judgments: {cpu:.2f} CPU s ({wall:.2f} s wall)"
    )
    # The lookup where every judgment is labelled: thousands of judgments share each label.
    time_lookups(engine.url.render_as_string(), 12)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="database for the lookups (read only)")
    parser.add_argument("--lookups", type=int, default=20)
    parser.add_argument("--import-rows", type=int, default=5000)
    args = parser.parse_args()
    if args.url:
        time_lookups(args.url, args.lookups)
    if args.import_rows:
        time_import(args.import_rows)


if __name__ == "__main__":
    main()
