"""lib.precedents: seed-003 auto-evaluation by precedent, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, func, select
from sqlmodel import Session

from lib import precedents
from lib.config import reset_settings
from lib.models import AutoEval, ExpertFeedback, Interaction, utcnow
from tests.llm_server import json_reply, server_error

CITE = "https://help.acme.test/reset-password"
QUESTION = "How do I reset my password?"
S1 = "Open Settings and choose Reset password."
S2 = "We email you a link that works for one hour."
ANSWER = f"{S1} {S2}"
UNRELATED_Q = "When are invoices sent to customers?"
UNRELATED_A = "Invoices are emailed on the first business day of every month, with a PDF attached."


def _add(
    session: Session,
    iid: str,
    *,
    question: str = QUESTION,
    answer: str = ANSWER,
    citation: str | None = CITE,
    scores: list[Any] | None = None,
    citation_score: float | None = 20.0,
    total: float | None = None,
    feedback_type: str = "expert",
    age_days: int = 0,
) -> Interaction:
    """An interaction, with expert (or AI) feedback when `scores` is given (one per sentence)."""
    interaction = Interaction(
        id=iid,
        product="acme",
        question=question,
        answer=answer,
        citation_url=citation,
        citations=[citation] if citation else [],
        created_at=utcnow() - timedelta(days=age_days),
    )
    session.add(interaction)
    session.flush()  # no ORM relationship orders the inserts, so the parent goes first
    if scores is not None:
        sentences = precedents.split_sentences(answer)
        session.add(
            ExpertFeedback(
                interaction_id=iid,
                type=feedback_type,
                total_score=total,
                citation_score=citation_score,
                citation_url=citation,
                sentence_scores=[{"sentence": s, "score": v} for s, v in zip(sentences, scores, strict=True)],
                reviewer="expert@acme.test",
            )
        )
    session.commit()
    return interaction


def _evaluate(engine: Engine, iid: str) -> AutoEval:
    with Session(engine, expire_on_commit=False) as session:
        row = precedents.evaluate_interaction(session, iid)
        session.commit()
        return row


def _ai_feedback(engine: Engine, iid: str) -> list[ExpertFeedback]:
    with Session(engine) as session:
        return list(
            session.execute(
                select(ExpertFeedback).where(
                    ExpertFeedback.interaction_id == iid, ExpertFeedback.type == "ai"
                )
            ).scalars()
        )


def _set_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(f"OVERRULE_{name.upper()}", value)
    reset_settings()


# ---------------------------------------------------------------------------------------------
# Pure functions


@pytest.mark.parametrize(
    ("scores", "citation", "expected"),
    [
        ([80, 60], 20.0, 72.5),
        ([100], None, 100.0),
        ([100, 100, 100], 25.0, 100.0),
        ([0], 0.0, 0.0),
        ([33, 34], 10.0, 35.12),  # 33.5 × 0.75 + 10 = 35.125 → 35.12 (round half to even)
        ([90, 70, 50], None, 77.5),
        ([1 / 3], 0.0, 0.25),
    ],
)
def test_total_score_is_mean_times_075_plus_citation_or_25(
    scores: list[float], citation: float | None, expected: float
) -> None:
    assert precedents.total_score(scores, citation) == expected


def test_total_score_refuses_no_sentences() -> None:
    with pytest.raises(ValueError):
        precedents.total_score([], 20.0)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (CITE, CITE, True),
        (CITE, CITE.upper(), True),
        (f"  {CITE}\n", CITE, True),
        ("\tHTTPS://Help.Acme.Test/Reset-Password ", CITE, True),
        (CITE, CITE + "/", False),
        (CITE, "https://help.acme.test/reset-username", False),
        (CITE, None, False),
        (None, None, True),
    ],
)
def test_citation_match_ignores_case_and_surrounding_whitespace(
    a: str | None, b: str | None, expected: bool
) -> None:
    assert precedents.citation_matches(a, b) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three?", ["One.", "Two!", "Three?"]),
        ("Line one\nLine two", ["Line one", "Line two"]),
        ("  Only one sentence  ", ["Only one sentence"]),
        ("", []),
        ("Version 2.5 is out. Update now.", ["Version 2.5 is out.", "Update now."]),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert precedents.split_sentences(text) == expected


@pytest.mark.parametrize("text", [QUESTION, ANSWER, "Şifremi nasıl sıfırlarım?", "a"])
def test_offline_embedding_of_identical_text_has_similarity_one(text: str) -> None:
    a, b = precedents.embed_texts([text, text])
    assert len(a) == precedents.EMBEDDING_DIM
    assert math.isclose(math.sqrt(sum(x * x for x in a)), 1.0)
    assert math.isclose(precedents.cosine(a, b), 1.0)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (ANSWER, "Open Settings and select Reset password. We email you a link that works for one hour."),
        (ANSWER, ANSWER.upper()),
        (ANSWER, ANSWER.replace("hour.", "hour")),
        (S1, "Open settings and choose Reset password"),
    ],
)
def test_offline_embedding_of_near_identical_text_is_above_threshold(a: str, b: str) -> None:
    va, vb = precedents.embed_texts([a, b])
    assert precedents.cosine(va, vb) >= 0.85


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (ANSWER, UNRELATED_A),
        (QUESTION, UNRELATED_Q),
        (S1, S2),
        ("Şifrenizi Ayarlar bölümünden sıfırlayın.", UNRELATED_A),
    ],
)
def test_offline_embedding_of_unrelated_text_is_below_threshold(a: str, b: str) -> None:
    va, vb = precedents.embed_texts([a, b])
    assert precedents.cosine(va, vb) < 0.85


def test_offline_embedding_is_deterministic_across_calls() -> None:
    assert precedents.embed_texts([ANSWER]) == precedents.embed_texts([ANSWER])


@pytest.mark.parametrize(("a", "b"), [([], []), ([1.0, 0.0], [1.0]), ([0.0, 0.0], [1.0, 0.0])])
def test_cosine_of_empty_zero_or_mismatched_vectors_is_zero(a: list[float], b: list[float]) -> None:
    assert precedents.cosine(a, b) == 0.0


def test_embeddings_come_from_the_server_when_an_embedding_model_is_configured(
    llm_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_env(monkeypatch, embedding_model="test-embed")
    vectors = precedents.embed_texts([S1, S2])
    assert [len(v) for v in vectors] == [llm_server.embedding_dim] * 2
    assert any(p.endswith("/embeddings") for p in llm_server.paths)


# ---------------------------------------------------------------------------------------------
# QA matches


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_qa_matches_skip_the_same_interaction(engine: Engine) -> None:
    with Session(engine) as session:
        me = _add(session, "self", scores=[80, 60])
        assert precedents.find_qa_matches(session=session, interaction=me) == []


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
@pytest.mark.parametrize("feedback_type", [None, "ai"])
def test_qa_matches_ignore_neighbours_without_expert_feedback(
    engine: Engine, feedback_type: str | None
) -> None:
    with Session(engine) as session:
        if feedback_type is None:
            _add(session, "neighbour")
        else:
            _add(session, "neighbour", scores=[80, 60], feedback_type=feedback_type)
        me = _add(session, "new")
        assert precedents.find_qa_matches(session=session, interaction=me) == []


def test_qa_matches_return_at_most_limit_neighbours_most_similar_first(engine: Engine) -> None:
    with Session(engine) as session:
        for n in range(12):
            _add(session, f"p{n:02d}", scores=[80, 60])
        _add(session, "near", answer=ANSWER + " Check spam too.", scores=[80, 60, 50])
        me = _add(session, "new")
        matches = precedents.find_qa_matches(session=session, interaction=me)
        assert len(matches) == 10
        sims = [m.similarity for m in matches]
        assert sims == sorted(sims, reverse=True)
        assert "near" not in [m.interaction.id for m in matches]


def test_qa_match_at_exactly_the_threshold_counts_and_just_above_does_not(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", answer=ANSWER + " Check your spam folder.", scores=[80, 60, 40])
        me = _add(session, "new")
        sim = precedents.find_qa_matches(session=session, interaction=me, threshold=0.0)[0].similarity
        assert 0.0 < sim < 1.0
        assert [
            m.interaction.id
            for m in precedents.find_qa_matches(session=session, interaction=me, threshold=sim)
        ] == ["prec"]
        assert (
            precedents.find_qa_matches(session=session, interaction=me, threshold=math.nextafter(sim, 2.0))
            == []
        )


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_qa_matching_stores_the_computed_embeddings(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60])
        me = _add(session, "new")
        precedents.find_qa_matches(session=session, interaction=me)
        session.commit()
    with Session(engine) as session:
        stored = session.get(Interaction, "prec")
        assert stored is not None and stored.qa_vector is not None
        assert len(stored.qa_vector) == 4 * precedents.EMBEDDING_DIM


# ---------------------------------------------------------------------------------------------
# Sentence matches


def _qa_match(score: float | None = 70.0, sentence: str = S1) -> precedents.QAMatch:
    interaction = Interaction(id="p", question=QUESTION, answer=sentence)
    feedback = ExpertFeedback(interaction_id="p", sentence_scores=[{"sentence": sentence, "score": score}])
    return precedents.QAMatch(interaction, feedback, 0.99)


def test_sentence_match_at_exactly_the_threshold_counts_and_just_above_does_not() -> None:
    near = "Open Settings and choose Reset password now."
    sim = precedents.match_sentences([near], [_qa_match()], threshold=0.0)[0].similarity
    va, vb = precedents.embed_texts([near, S1])
    assert math.isclose(sim, precedents.cosine(va, vb), rel_tol=1e-9)
    assert 0.0 < sim < 1.0
    assert precedents.match_sentences([near], [_qa_match()], threshold=sim)[0].best_match == S1
    assert (
        precedents.match_sentences([near], [_qa_match()], threshold=math.nextafter(sim, 2.0))[0].best_match
        is None
    )


def test_sentence_matching_stops_at_the_first_unmatched_sentence() -> None:
    matches = precedents.match_sentences([S1, UNRELATED_A, S1], [_qa_match()], threshold=0.85)
    assert [m.best_match for m in matches] == [S1, None]


def test_sentence_matching_uses_the_chooser_when_several_qualify() -> None:
    other = precedents.QAMatch(
        Interaction(id="q", question=QUESTION, answer=S1),
        ExpertFeedback(interaction_id="q", sentence_scores=[{"sentence": S1, "score": 10}]),
        0.9,
    )
    seen: list[int] = []

    def pick_last(_sentence: str, candidates: Any) -> int:
        seen.append(len(candidates))
        return len(candidates) - 1

    picked = precedents.match_sentences([S1], [_qa_match(70.0), other], threshold=0.85, choose=pick_last)
    assert seen == [2]
    assert (picked[0].interaction_id, picked[0].score) == ("q", 10)


def test_sentence_matching_without_a_chooser_takes_the_most_similar() -> None:
    closer = precedents.QAMatch(
        Interaction(id="q", question=QUESTION, answer=S1),
        ExpertFeedback(interaction_id="q", sentence_scores=[{"sentence": S1 + " now", "score": 10}]),
        0.9,
    )
    picked = precedents.match_sentences([S1], [closer, _qa_match(70.0)], threshold=0.85)
    assert (picked[0].interaction_id, picked[0].score) == ("p", 70.0)


# ---------------------------------------------------------------------------------------------
# evaluate_interaction: reason codes and success


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
@pytest.mark.parametrize(
    ("scores", "citation_score", "copied", "total"),
    [
        ([80, 60], 20.0, [80.0, 60.0], 72.5),
        ([None, 60], 20.0, [100.0, 60.0], 80.0),
        ([None, None], None, [100.0, 100.0], 100.0),
        ([50, 90], 0.0, [50.0, 90.0], 52.5),
    ],
)
def test_match_copies_expert_sentence_scores_and_computes_total(
    engine: Engine, scores: list[Any], citation_score: float | None, copied: list[float], total: float
) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=scores, citation_score=citation_score)
        _add(session, "new")
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason, row.matched_interaction_id) == (True, None, "prec")
    assert row.total_score == total
    [ai] = _ai_feedback(engine, "new")
    assert ai.id == row.expert_feedback_id
    assert [s["score"] for s in ai.sentence_scores] == copied
    assert [s["sentence"] for s in ai.sentence_scores] == [S1, S2]
    # A precedent without a citation score counts (and is copied) as 25.
    assert (ai.total_score, ai.citation_score) == (total, 25.0 if citation_score is None else citation_score)


def test_match_trace_keeps_the_demo_shape(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60])
        _add(session, "new")
    trace = _evaluate(engine, "new").sentence_match_trace
    assert [m["interaction_id"] for m in trace["qa_matches"]] == ["prec"]
    assert set(trace["qa_matches"][0]) == {"interaction_id", "similarity"}
    assert [(s["sentence"], s["best_match"]) for s in trace["sentences"]] == [(S1, S1), (S2, S2)]
    assert trace["citation"] == {
        "expected": CITE,
        "actual": CITE,
        "match": True,
        "interaction_id": "prec",
        "accepted": [CITE],
    }


def test_citation_with_other_case_and_whitespace_still_matches(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60])
        _add(session, "new", citation=f"  {CITE.upper()} ")
    assert _evaluate(engine, "new").has_matches is True


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_different_citation_gives_no_citation_match(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60])
        _add(session, "new", citation="https://help.acme.test/other")
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason, row.total_score) == (False, "no_citation_match", None)
    assert row.sentence_match_trace["citation"]["match"] is False
    assert _ai_feedback(engine, "new") == []


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_unrelated_question_gives_no_qa_match(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60])
        _add(session, "new", question=UNRELATED_Q, answer=UNRELATED_A)
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "no_qa_match")
    assert row.sentence_match_trace["qa_matches"] == []


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_interaction_without_text_gives_no_embeddings(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60])
        _add(session, "new", question="", answer="")
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "no_embeddings")
    assert "error" in row.sentence_match_trace


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_embedding_server_failure_gives_no_embeddings(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An embedding model configured but no server reachable: the call fails, the reason says so.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    _set_env(monkeypatch, embedding_model="test-embed", llm_timeout="1", llm_max_retries="0")
    with Session(engine) as session:
        _add(session, "new")
    assert _evaluate(engine, "new").no_match_reason == "no_embeddings"


def _long_answer(extra: str = "") -> str:
    # Many shared sentences keep QA similarity high while one extra sentence has no counterpart.
    base = [
        S1,
        S2,
        "The link expires after sixty minutes for your security.",
        "If the email does not arrive, check your spam folder first.",
        "Administrators can also reset passwords from the Users page.",
    ]
    return " ".join([*base, extra] if extra else base)


def _sentence_mismatch(session: Session, total: float | None) -> None:
    prec_answer = _long_answer()
    _add(session, "prec", answer=prec_answer, scores=[90, 95, 90, 92, 94], total=total)
    _add(session, "new", answer=_long_answer("Phone support is open on weekdays."))


def test_unmatched_sentence_without_fallback_candidate_gives_no_sentence_match(engine: Engine) -> None:
    with Session(engine) as session:
        _sentence_mismatch(session, total=70.0)
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "no_sentence_match")
    assert row.sentence_match_trace["sentences"][-1]["best_match"] is None
    assert row.sentence_match_trace["fallback"]["candidates"] == []


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_fallback_cannot_pass_without_an_llm(engine: Engine) -> None:
    with Session(engine) as session:
        _sentence_mismatch(session, total=95.0)
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "no_sentence_match")
    assert row.sentence_match_trace["fallback"]["candidates"] == ["prec"]
    assert row.sentence_match_trace["fallback"]["llm_pass"] is None


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_fallback_rejected_by_the_llm_gives_no_sentence_match(engine: Engine, llm_server: Any) -> None:
    # Seed 003's diagram: "LLM decides pass? No" → no_sentence_match; forced_fallback_no_match is
    # only for the explicit force-fallback mode.
    llm_server.script(json_reply({"pass": False, "reason": "The new answer adds a wrong phone claim."}))
    with Session(engine) as session:
        _sentence_mismatch(session, total=95.0)
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "no_sentence_match")
    assert row.sentence_match_trace["fallback"]["llm_pass"] is False
    assert row.sentence_match_trace["fallback"]["llm_reason"] == "The new answer adds a wrong phone claim."
    assert llm_server.pending == 0


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_failing_llm_in_the_fallback_gives_no_sentence_match(engine: Engine, llm_server: Any) -> None:
    llm_server.script(server_error(), server_error())  # the first try and its one retry
    with Session(engine) as session:
        _sentence_mismatch(session, total=95.0)
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "no_sentence_match")
    assert row.sentence_match_trace["fallback"]["llm_reason"].startswith("LLM comparison failed")
    assert _ai_feedback(engine, "new") == []


def _evaluate_forced(engine: Engine, iid: str) -> AutoEval:
    with Session(engine, expire_on_commit=False) as session:
        row = precedents.evaluate_interaction(session, iid, force_fallback=True)
        session.commit()
        return row


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_forced_fallback_rejected_gives_forced_fallback_no_match(engine: Engine, llm_server: Any) -> None:
    llm_server.script(json_reply({"pass": False, "reason": "Different advice."}))
    with Session(engine) as session:
        # Every sentence would match: the forced mode must skip sentence matching all the same.
        _add(session, "prec", scores=[90, 95], total=95.0)
        _add(session, "new")
    row = _evaluate_forced(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "forced_fallback_no_match")
    trace = row.sentence_match_trace
    assert trace["forced_fallback"] is True and trace["sentences"] == []
    assert trace["fallback"]["candidates"] == ["prec"]
    assert len(llm_server.chat_requests) == 1


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_forced_fallback_without_an_llm_gives_forced_fallback_no_match(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[90, 95], total=95.0)
        _add(session, "new")
    assert _evaluate_forced(engine, "new").no_match_reason == "forced_fallback_no_match"


def test_forced_fallback_approved_copies_the_precedent(engine: Engine, llm_server: Any) -> None:
    llm_server.script(json_reply({"pass": True, "reason": "Same advice as the expert."}))
    with Session(engine) as session:
        _add(session, "prec", scores=[90, 96], total=95.0)
        _add(session, "new")
    row = _evaluate_forced(engine, "new")
    assert (row.has_matches, row.matched_interaction_id, row.total_score) == (True, "prec", 89.75)


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_citation_passes_against_any_qa_match_and_copies_only_that_review(engine: Engine) -> None:
    other = "https://help.acme.test/other"
    with Session(engine) as session:
        # "prec" is the most similar and gives the sentences, but cites another page;
        # "cited" is a QA match above the threshold whose accepted URL is the interaction's.
        _add(session, "prec", citation=other, scores=[80, 60], citation_score=5.0)
        _add(session, "cited", answer=ANSWER + " Check spam.", scores=[10, 30, 50], citation_score=12.0)
        _add(session, "new")
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.matched_interaction_id) == (True, "cited")
    citation = row.sentence_match_trace["citation"]
    assert (citation["interaction_id"], citation["expected"], citation["match"]) == ("cited", CITE, True)
    assert citation["accepted"] == sorted([CITE, other])
    [ai] = _ai_feedback(engine, "new")
    # Sentences and citation of one review: cited's S1 and S2 (10, 30) and its citation score.
    assert [s["score"] for s in ai.sentence_scores] == [10, 30] and ai.citation_score == 12.0
    assert row.total_score == precedents.total_score([10, 30], 12.0)
    assert [s["best_match"] for s in row.sentence_match_trace["sentences"]] == [S1, S2]


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_two_experts_on_one_answer_the_url_picks_whose_review_is_copied(engine: Engine) -> None:
    """Issue 25's example: A scored 80/60 with citation 10 (URL x), B 100/100 with 20 (URL y)."""
    url_x, url_y = "https://help.acme.test/x", "https://help.acme.test/y"
    with Session(engine) as session:
        _add(session, "a", citation=url_x, scores=[80, 60], citation_score=10.0)
        _add(session, "b", citation=url_y, scores=[100, 100], citation_score=20.0)
        _add(session, "new_x", citation=url_x)
        _add(session, "new_y", citation=url_y)
    y = _evaluate(engine, "new_y")
    assert (y.matched_interaction_id, y.total_score) == ("b", 95.0)  # B's own total; 72.5 was neither's
    x = _evaluate(engine, "new_x")
    assert (x.matched_interaction_id, x.total_score) == ("a", 62.5)
    [ai] = _ai_feedback(engine, "new_y")
    assert ([s["score"] for s in ai.sentence_scores], ai.citation_score) == ([100, 100], 20.0)


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_a_review_with_the_url_that_misses_a_sentence_is_not_copied(engine: Engine) -> None:
    other = "https://help.acme.test/other"
    with Session(engine) as session:
        # The sentences match "prec" (another URL); "cited" has the URL but matches S1 only.
        _add(session, "prec", citation=other, scores=[80, 60])
        _add(
            session, "cited", answer=f"{S1} We email you a code that works for ten minutes.", scores=[90, 90]
        )
        _add(session, "new")
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.no_match_reason) == (False, "no_citation_match")
    assert row.sentence_match_trace["citation"]["not_every_sentence"] == ["cited"]
    assert _ai_feedback(engine, "new") == []


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_citation_prefers_the_sentence_precedent_when_both_match(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60], citation_score=5.0)
        _add(session, "cited", answer=ANSWER + " Check spam.", scores=[10, 10, 10], citation_score=12.0)
        _add(session, "new")
    row = _evaluate(engine, "new")
    assert row.sentence_match_trace["citation"]["interaction_id"] == "prec"
    assert row.total_score == precedents.total_score([80, 60], 5.0)


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_fallback_approved_by_the_llm_copies_the_precedent_scores(engine: Engine, llm_server: Any) -> None:
    llm_server.script(json_reply({"pass": True, "reason": "Same steps, same link."}))
    with Session(engine) as session:
        _sentence_mismatch(session, total=95.0)
    row = _evaluate(engine, "new")
    assert (row.has_matches, row.matched_interaction_id) == (True, "prec")
    [ai] = _ai_feedback(engine, "new")
    assert len(ai.sentence_scores) == 6
    assert [s["score"] for s in ai.sentence_scores[:5]] == [90, 95, 90, 92, 94]
    assert row.total_score == precedents.total_score([s["score"] for s in ai.sentence_scores], 20.0)


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
@pytest.mark.parametrize("prec_citation", ["https://help.acme.test/other", None])
def test_fallback_needs_an_exact_citation_match(
    engine: Engine, llm_server: Any, prec_citation: str | None
) -> None:
    with Session(engine) as session:
        _add(
            session,
            "prec",
            answer=_long_answer(),
            citation=prec_citation,
            scores=[90, 95, 90, 92, 94],
            total=95,
        )
        _add(session, "new", answer=_long_answer("Phone support is open on weekdays."))
    row = _evaluate(engine, "new")
    assert row.no_match_reason == "no_sentence_match"
    assert llm_server.chat_requests == []


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_evaluating_twice_returns_the_first_result_unchanged(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60])
        _add(session, "new")
    first = _evaluate(engine, "new")
    with Session(engine) as session:
        # The precedent changes; the stored result must not.
        session.execute(ExpertFeedback.__table__.update().values(citation_score=0.0))
        session.commit()
    second = _evaluate(engine, "new")
    assert (second.id, second.total_score) == (first.id, first.total_score)
    assert len(_ai_feedback(engine, "new")) == 1


def test_evaluating_an_unknown_interaction_raises(engine: Engine) -> None:
    with Session(engine) as session, pytest.raises(LookupError):
        precedents.evaluate_interaction(session, "missing")


# ---------------------------------------------------------------------------------------------
# evaluate_pending


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_evaluate_pending_evaluates_unreviewed_interactions_once(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "prec", scores=[80, 60], age_days=3)
        _add(session, "same", age_days=2)
        _add(session, "other", question=UNRELATED_Q, answer=UNRELATED_A, age_days=1)
    summary = precedents.evaluate_pending(engine)
    assert summary == {"evaluated": 2, "matched": 1, "skipped": 0, "reasons": {"no_qa_match": 1}}
    assert precedents.evaluate_pending(engine)["evaluated"] == 0
    with Session(engine) as session:
        assert session.execute(select(func.count()).select_from(AutoEval)).scalar_one() == 2
        assert session.execute(select(AutoEval).where(AutoEval.interaction_id == "prec")).first() is None


def test_evaluate_pending_honours_the_limit_oldest_first(engine: Engine) -> None:
    with Session(engine) as session:
        for n in range(3):
            _add(session, f"i{n}", age_days=10 - n)
    assert precedents.evaluate_pending(engine, limit=2)["evaluated"] == 2
    with Session(engine) as session:
        done = set(session.execute(select(AutoEval.interaction_id)).scalars())
    assert done == {"i0", "i1"}


# ---------------------------------------------------------------------------------------------
# The precedent index (vectorised neighbour search)


def test_index_search_agrees_with_a_per_row_cosine_loop(engine: Engine) -> None:
    with Session(engine) as session:
        for n in range(6):
            _add(session, f"p{n}", answer=ANSWER + " Extra words." * n, scores=[80, 60] + [50] * n)
        _add(session, "unreviewed")
        index = precedents.PrecedentIndex.load(session=session)
        session.commit()
        assert index.ids == [f"p{n}" for n in range(6)]  # only expert-reviewed interactions
        query = precedents.embed_texts([f"{QUESTION}\n{ANSWER}"])[0]
        found = index.search(np.asarray(query), limit=4, threshold=0.0)
        by_loop = sorted(
            (-precedents.cosine(query, precedents.embed_texts([precedents.qa_text(i)])[0]), i.id)
            for i in session.execute(select(Interaction).where(Interaction.id != "unreviewed")).scalars()
        )[:4]
        assert [iid for iid, _ in found] == [iid for _, iid in by_loop]
        for (_, sim), (neg, _) in zip(found, by_loop, strict=True):
            assert math.isclose(sim, -neg, abs_tol=1e-6)


def test_index_recomputes_vectors_that_are_missing_or_of_another_dimension(engine: Engine) -> None:
    with Session(engine) as session:
        _add(session, "p1", scores=[80, 60])
        _add(session, "p2", scores=[80, 60])
        session.get(Interaction, "p1").qa_vector = precedents.pack_vector([1.0, 0.0, 0.0])  # type: ignore[union-attr]
        session.commit()
    with Session(engine) as session:
        index = precedents.PrecedentIndex.load(session=session)
        session.commit()
        assert index.matrix.shape == (2, precedents.EMBEDDING_DIM)
    with Session(engine) as session:
        for iid in ("p1", "p2"):
            blob = session.get(Interaction, iid).qa_vector  # type: ignore[union-attr]
            assert blob is not None and len(blob) == 4 * precedents.EMBEDDING_DIM


def test_index_of_an_empty_database_finds_nothing(engine: Engine) -> None:
    with Session(engine) as session:
        index = precedents.PrecedentIndex.load(session=session)
    assert len(index) == 0
    assert index.search(np.ones(precedents.EMBEDDING_DIM), limit=10, threshold=0.0) == []


# ---------------------------------------------------------------------------------------------
# Runs: worker pool, window, --redo


def _auto_rows(engine: Engine) -> dict[str, AutoEval]:
    with Session(engine) as session:
        return {r.interaction_id: r for r in session.execute(select(AutoEval)).scalars()}


def _corpus(session: Session) -> None:
    _add(session, "prec", scores=[80, 60], age_days=30)
    for n in range(4):
        _add(session, f"same{n}", age_days=n)
    _add(session, "other", question=UNRELATED_Q, answer=UNRELATED_A, age_days=1)
    _add(session, "old", age_days=20)
    _add(session, "cite", citation="https://help.acme.test/other", age_days=2)


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
@pytest.mark.parametrize("concurrency", [0, 1, 3])
def test_pool_and_serial_runs_give_the_same_results(engine: Engine, concurrency: int) -> None:
    with Session(engine) as session:
        _corpus(session)
    seen: list[tuple[int, int]] = []
    summary = precedents.auto_evaluate(
        engine, concurrency=concurrency, progress=lambda d, t: seen.append((d, t))
    )
    assert (summary.evaluated, summary.matched, summary.skipped) == (7, 5, 0)
    assert summary.reasons == {"no_qa_match": 1, "no_citation_match": 1}
    assert seen == [(n, 7) for n in range(1, 8)]
    rows = _auto_rows(engine)
    assert set(rows) == {"same0", "same1", "same2", "same3", "other", "old", "cite"}
    assert rows["cite"].no_match_reason == "no_citation_match"
    with Session(engine) as session:
        # The pool stored each evaluated interaction's vector along with its result.
        assert session.get(Interaction, "same2").qa_vector is not None  # type: ignore[union-attr]


def test_default_concurrency_comes_from_the_setting(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: set[str] = set()
    real = precedents.decide

    def spy(*args: Any, **kwargs: Any) -> Any:
        import threading

        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(precedents, "decide", spy)
    with Session(engine) as session:
        _corpus(session)
    _set_env(monkeypatch, eval_concurrency="0")
    precedents.auto_evaluate(engine, limit=2)
    assert threads == {"MainThread"}  # 0: serially in the caller, the seed's "Vercel" mode
    _set_env(monkeypatch, eval_concurrency="2")
    precedents.auto_evaluate(engine)
    assert threads - {"MainThread"} and all(t.startswith("auto-eval") for t in threads - {"MainThread"})


def test_a_worker_that_raises_never_stops_the_others(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    real = precedents.decide

    def flaky(*, session: Session, interaction: Interaction, **kwargs: Any) -> Any:
        if interaction.id == "same1":
            raise RuntimeError("worker exploded")
        return real(session=session, interaction=interaction, **kwargs)

    monkeypatch.setattr(precedents, "decide", flaky)
    with Session(engine) as session:
        _corpus(session)
    summary = precedents.auto_evaluate(engine, concurrency=2)
    assert summary.evaluated == 7 and summary.reasons["evaluation_error"] == 1
    rows = _auto_rows(engine)
    assert len(rows) == 7  # every interaction ends with an AutoEval row
    failed = rows["same1"]
    assert (failed.processed, failed.has_matches) == (False, False)
    assert failed.sentence_match_trace["error"] == "RuntimeError: worker exploded"
    assert rows["same2"].has_matches is True
    # --redo retries the failed one once the cause is gone.
    monkeypatch.setattr(precedents, "decide", real)
    again = precedents.auto_evaluate(engine, redo=True, concurrency=2)
    assert (again.deleted, again.evaluated, again.matched) == (7, 7, 5)
    assert _auto_rows(engine)["same1"].has_matches is True


def test_window_by_age_and_product_and_limit(engine: Engine) -> None:
    with Session(engine) as session:
        _corpus(session)
        other = _add(session, "otherproduct", age_days=0)
        other.product = "globex"
        session.add(other)
        session.commit()
    recent = utcnow() - timedelta(days=7)
    assert precedents.auto_evaluate(engine, since=recent, product="globex").evaluated == 1
    summary = precedents.auto_evaluate(engine, since=recent, product="acme", limit=2)
    assert summary.evaluated == 2
    assert set(_auto_rows(engine)) == {"otherproduct", "same3", "same2"}  # the oldest two of the window
    assert precedents.auto_evaluate(engine, since=recent).evaluated == 4
    assert "old" not in _auto_rows(engine)


def test_redo_deletes_the_windows_results_and_their_ai_feedback_then_runs_again(engine: Engine) -> None:
    with Session(engine) as session:
        _corpus(session)
    precedents.auto_evaluate(engine, concurrency=0)
    first = _auto_rows(engine)
    with Session(engine) as session:
        # A newer expert precedent with a better score changes what a redo copies.
        session.execute(
            ExpertFeedback.__table__.update()
            .where(ExpertFeedback.type == "expert")
            .values(citation_score=0.0)
        )
        session.commit()
    recent = utcnow() - timedelta(days=7)
    summary = precedents.auto_evaluate(engine, since=recent, redo=True, concurrency=2)
    assert (summary.deleted, summary.evaluated, summary.matched) == (6, 6, 4)
    rows = _auto_rows(engine)
    assert rows["old"].created_at == first["old"].created_at  # outside the window: untouched
    assert rows["same0"].created_at > first["same0"].created_at
    assert rows["same0"].total_score == precedents.total_score([80, 60], 0.0)
    with Session(engine) as session:
        ai = list(session.execute(select(ExpertFeedback).where(ExpertFeedback.type == "ai")).scalars())
        assert len(ai) == 5  # one per matched interaction, the replaced copies deleted
        assert {f.id for f in ai} == {r.expert_feedback_id for r in rows.values() if r.has_matches}
    # Running --redo again is stable.
    again = precedents.auto_evaluate(engine, since=recent, redo=True)
    assert (again.deleted, again.evaluated, again.matched) == (6, 6, 4)


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_forced_fallback_run_without_llm_reports_the_forced_reason(engine: Engine) -> None:
    with Session(engine) as session:
        _corpus(session)
    summary = precedents.auto_evaluate(engine, force_fallback=True, concurrency=2)
    assert summary.matched == 0
    assert summary.reasons == {"forced_fallback_no_match": 6, "no_qa_match": 1}
    assert "  forced_fallback_no_match: 6" in summary.lines()


def test_evaluate_new_skips_reviewed_and_evaluated_interactions(engine: Engine) -> None:
    with Session(engine) as session:
        _corpus(session)
    precedents.evaluate_ids(engine, ["same0"])
    summary = precedents.evaluate_new(engine, ["prec", "same0", "same1", "missing"])
    assert (summary.evaluated, summary.matched) == (1, 1)
    assert set(_auto_rows(engine)) == {"same0", "same1"}


@pytest.mark.pg_repeats("statements and lines of test_a_worker_that_raises_never_stops_the_others")
def test_a_result_the_database_refuses_is_counted_and_stays_pending(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = precedents.store

    def refusing(*, session: Session, outcome: precedents.Outcome) -> AutoEval:
        if outcome.interaction_id == "same1":
            raise RuntimeError("disk full")
        return real(session=session, outcome=outcome)

    monkeypatch.setattr(precedents, "store", refusing)
    with Session(engine) as session:
        _corpus(session)
    summary = precedents.auto_evaluate(engine, concurrency=2)
    assert (summary.evaluated, summary.not_stored) == (6, 1)
    assert "1 results could not be stored (see the log); they stay pending" in summary.lines()
    with Session(engine) as session:
        assert precedents.pending_interaction_ids(session=session) == ["same1"]
