"""The judge pipeline: prompt assembly, messy replies, every failure path, AD-7 atomicity, AD-8.

LLM tests run the real openai client against the local server (tests/llm_server.py); database
tests run on SQLite and PostgreSQL through the `engine` fixture.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, select

from lib import judge
from lib.config import Settings, get_settings, reset_settings
from lib.db import session_scope
from lib.judge import (
    AlreadyJudged,
    EvaluationInput,
    JudgeFailed,
    build_stage1_messages,
    build_stage2_messages,
    compute_gaps,
    judge_evaluation,
    load_context,
    parse_stage1_evidence,
    parse_stage1_response,
    parse_stage2_response,
    prepare_input,
)
from lib.metrics import DEFAULT_METRICS, MetricSpec, upsert_metric_definitions
from lib.models import EvaluationSnapshot, Judgment, utcnow
from tests.llm_server import (
    LLMServer,
    http_error,
    json_reply,
    malformed,
    rate_limited,
    server_error,
    stall,
    text,
)

pytestmark = pytest.mark.timeout(60)

PRODUCT = "acme"
ANSWER = "Paris is the capital of France. It has about 2 million residents. The tower dates from 1889."
QUESTION = "Tell me about Paris."
RUBRIC = [
    {"product": PRODUCT, "slug": "coherence", "display_name": "Coherence", "min": 1, "max": 3,
     "description": "Does the answer hang together as one argument?"},
    {"product": PRODUCT, "slug": "groundedness", "display_name": "Groundedness", "min": 0, "max": 1,
     "integer_scale": False, "description": "Is every claim supported by the sources?"},
    {"product": PRODUCT, "slug": "fluency", "display_name": "Fluency", "min": 1, "max": 5,
     "description": "Is the language natural and correct?"},
]  # fmt: skip
SPECS = [
    MetricSpec("coherence", "Coherence", 1, 3, True, "Does the answer hang together as one argument?"),
    MetricSpec("groundedness", "Groundedness", 0, 1, False, "Is every claim supported by the sources?"),
    MetricSpec("fluency", "Fluency", 1, 5, True, "Is the language natural and correct?"),
]
USER_SCORES = {
    "coherence": {"score": 2, "reason": "USER-REASON-COHERENCE"},
    "Groundedness": 1.0,  # a display name and a bare number are accepted too
    "fluency": {"score": 4, "reason": "reads well"},
}


def stage1_payload(**overrides: Any) -> dict[str, Any]:
    """A well-formed Stage 1 reply; overrides replace top-level keys."""
    payload: dict[str, Any] = {
        "independent_scores": {
            "coherence": {"score": 3, "confidence": 0.8, "rationale": "Clear line of thought."},
            "groundedness": {"score": 0.5, "confidence": 0.6, "rationale": "Population claim unsupported."},
            "fluency": {"score": 4, "confidence": 0.9, "rationale": "Fluent and easy to read."},
        },
        "evidence": {
            "coherence": [
                {"quote": "Paris is the capital of France.", "start": 0, "end": 31, "why": "clear opener",
                 "better": "Keep it."},
            ],
            "groundedness": [
                {"quote": "about 2 million residents", "start": 3, "end": 9, "why": "no source",
                 "better": "Cite INSEE."},
                {"quote": "a sentence that is not in the answer", "start": 0, "end": 5, "why": "x",
                 "better": "y"},
            ],
            "fluency": [],
        },
    }  # fmt: skip
    payload.update(overrides)
    return payload


STAGE2_PAYLOAD = {
    "metric_feedback": {"coherence": "You were stricter than the judge.", "groundedness": "Check sources."},
    "overall_feedback": "Good eye for fluency; look harder for unsupported numbers.",
}


def evaluation(**overrides: Any) -> EvaluationInput:
    values: dict[str, Any] = {
        "question": QUESTION,
        "model_answer": ANSWER,
        "product": PRODUCT,
        "language": "en",
        "model_name": "mistral-nemo",
        "category": "geography",
        "primary_metric": "coherence",
        "bonus_metrics": ("groundedness",),
        "user_scores": USER_SCORES,
    }
    values.update(overrides)
    return EvaluationInput(**values)


@pytest.fixture
def rubric(engine: Engine) -> Engine:
    """The engine with the test product's rubric (two scales besides 1–5) defined."""
    with session_scope(engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    return engine


def is_stage1(body: dict[str, Any]) -> bool:
    return "Stage 1" in body["messages"][0]["content"]


def counts(engine: Engine) -> tuple[int, int]:
    with Session(engine) as session:
        snapshots = session.exec(select(func.count()).select_from(EvaluationSnapshot)).one()
        judgments = session.exec(select(func.count()).select_from(Judgment)).one()
    return snapshots, judgments


def add_judgment(session: Session, change_id: str, product: str = PRODUCT, *, corrected: bool = False,
                 reasoning: str = "judge said so", user_reasoning: str | None = None, age_hours: int = 1,
                 metric: str = "coherence") -> None:  # fmt: skip
    session.add(
        Judgment(
            change_id=change_id,
            product=product,
            metric=metric,
            decision="3",
            reasoning=reasoning,
            user_decision="1" if corrected else None,
            user_reasoning=user_reasoning,
            was_corrected=corrected,
            timestamp=utcnow() - timedelta(hours=age_hours),
        )
    )


# -- input -----------------------------------------------------------------------------------------


def test_prepare_input_resolves_display_names_and_keeps_reasons() -> None:
    prepared = prepare_input(evaluation(), SPECS)
    assert prepared.user_scores == {
        "coherence": {"score": 2, "reason": "USER-REASON-COHERENCE"},
        "groundedness": {"score": 1, "reason": None},
        "fluency": {"score": 4, "reason": "reads well"},
    }
    assert prepared.primary_metric == "coherence"
    assert prepared.bonus_metrics == ("groundedness",)


def test_prepare_input_makes_the_first_metric_primary_when_none_is_named() -> None:
    assert prepare_input(evaluation(primary_metric=None), SPECS).primary_metric == "coherence"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"user_scores": {"clarity": 3}}, "'clarity' is not defined for product 'acme'"),
        ({"user_scores": {"coherence": 4}}, "outside its scale 1–3"),
        ({"user_scores": {"groundedness": "high"}}, "'high' is not a number"),
        ({"primary_metric": "safety"}, "primary_metric: metric 'safety'"),
        ({"bonus_metrics": ("nope",)}, "bonus_metrics: metric 'nope'"),
        ({"question": "  "}, "the question is empty"),
        ({"model_answer": ""}, "the model answer is empty"),
        ({"model_name": "m" * 201}, "at most 200"),
        ({"model_answer": "a\x00b"}, "NUL character"),
    ],
)
def test_prepare_input_refuses_what_the_rubric_or_table_cannot_hold(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prepare_input(evaluation(**overrides), SPECS)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"model_answer": "a", "product": "p"}, "'question' is required"),
        ({"question": "q", "model_answer": "a", "product": 3}, "'product' must be a string"),
        ({"question": "q", "model_answer": "a", "product": "p", "bonus_metrics": "x"}, "bonus_metrics"),
        ({"question": "q", "model_answer": "a", "product": "p", "user_scores": [1]}, "user_scores"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_batch_record_errors_name_the_field(record: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EvaluationInput.from_record(record)


# -- prompt assembly ---------------------------------------------------------------------------------


def stage1_prompt(prepared: judge.PreparedInput, **kwargs: Any) -> str:
    messages = build_stage1_messages(prepared, history_block=kwargs.pop("history_block", ""), **kwargs)
    return "\n".join(m["content"] for m in messages)


@pytest.mark.parametrize(
    "expected",
    [
        "coherence (Coherence) — scale 1–3, whole numbers: Does the answer hang together as one argument?",
        "groundedness (Groundedness) — scale 0–1 (continuous), any number in the range: Is every claim",
        "fluency (Fluency) — scale 1–5",
        "<<<ANSWER\n" + ANSWER + "\nANSWER>>>",
        "<<<QUESTION\n" + QUESTION + "\nQUESTION>>>",
        '"independent_scores"',
        "Include every metric of the rubric: coherence, groundedness, fluency.",
        "Product: acme",
        "Answering model: mistral-nemo",
    ],
)
def test_stage1_prompt_has_rubric_scales_answer_and_output_shape(expected: str) -> None:
    assert expected in stage1_prompt(prepare_input(evaluation(), SPECS))


@pytest.mark.parametrize("secret", ["USER-REASON-COHERENCE", "reads well"])
def test_stage1_prompt_is_blind_to_the_reviewers_scores(secret: str) -> None:
    assert secret not in stage1_prompt(prepare_input(evaluation(), SPECS))


def test_stage1_prompt_has_a_marked_notes_section_filled_by_the_caller() -> None:
    prepared = prepare_input(evaluation(), SPECS)
    assert f"## Cross-session notes\n{judge.NOTES_PLACEHOLDER}" in stage1_prompt(prepared)
    filled = stage1_prompt(prepared, notes_block="CROSS-SESSION EXPERIENCE NOTES:\n💡 TIP (2h ago): x")
    assert "## Cross-session notes\nCROSS-SESSION EXPERIENCE NOTES:\n💡 TIP (2h ago): x" in filled


def test_stage1_prompt_carries_the_products_correction_history_only(rubric: Engine) -> None:
    with session_scope(rubric) as session:
        add_judgment(session, "s1:coherence", corrected=True, user_reasoning="HISTORY-CORRECTION-REASON")
        add_judgment(session, "s2:fluency", metric="fluency", reasoning="HISTORY-CONFIRMED-REASONING")
        add_judgment(session, "o1:coherence", product="other", corrected=True, user_reasoning="OTHER-PRODUCT")
    with session_scope(rubric, read_only=True) as session:
        context = load_context(session=session, evaluation=evaluation(), settings=Settings(), notes_block="")
    prompt = stage1_prompt(context.prepared, history_block=context.history_block)
    assert "[CORRECTED] s1:coherence | metric: coherence" in prompt
    assert "HISTORY-CORRECTION-REASON" in prompt
    assert "HISTORY-CONFIRMED-REASONING" in prompt
    assert "OTHER-PRODUCT" not in prompt and "o1:coherence" not in prompt


def test_stage1_prompt_history_holds_only_the_selected_entries(rubric: Engine) -> None:
    with session_scope(rubric) as session:
        for n in range(1, 5):  # corrections, newest first: c1 (1 h old) … c4 (4 h old)
            add_judgment(
                session, f"c{n}:coherence", corrected=True, user_reasoning=f"reason-{n}", age_hours=n
            )
    with session_scope(rubric, read_only=True) as session:
        context = load_context(
            session=session, evaluation=evaluation(), settings=Settings(history_max_entries=2), notes_block=""
        )
    assert "c1:coherence" in context.history_block and "c2:coherence" in context.history_block
    assert "c3:coherence" not in context.history_block and "c4:coherence" not in context.history_block


@pytest.mark.pg_repeats(
    "statements and lines of test_a_duplicate_stored_while_the_judge_ran_is_refused_atomically"
)
def test_stage1_prompt_says_so_when_there_is_no_history(rubric: Engine) -> None:
    with session_scope(rubric, read_only=True) as session:
        context = load_context(session=session, evaluation=evaluation(), settings=Settings(), notes_block="")
    assert "## Correction history for this product\nNo previous judgments available" in stage1_prompt(
        context.prepared, history_block=context.history_block
    )


def stage2_prompt(stage1_data: dict[str, Any] | None = None) -> str:
    prepared = prepare_input(evaluation(), SPECS)
    stage1 = parse_stage1_response(stage1_data or stage1_payload(), SPECS)
    verified = judge.verified_evidence_of(ANSWER, stage1.evidence)
    messages = build_stage2_messages(prepared, stage1, compute_gaps(prepared, stage1.judge_scores), verified)
    return "\n".join(m["content"] for m in messages)


@pytest.mark.parametrize(
    "expected",
    [
        "- coherence (Coherence, scale 1–3, primary metric)",
        "evaluator: 2 — USER-REASON-COHERENCE",
        "judge: 3 — Clear line of thought.",
        "gap (rescaled to 1–5): 2.00",
        "- groundedness (Groundedness, scale 0–1 (continuous), bonus metric)",
        "judge: 0.5 — Population claim unsupported.",
        "- fluency (Fluency, scale 1–5, other metric)",
        '1. (verified) quote: "Paris is the capital of France."',
        '2. (NOT verified in the answer) quote: "a sentence that is not in the answer"',
        "better: Cite INSEE.",
        "Weighted gap: 1.80; judge meta score: 2/5",
    ],
)
def test_stage2_prompt_has_both_sides_gaps_and_checked_evidence(expected: str) -> None:
    assert expected in stage2_prompt()


def test_stage2_prompt_admits_missing_evidence_after_ad8() -> None:
    assert "evidence could not be read" in stage2_prompt(stage1_payload(evidence="garbage"))


# -- parsing messy replies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "score", "confidence"),
    [
        ({"score": 3, "confidence": 0.8}, 3, 0.8),
        ({"score": "2", "confidence": "85"}, 2, 0.85),  # text numbers; a percentage confidence
        ({"score": " 1 ", "confidence": 120}, 1, 1.0),
        ({"score": None}, None, None),
        ({"score": "N/A"}, None, None),
        ({"score": "null", "confidence": "sure"}, None, None),
        (2, 2, None),  # a bare number
        ({"score": 2.5, "confidence": -1}, 2.5, None),  # a mean of annotators is on the scale
    ],
)
def test_stage1_scores_are_read_from_messy_entries(entry: Any, score: Any, confidence: Any) -> None:
    result = parse_stage1_response({"independent_scores": {"coherence": entry, "fluency": 4}}, SPECS)
    assert result.scores["coherence"].score == score
    assert result.scores["coherence"].confidence == confidence


def test_stage1_accepts_display_names_and_reason_aliases_and_leaves_out_unknown_metrics() -> None:
    result = parse_stage1_response(
        {"scores": {"Fluency": {"score": 5, "reason": "why"}, "wit": {"score": 9}}}, SPECS
    )
    assert result.scores["fluency"].score == 5 and result.scores["fluency"].rationale == "why"
    assert result.scores["coherence"].score is None  # left out by the judge: not scored
    assert set(result.scores) == {"coherence", "groundedness", "fluency"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"independent_scores": {"coherence": 4}}, "score 4 for 'coherence' is outside its scale 1–3"),
        ({"independent_scores": {"groundedness": 1.5}}, "outside its scale 0–1"),
        ({"independent_scores": {"fluency": "good"}}, "'good', not a number"),
        ({"independent_scores": {"fluency": None, "coherence": None}}, "scored none of the metrics"),
        ({"verdict": "fine"}, "no 'independent_scores' object"),
        ({"independent_scores": [3, 2]}, "no 'independent_scores' object"),
    ],
)
def test_unusable_stage1_replies_are_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_stage1_response(data, SPECS)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (None, "no evidence block"),
        ("quotes: Paris", "text that is not JSON"),
        ([{"quote": "Paris"}], "list, not an object"),
        ({"coherence": ["just text", 3]}, "no evidence item"),
    ],
)
def test_unusable_evidence_blocks_degrade_to_none(raw: Any, problem: str) -> None:
    evidence, why, _dropped = parse_stage1_evidence(raw, SPECS)
    assert evidence is None
    assert problem in (why or "")


def test_evidence_in_a_json_string_or_the_seed_shape_is_read() -> None:
    raw = json.dumps({"Coherence": {"evidence": [{"quote": "Paris", "start": "0", "end": 5.0, "why": "w"}]}})
    evidence, problem, dropped = parse_stage1_evidence(raw, SPECS)
    assert problem is None and dropped == 0
    assert evidence == {"coherence": [{"quote": "Paris", "start": 0, "end": 5, "why": "w", "better": None}]}


def test_evidence_keeps_three_items_and_drops_unreadable_ones() -> None:
    items = [{"quote": f"q{n}", "start": "x", "end": -2} for n in range(5)] + [{"quote": ""}, "text"]
    evidence, _problem, dropped = parse_stage1_evidence({"fluency": items, "wit": [{"quote": "x"}]}, SPECS)
    assert evidence == {"fluency": [{"quote": f"q{n}", "start": None, "end": None, "why": None, "better": None}
                                    for n in range(3)]}  # fmt: skip
    assert dropped == 4


@pytest.mark.parametrize(
    ("data", "overall", "per_metric"),
    [
        (STAGE2_PAYLOAD, STAGE2_PAYLOAD["overall_feedback"],
         {"coherence": "You were stricter than the judge.", "groundedness": "Check sources."}),
        ({"overall": " ok ", "metric_feedback": {"Fluency": {"comparison": "same"}, "wit": "x"}}, "ok",
         {"fluency": "same"}),
        ({"overall_feedback": "ok", "metric_feedback": "none"}, "ok", {}),
    ],
)  # fmt: skip
def test_stage2_replies_are_read_tolerantly(data: dict, overall: str, per_metric: dict) -> None:
    assert parse_stage2_response(data, SPECS) == (overall, per_metric)


@pytest.mark.parametrize("data", [{}, {"overall_feedback": "  "}, {"overall_feedback": 3}])
def test_stage2_reply_without_overall_feedback_is_refused(data: dict) -> None:
    with pytest.raises(ValueError, match="overall_feedback"):
        parse_stage2_response(data, SPECS)


def test_gaps_follow_spec_arithmetic_on_each_scale() -> None:
    prepared = prepare_input(evaluation(), SPECS)
    stage1 = parse_stage1_response(stage1_payload(), SPECS)
    gaps = compute_gaps(prepared, stage1.judge_scores)
    # coherence |2-3|·4/2 = 2; groundedness |1-0.5|·4/1 = 2; fluency 0 → 0.7·2 + 0.2·2 + 0.1·0 = 1.8
    assert gaps.per_metric == {"coherence": 2.0, "groundedness": 2.0, "fluency": 0.0}
    assert (gaps.weighted_gap, gaps.judge_meta_score) == (1.8, 2)


def test_no_comparable_metric_means_no_gap_rather_than_a_perfect_judge() -> None:
    prepared = prepare_input(evaluation(user_scores={"fluency": {"score": None, "reason": "unsure"}}), SPECS)
    stage1 = parse_stage1_response(stage1_payload(), SPECS)
    gaps = compute_gaps(prepared, stage1.judge_scores)
    assert (gaps.weighted_gap, gaps.judge_meta_score) == (None, None)


# -- end to end against the local OpenAI-compatible server -------------------------------------------


@pytest.mark.pg_repeats(
    "statements and lines of test_judging_the_same_answer_again_is_refused_before_any_llm_call"
)
def test_both_stages_write_one_snapshot_with_its_judgments(rubric: Engine, llm_server: LLMServer) -> None:
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert llm_server.pending == 0
    with Session(rubric) as session:
        snap = session.get(EvaluationSnapshot, snapshot_id)
        judgments = session.exec(select(Judgment).order_by(Judgment.change_id)).all()
    assert snap is not None
    assert snapshot_id.startswith("snap_")
    assert (snap.product, snap.language, snap.model_name, snap.category) == (
        PRODUCT, "en", "mistral-nemo", "geography")  # fmt: skip
    assert snap.judge_model == get_settings().judge_model and snap.created_by == "ayse"
    assert (snap.weighted_gap, snap.judge_meta_score) == (1.8, 2)
    assert snap.overall_feedback == STAGE2_PAYLOAD["overall_feedback"]
    assert snap.judge_scores_json["coherence"] == {
        "score": 3, "reason": "Clear line of thought.", "mentoring": "You were stricter than the judge."}  # fmt: skip
    assert snap.user_scores_json["coherence"] == {"score": 2, "reason": "USER-REASON-COHERENCE"}
    stages = [(i["quote"], i["stage"]) for i in snap.evidence_json["groundedness"]["evidence"]]
    assert stages == [("about 2 million residents", "substring"),
                      ("a sentence that is not in the answer", "unverified")]  # fmt: skip
    assert snap.evidence_json["coherence"]["evidence"][0]["stage"] == "exact"
    assert (snap.evidence_count, snap.evidence_highlighted, snap.evidence_unverified) == (3, 2, 1)
    assert [(j.change_id, j.decision, j.confidence, j.reasoning) for j in judgments] == [
        (f"{snapshot_id}:coherence", "3", 0.8, "Clear line of thought."),
        (f"{snapshot_id}:fluency", "4", 0.9, "Fluent and easy to read."),
        (f"{snapshot_id}:groundedness", "0.5", 0.6, "Population claim unsupported."),
    ]
    assert all(j.snapshot_id == snapshot_id and j.user_decision is None for j in judgments)


def test_the_prompt_sent_carries_the_history_and_uses_the_judge_model(
    rubric: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OVERRULE_JUDGE_MODEL", "judge-x")
    reset_settings()
    with session_scope(rubric) as session:
        add_judgment(session, "old:coherence", corrected=True, user_reasoning="SENT-HISTORY")
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    first, second = llm_server.chat_requests
    assert first["model"] == second["model"] == "judge-x"
    # Stage 1 offers the note tools (lib.judge_tools) and asks for its schema; Stage 2 asks for its own.
    assert [t["function"]["name"] for t in first["tools"]] == ["add_note", "search_notes", "clear_notes"]
    assert first["response_format"]["type"] == "json_schema"
    assert first["response_format"]["json_schema"]["schema"] == judge.stage1_schema(SPECS)
    assert second["response_format"]["json_schema"]["schema"] == judge.stage2_schema(SPECS)
    assert "tools" not in second
    assert (first["max_tokens"], second["max_tokens"]) == (get_settings().max_tokens_judge,
                                                           get_settings().max_tokens_mentor)  # fmt: skip
    assert "SENT-HISTORY" in first["messages"][1]["content"]
    assert "USER-REASON-COHERENCE" not in json.dumps(first) and "USER-REASON-COHERENCE" in json.dumps(second)


@pytest.mark.pg_repeats(
    "statements and lines of test_judging_the_same_answer_again_is_refused_before_any_llm_call"
)
@pytest.mark.parametrize(
    "reply",
    [
        text("Here is my evaluation:\n```json\n" + json.dumps(stage1_payload()) + "\n```\nHope it helps."),
        text("Sure! " + json.dumps(stage1_payload()) + " Let me know."),
    ],
)
def test_stage1_reply_wrapped_in_prose_and_fences_still_works(
    rubric: Engine, llm_server: LLMServer, reply: Any
) -> None:
    llm_server.script(reply, json_reply(STAGE2_PAYLOAD))
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert counts(rubric) == (1, 3)
    assert snapshot_id


@pytest.mark.pg_repeats(
    "statements and lines of test_judging_the_same_answer_again_is_refused_before_any_llm_call"
)
def test_rate_limit_is_retried_and_the_run_succeeds(rubric: Engine, llm_server: LLMServer) -> None:
    llm_server.script(rate_limited(), json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert len(llm_server.chat_requests) == 3 and llm_server.pending == 0
    assert counts(rubric) == (1, 3)


def no_retries(monkeypatch: pytest.MonkeyPatch, timeout: str = "5") -> None:
    monkeypatch.setenv("OVERRULE_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("OVERRULE_LLM_TIMEOUT", timeout)
    reset_settings()


@pytest.mark.pg_repeats(
    "statements and lines of test_a_duplicate_stored_while_the_judge_ran_is_refused_atomically"
)
@pytest.mark.parametrize(
    ("replies", "stage", "kind", "message"),
    [
        ([server_error(), server_error()], "stage1", "server", "HTTP 500"),
        ([rate_limited(), rate_limited()], "stage1", "rate_limit", "HTTP 429"),
        ([text("I think the answer is fine, score 3.")] * 2, "stage1", "invalid_json", "not valid JSON"),
        ([malformed()], "stage1", "bad_response", "not an OpenAI-style completion"),
        ([json_reply({"independent_scores": {"coherence": 7}})] * 2, "stage1", "invalid_reply",
         "outside its scale"),
        ([json_reply(stage1_payload()), server_error(), server_error()], "stage2", "server", "HTTP 500"),
        ([json_reply(stage1_payload()), text("no json here"), text("no json here")], "stage2", "invalid_json",
         "not valid JSON"),
        ([json_reply(stage1_payload()), json_reply({"metric_feedback": {}}), json_reply({"metric_feedback": {}})],
         "stage2", "invalid_reply", "overall_feedback"),
        ([json_reply(stage1_payload()), http_error(400, "context too long", headers=())], "stage2", "request",
         "HTTP 400"),
    ],
)  # fmt: skip
def test_any_stage_failure_writes_nothing_and_names_the_stage(
    rubric: Engine, llm_server: LLMServer, replies: list, stage: str, kind: str, message: str
) -> None:
    llm_server.script(*replies)
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert (failure.value.stage, failure.value.kind) == (stage, kind)
    assert message in str(failure.value)
    assert judge.STAGE_LABELS[stage] in str(failure.value) and "Nothing was saved." in str(failure.value)
    assert llm_server.pending == 0
    assert counts(rubric) == (0, 0)


def test_a_judge_that_never_answers_times_out_and_writes_nothing(
    rubric: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_retries(monkeypatch, timeout="0.3")
    llm_server.script(stall(3))
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert (failure.value.stage, failure.value.kind) == ("stage1", "timeout")
    assert "did not answer within 0.3 s" in str(failure.value)
    assert counts(rubric) == (0, 0)


def test_stage2_timeout_after_a_good_stage1_writes_nothing(
    rubric: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stage 1's reply must come within the timeout: 2 s, not 0.3, for a loaded machine (the stall
    # lasts until the server stops).
    no_retries(monkeypatch, timeout="2")
    llm_server.script(json_reply(stage1_payload()), stall(600))
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert (failure.value.stage, failure.value.kind) == ("stage2", "timeout")
    assert counts(rubric) == (0, 0)


@pytest.mark.parametrize(
    "evidence",
    ["see the quotes above", ["Paris is the capital"], None, 42],
)
def test_unparsable_evidence_keeps_scores_and_logs_the_seed_warning(
    rubric: Engine, llm_server: LLMServer, caplog: pytest.LogCaptureFixture, evidence: Any
) -> None:
    payload = stage1_payload(evidence=evidence)
    if evidence is None:
        del payload["evidence"]
    llm_server.script(json_reply(payload), json_reply(STAGE2_PAYLOAD))
    with caplog.at_level(logging.WARNING, logger="lib.judge"):
        snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    with Session(rubric) as session:
        snap = session.get(EvaluationSnapshot, snapshot_id)
    assert snap is not None and snap.evidence_json is None and snap.evidence_count == 0
    assert snap.judge_scores_json["fluency"]["score"] == 4 and snap.weighted_gap == 1.8
    assert counts(rubric) == (1, 3)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"Evidence parse failed for eval {snapshot_id}, continuing without evidence"
    ]


@pytest.mark.pg_repeats(
    "statements and lines of test_judging_the_same_answer_again_is_refused_before_any_llm_call"
)
def test_without_reviewer_scores_stage2_is_not_asked_and_there_is_no_gap(
    rubric: Engine, llm_server: LLMServer
) -> None:
    llm_server.script(json_reply(stage1_payload()))
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(user_scores={}), reviewer="cli")
    assert len(llm_server.chat_requests) == 1
    with Session(rubric) as session:
        snap = session.get(EvaluationSnapshot, snapshot_id)
    assert snap is not None
    assert (snap.weighted_gap, snap.judge_meta_score, snap.overall_feedback) == (None, None, None)
    assert counts(rubric) == (1, 3)


@pytest.mark.pg_repeats(
    "statements and lines of test_judging_the_same_answer_again_is_refused_before_any_llm_call"
)
def test_the_default_rubric_is_used_for_a_product_without_one(engine: Engine, llm_server: LLMServer) -> None:
    scores = {
        m.slug: {"score": 4, "confidence": 0.5, "rationale": "Good enough on this metric."}
        for m in DEFAULT_METRICS
    }
    llm_server.script(json_reply({"independent_scores": scores, "evidence": {}}), json_reply(STAGE2_PAYLOAD))
    ev = evaluation(product="plain", primary_metric="Truthfulness", bonus_metrics=("clarity",),
                    user_scores={"truthfulness": 2})  # fmt: skip
    snapshot_id = judge_evaluation(engine=engine, evaluation=ev, reviewer="ayse")
    prompt = llm_server.chat_requests[0]["messages"][1]["content"]
    assert all(f"- {m.slug} ({m.display_name}) — scale 1–5" in prompt for m in DEFAULT_METRICS)
    with Session(engine) as session:
        snap = session.get(EvaluationSnapshot, snapshot_id)
    assert snap is not None and snap.primary_metric == "truthfulness"
    assert (snap.weighted_gap, snap.judge_meta_score) == (1.4, 3)  # 0.7 × |2 − 4|
    assert counts(engine) == (1, 8)


def test_judging_the_same_answer_again_is_refused_before_any_llm_call(
    rubric: Engine, llm_server: LLMServer
) -> None:
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    first = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    with pytest.raises(AlreadyJudged) as again:
        judge_evaluation(engine=rubric, evaluation=evaluation(user_scores={"fluency": 1}), reviewer="bob")
    assert again.value.snapshot_id == first
    assert first in str(again.value)
    assert len(llm_server.chat_requests) == 2 and counts(rubric) == (1, 3)


def test_a_duplicate_stored_while_the_judge_ran_is_refused_atomically(
    rubric: Engine, llm_server: LLMServer
) -> None:
    def responder(body: dict[str, Any]) -> Any:
        if is_stage1(body):
            # Another writer stores the same evaluation while this run waits for its LLM.
            with session_scope(rubric) as session:
                session.add(EvaluationSnapshot(id="snap_other", question=QUESTION, model_answer=ANSWER,
                                               product=PRODUCT, source_key=evaluation().source_key))  # fmt: skip
            return json_reply(stage1_payload())
        return json_reply(STAGE2_PAYLOAD)

    llm_server.responder = responder
    with pytest.raises(AlreadyJudged) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert failure.value.snapshot_id == "snap_other"
    assert counts(rubric) == (1, 0)


@pytest.mark.pg_repeats(
    "statements and lines of test_a_duplicate_stored_while_the_judge_ran_is_refused_atomically"
)
def test_no_llm_configured_fails_before_reading_or_calling_anything(engine: Engine) -> None:
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=engine, evaluation=evaluation(), reviewer="ayse")
    assert (failure.value.stage, failure.value.kind) == ("configuration", "not_configured")
    assert "OPENAI_API_KEY" in str(failure.value)


@pytest.mark.pg_repeats(
    "statements and lines of test_a_duplicate_stored_while_the_judge_ran_is_refused_atomically"
)
@pytest.mark.parametrize(
    ("overrides", "reviewer", "message"),
    [
        ({"user_scores": {"coherence": 9}}, "ayse", "outside its scale 1–3"),
        ({}, " ", "no reviewer was named"),
    ],
)
def test_bad_input_fails_before_any_llm_call(
    rubric: Engine, llm_server: LLMServer, overrides: dict, reviewer: str, message: str
) -> None:
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(**overrides), reviewer=reviewer)
    assert failure.value.stage == "input" and message in str(failure.value)
    assert llm_server.chat_requests == []


@pytest.mark.pg_repeats(
    "statements and lines of test_judging_the_same_answer_again_is_refused_before_any_llm_call"
)
def test_progress_messages_follow_the_stages(rubric: Engine, llm_server: LLMServer) -> None:
    llm_server.script(json_reply(stage1_payload(evidence="bad")), json_reply(STAGE2_PAYLOAD))
    said: list[str] = []
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse", progress=said.append)
    assert [s.split(":")[0].split(";")[0] for s in said] == [
        "The judge scores the answer and collects evidence…",
        "The judge's evidence could not be read",
        "Mentor feedback",
        "Saving the evaluation…",
    ]


def test_notes_for_the_evaluations_language_fill_the_notes_section(
    rubric: Engine, llm_server: LLMServer
) -> None:
    from lib import notes

    with session_scope(rubric) as session:
        notes.add_note(
            session=session, language="tr", note_type="TIP", content="TURKISH-TIP", session_id="s_tr"
        )
        notes.add_note(
            session=session, language="en", note_type="TIP", content="ENGLISH-TIP", session_id="s_en"
        )
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    judge_evaluation(engine=rubric, evaluation=evaluation(language="tr"), reviewer="ayse")
    prompt = llm_server.chat_requests[0]["messages"][1]["content"]
    notes_section = prompt.split("## Cross-session notes\n", 1)[1].split("\n\n## Question", 1)[0]
    assert notes_section.startswith("CROSS-SESSION EXPERIENCE NOTES:")
    assert "TURKISH-TIP" in notes_section and "ENGLISH-TIP" not in prompt
    from lib.models import SessionAudit

    with session_scope(rubric, read_only=True) as session:
        audits = session.exec(select(SessionAudit)).all()
    assert [a.recorded_by for a in audits] == ["ayse"]  # the run's actor, like every other write
