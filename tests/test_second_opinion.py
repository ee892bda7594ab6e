"""Second opinions (seed 000 evaluation layer) end to end: prompt, parsing, rules, storage, batches.

The evaluation model is the local OpenAI-compatible server behind the real openai client; the
database is SQLite and PostgreSQL through the `engine` fixture.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, select

from lib import second_opinion
from lib.config import Settings, reset_settings
from lib.corrections import DecisionScale, record_review
from lib.db import session_scope
from lib.evaluation_layer import EvaluationVerdict
from lib.metrics import MetricSpec, upsert_metric_definitions
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, utcnow
from lib.second_opinion import (
    JudgmentContext,
    build_evaluation_messages,
    checked_verdict,
    decide,
    request_second_opinion,
    second_opinion_batch,
)
from tests.llm_server import LLMServer, server_error, stall, text

pytestmark = pytest.mark.timeout(60)

ANSWER = (
    "Einstein received the 1921 Nobel Prize in Chemistry for his work on the photoelectric effect, "
    "which laid the foundation of quantum theory."
)
VALID = "VALID: YES\nCONFIDENCE_APPROPRIATE: YES\nIMPROVED_CODE: NONE\nEVALUATION: The score fits the error."
RUBRIC = [{"product": "acme", "slug": "truthfulness", "display_name": "Truthfulness", "min": 1, "max": 5,
           "description": "Are the factual claims correct?"}]  # fmt: skip
EVIDENCE = {
    "truthfulness": {
        "evidence": [
            {
                "quote": "Nobel Prize in Chemistry",
                "why": "It was Physics.",
                "verified": True,
                "stage": "exact",
            }
        ]
    }
}


@pytest.fixture
def judged(engine: Engine) -> Engine:
    """A snapshot with a truthfulness judgment (id 1): decision 2 at 0.8 confidence."""
    with session_scope(engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
        session.add(EvaluationSnapshot(id="snap_e", question="Who won the 1921 Nobel?", model_answer=ANSWER,
                                       product="acme", evidence_json=EVIDENCE))  # fmt: skip
        session.flush()
        session.add(Judgment(change_id="snap_e:truthfulness", product="acme", metric="truthfulness",
                             snapshot_id="snap_e", decision="2", confidence=0.8,
                             reasoning="JUDGE-REASONING: wrong prize category."))  # fmt: skip
    return engine


def the_judgment(engine: Engine, change_id: str = "snap_e:truthfulness") -> Judgment:
    with Session(engine) as session:
        return session.exec(select(Judgment).where(Judgment.change_id == change_id)).one()


def events(engine: Engine) -> list[JudgmentEvent]:
    with Session(engine) as session:
        return list(session.exec(select(JudgmentEvent)).all())


def judgment_id(engine: Engine, change_id: str = "snap_e:truthfulness") -> int:
    value = the_judgment(engine, change_id).id
    assert value is not None
    return value


# -- the prompt -------------------------------------------------------------------------------------


def context(**overrides: Any) -> JudgmentContext:
    values: dict[str, Any] = {
        "judgment_id": 1,
        "change_id": "snap_e:truthfulness",
        "product": "acme",
        "metric": "truthfulness",
        "decision": "2",
        "confidence": 0.8,
        "reasoning": "JUDGE-REASONING",
        "question": "Who won?",
        "text": ANSWER,
        "scale": DecisionScale(
            spec=MetricSpec("truthfulness", "Truthfulness", 1, 5, True, "Are claims true?")
        ),
        "evidence": (EVIDENCE["truthfulness"]["evidence"][0],),
    }
    values.update(overrides)
    return JudgmentContext(**values)


@pytest.mark.parametrize(
    "expected",
    [
        "Metric: Truthfulness (truthfulness), scale 1–5",
        "Rubric: Are claims true?",
        "<<<TEXT\n" + ANSWER + "\nTEXT>>>",
        "<<<QUESTION\nWho won?\nQUESTION>>>",
        "Decision: 2",
        "Confidence: 80%",
        "Reasoning: JUDGE-REASONING",
        '1. "Nobel Prize in Chemistry" (verified) — It was Physics.',
        "VALID: YES or NO",
        "IMPROVED_CODE: a better score on the scale 1–5, or NONE",
        "IMPROVED_CONFIDENCE: your confidence in the improved decision, 0-100",
        "EVALUATION: your assessment",
    ],
)
def test_the_evaluation_prompt_has_the_text_the_judgment_and_the_seed_format(expected: str) -> None:
    messages = build_evaluation_messages(context())
    assert expected in "\n".join(m["content"] for m in messages)


def test_a_label_judgment_prompt_offers_the_labels_and_says_when_confidence_is_missing() -> None:
    ctx = context(metric=None, decision="INCLUDE", confidence=None, question=None, evidence=(),
                  text="PR #12: adds a Turkish locale", scale=DecisionScale(labels=("INCLUDE", "EXCLUDE", "UNCERTAIN")))  # fmt: skip
    prompt = "\n".join(m["content"] for m in build_evaluation_messages(ctx))
    assert "IMPROVED_CODE: one of INCLUDE, EXCLUDE, UNCERTAIN, or NONE" in prompt
    assert "Confidence: not given" in prompt and "PR #12: adds a Turkish locale" in prompt
    assert "QUESTION" not in prompt


# -- rules --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("improved", "kept"),
    [
        ("3", "3"),
        ("3.0", "3"),  # written as a reviewer would write it
        ("7", None),  # off the 1–5 scale
        ("two", None),
        ("2", None),  # the same decision is no improvement
    ],
)
def test_improvements_must_be_a_different_decision_on_the_scale(improved: str, kept: str | None) -> None:
    verdict = checked_verdict(EvaluationVerdict(improved_code=improved, improved_confidence=0.9), context())
    assert verdict.improved_code == kept


def test_label_improvements_are_normalised_to_the_label_set() -> None:
    ctx = context(decision="INCLUDE", scale=DecisionScale(labels=("INCLUDE", "EXCLUDE", "UNCERTAIN")))
    assert checked_verdict(EvaluationVerdict(improved_code="exclude"), ctx).improved_code == "EXCLUDE"
    assert checked_verdict(EvaluationVerdict(improved_code="MAYBE"), ctx).improved_code is None


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        (EvaluationVerdict(valid=True), ("2", None, "validated")),
        (EvaluationVerdict(valid=False), ("2", None, "questioned")),
        (EvaluationVerdict(improved_code="4", improved_confidence=0.6), ("4", 0.6, "improved")),
        (EvaluationVerdict(improved_code="4", valid=False), ("2", None, "questioned")),
        (EvaluationVerdict(evaluation="hmm"), ("2", None, "unchanged")),
    ],
)
def test_without_a_confidence_only_an_improvement_sets_one(
    verdict: EvaluationVerdict, expected: tuple
) -> None:
    assert decide(context(confidence=None), verdict) == expected


# -- one second opinion, end to end -------------------------------------------------------------------


@pytest.mark.pg_repeats("statements and lines of test_a_batch_limit_takes_the_newest_eligible_judgments")
@pytest.mark.parametrize(
    ("reply", "action", "valid", "decision", "confidence"),
    [
        (VALID, "validated", True, "2", 0.9),
        ("**VALID:** NO\n**EVALUATION:** The category is right, the score too lenient.", "questioned", False,
         "2", 0.56),
        ("```\nVALID: NO\nIMPROVED_CODE: 1\nIMPROVED_CONFIDENCE: 95%\nIMPROVED_REASONING: a core fact is wrong\n"
         "EVALUATION: Too lenient.\n```", "improved", False, "1", 0.95),
        ("VALID: YES\nIMPROVED_CODE: 1\nIMPROVED_CONFIDENCE: 50\nEVALUATION: ok", "validated", True, "2", 0.9),
    ],
)  # fmt: skip
def test_a_second_opinion_is_stored_beside_the_judges_decision_with_an_event(
    judged: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch,
    reply: str, action: str, valid: bool, decision: str, confidence: float,
) -> None:  # fmt: skip
    monkeypatch.setenv("OVERRULE_EVAL_MODEL", "eval-x")
    reset_settings()
    llm_server.script(text(reply))
    opinion = request_second_opinion(engine=judged, judgment_id=judgment_id(judged), reviewer="lead")
    assert opinion.ok, opinion.error
    assert (opinion.action, opinion.valid, opinion.decision) == (action, valid, decision)
    assert opinion.confidence == pytest.approx(confidence)
    row = the_judgment(judged)
    assert (row.decision, row.confidence, row.version) == ("2", 0.8, 1)  # the judge's record stands
    assert (row.second_opinion_action, row.second_opinion_valid, row.second_opinion_decision) == (
        action, valid, decision)  # fmt: skip
    assert row.second_opinion_confidence == pytest.approx(confidence)
    assert row.second_opinion_model == "eval-x" and row.second_opinion_at is not None
    assert row.second_opinion_text and "```" not in row.second_opinion_text
    [event] = events(judged)
    assert (event.action, event.reviewer, event.from_decision, event.to_decision, event.version) == (
        "second_opinion", "lead", "2", decision, 1)  # fmt: skip
    assert llm_server.chat_requests[0]["model"] == "eval-x"
    assert "JUDGE-REASONING: wrong prize category." in llm_server.chat_requests[0]["messages"][1]["content"]


@pytest.mark.pg_repeats("statements and lines of test_a_batch_limit_takes_the_newest_eligible_judgments")
def test_an_improvement_explains_itself_in_the_stored_text(judged: Engine, llm_server: LLMServer) -> None:
    llm_server.script(text("VALID: NO\nIMPROVED_CODE: 1\nIMPROVED_CONFIDENCE: 90\n"
                           "IMPROVED_REASONING: a core fact is wrong\nEVALUATION: Too lenient."))  # fmt: skip
    request_second_opinion(engine=judged, judgment_id=judgment_id(judged), reviewer="lead")
    assert (
        the_judgment(judged).second_opinion_text
        == "Too lenient.\n\nImproved decision 1: a core fact is wrong"
    )


@pytest.mark.pg_repeats("statements and lines of test_a_batch_limit_takes_the_newest_eligible_judgments")
@pytest.mark.parametrize(
    ("replies", "message"),
    [
        ([server_error(), server_error()], "HTTP 500"),
        ([text("I think it is probably fine.")], "none of VALID, IMPROVED_CODE or EVALUATION"),
    ],
)
def test_a_failed_evaluation_leaves_the_judgment_as_it_was(
    judged: Engine, llm_server: LLMServer, replies: list, message: str
) -> None:
    llm_server.script(*replies)
    opinion = request_second_opinion(engine=judged, judgment_id=judgment_id(judged), reviewer="lead")
    assert not opinion.ok
    assert message in (opinion.error or "") and "the judgment is unchanged" in (opinion.error or "")
    row = the_judgment(judged)
    assert row.second_opinion_at is None and row.second_opinion_action is None
    assert events(judged) == []


def test_an_evaluation_model_that_never_answers_times_out(
    judged: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OVERRULE_LLM_TIMEOUT", "0.3")
    monkeypatch.setenv("OVERRULE_LLM_MAX_RETRIES", "0")
    reset_settings()
    llm_server.script(stall(3))
    opinion = request_second_opinion(engine=judged, judgment_id=judgment_id(judged), reviewer="lead")
    assert "did not answer within 0.3 s" in (opinion.error or "")
    assert the_judgment(judged).second_opinion_at is None


@pytest.mark.pg_repeats("statements and lines of test_a_batch_limit_takes_the_newest_eligible_judgments")
@pytest.mark.parametrize(
    ("reviewer", "message"),
    [(" ", "Enter your name first"), ("lead", "no judgment with id 999")],
)
def test_nothing_is_asked_without_a_reviewer_or_a_judgment(
    judged: Engine, llm_server: LLMServer, reviewer: str, message: str
) -> None:
    target = 999 if reviewer.strip() else judgment_id(judged)
    opinion = request_second_opinion(engine=judged, judgment_id=target, reviewer=reviewer)
    assert message in (opinion.error or "")
    assert llm_server.chat_requests == []


@pytest.mark.pg_repeats("statements and lines of test_a_batch_limit_takes_the_newest_eligible_judgments")
def test_without_an_llm_the_error_says_how_to_configure_one(judged: Engine) -> None:
    opinion = request_second_opinion(engine=judged, judgment_id=judgment_id(judged), reviewer="lead")
    assert "OPENAI_API_KEY" in (opinion.error or "")


@pytest.mark.pg_repeats("statements and lines of test_a_batch_limit_takes_the_newest_eligible_judgments")
def test_a_label_judgment_is_checked_against_its_description(judged: Engine, llm_server: LLMServer) -> None:
    with session_scope(judged) as session:
        session.add(Judgment(change_id="pr-12", product="acme", decision="INCLUDE", confidence=0.7,
                             description="PR #12: adds a Turkish locale", url="https://example.test/pr/12"))  # fmt: skip
    llm_server.script(
        text("VALID: NO\nIMPROVED_CODE: exclude\nIMPROVED_CONFIDENCE: 0.85\nEVALUATION: docs only")
    )
    opinion = request_second_opinion(engine=judged, judgment_id=judgment_id(judged, "pr-12"), reviewer="lead")
    assert (opinion.action, opinion.decision, opinion.confidence) == ("improved", "EXCLUDE", 0.85)
    prompt = llm_server.chat_requests[0]["messages"][1]["content"]
    assert "PR #12: adds a Turkish locale\nhttps://example.test/pr/12" in prompt


def test_a_reviewer_mid_review_is_not_in_conflict_with_a_second_opinion(
    judged: Engine, llm_server: LLMServer
) -> None:
    seen_version = the_judgment(judged).version
    llm_server.script(text(VALID))
    request_second_opinion(engine=judged, judgment_id=judgment_id(judged), reviewer="lead")
    with session_scope(judged) as session:
        record_review(session=session, judgment_id=judgment_id(judged), expected_version=seen_version,
                      action="overrule", user_decision="1", reviewer="ayse", reason="Physics, not Chemistry")  # fmt: skip
    row = the_judgment(judged)
    assert (row.user_decision, row.second_opinion_action) == ("1", "validated")


# -- batches ------------------------------------------------------------------------------------------


def add_candidates(engine: Engine) -> None:
    """Judgments of every kind the seed's threshold must tell apart, newest first by name order."""
    now = utcnow()
    with session_scope(engine) as session:
        session.add(
            EvaluationSnapshot(id="snap_short", question="q", model_answer="Too short.", product="acme")
        )
        session.add(EvaluationSnapshot(id="snap_gone", question="q", model_answer=ANSWER, product="acme",
                                       status="archived", deleted_at=now))  # fmt: skip
        session.flush()
        rows = [
            ("a_eligible", "snap_e", "3", 0.9, None),
            ("b_short_text", "snap_short", "3", 0.9, None),
            ("c_unknown", "snap_e", "UNKNOWN", 0.9, None),
            ("d_low_confidence", "snap_e", "3", 0.29, None),
            ("e_no_confidence", "snap_e", "3", None, None),
            ("f_archived", "snap_gone", "3", 0.9, None),
            ("g_already", "snap_e", "3", 0.9, now),
            ("h_eligible", "snap_e", "4", 0.3, None),
        ]
        for age, (change_id, snap, decision, confidence, opinion_at) in enumerate(rows):
            session.add(Judgment(change_id=change_id, product="acme", metric="truthfulness", snapshot_id=snap,
                                 decision=decision, confidence=confidence, second_opinion_at=opinion_at,
                                 timestamp=now - timedelta(minutes=age)))  # fmt: skip
        session.add(Judgment(change_id="other_product", product="other", decision="3", confidence=0.9,
                             description="x" * 150))  # fmt: skip


def test_a_batch_honours_the_seed_threshold_and_skips_what_has_an_opinion(
    judged: Engine, llm_server: LLMServer
) -> None:
    add_candidates(judged)
    llm_server.default_reply = text(VALID)
    outcome = second_opinion_batch(engine=judged, product="acme", reviewer="lead")
    # snap_e:truthfulness (fixture) and the two eligible rows; 4 below the threshold.
    assert (outcome.evaluated, outcome.skipped, outcome.failed) == (3, 4, [])
    assert outcome.actions == {"validated": 3}
    with Session(judged) as session:
        asked = set(session.exec(select(JudgmentEvent.change_id)).all())
    assert asked == {"a_eligible", "h_eligible", "snap_e:truthfulness"}


def test_a_batch_limit_takes_the_newest_eligible_judgments(judged: Engine, llm_server: LLMServer) -> None:
    add_candidates(judged)
    llm_server.default_reply = text(VALID)
    progress: list[tuple[int, int]] = []
    outcome = second_opinion_batch(engine=judged, product="acme", reviewer="lead", limit=1,
                                   progress=lambda done, total: progress.append((done, total)))  # fmt: skip
    assert (outcome.evaluated, outcome.skipped) == (1, 0)
    assert [e.change_id for e in events(judged)] == ["a_eligible"]
    assert progress == [(0, 1), (1, 1)]


@pytest.mark.pg_repeats("statements and lines of test_a_batch_limit_takes_the_newest_eligible_judgments")
def test_a_batch_reports_failures_and_carries_on(judged: Engine, llm_server: LLMServer) -> None:
    add_candidates(judged)

    def respond(body: dict[str, Any]) -> Any:
        return server_error() if "Decision: 4" in body["messages"][1]["content"] else text(VALID)

    llm_server.responder = respond
    outcome = second_opinion_batch(
        engine=judged, product="acme", reviewer="lead", settings=Settings(
            openai_base_url=llm_server.base_url, llm_max_retries=0, judge_concurrency=2)
    )  # fmt: skip
    assert outcome.evaluated == 2
    assert [change_id for change_id, _ in outcome.failed] == ["h_eligible"]
    assert "HTTP 500" in outcome.failed[0][1]
    assert outcome.summary() == (
        "2 second opinions (2 validated), 4 below the evaluation threshold (skipped), 1 failed"
    )
    with Session(judged) as session:
        assert session.exec(select(func.count()).select_from(JudgmentEvent)).one() == 2


def test_describe_summarises_an_opinion_in_one_line() -> None:
    opinion = second_opinion.SecondOpinion(1, action="improved", decision="1", confidence=0.95, model="m")
    assert second_opinion.describe(opinion, decision="2") == "improved, → 1, confidence 95%, by m"
    assert second_opinion.describe(opinion, decision="1") == "improved, decision 1, confidence 95%, by m"
