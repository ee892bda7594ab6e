"""OTLP receiver benchmark (issue 29): ingesting N evaluations with 5 evaluation events each over
OTLP/HTTP vs pushing the same evaluations as JSONL to `POST /api/v1/evaluations`. Goal: OTLP at
least 0.8x the JSONL push's speed.

    python bench/bench_otlp.py [--evaluations 10000] [--batch 512] [--runs 3] [--skip-logs] [--pg ADMIN_URL]
    python bench/bench_otlp.py --runs 3 --skip-logs --existing bench/out/existing/pages_100k_0027_g7.db

The same N judged answers (5 metrics each), each case into a fresh SQLite file (or, with `--pg`, a
fresh PostgreSQL database) behind the API under uvicorn on 127.0.0.1, bodies built before the clock
starts, in request sizes compared like for like. With `--existing FILE` each case starts instead
from a copy of FILE (a `bench/gen.py` SQLite database: a running Overrule that already holds data),
made before the clock starts; FILE itself is only read. Copy a shared read-only database to a
folder of your own first: the copy per case is a plain file copy, so FILE must have no pending WAL.
What changes with data already there: a large load into a small table builds its secondary
indexes once after the load (`lib.bulk.worth_deferring`: at least 50,000 new judgments and at
least half the judgments already stored), so the one 10,000-record JSONL POST defers on an empty
database or the 1k file (10,000 judgments) and not on the 100k one (1,000,000); the bench prints
which. The cases:

- one request: the N records as one JSON Lines body vs the N spans in one OTLP request (what the
  SDK sends when its BatchSpanProcessor is given `max_export_batch_size` >= N: docs/opentelemetry.md);
- `--batch` a request (default 512, the BatchSpanProcessor's default batch): JSONL posts of that
  many records vs OTLP requests of that many spans;
- the evaluations as log records (unless `--skip-logs`): the SDK emits a `gen_ai.evaluation.result`
  event as a LOG record and exports spans and logs in separate requests, so each call arrives in
  two halves and the first waits in `otlp_spans` for the second. Four cases, each compared with
  the JSONL posts of the same size: the spans (without events) first, then the 5 events per span
  as log records (`/v1/logs`), and the log records first, then the spans; each with the records
  in the span's context, and naming the call's `gen_ai.response.id` instead (no span context:
  docs/opentelemetry.md's example, a judge running after the call's span has ended). The SDK's log
  processor exports at most 512 records (the verdicts of ~102 calls) a request, so its requests
  are five times as many as the spans', and a call's five verdicts often straddle two of them; a
  fifth case sends the spans then the logs in requests of `--batch` x 5 records (the verdicts of
  as many calls as a span request holds: `OTEL_BLRP_MAX_EXPORT_BATCH_SIZE`, docs/opentelemetry.md).

OTLP spans are the OpenTelemetry SDK's own (GenAI attributes with question and answer, 5
`gen_ai.evaluation.result` span events each), encoded by the SDK's OTLP encoder.

Printed: median wall and process CPU seconds of each case over `--runs` interleaved rounds (client
and server share the process; before each the heap is collected and frozen, as the app's server
freezes its start-up heap: `server_heap`), the CPU of every run, and every
pair's speed ratio (JSONL CPU / OTLP CPU: above 1 is faster) with each run's ratio, then the issue's
literal reading too: OTLP in `--batch` requests against the one JSONL POST. On PostgreSQL the CPU
also counts the server backends of the run's connections (read from /proc before they close), since
there the database's work is not in this process.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk._logs import LoggerProvider  # noqa: E402
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from sqlalchemy import Engine, func, select  # noqa: E402
from sqlmodel import Session  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402

from bench.common import OUT, drop_pg_database, fresh_pg_database, fresh_sqlite_url, serve_asgi  # noqa: E402
from lib import bulk  # noqa: E402
from lib.api import API_PREFIX, create_app, otlp_root_routes  # noqa: E402
from lib.auth import system_actor  # noqa: E402
from lib.bulk import worth_deferring  # noqa: E402
from lib.db import init_db  # noqa: E402
from lib.models import EvaluationSnapshot, Judgment  # noqa: E402
from lib.tokens import create_token  # noqa: E402

METRICS = ("truthfulness", "helpfulness", "safety", "clarity", "consistency")
PRODUCT = "tutor"
EVENT = "gen_ai.evaluation.result"
GOAL = 0.8  # issue 29: OTLP ingest at least 0.8x the speed of the JSONL API push


def question(i: int) -> str:
    return f"Question {i}: who received the 1921 Nobel Prize in Physics, and for what?"


def answer(i: int) -> str:
    return f"Albert Einstein, for his explanation of the photoelectric effect ({i})."


def score(i: int, m: int) -> int:
    return 1 + (i * 7 + m * 3) % 5


def jsonl_bodies(n: int, batch: int | None) -> list[bytes]:
    lines = [
        json.dumps(
            {
                "question": question(i),
                "model_answer": answer(i),
                "product": PRODUCT,
                "model_name": "bench-model",
                "judge_scores": {
                    metric: {"score": score(i, m), "reason": f"{metric} reason {i}"}
                    for m, metric in enumerate(METRICS)
                },
            }
        )
        + "\n"
        for i in range(n)
    ]
    size = batch or n
    return ["".join(lines[i : i + size]).encode() for i in range(0, n, size)]


def _span_attributes(i: int) -> dict[str, object]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "bench-model",
        "gen_ai.response.model": "bench-model",
        "gen_ai.response.id": f"chatcmpl-{i}",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": question(i)}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [
                {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": answer(i)}],
                    "finish_reason": "stop",
                }
            ]
        ),
    }


def _verdict(i: int, m: int, metric: str) -> dict[str, object]:
    return {
        "gen_ai.evaluation.name": metric,
        "gen_ai.evaluation.score.value": score(i, m),
        "gen_ai.evaluation.explanation": f"{metric} reason {i}",
    }


def finished_spans(n: int, *, events_as_logs: bool, by_response: bool = False) -> tuple[list, list]:
    """(finished spans, log records) of N instrumented calls, as the SDK hands them to its exporters.

    Log records (`events_as_logs`) are emitted in the judged span's context, or with `by_response`
    outside any span, naming the call's `gen_ai.response.id` (docs/opentelemetry.md's example).

    The providers are not kept alive for an exit hook (`shutdown_on_exit`): once the caller drops
    the spans, nothing of them stays on the heap, which every case's garbage collections would
    otherwise walk (the JSONL cases' too), as no server's heap would hold its clients' spans."""
    resource = Resource.create({"service.name": PRODUCT})
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracer_provider.get_tracer("bench")
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    logger = logger_provider.get_logger("judge")
    for i in range(n):
        with tracer.start_as_current_span("chat bench-model", attributes=_span_attributes(i)) as span:
            if not events_as_logs:
                for m, metric in enumerate(METRICS):
                    span.add_event(EVENT, _verdict(i, m, metric))
        if events_as_logs and by_response:
            for m, metric in enumerate(METRICS):
                named = {**_verdict(i, m, metric), "gen_ai.response.id": f"chatcmpl-{i}"}
                logger.emit(event_name=EVENT, attributes=named)
        elif events_as_logs:
            context = trace.set_span_in_context(trace.NonRecordingSpan(span.get_span_context()))
            for m, metric in enumerate(METRICS):
                logger.emit(event_name=EVENT, context=context, attributes=_verdict(i, m, metric))
    return list(spans.get_finished_spans()), list(logs.get_finished_logs())


def encoded(items: list, batch: int, encoder: Callable[[list], Any]) -> list[bytes]:
    """The items in `batch`-sized OTLP/HTTP protobuf bodies, as the SDK's exporter encodes each export
    (a BatchSpanProcessor hands its exporter at most `max_export_batch_size` spans at a time)."""
    return [encoder(items[i : i + batch]).SerializeToString() for i in range(0, len(items), batch)]


PG_ADMIN: str | None = None  # --pg: measure on PostgreSQL
EXISTING: Path | None = None  # --existing: every case starts from a copy of this SQLite file


def fresh(name: str) -> Engine:
    """The case's starting database: empty, or a copy of `EXISTING` (copied before any clock starts)."""
    if PG_ADMIN:
        return init_db(fresh_pg_database(PG_ADMIN, name.removesuffix(".db")))
    url = fresh_sqlite_url(OUT / name)
    if EXISTING is not None:
        shutil.copyfile(EXISTING, OUT / name)
    return init_db(url)


def discard(name: str) -> None:
    """Remove a case's SQLite file once measured (with `--existing` each is a copy of a large file)."""
    if EXISTING is not None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{OUT / name}{suffix}").unlink(missing_ok=True)


def held(engine: Engine) -> tuple[int, int]:
    """(evaluations, judgments) the database holds."""
    with Session(engine) as session:
        evaluations = session.execute(select(func.count()).select_from(EvaluationSnapshot)).scalar_one()
        judgments = session.execute(select(func.count()).select_from(Judgment)).scalar_one()
    return evaluations, judgments


def existing_copy(path: Path) -> Path:
    """`path`, checked: a SQLite file whose every committed page is in the file itself (a plain copy
    of a database with a non-empty WAL beside it would miss what the WAL holds)."""
    if not path.is_file():
        raise SystemExit(f"--existing {path}: no such file")
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise SystemExit(f"--existing {path}: {wal} is not empty; checkpoint a copy of your own first")
    return path


def server_cpu(engine: Engine) -> float:
    """CPU seconds of the PostgreSQL backends serving this database (0 on SQLite: in-process)."""
    if engine.dialect.name != "postgresql":
        return 0.0
    import os

    with engine.connect() as conn:
        pids = (
            conn.exec_driver_sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            .scalars()
            .all()
        )
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # not on this machine, or gone
        total += int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def serve(engine: Engine) -> tuple[str, str, uvicorn.Server, threading.Thread]:
    with Session(engine) as session:
        _, secret = create_token(session=session, actor=system_actor(), name="bench", role="lead")
        session.commit()
    api = create_app(engine, max_body_mb=10_000, max_json_mb=1_000)
    app = Starlette(routes=[Mount(API_PREFIX, app=api), *otlp_root_routes(api)])
    base, server, thread = serve_asgi(app)
    return base, secret, server, thread


@contextmanager
def server_heap() -> Iterator[None]:
    """The heap as the app's server keeps it (`lib.ui.server.freeze_imported_heap`): what exists
    when the case starts (the app, its modules, the bodies to send) is collected and frozen, and
    `lib.bulk` is told so (`HEAP_FROZEN_ELSEWHERE`), as the server's launcher does; undone after.

    Every case starts on a collected heap (none pays for garbage an earlier one left). Without
    the freeze, `lib.bulk.frozen_heap` froze and unfroze the heap around each load, which the
    server, whose heap is frozen at start, never does: the bench measured another collector."""
    gc.collect()
    gc.freeze()
    bulk.HEAP_FROZEN_ELSEWHERE = True
    try:
        yield
    finally:
        bulk.HEAP_FROZEN_ELSEWHERE = False
        gc.unfreeze()


def run(name: str, posts: Callable[[str], list[tuple[str, bytes, str]]], n: int) -> tuple[float, float]:
    """(wall, CPU) seconds to send every body in order; then checks every evaluation and judgment is in."""
    engine = fresh(f"bench_otlp_{name}.db")
    start = held(engine) if EXISTING is not None else (0, 0)
    base, secret, server, thread = serve(engine)
    requests = posts(base)
    server_before = server_cpu(engine)
    try:
        with server_heap(), httpx.Client(timeout=3600, headers={"Authorization": f"Bearer {secret}"}) as http:
            cpu, wall = time.process_time(), time.perf_counter()
            for url, body, content_type in requests:
                response = http.post(url, content=body, headers={"Content-Type": content_type})
                assert response.status_code == 200, response.text[:500]
                if content_type == "application/x-protobuf":
                    assert b"rejected" not in response.content and len(response.content) == 0, (
                        response.content
                    )
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            cpu += server_cpu(engine) - server_before
    finally:
        server.should_exit = True
        thread.join()
    evaluations, judgments = held(engine)
    added = (evaluations - start[0], judgments - start[1])
    assert added == (n, n * len(METRICS)), (name, start, evaluations, judgments)
    engine.dispose()
    if PG_ADMIN:
        drop_pg_database(PG_ADMIN, f"bench_otlp_{name}")
    else:
        discard(f"bench_otlp_{name}.db")
    return wall, cpu


Post = tuple[str, bytes, str]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=10_000)
    parser.add_argument(
        "--batch", type=int, default=512, help="spans (or JSONL records) per request (the SDK's default: 512)"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="rounds of every case, interleaved; medians reported"
    )
    parser.add_argument("--skip-logs", action="store_true", help="leave out the spans-then-log-events case")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL: measure there instead of SQLite")
    parser.add_argument(
        "--existing",
        type=Path,
        default=None,
        metavar="FILE",
        help="start every case from a copy of this SQLite database (e.g. a bench/gen.py file) instead of an empty one",
    )
    args = parser.parse_args(argv)
    global PG_ADMIN, EXISTING
    if args.existing is not None and args.pg:
        parser.error("--existing is a SQLite file; it cannot be combined with --pg")
    PG_ADMIN = args.pg
    EXISTING = existing_copy(args.existing) if args.existing is not None else None
    n, batch = args.evaluations, args.batch
    spans, _ = finished_spans(n, events_as_logs=False)
    bodies = {
        "jsonl one": jsonl_bodies(n, None),
        "jsonl batch": jsonl_bodies(n, batch),
        "otlp one": encoded(spans, n, encode_spans),
        "otlp batch": encoded(spans, batch, encode_spans),
    }
    if not args.skip_logs:
        bare_spans, records = finished_spans(n, events_as_logs=True)
        bodies["bare spans"] = encoded(bare_spans, batch, encode_spans)
        bodies["logs"] = encoded(records, batch, encode_logs)
        bodies["logs by call batch"] = encoded(records, batch * len(METRICS), encode_logs)
        bare_spans, records = finished_spans(n, events_as_logs=True, by_response=True)
        bodies["bare spans by response"] = encoded(bare_spans, batch, encode_spans)
        bodies["logs by response"] = encoded(records, batch, encode_logs)
        del bare_spans, records
    del spans
    jsonl_type, proto = "application/x-ndjson", "application/x-protobuf"
    evaluations_url = API_PREFIX + "/evaluations"

    def posts(*parts: tuple[str, str, str]) -> Callable[[str], list[Post]]:
        return lambda base: [(base + url, b, kind) for key, url, kind in parts for b in bodies[key]]

    jsonl, traces, logs = (evaluations_url, jsonl_type), ("/v1/traces", proto), ("/v1/logs", proto)
    one, some = "one request", f"{batch} a request"
    cases: dict[str, Callable[[str], list[Post]]] = {
        f"JSONL, {one}": posts(("jsonl one", *jsonl)),
        f"OTLP span events, {one}": posts(("otlp one", *traces)),
        f"JSONL, {some}": posts(("jsonl batch", *jsonl)),
        f"OTLP span events, {some}": posts(("otlp batch", *traces)),
    }
    two_phase = {  # case → its bodies in the order sent
        "spans then logs": (("bare spans", *traces), ("logs", *logs)),
        "logs then spans": (("logs", *logs), ("bare spans", *traces)),
        "spans then logs by response id": (("bare spans by response", *traces), ("logs by response", *logs)),
        "logs by response id then spans": (("logs by response", *logs), ("bare spans by response", *traces)),
        f"spans then logs ({batch * len(METRICS)} a log request)": (
            ("bare spans", *traces),
            ("logs by call batch", *logs),
        ),
    }
    if not args.skip_logs:
        for what, parts in two_phase.items():
            cases[f"OTLP {what}, {some}"] = posts(*parts)
    sizes = {len(b) for b in bodies["otlp one"]}
    # Warm up (imports, first queries, the encoder) on a few evaluations, unmeasured.
    warm_spans, _ = finished_spans(20, events_as_logs=False)
    warm_jsonl, warm_otlp = jsonl_bodies(20, None), encoded(warm_spans, batch, encode_spans)
    run("warm_jsonl", lambda base: [(base + evaluations_url, b, jsonl_type) for b in warm_jsonl], 20)
    run("warm_otlp", lambda base: [(base + "/v1/traces", b, proto) for b in warm_otlp], 20)
    kind = "PostgreSQL (CPU: this process + its backends)" if PG_ADMIN else "SQLite"
    print(
        f"{n} evaluations x {len(METRICS)} evaluation events, {kind}; the one OTLP request is "
        f"{max(sizes) / 1e6:.1f} MB of protobuf",
        flush=True,
    )
    engine = fresh("bench_otlp_start.db")
    with engine.connect() as conn:
        defers = worth_deferring(conn, Judgment.__table__, n * len(METRICS))  # type: ignore[attr-defined]
    start = held(engine)
    engine.dispose()
    discard("bench_otlp_start.db")
    print(
        f"starting database: {'a copy of ' + str(EXISTING) if EXISTING else 'empty'} ({start[0]:,} "
        f"evaluations, {start[1]:,} judgments); the one JSONL POST of {n:,} records "
        f"{'defers' if defers else 'does not defer'} its secondary indexes (lib.bulk.worth_deferring)",
        flush=True,
    )
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(args.runs):  # interleaved: a load change hits every case alike
        for i, (name, post) in enumerate(cases.items()):
            wall, cpu = run(f"{round_}_{i}", post, n)
            walls[name].append(wall)
            cpus[name].append(cpu)
    median = statistics.median
    print(f"{'':60} {'wall s':>8} {'CPU s':>8} {'evals/s':>9}  CPU s of each run")
    for name in cases:
        wall, cpu = median(walls[name]), median(cpus[name])
        runs = ", ".join(f"{c:.2f}" for c in cpus[name])
        print(f"{name:60} {wall:8.2f} {cpu:8.2f} {n / wall:9.0f}  {runs}")
    # Every pair, like for like first (the same request sizes on both sides), then the issue's
    # literal reading (the SDK's default batches against the one POST, the importer's best case).
    pairs = [
        (f"OTLP span events, {one}", f"JSONL, {one}", "same request sizes: one request each"),
        (f"OTLP span events, {some}", f"JSONL, {some}", f"same request sizes: {batch} a request each"),
        (f"OTLP span events, {some}", f"JSONL, {one}", f"{batch} a request vs the one JSONL POST (issue 29)"),
    ]
    if not args.skip_logs:
        pairs += [(f"OTLP {what}, {some}", f"JSONL, {some}", f"{what}, {batch} each") for what in two_phase]
    print(f"speed of OTLP vs JSONL (JSONL CPU s / OTLP CPU s; goal >= {GOAL}x):")
    for otlp_name, jsonl_name, what in pairs:
        ratio = median(cpus[jsonl_name]) / median(cpus[otlp_name])
        each = ", ".join(f"{j / o:.2f}" for j, o in zip(cpus[jsonl_name], cpus[otlp_name], strict=True))
        wall_ratio = median(walls[jsonl_name]) / median(walls[otlp_name])
        verdict = "met" if ratio >= GOAL else "NOT met"
        print(f"  {what:48} CPU {ratio:.2f}x ({verdict}; runs {each}), wall {wall_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
