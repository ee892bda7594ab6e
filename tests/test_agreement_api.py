"""Agreement between reviewers end to end: a blind-first team queue labelled and adjudicated through
lib.queues, then read over the pipeline API (`/queues/{queue}/agreement`, `/agreement`) and the
command line (`queue agreement`), which call the same lib.agreement functions."""

from __future__ import annotations

import csv
import io
import json

import httpx
import krippendorff
import numpy as np
import pytest
from sqlalchemy import Engine

from lib import queues
from lib.auth import Actor
from lib.db import session_scope
from lib.queues import LabelInput, QueueSpec
from tests.cli import run_cli
from tests.test_api import Server, server  # noqa: F401  (the fixture)
from tests.test_queues_api import _evaluations

LEAD = Actor(identity="lead", role="lead")
# Per evaluation (the judge says 2): ana's (blind, final) label, ben's (blind, final) label. The final
# labels agree except on the fourth (ana 2, ben 4), which a lead adjudicates as 3.
LABELS = [((4, 4), (4, 4)), ((1, 2), (3, 2)), ((5, 3), (3, 3)), ((2, 2), (5, 4)), ((3, 2), (1, 2))]


def labelled_blind_queue(engine: Engine) -> int:
    """Five evaluations in a blind-first queue with overlap 2; ana and ben label all; a lead settles
    the one dispute (ana 2, ben 4 on the fourth) as 3."""
    _evaluations(engine, len(LABELS))
    with session_scope(engine) as s:
        queue = queues.create_queue(
            session=s, actor=LEAD, spec=QueueSpec(name="Blind pair", overlap=2, mode="blind", size=10)
        )
        assert queue.id is not None
        queue_id = queue.id
    for index, reviewer in enumerate(("ana", "ben")):
        for _ in LABELS:
            with session_scope(engine) as s:
                held = queues.next_assignment(session=s, queue_id=queue_id, reviewer=reviewer)
                assert held is not None
                blind_item = queues.load_blind_item(
                    session=s, queue_id=queue_id, item_id=held.item_id, reviewer=reviewer
                )
                position = int(blind_item.question.rsplit(" ", 1)[1])
                blind, final = LABELS[position][index]
                [metric] = blind_item.metrics
                for value in (blind, final):
                    queues.label_item(
                        session=s, queue_id=queue_id, item_id=held.item_id, reviewer=reviewer,
                        labels=[LabelInput(metric.judgment_id, value, reason="seen")],
                    )  # fmt: skip
    with session_scope(engine) as s:
        [dispute] = queues.disputes(session=s, queue_id=queue_id)
        queues.adjudicate(
            session=s, queue_id=queue_id, judgment_id=dispute.judgment.id or 0, actor=LEAD, decision="3",
            reason="between the two",
        )  # fmt: skip
    return queue_id


def reference_alpha(which: int) -> float:
    data = np.array([[LABELS[u][r][which] for u in range(len(LABELS))] for r in (0, 1)], dtype=float)
    return float(krippendorff.alpha(reliability_data=data, level_of_measurement="ordinal"))


def test_the_api_serves_a_queues_agreement_computed_from_its_labels(server: Server) -> None:  # noqa: F811
    queue_id = labelled_blind_queue(server.engine)
    viewer = server.headers("viewer")
    with httpx.Client(base_url=server.base, timeout=60) as http:
        got = http.get(f"/queues/{queue_id}/agreement", headers=viewer)
        assert got.status_code == 200, got.text
        body = got.json()
        [row] = body["metrics"]
        assert (row["metric"], row["level"], row["items"], row["reviewers"]) == ("clarity", "ordinal", 5, 2)
        assert row["alpha"] == pytest.approx(reference_alpha(1))
        assert row["alpha_lo"] <= row["alpha"] <= row["alpha_hi"]
        [pair] = body["pairs"]
        assert (pair["reviewer_a"], pair["reviewer_b"], pair["items"]) == ("ana", "ben", 5)
        calibration = {(r["reviewer"], r["metric_name"]): r for r in body["calibration"]}
        for reviewer in ("ana", "ben"):  # both labelled the adjudicated item, neither with 3
            row = calibration[(reviewer, "(all metrics)")]
            assert (row["decided"], row["adjudicated"], row["adjudicated_against"]) == (5, 1, 1)
        anchoring = {(r["reviewer"], r["metric_name"]): r for r in body["anchoring"]}
        # ana: 1->2, 5->3, 3->2 toward the judge's 2; ben: 3->2, 5->4, 1->2.
        for reviewer in ("ana", "ben"):
            row = anchoring[(reviewer, "(all metrics)")]
            assert (row["labels"], row["moved_toward_judge"], row["moved_away"]) == (5, 3, 0)

        blind = http.get(
            f"/queues/{queue_id}/agreement", params={"basis": "blind", "table": "metrics"}, headers=viewer
        ).json()
        assert set(blind) == {"labels", "metrics"}
        assert blind["metrics"][0]["alpha"] == pytest.approx(reference_alpha(0))

        everything = http.get("/agreement", params={"product": "acme", "resamples": 0}, headers=viewer).json()
        assert everything["metrics"][0]["alpha_lo"] is None  # no resamples: no interval, null in JSON
        assert http.get("/agreement", params={"product": "other"}, headers=viewer).json()["metrics"] == []

        assert (
            http.get(f"/queues/{queue_id}/agreement", params={"table": "nope"}, headers=viewer).status_code
            == 422
        )
        assert (
            http.get(f"/queues/{queue_id}/agreement", params={"basis": "x"}, headers=viewer).status_code
            == 422
        )
        assert (
            http.get("/agreement", params={"resamples": 10**7}, headers=viewer).json()["field"] == "resamples"
        )
        assert http.get("/queues/nope/agreement", headers=viewer).status_code == 404
        assert http.get("/agreement").status_code == 401


@pytest.fixture
def cli_db(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("OVERRULE_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    return engine


def test_the_command_line_prints_agreement_as_text_json_and_csv(cli_db: Engine) -> None:
    labelled_blind_queue(cli_db)
    text_out = run_cli("queue", "agreement", "Blind pair")
    assert text_out.returncode == 0, text_out.stderr
    assert text_out.stdout.startswith("10 labels (final labels)")
    for table in ("metrics", "pairs", "calibration", "anchoring"):
        assert f"== {table}" in text_out.stdout
    as_json = json.loads(run_cli("queue", "agreement", "--format", "json", "--table", "metrics").stdout)
    assert as_json["metrics"][0]["alpha"] == pytest.approx(reference_alpha(1))
    pairs = run_cli("queue", "agreement", "Blind pair", "--table", "pairs", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(pairs.stdout)))
    assert [(r["reviewer_a"], r["reviewer_b"], r["items"]) for r in rows] == [("ana", "ben", "5")]
    refused = run_cli("queue", "agreement", "--format", "csv")
    assert refused.returncode == 1 and "--format csv prints one table" in refused.stderr
    assert "unknown table" in run_cli("queue", "agreement", "--table", "bogus").stderr
    assert run_cli("queue", "agreement", "Nope").stderr.startswith("error: queue agreement: no review queue")
