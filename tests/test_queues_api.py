"""Team review queues over the pipeline API and the command line: the same lib.queues functions,
the permission table, blind-first payloads without judge data, clear errors (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from lib.auth import system_actor
from lib.db import session_scope
from lib.models import EvaluationSnapshot, Judgment, ReviewLabel
from lib.tokens import create_token
from tests.cli import run_cli
from tests.test_api import Server, server  # noqa: F401  (the fixture)

SECRET_REASON = "JUDGE-SAID-THIS"


def _evaluations(engine: Engine, n: int = 2) -> None:
    with session_scope(engine) as s:
        for i in range(n):
            s.add(
                EvaluationSnapshot(
                    id=f"e{i}", question=f"question {i}", model_answer=f"answer {i}", product="acme",
                    judge_scores_json={"clarity": 2}, evidence_json={"clarity": [{"quote": "answer", "why": SECRET_REASON}]},
                )
            )  # fmt: skip
            s.flush()
            s.add(Judgment(change_id=f"e{i}:clarity", product="acme", metric="clarity", snapshot_id=f"e{i}",
                           decision="2", reasoning=SECRET_REASON))  # fmt: skip


def _token(engine: Engine, name: str, role: str) -> dict[str, str]:
    with Session(engine) as session:
        _, secret = create_token(session=session, actor=system_actor(), name=name, role=role)
        session.commit()
    return {"Authorization": f"Bearer {secret}"}


def test_a_blind_first_team_queue_end_to_end_over_the_api(server: Server) -> None:  # noqa: F811
    _evaluations(server.engine)
    ana, ben = _token(server.engine, "ana", "reviewer"), _token(server.engine, "ben", "reviewer")
    with httpx.Client(base_url=server.base, timeout=30) as http:
        spec = {"name": "Blind pair", "overlap": 2, "mode": "blind", "size": 1}
        assert http.post("/queues", json=spec, headers=server.headers("reviewer")).status_code == 403
        assert (
            http.post("/queues", json={**spec, "size": "ten"}, headers=server.headers("lead")).json()["field"]
            == "size"
        )
        created = http.post("/queues", json=spec, headers=server.headers("lead"))
        assert created.status_code == 201, created.text
        queue_id = created.json()["id"]
        assert created.json()["items"] == 1 and created.json()["mode"] == "blind"
        assert http.post(f"/queues/{queue_id}/next", headers=server.headers("viewer")).status_code == 403

        first = http.post(f"/queues/{queue_id}/next", headers=ana)
        assert first.status_code == 200, first.text
        assert SECRET_REASON not in first.text and '"decision"' not in first.text  # nothing of the judge
        body = first.json()
        assert body["assignment"]["stage"] == "blind" and body["item"]["question"] == "question 0"
        item_id = body["item"]["item_id"]
        [metric] = body["item"]["metrics"]
        labels_url = f"/queues/{queue_id}/items/{item_id}/labels"
        bad = http.post(
            labels_url, json={"labels": [{"judgment_id": metric["judgment_id"], "decision": 9}]}, headers=ana
        )
        assert bad.status_code == 422
        blind = http.post(
            labels_url,
            json={"labels": [{"judgment_id": metric["judgment_id"], "decision": 4, "reason": "fine"}]},
            headers=ana,
        )
        assert blind.json() == {"stage": "blind", "revealed": True, "item_done": False,
                                "states": {str(metric["judgment_id"]): "open"}}  # fmt: skip
        revealed = http.get(f"/queues/{queue_id}/items/{item_id}", headers=ana)
        assert SECRET_REASON in revealed.text and revealed.json()["item"]["judgments"][0]["decision"] == "2"
        final = http.post(
            labels_url, json={"labels": [{"judgment_id": metric["judgment_id"], "decision": 4}]}, headers=ana
        )
        assert final.json()["item_done"] is True

        # Ben gets the same item (overlap 2); a third reviewer gets nothing.
        second = http.post(f"/queues/{queue_id}/next", headers=ben).json()
        assert second["item"]["item_id"] == item_id
        assert http.post(f"/queues/{queue_id}/next", headers=server.headers("reviewer")).json() == {
            "assignment": None, "item": None,
        }  # fmt: skip
        assert (
            http.get(f"/queues/{queue_id}/items/{item_id}", headers=server.headers("reviewer")).status_code
            == 409
        )
        http.post(
            labels_url, json={"labels": [{"judgment_id": metric["judgment_id"], "decision": 2}]}, headers=ben
        )
        done = http.post(
            labels_url, json={"labels": [{"judgment_id": metric["judgment_id"], "decision": 2}]}, headers=ben
        )
        assert done.json()["states"] == {str(metric["judgment_id"]): "disputed"}

        disputes = http.get(f"/queues/{queue_id}/disputes", headers=server.headers("viewer")).json()
        assert [(lv["reviewer"], lv["blind_decision"], lv["decision"]) for lv in disputes[0]["labels"]] == [
            ("ana", "4", "4"),
            ("ben", "2", "2"),
        ]
        adjudicate = f"/queues/{queue_id}/judgments/{metric['judgment_id']}/adjudicate"
        assert http.post(adjudicate, json={"decision": 3}, headers=ana).status_code == 403
        assert (
            http.post(adjudicate, json={"decision": 3}, headers=server.headers("lead")).status_code == 422
        )  # no reason
        decided = http.post(
            adjudicate, json={"decision": 3, "reason": "between"}, headers=server.headers("lead")
        )
        assert decided.json() == {
            "judgment_id": metric["judgment_id"],
            "state": "adjudicated",
            "decision": "3",
        }
        shown = http.get(f"/queues/{queue_id}", headers=server.headers("viewer")).json()
        assert shown["progress"]["adjudicated"] == 1 and shown["progress"]["items_done"] == 1
        assert {r["reviewer"] for r in shown["reviewers_progress"]} == {"ana", "ben"}
        assert [q["name"] for q in http.get("/queues", headers=ana).json()] == ["Blind pair"]
        assert http.get("/queues/nope", headers=ana).status_code == 404
        closed = http.patch(f"/queues/{queue_id}", json={"status": "closed"}, headers=server.headers("lead"))
        assert closed.json()["status"] == "closed"
    with Session(server.engine) as s:
        judgment = s.exec(select(Judgment).where(Judgment.change_id == "e0:clarity")).one()
        assert (judgment.user_decision, judgment.reviewer) == ("3", "ci-lead")


@pytest.fixture
def cli_db(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("OVERRULE_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    return engine


def test_the_command_line_runs_a_queue_from_creation_to_adjudication(cli_db: Engine) -> None:
    _evaluations(cli_db)
    created = run_cli("queue", "create", "--name", "Pair", "--overlap", "2", "--size", "1", "--by", "boss")
    assert created.returncode == 0, created.stderr
    assert "queue 1 'Pair' created: 1 items, 1 judgments; overlap 2" in created.stdout
    assert run_cli("queue", "create", "--name", "Pair").stderr.startswith(
        "error: queue create: a queue named"
    )
    shown = run_cli("queue", "next", "Pair", "--reviewer", "ana", "--format", "json")
    item = json.loads(shown.stdout)
    judgment_id = item["item"]["judgments"][0]["judgment_id"]
    labelled = run_cli(
        "queue", "label", "Pair", "--reviewer", "ana", "--judgment", str(judgment_id), "--decision", "4"
    )
    assert labelled.returncode == 1 and "reason is required" in labelled.stderr
    run_cli(
        "queue",
        "label",
        "1",
        "--reviewer",
        "ana",
        "--judgment",
        str(judgment_id),
        "--decision",
        "4",
        "--reason",
        "ok",
    )
    run_cli("queue", "next", "Pair", "--reviewer", "ben")
    out = run_cli(
        "queue", "label", "Pair", "--reviewer", "ben", "--judgment", str(judgment_id), "--decision", "2"
    )
    assert out.stdout.strip() == f"final label saved for judgment {judgment_id}: disputed"
    disputes = run_cli("queue", "disputes", "Pair")
    assert "ana: 4 (ok); ben: 2" in disputes.stdout
    decided = run_cli(
        "queue", "adjudicate", "Pair", "--judgment", str(judgment_id), "--decision", "2", "--by", "boss"
    )
    assert decided.returncode == 0, decided.stderr
    undone = run_cli(
        "queue", "undo", "Pair", "--judgment", str(judgment_id), "--adjudication", "--reviewer", "boss"
    )
    assert undone.stdout == f"adjudication of judgment {judgment_id} undone: it awaits adjudication again\n"
    again = ("queue", "adjudicate", "Pair", "--judgment", str(judgment_id), "--decision", "2", "--by", "boss")
    assert run_cli(*again).stdout == f"judgment {judgment_id} adjudicated: 2\n"
    listed = run_cli("queue", "list")
    assert (
        "Pair\tactive\topen\toverlap 2\t1/1 items done\t0 reserved\t0 awaiting adjudication" in listed.stdout
    )
    csv = run_cli("queue", "show", "Pair", "--format", "csv")
    assert csv.stdout.splitlines()[0].startswith("reviewer,assigned,done")
    assert run_cli("queue", "next", "Pair", "--reviewer", "cem").stdout.startswith("nothing left for cem")
    assert run_cli("queue", "show", "Nope").stderr.startswith("error: queue show: no review queue")
    with Session(cli_db) as s:
        assert len(s.exec(select(ReviewLabel)).all()) == 2


def test_the_command_line_prints_a_blind_item_without_the_judge(cli_db: Engine) -> None:
    _evaluations(cli_db, 1)
    run_cli("queue", "create", "--name", "Blind", "--mode", "blind")
    for fmt in ("text", "json"):
        shown = run_cli("queue", "next", "Blind", "--reviewer", "ana", "--format", fmt)
        assert shown.returncode == 0 and "question 0" in shown.stdout
        assert SECRET_REASON not in shown.stdout and "judge" not in shown.stdout.replace("judgment", "")
