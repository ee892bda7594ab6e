"""Peak memory of the Evaluations "Download CSV (all matches)" at 10k vs 100k evaluations.

Each measurement runs in a fresh Python process (so peaks do not mix) that imports the app, notes
its resident memory, exports every live evaluation, and reports its peak resident memory
(`VmHWM`) above that baseline, the seconds and the CSV size:

- `frame (before)`: the old download, every match as one pandas frame (the list's select with
  review counts, `frame_to_csv_bytes`), reimplemented here since it is gone from lib;
- `bytes wide` / `bytes long`: `lib.export.evaluations_csv_bytes` as the page calls it: rows
  streamed in batches into a temporary file, whose bytes come back (Streamlit keeps them);
- `file wide` / `file long`: `lib.export.export_evaluations_csv` as the CLI calls it, straight to a
  file: nothing of the size of the data is ever in memory;
- `link wide` / `link long`: `lib.export.evaluations_csv_chunks` as the streamed download link
  (`lib.downloads`, when the app runs from serve.py) sends it, chunks consumed and dropped.

Databases come from `bench/gen.py` (N evaluations, 8 judgments each) and are kept in `bench/out/`.

    .venv/bin/python bench/bench_export_evaluations.py                 # 10k and 100k, SQLite
    .venv/bin/python bench/bench_export_evaluations.py --sizes 10000,100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out"
METHODS = ("frame (before)", "bytes wide", "bytes long", "file wide", "file long", "link wide", "link long")


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    """This process's own peak RSS (VmHWM). Not `ru_maxrss`: Linux carries the parent's peak across
    fork + exec into it, so a child of a big parent would report the parent's memory."""
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _frame_before(engine) -> bytes:  # type: ignore[no-untyped-def]
    """The download as it was: one frame of every match (inspector.filtered_frame), then CSV bytes."""
    import pandas as pd
    from sqlmodel import Session, col, func, select

    from lib.export import frame_to_csv_bytes
    from lib.inspector import LIST_FRAME_COLUMNS, EvaluationFilters, _list_select
    from lib.models import EvaluationSnapshot as S
    from lib.models import Judgment as J

    reviewed = col(J.reviewed_at).is_not(None)
    review = (
        select(
            col(J.snapshot_id).label("snapshot_id"),
            func.count().label("judged"),
            func.count().filter(reviewed).label("reviewed"),
            func.count().filter(reviewed & col(J.was_corrected)).label("corrected"),
        )
        .where(col(J.snapshot_id).is_not(None))
        .group_by(col(J.snapshot_id))
        .subquery()
    )
    stmt = (
        _list_select(EvaluationFilters())
        .add_columns(
            func.coalesce(review.c.judged, 0).label("judged"),
            func.coalesce(review.c.reviewed, 0).label("reviewed"),
            func.coalesce(review.c.corrected, 0).label("corrected"),
        )
        .outerjoin(review, review.c.snapshot_id == col(S.id))
    )
    with Session(engine) as session:
        result = session.exec(stmt)
        frame = pd.DataFrame(result.all(), columns=list(result.keys())).reindex(columns=LIST_FRAME_COLUMNS)
    return frame_to_csv_bytes(frame)


def child(method: str, url: str) -> None:
    from lib.db import create_db_engine
    from lib.export import evaluations_csv_bytes, evaluations_csv_chunks, export_evaluations_csv
    from lib.inspector import EvaluationFilters

    engine = create_db_engine(url)
    base = _rss_mb()
    t0 = time.perf_counter()
    if method == "frame (before)":
        size = len(_frame_before(engine))
    elif method.startswith("link"):
        size = sum(
            len(c)
            for c in evaluations_csv_chunks(
                engine=engine, filters=EvaluationFilters(), form=method.split()[1]
            )
        )
    elif method.startswith("bytes"):
        size = len(evaluations_csv_bytes(engine=engine, filters=EvaluationFilters(), form=method.split()[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "e.csv"
            export_evaluations_csv(engine=engine, out=out, form=method.split()[1])
            size = out.stat().st_size
    seconds = time.perf_counter() - t0
    peak = _peak_mb()
    print(json.dumps({"peak_mb": peak - base, "seconds": seconds, "csv_mb": size / 2**20}))


def ensure_db(size: int) -> str:
    path = OUT / f"export_eval_{size}.db"
    if not path.exists():
        from bench.gen import generate
        from lib.db import init_db

        OUT.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        engine = init_db(f"sqlite:///{partial}")
        generate(engine, judgments=size * 8, snapshots=size)
        engine.dispose()
        partial.rename(path)
    return f"sqlite:///{path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = [m for m in args.methods.split(",") if m in METHODS]
    results: dict[tuple[str, int], dict[str, float]] = {}
    for size in sizes:
        url = ensure_db(size)
        for method in methods:
            done = subprocess.run(
                [sys.executable, __file__, "--child", method, url], capture_output=True, text=True, check=True
            )
            results[method, size] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"{'method':<16}"
        + "".join(f"{f'{s:,} peak MB':>16}{'s':>8}{'CSV MB':>9}" for s in sizes)
        + "  peak ratio"
    )
    for method in methods:
        line = f"{method:<16}"
        for size in sizes:
            r = results[method, size]
            line += f"{r['peak_mb']:>16.0f}{r['seconds']:>8.1f}{r['csv_mb']:>9.1f}"
        first, last = results[method, sizes[0]]["peak_mb"], results[method, sizes[-1]]["peak_mb"]
        line += f"  {last / max(first, 1):.1f}x"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
