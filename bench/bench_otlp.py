"""OTLP receiver benchmark (issue 29): ingesting N evaluations with 5 evaluation events each over
OTLP/HTTP vs pushing the same evaluations as JSONL to `POST /api/v1/evaluations`. Goal: OTLP at
least 0.8x the JSONL push's speed.

    python bench/bench_otlp.py [--evaluations 10000] [--batch 512] [--pg ADMIN_URL]

The same N judged answers (5 metrics each) three ways, each into a fresh SQLite file (or, with
`--pg`, a fresh PostgreSQL database) behind the API under uvicorn on 127.0.0.1, bodies built before
the clock starts:

- JSONL: the evaluation records as one JSON Lines body, one POST (the importer's best case), and
  also in `--batch`-record posts;
- OTLP spans: the OpenTelemetry SDK's spans (GenAI attributes with question and answer) with their
  5 `gen_ai.evaluation.result` span events, encoded by the SDK's OTLP encoder in `--batch`-span
  requests (the SDK's BatchSpanProcessor sends at most 512) to `/v1/traces`;
- OTLP spans then logs: the spans without events first, then the 5 events per span as log records
  in the span's context (`/v1/logs`), so every span waits in `otlp_spans` and is joined later.

Printed: wall seconds and process CPU seconds (client and server share the process) for each, and
speed ratios against the one-body JSONL push (JSONL time / OTLP time: above 1 is faster). On
PostgreSQL the CPU also counts the server backends of the run's connections (read from /proc before
they close), since there the database's work is not in this process.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

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
from lib.api import API_PREFIX, create_app, otlp_root_routes  # noqa: E402
from lib.auth import system_actor  # noqa: E402
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


def otlp_bodies(n: int, batch: int, *, events_as_logs: bool) -> tuple[list[bytes], list[bytes]]:
    """(trace bodies, log bodies) as the SDK's OTLP/HTTP exporter would send them."""
    resource = Resource.create({"service.name": PRODUCT})
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracer_provider.get_tracer("bench")
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    logger = logger_provider.get_logger("judge")
    for i in range(n):
        with tracer.start_as_current_span("chat bench-model", attributes=_span_attributes(i)) as span:
            if not events_as_logs:
                for m, metric in enumerate(METRICS):
                    span.add_event(EVENT, _verdict(i, m, metric))
        if events_as_logs:
            context = trace.set_span_in_context(trace.NonRecordingSpan(span.get_span_context()))
            for m, metric in enumerate(METRICS):
                logger.emit(event_name=EVENT, context=context, attributes=_verdict(i, m, metric))
    finished = spans.get_finished_spans()
    trace_bodies = [
        encode_spans(finished[i : i + batch]).SerializeToString() for i in range(0, len(finished), batch)
    ]
    records = logs.get_finished_logs()
    log_bodies = [
        encode_logs(records[i : i + batch]).SerializeToString() for i in range(0, len(records), batch)
    ]
    return trace_bodies, log_bodies


PG_ADMIN: str | None = None  # --pg: measure on PostgreSQL


def fresh(name: str) -> Engine:
    if PG_ADMIN:
        return init_db(fresh_pg_database(PG_ADMIN, name.removesuffix(".db")))
    return init_db(fresh_sqlite_url(OUT / name))


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


def run(name: str, posts: Callable[[str], list[tuple[str, bytes, str]]], n: int) -> tuple[float, float]:
    """(wall, CPU) seconds to send every body in order; then checks every evaluation and judgment is in."""
    engine = fresh(f"bench_otlp_{name}.db")
    base, secret, server, thread = serve(engine)
    requests = posts(base)
    server_before = server_cpu(engine)
    try:
        with httpx.Client(timeout=3600, headers={"Authorization": f"Bearer {secret}"}) as http:
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
    with Session(engine) as session:
        evaluations = session.execute(select(func.count()).select_from(EvaluationSnapshot)).scalar_one()
        judgments = session.execute(select(func.count()).select_from(Judgment)).scalar_one()
    assert (evaluations, judgments) == (n, n * len(METRICS)), (name, evaluations, judgments)
    engine.dispose()
    if PG_ADMIN:
        drop_pg_database(PG_ADMIN, f"bench_otlp_{name}")
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=512, help="spans (or JSONL records) per request")
    parser.add_argument("--skip-logs", action="store_true", help="leave out the spans-then-log-events case")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL: measure there instead of SQLite")
    args = parser.parse_args(argv)
    global PG_ADMIN
    PG_ADMIN = args.pg
    n, batch = args.evaluations, args.batch
    jsonl_one = jsonl_bodies(n, None)
    jsonl_batched = jsonl_bodies(n, batch)
    span_bodies, _ = otlp_bodies(n, batch, events_as_logs=False)
    bare_spans, log_bodies = ([], []) if args.skip_logs else otlp_bodies(n, batch, events_as_logs=True)
    jsonl_type, proto = "application/x-ndjson", "application/x-protobuf"
    evaluations_url = API_PREFIX + "/evaluations"
    cases: dict[str, Callable[[str], list[tuple[str, bytes, str]]]] = {
        "JSONL, one POST": lambda base: [(base + evaluations_url, b, jsonl_type) for b in jsonl_one],
        f"JSONL, {batch} a POST": lambda base: [
            (base + evaluations_url, b, jsonl_type) for b in jsonl_batched
        ],
        "OTLP spans with span events": lambda base: [(base + "/v1/traces", b, proto) for b in span_bodies],
        "OTLP spans, then log events": lambda base: [
            *((base + "/v1/traces", b, proto) for b in bare_spans),
            *((base + "/v1/logs", b, proto) for b in log_bodies),
        ],
    }
    # Warm up (imports, first queries, the encoder) on a few evaluations, unmeasured.
    warm_jsonl, (warm_spans, _) = jsonl_bodies(20, None), otlp_bodies(20, batch, events_as_logs=False)
    run("warm_jsonl", lambda base: [(base + evaluations_url, b, jsonl_type) for b in warm_jsonl], 20)
    run("warm_otlp", lambda base: [(base + "/v1/traces", b, proto) for b in warm_spans], 20)
    if args.skip_logs:
        del cases["OTLP spans, then log events"]
    kind = "PostgreSQL (CPU: this process + its backends)" if PG_ADMIN else "SQLite"
    print(f"{n} evaluations x {len(METRICS)} evaluation events, {batch} a request, {kind}")
    results = {name: run(str(i), posts, n) for i, (name, posts) in enumerate(cases.items())}
    base_wall, base_cpu = results["JSONL, one POST"]
    print(f"{'':32} {'wall s':>8} {'CPU s':>8} {'evals/s':>9} {'speed vs JSONL (wall, CPU)':>28}")
    for name, (wall, cpu) in results.items():
        print(
            f"{name:32} {wall:8.2f} {cpu:8.2f} {n / wall:9.0f} {base_wall / wall:13.2f}x {base_cpu / cpu:8.2f}x"
        )
    otlp_cpu = results["OTLP spans with span events"][1]
    same_sizes = results[f"JSONL, {batch} a POST"][1]
    verdict = "met" if base_cpu / otlp_cpu >= GOAL else "NOT met"
    print(
        f"goal: OTLP span events >= {GOAL}x the one JSONL POST (CPU): {base_cpu / otlp_cpu:.2f}x, {verdict}; "
        f"vs JSONL in {batch}-record posts {same_sizes / otlp_cpu:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
