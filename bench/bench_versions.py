"""Agreement by judge version (lib.version_agreement) at 1k, 100k and 1M judgments with 20 versions.

    nice -n 19 .venv/bin/python bench/bench_versions.py                      # 1k,100k, SQLite
    nice -n 19 .venv/bin/python bench/bench_versions.py --sizes 1k,100k,1m
    nice -n 19 .venv/bin/python bench/bench_versions.py --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres

Each size is a fresh database: N reviewed judgments of two products on four 1–5 metrics over 26
weeks and two languages, judged by 20 versions (10 per product, in time order), plus a re-judge of
a tenth of them by the next version (`judge_verdicts`), the counts rebuilt once. Every option the
Analytics tab offers is timed: the per-version table (all products, one product, one language),
the version choices, a comparison of two versions (independent samples, and "same items only",
alone and with each filter), and the timeline; then whole renders under Streamlit's AppTest: the
Analytics "Judge versions" tab as it opens (table, chart, the last two versions compared,
timeline), the same with "Same items only" ticked, and the Judge versions page. Prints median
seconds per option and the ratio against the smallest size, measured in the same process; the
1,000-resample bootstrap is included. `--db-dir` keeps the databases (the 1M fill takes 5–25
minutes) and reuses them, migrated to the current schema on open.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from sqlalchemy import Engine, insert, text  # noqa: E402
from sqlmodel import Session  # noqa: E402

from bench.common import fresh_pg_database, fresh_sqlite_url, label, parse_size  # noqa: E402
from lib import counters, version_agreement  # noqa: E402
from lib.db import init_db  # noqa: E402
from lib.models import EvaluationSnapshot, JudgeVerdict, JudgeVersion, Judgment  # noqa: E402
from lib.scores import utc_day, week_of  # noqa: E402

PRODUCTS = ("alpha", "beta")
METRICS = ("clarity", "safety", "tone", "accuracy")
VERSIONS_PER_PRODUCT = 10
CHUNK = 20_000
START = datetime(2026, 1, 5, tzinfo=UTC)


def fill(engine: Engine, n: int, seed: int = 0) -> None:
    """n reviewed judgments (one snapshot per four), 20 versions, a tenth re-judged by the next version."""
    rng = np.random.default_rng(seed)
    with engine.begin() as con:
        ids = {}
        for p, product in enumerate(PRODUCTS):
            for v in range(VERSIONS_PER_PRODUCT):
                vid = p * VERSIONS_PER_PRODUCT + v + 1
                ids[(product, v)] = vid
                con.execute(
                    insert(JudgeVersion.__table__),  # type: ignore[attr-defined]
                    [{"id": vid, "product": product, "name": f"v{v + 1}", "content_hash": f"{vid:064d}",
                      "complete": False, "origin": "import", "description": "", "created_by": "bench",
                      "created_at": START + timedelta(weeks=v * 26 / VERSIONS_PER_PRODUCT)}],
                )  # fmt: skip
        snapshots = (n + 3) // 4
        for start in range(0, snapshots, CHUNK):
            rows = []
            for i in range(start, min(snapshots, start + CHUNK)):
                product = PRODUCTS[i % 2]
                rows.append({
                    "id": f"s{i}", "source_key": f"k{i}", "question": "q", "model_answer": "a", "product": product,
                    "language": "tr" if i % 5 == 0 else "en", "created_at": START, "status": "active",
                    "user_scores_json": {}, "judge_scores_json": {}, "bonus_metrics": [],
                })  # fmt: skip
            con.execute(insert(EvaluationSnapshot.__table__), rows)  # type: ignore[attr-defined]
        for start in range(0, n, CHUNK):
            count = min(n, start + CHUNK) - start
            idx = np.arange(start, start + count)
            snapshot = idx // 4
            product_i = snapshot % 2
            moment = rng.uniform(0, 26 * 7, size=count)  # days since START
            version = np.minimum(
                (moment / (26 * 7) * VERSIONS_PER_PRODUCT).astype(int), VERSIONS_PER_PRODUCT - 1
            )
            truth = rng.integers(1, 6, size=count)
            skill = 0.5 + 0.04 * version  # later versions agree a little more
            judged = np.where(
                rng.random(count) < skill, truth, np.clip(truth + rng.choice([-1, 1], count), 1, 5)
            )
            judgments, verdicts = [], []
            for k in range(count):
                product = PRODUCTS[product_i[k]]
                at = START + timedelta(days=float(moment[k]))
                jid = int(idx[k]) + 1
                judgments.append({
                    "id": jid, "change_id": f"c{jid}", "product": product, "metric": METRICS[idx[k] % 4],
                    "snapshot_id": f"s{snapshot[k]}", "decision": str(judged[k]), "user_decision": str(truth[k]),
                    "reviewed_at": at, "reviewer": "ana", "timestamp": at, "version": 1,
                    "was_corrected": bool(judged[k] != truth[k]),
                    "judge_version_id": ids[(product, int(version[k]))],
                })  # fmt: skip
                if k % 10 == 0 and version[k] + 1 < VERSIONS_PER_PRODUCT:
                    later = at + timedelta(days=7)
                    verdicts.append({
                        "judgment_id": jid, "judge_version_id": ids[(product, int(version[k]) + 1)],
                        "decision": str(truth[k] if rng.random() < skill[k] + 0.04 else judged[k]),
                        "judged_at": later, "week": week_of(utc_day(later)),
                    })  # fmt: skip
            con.execute(insert(Judgment.__table__), judgments)  # type: ignore[attr-defined]
            if verdicts:
                con.execute(insert(JudgeVerdict.__table__), verdicts)  # type: ignore[attr-defined]
    with Session(engine) as session:
        counters.recount(session=session)  # every counter, as an import leaves them (the pages read them)
        session.commit()
    if engine.dialect.name == "sqlite":
        with engine.connect() as con:
            con.execute(text("ANALYZE"))
    else:
        with engine.connect() as con:
            con.execute(text("COMMIT"))
            con.execute(text("ANALYZE"))


def options(session: Session) -> dict[str, object]:
    """Every option a user can pick on the tab, as a callable."""
    f = version_agreement.VersionFilters
    choices = version_agreement.version_choices(session=session)
    alpha = [c for c in choices if c.key.product == "alpha"]
    a, b = alpha[3], alpha[4]
    far = alpha[8]
    return {
        "table, all products": lambda: version_agreement.agreement_by_version(session=session),
        "table, one product": lambda: version_agreement.agreement_by_version(session=session, filters=f(products=("alpha",))),
        "table, one language": lambda: version_agreement.agreement_by_version(session=session, filters=f(language="tr")),
        "table, product + language": lambda: version_agreement.agreement_by_version(
            session=session, filters=f(products=("alpha",), language="tr")),
        "choices": lambda: version_agreement.version_choices(session=session),
        "compare v4 vs v5": lambda: version_agreement.compare_versions(session=session, a=a, b=b),
        "compare v4 vs v5, same items": lambda: version_agreement.compare_versions(
            session=session, a=a, b=b, same_items=True),
        "compare v5 vs v4, same items": lambda: version_agreement.compare_versions(
            session=session, a=b, b=a, same_items=True),
        "same items, one language": lambda: version_agreement.compare_versions(
            session=session, a=a, b=b, same_items=True, filters=f(language="tr")),
        "same items, product + language": lambda: version_agreement.compare_versions(
            session=session, a=a, b=b, same_items=True, filters=f(products=("alpha",), language="tr")),
        "compare v4 vs v9 (cautions)": lambda: version_agreement.compare_versions(session=session, a=a, b=far),
        "timeline": lambda: version_agreement.timeline(session=session),
        "timeline, one product": lambda: version_agreement.timeline(session=session, filters=f(products=("alpha",))),
        "tab's filter choices": lambda: (version_agreement.version_products(session=session),
                                         version_agreement.version_languages(session=session)),
    }  # fmt: skip


def _versions_tab() -> None:
    from lib.ui.judge_versions import versions_tab

    versions_tab(key="analytics_versions")


def renders(url: str) -> dict[str, object]:
    """Whole renders under AppTest against `url`: the Analytics tab (as it opens, and with "Same
    items only" ticked) and the Judge versions page. `st.cache_data` is cleared before each."""
    import os

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from bench.bench_pages import share_component_scan
    from lib.config import reset_settings

    os.environ["OVERRULE_DATABASE_URL"] = url
    os.environ["OVERRULE_LOAD_DEMO"] = "false"
    reset_settings()
    st.cache_resource.clear()  # the engine of the previous size's database
    share_component_scan()

    def run(at: AppTest) -> None:
        st.cache_data.clear()
        at.run()
        if at.exception:
            raise RuntimeError(at.exception[0].message)

    def tab(same: bool) -> None:
        at = AppTest.from_function(_versions_tab, default_timeout=1800)
        at.session_state["analytics_versions_same"] = same
        run(at)

    def page() -> None:
        at = AppTest.from_file(str(ROOT / "pages" / "judge_versions.py"), default_timeout=1800)
        at.session_state["versions_product"] = "alpha"
        run(at)

    page()  # warm-up: imports, engine, AppTest machinery
    return {
        "Analytics tab render (AppTest)": lambda: tab(False),
        "  … with same items (AppTest)": lambda: tab(True),
        "Judge versions page (AppTest)": page,
    }


def measure(engine: Engine, repeats: int, url: str, n: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per option; each printed as it is measured (a long run that
    fails later keeps what it measured)."""
    out = {}

    def time_all(found: dict[str, object]) -> None:
        for name, fn in found.items():
            times, cpus = [], []
            for _ in range(repeats):
                started, cpu = time.perf_counter(), time.process_time()
                fn()  # type: ignore[operator]
                times.append(time.perf_counter() - started)
                cpus.append(time.process_time() - cpu)
            out[name] = (statistics.median(times), statistics.median(cpus))
            print(
                f"{label(n):>5} {name:<34}{out[name][0]:>9.3f} s {out[name][1]:>9.3f} CPU s", file=sys.stderr
            )

    with Session(engine) as session:
        time_all(options(session))
    time_all(renders(url))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1k,100k")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pg", default=None, help="a PostgreSQL server URL (a fresh database per size)")
    parser.add_argument(
        "--db-dir", type=Path, default=None,
        help="keep each size's SQLite database here and reuse it on the next run (migrated on open); "
        "the 1M fill takes many minutes",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            kept = args.db_dir / f"versions_{label(n)}.db" if args.db_dir and not args.pg else None
            if args.pg:
                url = fresh_pg_database(args.pg, f"bench_versions_{n}")
            elif kept is not None and kept.exists():
                url = f"sqlite:///{kept}"
            else:
                url = fresh_sqlite_url(
                    kept.with_name(kept.name + ".partial") if kept else Path(tmp) / "bench.db"
                )
            started = time.perf_counter()
            engine = init_db(url)
            if kept is None or not kept.exists():
                fill(engine, n)
                print(f"{n:>9,} judgments: filled in {time.perf_counter() - started:.1f} s", file=sys.stderr)
                if kept is not None:
                    engine.dispose()
                    Path(url.removeprefix("sqlite:///")).rename(kept)
                    engine = init_db(f"sqlite:///{kept}")
            else:
                print(f"{n:>9,} judgments: reused {kept} (migrated in {time.perf_counter() - started:.1f} s)",
                      file=sys.stderr)  # fmt: skip
            with Session(engine) as session:  # a database filled before the fill recounted everything
                if session.execute(text("SELECT count(*) FROM product_counts")).scalar_one() == 0:
                    counters.recount(session=session)
                    session.commit()
            results[n] = measure(engine, args.repeats, url, n)
            engine.dispose()
    base = results[sizes[0]]
    for kind, which in (("seconds", 0), ("CPU seconds (this process)", 1)):
        print(f"\n{kind}, median of {args.repeats}")
        print(f"{'option':<34}" + "".join(f"{label(n):>12}" for n in sizes) + "   ratio (largest / smallest)")
        for name in base:
            cells = "".join(f"{results[n][name][which]:>10.3f} s" for n in sizes)
            low = base[name][which]
            ratio = results[sizes[-1]][name][which] / low if low else float("nan")
            print(f"{name:<34}{cells}   {ratio:.1f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
