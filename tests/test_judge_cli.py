"""`python -m lib judge FILE` and `python -m lib second-opinion`: batches, resumption, failures.

The CLI runs in-process (`main(argv)`) against the local OpenAI-compatible server and a real
database on each backend; one test runs it as a real subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, select

from lib.__main__ import main, progress_bar
from lib.config import reset_settings
from lib.db import session_scope
from lib.metrics import upsert_metric_definitions
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, utcnow
from tests.llm_server import LLMServer, json_reply, server_error, text
from tests.test_judge import RUBRIC, STAGE2_PAYLOAD, stage1_payload

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
ANSWER = "Paris is the capital of France. It has about 2 million residents. The tower dates from 1889."


@pytest.fixture
def cli_db(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """The CLI's database is the test engine's (OVERRULE_DATABASE_URL), with the test rubric."""
    monkeypatch.setenv("OVERRULE_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    reset_settings()
    with session_scope(engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    return engine


def line(n: int, **extra: Any) -> dict[str, Any]:
    record = {
        "question": f"Question {n}: tell me about Paris.",
        "model_answer": ANSWER,
        "product": "acme",
        "model_name": "mistral-nemo",
        "user_scores": {"coherence": 2, "fluency": {"score": 4, "reason": "ok"}},
    }
    record.update(extra)
    return record


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n", encoding="utf-8"
    )
    return path


def snapshot_questions(engine: Engine) -> list[str]:
    with Session(engine) as session:
        return sorted(session.exec(select(EvaluationSnapshot.question)).all())


def stage1_questions(server: LLMServer) -> list[str]:
    """The questions of the Stage 1 requests the server received."""
    out = []
    for body in server.chat_requests:
        if "Stage 1" in body["messages"][0]["content"]:
            content = body["messages"][1]["content"]
            out.append(content.split("<<<QUESTION\n", 1)[1].split("\nQUESTION>>>", 1)[0])
    return out


def failing_on(marker: str) -> Any:
    """A responder that fails every Stage 1 request whose question contains `marker`."""

    def respond(body: dict[str, Any]) -> Any:
        if "Stage 1" in body["messages"][0]["content"]:
            if marker and marker in body["messages"][1]["content"]:
                return server_error()
            return json_reply(stage1_payload())
        return json_reply(STAGE2_PAYLOAD)

    return respond


def test_a_failed_line_is_reported_and_a_rerun_judges_only_what_is_left(
    cli_db: Engine, llm_server: LLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = write_jsonl(tmp_path / "batch.jsonl", [line(n) for n in range(1, 6)])
    llm_server.responder = failing_on("Question 3:")
    assert main(["judge", str(batch), "--concurrency", "2"]) == 1
    out, err = capsys.readouterr()
    assert out.strip() == "5 lines: 4 judged, 0 already judged (skipped), 1 failed"
    assert "batch.jsonl line 3: The judge's scoring failed" in err
    assert "rerun the same command" in err
    assert snapshot_questions(cli_db) == [f"Question {n}: tell me about Paris." for n in (1, 2, 4, 5)]

    first_run = len(llm_server.requests)
    llm_server.responder = failing_on("")
    assert main(["judge", str(batch), "--concurrency", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "5 lines: 1 judged, 4 already judged (skipped), 0 failed"
    llm_server.requests[:first_run] = []  # only what the second run sent
    llm_server.paths[:first_run] = []
    assert stage1_questions(llm_server) == ["Question 3: tell me about Paris."]
    assert len(snapshot_questions(cli_db)) == 5
    with Session(cli_db) as session:
        assert session.exec(select(func.count()).select_from(Judgment)).one() == 15
        assert set(session.exec(select(EvaluationSnapshot.created_by)).all()) == {"cli"}


@pytest.mark.pg_repeats("statements and lines of test_duplicate_lines_in_one_file_are_judged_once")
def test_progress_goes_to_stderr_and_the_summary_to_stdout(
    cli_db: Engine, llm_server: LLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = write_jsonl(tmp_path / "b.jsonl", [line(1), line(2)])
    llm_server.responder = failing_on("")
    assert main(["judge", str(batch), "--reviewer", "pipeline-7"]) == 0
    out, err = capsys.readouterr()
    assert out == "2 lines: 2 judged, 0 already judged (skipped), 0 failed\n"
    assert err.endswith(f"\r{progress_bar(2, 2)}\n")
    assert f"\r{progress_bar(0, 2)}" in err
    with Session(cli_db) as session:
        assert set(session.exec(select(EvaluationSnapshot.created_by)).all()) == {"pipeline-7"}


def test_duplicate_lines_in_one_file_are_judged_once(
    cli_db: Engine, llm_server: LLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = write_jsonl(tmp_path / "b.jsonl", [line(1), "", line(1, user_scores={"fluency": 1}), line(2)])
    llm_server.responder = failing_on("")
    assert main(["judge", str(batch)]) == 0
    assert capsys.readouterr().out.strip() == "3 lines: 2 judged, 1 already judged (skipped), 0 failed"
    assert len(stage1_questions(llm_server)) == 2


def test_the_pool_never_has_more_requests_in_flight_than_the_concurrency(
    cli_db: Engine, llm_server: LLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = write_jsonl(tmp_path / "b.jsonl", [line(n, user_scores={}) for n in range(1, 9)])
    lock = threading.Lock()
    in_flight = peak = 0

    def respond(body: dict[str, Any]) -> Any:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.05)  # long enough for the other workers' requests to arrive meanwhile
        with lock:
            in_flight -= 1
        return json_reply(stage1_payload())

    llm_server.responder = respond
    assert main(["judge", str(batch), "--concurrency", "3"]) == 0
    assert capsys.readouterr().out.strip() == "8 lines: 8 judged, 0 already judged (skipped), 0 failed"
    assert 1 <= peak <= 3


@pytest.mark.pg_repeats("statements and lines of test_duplicate_lines_in_one_file_are_judged_once")
@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([line(1), "{not json"], "b.jsonl line 2: invalid JSON"),
        ([line(1), {"question": "q", "product": "acme"}], "b.jsonl line 2: field 'model_answer' is required"),
        ([line(1, user_scores={"wit": 3})], "b.jsonl line 1: user_scores: metric 'wit' is not defined"),
        ([line(1, user_scores={"coherence": 5})], "b.jsonl line 1: user_scores.coherence: score 5"),
    ],
)
def test_a_bad_line_refuses_the_whole_file_before_any_llm_call(
    cli_db: Engine,
    llm_server: LLMServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    records: list,
    message: str,
) -> None:
    batch = write_jsonl(tmp_path / "b.jsonl", records)
    assert main(["judge", str(batch)]) == 1
    err = capsys.readouterr().err
    assert message in err and "nothing was judged" in err
    assert llm_server.requests == []
    assert snapshot_questions(cli_db) == []


@pytest.mark.pg_repeats("statements and lines of test_duplicate_lines_in_one_file_are_judged_once")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["judge", "missing.jsonl"], "no such file"),
        (["judge", "{file}", "--concurrency", "0"], "--concurrency must be between 1 and 64"),
    ],
)
def test_cli_usage_errors_exit_non_zero(
    cli_db: Engine, llm_server: LLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    argv: list[str], message: str,
) -> None:  # fmt: skip
    batch = write_jsonl(tmp_path / "b.jsonl", [line(1)])
    assert main([a.format(file=batch) for a in argv]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.pg_repeats("statements and lines of test_duplicate_lines_in_one_file_are_judged_once")
@pytest.mark.parametrize("command", [["judge", "{file}"], ["second-opinion", "--product", "acme"]])
def test_without_an_llm_the_commands_say_how_to_configure_one(
    cli_db: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    batch = write_jsonl(tmp_path / "b.jsonl", [line(1)])
    assert main([a.format(file=batch) for a in command]) == 1
    assert "OPENAI_API_KEY" in capsys.readouterr().err


@pytest.mark.slow  # a new interpreter importing the whole stack
def test_judge_runs_as_a_real_subprocess(sqlite_url: str, llm_server: LLMServer, tmp_path: Path) -> None:
    batch = write_jsonl(tmp_path / "b.jsonl", [line(1, product="plain", user_scores={})])
    scores = {"truthfulness": {"score": 5, "rationale": "Every claim is true."}}
    llm_server.default_reply = json_reply({"independent_scores": scores, "evidence": {}})
    env = {
        "PATH": "/usr/bin:/bin",
        "OVERRULE_DATABASE_URL": sqlite_url,
        "OVERRULE_LOAD_DEMO": "false",
        "OPENAI_BASE_URL": llm_server.base_url,
        "OPENAI_API_KEY": "test",
        "OVERRULE_LLM_MAX_RETRIES": "0",
    }
    result = subprocess.run(
        [sys.executable, "-m", "lib", "judge", str(batch)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1 lines: 1 judged, 0 already judged (skipped), 0 failed\n"
    assert progress_bar(1, 1) in result.stderr


# -- second-opinion ---------------------------------------------------------------------------------

LONG_ANSWER = "The answer explains the capital, the population and the history of the city in detail. " * 2


def add_snapshot_judgments(engine: Engine) -> None:
    """Three judgments: two the seed's threshold admits, one below its confidence threshold."""
    with session_scope(engine) as session:
        session.add(EvaluationSnapshot(id="snap_a", question="Q?", model_answer=LONG_ANSWER, product="acme"))
        session.flush()
        now = utcnow()
        for age, (metric, confidence) in enumerate(
            (("groundedness", 0.1), ("fluency", 0.5), ("coherence", 0.8))
        ):
            session.add(Judgment(change_id=f"snap_a:{metric}", product="acme", metric=metric,
                                 snapshot_id="snap_a", decision="1", confidence=confidence,
                                 timestamp=now - timedelta(minutes=age)))  # fmt: skip


def test_second_opinion_batch_validates_eligible_judgments_and_reports(
    cli_db: Engine, llm_server: LLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    add_snapshot_judgments(cli_db)
    llm_server.default_reply = text(
        "VALID: YES\nCONFIDENCE_APPROPRIATE: YES\nIMPROVED_CODE: NONE\nEVALUATION: ok"
    )
    assert main(["second-opinion", "--product", "acme", "--reviewer", "lead"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == "2 second opinions (2 validated), 1 below the evaluation threshold (skipped), 0 failed"
    with Session(cli_db) as session:
        rows = {j.metric: j for j in session.exec(select(Judgment)).all()}
        events = session.exec(select(JudgmentEvent)).all()
    assert rows["coherence"].second_opinion_confidence == pytest.approx(0.9)
    assert rows["fluency"].second_opinion_confidence == pytest.approx(0.6)
    assert rows["groundedness"].second_opinion_at is None
    assert sorted((e.change_id, e.action, e.reviewer) for e in events) == [
        ("snap_a:coherence", "second_opinion", "lead"),
        ("snap_a:fluency", "second_opinion", "lead"),
    ]


@pytest.mark.pg_repeats(
    "statements and lines of test_second_opinion_batch_validates_eligible_judgments_and_reports"
)
def test_second_opinion_limit_and_failures_are_reported(
    cli_db: Engine, llm_server: LLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    add_snapshot_judgments(cli_db)
    llm_server.script(server_error(), server_error())
    assert main(["second-opinion", "--product", "acme", "--limit", "1"]) == 1
    out, err = capsys.readouterr()
    # Newest first: groundedness is below the threshold, fluency is the one judgment the limit admits.
    assert out.strip() == "0 second opinions (none), 1 below the evaluation threshold (skipped), 1 failed"
    assert "snap_a:fluency: The evaluation model failed; the judgment is unchanged." in err
    with Session(cli_db) as session:
        assert session.exec(select(func.count()).select_from(JudgmentEvent)).one() == 0
