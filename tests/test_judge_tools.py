"""Note tools for the judge: schemas, execution, text commands, the conversation loop, AD-7 buffering.

LLM tests run the real openai client against the local server (tests/llm_server.py); database
tests run on SQLite and PostgreSQL through the `engine` fixture.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, select

from lib import judge_tools, notes
from lib.auth import Actor
from lib.config import get_settings, reset_settings
from lib.db import session_scope
from lib.judge import JudgeFailed, judge_evaluation
from lib.judge_tools import (
    MAX_NOTES_PER_RUN,
    NOTE_TOOLS,
    PendingNotes,
    check_note,
    execute_tool_call,
    parse_text_commands,
    run_with_tools,
    strip_text_commands,
)
from lib.llm import LLMError
from lib.metrics import upsert_metric_definitions
from lib.models import EvaluationSnapshot, SessionNote, utcnow
from tests.conftest import sqlite_only
from tests.llm_server import (
    LLMServer,
    ToolCallReply,
    http_error,
    json_reply,
    server_error,
    text,
    tool_call,
)
from tests.test_judge import RUBRIC, STAGE2_PAYLOAD, evaluation, stage1_payload

LEAD = Actor(identity="lee@example.com", role="lead", kind="user")
ADMIN = Actor(identity="ada@example.com", role="admin", kind="user")

pytestmark = pytest.mark.timeout(60)

SID = "snap_20260101_120000_abcd1234"
AUTHOR = "judge:test-model"
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in NOTE_TOOLS}


@pytest.fixture
def rubric(engine: Engine) -> Engine:
    """The engine with the judge tests' rubric for product 'acme'."""
    with session_scope(engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    return engine


def stored_notes(engine: Engine) -> list[SessionNote]:
    with Session(engine) as session:
        return list(session.exec(select(SessionNote).order_by(SessionNote.id)).all())


def add_stored(engine: Engine, content: str, *, note_type: str = "TIP", language: str = "en",
               session_id: str = "reviewer_session", created_by: str = "ayse") -> None:  # fmt: skip
    with session_scope(engine) as session:
        notes.add_note(session=session, language=language, note_type=note_type, content=content,
                       session_id=session_id, created_by=created_by)  # fmt: skip


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def pending(acting_for: Actor | None = None) -> PendingNotes:
    return PendingNotes(session_id=SID, created_by=AUTHOR, language="en", acting_for=acting_for)


def run_buffered(engine: Engine, name: str, args: Any, buffer: PendingNotes) -> str:
    with session_scope(engine, read_only=True) as session:
        return execute_tool_call(session=session, name=name, args=args, session_id=SID, created_by=AUTHOR, language="en",
                                 pending=buffer)  # fmt: skip


def is_stage1(body: dict[str, Any]) -> bool:
    return "Stage 1" in body["messages"][0]["content"]


# -- schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "properties", "required"),
    [
        ("add_note", ["type", "content", "phelps_code", "confidence", "language"], ["type", "content"]),
        ("search_notes", ["query", "type", "language"], ["query"]),
        ("clear_notes", ["type", "language", "days_old"], []),
    ],
)
def test_tool_schemas_mirror_the_seeds_commands(
    tool: str, properties: list[str], required: list[str]
) -> None:
    schema = SCHEMAS[tool]
    assert list(schema["properties"]) == properties
    assert schema.get("required", []) == required
    assert schema["additionalProperties"] is False


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_clear_notes_is_described_once_the_same_in_every_mode() -> None:
    """Issue 25: under structured output the judge was told CLEAR_NOTES "takes back notes you added
    in this run" while it removed other runs' notes; every mode now reads the one description."""
    described = judge_tools.CLEAR_NOTES_DESCRIPTION
    assert "every session" in described and "admin" in described
    [clear] = [t["function"] for t in NOTE_TOOLS if t["function"]["name"] == "clear_notes"]
    assert _flat(described) in _flat(clear["description"])
    for instruction in (
        judge_tools.TOOLS_INSTRUCTION,
        judge_tools.TEXT_COMMANDS_INSTRUCTION,
        judge_tools.NOTE_COMMANDS_INSTRUCTION,
    ):
        assert _flat(described) in _flat(instruction)
        assert "takes back" not in instruction


def test_tool_schemas_offer_exactly_the_note_types() -> None:
    for tool in ("add_note", "search_notes", "clear_notes"):
        assert SCHEMAS[tool]["properties"]["type"]["enum"] == [
            "SUCCESS",
            "FAILURE",
            "PATTERN",
            "STRATEGY",
            "TIP",
        ]


# -- text commands -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ADD_NOTE:TIP,Check every number against the sources",
         ("add_note", {"type": "TIP", "content": "Check every number against the sources"})),
        ("ADD_NOTE:TIP,Look at dates, names, and numbers",
         ("add_note", {"type": "TIP", "content": "Look at dates, names, and numbers"})),
        ("ADD_NOTE:SUCCESS,Matched by the opening phrase,AB00123PRO,0.9",
         ("add_note", {"type": "SUCCESS", "content": "Matched by the opening phrase", "phelps_code": "AB00123PRO",
                       "confidence": "0.9"})),
        ("ADD_NOTE:SUCCESS,Matched, finally,AB00123PRO,90%",
         ("add_note", {"type": "SUCCESS", "content": "Matched, finally", "phelps_code": "AB00123PRO",
                       "confidence": "90%"})),
        ("ADD_NOTE:PATTERN,Spanish answers open with 'Oh Señor',,0.0",
         ("add_note", {"type": "PATTERN", "content": "Spanish answers open with 'Oh Señor'",
                       "confidence": "0.0"})),
        ("  - add_note: tip, lower case works too",
         ("add_note", {"type": "tip", "content": "lower case works too"})),
        ("`ADD_NOTE:TIP,in backticks`", ("add_note", {"type": "TIP", "content": "in backticks"})),
        ("SEARCH_NOTES:population", ("search_notes", {"query": "population"})),
        ("SEARCH_NOTES:dates, numbers", ("search_notes", {"query": "dates, numbers"})),
        ("SEARCH_NOTES:population,TIP", ("search_notes", {"query": "population", "type": "TIP"})),
        ("SEARCH_NOTES:population,TIP,tr",
         ("search_notes", {"query": "population", "type": "TIP", "language": "tr"})),
        ("SEARCH_NOTES:population,,tr", ("search_notes", {"query": "population", "language": "tr"})),
        ("CLEAR_NOTES:", ("clear_notes", {})),
        ("CLEAR_NOTES:TIP", ("clear_notes", {"type": "TIP"})),
        ("CLEAR_NOTES:,en,", ("clear_notes", {"language": "en"})),
        ("CLEAR_NOTES:TIP,en,3", ("clear_notes", {"type": "TIP", "language": "en", "days_old": "3"})),
        ("CLEAR_NOTES:TIP,en,3,x", ("clear_notes", {"type": "TIP", "language": "en", "days_old": "3,x"})),
    ],
)  # fmt: skip
def test_text_commands_follow_the_seeds_grammar(line: str, expected: tuple[str, dict[str, Any]]) -> None:
    assert parse_text_commands(line) == [expected]


@pytest.mark.parametrize(
    "reply",
    [
        '{"note": "ADD_NOTE:TIP,inside a JSON string"}',
        "I would ADD_NOTE:TIP,mid-sentence",
        "NOTE:TIP,not a command",
        "",
    ],
)
def test_text_that_is_not_a_command_line_is_no_command(reply: str) -> None:
    assert parse_text_commands(reply) == []


def test_command_lines_are_stripped_leaving_the_json_readable() -> None:
    payload = {"independent_scores": {"coherence": {"score": 3}}}
    reply = f"ADD_NOTE:TIP,a lesson\nSEARCH_NOTES:x\n```json\n{json.dumps(payload, indent=2)}\n```"
    stripped = strip_text_commands(reply)
    assert "ADD_NOTE" not in stripped and "SEARCH_NOTES" not in stripped
    assert json.loads(stripped.removeprefix("```json").removesuffix("```")) == payload


# -- checking add_note arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        {"type": "tip", "content": "  spaced\n out  "},
        {"type": "SUCCESS", "content": "c", "phelps_code": "AB1", "confidence": 0.5},
        {"type": "PATTERN", "content": "c", "phelps_code": "", "confidence": 0.0},
        {"type": "STRATEGY", "content": "c", "language": ""},
        {"type": "TIP", "content": "c", "language": "EN"},
        {"type": "TIP", "content": ""},
        {"type": "TIP", "content": "x" * (notes.MAX_CONTENT_CHARS + 1)},
        {"type": "NOTE", "content": "c"},
        {"type": "TIP", "content": "c", "phelps_code": "AB1"},
        {"type": "TIP", "content": "c", "confidence": 0.4},
        {"type": "SUCCESS", "content": "c", "phelps_code": "X" * (notes.MAX_CODE_CHARS + 1)},
        {"type": "TIP", "content": "c", "language": "english!"},
        {"type": "SUCCESS", "content": "c", "confidence": -0.1},
    ],
)
@pytest.mark.pg_repeats(
    "statements and lines of test_a_model_that_keeps_calling_tools_is_stopped_after_max_rounds"
)
def test_add_note_arguments_are_checked_exactly_as_add_note_checks_them(engine: Engine, args: dict) -> None:
    try:
        checked = check_note(args, default_language="tr")
    except ValueError as exc:
        checked, refusal = None, str(exc)
    with Session(engine) as session:
        try:
            stored = notes.add_note(session=session, note_type=args["type"], content=args["content"],
                                    phelps_code=args.get("phelps_code"), confidence=args.get("confidence"),
                                    language=args.get("language", "tr"), session_id=SID)  # fmt: skip
        except ValueError as exc:
            assert checked is None, f"add_note refuses what the tool accepts: {exc}"
            return
        session.rollback()
    assert checked is not None, f"the tool refuses what add_note accepts: {refusal}"
    assert (checked.note_type, checked.content, checked.language, checked.phelps_code, checked.confidence) == (
        stored.note_type, stored.content, stored.language, stored.phelps_code, stored.confidence)  # fmt: skip


@pytest.mark.parametrize(
    ("given", "confidence"), [(0.9, 0.9), ("0.9", 0.9), (90, 0.9), ("90%", 0.9), ("85", 0.85)]
)
def test_a_confidence_above_one_is_read_as_a_percentage(given: Any, confidence: float) -> None:
    checked = check_note({"type": "SUCCESS", "content": "c", "phelps_code": "X", "confidence": given})
    assert checked.confidence == pytest.approx(confidence)


def test_the_seeds_phelps_name_is_accepted_for_the_code() -> None:
    assert check_note({"type": "SUCCESS", "content": "c", "phelps": "AB1"}).phelps_code == "AB1"


# -- executing calls -----------------------------------------------------------------------------


@sqlite_only
@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("add_note", {"content": "no type"}, "'type' is required"),
        ("add_note", {"type": "TIP"}, "'content' is required"),
        ("add_note", {"type": "HINT", "content": "c"}, "note type 'HINT' is not one of"),
        (
            "add_note",
            {"type": "TIP", "content": "c", "phelps_code": "AB1"},
            "only SUCCESS notes carry a code",
        ),
        ("add_note", {"type": "TIP", "content": ["a", "list"]}, "'content' must be text"),
        ("add_note", {"type": "SUCCESS", "content": "c", "confidence": 250}, "between 0 and 1"),
        ("add_note", {"type": "SUCCESS", "content": "c", "confidence": True}, "must be a number"),
        ("add_note", ["TIP", "c"], "must be a JSON object"),
        ("search_notes", {"query": "x", "type": "HINT"}, "note type 'HINT'"),
        ("search_notes", {"query": "x", "language": "no such language"}, "language 'no such language'"),
        ("search_notes", {"query": "q" * 501}, "longer than 500"),
        ("clear_notes", {"days_old": -1}, "'days_old' must be a whole number"),
        ("clear_notes", {"days_old": "3,x"}, "'days_old' must be a whole number"),
        ("delete_everything", {}, "there is no tool 'delete_everything'"),
    ],
)
def test_invalid_arguments_come_back_as_error_text_and_change_nothing(
    engine: Engine, name: str, args: Any, message: str
) -> None:
    buffer = pending()
    result = run_buffered(engine, name, args, buffer)
    assert result.startswith("Error: ") and message in result and result.endswith("Nothing was changed.")
    assert buffer.notes == [] and stored_notes(engine) == []


@pytest.mark.pg_repeats(
    "statements and lines of test_buffered_clear_removes_by_type_and_language_across_sessions_once_the_run_is_saved"
)
def test_buffered_add_note_keeps_the_note_pending_until_saved(engine: Engine) -> None:
    buffer = pending()
    result = run_buffered(engine, "add_note", {"type": "TIP", "content": "Check the population"}, buffer)
    assert "saved when this evaluation is saved" in result
    assert stored_notes(engine) == []
    assert judge_tools.save_pending_notes(engine, buffer) == 1
    [note] = stored_notes(engine)
    assert (note.session_id, note.created_by, note.language, note.note_type, note.content) == (
        SID, AUTHOR, "en", "TIP", "Check the population")  # fmt: skip


@pytest.mark.pg_repeats(
    "statements and lines of test_a_model_that_keeps_calling_tools_is_stopped_after_max_rounds"
)
def test_repeating_a_note_in_one_run_does_not_add_it_twice(engine: Engine) -> None:
    buffer = pending()
    run_buffered(engine, "add_note", {"type": "TIP", "content": "same"}, buffer)
    again = run_buffered(engine, "add_note", {"type": "tip", "content": " same "}, buffer)
    assert "already added this note" in again and len(buffer.notes) == 1


@pytest.mark.pg_repeats(
    "statements and lines of test_a_model_that_keeps_calling_tools_is_stopped_after_max_rounds"
)
def test_one_run_adds_at_most_the_run_limit_of_notes(engine: Engine) -> None:
    buffer = pending()
    for n in range(MAX_NOTES_PER_RUN):
        assert not run_buffered(engine, "add_note", {"type": "TIP", "content": f"n{n}"}, buffer).startswith(
            "Error"
        )
    over = run_buffered(engine, "add_note", {"type": "TIP", "content": "one too many"}, buffer)
    assert over.startswith("Error: ") and f"already added {MAX_NOTES_PER_RUN} notes" in over
    assert len(buffer.notes) == MAX_NOTES_PER_RUN


@pytest.mark.pg_repeats(
    "statements and lines of test_buffered_clear_removes_by_type_and_language_across_sessions_once_the_run_is_saved"
)
def test_direct_add_note_writes_in_the_callers_session_with_its_session_id(engine: Engine) -> None:
    with session_scope(engine) as session:
        result = execute_tool_call(session=session, name="add_note", args={"type": "STRATEGY", "content": "s", "language": ""},
                                   session_id=SID, created_by=AUTHOR)  # fmt: skip
    [note] = stored_notes(engine)
    assert result == f"Saved STRATEGY note for every language (#{note.id})."
    assert (note.session_id, note.created_by, note.language) == (SID, AUTHOR, "")


def test_search_finds_notes_of_every_session_and_filters_by_type_and_language(engine: Engine) -> None:
    add_stored(engine, "Population figures need a source", session_id="s1")
    add_stored(engine, "population of Ankara", language="tr", session_id="s2")
    add_stored(engine, "population trend", note_type="PATTERN", session_id="s3")
    add_stored(engine, "Unrelated tip", session_id="s4")
    buffer = pending()
    found = run_buffered(engine, "search_notes", {"query": "POPULATION"}, buffer).splitlines()
    assert found[0] == "Found 3 notes:"
    assert [line.split(": ", 1)[1].split(" [SESSION")[0] for line in found[1:]] == [
        "population trend", "population of Ankara", "Population figures need a source"]  # fmt: skip
    filtered = run_buffered(engine, "search_notes", {"query": "population", "type": "tip", "language": "en"},
                            buffer).splitlines()  # fmt: skip
    assert filtered == [
        "Found 1 note:",
        "[en] 💭 TIP (0m ago): Population figures need a source [SESSION: s1]",
    ]


def test_search_says_so_when_nothing_matches(engine: Engine) -> None:
    add_stored(engine, "something")
    assert run_buffered(engine, "search_notes", {"query": "nothing like it"}, pending()) == "No notes match."


def test_search_shows_the_newest_ten_and_counts_the_rest(engine: Engine) -> None:
    with session_scope(engine) as session:
        for n in range(13):
            notes.add_note(session=session, language="en", note_type="TIP", content=f"tip number {n:02d}",
                           session_id="s", timestamp=utcnow() - timedelta(minutes=60 - n))  # fmt: skip
    found = run_buffered(engine, "search_notes", {"query": "tip number"}, pending()).splitlines()
    assert found[0] == "Found 13 notes; the newest 10:"
    assert [line.split(": ", 1)[1].split(" [")[0] for line in found[1:]] == [
        f"tip number {n:02d}" for n in range(12, 2, -1)]  # fmt: skip


def test_search_sees_this_runs_pending_notes_marked_as_the_current_session(engine: Engine) -> None:
    add_stored(engine, "stored lesson about dates", session_id="20250101_000000_1_123456")
    buffer = pending()
    run_buffered(engine, "add_note", {"type": "FAILURE", "content": "pending lesson about dates"}, buffer)
    lines = run_buffered(engine, "search_notes", {"query": "lesson about dates"}, buffer).splitlines()
    assert lines[0] == "Found 2 notes:"
    assert lines[1].startswith("[en] ❌ FAILURE (0m ago): pending lesson about dates [CURRENT SESSION]")
    assert lines[2].endswith("stored lesson about dates [SESSION: 1_123456]")


def test_buffered_clear_removes_by_type_and_language_across_sessions_once_the_run_is_saved(
    engine: Engine,
) -> None:
    add_stored(engine, "a reviewer's tip")
    add_stored(engine, "an earlier judge run's tip", session_id="snap_earlier", created_by="judge:x")
    add_stored(engine, "a Turkish tip", language="tr")
    add_stored(engine, "a pattern", note_type="PATTERN")
    buffer = pending(ADMIN)  # a run an admin started: stored notes of every session may go
    for args in ({"type": "TIP", "content": "mine 1"}, {"type": "PATTERN", "content": "mine 2"},
                 {"type": "TIP", "content": "mine 3", "language": "tr"}):  # fmt: skip
        run_buffered(engine, "add_note", args, buffer)
    result = run_buffered(engine, "clear_notes", {"type": "TIP", "language": "en"}, buffer)
    assert result == (
        "Removed 1 of the notes you added in this run; 2 stored notes are removed when this evaluation is saved."
    )
    assert [n.content for n in buffer.notes] == ["mine 2", "mine 3"]
    assert len(stored_notes(engine)) == 4  # AD-7: nothing is written before the run is saved
    run_buffered(engine, "add_note", {"type": "TIP", "content": "added after the clear"}, buffer)
    assert judge_tools.save_pending_notes(engine, buffer) == 3
    assert sorted(n.content for n in stored_notes(engine)) == [
        "a Turkish tip", "a pattern", "added after the clear", "mine 2", "mine 3",
    ]  # fmt: skip


@pytest.mark.parametrize("args", [{}, {"days_old": 0}, {"type": " ", "language": ""}])
@pytest.mark.pg_repeats(
    "statements and lines of test_buffered_clear_removes_by_type_and_language_across_sessions_once_the_run_is_saved"
)
def test_clear_without_a_filter_is_refused_and_changes_nothing(engine: Engine, args: dict) -> None:
    add_stored(engine, "reviewer memory")
    buffer = pending()
    run_buffered(engine, "add_note", {"type": "TIP", "content": "mine"}, buffer)
    result = run_buffered(engine, "clear_notes", args, buffer)
    assert result.startswith("Error: refusing to remove every note") and result.endswith(
        "Nothing was changed."
    )
    assert ([n.content for n in buffer.notes], buffer.clears) == (["mine"], [])
    with session_scope(engine) as session:
        execute_tool_call(session=session, name="clear_notes", args=args, session_id=SID, created_by=AUTHOR)
    assert [n.content for n in stored_notes(engine)] == ["reviewer memory"]


@pytest.mark.parametrize(("days_old", "removed"), [(0, 1), ("0", 1), (1, 0), (30, 0)])
def test_clear_by_age_counts_whole_days(engine: Engine, days_old: Any, removed: int) -> None:
    buffer = pending()
    run_buffered(engine, "add_note", {"type": "TIP", "content": "fresh"}, buffer)
    args = {"type": "TIP", "days_old": days_old}
    assert run_buffered(engine, "clear_notes", args, buffer).startswith(f"Removed {removed} ")


def test_direct_clear_removes_matching_notes_of_every_session(engine: Engine) -> None:
    add_stored(engine, "reviewer memory", session_id="reviewer_session")
    add_stored(engine, "this session's tip", session_id=SID, created_by=AUTHOR)
    add_stored(engine, "a pattern", note_type="PATTERN", session_id=SID, created_by=AUTHOR)
    with session_scope(engine) as session:
        result = execute_tool_call(
            session=session, name="clear_notes", args={"type": "TIP"}, session_id=SID, created_by=AUTHOR,
            acting_for=ADMIN,
        )  # fmt: skip
    assert result == "Removed 2 notes."
    assert [n.content for n in stored_notes(engine)] == ["a pattern"]


# -- the conversation loop against the local server ------------------------------------------------


def run_loop(engine: Engine, **options: Any) -> judge_tools.ToolRun:
    messages = [{"role": "system", "content": "You judge."}, {"role": "user", "content": "Reply in JSON."}]
    return run_with_tools(messages, model=get_settings().judge_model,
                          session_factory=lambda: session_scope(engine, read_only=True),
                          session_id=SID, **{"language": "en", **options})  # fmt: skip


@pytest.mark.pg_repeats(
    "statements and lines of test_search_finds_notes_of_every_session_and_filters_by_type_and_language"
)
def test_tool_results_go_back_to_the_model_under_their_call_ids(
    engine: Engine, llm_server: LLMServer
) -> None:
    add_stored(engine, "Population figures need a source")
    llm_server.script(
        ToolCallReply(
            (("search_notes", {"query": "population"}), ("add_note", {"type": "TIP", "content": "t"}))
        ),
        json_reply({"ok": True}),
    )
    run = run_loop(engine)
    first, second = llm_server.chat_requests
    assert first["tools"] == json.loads(json.dumps(list(NOTE_TOOLS)))
    assert judge_tools.TOOLS_INSTRUCTION in first["messages"][0]["content"]
    assistant = second["messages"][2]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["search_notes", "add_note"]
    results = tool_messages(second)
    assert [m["tool_call_id"] for m in results] == ["call_0", "call_1"]
    assert "Population figures need a source" in results[0]["content"]
    assert results[1]["content"].startswith("Added TIP note for 'en'")
    assert (run.text, run.mode, run.rounds, [n.content for n in run.pending.notes]) == (
        '{"ok": true}', "tools", 1, ["t"])  # fmt: skip


@pytest.mark.parametrize(("language", "stored"), [("TR", "tr"), ("", ""), ("en-US-posix", "")])
@pytest.mark.pg_repeats(
    "statements and lines of test_a_model_that_keeps_calling_tools_is_stopped_after_max_rounds"
)
def test_notes_default_to_the_runs_language_or_every_language(
    engine: Engine, llm_server: LLMServer, language: str, stored: str
) -> None:
    llm_server.script(tool_call("add_note", {"type": "TIP", "content": "t"}), json_reply({"ok": True}))
    run = run_loop(engine, language=language)
    assert [n.language for n in run.pending.notes] == [stored]


@pytest.mark.parametrize("max_rounds", [0, 1, 3])
def test_a_model_that_keeps_calling_tools_is_stopped_after_max_rounds(
    engine: Engine, llm_server: LLMServer, max_rounds: int
) -> None:
    llm_server.responder = lambda body: tool_call("search_notes", {"query": "x"})
    with pytest.raises(LLMError) as failure:
        run_loop(engine, max_rounds=max_rounds)
    assert failure.value.kind == "tool_loop" and f"after {max_rounds} rounds" in str(failure.value)
    assert len(llm_server.chat_requests) == max_rounds + 1


def test_only_the_first_calls_of_a_long_reply_are_run(engine: Engine, llm_server: LLMServer) -> None:
    calls = tuple(("add_note", {"type": "TIP", "content": f"n{n}"}) for n in range(10))
    llm_server.script(ToolCallReply(calls), json_reply({"ok": True}))
    run = run_loop(engine)
    results = tool_messages(llm_server.chat_requests[1])
    assert len(results) == 10 and all("at most 8 tool calls" in m["content"] for m in results[8:])
    assert len(run.pending.notes) == judge_tools.MAX_CALLS_PER_ROUND


@pytest.mark.parametrize(
    "rejection",
    [
        http_error(400, "tools is not supported by this model", headers=()),
        http_error(400, "registry.ollama.ai/library/gemma:2b does not support tools", headers=()),
        http_error(400, '"auto" tool choice requires --enable-auto-tool-choice', headers=()),
        http_error(422, "Extra inputs are not permitted", headers=(), param="tools"),
    ],
)
@pytest.mark.pg_repeats(
    "statements and lines of test_a_model_that_keeps_calling_tools_is_stopped_after_max_rounds"
)
def test_a_server_that_rejects_tools_gets_the_text_commands_instead(
    engine: Engine, llm_server: LLMServer, rejection: Any
) -> None:
    llm_server.script(rejection, text('ADD_NOTE:TIP,Check numbers\n{"ok": true}'))
    run = run_loop(engine)
    rejected, fallback = llm_server.chat_requests
    assert "tools" in rejected and "tools" not in fallback
    system = fallback["messages"][0]["content"]
    assert judge_tools.TEXT_COMMANDS_INSTRUCTION in system and judge_tools.TOOLS_INSTRUCTION not in system
    assert (run.text, run.mode, [n.content for n in run.pending.notes]) == (
        '{"ok": true}',
        "text",
        ["Check numbers"],
    )


@pytest.mark.pg_repeats(
    "statements and lines of test_a_model_that_keeps_calling_tools_is_stopped_after_max_rounds"
)
def test_a_request_error_that_is_not_about_tools_is_not_retried(
    engine: Engine, llm_server: LLMServer
) -> None:
    llm_server.script(http_error(400, "context length exceeded", headers=()))
    with pytest.raises(LLMError) as failure:
        run_loop(engine)
    assert failure.value.status == 400 and len(llm_server.chat_requests) == 1


def test_tool_arguments_that_are_not_json_fall_back_to_text_commands(
    engine: Engine, llm_server: LLMServer
) -> None:
    llm_server.script(tool_call("add_note", "{type: TIP, content"), text('{"ok": true}'))
    run = run_loop(engine)
    assert run.mode == "text" and run.text == '{"ok": true}'
    assert "tools" not in llm_server.chat_requests[1]


def test_text_mode_search_results_come_back_before_the_answer(engine: Engine, llm_server: LLMServer) -> None:
    add_stored(engine, "Population figures need a source")
    add_stored(engine, "Something else")
    llm_server.script(
        http_error(400, "tools is not supported", headers=()),
        text("SEARCH_NOTES:population\nADD_NOTE:TIP,a lesson"),
        text('{"ok": true}'),
    )
    run = run_loop(engine)
    feedback = llm_server.chat_requests[2]["messages"][-1]
    assert feedback["role"] == "user" and feedback["content"].startswith("Results of your note commands:")
    assert (
        "Population figures need a source" in feedback["content"]
        and "Something else" not in feedback["content"]
    )
    assert (run.text, run.rounds, [n.content for n in run.pending.notes]) == ('{"ok": true}', 1, ["a lesson"])


# -- wired into the judge ---------------------------------------------------------------------------


@pytest.mark.pg_repeats("statements and lines of test_the_judge_reads_search_results_from_its_tool")
def test_stage1_offers_the_note_tools_and_stage2_does_not(rubric: Engine, llm_server: LLMServer) -> None:
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    first, second = llm_server.chat_requests
    assert [t["function"]["name"] for t in first["tools"]] == ["add_note", "search_notes", "clear_notes"]
    assert "tools" not in second


def test_a_note_the_judge_adds_is_stored_with_the_runs_session_id_after_success(
    rubric: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OVERRULE_JUDGE_MODEL", "judge-x")
    reset_settings()

    def respond(body: dict[str, Any]) -> Any:
        if is_stage1(body):
            # The note is not in the database while the run is still going (AD-7 buffering).
            assert stored_notes(rubric) == []
            if not tool_messages(body):
                return tool_call("add_note", {"type": "PATTERN", "content": "Population claims lack sources"})
            return json_reply(stage1_payload())
        assert stored_notes(rubric) == []
        return json_reply(STAGE2_PAYLOAD)

    llm_server.responder = respond
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(language="tr"), reviewer="ayse")
    assert len(llm_server.chat_requests) == 3
    [note] = stored_notes(rubric)
    assert (note.session_id, note.created_by, note.language, note.note_type, note.content) == (
        snapshot_id, "judge:judge-x", "tr", "PATTERN", "Population claims lack sources")  # fmt: skip


@pytest.mark.parametrize(
    "stage2",
    [server_error(), text("no json here"), json_reply({"metric_feedback": {}})],
)
def test_a_run_that_fails_after_the_judge_added_a_note_stores_no_note(
    rubric: Engine, llm_server: LLMServer, stage2: Any
) -> None:
    llm_server.script(
        tool_call("add_note", {"type": "TIP", "content": "never stored"}),
        json_reply(stage1_payload()),
        stage2,
        stage2,  # the client retries a 500 once
    )
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert failure.value.stage == "stage2"
    assert stored_notes(rubric) == []
    with Session(rubric) as session:
        assert session.exec(select(func.count()).select_from(EvaluationSnapshot)).one() == 0


@pytest.mark.pg_repeats(
    "statements and lines of test_a_run_that_fails_after_the_judge_added_a_note_stores_no_note"
)
def test_a_judge_that_loops_on_tools_fails_stage1_and_stores_nothing(
    rubric: Engine, llm_server: LLMServer
) -> None:
    llm_server.responder = lambda body: tool_call("add_note", {"type": "TIP", "content": "again"})
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert (failure.value.stage, failure.value.kind) == ("stage1", "tool_loop")
    assert len(llm_server.chat_requests) == judge_tools.DEFAULT_MAX_ROUNDS + 1
    assert stored_notes(rubric) == []


def test_the_judge_reads_search_results_from_its_tool(rubric: Engine, llm_server: LLMServer) -> None:
    add_stored(rubric, "Paris population figures are often outdated", language="")
    add_stored(rubric, "Turkish answers use formal address", language="tr")
    llm_server.script(
        tool_call("search_notes", {"query": "paris"}),
        json_reply(stage1_payload()),
        json_reply(STAGE2_PAYLOAD),
    )
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    [result] = tool_messages(llm_server.chat_requests[1])
    assert "Paris population figures are often outdated" in result["content"]
    assert "formal address" not in result["content"]


@pytest.mark.pg_repeats("statements and lines of test_the_judge_reads_search_results_from_its_tool")
def test_a_judge_clears_by_type_across_sessions_but_never_everything(
    rubric: Engine, llm_server: LLMServer
) -> None:
    add_stored(rubric, "reviewer memory")
    add_stored(rubric, "a reviewer's pattern", note_type="PATTERN")
    llm_server.script(
        tool_call("add_note", {"type": "TIP", "content": "second thoughts"}),
        tool_call("clear_notes", {}),
        tool_call("clear_notes", {"type": "TIP"}),
        json_reply(stage1_payload()),
        json_reply(STAGE2_PAYLOAD),
    )
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    refused = tool_messages(llm_server.chat_requests[2])[-1]["content"]
    cleared = tool_messages(llm_server.chat_requests[3])[-1]["content"]
    assert refused.startswith("Error: refusing to remove every note")
    assert cleared.startswith("Removed 1 of the notes you added in this run; 1 stored note is removed")
    assert [n.content for n in stored_notes(rubric)] == ["a reviewer's pattern"]


@pytest.mark.parametrize("mode", ["tools", "structured"])
@pytest.mark.parametrize(("starter", "left"), [(LEAD, 3), (ADMIN, 1)])
@pytest.mark.pg_repeats("statements and lines of test_the_judge_reads_search_results_from_its_tool")
def test_a_judge_run_removes_no_more_than_the_notes_page_lets_its_starter_remove(
    rubric: Engine, llm_server: LLMServer, mode: str, starter: Actor, left: int
) -> None:
    """Issue 25's report: `note_commands: ["CLEAR_NOTES:STRATEGY,,"]` deleted two other runs' STRATEGY
    notes. Across sessions that is the Notes page's bulk removal, an admin's: a lead's run keeps them."""
    add_stored(
        rubric, "strategy of run 1", note_type="STRATEGY", session_id="snap_run1", created_by="judge:x"
    )
    add_stored(
        rubric, "strategy of run 2", note_type="STRATEGY", session_id="snap_run2", created_by="judge:x"
    )
    add_stored(rubric, "a reviewer's pattern", note_type="PATTERN")
    if mode == "tools":
        llm_server.script(
            tool_call("clear_notes", {"type": "STRATEGY"}),
            json_reply(stage1_payload()),
            json_reply(STAGE2_PAYLOAD),
        )
    else:  # a server that ignores tools: the command rides in the structured reply
        llm_server.ignore_tools = True
        llm_server.script(
            json_reply(stage1_payload(note_commands=["CLEAR_NOTES:STRATEGY,,"])), json_reply(STAGE2_PAYLOAD)
        )
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer=starter)
    assert len(stored_notes(rubric)) == left
    if mode == "tools":
        said = tool_messages(llm_server.chat_requests[-2])[-1]["content"]
        if starter is LEAD:
            assert "2 stored notes of other sessions were left" in said and "admin" in said
        else:
            assert "2 stored notes are removed when this evaluation is saved" in said


@pytest.mark.pg_repeats("statements and lines of test_direct_clear_removes_matching_notes_of_every_session")
def test_a_direct_clear_for_a_lead_is_refused_and_changes_nothing(engine: Engine) -> None:
    add_stored(engine, "reviewer memory")
    with session_scope(engine) as session:
        said = execute_tool_call(session=session, name="clear_notes", args={"type": "TIP"}, session_id=SID,
                                 created_by=AUTHOR, acting_for=LEAD)  # fmt: skip
    assert said.startswith("Error: ") and "admin" in said and said.endswith("Nothing was changed.")
    assert [n.content for n in stored_notes(engine)] == ["reviewer memory"]


@pytest.mark.pg_repeats(
    "statements and lines of test_without_tools_the_judges_text_commands_are_run_and_its_json_still_read"
)
def test_invalid_tool_arguments_reach_the_judge_and_the_run_still_succeeds(
    rubric: Engine, llm_server: LLMServer
) -> None:
    llm_server.script(
        tool_call("add_note", {"type": "TIP", "content": "c", "phelps_code": "AB1"}),
        json_reply(stage1_payload()),
        json_reply(STAGE2_PAYLOAD),
    )
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    [result] = tool_messages(llm_server.chat_requests[1])
    assert result["content"].startswith("Error: only SUCCESS notes carry a code")
    assert snapshot_id and stored_notes(rubric) == []


def test_without_tools_the_judges_text_commands_are_run_and_its_json_still_read(
    rubric: Engine, llm_server: LLMServer
) -> None:
    reply = "ADD_NOTE:STRATEGY,Score groundedness claim by claim\n" + json.dumps(stage1_payload())
    llm_server.script(
        http_error(400, "tools is not supported by this server", headers=()),
        text(reply),
        json_reply(STAGE2_PAYLOAD),
    )
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert llm_server.pending == 0 and "tools" not in llm_server.chat_requests[1]
    with Session(rubric) as session:
        snap = session.get(EvaluationSnapshot, snapshot_id)
    assert snap is not None and snap.judge_scores_json["fluency"]["score"] == 4
    [note] = stored_notes(rubric)
    assert (note.note_type, note.content, note.session_id) == (
        "STRATEGY", "Score groundedness claim by claim", snapshot_id)  # fmt: skip
