"""What the OTLP receiver keeps waiting, why, and what it forgot (lib.otlp_waiting): the cases that
waited the week in silence, each sent through the receiver as the SDK would, then read back on
SQLite and PostgreSQL; the sweep's record; the CLI."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from lib import otlp, otlp_table, otlp_waiting
from lib.auth import AuditRate
from lib.db import session_scope
from lib.models import OtlpSpan, utcnow
from tests.cli import ROOT, run_cli
from tests.test_otlp import EVAL, Receiver, Telemetry, _chat_attributes, _receiving

RID = {"gen_ai.response.id": "resp-X"}


@pytest.fixture
def receiver(engine: Engine) -> Iterator[Receiver]:
    with _receiving(engine) as running:
        yield running


def _send(receiver: Receiver, t: Telemetry, *, spans: bool = True, leave_out: str = "") -> None:
    """The telemetry's log records, then (if `spans`) its finished spans but those named
    `leave_out` (a span Overrule never receives); what is not sent is forgotten."""
    if t.logs.get_finished_logs():
        r = receiver.post("/v1/logs", t.log_body())
        assert r.status_code == 200 and not r.content, r.content
    sent = [s for s in t.spans.get_finished_spans() if s.name != leave_out]
    t.spans.clear()
    if spans and sent:
        r = receiver.post("/v1/traces", encode_spans(sent).SerializeToString())
        assert r.status_code == 200 and not r.content, r.content


def _trace(span: Any) -> str:
    return f"{span.get_span_context().trace_id:032x}"


def _every_case(receiver: Receiver) -> dict[str, str]:
    """Each reason to wait, as the receiver meets it; returns the trace id (hex) of each case."""
    traces: dict[str, str] = {}
    t = Telemetry()
    # A call no judge looked at (an app exporting every call), and one with no answer.
    with t.tracer.start_as_current_span("POST /unjudged") as handler:
        t.call("Capital of Peru?", "Lima.", **{"gen_ai.response.id": "resp-unjudged"})
    traces["no_verdict"] = _trace(handler)
    t.call("Capital of Chad?", None)
    _send(receiver, t)
    # A verdict in a handler's span that never arrives, its trace holding no call.
    with t.tracer.start_as_current_span("POST /sampled-out") as handler:
        t.verdict("clarity", 4, None)
    traces["span_not_received"] = _trace(handler)
    _send(receiver, t, spans=False)
    # The same, then its trace's one call arrives, but not the handler's span (sent before, or never).
    with t.tracer.start_as_current_span("POST /ask") as handler:
        t.verdict("tone", 3, None)
        _send(receiver, t, spans=False)
        t.call("Capital of Chile?", "Santiago.")
    traces["call_came_later"] = _trace(handler)
    _send(receiver, t, leave_out="POST /ask")
    # A trace of two calls, the verdict in its handler's span (not received), naming no call.
    with t.tracer.start_as_current_span("POST /two") as handler:
        t.call("First?", "One.")
        t.call("Second?", "Two.")
        _send(receiver, t)
        t.verdict("helpfulness", 1, None)
    traces["several_calls"] = _trace(handler)
    _send(receiver, t, leave_out="POST /two")
    # A verdict naming resp-X, which a call of another trace records, emitted in a span not received.
    t.call("Capital of Kenya?", "Nairobi.", **RID)
    _send(receiver, t)
    with t.tracer.start_as_current_span("judge job") as job:
        t.verdict("truthfulness", 5, None, **RID)
    traces["id_in_other_trace"] = _trace(job)
    _send(receiver, t, spans=False)
    # A verdict emitted in a call recording resp-A, naming resp-B, which no call records (review11 F2):
    # the judged call with a mismatched id, or a judge's own call whose judged call has not come.
    ctx = t.call("Capital of Mali?", "Bamako.", **{"gen_ai.response.id": "resp-A"})
    traces["in_call_recording_another"] = f"{ctx.trace_id:032x}"
    _send(receiver, t)
    t.verdict("coherence", 3, ctx, **{"gen_ai.response.id": "resp-B"})
    _send(receiver, t, spans=False)
    # A verdict emitted outside any span naming an id no call records.
    t.verdict("=cmd|' /C calc'!A0", 2, None, **{"gen_ai.response.id": "resp-nobody"})
    _send(receiver, t, spans=False)
    return traces


def test_every_reason_to_wait_is_read_with_what_to_change(receiver: Receiver) -> None:
    traces = _every_case(receiver)
    with Session(receiver.engine) as session:
        waiting = otlp_waiting.read(session)
    by_why: dict[str, list[otlp_waiting.WaitingRow]] = {}
    for row in waiting.rows:
        by_why.setdefault(row.why, []).append(row)
    # Calls waiting: the unjudged call, the call with no answer, the two calls of the trace, Kenya.
    calls = by_why.pop("no_verdict")
    assert {row.response_id for row in calls} >= {"resp-unjudged", "resp-X"}
    assert all(row.what == "call" and row.span_name == "chat m1" for row in calls)
    assert all(row.product == "support-bot" for row in calls)
    [no_answer] = [row for row in calls if "will be refused" in row.advice]
    assert "the span has no gen_ai.output.messages (the instrumentation records" in no_answer.advice
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY" in no_answer.advice
    [unjudged] = [row for row in calls if row.response_id == "resp-unjudged"]
    assert unjudged.trace_id == traces["no_verdict"]
    assert "naming its gen_ai.response.id 'resp-unjudged'" in unjudged.advice
    assert set(by_why) == {
        "span_not_received",
        "call_came_later",
        "several_calls",
        "id_in_other_trace",
        "in_call_recording_another",
        "id_unrecorded",
    }
    for why, rows in by_why.items():
        assert len(rows) == 1, why
    expected = {
        "span_not_received": ("clarity", "its trace holds no call yet"),
        "call_came_later": ("tone", "came after the verdicts"),
        "several_calls": ("helpfulness", "in a trace of 2 calls"),
        "id_in_other_trace": ("truthfulness", "which 1 call(s) of another trace record"),
        "in_call_recording_another": ("coherence", "which records gen_ai.response.id 'resp-A'"),
        "id_unrecorded": ("=cmd|' /C calc'!A0", "which no call received in the last 7 days records"),
    }
    for why, (metric, words) in expected.items():
        [row] = by_why[why]
        assert row.what == "verdicts" and row.evaluations == (metric,), why
        assert words in row.advice, (why, row.advice)
        if why != "id_unrecorded":
            assert row.trace_id == traces[why] and row.span_id, why
    assert by_why["id_in_other_trace"][0].response_id == "resp-X"
    # review14 F7: a handler span (no call) is a route too, and a span passed over was received.
    assert "else the one call of its trace" in by_why["span_not_received"][0].advice
    for why in ("span_not_received", "call_came_later", "several_calls", "id_in_other_trace"):
        assert "which Overrule has not kept" in by_why[why][0].advice, why
    unrecorded = by_why["id_unrecorded"][0]
    assert (unrecorded.trace_id, unrecorded.span_id, unrecorded.response_id) == ("", "", "resp-nobody")
    # Counted by why, in WHY's order, with the oldest of each; the rows oldest first.
    assert [c.why for c in waiting.counts] == list(otlp_waiting.WHY)
    assert waiting.counts[0].rows == len(calls) and waiting.total == len(waiting.rows)
    assert sum(c.verdicts for c in waiting.counts) == 6
    assert [row.since for row in waiting.rows] == sorted(row.since for row in waiting.rows)
    assert not waiting.swept.sweeps
    with Session(receiver.engine) as session:
        assert otlp_waiting.read(session, limit=2).rows == waiting.rows[:2]


def test_a_call_whose_response_id_other_calls_record_is_not_advised_to_be_named(
    receiver: Receiver,
) -> None:
    """Ollama's ids repeat: a verdict naming an id two calls record, outside their traces, is
    refused, so a waiting call of a shared id is advised its span's context or one span with the
    call, not its id (review14 F1: the advice named what had just been refused)."""
    t = Telemetry()
    for question in ("Capital of Peru?", "Capital of Chile?"):
        t.call(question, "Lima.", **{"gen_ai.response.id": "chatcmpl-test"})
    t.call("Capital of Chad?", "N'Djamena.", **{"gen_ai.response.id": "resp-own"})
    _send(receiver, t)
    with Session(receiver.engine) as session:
        rows = otlp_waiting.read(session).rows
        assert [row.advice for row in otlp_waiting.read(session, limit=3).rows] == [
            row.advice for row in rows
        ]  # a page (a limit) says the same
    calls = {row.response_id: row for row in rows}
    assert len(rows) == 3 and len({row.advice for row in rows if row.response_id == "chatcmpl-test"}) == 1
    advice = calls["chatcmpl-test"].advice
    assert "naming its gen_ai.response.id" not in advice
    assert "in this span's context or in one span with the call" in advice
    assert "other calls record its gen_ai.response.id 'chatcmpl-test' too" in advice
    assert "naming its gen_ai.response.id 'resp-own'" in calls["resp-own"].advice


def test_the_sweep_records_what_it_forgets_and_the_reader_counts_it(receiver: Receiver) -> None:
    _every_case(receiver)
    with Session(receiver.engine) as session:
        before = otlp_waiting.read(session)
        old = utcnow() - timedelta(days=otlp_table.PENDING_DAYS, hours=1)
        session.execute(update(OtlpSpan).values(received_at=old))  # type: ignore[call-overload]
        session.add(OtlpSpan(key="f:1", snapshot_id="s1", received_at=old))  # a link row stays
        assert otlp._sweep(session, force=True) == len(before.rows)
        assert otlp._sweep(session, force=True) == 0  # nothing left: no second record
        session.commit()
        after = otlp_waiting.read(session)
    assert not after.rows and not after.counts
    calls = before.counts[0].rows
    assert (after.swept.sweeps, after.swept.calls, after.swept.verdicts) == (1, calls, 6)
    assert after.swept.last_at is not None
    assert f"{calls:,} call(s) no verdict came for and 6 verdict(s)" in after.swept.describe()
    lines = list(otlp_waiting.summary_lines(after))
    assert lines[0].startswith("Nothing waits") and lines[-1] == after.swept.describe()


def test_what_waits_is_found_by_the_partial_index_of_waiting_rows(engine: Engine) -> None:
    """Migration 0033: the rows that wait are indexed alone (`ix_otlp_spans_waiting`, received_at
    and key WHERE snapshot_id IS NULL), link rows never. The statements that ask what waits (the
    sweep's record and DELETE, the Admin page's "anything waits?", the list's oldest keys) are run,
    caught as sent, and explained: each reads that index (PostgreSQL told to avoid a scan, as its
    planner would at any size worth an index). Fails if the index were dropped or its predicate
    no longer matched theirs (the full snapshot index it replaced would be read instead)."""
    from sqlalchemy import event

    sent: list[tuple[str, Any]] = []

    def catch(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if "otlp_spans" in statement and "snapshot_id IS NULL" in statement:
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", catch)
    try:
        with Session(engine) as session:
            otlp._sweep(session, force=True)
            otlp_waiting.anything_waits(session)
            session.execute(otlp_waiting._oldest_keys(10, otlp_waiting._WAITS)).all()
            session.rollback()
    finally:
        event.remove(engine, "before_cursor_execute", catch)
    assert len(sent) == 4, sent  # the sweep's record (what it forgets) reads them first
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        for statement, parameters in sent:
            cursor = raw.cursor()
            if engine.dialect.name == "postgresql":
                cursor.execute("SET LOCAL enable_seqscan = off")
                cursor.execute("EXPLAIN " + statement, parameters)
            else:
                cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            plan = " ".join(str(row) for row in cursor.fetchall())
            cursor.close()
            assert "ix_otlp_spans_waiting" in plan, (statement, plan)
        conn.rollback()


def test_the_cli_prints_each_waiting_row_as_a_line_and_the_whole_list_as_csv(
    receiver: Receiver, db_url: str
) -> None:
    env = {"OVERRULE_DATABASE_URL": db_url}
    done = run_cli("otlp", "waiting", env=env)
    assert done.returncode == 0 and "Nothing waits" in done.stdout, done.stderr
    _every_case(receiver)
    done = run_cli("otlp", "waiting", "--limit", "3", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "1 row (1 verdict) naming a response id no call records; the oldest since" in done.stdout
    assert "Nothing forgotten yet" in done.stdout
    with Session(receiver.engine) as session:
        waiting = otlp_waiting.read(session)
    assert lines[-1] == f"(the oldest 3 of {waiting.total}; --csv prints them all)"
    assert lines[-4].split("\t")[1:3] == ["call", "no_verdict"]  # the oldest first, tab-separated
    assert lines[-4].split("\t")[0] == otlp_waiting.utc_text(waiting.rows[0].since)  # as the CSV and API
    assert lines[-5] == "\t".join(otlp_waiting.COLUMNS)  # under a header (review11 F7)
    done = run_cli("otlp", "waiting", env=env)
    [plain] = [line.split("\t") for line in done.stdout.splitlines() if "resp-nobody" in line]
    assert "'=cmd|' /C calc'!A0" in plain  # neutralised as the CSV is (review17 L2)
    done = run_cli("otlp", "waiting", "--csv", env=env)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert tuple(rows[0]) == otlp_waiting.COLUMNS and len(rows) == waiting.total
    [formula] = [row for row in rows if row["response_id"] == "resp-nobody"]
    assert formula["evaluations"] == "'=cmd|' /C calc'!A0"  # neutralised for spreadsheets
    assert rows[0]["waiting_since"] == otlp_waiting.utc_text(waiting.rows[0].since)
    assert (
        formula["why"] == "id_unrecorded"
        and "no call received in the last 7 days records" in formula["advice"]
    )
    assert run_cli("otlp", "waiting", "--limit", "-1", env=env).returncode == 1


def test_the_api_answers_what_waits_to_a_lead(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from lib import auth

    _every_case(receiver)
    lead = {"Authorization": f"Bearer {receiver.secrets['lead']}"}
    viewer = {"Authorization": f"Bearer {receiver.secrets['viewer']}"}
    url = f"{receiver.base}/api/v1/otlp/waiting"
    assert httpx.get(url, headers=viewer).status_code == 403
    with monkeypatch.context() as patched:  # the Admin page's rule too (review11 F7)
        patched.setitem(auth.PERMISSIONS, auth.Permission.SEE_OTLP_WAITING, "admin")
        assert httpx.get(url, headers=lead).status_code == 403
    r = httpx.get(url, params={"limit": 2}, headers=lead)
    assert r.status_code == 200, r.text
    body = r.json()
    with Session(receiver.engine) as session:
        waiting = otlp_waiting.read(session, limit=2)
    assert body["total"] == waiting.total and len(body["rows"]) == 2
    assert [c["why"] for c in body["counts"]] == list(otlp_waiting.WHY)
    assert body["rows"] == [row.record() for row in waiting.rows]
    # one form of time on every surface (review14 F7: the API wrote +00:00, the CSV Z, the CLI a space)
    first = body["rows"][0]
    assert first["why"] == "no_verdict"
    assert first["waiting_since"] == otlp_waiting.utc_text(waiting.rows[0].since)
    assert first["waiting_since"].endswith("Z") and "T" in first["waiting_since"]
    assert all(c["oldest"].endswith("Z") for c in body["counts"]) and body["unclassed"] == 0
    assert body["swept"] == {"sweeps": 0, "calls": 0, "verdicts": 0, "last_at": None}
    everything = httpx.get(url, params={"limit": 100}, headers=lead).json()["rows"]
    [unrecorded] = [row for row in everything if row["why"] == "id_unrecorded"]
    # what a row does not have is null, whichever field (review14 F7: trace_id "" beside response_id null)
    assert unrecorded["evaluations"] == ["=cmd|' /C calc'!A0"]
    assert (unrecorded["trace_id"], unrecorded["span_id"], unrecorded["span_name"], unrecorded["product"]) == (
        None, None, None, None,
    )  # fmt: skip
    call = next(row for row in everything if row["what"] == "call")
    assert call["trace_id"] and call["span_name"] and call["evaluations"] == []


def test_the_api_classes_the_oldest_rows_of_verdicts_only(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for a few rows, the API classed every waiting row for its counts on each call (SQLite
    0.91 CPU s at 300k waiting verdicts, whatever `limit`): now the oldest `CLASSED` rows of
    verdicts are classed, as on the Admin page, and the rest counted (`unclassed`); `total` holds
    all."""
    import httpx

    _fill_waiting(receiver.engine, verdicts=40, calls=10)
    monkeypatch.setattr(otlp_waiting, "CLASSED", 6)
    lead = {"Authorization": f"Bearer {receiver.secrets['lead']}"}
    body = httpx.get(f"{receiver.base}/api/v1/otlp/waiting", params={"limit": 1}, headers=lead).json()
    assert body["total"] == 50 and body["unclassed"] == 34 and len(body["rows"]) == 1
    counts = {c["why"]: c["rows"] for c in body["counts"]}
    assert counts == {"no_verdict": 10, "span_not_received": 3, "id_unrecorded": 3}  # the oldest 6


def _fill_waiting(engine: Engine, verdicts: int, calls: int) -> None:
    """Waiting rows as lib.otlp writes them: rows of verdicts (half under a span never received,
    half under `response:<id>`) and calls no verdict came for."""
    from sqlalchemy import insert

    now = utcnow()
    rows = []
    for i in range(verdicts):
        pending = [{"metric": "truthfulness", "score": 4.0, "label": None, "explanation": "x" * 50}]
        key = f"{i:032x}:{i:016x}" if i % 2 else f"response:r-{i}"
        rows.append((key, None if i % 2 else f"r-{i}", None, pending, now - timedelta(seconds=i)))
    for i in range(calls):
        span = {"key": f"c{i:031x}:{i:016x}", "name": "chat m1", "response_id": None, "missing": []}
        rows.append((span["key"], None, span, [], now - timedelta(seconds=i, milliseconds=500)))
    with engine.begin() as conn:
        conn.execute(
            insert(OtlpSpan.__table__),  # type: ignore[attr-defined]
            [
                dict(
                    zip(("key", "response_id", "span_json", "pending_json", "received_at"), row, strict=True)
                )
                for row in rows
            ],
        )


def test_a_page_of_the_list_explains_only_the_rows_it_shows_and_counts_in_sql(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review11 F4: the Admin page and the API read the oldest rows only; the counts by why come
    from SQL. Before, every waiting verdict row was read, decoded (three times) and explained on
    every run, whatever the limit (100k rows: 1.7 CPU s, 166 MiB)."""
    _fill_waiting(engine, verdicts=40, calls=10)
    explained: list[str] = []
    real = otlp_waiting._verdict_row
    monkeypatch.setattr(otlp_waiting, "_verdict_row", lambda *a: explained.append(a[0]) or real(*a))
    with Session(engine) as session:
        waiting = otlp_waiting.read(session, limit=3)
    assert len(waiting.rows) == 3 and len(explained) <= 3, len(explained)
    assert waiting.total == 50
    assert {c.why: (c.rows, c.verdicts) for c in waiting.counts} == {
        "no_verdict": (10, 0),
        "span_not_received": (20, 20),
        "id_unrecorded": (20, 20),
    }
    with Session(engine) as session:
        everything = otlp_waiting.read(session)
    assert everything.rows[:3] == waiting.rows and everything.counts == waiting.counts
    assert [r.since for r in everything.rows] == sorted(r.since for r in everything.rows)


def test_a_row_holding_a_non_finite_score_is_listed_beside_the_others(sqlite_engine: Engine) -> None:
    """review17 H1: a NaN score kept waiting (before lib.otlp refused them) is JSON SQLite's parser
    calls malformed, and every read of the list failed with it for the week it waited."""
    from sqlalchemy import insert

    _fill_waiting(sqlite_engine, verdicts=4, calls=1)
    pending = [{"metric": "faithfulness", "score": float("nan"), "context": "ab" * 16 + ":" + "cd" * 8}]
    with sqlite_engine.begin() as conn:
        conn.execute(
            insert(OtlpSpan.__table__),  # type: ignore[attr-defined]
            [
                {
                    "key": "response:r-nan",
                    "response_id": "r-nan",
                    "pending_json": pending,
                    "received_at": utcnow(),
                }
            ],
        )
    with Session(sqlite_engine) as session:
        waiting = otlp_waiting.read(session)
        page = otlp_waiting.read(session, limit=2)
    assert waiting.total == 6 and len(page.rows) == 2
    [nan] = [row for row in waiting.rows if row.record()["response_id"] == "r-nan"]
    assert nan.record()["evaluations"] == ["faithfulness"]
    assert sum(c.verdicts for c in waiting.counts) == 5
    assert b"faithfulness" in b"".join(otlp_waiting.csv_chunks(sqlite_engine))


def test_a_page_of_the_list_decodes_the_json_of_the_shown_rows_only(sqlite_engine: Engine) -> None:
    decoded: list[str] = []
    sqlite_engine.dialect._json_deserializer = lambda text: decoded.append(text) or json.loads(text)  # type: ignore[attr-defined]
    _fill_waiting(sqlite_engine, verdicts=40, calls=10)
    with Session(sqlite_engine) as session:
        otlp_waiting.read(session, limit=3)
    assert len(decoded) <= 6, len(decoded)  # the shown rows' verdicts, or a call's `missing`


def test_the_csv_of_the_whole_list_is_streamed_a_batch_at_a_time(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review11 F4: the download's first bytes go out before the whole list is read (memory stays
    one batch of rows); before, every row was read and explained first."""
    import lib.export

    _fill_waiting(engine, verdicts=40, calls=10)
    monkeypatch.setattr(lib.export, "CSV_BATCH_ROWS", 5)
    monkeypatch.setattr(otlp_waiting, "_BATCH", 5)
    explained: list[str] = []
    real = otlp_waiting._verdict_row
    monkeypatch.setattr(otlp_waiting, "_verdict_row", lambda *a: explained.append(a[0]) or real(*a))
    chunks = otlp_waiting.csv_chunks(engine)
    first = next(chunks)
    assert first.startswith(b"waiting_since,what,why,") and len(explained) < 20, len(explained)
    rows = list(csv.DictReader(io.StringIO(b"".join([first, *chunks]).decode())))
    assert len(rows) == 50 and len(explained) == 40
    assert [r["waiting_since"] for r in rows] == sorted(r["waiting_since"] for r in rows)


def test_the_cli_piped_into_a_reader_that_stops_early_ends_quietly(
    sqlite_engine: Engine, sqlite_url: str
) -> None:
    """review14 F7: `python -m lib otlp waiting | head` ended in a BrokenPipeError traceback (twice:
    the print, then the interpreter's flush at exit). More rows than a pipe holds, so the command is
    still writing when the reader goes."""
    _fill_waiting(sqlite_engine, verdicts=1000, calls=0)
    with subprocess.Popen(
        [sys.executable, "-m", "lib", "otlp", "waiting", "--limit", "1000"],
        cwd=ROOT,
        env={**os.environ, "OVERRULE_DATABASE_URL": sqlite_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline().startswith(b"500 row")
        process.stdout.close()  # `head` has its lines
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=120) == 141
    assert stderr == ""


# What waits1's sweep wrote into the audit trail (lib.otlp_waiting at d6e3df9), verbatim: the trail is
# permanent, so any later wording must still read these.
FROZEN_SWEEPS = (
    "forgot 120 call(s) no verdict came for and 3 verdict(s) whose call never came (truthfulness), "
    "after 7 days; the oldest waited since 2026-11-21 07:00 UTC",
    "forgot 0 call(s) no verdict came for and 2 verdict(s) whose call never came (x and 999 verdict(s), "
    "tone), after 7 days; the oldest waited since 2026-11-20 10:15 UTC",
    "forgot 4 call(s) no verdict came for and 0 verdict(s) whose call never came, after 7 days; the "
    "oldest waited since 2026-11-19 23:59 UTC",
)


def test_the_sweeps_recorded_in_any_wording_so_far_are_summed(engine: Engine) -> None:
    """review11 F5: the sweep's record is written and read by one pair (swept_detail, swept_counts);
    rows written before, frozen here, still count, and an evaluation name cannot forge the counts."""
    from lib.auth import record_event

    hostile = ["x and 999 verdict(s) whose call never came", "forgot 5 call(s)"]
    written = otlp_waiting.swept_detail(7, 11, hostile, utcnow())
    assert otlp_waiting.swept_counts(written) == (7, 11)
    assert [otlp_waiting.swept_counts(d) for d in FROZEN_SWEEPS] == [(120, 3), (0, 2), (4, 0)]
    assert otlp_waiting.swept_counts("forgot everything") is None
    with Session(engine) as session:
        for detail in (*FROZEN_SWEEPS, written, "forgot everything"):
            record_event(
                session=session,
                identity=otlp_waiting.SWEPT_BY,
                action=otlp_waiting.SWEPT_ACTION,
                detail=detail,
            )
        session.commit()
        swept = otlp_waiting.swept(session)
    assert (swept.sweeps, swept.calls, swept.verdicts) == (4, 131, 16)


def test_a_sweep_rolled_back_is_done_again_by_the_next_request(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review13 F1: the hour between sweeps counts from a committed sweep. A request rolled back
    after its sweep (a deadlock's victim, run again by lib.db.run_retrying) forgot nothing, so the
    next attempt sweeps; noted before the commit, nothing was swept or recorded for an hour."""
    monkeypatch.setattr(otlp, "_last_sweep", {})
    old = utcnow() - timedelta(days=otlp_table.PENDING_DAYS, hours=1)
    with Session(engine) as session:
        session.add(OtlpSpan(key="a:1", pending_json=[{"name": "truthfulness"}], received_at=old))
        session.commit()
    with Session(engine) as session:
        assert otlp._sweep(session) == 1
        session.rollback()
    with Session(engine) as session:
        assert otlp._sweep(session) == 1  # before the fix: 0, the rolled-back sweep counted as done
        session.commit()
    with Session(engine) as session:
        session.add(OtlpSpan(key="b:1", pending_json=[{"name": "clarity"}], received_at=old))
        session.flush()
        assert otlp._sweep(session) == 0  # within the hour of the committed sweep
        assert otlp_waiting.read(session).swept.sweeps == 1


class _Deadlocked(Exception):
    """Stands for psycopg's DeadlockDetected: what lib.db.must_retry reads is the SQLSTATE."""

    sqlstate = "40P01"


def test_a_request_run_again_as_a_deadlocks_victim_still_sweeps(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review13 F1 end to end on PostgreSQL: the OTLP request's first attempt sweeps, then is
    aborted as a deadlock's victim; the attempt run again sweeps and records it."""
    if engine.dialect.name != "postgresql":
        pytest.skip("only PostgreSQL picks deadlock victims (SQLite's writers take turns)")
    from lib.auth import system_actor
    from lib.config import get_settings

    monkeypatch.setattr(otlp, "_last_sweep", {})
    old = utcnow() - timedelta(days=otlp_table.PENDING_DAYS, hours=1)
    with Session(engine) as session:
        session.add(OtlpSpan(key="a:1", pending_json=[{"name": "truthfulness"}], received_at=old))
        session.commit()
    runs: list[int] = []
    run = otlp._Join.run

    def aborted_once(join: Any) -> None:
        run(join)
        runs.append(1)
        if len(runs) == 1:
            raise _Deadlocked("deadlock detected (staged)")

    monkeypatch.setattr(otlp._Join, "run", aborted_once)
    t = Telemetry(service="P")
    t.call("Q?", "A.", events={"truthfulness": 4})
    outcome = otlp.receive(
        engine=engine, signal="traces", body=t.traces(), kind=otlp.PROTOBUF,
        settings=get_settings(), actor=system_actor("ci"),
    )  # fmt: skip
    assert len(runs) == 2 and outcome.evaluations == 1
    with Session(engine) as session:
        waiting = otlp_waiting.read(session)
        assert session.get(OtlpSpan, "a:1") is None
    assert waiting.swept.sweeps == 1 and waiting.swept.verdicts == 1


def test_a_count_tells_rows_and_verdicts_apart_in_words() -> None:
    """review14 F7: "1 verdicts naming ... (2 verdict(s))" read as two counts of one thing."""
    since = datetime(2026, 11, 28, 7, 45)
    assert otlp_waiting.WhyCount("id_unrecorded", 1, 2, since).describe() == (
        "1 row (2 verdicts) naming a response id no call records"
    )
    assert otlp_waiting.WhyCount("several_calls", 1_200, 2_400, since).describe() == (
        "1,200 rows (2,400 verdicts) in a span of a trace with several calls"
    )
    assert otlp_waiting.WhyCount("no_verdict", 1, 0, since).describe() == "1 call no verdict has come for"
    assert otlp_waiting.WhyCount("no_verdict", 3, 0, since).describe() == "3 calls no verdict has come for"


def test_every_time_of_the_list_has_one_fixed_width_form(engine: Engine) -> None:
    """review16 L6: a time whose microseconds were 0 lost its fraction (`…T09:48:01Z` beside
    `…T09:48:01.366842Z`): the text was of variable width, and sorting it as text put `01Z` after
    `01.5Z`; the CLI's counts wrote a third form (`2026-11-28 09:48 UTC`). Every time of the list
    (the API, the CLI's lines and counts, the CSV) is ISO 8601 UTC with microseconds and `Z`."""
    whole, later = datetime(2026, 11, 28, 9, 48, 1), datetime(2026, 11, 28, 9, 48, 1, 500_000)
    assert otlp_waiting.utc_text(whole) == "2026-11-28T09:48:01.000000Z"
    assert sorted([otlp_waiting.utc_text(later), otlp_waiting.utc_text(whole)])[0].startswith(
        "2026-11-28T09:48:01.0"
    )
    with Session(engine) as session:
        session.add(
            OtlpSpan(key="a:1", pending_json=[{"metric": "truthfulness", "score": 4.0}], received_at=whole)
        )
        session.add(
            OtlpSpan(key="b:1", pending_json=[{"metric": "clarity", "score": 3.0}], received_at=later)
        )
        session.commit()
    with Session(engine) as session:
        waiting = otlp_waiting.read(session)
    record = otlp_waiting.waiting_record(waiting)
    assert [row["waiting_since"] for row in record["rows"]] == [
        "2026-11-28T09:48:01.000000Z",
        "2026-11-28T09:48:01.500000Z",
    ]
    assert record["counts"][0]["oldest"] == "2026-11-28T09:48:01.000000Z"
    rows = list(csv.DictReader(io.StringIO(b"".join(otlp_waiting.csv_chunks(engine)).decode("utf-8"))))
    assert [row["waiting_since"] for row in rows] == [row["waiting_since"] for row in record["rows"]]
    assert [row.cells()[0] for row in waiting.rows] == [row["waiting_since"] for row in record["rows"]]
    [count] = [line for line in otlp_waiting.summary_lines(waiting) if "the oldest since" in line]
    assert count.endswith("the oldest since 2026-11-28T09:48:01.000000Z")


def test_an_answer_that_rejects_or_warns_is_recorded_for_a_lead_and_a_clean_one_writes_nothing(
    receiver: Receiver, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review18 L6: the SDK's exporters never read a partial success, so a span refused for lacking
    its messages, a verdict refused for a NaN score or a "not taken" warning was seen only in the
    server's log. Each such request now records one audit row (its signal, token, counts and the
    answer's messages, bounded) in its own transaction, read back newest first; a clean request
    sends not one statement more."""
    from sqlalchemy import event

    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    def clean_request(question: str) -> list[str]:
        t.call(question, "Yes.", events={"truthfulness": 5})
        statements.clear()
        r = receiver.post("/v1/traces", t.traces())
        assert r.status_code == 200 and not r.content, r.content
        return list(statements)

    t = Telemetry()
    ctx = t.call("Warm-up?", "Yes.", events={"truthfulness": 5})  # the sweep, the product, the rubric
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    event.listen(receiver.engine, "before_cursor_execute", seen)
    try:
        live = clean_request("Clean?")
        with monkeypatch.context() as patched:  # the same request with no recorder at all
            patched.setattr(otlp, "_record_refused", lambda *_args: None)
            without = clean_request("Clean too?")
        hostile = "<b>x</b>\nforged"  # kept whole: a long message cuts a name to 16
        with t.tracer.start_as_current_span(hostile, attributes=_chat_attributes("Lost?", None)) as span:
            span.add_event(
                EVAL, {"gen_ai.evaluation.name": "truthfulness", "gen_ai.evaluation.score.value": 1}
            )
        statements.clear()
        assert receiver.post("/v1/traces", t.traces()).status_code == 200
        refusing = list(statements)
    finally:
        event.remove(receiver.engine, "before_cursor_execute", seen)
    assert len(live) == len(without), (live, without)
    assert not [s for s in live if "audit_events" in s]
    assert len([s for s in refusing if "INSERT INTO audit_events" in s]) == 1
    t.verdict("relevance", float("nan"))  # outside any span: refused as decoded (no join, no lock)
    assert receiver.post("/v1/logs", t.log_body()).status_code == 200
    t.verdict("truthfulness", 2, ctx)  # another score for a metric the evaluation has: a warning
    assert receiver.post("/v1/logs", t.log_body()).status_code == 200
    with Session(receiver.engine) as session:
        refused = otlp_waiting.refused(session)
        assert [r.at for r in otlp_waiting.refused(session, 2)] == [r.at for r in refused[:2]]
    assert [(r.signal, r.rejected, r.warning) for r in refused] == [
        ("logs", 0, True),
        ("logs", 1, False),
        ("traces", 1, False),
    ]
    assert {r.identity for r in refused} == {"o-lead"}
    assert "'truthfulness' 2 was not taken" in refused[0].messages
    assert "evaluation 'relevance': score must be a finite number, got nan" in refused[1].messages
    assert "no gen_ai.output.messages" in refused[2].messages
    assert "span '<b>x</b>\\nforged' (trace" in refused[2].messages  # one line, as logged
    # The CLI's short part, between the counts and the waiting rows; the sender's text on one line.
    done = run_cli("otlp", "waiting", env={"OVERRULE_DATABASE_URL": db_url})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("Refused or warned of lately (the latest 3; the Admin page shows 50):")
    assert [line.split("\t")[1:4] for line in lines[start + 1 : start + 4]] == [
        ["logs", "o-lead", "warning"],
        ["logs", "o-lead", "1 rejected"],
        ["traces", "o-lead", "1 rejected"],
    ]
    assert lines[start + 1].split("\t")[0] == otlp_waiting.utc_text(refused[0].at)
    assert not any(line.startswith("forged") for line in lines)


def test_refused_answers_are_recorded_a_token_at_most_so_often_the_rest_counted(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review19 L6: an exporter whose every batch warns wrote an audit row a batch for good (~17,000
    a day for one app). At most REFUSED_PER_HOUR rows a token and hour (lib.auth.AuditRate, the API
    refusals' rule); past that the hour's one more row counts the rest and quotes the last."""
    from lib.models import AuditEvent

    monkeypatch.setattr(otlp_waiting, "REFUSED_PER_HOUR", 3)
    monkeypatch.setattr(otlp_waiting, "_refused_rate", AuditRate(3, 3600))

    def answer(identity: str, n: int, at: float) -> None:
        with session_scope(engine) as session:
            otlp_waiting.record_refused(
                session, signal="traces", identity=identity, rejected=1, messages=f"#{n}", clock=at
            )

    for n in range(10):
        answer("token:app", n, 1000.0 + n)  # one a second: the summary refreshed every 5 s
    answer("token:other", 0, 1000.0)  # another token has an hour of its own
    with Session(engine) as session:
        rows = session.exec(select(AuditEvent).order_by(col(AuditEvent.id))).all()
        refused = otlp_waiting.refused(session)
    assert [(r.identity, r.action) for r in rows] == [("token:app", otlp_waiting.REFUSED_ACTION)] * 4 + [
        ("token:other", otlp_waiting.REFUSED_ACTION)
    ]
    assert [r.messages for r in refused if r.identity == "token:app"][1:] == ["#2", "#1", "#0"]
    (summary,) = [r for r in refused if r.messages.startswith("6 more")]  # #9: within 5 s of #8
    assert (summary.signal, summary.rejected) == ("traces", 1)
    assert summary.messages == (
        "6 more answer(s) to this token that rejected or warned in this hour were counted, not recorded "
        "one by one (more than 3 an hour); the last: #8"
    )
    answer("token:app", 10, 1000.0 + 3600)  # the next hour: recorded again
    with Session(engine) as session:
        assert otlp_waiting.refused(session)[0].messages == "#10"


FROZEN_REFUSALS = (
    "traces: 2 rejected: span 'chat m1' (trace 0af7651916cd43dd8448eb211c80319c, span b7ad6b7169203331): "
    "no gen_ai.output.messages; evaluation 'depth': score must be a finite number, got nan",
    "logs: a warning, 0 rejected: evaluation 12 already has 'truthfulness': 'truthfulness' 2 was not taken",
)


def test_the_refusals_recorded_in_todays_wording_are_read_back_and_bounded(engine: Engine) -> None:
    """The refusal's record is written and read by one pair (refused_detail, refused_fields), frozen
    here: the audit trail is permanent. A sender's text cannot forge the counts, and however long the
    answer's messages, the row stays within the audit trail's bound, cut at a word."""
    from lib.auth import MAX_DETAIL_CHARS, record_event

    assert [otlp_waiting.refused_fields(d)[:3] for d in FROZEN_REFUSALS] == [  # type: ignore[index]
        ("traces", 2, False),
        ("logs", 0, True),
    ]
    forged = otlp_waiting.refused_detail("logs", 1, "x: 999 rejected: logs: 5 rejected: y")
    assert otlp_waiting.refused_fields(forged) == ("logs", 1, False, "x: 999 rejected: logs: 5 rejected: y")
    assert otlp_waiting.refused_fields("forgot 5 call(s)") is None
    long = otlp_waiting.refused_detail("traces", 100, "word " * 5000)
    assert len(long) <= MAX_DETAIL_CHARS and long.endswith("…")
    with Session(engine) as session:
        for detail in (*FROZEN_REFUSALS, "not one of ours"):
            record_event(
                session=session, identity="token:app", action=otlp_waiting.REFUSED_ACTION, detail=detail
            )
        session.commit()
        refused = otlp_waiting.refused(session)
    assert sorted((r.signal, r.rejected, r.warning) for r in refused) == [
        ("logs", 0, True),
        ("traces", 2, False),
    ]
