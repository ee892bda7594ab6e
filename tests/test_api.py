"""The pipeline API over real HTTP: uvicorn on 127.0.0.1, httpx and lib.client, SQLite and PostgreSQL."""

from __future__ import annotations

import csv as csv_module
import fcntl
import io
import json
import os
import re
import select as selectors_module
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.routing import APIRoute
from sqlalchemy import Engine, func, text
from sqlmodel import Session, select
from starlette.applications import Starlette
from starlette.routing import Mount

from lib import client as api_client
from lib.__main__ import main as cli_main
from lib.api import API_PREFIX, create_app
from lib.auth import system_actor
from lib.models import ApiToken, EvaluationSnapshot, Judgment, JudgmentEvent, SessionNote
from lib.tokens import create_token, hash_secret, list_tokens, revoke_token
from tests.conftest import sqlite_only
from tests.test_importer import record
from tests.waiting import wait_until

# The first DuckDB export starts its worker processes: seconds on a loaded machine, past httpx's 5 s default.
EXPORT_TIMEOUT = 120


@dataclass
class Server:
    base: str
    engine: Engine
    secrets: dict[str, str]
    port: int = 0
    meter: BodyMeter | None = None

    def headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[role]}"}


@pytest.fixture
def server(engine: Engine) -> Iterator[Server]:
    """The API mounted at /api/v1 as serve.py mounts it, served by uvicorn on a free loopback port."""
    secrets: dict[str, str] = {}
    with Session(engine) as session:
        for role in ("viewer", "reviewer", "lead", "admin"):
            _, secrets[role] = create_token(
                session=session, actor=system_actor(), name=f"ci-{role}", role=role
            )
        _, secrets["revoked"] = create_token(session=session, actor=system_actor(), name="old", role="admin")
        revoke_token(session=session, actor=system_actor(), name="old")
        session.commit()
    meter = BodyMeter(
        Starlette(routes=[Mount(API_PREFIX, app=create_app(engine, max_body_mb=1, max_json_mb=1))])
    )
    with serving(meter) as port:
        yield Server(f"http://127.0.0.1:{port}{API_PREFIX}", engine, secrets, port, meter)


class BodyMeter:
    """ASGI wrapper counting the request-body bytes the app has pulled from the server."""

    def __init__(self, app: Any) -> None:
        self.app, self.read = app, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                self.read += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


@contextmanager
def serving(app: Any) -> Iterator[int]:
    """`app` served by uvicorn on a free loopback port (in a thread) while the block runs. The socket
    is bound here and handed to uvicorn: a port found free, closed, then bound again by the server
    could be taken by another process in between."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: uv.started or not thread.is_alive(), "the API server to start")
        assert uv.started, "the API server stopped before it started"
        yield port
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        listener.close()


def count(engine: Engine, model: type) -> int:
    with Session(engine) as session:
        return int(session.exec(select(func.count()).select_from(model)).one())


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_tokens_are_stored_as_hashes_and_revoked_tokens_stop(server: Server) -> None:
    with Session(server.engine) as session:
        rows = {t.name: t for t in list_tokens(session=session)}
    assert rows["ci-lead"].secret_hash == hash_secret(server.secrets["lead"])
    assert server.secrets["lead"] not in {t.secret_hash for t in rows.values()}
    assert rows["old"].revoked_at is not None
    r = httpx.get(f"{server.base}/history", params={"product": "p"}, headers=server.headers("revoked"))
    assert r.status_code == 401


@pytest.mark.pg_repeats("statements and lines of test_history_prompt_is_byte_identical_to_the_cli")
def test_health_needs_no_token_and_reports_the_head_revision(server: Server) -> None:
    r = httpx.get(f"{server.base}/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    assert r.json()["database"] == server.engine.dialect.name


@pytest.mark.pg_repeats("statements and lines of test_a_viewer_token_cannot_export_the_access_records")
def test_openapi_docs_are_served(server: Server) -> None:
    assert httpx.get(f"{server.base}/docs").status_code == 200
    paths = httpx.get(f"{server.base}/openapi.json").json()["paths"]
    assert {"/history", "/notes", "/evaluations", "/judgments/{change_id}", "/exports/{table}"} <= set(paths)


@pytest.mark.parametrize("page", ["docs", "redoc"])
@pytest.mark.pg_repeats("statements and lines of test_a_viewer_token_cannot_export_the_access_records")
def test_docs_pages_load_their_scripts_and_styles_from_the_app(server: Server, page: str) -> None:
    """Issue 24.11: /docs loaded Swagger UI from a CDN (and its favicon from fastapi.tiangolo.com)."""
    html = httpx.get(f"{server.base}/{page}").text
    assets = re.findall(r"""(?:src|href)\s*[=:(]\s*['"]([^'"]+)['"]""", html)
    assert any(a.endswith(".js") for a in assets), html
    for asset in assets:
        assert asset.startswith(API_PREFIX + "/"), f"{asset} is not served by the app"
        fetched = httpx.get(f"http://127.0.0.1:{server.port}{asset}")
        assert fetched.status_code == 200, asset
    assert "cdn." not in html and "https://" not in html


@pytest.mark.pg_repeats("statements and lines of test_another_tools_results_file_imports_through_the_api")
def test_no_token_401_wrong_role_403_and_nothing_written(server: Server) -> None:
    body = jsonl([record(question="Q1?")])
    assert httpx.post(f"{server.base}/evaluations", content=body).status_code == 401
    bad = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{server.base}/evaluations", content=body, headers=bad).status_code == 401
    r = httpx.post(f"{server.base}/evaluations", content=body, headers=server.headers("reviewer"))
    assert r.status_code == 403
    assert "lead" in r.json()["detail"]
    note = {"content": "Check the year.", "type": "TIP"}
    assert httpx.post(f"{server.base}/notes", json=note, headers=server.headers("viewer")).status_code == 403
    assert httpx.get(f"{server.base}/notes", params={"language": ""}).status_code == 401
    assert count(server.engine, EvaluationSnapshot) == 0
    assert count(server.engine, SessionNote) == 0


def test_push_evaluations_jsonl_and_array_idempotent(server: Server) -> None:
    rows = [record(question=f"Q{i}?") for i in range(3)]
    r = httpx.post(f"{server.base}/evaluations", content=jsonl(rows), headers=server.headers("lead"))
    assert r.status_code == 200, r.text
    assert r.json()["inserted"] == 3
    again = httpx.post(f"{server.base}/evaluations", json=rows, headers=server.headers("lead"))
    assert again.status_code == 200, again.text
    assert again.json()["inserted"] == 0
    assert count(server.engine, EvaluationSnapshot) == 3
    with Session(server.engine) as session:
        authors = set(session.exec(select(EvaluationSnapshot.created_by)).all())
    assert authors == {"ci-lead"}  # the token's name is the actor of its writes


def test_push_evaluations_bad_record_422_malformed_400_too_large_413(server: Server) -> None:
    lead = server.headers("lead")
    bad = jsonl([record(question="ok?"), record(question="bad?", product=None)])
    r = httpx.post(f"{server.base}/evaluations", content=bad, headers=lead)
    assert r.status_code == 422, r.text
    assert r.json()["line"] == 2
    assert "product" in r.json()["detail"]
    r = httpx.post(f"{server.base}/evaluations", content=b'{"question": "x"\n', headers=lead)
    assert r.status_code == 400
    assert "column" in r.json()["detail"]
    r = httpx.post(f"{server.base}/evaluations", content=b'[{"question": }]', headers=lead)
    assert r.status_code == 400
    assert r.json()["position"] == 14
    big = b" " * (1024 * 1024 + 1)
    assert httpx.post(f"{server.base}/evaluations", content=big, headers=lead).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted while streaming
        for _ in range(20):
            yield b" " * 65536

    assert httpx.post(f"{server.base}/evaluations", content=chunks(), headers=lead).status_code == 413
    assert count(server.engine, EvaluationSnapshot) == 0


def test_history_prompt_is_byte_identical_to_the_cli(
    server: Server, db_url: str, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    rows = [record(question=f"Q{i}?") for i in range(4)]
    assert (
        httpx.post(f"{server.base}/evaluations", json=rows, headers=server.headers("lead")).status_code == 200
    )
    monkeypatch.setenv("OVERRULE_DATABASE_URL", db_url)
    from lib.config import reset_settings

    reset_settings()
    for args in ([], ["--max-entries", "3", "--ratio", "0.5"], ["--metric", "clarity"]):
        capsysbinary.readouterr()
        assert cli_main(["history", "--product", "tutor", "--format", "prompt", *args]) == 0
        expected = capsysbinary.readouterr().out
        params: dict[str, Any] = {"product": "tutor", "format": "prompt"}
        for flag, key in (("--max-entries", "max_entries"), ("--ratio", "ratio"), ("--metric", "metric")):
            if flag in args:
                params[key] = args[args.index(flag) + 1]
        got = httpx.get(f"{server.base}/history", params=params, headers=server.headers("viewer"))
        assert got.status_code == 200
        assert got.content == expected
        assert expected.startswith(b"PREVIOUS JUDGMENTS")  # a real block, not two empty answers
    as_json = httpx.get(
        f"{server.base}/history", params={"product": "tutor"}, headers=server.headers("viewer")
    )
    assert len(as_json.json()) == 4 * 2  # two metrics per evaluation
    assert api_client.Client(server.base, server.secrets["viewer"]).history_prompt("tutor").encode() == (
        httpx.get(
            f"{server.base}/history",
            params={"product": "tutor", "format": "prompt"},
            headers=server.headers("viewer"),
        ).content
    )
    bad = httpx.get(
        f"{server.base}/history", params={"product": "tutor", "ratio": 2}, headers=server.headers("viewer")
    )
    assert bad.status_code == 422


def test_notes_post_and_get_record_the_token_name(server: Server) -> None:
    c = api_client.Client(server.base, server.secrets["reviewer"])
    note = c.add_note("Check the year before the name.", note_type="TIP", language="en")
    assert note["created_by"] == "ci-reviewer"
    listed = httpx.get(f"{server.base}/notes", params={"language": "en"}, headers=server.headers("viewer"))
    assert [n["content"] for n in listed.json()] == ["Check the year before the name."]
    prompt = c.notes_prompt("en")
    assert "Check the year before the name." in prompt
    bad = httpx.post(
        f"{server.base}/notes", json={"content": "x", "type": "NOPE"}, headers=server.headers("lead")
    )
    assert bad.status_code == 422
    missing = httpx.post(f"{server.base}/notes", json={"type": "TIP"}, headers=server.headers("lead"))
    assert missing.status_code == 422
    assert missing.json()["field"] == "content"
    assert count(server.engine, SessionNote) == 1


def _a_change_id(engine: Engine) -> str:
    with Session(engine) as session:
        return session.exec(select(Judgment.change_id).order_by(Judgment.id)).first()  # type: ignore[arg-type]


def test_review_with_if_match_404_428_and_two_concurrent_reviewers_one_409(server: Server) -> None:
    rows = [record(question="Q?")]
    httpx.post(f"{server.base}/evaluations", json=rows, headers=server.headers("lead"))
    change_id = _a_change_id(server.engine)
    rev = server.headers("reviewer")
    assert httpx.get(f"{server.base}/judgments/nope", headers=rev).status_code == 404
    got = httpx.get(f"{server.base}/judgments/{change_id}", headers=rev)
    assert got.status_code == 200
    version = got.json()["version"]
    assert got.headers["etag"] == f'"{version}"'
    body = {"action": "confirm"}
    assert httpx.patch(f"{server.base}/judgments/{change_id}", json=body, headers=rev).status_code == 428
    viewer = {**server.headers("viewer"), "If-Match": str(version)}
    assert httpx.patch(f"{server.base}/judgments/{change_id}", json=body, headers=viewer).status_code == 403
    bad = {**rev, "If-Match": str(version)}
    for wrong in ({"action": "nope"}, {"action": "overrule", "decision": "99", "reason": "x"}, {}):
        assert httpx.patch(f"{server.base}/judgments/{change_id}", json=wrong, headers=bad).status_code == 422
    assert (
        httpx.patch(
            f"{server.base}/judgments/{change_id}", json=body, headers={**rev, "If-Match": "v"}
        ).status_code
        == 400
    )
    assert count(server.engine, JudgmentEvent) == 0

    def review(decision: str) -> httpx.Response:
        headers = {**rev, "If-Match": f'"{version}"'}
        return httpx.patch(
            f"{server.base}/judgments/{change_id}",
            json={"action": "overrule", "decision": decision, "reason": "checked"},
            headers=headers,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(review, ["1", "5"]))
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 409], [r.text for r in results]
    won = next(r for r in results if r.status_code == 200).json()
    lost = next(r for r in results if r.status_code == 409).json()
    assert lost["current"]["reviewer_decision"] == won["reviewer_decision"]
    assert won["reviewed_by"] == "ci-reviewer"
    with Session(server.engine) as session:
        events = session.exec(select(JudgmentEvent)).all()
    assert [e.reviewer for e in events if e.action in ("confirmed", "overruled")] == ["ci-reviewer"]


@pytest.mark.pg_repeats(
    "statements and lines of test_evaluations_export_wide_or_long_streams_scores_and_answer"
)
def test_a_judgment_names_whose_decision_each_field_holds_and_keeps_the_v1_names(server: Server) -> None:
    """Issue 25: the judge's score, the reviewer's decision and its reason by lib.display's rule;
    seed 004's names (decision, user_decision, user_reasoning, reviewer) stay as aliases in v1."""
    httpx.post(f"{server.base}/evaluations", json=[record(question="Roles?")], headers=server.headers("lead"))
    change_id = _a_change_id(server.engine)
    rev = server.headers("reviewer")
    state = httpx.get(f"{server.base}/judgments/{change_id}", headers=rev).json()
    judge = state["judge_decision"]
    body = {"action": "overrule", "decision": "1" if judge != "1" else "2", "reason": "too kind"}
    done = httpx.patch(
        f"{server.base}/judgments/{change_id}",
        json=body,
        headers={**rev, "If-Match": f'"{state["version"]}"'},
    ).json()
    assert (done["judge_decision"], done["reviewer_decision"], done["reviewer_reason"], done["reviewed_by"]) == (
        judge, body["decision"], "too kind", "ci-reviewer"
    )  # fmt: skip
    assert (done["decision"], done["user_decision"], done["user_reasoning"], done["reviewer"]) == (
        judge, body["decision"], "too kind", "ci-reviewer"
    )  # fmt: skip
    stale = httpx.patch(
        f"{server.base}/judgments/{change_id}",
        json=body,
        headers={**rev, "If-Match": f'"{state["version"]}"'},
    )
    assert stale.status_code == 409 and stale.json()["current"]["reviewer_decision"] == body["decision"]


def test_a_review_waiting_on_a_row_lock_leaves_the_server_answering(server: Server) -> None:
    """review10 F6: PATCH /judgments ran its write on the event loop the pages share: a review
    waiting on a locked row (or a deadlock victim's back-off) froze every other request."""
    if server.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's writers wait on the file, not a row")
    httpx.post(f"{server.base}/evaluations", json=[record(question="Q?")], headers=server.headers("lead"))
    change_id = _a_change_id(server.engine)
    rev = server.headers("reviewer")
    version = httpx.get(f"{server.base}/judgments/{change_id}", headers=rev).json()["version"]
    answered: list[int] = []
    with server.engine.connect() as holder:
        holder.execute(text("SELECT id FROM judgments WHERE change_id = :c FOR UPDATE"), {"c": change_id})

        def review() -> None:
            r = httpx.patch(
                f"{server.base}/judgments/{change_id}",
                json={"action": "confirm"},
                headers={**rev, "If-Match": f'"{version}"'},
                timeout=60,
            )
            answered.append(r.status_code)

        waiting = threading.Thread(target=review)
        waiting.start()
        wait_until(lambda: _lock_waiters(server.engine) > 0, what="the review waiting on the row lock")
        assert httpx.get(f"{server.base}/health", timeout=20).status_code == 200  # while it waits
        assert not answered
        holder.rollback()
    waiting.join(60)
    assert answered == [200]


def _lock_waiters(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        ).scalar_one()


@pytest.mark.pg_repeats(
    "statements and lines of test_review_with_if_match_404_428_and_two_concurrent_reviewers_one_409"
)
def test_client_push_and_review(server: Server) -> None:
    lead = api_client.Client(server.base, server.secrets["lead"])
    report = lead.push_evaluations([record(question="Via client?")])
    assert report["inserted"] == 1
    change_id = _a_change_id(server.engine)
    state = lead.review(change_id, decision="3", reason="too harsh")
    assert state["reviewer_decision"] == "3"
    assert state["reviewed_by"] == "ci-lead"
    with pytest.raises(api_client.ApiError) as err:
        lead.review(change_id, decision="2", reason="again", version=state["version"] - 1)
    assert err.value.status == 409


def test_exports_stream_formula_safe_csv_and_refuse_unknown_tables(server: Server) -> None:
    httpx.post(
        f"{server.base}/evaluations",
        json=[record(question='=HYPERLINK("x")')],
        headers=server.headers("lead"),
    )
    viewer = server.headers("viewer")
    csv = httpx.get(
        f"{server.base}/exports/evaluations", params={"format": "csv"}, headers=viewer, timeout=EXPORT_TIMEOUT
    )
    assert csv.status_code == 200
    assert "'=HYPERLINK" in csv.text
    lines = httpx.get(
        f"{server.base}/exports/evaluations",
        params={"format": "jsonl"},
        headers=viewer,
        timeout=EXPORT_TIMEOUT,
    )
    assert len(lines.text.strip().splitlines()) == 1
    assert (
        httpx.get(f"{server.base}/exports/api_tokens", headers=viewer, timeout=EXPORT_TIMEOUT).status_code
        == 404
    )
    assert httpx.get(f"{server.base}/exports/evaluations", timeout=EXPORT_TIMEOUT).status_code == 401
    assert count(server.engine, ApiToken) == 5


def _temp_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(("overrule-export-", "overrule-api-")))


def test_export_and_upload_folders_are_removed_and_dead_ones_swept(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review3 E2: an export's temp folder stayed for ever when the server was killed mid-request
    (no later request looks into it) or when the export failed with anything but an ExportError."""
    from lib import claims, export
    from lib.claims import FOLDER_CLAIM

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the server runs in this process
    # Every request's folder sweeps here (the once-a-minute throttle is tests/test_claims.py's).
    monkeypatch.setattr(claims, "SWEEP_INTERVAL_SECONDS", 0.0)
    then = time.time() - 7200
    dead, fresh, live = (
        tmp_path / name
        for name in ("overrule-export-dead0001", "overrule-api-fresh001", "overrule-api-live0001")
    )
    for folder in (dead, fresh, live):
        folder.mkdir()
        (folder / FOLDER_CLAIM).write_bytes(b"")
        if folder is not fresh:
            for path in (folder / FOLDER_CLAIM, folder):
                os.utime(path, (then, then))
    holder = os.open(live / FOLDER_CLAIM, os.O_WRONLY)  # a request of another server, still running
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    viewer = server.headers("viewer")
    try:
        r = httpx.get(f"{server.base}/exports/judgments", headers=viewer, timeout=EXPORT_TIMEOUT)
        assert r.status_code == 200
        # the request's own folder goes once the file is sent
        wait_until(lambda: _temp_folders(tmp_path) == [fresh.name, live.name], "the export's folder to go")
        r = httpx.post(f"{server.base}/evaluations", content=b"not json\n", headers=server.headers("lead"))
        assert r.status_code == 400  # refused: its folder goes all the same
        assert _temp_folders(tmp_path) == [fresh.name, live.name]
    finally:
        os.close(holder)

    def broken(**kwargs: Any) -> int:
        raise RuntimeError("not an ExportError")

    monkeypatch.setattr(export, "export_table", broken)
    r = httpx.get(f"{server.base}/exports/judgments", headers=viewer, timeout=EXPORT_TIMEOUT)
    assert r.status_code == 500
    assert _temp_folders(tmp_path) == [fresh.name]  # the live one, let go, was swept by that request


@pytest.mark.parametrize(("form", "rows"), [("wide", 1), ("long", 2)])
def test_evaluations_export_wide_or_long_streams_scores_and_answer(
    server: Server, form: str, rows: int
) -> None:
    posted = record(question="İstanbul?", model_answer="=1+1")
    httpx.post(f"{server.base}/evaluations", json=[posted], headers=server.headers("lead"))
    viewer = server.headers("viewer")
    response = httpx.get(
        f"{server.base}/exports/evaluations", params={"form": form}, headers=viewer, timeout=EXPORT_TIMEOUT
    )
    assert response.status_code == 200
    assert response.headers["content-disposition"] == f'attachment; filename="evaluations_{form}.csv"'
    read = list(csv_module.DictReader(io.StringIO(response.text)))
    assert len(read) == rows  # two judged metrics: one evaluation, two judgments
    assert {r["answer"] for r in read} == {"'=1+1"}
    if form == "wide":
        assert (read[0]["clarity judge_score"], read[0]["clarity user_score"], read[0]["clarity gap"]) == (
            "2.5",
            "4",
            "1.5",
        )
    refused = httpx.get(
        f"{server.base}/exports/judgments", params={"form": form}, headers=viewer, timeout=EXPORT_TIMEOUT
    )
    assert refused.status_code == 422 and "form applies to" in refused.text


def test_relevance_audits_and_scores_feed_tag_relevance_once(server: Server) -> None:
    from lib.models import LessonTagRelevance, SessionAudit, TagRelevanceEvent

    reviewer = api_client.Client(server.base, server.secrets["reviewer"])
    note_id = reviewer.add_note("Units matter in physics answers.", note_type="TIP")["id"]
    with pytest.raises(api_client.ApiError) as err:
        reviewer.record_shown_notes("run-1", [note_id], tags=["physics"])
    assert err.value.status == 403
    lead = api_client.Client(server.base, server.secrets["lead"])
    bad = httpx.post(
        f"{server.base}/relevance/audits",
        json={"session_id": "run-1", "shown_note_ids": "x"},
        headers=server.headers("lead"),
    )
    assert bad.status_code == 422
    assert count(server.engine, SessionAudit) == 0
    done = lead.record_shown_notes("run-1", [note_id, 999_999], tags=["physics"], product="tutor")
    assert done["shown_note_ids"] == [note_id]
    assert lead.record_shown_notes("run-1", [note_id], tags=["physics"])["session_id"] == "run-1"
    assert count(server.engine, SessionAudit) == 1
    with pytest.raises(api_client.ApiError) as err:
        lead.record_scores("no-such-run", {note_id: 1.0})
    assert err.value.status == 404
    with pytest.raises(api_client.ApiError) as err:
        lead.record_scores("run-1", {999_999: 1.0})  # scores none of the shown notes
    assert err.value.status == 422
    assert count(server.engine, LessonTagRelevance) == 0
    assert lead.record_scores("run-1", {note_id: 1.0})["applied"] is True
    assert lead.record_scores("run-1", {note_id: 1.0})["applied"] is False
    with Session(server.engine) as session:
        rows = session.exec(select(LessonTagRelevance)).all()
        audits = session.exec(select(SessionAudit)).all()
        events = session.exec(select(TagRelevanceEvent)).all()
    assert [(r.lesson_id, r.tag, r.positive_evals) for r in rows] == [(note_id, "physics", 1)]
    # every write records the token's name as the actor
    assert [a.recorded_by for a in audits] == ["ci-lead"]
    assert [(e.lesson_id, e.source, e.reviewer) for e in events] == [(note_id, "evaluator", "ci-lead")]


def test_push_interactions_is_the_cli_import_with_its_refusals(server: Server) -> None:
    from lib.models import Interaction
    from tests.test_precedents_import import _line

    lead = server.headers("lead")
    rows = [_line(id="a", created_at="2026-01-01T10:00:00Z"), _line(id="b", question="When?")]
    assert (
        httpx.post(
            f"{server.base}/interactions", content=jsonl(rows), headers=server.headers("reviewer")
        ).status_code
        == 403
    )
    bad = httpx.post(f"{server.base}/interactions", content=jsonl([rows[0], {"id": "c"}]), headers=lead)
    assert bad.status_code == 422
    assert bad.json()["line"] == 2
    assert httpx.post(f"{server.base}/interactions", json=rows, headers=lead).status_code == 422
    assert count(server.engine, Interaction) == 0
    ok = httpx.post(f"{server.base}/interactions", content=jsonl(rows), headers=lead, timeout=120)
    assert ok.status_code == 200, ok.text
    assert ok.json()["inserted"] == 2
    again = httpx.post(f"{server.base}/interactions", content=jsonl(rows), headers=lead, timeout=120)
    assert again.json()["inserted"] == 0
    assert count(server.engine, Interaction) == 2


def test_notes_prompt_is_byte_identical_to_the_cli(
    server: Server, db_url: str, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    c = api_client.Client(server.base, server.secrets["reviewer"])
    c.add_note("Read the question twice.", note_type="STRATEGY", language="en", session="run-0")
    c.add_note("Dates come first.", note_type="TIP", language="de", session="run-1")
    monkeypatch.setenv("OVERRULE_DATABASE_URL", db_url)
    from lib.config import reset_settings

    reset_settings()
    for language, tags in (("en", []), ("de", ["math"])):
        capsysbinary.readouterr()
        tag_args = ["--tags", *tags] if tags else []
        argv = ["notes", "--language", language, *tag_args, "--format", "prompt", "--session", "run-1"]
        assert cli_main(argv) == 0
        expected = capsysbinary.readouterr().out
        assert b"Read the question twice." in expected
        assert c.notes_prompt(language, tags=tags, session="run-1").encode() == expected


def test_push_with_judge_runs_the_built_in_judge_and_a_repost_resumes(
    server: Server, llm_server: Any
) -> None:
    """`?judge=true`: the judge's batch on the posted lines, as the token; failures reported by line."""
    from lib.db import session_scope
    from lib.metrics import upsert_metric_definitions
    from tests.llm_server import json_reply, server_error
    from tests.test_judge import RUBRIC, STAGE2_PAYLOAD, stage1_payload
    from tests.test_judge_cli import line

    with session_scope(server.engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    lines = [line(1), line(2)]
    reviewer = api_client.Client(server.base, server.secrets["reviewer"])
    with pytest.raises(api_client.ApiError) as err:  # importing is not judging
        reviewer.push_evaluations(lines, judge=True)
    assert err.value.status == 403
    bad = httpx.post(
        f"{server.base}/evaluations",
        params={"judge": "true"},
        content=jsonl([line(1), {"question": "Q?", "product": "acme"}]),
        headers=server.headers("lead"),
    )
    assert bad.status_code == 422 and bad.json()["line"] == 2, bad.text
    assert "nothing was judged" in bad.json()["detail"] and "request line 2" in bad.json()["detail"]
    assert llm_server.chat_requests == [] and count(server.engine, EvaluationSnapshot) == 0

    lead = api_client.Client(server.base, server.secrets["lead"])
    # line 1 is judged (Stage 1 + 2); line 2's Stage 1 fails after the client's retry
    llm_server.script(
        json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD), server_error(), server_error()
    )
    first = lead.push_evaluations(lines, judge=True, concurrency=1)
    assert (first["total"], first["judged"], first["skipped"]) == (2, 1, 0), first
    assert [f["line"] for f in first["failed"]] == [2]
    assert count(server.engine, EvaluationSnapshot) == 1
    with Session(server.engine) as session:
        snapshot = session.exec(select(EvaluationSnapshot)).one()
    assert snapshot.id == first["snapshot_ids"][0]
    assert snapshot.created_by == "ci-lead"  # the token's name is the writer

    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    again = httpx.post(  # a JSON array is accepted too; the judged line is skipped
        f"{server.base}/evaluations", params={"judge": "true"}, json=lines, headers=server.headers("lead")
    ).json()
    assert (again["judged"], again["skipped"], again["failed"]) == (1, 1, []), again
    assert count(server.engine, EvaluationSnapshot) == 2
    assert llm_server.pending == 0


@pytest.mark.pg_repeats("statements and lines of test_another_tools_results_file_imports_through_the_api")
def test_push_with_judge_without_an_llm_is_503_and_reads_nothing(server: Server) -> None:
    r = httpx.post(
        f"{server.base}/evaluations",
        params={"judge": "true"},
        content=jsonl([record(question="Q1?")]),
        headers=server.headers("lead"),
    )
    assert r.status_code == 503 and "OPENAI" in r.json()["detail"], r.text
    assert count(server.engine, EvaluationSnapshot) == 0


def _post_until_answered(
    port: int, method: str, path: str, headers: dict[str, str], total: int
) -> tuple[int, int]:
    """Send a `total`-byte body in 64 KiB chunks until the server answers (or stops reading):
    (the answer's status, body bytes sent). With `total` 0 the body is chunked and unbounded."""
    chunked = total == 0
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    block = b" " * 65536
    piece = b"10000\r\n" + block + b"\r\n" if chunked else block
    sent, limit = 0, total or 64 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        while sent < limit:
            readable, writable, _ = selectors_module.select([conn], [conn], [], 30)
            if readable or not writable:
                break
            try:
                conn.sendall(piece)
            except OSError:  # the server closed the connection after answering
                break
            sent += len(block)
        reply = conn.recv(4096)
    return int(reply.split(b" ", 2)[1]), sent


def _routes(*methods: str) -> list[tuple[str, str]]:
    """(method, path) of every API route answering one of `methods`, path parameters filled in."""
    found = []
    for route in create_app().routes:
        if isinstance(route, APIRoute):
            for method in sorted(route.methods & set(methods)):
                found.append((method, re.sub(r"\{[^}]+\}", "1", route.path)))
    return found


def test_no_route_lets_fastapi_read_the_body_before_the_token() -> None:
    """FastAPI reads and parses a declared body parameter before any dependency (the token) runs."""
    bodies = [r.path for r in create_app().routes if isinstance(r, APIRoute) and r.body_field is not None]
    assert bodies == []


@sqlite_only
@pytest.mark.parametrize(
    ("method", "path"),
    [*_routes("POST", "PATCH", "PUT", "DELETE"), ("GET", "/history?product=p"), ("POST", "/nope")],
)
def test_a_huge_body_without_a_token_is_refused_before_a_byte_is_read(
    server: Server, method: str, path: str
) -> None:
    """Issue 24.2: before, /notes, /judgments and /relevance/* read (and parsed) the whole body first."""
    assert server.meter is not None
    total = 64 * 1024 * 1024
    status, sent = _post_until_answered(server.port, method, API_PREFIX + path, {}, total)
    assert status in (401, 404)
    assert server.meter.read == 0
    assert sent < total  # answered while the client was still sending


@sqlite_only
@pytest.mark.parametrize(
    ("method", "path", "role"),
    [
        ("POST", "/notes", "reviewer"),
        ("PATCH", "/judgments/x", "reviewer"),
        ("POST", "/relevance/audits", "lead"),
        ("POST", "/relevance/scores", "lead"),
        ("POST", "/evaluations", "lead"),
        ("POST", "/queues", "lead"),
    ],
)
def test_every_body_is_capped_while_it_streams_even_without_a_length(
    server: Server, method: str, path: str, role: str
) -> None:
    """The fixture's caps are 1 MB: an unbounded chunked body stops there, not at the client's end."""
    assert server.meter is not None
    headers = {**server.headers(role), "If-Match": "1"}
    status, _ = _post_until_answered(server.port, method, API_PREFIX + path, headers, 0)
    assert status == 413
    assert server.meter.read < 2 * 1024 * 1024  # the cap plus what the server had buffered, of 64 MB sent
    declared = httpx.request(method, server.base + path, content=b" " * (1024 * 1024 + 1), headers=headers)
    assert declared.status_code == 413
    assert "OVERRULE_API_MAX_" in declared.json()["detail"]
    assert count(server.engine, SessionNote) == 0


def test_json_bodies_are_parsed_after_the_token_with_clear_errors(server: Server) -> None:
    headers = server.headers("reviewer")
    malformed = httpx.post(f"{server.base}/notes", content=b'{"content": ', headers=headers)
    assert malformed.status_code == 400
    assert "malformed JSON" in malformed.json()["detail"]
    not_object = httpx.post(f"{server.base}/notes", json=["x"], headers=headers)
    assert not_object.status_code == 422
    assert "JSON object" in not_object.json()["detail"]
    schema = httpx.get(f"{server.base}/openapi.json").json()
    assert "requestBody" in schema["paths"]["/notes"]["post"]


def test_a_viewer_token_cannot_export_the_access_records(server: Server) -> None:
    """Issue 24.7: the roles and the audit trail were a CSV away for any token; the Admin page refuses viewers."""
    for table in ("audit_events", "user_roles"):
        for role in ("viewer", "reviewer", "lead"):
            refused = httpx.get(
                f"{server.base}/exports/{table}", headers=server.headers(role), timeout=EXPORT_TIMEOUT
            )
            assert refused.status_code == 403, refused.text
            assert "admin" in refused.json()["detail"]
        allowed = httpx.get(
            f"{server.base}/exports/{table}", headers=server.headers("admin"), timeout=EXPORT_TIMEOUT
        )
        assert allowed.status_code == 200
        assert allowed.text.splitlines()[0].startswith(("id,", "identity,"))


def _wait_for_a_lock_wait(engine: Engine) -> None:
    """Until a backend of this test's database waits on a lock (a row or an advisory lock)."""

    def waiting() -> int:
        with engine.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).scalar_one()

    wait_until(waiting, "the second import to wait for the first")


def test_the_second_of_two_identical_imports_waits_and_reports_what_it_skipped(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24.10: on PostgreSQL the second caller got 422 "duplicate key ... run this one again"."""
    if server.engine.dialect.name != "postgresql":
        pytest.skip("SQLite writers already queue on the database's write lock")
    from lib import importer

    original = importer._write_evaluations
    first_wrote, release = threading.Event(), threading.Event()

    def paused(session: Session, prepared: Any) -> Any:  # the first import holds its transaction open
        report = original(session, prepared)
        if not first_wrote.is_set():
            first_wrote.set()
            release.wait(60)
        return report

    monkeypatch.setattr(importer, "_write_evaluations", paused)
    body, lead = jsonl([record(question=f"Q{i}?") for i in range(5)]), server.headers("lead")
    url = f"{server.base}/evaluations"
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.post, url, content=body, headers=lead, timeout=120)
        assert first_wrote.wait(60)
        second = pool.submit(httpx.post, url, content=body, headers=lead, timeout=120)
        try:
            _wait_for_a_lock_wait(server.engine)
        finally:
            release.set()
        won, lost = first.result(), second.result()
    assert (won.status_code, lost.status_code) == (200, 200), lost.text
    assert (won.json()["inserted"], lost.json()["inserted"], lost.json()["skipped"]) == (5, 0, 5)
    assert count(server.engine, EvaluationSnapshot) == 5


def test_two_identical_imports_at_once_store_each_row_once(server: Server) -> None:
    rows = [record(question=f"Q{i}?") for i in range(200)]
    body, lead = jsonl(rows), server.headers("lead")
    start = threading.Barrier(2)

    def post(_: int) -> httpx.Response:
        start.wait()
        return httpx.post(f"{server.base}/evaluations", content=body, headers=lead, timeout=120)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(post, range(2)))
    assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
    assert sorted(r.json()["inserted"] for r in results) == [0, 200]
    assert sum(r.json()["skipped"] for r in results) == 200
    assert count(server.engine, EvaluationSnapshot) == 200


def test_a_write_refused_by_another_writer_is_409_with_retry_after(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collision the import lock cannot prevent (another kind of writer) is no data error: 409, not 422."""
    from sqlalchemy.exc import IntegrityError

    from lib import bulk

    def refused(*_: Any, **__: Any) -> None:
        raise IntegrityError("INSERT", {}, Exception("duplicate key value violates unique constraint"))

    monkeypatch.setattr(bulk, "insert_tuples", refused)
    r = httpx.post(
        f"{server.base}/evaluations", content=jsonl([record(question="Q?")]), headers=server.headers("lead")
    )
    assert r.status_code == 409, r.text
    assert r.headers["retry-after"] == "1"
    assert "run this one again" in r.json()["detail"]


# --------------------------------------------------------------------------------------------
# Issue 24.11: refusals are audited (rate-limited); tokens expire and show their last use


@pytest.fixture
def fresh_refusal_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal rate limit is process-wide: each of these tests starts a minute of its own."""
    from lib import auth

    monkeypatch.setattr(auth, "_refusals", auth.AuditRate(auth.REFUSALS_PER_MINUTE, 60))


def audit_rows(engine: Engine, *actions: str) -> list[tuple[str, str, str]]:
    from lib.models import AuditEvent

    with Session(engine) as session:
        rows = session.exec(select(AuditEvent).where(AuditEvent.action.in_(actions)).order_by(AuditEvent.id))
        return [(e.identity, e.action, e.detail) for e in rows]


@pytest.mark.pg_repeats(
    "statements and lines of test_an_expired_token_is_refused_and_a_used_token_shows_when"
)
def test_refused_requests_are_audited_with_who_what_and_why(
    server: Server, fresh_refusal_window: None
) -> None:
    body = jsonl([record(question="Q1?")])
    httpx.post(f"{server.base}/evaluations", content=body)
    httpx.get(f"{server.base}/history", params={"product": "p"}, headers=server.headers("revoked"))
    httpx.post(f"{server.base}/evaluations", content=body, headers=server.headers("reviewer"))
    rows = audit_rows(server.engine, "api_refused")
    assert [(who, action) for who, action, _ in rows] == [
        ("anonymous", "api_refused"),
        ("old", "api_refused"),
        ("ci-reviewer", "api_refused"),
    ]
    assert rows[0][2].startswith("401 POST /api/v1/evaluations from 127.0.0.1: an API token is required")
    assert rows[1][2].startswith("401 GET /api/v1/history from 127.0.0.1: unknown or revoked API token")
    assert rows[2][2].startswith("403 POST /api/v1/evaluations from 127.0.0.1: ") and "'lead'" in rows[2][2]
    assert not any(server.secrets["revoked"] in detail for _, _, detail in rows)


@pytest.mark.pg_repeats(
    "statements and lines of test_an_expired_token_is_refused_and_a_used_token_shows_when"
)
def test_a_flood_of_refusals_cannot_fill_the_audit_trail(server: Server, fresh_refusal_window: None) -> None:
    from lib import auth

    bad = {"Authorization": "Bearer nope"}
    with httpx.Client(timeout=60) as http:
        statuses = {
            http.get(f"{server.base}/history", params={"product": "p"}, headers=bad).status_code
            for _ in range(120)
        }
    assert statuses == {401}  # every request still refused
    assert len(audit_rows(server.engine, "api_refused")) == auth.REFUSALS_PER_MINUTE
    (summary,) = audit_rows(server.engine, "refusals_dropped")
    # The count is refreshed every REFUSAL_COUNT_SECONDS: at least the first dropped one is in it.
    dropped = int(summary[2].split(" ", 1)[0])
    assert 1 <= dropped <= 120 - auth.REFUSALS_PER_MINUTE
    assert summary[:2] == ("rate limit", "refusals_dropped")


def test_the_rate_limit_counts_what_it_drops_and_opens_again_next_minute(
    engine: Engine, fresh_refusal_window: None
) -> None:
    from lib import auth

    limit = auth.REFUSALS_PER_MINUTE
    results = [
        auth.record_refusal(engine=engine, identity="x", detail=f"401 #{i}", clock=1000.0 + i * 0.01)
        for i in range(limit + 50)
    ]
    assert results == [True] * limit + [False] * 50
    (summary,) = audit_rows(engine, "refusals_dropped")
    assert summary[2].startswith("1 more refused")  # the others came within REFUSAL_COUNT_SECONDS
    auth.record_refusal(engine=engine, identity="x", detail="401 late", clock=1000.0 + 10)
    (summary,) = audit_rows(engine, "refusals_dropped")
    assert summary[2].startswith("51 more refused") and summary[2].endswith("the last: 401 late")
    assert auth.record_refusal(engine=engine, identity="x", detail="401 next minute", clock=1000.0 + 61)
    assert len(audit_rows(engine, "api_refused")) == limit + 1


def test_an_expired_token_is_refused_and_a_used_token_shows_when(
    server: Server, fresh_refusal_window: None
) -> None:
    from datetime import timedelta

    from lib.models import utcnow

    with Session(server.engine) as session:
        _, secret = create_token(
            session=session, actor=system_actor(), name="short", role="viewer", expires_in=timedelta(hours=1)
        )
        session.commit()
    headers = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{server.base}/history", params={"product": "p"}, headers=headers).status_code == 200
    with Session(server.engine) as session:
        used = session.exec(select(ApiToken).where(ApiToken.name == "short")).one()
        assert used.last_used_at is not None and used.last_used_at <= utcnow()
        used.expires_at = utcnow() - timedelta(seconds=1)
        session.add(used)
        session.commit()
    r = httpx.get(f"{server.base}/history", params={"product": "p"}, headers=headers)
    assert r.status_code == 401 and "this API token expired at" in r.json()["detail"]
    assert audit_rows(server.engine, "api_refused")[-1][0] == "short"


def test_another_tools_results_file_imports_through_the_api(server: Server) -> None:
    """Issue 29.2: `POST /imports/promptfoo` is `python -m lib import --kind promptfoo`, refusals 422."""
    results = Path(__file__).resolve().parent / "fixtures" / "sources" / "promptfoo_results.json"
    url = f"{server.base}/imports/promptfoo"
    r = httpx.post(
        url, params={"product": "geo"}, content=results.read_bytes(), headers=server.headers("lead")
    )
    assert r.status_code == 200, r.text
    assert (r.json()["inserted"], r.json()["judgments"]) == (3, 6)
    langfuse = results.with_name("langfuse_export_v3.jsonl").read_bytes()
    r = httpx.post(f"{server.base}/imports/langfuse", content=langfuse, headers=server.headers("lead"))
    # review18 M3: the ANNOTATION is counted as the reviewer's side; no "expert_reviews": 0 beside it
    assert (r.json()["judgments"], r.json()["reviewer_scores"]) == (6, 1) and "expert_reviews" not in r.json()
    # review18 M4: a .jsonl body is named as one, and the summary says where its lines went
    lines = results.with_name("promptfoo_results.jsonl").read_bytes()
    r = httpx.post(url, content=lines, headers=server.headers("lead"))
    assert (r.status_code, r.json()["source"], r.json()["defaulted"]) == (200, "promptfoo.jsonl", 3), r.text
    assert r.json()["summary"].endswith(
        "3 filed under the default product 'promptfoo' (the file names none: pass ?product=NAME)"
    )
    broken = json.loads(results.read_text(encoding="utf-8"))
    broken["results"]["results"][0]["gradingResult"]["componentResults"][0]["pass"] = "yes"
    r = httpx.post(url, content=json.dumps(broken).encode(), headers=server.headers("lead"))
    assert r.status_code == 422
    assert r.json()["field"] == "gradingResult.componentResults"
    assert "results.results[0]" in r.json()["detail"]
    assert (
        httpx.post(
            f"{server.base}/imports/braintrust", content=b"{}", headers=server.headers("lead")
        ).status_code
        == 404
    )
    assert httpx.post(url, content=b"{}", headers=server.headers("reviewer")).status_code == 403
    odd = httpx.post(
        url, params={"label_scores": "pass"}, content=results.read_bytes(), headers=server.headers("lead")
    )  # ?label_scores= reaches the reader (review7 F9)
    assert odd.status_code == 422 and "'pass' is not LABEL=SCORE" in odd.json()["detail"]
    assert count(server.engine, EvaluationSnapshot) == 9


@sqlite_only  # the importer behind it is the CLI's, tested on both databases in tests/test_source_import.py
def test_phoenix_evaluations_and_spans_import_through_the_api_as_two_file_parts(server: Server) -> None:
    """Issue 29: `POST /imports/phoenix` (multipart: evaluations + spans) is `import --kind phoenix
    --spans`; the token is checked before the body is read; a broken file is refused whole."""
    fixtures = Path(__file__).resolve().parent / "fixtures" / "sources"
    url = f"{server.base}/imports/phoenix"
    parquet = {
        "evaluations": ("evals.parquet", (fixtures / "phoenix_evaluations.parquet").read_bytes()),
        "spans": ("spans.parquet", (fixtures / "phoenix_spans.parquet").read_bytes()),
    }
    assert server.meter is not None
    read = server.meter.read
    refused = httpx.post(url, files=parquet)
    assert refused.status_code == 401 and server.meter.read == read  # not a byte of the body read
    assert httpx.post(url, files=parquet, headers=server.headers("reviewer")).status_code == 403
    assert server.meter.read == read

    r = httpx.post(url, params={"product": "library-qa"}, files=parquet, headers=server.headers("lead"))
    assert r.status_code == 200, r.text
    assert (r.json()["inserted"], r.json()["judgments"]) == (3, 3)
    with Session(server.engine) as session:
        assert set(session.exec(select(EvaluationSnapshot.product)).all()) == {"library-qa"}
    again = httpx.post(url, params={"product": "library-qa"}, files=parquet, headers=server.headers("lead"))
    assert (again.status_code, again.json()["inserted"]) == (200, 0)

    broken_csv = (
        (fixtures / "phoenix_evaluations.csv")
        .read_text(encoding="utf-8")
        .replace(",factual,,", ",factual,high,")
    )
    csv_files = {
        "evaluations": ("evals.csv", broken_csv.encode()),
        "spans": ("spans.csv", (fixtures / "phoenix_spans.csv").read_bytes()),
    }
    odd = httpx.post(url, params={"label_scores": "a=b"}, files=csv_files, headers=server.headers("lead"))
    assert odd.status_code == 422 and "'a=b' is not LABEL=SCORE" in odd.json()["detail"]
    # A label no rule scores: the refusal names the API's parameter, not the CLI's flag (review14 F3).
    cold = b"context.span_id,eval_name,label,explanation\na1b2c3d4e5f60718,Tone,cold,Curt.\n"
    r = httpx.post(url, files={**csv_files, "evaluations": ("e.csv", cold)}, headers=server.headers("lead"))
    assert r.status_code == 422 and "label 'cold' has no score" in r.json()["detail"], r.text
    assert "(?label_scores=cold=N,…)" in r.json()["detail"] and "--label-scores" not in r.json()["detail"]
    r = httpx.post(url, files=csv_files, headers=server.headers("lead"))
    assert r.status_code == 422
    assert (r.json()["file"], r.json()["line"], r.json()["field"]) == ("evaluations.csv", 2, "score")
    assert r.json()["detail"].startswith("evaluations.csv line 2, field 'score': 'high' is not a number")
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(fixtures / "phoenix_evaluations.parquet")
    ids = table.column("context.span_id").to_pylist()
    ids[1] = "ffffffffffffffff"
    sink = io.BytesIO()
    pq.write_table(table.set_column(table.schema.get_field_index("context.span_id"), "context.span_id",
                                    pa.array(ids)), sink)  # fmt: skip
    r = httpx.post(
        url, files={**parquet, "evaluations": ("e.parquet", sink.getvalue())}, headers=server.headers("lead")
    )
    assert r.status_code == 422
    assert (r.json()["file"], r.json()["row"], r.json()["field"]) == (
        "evaluations.parquet",
        2,
        "context.span_id",
    )
    assert "span 'ffffffffffffffff' is not in spans.parquet" in r.json()["detail"]

    missing = httpx.post(url, files={"evaluations": parquet["evaluations"]}, headers=server.headers("lead"))
    assert (missing.status_code, missing.json()["field"]) == (422, "spans")
    assert "the file part 'spans' is missing" in missing.json()["detail"]
    big = {**csv_files, "spans": ("spans.csv", b"x" * (1024 * 1024))}  # the fixture's cap: 1 MB in all
    too_big = httpx.post(url, files=big, headers=server.headers("lead"))
    assert too_big.status_code == 413 and "OVERRULE_API_MAX_BODY_MB" in too_big.json()["detail"]
    not_multipart = httpx.post(url, content=b"{}", headers=server.headers("lead"))
    assert not_multipart.status_code == 415 and "multipart/form-data" in not_multipart.json()["detail"]
    assert count(server.engine, EvaluationSnapshot) == 3
