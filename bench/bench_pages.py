"""Every page at 1k, 100k and 1M evaluations: does a render stay flat as the data grows?

    .venv/bin/python bench/bench_pages.py --sizes 1k,100k            # SQLite, DBs cached in bench/out
    .venv/bin/python bench/bench_pages.py --sizes 1k,100k,1m --db-dir /work/bench-data
    .venv/bin/python bench/bench_pages.py --sizes 1k --pg postgresql://overrule:overrule@127.0.0.1:5432/postgres --pg-sizes 1k,100k
    .venv/bin/python bench/bench_pages.py --sizes 1k,100k --pages overview,analytics --repeat 5
    .venv/bin/python bench/bench_pages.py --sizes 1k,200k --db 1k=a.db --db 200k=b.db --match notes --processes 5
    .venv/bin/python bench/bench_pages.py --sizes '' --pg-db 1k=postgresql://…/a --pg-db 200k=postgresql://…/b

A size is a number of evaluations (`1k`, `100k`, `1m` or a plain integer); each database holds
10 judgments per evaluation (8 metrics of the evaluation + 2 code-review judgments), built by
`bench/gen.py` the first time and reused afterwards: the file (or PostgreSQL database) name carries
the size, the Alembic head and `gen.GEN_VERSION`, so a new migration or generator builds afresh.
A database is built under a temporary name and renamed when complete, so an interrupted build is
never mistaken for a finished one.

Each database is measured in a fresh worker process (this script with `--worker`), so one size's
caches and memory never leak into another's. In the worker, every scenario is one page file under
`streamlit.testing.v1.AppTest` (widgets preset through the URL's query parameters or session
state, a reviewer named in the sidebar). Timed: `AppTest.run()` only, i.e. the script run, with

- the installed-components scan (about 0.25 s per new AppTest, the same at any size) done once
  and shared before timing, exactly as `tests/pages/conftest.py` does; the script also prints how
  long an empty page takes, the floor every figure includes;
- `st.cache_data` cleared before every timed run (a first render after the cache expired, the
  reviewer's worst case), `st.cache_resource` (engine, DuckDB connection) kept, as in a server
  that has been up for a while; `--warm-data-cache` keeps it too;
- one untimed warm-up run per scenario, then the median of `--repeat` (3) runs;
- before every run (untimed) the worker's heap is collected and frozen (`gc.collect()`, `gc.freeze()`),
  so a run pays for the garbage collections of its own objects only. Without it, CPython's full
  collection, which walks the ~250,000 objects of the imported libraries (~150 ms here, the same
  at 1k and 100k), fell into whichever run happened to cross its allocation threshold: one
  scenario's timed run at one size and its untimed warm-up at the other (issue 27's PostgreSQL
  "review language order=largest_gap" 23 -> 163 ms and "corrections" 65 -> 211 ms with one timed
  run per process). A server pays that collection now and then at any size: it is no cost of the
  data, and `gc_seconds` (the collections inside a timed run, in `--json`) still shows the ones a
  render's own objects cause.

Analytics also reports the server's memory: the peak proportional set size (PSS, so pages that
forked children share are counted once) of the worker process plus its children (DuckDB runs
SQLite scans in a forked worker), sampled every 50 ms during its renders, and the same after them.

Prints seconds per scenario and size and the ratio to the smallest size (goal: every page ≤ 1.5),
then the same for the worker's CPU seconds, which other jobs on a shared machine disturb far less
(but which leave out work done in DuckDB's forked worker). On PostgreSQL that figure adds the CPU
of the server processes serving the bench database (a local server: read from /proc before and
after each render, `bench.common.backend_cpu`), where a render's queries run; so no other client
may use that database while the bench runs.
A page that raises prints its error instead of a time. Wall clock on a shared machine: run with
`nice` and expect noise from other jobs; `--repeat 5` narrows it.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    OUT,
    backend_cpu,
    label,
    parse_size,
    parse_sizes,
    pg_database,
    sqlite_database,
)

JUDGMENTS_PER_EVALUATION = 10
PAGE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Scenario:
    """One page render: the page file, its query parameters and preset session state."""

    name: str
    page: str
    query: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    rss: bool = False
    reviewer: str = "bench"


@dataclass(frozen=True)
class Context:
    """What the scenarios' values are read from: the database being measured (filter menus, dates,
    ids), so that every value exists at any size. None of it is timed."""

    evaluations: int
    products: list[str]
    languages: list[str]
    models: list[str]
    categories: list[str]
    metrics: list[str]
    first_day: date
    last_day: date
    judgments: dict[str, list[str]]  # the Corrections page's menus
    queue: dict[str, list[str]]  # the Review page's menus
    note_languages: list[str]
    note_sessions: list[str]
    reviewer: str  # someone with decisions to undo (the Review page reads their latest ones)
    change_id: str  # a judgment with an audit trail (history, undo)


def read_context(url: str, evaluations: int) -> Context:
    """The menus and values the pages would offer on this database (through lib, as the pages read them)."""
    from sqlalchemy import func
    from sqlmodel import select

    from bench import gen
    from lib import corrections, inspector, notes, review_queue
    from lib.db import create_db_engine, session_scope
    from lib.models import EvaluationSnapshot, JudgmentEvent

    engine = create_db_engine(url)
    try:
        with session_scope(engine, read_only=True) as session:
            options = inspector.filter_options(session=session)
            first, last = session.exec(
                select(func.min(EvaluationSnapshot.created_at), func.max(EvaluationSnapshot.created_at))
            ).one()
            # A judgment whose trail holds more than one decision (an undo, or another reviewer's).
            trail = session.exec(
                select(JudgmentEvent.change_id)
                .where(JudgmentEvent.action == corrections.UNDO_ACTION)
                .order_by(JudgmentEvent.id)
                .limit(1)
            ).first()
            return Context(
                evaluations=evaluations,
                products=options.products,
                languages=options.languages,
                models=options.models,
                categories=options.categories,
                metrics=list(options.metrics),
                first_day=_as_date(first),
                last_day=_as_date(last),
                judgments=corrections.filter_options(session=session),
                queue=review_queue.queue_options(session=session),
                note_languages=notes.note_languages(session=session),
                note_sessions=notes.recent_session_ids(session=session),
                reviewer=gen.REVIEWERS[0],
                change_id=trail or f"snap_{evaluations // 2:07d}:{gen.METRICS[0]}",
            )
    finally:
        engine.dispose()


def _as_date(value: Any) -> date:
    return (
        (value or datetime(2025, 1, 1)).date()
        if not isinstance(value, str)
        else date.fromisoformat(value[:10])
    )


@dataclass(frozen=True)
class Option:
    """One value a page offers for one of its filters: `label` names it in the scenario, `value`
    reads it from the database's `Context` (menus hold different values at different sizes)."""

    name: str  # the filter (a field of the page's filter dataclass)
    label: str
    value: Callable[[Context], Any]
    group: str = ""  # options of one widget (the Notes page's Age sets since or until): never paired

    @property
    def widget(self) -> str:
        return self.group or self.name


def _last(menu: str) -> Callable[[Context], Any]:
    """The last entry of one of the page's menus (any entry would do; the last is the same at every size)."""
    return lambda ctx: getattr(ctx, menu)[-1]


def _choices(name: str, labels: Mapping[str, str]) -> list[Option]:
    """Every choice of a select box but its "any" entry, from the page's own choice dict."""
    return [Option(name, f"{name}={key}", lambda _ctx, key=key: key) for key in labels if key != "any"]


def evaluation_options() -> list[Option]:
    """Every filter of the Evaluations page (`inspector.EvaluationFilters`, but its sort), with the
    values a reviewer picks: each choice of a select box, a menu's value, dates near both ends of the
    data, a common and a rare text, the archived list. A new filter field fails here until it is given
    values, so it cannot go unmeasured."""
    from lib import inspector

    values: dict[str, list[Option]] = {
        "product": [Option("product", "product", _last("products"))],
        "language": [Option("language", "language", _last("languages"))],
        "model": [Option("model", "model", _last("models"))],
        "category": [Option("category", "category", _last("categories"))],
        "metric": [Option("metric", "metric", _last("metrics"))],
        "min_gap": [
            Option("min_gap", "min_gap=2", lambda _ctx: 2.0),
            Option("min_gap", f"min_gap={inspector.MAX_GAP:g}", lambda _ctx: inspector.MAX_GAP),
        ],
        "review": _choices("review", inspector.REVIEW_STATES),
        "evidence": _choices("evidence", inspector.EVIDENCE_STATES),
        "date_from": [
            Option("date_from", "from=last 30 days", lambda ctx: ctx.last_day - timedelta(days=30))
        ],
        "date_to": [Option("date_to", "to=first 30 days", lambda ctx: ctx.first_day + timedelta(days=30))],
        # gen.py's questions: this phrase opens a fifth of them; "(case N" names one (or a few).
        "text": [
            Option("text", "text=common", lambda _ctx: "reset my password"),
            Option("text", "text=rare", lambda ctx: f"(case {ctx.evaluations // 3}"),
        ],
        "archived": [Option("archived", "archived", lambda _ctx: True)],
    }
    return _for_fields(inspector.EvaluationFilters, values, skip={"sort"})


def _for_fields(
    filters: type, values: Mapping[str, list[Option]], *, skip: Collection[str] = ()
) -> list[Option]:
    """The options of every field of a page's filter dataclass, in field order; a field without
    benchmark values raises (add it to the page's table in this script)."""
    missing = [f.name for f in fields(filters) if f.name not in values and f.name not in skip]
    if missing:
        raise KeyError(f"bench_pages.py has no values for {filters.__name__} field(s) {', '.join(missing)}")
    return [option for f in fields(filters) if f.name not in skip for option in values[f.name]]


def _alone_and_in_pairs(options: list[Option]) -> list[tuple[Option, ...]]:
    """Every option alone, then every pair of options of two different filters."""
    pairs = [(a, b) for a, b in itertools.combinations(options, 2) if a.widget != b.widget]
    return [(o,) for o in options] + pairs


def correction_options() -> list[Option]:
    """Every filter of the Corrections list (`corrections.JudgmentFilter`)."""
    from lib import corrections

    values = {
        "product": [Option("product", "product", lambda ctx: ctx.judgments["products"][-1])],
        "metric": [Option("metric", "metric", lambda ctx: ctx.judgments["metrics"][-1])],
        "state": [Option("state", f"state={s}", lambda _ctx, s=s: s) for s in corrections.REVIEW_STATES],
        "reviewer": [Option("reviewer", "reviewer", lambda ctx: ctx.judgments["reviewers"][-1])],
    }
    return _for_fields(corrections.JudgmentFilter, values)


# The Notes page's widgets for each `notes.NoteFilter` field: (session-state key, value as the widget holds it).
NOTE_WIDGETS: dict[str, str] = {
    "query": "notes_query",
    "note_type": "notes_types",
    "language": "notes_language",
    "session_id": "notes_session",
    "since": "notes_age",
    "until": "notes_age",
}


def note_options() -> list[Option]:
    """Every filter of the Notes page (`notes.NoteFilter`): a word, each type, a language, a
    session, each age (since / until are the page's Age choices)."""
    from lib import notes
    from lib.models import NOTE_TYPES

    ages = {label: span for label, span in notes.AGES.items() if span != (None, None)}
    values = {
        "query": [Option("query", "text", lambda _ctx: "refund")],
        "note_type": [Option("note_type", f"type={t}", lambda _ctx, t=t: [t]) for t in NOTE_TYPES],
        "language": [Option("language", "language", lambda ctx: ctx.note_languages[-1])],
        "session_id": [Option("session_id", "session", lambda ctx: ctx.note_sessions[0])],
        "since": [
            Option("since", f"age={a}", lambda _ctx, a=a: a, "age") for a, (new, _o) in ages.items() if new
        ],
        "until": [
            Option("until", f"age={a}", lambda _ctx, a=a: a, "age") for a, (_n, old) in ages.items() if old
        ],
    }
    return _for_fields(notes.NoteFilter, values)


def queue_options() -> list[Option]:
    """Every filter of the Review page's queue (`review_queue.QueueFilter`, but its order)."""
    from lib import review_queue

    values = {
        name: [Option(name, name, lambda ctx, menu=f"{name}s": ctx.queue[menu][-1])]
        for name in ("product", "metric", "language")
    }
    return _for_fields(review_queue.QueueFilter, values, skip={"order"})


DEEP_PAGE = 400


def filter_scenarios(ctx: Context | None) -> list[Scenario]:
    """Every filter the Evaluations, Corrections, Notes and Review pages offer, alone and in pairs,
    with every sort (order), and page 400 of each filter alone and of each sort unfiltered (issue 27).
    Without a context: the names only (`--list`)."""
    from lib import inspector, review_queue

    found: list[Scenario] = []

    def value(option: Option) -> Any:
        return option.value(ctx) if ctx is not None else None

    def name(page: str, picked: tuple[Option, ...], extra: str = "") -> str:
        return " ".join([page, *(o.label for o in picked), *([extra] if extra else [])])

    # Evaluations: the URL carries the filters (inspector.to_params), the page number too.
    for picked in [(), *_alone_and_in_pairs(evaluation_options())]:
        for sort in inspector.SORTS:
            sorted_by = "" if sort == "newest" else f"sort={sort}"
            query = {}
            if ctx is not None:
                chosen = {o.name: value(o) for o in picked}
                query = inspector.to_params(inspector.EvaluationFilters(**chosen, sort=sort))
            if picked or sort != "newest":
                found.append(Scenario(name("evaluations", picked, sorted_by), "pages/evaluations.py", query))
            if len(picked) < 2 and (sort == "newest" or not picked):
                deep = {**query, "page": str(DEEP_PAGE)}
                found.append(Scenario(name("evaluations", picked, f"{sorted_by} page={DEEP_PAGE}".strip()),
                                      "pages/evaluations.py", deep))  # fmt: skip
    # Corrections: the filters are its deep-link parameters (corrections.filter_params).
    for picked in [(), *_alone_and_in_pairs(correction_options())]:
        query = {o.name: str(value(o)) for o in picked} if ctx else {}
        if picked:
            found.append(Scenario(name("corrections", picked), "pages/corrections.py", query))
        if len(picked) < 2:
            found.append(Scenario(name("corrections", picked, f"page={DEEP_PAGE}"), "pages/corrections.py",
                                  query, state={"corrections_page": DEEP_PAGE}))  # fmt: skip
    found.append(
        Scenario("corrections judgment history", "pages/corrections.py",
                 {"change_id": ctx.change_id} if ctx else {})
    )  # fmt: skip
    # Notes: widgets in session state; the list tab (pairs, page 400) and the timeline tab (alone).
    for picked in [(), *_alone_and_in_pairs(note_options())]:
        state = {NOTE_WIDGETS[o.name]: value(o) for o in picked}
        if picked:
            found.append(Scenario(name("notes", picked), "pages/notes.py", state=state))
        if len(picked) < 2:
            found.append(Scenario(name("notes", picked, f"page={DEEP_PAGE}"), "pages/notes.py",
                                  state={**state, "notes_page": DEEP_PAGE}))  # fmt: skip
            found.append(Scenario(name("notes", picked, "timeline"), "pages/notes.py",
                                  state={**state, "notes_tab": "Timeline"}))  # fmt: skip
    # Review: the queue's filters and order in session state, as a reviewer with decisions to undo.
    for picked in [(), *_alone_and_in_pairs(queue_options())]:
        for order in review_queue.ORDERS:
            state = {f"review_{o.name}": value(o) for o in picked} | {"review_order": order}
            found.append(Scenario(name("review", picked, f"order={order}"), "pages/review.py", state=state,
                                  reviewer=ctx.reviewer if ctx else "bench"))  # fmt: skip
    return found


def scenarios(ctx: Context | None) -> list[Scenario]:
    """Every page's default render (issue 19's table), then every filter scenario (issue 27)."""
    middle = f"snap_{(ctx.evaluations if ctx else 0) // 2:07d}"  # gen.py's ids: snap_0000000, ...
    return [
        Scenario("overview", "pages/overview.py"),
        Scenario("corrections", "pages/corrections.py"),
        Scenario("analytics", "pages/analytics.py", rss=True),
        Scenario("evaluations", "pages/evaluations.py"),
        Scenario("evaluation detail", "pages/evaluations.py", query={"snapshot": middle}),
        Scenario("review queue", "pages/review.py"),
        Scenario("notes", "pages/notes.py"),
        Scenario("tag scores", "pages/tag_scores.py"),
        Scenario("precedents", "pages/precedents.py"),
        Scenario("alignment lab", "pages/alignment.py"),
        Scenario("coach", "pages/coach.py", query={"snapshot": middle}),
        Scenario("new evaluation", "pages/new_evaluation.py"),
        Scenario("import", "pages/import_data.py"),
        Scenario("admin", "pages/admin.py"),
        *filter_scenarios(ctx),
    ]


# ---------------------------------------------------------------------------------------------
# The worker: one database, every scenario


def share_component_scan() -> None:
    """Scan installed packages for Streamlit components once per process, not once per AppTest.

    Each new AppTest scans every installed package's metadata (about 0.25 s, the same at any data
    size); timed into a 1k render that constant would flatter every ratio. The installed packages
    cannot change during a benchmark, so the first scan serves all (as in tests/pages/conftest.py).
    """
    from functools import cache

    from streamlit.components.v2 import manifest_scanner

    if not hasattr(manifest_scanner.scan_component_manifests, "cache_info"):
        manifest_scanner.scan_component_manifests = cache(manifest_scanner.scan_component_manifests)


def _tree_pss_bytes(pid: int) -> int:
    """Proportional set size of a process plus all its descendants, from /proc (Linux).

    PSS rather than RSS: forked workers share their parent's pages copy-on-write, and summing
    their RSS would count those pages once per process.
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/smaps_rollup", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(children.get(current, []))
    return total


class PeakRss:
    """Samples the memory (PSS) of this process tree in a thread; `peak` is the largest seen."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_pss_bytes(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_pss_bytes(os.getpid()))


def worker(
    url: str, evaluations: int, wanted: Callable[[str], bool], repeat: int, warm_data_cache: bool
) -> None:
    """Render every wanted scenario against `url`; one JSON line per scenario on stdout."""
    os.environ["OVERRULE_DATABASE_URL"] = url
    os.environ["OVERRULE_LOAD_DEMO"] = "false"
    import logging

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from lib import bulk
    from lib.config import reset_settings
    from lib.db import init_db

    # `render` freezes the heap for good before each run: a bulk load inside a scenario (none today)
    # must not `gc.unfreeze()` it in the middle of a timed run (`lib.bulk.frozen_heap`).
    bulk.HEAP_FROZEN_ELSEWHERE = True
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    reset_settings()
    share_component_scan()
    init_db(url).dispose()  # an older schema is migrated here, untimed
    ctx = read_context(url, evaluations)

    # PostgreSQL does a render's database work in its server processes: their CPU (read from /proc,
    # the server being local; the pool keeps its connections, so a render's backends outlive it)
    # is added to the worker's, else the process CPU alone flatters PostgreSQL.
    server = url.rpartition("/")[2].partition("?")[0] if url.startswith("postgresql") else None

    collecting: list[float] = []  # perf_counter at the start of the collection under way
    collected = [0.0]  # seconds of collections since the last reset

    def on_gc(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            collecting[:] = [time.perf_counter()]
        elif collecting:
            collected[0] += time.perf_counter() - collecting.pop()

    gc.callbacks.append(on_gc)

    def render(scenario: Scenario | None) -> tuple[float, float, str | None, float]:
        if scenario is None:
            at = AppTest.from_string("import streamlit as st\nst.write('empty')", default_timeout=60)
        else:
            at = AppTest.from_file(str(ROOT / scenario.page), default_timeout=PAGE_TIMEOUT_S)
            at.session_state["sidebar_reviewer"] = scenario.reviewer
            for key, value in scenario.query.items():
                at.query_params[key] = value
            for key, value in scenario.state.items():
                at.session_state[key] = value
        if not warm_data_cache:
            st.cache_data.clear()
        gc.collect()  # the garbage earlier runs left, untimed (the heap after them is frozen: cheap)
        gc.freeze()  # collections during the run walk only the objects it makes (see the docstring)
        before = backend_cpu(server) if server else {}
        collected[0] = 0.0
        started, cpu_started = time.perf_counter(), time.process_time()
        at.run()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        in_gc = collected[0]
        if server:
            cpu += sum(spent - before.get(pid, 0.0) for pid, spent in backend_cpu(server).items())
        error = at.exception[0].message.splitlines()[0][:200] if at.exception else None
        return elapsed, cpu, error, in_gc

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    render(None)  # warm-up: component registry, AppTest machinery, imports
    floors = [render(None) for _ in range(repeat)]
    emit(
        {
            "scenario": "(empty page)",
            "seconds": statistics.median(f[0] for f in floors),
            "cpu_seconds": statistics.median(f[1] for f in floors),
        }
    )
    for scenario in scenarios(ctx):
        if not wanted(scenario.name):
            continue
        try:
            sampler = PeakRss() if scenario.rss else None
            if sampler:
                sampler.__enter__()
            try:
                _, _, error, _ = render(scenario)  # warm-up (connections, OS page cache, imports)
                times, cpus, gcs = [], [], []
                for _ in range(repeat if error is None else 0):
                    elapsed, cpu, error, in_gc = render(scenario)
                    times.append(elapsed)
                    cpus.append(cpu)
                    gcs.append(in_gc)
                    if error:
                        break
            finally:
                if sampler:
                    sampler.__exit__()
        except Exception as exc:  # a page that cannot even start: report it, measure the others
            error, times, cpus, gcs = f"{type(exc).__name__}: {exc}"[:200], [], [], []
        record: dict[str, Any] = {"scenario": scenario.name, "times": times, "error": error}
        record["seconds"] = statistics.median(times) if times and error is None else None
        record["cpu_seconds"] = statistics.median(cpus) if cpus and error is None else None
        record["gc_seconds"] = statistics.median(gcs) if gcs and error is None else None
        if sampler:
            record["peak_rss_mib"] = round(sampler.peak / 2**20)
            record["rss_after_mib"] = round(_tree_pss_bytes(os.getpid()) / 2**20)
            record["self_max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        emit(record)


def run_worker(url: str, evaluations: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """This script as `--processes` fresh `--worker` processes on `url`, one after the other; each
    scenario's figures are the median over the processes of each one's median."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        url,
        "--evaluations",
        str(evaluations),
    ]
    command += ["--repeat", str(args.repeat)]
    for option in ("pages", "match"):
        if getattr(args, option):
            command += [f"--{option}", getattr(args, option)]
    if args.warm_data_cache:
        command.append("--warm-data-cache")
    runs: dict[str, list[dict[str, Any]]] = {}
    for process in range(args.processes):
        with (
            tempfile.TemporaryFile("w+") as errors,  # Streamlit's warnings, and why a worker failed
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True) as proc,
        ):
            assert proc.stdout is not None
            for line in proc.stdout:
                record = json.loads(line)
                runs.setdefault(record["scenario"], []).append(record)
                shown = "error: " + record["error"] if record.get("error") else f"{record['seconds']:.3f} s"
                if args.verbose:
                    print(f"    [{process + 1}] {record['scenario']:60} {shown}", flush=True)
            if proc.wait():
                errors.seek(0)
                tail = "".join(errors.readlines()[-8:])
                print(f"    worker exited with {proc.returncode}:\n{tail}", flush=True)
        print(f"    process {process + 1}/{args.processes}: {len(runs)} scenarios", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for name, records in runs.items():
        merged = dict(records[-1])
        for key in ("seconds", "cpu_seconds", "gc_seconds"):
            values = [r[key] for r in records if r.get(key) is not None]
            merged[key] = statistics.median(values) if values and len(values) == len(records) else None
        merged["error"] = next((r["error"] for r in records if r.get("error")), None)
        merged["processes"] = len(records)  # fewer than --processes when a worker failed
        results[name] = merged
    return results


# ---------------------------------------------------------------------------------------------
# Report

GOAL_RATIO = 1.5
FLAT_SECONDS = 0.05  # a render this fast at the largest size counts as flat whatever its ratio (issue 27)


def is_flat(small: float, big: float) -> bool:
    """The issue-27 rule: at most 1.5x the smallest size, or under 50 ms at the largest."""
    return big < FLAT_SECONDS or (small > 0 and big / small <= GOAL_RATIO)


def print_table(
    title: str, measured: dict[int, dict[str, dict[str, Any]]], key: str = "seconds"
) -> list[str]:
    """Seconds (`key`) per scenario and size and each size's ratio to the smallest, worst first
    (by the largest size's ratio); returns the scenarios over the goal (ratio > 1.5 and not under
    50 ms at the largest size)."""
    sizes = sorted(measured)
    base, top = sizes[0], sizes[-1]
    names: list[str] = []
    for results in measured.values():
        names += [n for n in results if n not in names]

    def worst(name: str) -> float:
        first, last = measured[base].get(name, {}).get(key), measured[top].get(name, {}).get(key)
        if first is None or last is None:
            return math.inf  # an error (or a missing size) comes first
        return last / first if first > 0 else math.inf

    head = f"| {'scenario':70} |" + "".join(f" {label(s):>8} |" for s in sizes)
    head += "".join(f" {label(s)}/{label(base)}".rjust(10) + " |" for s in sizes[1:])
    print(
        f"\n{title}\n\n{head}\n|{'-' * 72}|" + "---------:|" * len(sizes) + "---------:|" * (len(sizes) - 1)
    )
    over: list[str] = []
    for name in sorted(names, key=lambda n: (not n.startswith("("), -worst(n))):
        cells, seconds = [], {}
        for size in sizes:
            record = measured[size].get(name)
            if record is None:
                cells.append(f" {'—':>8} |")
            elif record.get(key) is None:
                cells.append(f" {'error':>8} |")
            else:
                seconds[size] = record[key]
                cells.append(f" {record[key]:>8.3f} |")
        for size in sizes[1:]:
            if size in seconds and base in seconds and seconds[base] > 0:
                ratio = seconds[size] / seconds[base]
                flat = is_flat(seconds[base], seconds[size])
                cells.append(f" {ratio:>8.2f}{'x' if flat else '!'} |")
                if size == top and not flat and not name.startswith("("):
                    over.append(f"{name} ({ratio:.1f}x)")
            else:
                cells.append(f" {'—':>9} |")
                if size == top and not name.startswith("("):
                    over.append(f"{name} (error)")
        print(f"| {name:70} |" + "".join(cells))
    print(
        f"\nover the goal ({key}: ratio > {GOAL_RATIO} and {FLAT_SECONDS * 1000:.0f} ms or more at "
        f"{label(top)}; marked !): {len(over)} of {len(names) - 1}" + (": " + ", ".join(over) if over else "")
    )
    if key == "seconds":
        for size in sizes:
            for name, record in measured[size].items():
                if "peak_rss_mib" in record:
                    print(
                        f"{name} at {label(size)}: server memory peak {record['peak_rss_mib']:,} MiB PSS "
                        "(process + children), "
                        f"{record['rss_after_mib']:,} MiB after; the worker's own peak RSS so far "
                        f"{record['self_max_rss_mib']:,} MiB"
                    )
                if record.get("error"):
                    print(f"{name} at {label(size)}: {record['error']}")
    return over


Tables = list[tuple[str, dict[int, dict[str, dict[str, Any]]]]]


def load_results(paths: list[Path]) -> tuple[Tables, list[dict[str, Any]]]:
    """Merge several `--json` files into tables as measured ones, so a sitting's runs (one page per
    run, a re-run of the worst with more processes) print and tabulate as if measured together.
    A later file's figure replaces an earlier one's for the same backend, size and scenario; a
    backend measured at other sizes (e.g. notes at 1k and 200k) stays a table of its own. Returns
    the tables and each file's run facts (`_run`, or the file's time when it predates them)."""
    tables: Tables = []
    runs: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(path.read_text())
        written = datetime.fromtimestamp(path.stat().st_mtime).astimezone().isoformat(timespec="seconds")
        run = dict(data.get("_run") or {"written": written})
        runs.append({"file": str(path), **run})
        for backend, by_size in data.items():
            if backend.startswith("_"):
                continue
            sizes = sorted(int(s) for s in by_size)
            found = next((m for b, m in tables if b == backend and sorted(m) == sizes), None)
            if found is None:
                found = {size: {} for size in sizes}
                tables.append((backend, found))
            for size, results in by_size.items():
                found[int(size)].update(results)
    return tables, runs


def markdown_table(tables: Tables, key: str = "cpu_seconds", top: int | None = None, link: str = "") -> str:
    """The worst-first Markdown table of every scenario over every backend: its smallest and
    largest size, the time at each (`key`, in ms; the CPU figure beside it), the ratio and whether
    it is flat by the issue-27 rule; the scenarios over the goal first, then by ratio. `top` keeps
    the worst rows; the counts per backend above the table cover all of them. A scenario in
    several tables of one backend keeps the later table's figures, as `load_results` merges."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for backend, measured in tables:
        for name in {n for results in measured.values() for n in results}:
            if name.startswith("("):
                continue
            sizes = [s for s in sorted(measured) if name in measured[s]]
            small, big = measured[sizes[0]][name], measured[sizes[-1]][name]
            row: dict[str, Any] = {"scenario": name, "backend": backend, "sizes": (sizes[0], sizes[-1])}
            for field_ in ("seconds", "cpu_seconds"):
                a, b = small.get(field_), big.get(field_)
                row[field_] = (a, b)
                row[field_ + "_flat"] = None if a is None or b is None or len(sizes) < 2 else is_flat(a, b)
                row[field_ + "_ratio"] = b / a if a and b is not None else math.inf
            rows[(backend, name)] = row
    ordered = sorted(
        rows.values(), key=lambda r: (r[key + "_flat"] is not False, -r[key + "_ratio"], r["scenario"])
    )
    other = "cpu_seconds" if key == "seconds" else "seconds"
    what, beside = ("wall", "CPU") if key == "seconds" else ("CPU", "wall")
    lines = []
    for backend in dict.fromkeys(r["backend"] for r in ordered):
        mine = [r for r in ordered if r["backend"] == backend]
        over = [r for r in mine if r[key + "_flat"] is False]
        over_other = [r for r in mine if r[other + "_flat"] is False]
        unmeasured = [r for r in mine if r[key + "_flat"] is None]
        lines.append(
            f"- {backend}: {len(mine)} scenarios, **{len(over)} over the goal** by {what} time"
            f" ({len(over_other)} by {beside} time)"
            + (f", {len(unmeasured)} without a figure at both sizes" if unmeasured else "")
            + (": " + ", ".join(f"{r['scenario']} ({r[key + '_ratio']:.1f}x)" for r in over) if over else "")
        )
    lines += [
        "",
        f"| scenario | backend | sizes | {what} ms small | {what} ms big | ratio | flat | "
        f"{beside} ms small | {beside} ms big | {beside} ratio |",
        "|---|---|---|--:|--:|--:|---|--:|--:|--:|",
    ]

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.1f}"

    def ratio(value: float) -> str:
        return "—" if math.isinf(value) else f"{value:.2f}x"

    for r in ordered[:top]:
        flat = {True: "yes", False: "**no**", None: "—"}[r[key + "_flat"]]
        name = f"[{r['scenario']}]({link})" if link else r["scenario"]
        lines.append(
            f"| {name} | {r['backend']} | {label(r['sizes'][0])} → {label(r['sizes'][1])} | "
            f"{ms(r[key][0])} | {ms(r[key][1])} | {ratio(r[key + '_ratio'])} | {flat} | "
            f"{ms(r[other][0])} | {ms(r[other][1])} | {ratio(r[other + '_ratio'])} |"
        )
    if top is not None and len(ordered) > top:
        lines.append(f"\n(the worst {top} of {len(ordered)} rows)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Build missing databases, measure each in worker processes, print the tables."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=parse_sizes, default=parse_sizes("1k,100k"), help="SQLite sizes, e.g. 1k,100k,1m"
    )
    parser.add_argument(
        "--db-dir", type=Path, default=OUT, help="where SQLite databases are built and reused"
    )
    parser.add_argument(
        "--db",
        action="append",
        default=[],
        metavar="SIZE=FILE",
        help="use this SQLite file for a size (e.g. 1m=/work/bench-data/x.db) instead of the cached one; "
        "an older schema is migrated to head when the worker opens it (untimed)",
    )
    parser.add_argument(
        "--pg", metavar="ADMIN_URL", help="also measure PostgreSQL (databases built on this server)"
    )
    parser.add_argument("--pg-sizes", type=parse_sizes, default=parse_sizes("1k,100k"))
    parser.add_argument(
        "--pg-db",
        action="append",
        default=[],
        metavar="SIZE=URL",
        help="use this PostgreSQL database for a size (e.g. 200k=postgresql://…/notes_big) instead of "
        "building one on --pg's server; measures PostgreSQL without --pg",
    )
    parser.add_argument("--pages", help="comma-separated scenario names (default: all)")
    parser.add_argument("--match", help="only scenarios whose name contains this text (e.g. 'evaluations')")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per scenario and process (median)")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="fresh worker processes per database (median of their medians)",
    )
    parser.add_argument("--warm-data-cache", action="store_true", help="keep st.cache_data between runs")
    parser.add_argument("--no-build", action="store_true", help="fail instead of building a missing database")
    parser.add_argument("--list", action="store_true", help="print the scenario names and exit")
    parser.add_argument("--verbose", action="store_true", help="print each scenario's time as it is measured")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument(
        "--from-json",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="measure nothing: print the tables of these --json files merged (repeatable; a later "
        "file's figure replaces an earlier one's for the same backend, size and scenario)",
    )
    parser.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the worst-first Markdown table of every backend to FILE ('-' prints it)",
    )
    parser.add_argument("--markdown-top", type=int, help="keep the worst N rows of the Markdown table")
    parser.add_argument(
        "--markdown-key",
        choices=("seconds", "cpu_seconds"),
        default="cpu_seconds",
        help="the figure the Markdown table ranks and judges by: CPU (default; other jobs on a shared "
        "machine disturb it far less) or wall seconds",
    )
    parser.add_argument("--markdown-link", default="", help="link every scenario of the Markdown table here")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--evaluations", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = {n.strip() for n in args.pages.split(",")} if args.pages else None

    def wanted(name: str) -> bool:
        return (names is None or name in names) and (not args.match or args.match in name)

    known = [s.name for s in scenarios(None)]
    if args.list:
        print("\n".join(n for n in known if wanted(n)))
        return 0
    if args.worker:
        worker(args.worker, args.evaluations, wanted, args.repeat, args.warm_data_cache)
        return 0
    if names is not None and (unknown := names - set(known)):
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))} (see --list)")

    given: dict[int, str] = {}
    for item in args.db:
        size, _, path = item.partition("=")
        if not path or not Path(path).is_file():
            parser.error(f"--db {item}: expected SIZE=FILE with an existing file")
        given[parse_size(size)] = f"sqlite:///{Path(path).resolve()}"

    def sqlite_url(size: int) -> str:
        return given.get(size) or sqlite_database(args.db_dir, size, build=not args.no_build)

    pg_given: dict[int, str] = {}
    for item in args.pg_db:
        size, _, url = item.partition("=")
        if not url.startswith("postgresql"):
            parser.error(f"--pg-db {item}: expected SIZE=postgresql://...")
        pg_given[parse_size(size)] = url

    def pg_url(size: int) -> str:
        return pg_given.get(size) or pg_database(args.pg, size, build=not args.no_build)

    backends: list[tuple[str, list[int], Callable[[int], str]]] = []
    if args.from_json:
        pass  # figures come from the files: nothing is measured
    elif args.sizes:
        backends.append(("SQLite", args.sizes, sqlite_url))
    if (args.pg or pg_given) and not args.from_json:
        backends.append(("PostgreSQL", sorted(pg_given) if not args.pg else args.pg_sizes, pg_url))
    tables: Tables = []
    started, load = datetime.now().astimezone().isoformat(timespec="seconds"), os.getloadavg()
    for backend, sizes, database in backends:
        measured: dict[int, dict[str, dict[str, Any]]] = {}
        for size in sizes:
            url = database(size)
            print(f"[{backend} {label(size)}] {url}", flush=True)
            measured[size] = run_worker(url, size, args)
        tables.append((backend, measured))
    runs = [
        {
            "date": started,
            "ended": datetime.now().astimezone().isoformat(timespec="seconds"),
            "load": [round(x, 2) for x in (*load, *os.getloadavg())],
            "processes": args.processes,
            "repeat": args.repeat,
        }
    ]
    if args.from_json:
        tables, runs = load_results(args.from_json)
    if args.json:
        figures = {b: {str(s): r for s, r in m.items()} for b, m in tables}
        args.json.write_text(
            json.dumps({"_run": runs[0], **figures} if not args.from_json else figures, indent=1)
        )
    failed = 0
    for backend, measured in tables:
        over = print_table(
            f"{backend}: seconds per render (AppTest.run, median of {args.repeat} in each of "
            f"{args.processes} process(es), st.cache_data {'warm' if args.warm_data_cache else 'cleared'}) "
            "and ratio to the smallest size, worst first",
            measured,
        )
        print_table(
            f"{backend}: CPU seconds of the worker process per render (less sensitive to other jobs; "
            "work in DuckDB's forked worker is not counted"
            + (
                "; the PostgreSQL server processes serving the database are"
                if backend == "PostgreSQL"
                else ""
            )
            + "), worst first",
            measured,
            key="cpu_seconds",
        )
        failed += len(over)
    if args.markdown:
        facts = "".join(
            f"- {run.get('file', 'this run')}: "
            + (
                f"{run['date']}"
                if run.get("date")
                else f"written {run['written']} (date and load not recorded)"
            )
            + (f" to {run['ended']}" if run.get("ended") else "")
            + (
                f", load {run['load'][0]:.1f} at the start, {run['load'][3]:.1f} at the end"
                if run.get("load")
                else ""
            )
            + (f", {run['processes']} process(es) × {run['repeat']}" if run.get("processes") else "")
            + "\n"
            for run in runs
        )
        text = markdown_table(tables, args.markdown_key, args.markdown_top, args.markdown_link)
        text = text + "\nRuns:\n\n" + facts
        if args.markdown == "-":
            print("\n" + text)
        else:
            Path(args.markdown).write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
