"""Streamed "Download CSV (all matches)" links (lib.downloads) on both backends, and the pages using them."""

from __future__ import annotations

import csv
import functools
import io
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session
from starlette.applications import Starlette
from starlette.testclient import TestClient

from lib import downloads, export, inspector, wide_scan
from lib.config import ROOT, reset_settings
from lib.corrections import JudgmentFilter
from lib.importer import import_evaluations
from lib.inspector import EvaluationFilters
from tests.test_inspector import RECORDS, record

# A browser's XSRF cookie as Streamlit writes it ("2|mask|masked token|time"), and the binding of a
# link made in that browser session.
XSRF = "2|01020304|61636567|1700000000"
OWNER = downloads.browser_binding({downloads.XSRF_COOKIE: XSRF})


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(Starlette(routes=downloads.routes())) as c:
        c.cookies.set(downloads.XSRF_COOKIE, XSRF)  # the browser that made the links
        yield c


@pytest.fixture
def seeded(engine: Engine) -> Engine:
    with Session(engine) as session:
        import_evaluations(session=session, records=RECORDS, reviewer="tester")
        session.commit()
    return engine


@pytest.mark.parametrize("form", ["wide", "long"])
def test_link_streams_the_same_csv_as_the_button(seeded: Engine, client: TestClient, form: str) -> None:
    filters = EvaluationFilters(product="beta")
    path = downloads.register(
        f"evaluations_{form}.csv",
        functools.partial(export.evaluations_csv_chunks, engine=seeded, filters=filters, form=form),
        owner=OWNER,
    )
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-disposition"] == f'attachment; filename="evaluations_{form}.csv"'
    assert response.headers["content-type"].startswith("text/csv")
    assert response.content == export.evaluations_csv_bytes(engine=seeded, filters=filters, form=form)
    assert {r["id"] for r in csv.DictReader(io.StringIO(response.text))} == {"s_c", "s_d"}


def test_link_streams_in_chunks(seeded: Engine, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspector, "EXPORT_BATCH_ROWS", 1)  # the in-session path
    monkeypatch.setattr(export, "SCAN_BATCH_ROWS", 1)  # the scanner path: a row per write
    monkeypatch.setattr(export, "SCAN_CHUNK_BYTES", 64)  # and per read of what its worker wrote
    chunks = list(export.evaluations_csv_chunks(engine=seeded, filters=EvaluationFilters()))
    assert len(chunks) > 4  # header and every row handed on separately, not one buffer
    path = downloads.register(
        "e.csv",
        functools.partial(export.evaluations_csv_chunks, engine=seeded, filters=EvaluationFilters()),
        owner=OWNER,
    )
    assert client.get(path).content == b"".join(chunks)


def _large_answers(engine: Engine) -> None:
    """Rows whose CSV is larger than a pipe's buffer (64 KiB): a worker is still writing after the
    first chunk was read."""
    answers = [record(f"s_{i}", model_answer="x" * 20_000) for i in range(8)]
    with Session(engine) as session:
        import_evaluations(session=session, records=answers, reviewer="tester")
        session.commit()


def _submitted_exports(monkeypatch: pytest.MonkeyPatch) -> list[Future[int]]:
    """The calls the scanner path submits to the export workers, as they are made (one row per
    write, 64 bytes per read)."""
    submitted: list[Future[int]] = []
    pool = wide_scan.EXPORT_WORKERS
    submit_in_pool = pool.submit

    def submit(*args: object, **kwargs: object) -> Future[int]:
        submitted.append(submit_in_pool(*args, **kwargs))
        return submitted[-1]

    monkeypatch.setattr(pool, "submit", submit)
    monkeypatch.setattr(export, "SCAN_BATCH_ROWS", 1)
    monkeypatch.setattr(export, "SCAN_CHUNK_BYTES", 64)
    return submitted


def test_a_stopped_download_ends_the_export_worker(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the chunks (a browser that stops the download) closes the FIFO the scanner path's
    worker writes into: its next write fails and it ends, rather than waiting for a reader."""
    _large_answers(sqlite_engine)
    submitted = _submitted_exports(monkeypatch)
    chunks = export.evaluations_csv_chunks(engine=sqlite_engine, filters=EvaluationFilters())
    assert next(chunks).startswith(b"id,created_at,")
    chunks.close()
    with pytest.raises(BrokenPipeError):
        wide_scan.EXPORT_WORKERS.result(submitted[0], timeout=30)


def test_an_abandoned_export_cancels_its_queued_call(seeded: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A download given up while its call still waits for a worker (both busy): the call is
    cancelled, instead of running later for nobody. Here the call stays queued, and the test
    writes a first chunk into the FIFO itself so that the download can be given up after it."""
    queued: Future[int] = Future()

    def submit(func: object, source: object, scan: object, fifo: str, *args: object) -> Future[int]:
        with open(fifo, "wb") as out:  # the reader is open: this does not block
            out.write(b"id,created_at\n")
        return queued

    monkeypatch.setattr(wide_scan.EXPORT_WORKERS, "submit", submit)
    chunks = export.evaluations_csv_chunks(engine=seeded, filters=EvaluationFilters())
    assert next(chunks) == b"id,created_at\n"
    chunks.close()
    assert queued.cancelled()


def test_a_call_whose_fifo_is_gone_attaches_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A call the executor handed on before its export was abandoned (the FIFO removed) ends at
    once, before the worker attaches the database."""
    attached = []
    monkeypatch.setattr(wide_scan, "scanner_session", lambda *args: attached.append(args))
    source = wide_scan.ScanSource("sqlite", str(tmp_path / "app.db"))
    scan = wide_scan.WideScan([], [], [], [], {}, "SELECT 1")
    with pytest.raises(FileNotFoundError):
        wide_scan.write_wide_csv(source, scan, str(tmp_path / "gone.csv"), 1, 1.0)
    assert attached == []


def test_stalled_downloads_free_their_workers(sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two downloads whose clients stop reading (but stay connected) held both export workers for
    ever: every later export waited. A worker now gives up after OVERRULE_EXPORT_STALL_SECONDS
    without a byte taken, and a third export runs."""
    monkeypatch.setenv("OVERRULE_EXPORT_STALL_SECONDS", "0.5")
    reset_settings()
    _large_answers(sqlite_engine)
    submitted = _submitted_exports(monkeypatch)
    stalled = [
        export.evaluations_csv_chunks(engine=sqlite_engine, filters=EvaluationFilters()) for _ in range(2)
    ]
    try:
        for chunks in stalled:
            assert next(chunks).startswith(b"id,created_at,")  # then nobody reads on
        for future in submitted:
            with pytest.raises(wide_scan.ExportStalled, match=r"took nothing for 0\.5 s"):
                wide_scan.EXPORT_WORKERS.result(future, timeout=60)
        # The third is read to its end: a loaded machine that paused this reader for 0.5 s would
        # stall it too.
        monkeypatch.setenv("OVERRULE_EXPORT_STALL_SECONDS", "60")
        reset_settings()
        third = b"".join(export.evaluations_csv_chunks(engine=sqlite_engine, filters=EvaluationFilters()))
        assert third.count(b"x" * 20_000) == 8
    finally:
        for chunks in stalled:
            chunks.close()


def test_the_app_exits_while_a_worker_is_blocked(tmp_path: Path) -> None:
    """A call blocked for good in an export worker (here a plain write into a FIFO nobody reads, no
    stall limit) kept the interpreter from exiting: concurrent.futures joins its executors at exit,
    and that join waits for every running call. The pools now stop their workers first."""
    script = f"""
import os, pathlib, time
from lib.wide_scan import EXPORT_WORKERS
fifo = {str(tmp_path / "f")!r}
os.mkfifo(fifo)
reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
future = EXPORT_WORKERS.submit(pathlib.Path(fifo).write_bytes, b"x" * 10_000_000)
while not future.running():
    time.sleep(0.05)
print("blocked", flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )  # before: never returned (TimeoutExpired)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "blocked\n"


def test_corrections_link_streams_judgments(seeded: Engine, client: TestClient) -> None:
    path = downloads.register(
        "judgments.csv",
        functools.partial(export.judgments_csv_chunks, engine=seeded, filters=JudgmentFilter()),
        owner=OWNER,
    )
    rows = list(csv.DictReader(io.StringIO(client.get(path).text)))
    assert len(rows) == 7 and {r["state"] for r in rows} == {"unreviewed"}


def test_unknown_and_expired_links_say_what_to_do(client: TestClient) -> None:
    expired = downloads.register(
        "x.csv", lambda: iter([b"a"]), owner=OWNER, now=time.monotonic() - downloads.LINK_TTL_SECONDS - 1
    )
    for path in (f"{downloads.DOWNLOAD_PREFIX}/nope", expired):
        response = client.get(path)
        assert response.status_code == 404
        assert "expired or is unknown" in response.text


def test_file_names_cannot_break_the_header(client: TestClient) -> None:
    path = downloads.register('a"b\r\nc.csv', lambda: iter([b"x"]), owner=OWNER)
    assert client.get(path).headers["content-disposition"] == 'attachment; filename="a_b__c.csv"'


def test_a_link_streams_only_to_the_browser_session_that_made_it(client: TestClient) -> None:
    """Issue 24.8: an anonymous client fetched a viewer's link; links were bearer capabilities."""
    path = downloads.register("mine.csv", lambda: iter([b"secret,rows\n"]), owner=OWNER)
    # The same browser on a later page load: Streamlit re-masks the XSRF cookie, the token is the same.
    client.cookies.set(downloads.XSRF_COOKIE, "2|0a0b0c0d|6a6a6a6e|1700000000")
    assert client.get(path).content == b"secret,rows\n"
    with TestClient(Starlette(routes=downloads.routes())) as anonymous:
        refused = anonymous.get(path)
        assert refused.status_code == 403 and "another browser session" in refused.text
        anonymous.cookies.set(downloads.XSRF_COOKIE, "2|01020304|00000000|1700000000")  # another browser
        assert anonymous.get(path).status_code == 403
        anonymous.cookies.set(downloads.XSRF_COOKIE, "not a token")
        assert anonymous.get(path).status_code == 403
    assert b"secret" not in refused.content


def test_a_signed_in_link_needs_the_same_sign_in_and_a_live_session(client: TestClient) -> None:
    alice = {"_streamlit_user": "alice-signed", "_streamlit_user_tokens": "t", downloads.XSRF_COOKIE: XSRF}
    live = [True]
    path = downloads.register(
        "a.csv", lambda: iter([b"rows"]), owner=downloads.browser_binding(alice), still_valid=lambda: live[0]
    )
    client.cookies.clear()
    for name, value in alice.items():
        client.cookies.set(name, value)
    assert client.get(path).content == b"rows"
    client.cookies.set("_streamlit_user", "bob-signed")  # another sign-in in the same browser
    assert client.get(path).status_code == 403
    client.cookies.delete("_streamlit_user")
    client.cookies.delete("_streamlit_user_tokens")  # signed out: only the XSRF cookie is left
    assert client.get(path).status_code == 403
    for name, value in alice.items():  # a copy of alice's cookies, after her session ended
        client.cookies.set(name, value)
    live[0] = False
    ended = client.get(path)
    assert ended.status_code == 403 and "session that made this download link has ended" in ended.text


def test_no_browser_cookie_no_link() -> None:
    assert downloads.browser_binding({}) is None
    assert downloads.browser_binding({downloads.XSRF_COOKIE: "2|zz|00|1"}) is None
    with pytest.raises(ValueError, match="bound"):
        downloads.register("x.csv", lambda: iter([b""]), owner="")


def test_the_xsrf_token_is_read_as_streamlit_writes_it() -> None:
    from streamlit.web.server.starlette.starlette_app_utils import (
        decode_xsrf_token_string,
        generate_xsrf_token_string,
    )

    token = bytes(range(16))
    first, second = (
        generate_xsrf_token_string(token, 1700000000),
        generate_xsrf_token_string(token, 1700000000),
    )
    assert decode_xsrf_token_string(first)[0] == token
    assert downloads._xsrf_token(first) == downloads._xsrf_token(second) == token
