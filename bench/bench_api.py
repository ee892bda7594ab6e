"""Pipeline API benchmark: push throughput over HTTP vs the CLI's import of the same file, and the
latency of fetching the history prompt block over HTTP vs calling lib directly.

    python bench/bench_api.py [--records 2000] [--judgments 1000,100000,1000000] [--runs 20]

Push: N evaluation records (2 judgments each) written to one JSONL file; `import_path` (what
`python -m lib import` runs) on a fresh SQLite file, then `POST /api/v1/evaluations` of the same
bytes to the API under uvicorn on 127.0.0.1 over a fresh SQLite file; evaluations/s for both and
their ratio. History: for each size in `--judgments`, that many rows from bench/gen.py, then the
median of `--runs` fetches of `GET /history?format=prompt` vs `corrections.history_block`
in-process, and each size's HTTP latency against the smallest size's (flat means the indexed
selection does not grow with the table). Figures are ratios for a shared machine: the wall clock
there mostly measures the other jobs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from sqlalchemy import Engine  # noqa: E402
from sqlmodel import Session, select  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402

from bench.common import OUT, fresh_sqlite_url, serve_asgi  # noqa: E402
from bench.gen import insert_batched, judgment_rows  # noqa: E402
from lib import corrections  # noqa: E402
from lib.api import API_PREFIX, create_app  # noqa: E402
from lib.auth import system_actor  # noqa: E402
from lib.db import init_db, session_scope  # noqa: E402
from lib.importer import import_path  # noqa: E402
from lib.models import Judgment  # noqa: E402
from lib.tokens import create_token  # noqa: E402


def fresh(name: str) -> Engine:
    return init_db(fresh_sqlite_url(OUT / name))


def serve(engine: Engine) -> tuple[str, str, uvicorn.Server, threading.Thread]:
    """The API under uvicorn on a free loopback port, with an admin token."""
    with Session(engine) as session:
        _, secret = create_token(session=session, actor=system_actor(), name="bench", role="admin")
        session.commit()
    app = Starlette(routes=[Mount(API_PREFIX, app=create_app(engine, max_body_mb=10_000))])
    base, server, thread = serve_asgi(app)
    return f"{base}{API_PREFIX}", secret, server, thread


def records_file(n: int) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "bench_api.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            record = {
                "question": f"Question {i}: who received the 1921 Nobel Prize in Physics?",
                "model_answer": f"Albert Einstein, for the photoelectric effect ({i}).",
                "product": "tutor",
                "model_name": "bench",
                "judge_model": "bench",
                "judge_scores": {"truthfulness": {"score": 4, "reason": "ok"}, "clarity": {"score": 3}},
            }
            fh.write(json.dumps(record) + "\n")
    return path


def push(n: int) -> None:
    path = records_file(n)
    cli_engine = fresh("bench_api_cli.db")
    start = time.perf_counter()
    report = import_path(engine=cli_engine, path=path, kind="evaluations", reviewer=system_actor())
    cli = time.perf_counter() - start
    assert report.inserted == n, report.summary()
    api_engine = fresh("bench_api_http.db")
    base, secret, server, thread = serve(api_engine)
    try:
        body = path.read_bytes()
        start = time.perf_counter()
        response = httpx.post(
            f"{base}/evaluations", content=body, headers={"Authorization": f"Bearer {secret}"}, timeout=3600
        )
        api = time.perf_counter() - start
        assert response.status_code == 200 and response.json()["inserted"] == n, response.text
    finally:
        server.should_exit = True
        thread.join()
    print(f"push {n} evaluations ({len(body) / 1e6:.1f} MB):")
    print(f"  CLI import  {n / cli:10.0f} evaluations/s")
    print(f"  API POST    {n / api:10.0f} evaluations/s   (API/CLI throughput = {cli / api:.2f})")


def history(judgments: int, runs: int) -> float:
    engine = fresh("bench_api_history.db")
    insert_batched(engine, Judgment, judgment_rows(judgments))
    base, secret, server, thread = serve(engine)
    headers = {"Authorization": f"Bearer {secret}"}
    try:
        with session_scope(engine, read_only=True) as session:
            product = session.exec(select(Judgment.product).limit(1)).one()
        params = {"product": product, "format": "prompt"}
        with httpx.Client(headers=headers) as http:
            http.get(f"{base}/history", params=params)  # warm
            over_http = []
            for _ in range(runs):
                start = time.perf_counter()
                http.get(f"{base}/history", params=params).raise_for_status()
                over_http.append(time.perf_counter() - start)
        direct = []
        for _ in range(runs):
            start = time.perf_counter()
            with session_scope(engine, read_only=True) as session:
                corrections.history_block(session=session, product=product)
            direct.append(time.perf_counter() - start)
    finally:
        server.should_exit = True
        thread.join()
    http_ms, lib_ms = statistics.median(over_http) * 1e3, statistics.median(direct) * 1e3
    print(f"history prompt at {judgments} judgments, median of {runs}:")
    print(f"  lib (in-process)  {lib_ms:8.2f} ms")
    print(f"  GET /history      {http_ms:8.2f} ms   (HTTP/lib = {http_ms / lib_ms:.1f})")
    return http_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--judgments", default="1000,100000,1000000", help="comma-separated table sizes")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--skip-push", action="store_true", help="only the history fetches")
    args = parser.parse_args(argv)
    sizes = sorted(int(part) for part in args.judgments.split(","))
    if not args.skip_push:
        push(args.records)
    latencies = {size: history(size, args.runs) for size in sizes}
    smallest = sizes[0]
    for size in sizes[1:]:
        print(f"GET /history at {size} vs {smallest} judgments: {latencies[size] / latencies[smallest]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
