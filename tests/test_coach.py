"""Coach chat core against the local OpenAI-compatible server, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlmodel import Session, func, select

from lib import coach
from lib.db import session_scope
from lib.llm import LLMError
from lib.models import ChatMessage, EvaluationSnapshot
from tests import llm_server as fake

ANSWER = "Einstein 1921'de Nobel Kimya Ödülü aldı. Kısacası, özetle söylemek gerekirse fotoelektrik etki."


def _snapshot(engine, *, snapshot_id: str = "snap_coach", language: str = "tr", max_turns: int = 15) -> str:
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id=snapshot_id,
                question="Einstein hangi ödülü aldı?",
                model_answer=ANSWER,
                product="mentor-tr",
                language=language,
                max_chat_turns=max_turns,
                user_scores_json={
                    "truthfulness": {"score": 4, "reason": "iyi"},
                    "clarity": {"score": 5},
                    "safety": {"score": 5, "reason": "SECRET-SAFETY-REASON"},
                },
                judge_scores_json={
                    "truthfulness": {"score": 2, "reason": "Factual error"},
                    "clarity": {"score": 4},
                    "safety": {"score": 5},
                },
                evidence_json={
                    "truthfulness": {
                        "evidence": [
                            {
                                "quote": "Nobel Kimya Ödülü",
                                "why": "Fizik",
                                "better": "Nobel Fizik Ödülü",
                                "verified": True,
                                "highlight_available": True,
                            }
                        ]
                    },
                    "safety": {"evidence": [{"quote": "SAFETY-QUOTE", "why": "x", "better": "y"}]},
                },
            )
        )
    return snapshot_id


def _drain(prepared: coach.PreparedReply) -> str:
    return "".join(prepared.stream())


def _messages(engine, snapshot_id: str) -> list[ChatMessage]:
    with Session(engine) as s:
        return list(s.exec(select(ChatMessage).where(ChatMessage.snapshot_id == snapshot_id)).all())


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_greeting_is_idempotent_and_never_counted(engine, llm_server) -> None:
    sid = _snapshot(engine)
    llm_server.script(fake.stream(["Merhaba! ", "Truthfulness farkı 2."]))
    first = coach.start_chat(engine, sid, ["truthfulness"], reviewer="ayse")
    assert _drain(first) == "Merhaba! Truthfulness farkı 2."
    again = coach.start_chat(engine, sid, ["truthfulness"], chat_id="")
    assert not again.needs_stream and again.text == "Merhaba! Truthfulness farkı 2."
    assert len(llm_server.chat_requests) == 1
    rows = _messages(engine, sid)
    assert [(r.client_message_id, r.role, r.is_complete) for r in rows] == [
        (f"init_{sid}", "assistant", True)
    ]
    with Session(engine) as s:
        assert s.get(EvaluationSnapshot, sid).chat_turn_count == 0


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_context_holds_only_selected_metrics_and_the_strict_evidence_rule(engine, llm_server) -> None:
    sid = _snapshot(engine)
    llm_server.script(fake.stream(["ok"]))
    _drain(coach.start_chat(engine, sid, ["truthfulness", "clarity"]))
    system = llm_server.chat_requests[0]["messages"][0]["content"]
    assert coach.STRICT_EVIDENCE_RULE in system
    assert "Nobel Kimya Ödülü" in system
    assert "SECRET-SAFETY-REASON" not in system and "SAFETY-QUOTE" not in system
    assert "REFUSE other metrics" in system and "Safety" in system  # named only as a metric to refuse
    assert "Turkish" in system


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_duplicate_send_returns_stored_reply_without_llm_or_turn(engine, llm_server) -> None:
    sid = _snapshot(engine)
    llm_server.script(fake.stream(["hi"]))
    _drain(coach.start_chat(engine, sid, ["truthfulness"]))
    llm_server.script(fake.stream(["Çünkü ", "Kimya yanlış."]))
    reply = coach.send_message(engine, sid, "Neden 2 verdin?", "turn-1")
    assert _drain(reply) == "Çünkü Kimya yanlış."
    repeat = coach.send_message(engine, sid, "Neden 2 verdin?", "turn-1")
    assert repeat.text == "Çünkü Kimya yanlış."
    assert len(llm_server.chat_requests) == 2
    with Session(engine) as s:
        assert s.get(EvaluationSnapshot, sid).chat_turn_count == 1


def test_window_sends_exactly_the_last_six_messages(engine, llm_server) -> None:
    sid = _snapshot(engine)
    llm_server.script(fake.stream(["greeting"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    for i in range(4):
        llm_server.script(fake.stream([f"answer {i}"]))
        _drain(coach.send_message(engine, sid, f"question {i}", f"t{i}"))
    sent = llm_server.chat_requests[-1]["messages"]
    assert sent[0]["role"] == "system"
    # The last six complete messages; the reply being generated is not one of them yet.
    assert [m["content"] for m in sent[1:]] == [
        "answer 0",
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
        "question 3",
    ]


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_sixteenth_message_is_refused_with_guidance(engine, llm_server) -> None:
    sid = _snapshot(engine, max_turns=15)
    llm_server.script(fake.stream(["g"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    llm_server.default_reply = fake.text("ok")
    for i in range(15):
        _drain(coach.send_message(engine, sid, f"m{i}", f"c{i}"))
    with pytest.raises(coach.TurnLimitReached, match="yeterince konuştuk"):
        coach.send_message(engine, sid, "one more", "c15")
    with Session(engine) as s:
        assert s.get(EvaluationSnapshot, sid).chat_turn_count == 15
        users = s.exec(select(func.count()).select_from(ChatMessage).where(ChatMessage.role == "user")).one()
    assert users == 15


def test_the_last_turn_completes_the_chat_at_once_and_the_limit_is_a_machine_readable_outcome(
    engine, llm_server
) -> None:
    sid = _snapshot(engine, max_turns=3)
    llm_server.script(fake.stream(["g"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    llm_server.default_reply = fake.text("ok")
    flags = []
    for i in range(3):
        prepared = coach.send_message(engine, sid, f"m{i}", f"c{i}")
        flags.append(prepared.chat_complete)
        with Session(engine) as s:
            status = s.get(EvaluationSnapshot, sid).status
        # Completed as soon as the last turn is claimed, before its reply is even streamed.
        assert status == ("completed" if i == 2 else "active")
        _drain(prepared)
    assert flags == [False, False, True]
    with pytest.raises(coach.TurnLimitReached) as info:
        coach.send_message(engine, sid, "one more", "c3")
    assert (info.value.outcome, info.value.used, info.value.limit, info.value.language) == (
        "turn_limit_reached", 3, 3, "tr",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("language", "label"),
    [
        ("tr", "Yeni bir değerlendirme başlat"),
        ("en", "Start a new evaluation"),
        ("es", "Start a new evaluation"),
    ],
)
def test_the_guidance_button_speaks_the_evaluations_language(language, label) -> None:
    assert coach.new_evaluation_label(language) == label


def test_interrupted_reply_is_regenerated_in_place(engine, llm_server) -> None:
    sid = _snapshot(engine)
    llm_server.script(fake.stream(["g"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    llm_server.script(fake.stream(["partial "], abort_after=1))
    with pytest.raises(LLMError):
        _drain(coach.send_message(engine, sid, "explain", "turn-x"))
    with Session(engine) as s:
        broken = coach.unfinished_replies(session=s, snapshot_id=sid)
    assert len(broken) == 1
    llm_server.script(fake.stream(["full ", "answer"]))
    resumed = coach.resume_reply(engine, sid, "turn-x")
    assert resumed.assistant_id == broken[0].id
    assert _drain(resumed) == "full answer"
    rows = [r for r in _messages(engine, sid) if r.client_message_id == "turn-x"]
    assert sorted((r.role, r.is_complete) for r in rows) == [("assistant", True), ("user", True)]
    with Session(engine) as s:
        assert s.get(EvaluationSnapshot, sid).chat_turn_count == 1


@pytest.mark.parametrize(
    ("metrics", "fragment"),
    [
        ([], "between 1 and 3"),
        (["clarity", "safety", "bias", "truthfulness"], "between 1 and 3"),
        (["nonsense"], "not metrics of this evaluation"),
    ],
)
def test_metric_selection_is_validated(engine, metrics, fragment) -> None:
    sid = _snapshot(engine)
    with pytest.raises(coach.CoachError, match=fragment):
        coach.start_chat(engine, sid, metrics)


def test_metrics_of_a_started_chat_are_immutable(engine, llm_server) -> None:
    sid = _snapshot(engine)
    llm_server.script(fake.stream(["g"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    with pytest.raises(coach.CoachError, match="cannot change"):
        coach.start_chat(engine, sid, ["safety"], chat_id="")
    llm_server.script(fake.stream(["second chat"]))
    other = coach.start_chat(engine, sid, ["safety"])  # a new chat
    assert other.chat_id != "" and _drain(other) == "second chat"
    with Session(engine) as s:
        chats = coach.list_chats(session=s, snapshot_id=sid)
    assert [c.selected_metrics for c in chats] == [["clarity"], ["safety"]]


def test_fifty_concurrent_sends_grant_exactly_the_limit(engine, llm_server) -> None:
    sid = _snapshot(engine, max_turns=15)
    llm_server.script(fake.stream(["g"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    granted: list[str] = []
    refused: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def send() -> None:
        cid = str(uuid.uuid4())
        try:
            coach.send_message(engine, sid, "hello", cid)
            with lock:
                granted.append(cid)
        except coach.TurnLimitReached:
            with lock:
                refused.append(cid)
        except BaseException as exc:  # collected and asserted
            errors.append(exc)

    threads = [threading.Thread(target=send) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert (len(granted), len(refused)) == (15, 35)
    with Session(engine) as s:
        assert s.get(EvaluationSnapshot, sid).chat_turn_count == 15


def test_claim_turn_alone_is_atomic_counter(engine) -> None:
    sid = _snapshot(engine, max_turns=2)
    results = []
    for _ in range(3):
        with session_scope(engine) as s:
            results.append(coach.claim_turn(s, sid))
    assert results == [True, True, False]


def test_archived_evaluation_cannot_be_coached(engine) -> None:
    sid = _snapshot(engine)
    from lib.models import utcnow

    with session_scope(engine) as s:
        snap = s.get(EvaluationSnapshot, sid)
        snap.deleted_at = utcnow()
        s.add(snap)
    with pytest.raises(coach.CoachError, match="archived"):
        coach.start_chat(engine, sid, ["clarity"])


# ---------------------------------------------------------------------------------------------
# The limit is per evaluation (seed 002 AD-9): once reached, no LLM call of any kind (issue 25)


def _at_the_limit(engine, llm_server, *, max_turns: int = 2) -> str:
    """An evaluation whose one chat (on clarity) used every turn."""
    sid = _snapshot(engine, max_turns=max_turns)
    llm_server.script(fake.stream(["greeting"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    llm_server.default_reply = fake.text("ok")
    for i in range(max_turns):
        _drain(coach.send_message(engine, sid, f"m{i}", f"c{i}"))
    return sid


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_at_the_limit_a_new_chat_is_refused_without_an_llm_call(engine, llm_server) -> None:
    sid = _at_the_limit(engine, llm_server)
    calls, rows = len(llm_server.chat_requests), len(_messages(engine, sid))
    with pytest.raises(coach.TurnLimitReached, match="yeterince konuştuk") as info:
        coach.start_chat(engine, sid, ["safety"])  # "New chat" with another metric
    assert (info.value.used, info.value.limit) == (2, 2)
    with pytest.raises(coach.TurnLimitReached):  # a greeting request by empty message, for another chat
        coach.send_message(engine, sid, "", "", chat_id="c2", selected_metrics=["truthfulness"])
    assert len(llm_server.chat_requests) == calls  # no greeting call
    assert len(_messages(engine, sid)) == rows  # and no greeting row waiting to be generated
    # The finished chat stays readable: its stored greeting comes back without a call.
    assert coach.start_chat(engine, sid, ["clarity"], chat_id="").text == "greeting"
    assert coach.send_message(engine, sid, "", "").text == "greeting"
    assert len(llm_server.chat_requests) == calls


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_at_the_limit_an_unfinished_greeting_is_not_regenerated(engine, llm_server) -> None:
    sid = _snapshot(engine, max_turns=1)
    llm_server.script(fake.stream(["half "], abort_after=1))
    with pytest.raises(LLMError):
        _drain(coach.start_chat(engine, sid, ["clarity"]))
    with session_scope(engine) as s:
        assert coach.claim_turn(s, sid)  # another tab used the only turn meanwhile
    calls = len(llm_server.chat_requests)
    with pytest.raises(coach.TurnLimitReached):
        coach.resume_reply(engine, sid, f"init_{sid}")
    with pytest.raises(coach.TurnLimitReached):
        coach.start_chat(engine, sid, ["clarity"], chat_id="")
    assert len(llm_server.chat_requests) == calls


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_the_reply_to_the_last_turn_is_still_finished_after_an_interruption(engine, llm_server) -> None:
    """The last turn was granted before the limit: its reply is owed, so resuming it may call the LLM."""
    sid = _snapshot(engine, max_turns=1)
    llm_server.script(fake.stream(["g"]))
    _drain(coach.start_chat(engine, sid, ["clarity"]))
    llm_server.script(fake.stream(["partial "], abort_after=1))
    with pytest.raises(LLMError):
        _drain(coach.send_message(engine, sid, "last one", "turn-last"))
    llm_server.script(fake.stream(["the whole answer"]))
    assert _drain(coach.resume_reply(engine, sid, "turn-last")) == "the whole answer"


# ---------------------------------------------------------------------------------------------
# An empty message is a greeting request (seed 002: `is_init: true` or an empty `message`)


@pytest.mark.parametrize("empty", ["", "   \n"])
def test_an_empty_message_asks_for_the_greeting_and_costs_no_turn(engine, llm_server, empty) -> None:
    sid = _snapshot(engine)
    llm_server.script(fake.stream(["Merhaba, ", "truthfulness farkı 2."]))
    first = coach.send_message(engine, sid, empty, "", selected_metrics=["truthfulness"], reviewer="ayse")
    assert (first.client_message_id, first.chat_id) == (f"init_{sid}", "")
    assert _drain(first) == "Merhaba, truthfulness farkı 2."
    again = coach.send_message(
        engine, sid, empty, "ignored", selected_metrics=["clarity"]
    )  # metrics are fixed
    assert again.text == "Merhaba, truthfulness farkı 2."
    assert len(llm_server.chat_requests) == 1
    rows = _messages(engine, sid)
    assert [(r.client_message_id, r.role, r.selected_metrics, r.reviewer) for r in rows] == [
        (f"init_{sid}", "assistant", ["truthfulness"], "ayse")
    ]
    with Session(engine) as s:
        assert s.get(EvaluationSnapshot, sid).chat_turn_count == 0


@pytest.mark.pg_repeats("statements and lines of test_fifty_concurrent_sends_grant_exactly_the_limit")
def test_an_empty_message_on_a_chat_without_metrics_says_to_pick_them(engine) -> None:
    sid = _snapshot(engine)
    with pytest.raises(coach.CoachError, match="pick between 1 and 3 metrics"):
        coach.send_message(engine, sid, "", "")
