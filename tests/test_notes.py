"""lib.notes on SQLite and PostgreSQL, plus the `python -m lib notes` command line."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import Engine, event, text
from sqlmodel import Session, select

from lib import counters, export, notes
from lib import search as search_module
from lib.config import reset_settings
from lib.counters import count_label
from lib.db import init_db, session_scope
from lib.models import NOTE_TYPES, LessonTagRelevance, SessionNote, TagRelevanceEvent
from tests import cli
from tests.cli import CliResult
from tests.conftest import sqlite_only

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2025, 11, 8, 14, 30, 22, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    notes.invalidate_notes_cache()
    yield
    notes.invalidate_notes_cache()


def put(engine: Engine, **fields: Any) -> SessionNote:
    """Write one note through the library, with test-friendly defaults."""
    fields.setdefault("language", "en")
    fields.setdefault("note_type", "TIP")
    fields.setdefault("content", "a note")
    fields.setdefault("session_id", "20251108_143022_12345_789")
    fields.setdefault("timestamp", NOW)
    with session_scope(engine) as s:
        return notes.add_note(session=s, **fields)


def relevant(engine: Engine, language: str, **kwargs: Any) -> list[SessionNote]:
    with session_scope(engine, read_only=True) as s:
        return notes.relevant_notes(session=s, language=language, **kwargs)


def stored(engine: Engine) -> list[SessionNote]:
    with session_scope(engine, read_only=True) as s:
        return list(s.exec(select(SessionNote).order_by(SessionNote.id)).all())


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


# --------------------------------------------------------------------------------------------
# Session ids


def test_session_id_has_the_seed_format() -> None:
    sid = notes.new_session_id(at=NOW, pid=12345)
    assert re.fullmatch(r"20251108_143022_12345_\d{6}", sid)


def test_session_id_uses_the_current_pid_by_default() -> None:
    assert notes.new_session_id().split("_")[2] == str(os.getpid())


def test_session_ids_made_in_the_same_second_differ() -> None:
    ids = {notes.new_session_id(at=NOW, pid=1) for _ in range(10)}
    assert len(ids) == 10


def test_process_session_id_is_stable_within_a_process() -> None:
    assert notes.process_session_id() == notes.process_session_id()


@pytest.mark.slow  # a new interpreter
def test_process_session_id_differs_in_another_process() -> None:
    code = "from lib.notes import process_session_id; print(process_session_id())"
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert other.stdout.strip() != notes.process_session_id()
    assert re.fullmatch(r"\d{8}_\d{6}_\d+_\d{6}", other.stdout.strip())


# --------------------------------------------------------------------------------------------
# add_note


@pytest.mark.parametrize("given", ["tip", "Tip", " TIP "])
def test_note_type_is_stored_upper_case(engine: Engine, given: str) -> None:
    assert put(engine, note_type=given).note_type == "TIP"
    assert stored(engine)[0].note_type == "TIP"


@sqlite_only
@pytest.mark.parametrize("given", ["HINT", "", "SUCCESSFUL"])
def test_unknown_note_type_is_refused(engine: Engine, given: str) -> None:
    with pytest.raises(ValueError, match="not one of SUCCESS, FAILURE, PATTERN, STRATEGY, TIP"):
        put(engine, note_type=given)
    assert stored(engine) == []


@pytest.mark.parametrize(
    ("given", "expected"), [("EN", "en"), (" tr ", "tr"), ("", ""), (None, ""), ("pt-BR", "pt-br")]
)
@pytest.mark.pg_repeats("statements and lines of test_add_note_takes_its_spec_arguments_positionally")
def test_language_is_normalised(engine: Engine, given: str | None, expected: str) -> None:
    assert put(engine, language=given).language == expected


@sqlite_only
@pytest.mark.parametrize("given", ["english-uk-x", "e n", "en;drop", "en\tgb"])
def test_invalid_language_is_refused(engine: Engine, given: str) -> None:
    with pytest.raises(ValueError, match="language"):
        put(engine, language=given)


@pytest.mark.pg_repeats("statements and lines of test_add_note_takes_its_spec_arguments_positionally")
def test_content_becomes_one_line(engine: Engine) -> None:
    note = put(engine, content="  first line\n\nsecond\tline\x00 \r\n")
    assert note.content == "first line second line"


@sqlite_only
@pytest.mark.parametrize("content", ["", "   ", "\n\t"])
def test_empty_content_is_refused(engine: Engine, content: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        put(engine, content=content)


@pytest.mark.pg_repeats("statements and lines of test_add_note_takes_its_spec_arguments_positionally")
def test_content_at_the_limit_is_kept_whole(engine: Engine) -> None:
    assert len(put(engine, content="x" * notes.MAX_CONTENT_CHARS).content) == notes.MAX_CONTENT_CHARS


@sqlite_only
def test_content_over_the_limit_is_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="longer than"):
        put(engine, content="x" * (notes.MAX_CONTENT_CHARS + 1))


@pytest.mark.pg_repeats("statements and lines of test_note_type_is_stored_upper_case")
def test_success_note_keeps_code_and_confidence(engine: Engine) -> None:
    put(engine, note_type="SUCCESS", phelps_code="AB00123PRO", confidence=0.9)
    note = stored(engine)[0]
    assert (note.phelps_code, note.confidence) == ("AB00123PRO", 0.9)


@sqlite_only
@pytest.mark.parametrize("confidence", [-0.01, 1.01, math.nan, True, "0.5"])
def test_confidence_outside_zero_to_one_is_refused(engine: Engine, confidence: Any) -> None:
    with pytest.raises(ValueError, match="confidence"):
        put(engine, note_type="SUCCESS", phelps_code="AB1", confidence=confidence)


@sqlite_only
def test_code_longer_than_twenty_characters_is_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="code"):
        put(engine, note_type="SUCCESS", phelps_code="X" * 21)


@sqlite_only
@pytest.mark.parametrize("note_type", ["FAILURE", "PATTERN", "STRATEGY", "TIP"])
def test_code_on_a_non_success_note_is_refused(engine: Engine, note_type: str) -> None:
    with pytest.raises(ValueError, match="only SUCCESS notes carry a code"):
        put(engine, note_type=note_type, phelps_code="AB1")


@sqlite_only
def test_confidence_on_a_non_success_note_is_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="only SUCCESS notes carry a confidence"):
        put(engine, note_type="PATTERN", confidence=0.7)


@pytest.mark.pg_repeats("statements and lines of test_note_type_is_stored_upper_case")
def test_seed_placeholders_on_a_pattern_note_mean_absent(engine: Engine) -> None:
    # The seed calls addSessionNote("es", "PATTERN", "...", "", 0.0).
    put(engine, language="es", note_type="PATTERN", content="Oh Señor", phelps_code="", confidence=0.0)
    note = stored(engine)[0]
    assert (note.phelps_code, note.confidence) == (None, None)


def test_note_defaults_to_this_process_session_and_now(engine: Engine) -> None:
    with session_scope(engine) as s:
        note = notes.add_note(session=s, language="en", note_type="TIP", content="c")
    assert note.session_id == notes.process_session_id()
    assert note.timestamp.tzinfo is not None


@pytest.mark.pg_repeats("statements and lines of test_note_type_is_stored_upper_case")
def test_author_is_recorded(engine: Engine) -> None:
    put(engine, created_by=" ayse ")
    assert stored(engine)[0].created_by == "ayse"


@sqlite_only
def test_naive_timestamp_is_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="timezone"):
        put(engine, timestamp=datetime(2025, 1, 1))


@pytest.mark.pg_repeats("statements and lines of test_note_type_is_stored_upper_case")
def test_added_note_is_not_committed_by_the_library(engine: Engine) -> None:
    with Session(engine) as s:
        note = notes.add_note(session=s, language="en", note_type="TIP", content="c")
        assert note.id is not None
        s.rollback()
    assert stored(engine) == []


# --------------------------------------------------------------------------------------------
# relevant_notes: the seed query


SEED_MATRIX = [
    # (note language, note type, shown to an "en" judge?)
    ("en", "TIP", True),
    ("en", "SUCCESS", True),
    ("en", "FAILURE", True),
    ("", "TIP", True),
    ("", "FAILURE", True),
    ("tr", "STRATEGY", True),
    ("tr", "PATTERN", True),
    ("tr", "TIP", False),
    ("tr", "SUCCESS", False),
    ("tr", "FAILURE", False),
]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevant_notes_follow_the_seed_or_rule(engine: Engine, use_cache: bool) -> None:
    for i, (language, kind, _) in enumerate(SEED_MATRIX):
        put(
            engine,
            language=language,
            note_type=kind,
            content=f"{language}/{kind}",
            timestamp=NOW + timedelta(minutes=i),
        )
    shown = {n.content for n in relevant(engine, "en", use_cache=use_cache)}
    assert shown == {f"{lang}/{kind}" for lang, kind, ok in SEED_MATRIX if ok}


@pytest.mark.parametrize("use_cache", [True, False])
def test_relevant_notes_are_newest_first(engine: Engine, use_cache: bool) -> None:
    for minutes in (5, 1, 9, 3):
        put(engine, content=f"m{minutes}", timestamp=NOW + timedelta(minutes=minutes))
    assert [n.content for n in relevant(engine, "en", use_cache=use_cache)] == ["m9", "m5", "m3", "m1"]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevant_notes_are_limited_to_twenty_by_default(engine: Engine, use_cache: bool) -> None:
    for i in range(25):
        put(engine, content=f"n{i}", timestamp=NOW + timedelta(minutes=i))
    shown = relevant(engine, "en", use_cache=use_cache)
    assert [n.content for n in shown] == [f"n{i}" for i in range(24, 4, -1)]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevant_notes_honour_an_explicit_limit(engine: Engine, use_cache: bool) -> None:
    for i in range(5):
        put(engine, content=f"n{i}", timestamp=NOW + timedelta(minutes=i))
    assert [n.content for n in relevant(engine, "en", limit=2, use_cache=use_cache)] == ["n4", "n3"]


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevant_notes_limit_comes_from_settings(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERRULE_NOTES_LIMIT", "3")
    reset_settings()
    for i in range(5):
        put(engine, content=f"n{i}", timestamp=NOW + timedelta(minutes=i))
    assert len(relevant(engine, "en")) == 3


@sqlite_only
def test_relevant_notes_refuse_a_zero_limit(engine: Engine) -> None:
    with pytest.raises(ValueError, match="limit"):
        relevant(engine, "en", limit=0)


def test_relevant_notes_language_is_case_insensitive(engine: Engine) -> None:
    put(engine, language="tr", content="turkish")
    assert [n.content for n in relevant(engine, "TR")] == ["turkish"]


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevant_notes_reach_past_the_cached_window(engine: Engine) -> None:
    # The 50 newest notes are English; the Turkish ones are older than the cached window.
    for i in range(5):
        put(engine, language="tr", content=f"tr{i}", timestamp=NOW + timedelta(minutes=i))
    for i in range(50):
        put(engine, language="en", content=f"en{i}", timestamp=NOW + timedelta(hours=1, minutes=i))
    assert [n.content for n in relevant(engine, "tr")] == [f"tr{i}" for i in range(4, -1, -1)]


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevant_notes_on_an_empty_database(engine: Engine) -> None:
    assert relevant(engine, "en") == []


# --------------------------------------------------------------------------------------------
# relevant_notes: the tag-relevance hook


def _seven_notes(engine: Engine) -> list[int]:
    return [put(engine, content=f"n{i}", timestamp=NOW + timedelta(minutes=i)).id for i in range(7)]


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevance_hook_is_not_called_without_tags(engine: Engine) -> None:
    _seven_notes(engine)
    calls: list[Any] = []
    relevant(engine, "en", relevance=lambda s, ids, tags: calls.append(ids) or {})
    assert calls == []


def test_relevance_hook_receives_the_candidates_and_tags(engine: Engine) -> None:
    ids = _seven_notes(engine)
    calls: list[tuple[list[int], list[str]]] = []
    relevant(
        engine,
        "en",
        limit=2,
        tags=["lang:en"],
        relevance=lambda s, i, t: calls.append((list(i), list(t))) or {},
    )
    assert calls == [(sorted(ids, reverse=True)[:6], ["lang:en"])]


@pytest.mark.pg_repeats("statements and lines of test_relevance_hook_receives_the_candidates_and_tags")
def test_filtered_notes_are_dropped_and_the_gap_is_filled(engine: Engine) -> None:
    ids = _seven_notes(engine)
    newest = ids[-1]
    shown = relevant(engine, "en", limit=3, tags=["t"], relevance=lambda s, i, t: {newest: ("filtered", 0.0)})
    assert [n.content for n in shown] == ["n5", "n4", "n3"]


@pytest.mark.pg_repeats("statements and lines of test_relevance_hook_receives_the_candidates_and_tags")
def test_boost_moves_a_note_up(engine: Engine) -> None:
    ids = _seven_notes(engine)
    oldest_in_pool = ids[1]  # pool of 2×3 = 6 newest: n6..n1
    shown = relevant(
        engine, "en", limit=2, tags=["t"], relevance=lambda s, i, t: {oldest_in_pool: ("boosted", 1.0)}
    )
    assert [n.content for n in shown] == ["n1", "n6"]


# --------------------------------------------------------------------------------------------
# The recent-notes cache


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    """SQL sent to the database that touches the notes table (observed, not faked)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "session_notes" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_cache_hit_costs_one_fingerprint_statement(engine: Engine, statements: list[str]) -> None:
    put(engine, content="cached")
    first = relevant(engine, "en")
    statements.clear()
    second = relevant(engine, "en")
    assert [n.content for n in second] == [n.content for n in first] == ["cached"]
    assert len(statements) == 1
    assert "max" in statements[0].lower() and "order by" not in statements[0].lower()


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_write_in_this_process_drops_the_cache_entry(engine: Engine, statements: list[str]) -> None:
    put(engine, content="one")
    relevant(engine, "en")
    put(engine, content="two", timestamp=NOW + timedelta(minutes=1))
    statements.clear()
    assert [n.content for n in relevant(engine, "en")] == ["two", "one"]
    assert len(statements) == 1 and "order by" in statements[0].lower()  # reloaded, not revalidated


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_cached_notes_are_private_copies(engine: Engine) -> None:
    put(engine, content="original")
    relevant(engine, "en")
    relevant(engine, "en")[0].content = "changed by a caller"
    assert relevant(engine, "en")[0].content == "original"


def test_note_added_in_this_process_is_seen_at_once(engine: Engine) -> None:
    put(engine, content="old", timestamp=NOW - timedelta(days=1))
    relevant(engine, "en")
    put(engine, content="new")
    assert [n.content for n in relevant(engine, "en")] == ["new", "old"]


def test_removal_in_this_process_is_seen_at_once(engine: Engine) -> None:
    put(engine, content="keep", note_type="TIP")
    put(engine, content="drop", note_type="FAILURE")
    relevant(engine, "en")
    with session_scope(engine) as s:
        notes.remove_notes(session=s, note_type="FAILURE")
    assert [n.content for n in relevant(engine, "en")] == ["keep"]


def test_insert_by_another_engine_is_seen(engine: Engine) -> None:
    put(engine, content="mine")
    relevant(engine, "en")
    other = init_db(url_of(engine))
    try:
        # Core insert, bypassing lib.notes: only the fingerprint can notice, as with another process.
        with other.begin() as conn:
            conn.execute(
                SessionNote.__table__.insert().values(  # type: ignore[attr-defined]
                    timestamp=NOW - timedelta(days=3),
                    language="en",
                    note_type="TIP",
                    content="theirs",
                    session_id="other",
                    pinned=False,
                    auto_pinned=False,
                    prerequisites={},
                )
            )
    finally:
        other.dispose()
    assert [n.content for n in relevant(engine, "en")] == ["mine", "theirs"]


def test_raw_delete_by_another_engine_is_seen(engine: Engine) -> None:
    for i in range(3):
        put(engine, content=f"n{i}", timestamp=NOW + timedelta(minutes=i))
    relevant(engine, "en")
    other = init_db(url_of(engine))
    try:
        with other.begin() as conn:
            conn.execute(text("DELETE FROM session_notes WHERE content = 'n1'"))
    finally:
        other.dispose()
    assert [n.content for n in relevant(engine, "en")] == ["n2", "n0"]


@pytest.mark.pg_repeats("statements and lines of test_raw_delete_by_another_engine_is_seen")
def test_raw_delete_inside_a_full_window_is_seen(engine: Engine) -> None:
    for i in range(60):
        put(engine, content=f"n{i}", timestamp=NOW + timedelta(minutes=i))
    relevant(engine, "en")
    with engine.begin() as conn:  # bypasses lib.notes, as another process would
        conn.execute(text("DELETE FROM session_notes WHERE content = 'n58'"))
    shown = [n.content for n in relevant(engine, "en")]
    assert "n58" not in shown and shown[:2] == ["n59", "n57"] and len(shown) == 20


@pytest.mark.slow  # a new interpreter importing the whole stack
def test_note_added_by_another_process_is_seen(engine: Engine) -> None:
    put(engine, content="mine", timestamp=NOW - timedelta(days=1))
    relevant(engine, "en")
    added = cli.run_cli_process(
        "notes",
        "add",
        "--type",
        "TIP",
        "--language",
        "en",
        "from the cli",
        env={"OVERRULE_DATABASE_URL": url_of(engine)},
    )
    assert added.returncode == 0, added.stderr
    assert [n.content for n in relevant(engine, "en")] == ["from the cli", "mine"]


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_disabled_cache_still_answers(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERRULE_NOTES_CACHE_SIZE", "0")
    reset_settings()
    put(engine, content="n")
    assert [n.content for n in relevant(engine, "en")] == ["n"]


def test_cache_is_safe_under_concurrent_readers_and_a_writer(engine: Engine) -> None:
    for i in range(10):
        put(engine, content=f"seed{i}", timestamp=NOW + timedelta(minutes=i))
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(15):
                shown = relevant(engine, "en")
                assert [n.timestamp for n in shown] == sorted((n.timestamp for n in shown), reverse=True)
        except BaseException as exc:
            errors.append(exc)

    def write() -> None:
        try:
            for i in range(15):
                put(engine, content=f"w{i}", timestamp=NOW + timedelta(hours=1, minutes=i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)] + [threading.Thread(target=write)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [n.content for n in relevant(engine, "en")] == [
        n.content for n in relevant(engine, "en", use_cache=False)
    ]
    assert relevant(engine, "en")[0].content == "w14"


# --------------------------------------------------------------------------------------------
# search_notes / count_notes


@pytest.fixture
def corpus(engine: Engine) -> Engine:
    rows = [
        ("en", "TIP", "Opening phrases decide the match", "s_one", 1),
        ("tr", "PATTERN", "ÇAY ile başlayan dualar", "s_one", 2),
        ("en", "FAILURE", "100% sure was wrong", "s_two", 3),
        ("", "STRATEGY", "use a_b then c", "s_two", 4),
        ("en", "TIP", "back\\slash in text", "s_three", 5),
    ]
    for language, kind, content, sid, minutes in rows:
        put(
            engine,
            language=language,
            note_type=kind,
            content=content,
            session_id=sid,
            timestamp=NOW + timedelta(minutes=minutes),
        )
    return engine


def search(engine: Engine, **kwargs: Any) -> list[str]:
    with session_scope(engine, read_only=True) as s:
        paging = {k: kwargs.pop(k) for k in ("limit", "offset") if k in kwargs}
        return [
            n.content for n in notes.search_notes(session=s, filters=notes.NoteFilter(**kwargs), **paging)
        ]


@pytest.mark.parametrize("query", ["opening", "OPENING", "Phrases Decide", "match"])
def test_search_is_case_insensitive_substring(corpus: Engine, query: str) -> None:
    assert search(corpus, query=query) == ["Opening phrases decide the match"]


@pytest.mark.parametrize("query", ["çay", "ÇAY", "BAŞLAYAN"])
def test_search_folds_case_beyond_ascii(corpus: Engine, query: str) -> None:
    assert search(corpus, query=query) == ["ÇAY ile başlayan dualar"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [("%", ["100% sure was wrong"]), ("_", ["use a_b then c"]), ("\\", ["back\\slash in text"]),
     ("a%b", []), ("a_b", ["use a_b then c"]), ("0%_", [])],
)  # fmt: skip
def test_search_treats_wildcards_literally(corpus: Engine, query: str, expected: list[str]) -> None:
    assert search(corpus, query=query) == expected


def test_search_without_match_is_empty(corpus: Engine) -> None:
    assert search(corpus, query="no such words") == []


def test_empty_search_lists_every_session_newest_first(corpus: Engine) -> None:
    assert len(search(corpus)) == 5
    assert search(corpus)[0] == "back\\slash in text"


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"note_type": "tip"}, ["back\\slash in text", "Opening phrases decide the match"]),
        ({"note_type": ["FAILURE", "STRATEGY"]}, ["use a_b then c", "100% sure was wrong"]),
        ({"language": ""}, ["use a_b then c"]),
        ({"language": "TR"}, ["ÇAY ile başlayan dualar"]),
        ({"session_id": "s_two"}, ["use a_b then c", "100% sure was wrong"]),
        ({"since": NOW + timedelta(minutes=4)}, ["back\\slash in text", "use a_b then c"]),
        ({"until": NOW + timedelta(minutes=2)}, ["Opening phrases decide the match"]),
        ({"query": "e", "language": "en", "note_type": "FAILURE"}, ["100% sure was wrong"]),
        ({"note_type": []}, []),
    ],
)
def test_search_filters(corpus: Engine, filters: dict[str, Any], expected: list[str]) -> None:
    assert search(corpus, **filters) == expected


def test_search_takes_its_filters_one_way_only(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s, pytest.raises(TypeError, match="not both"):
        notes.search_notes(s, "tip", filters=notes.NoteFilter(language="en"))


@sqlite_only
def test_search_refuses_an_unknown_type(corpus: Engine) -> None:
    with pytest.raises(ValueError, match="not one of"):
        search(corpus, note_type="HINT")


def test_search_pages_with_limit_and_offset(corpus: Engine) -> None:
    everything = search(corpus)
    assert (
        search(corpus, limit=2) + search(corpus, limit=2, offset=2) + search(corpus, limit=2, offset=4)
        == everything
    )


@pytest.mark.parametrize(("filters", "expected"), [({}, 5), ({"query": "%"}, 1), ({"language": "en"}, 3)])
def test_count_matches_search(corpus: Engine, filters: dict[str, Any], expected: int) -> None:
    with session_scope(corpus, read_only=True) as s:
        assert (
            notes.count_notes(session=s, filters=notes.NoteFilter(**filters))
            == expected
            == len(search(corpus, **filters))
        )


def test_note_languages_lists_each_once(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        assert notes.note_languages(session=s) == ["", "en", "tr"]


# --------------------------------------------------------------------------------------------
# Timeline and health


def test_timeline_lists_sessions_newest_first_with_counts_per_type(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        timeline = notes.session_timeline(session=s)
    assert [t.session_id for t in timeline] == ["s_three", "s_two", "s_one"]
    assert timeline[1].notes == 2
    assert timeline[1].counts == {"SUCCESS": 0, "FAILURE": 1, "PATTERN": 0, "STRATEGY": 1, "TIP": 0}
    assert (timeline[2].first_note, timeline[2].last_note) == (
        NOW + timedelta(minutes=1),
        NOW + timedelta(minutes=2),
    )


def test_timeline_respects_filters_and_paging(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        tips = notes.session_timeline(session=s, filters=notes.NoteFilter(note_type="TIP"))
        assert notes.count_sessions(session=s, filters=notes.NoteFilter(note_type="TIP")) == 2
        page = notes.session_timeline(session=s, limit=1, offset=1)
    assert [(t.session_id, t.notes) for t in tips] == [("s_three", 1), ("s_one", 1)]
    assert [t.session_id for t in page] == ["s_two"]


def test_timeline_orders_overlapping_sessions_by_their_latest_note(engine: Engine, monkeypatch) -> None:
    monkeypatch.setattr(notes, "TIMELINE_SCAN_BATCH", 1)  # the walk crosses fetch batches
    for minutes, sid in [(1, "early"), (2, "middle"), (3, "late"), (4, "early"), (5, "middle")]:
        put(engine, session_id=sid, content=f"{sid} {minutes}", timestamp=NOW + timedelta(minutes=minutes))
    with session_scope(engine, read_only=True) as s:
        pages = [notes.session_timeline(session=s, limit=2, offset=o) for o in (0, 2, 4)]
        tips = notes.session_timeline(session=s, filters=notes.NoteFilter(query="early"))
    assert [[(t.session_id, t.notes) for t in page] for page in pages] == [
        [("middle", 2), ("early", 2)],
        [("late", 1)],
        [],
    ]
    assert pages[0][1].first_note == NOW + timedelta(minutes=1)
    assert pages[0][1].last_note == NOW + timedelta(minutes=4)
    assert [(t.session_id, t.notes) for t in tips] == [("early", 2)]


def test_timeline_frame_has_a_column_per_type(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        frame = notes.timeline_frame(notes.session_timeline(session=s))
    assert list(frame.columns) == ["session_id", "notes", *NOTE_TYPES, "first_note", "last_note"]
    assert frame["notes"].sum() == 5


def test_notes_of_sessions_are_the_matching_notes_of_those_sessions_only(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        both = notes.notes_of_sessions(session=s, session_ids=["s_one", "s_two"])
        tips = notes.notes_of_sessions(
            session=s, session_ids=["s_one", "s_two"], filters=notes.NoteFilter(note_type="TIP")
        )
        capped = notes.notes_of_sessions(session=s, session_ids=["s_one", "s_two"], limit=1)
        none = notes.notes_of_sessions(session=s, session_ids=[])
    assert sorted({n.session_id for n in both}) == ["s_one", "s_two"] and len(both) == 4
    assert [n.timestamp for n in both] == sorted((n.timestamp for n in both), reverse=True)
    assert [(n.session_id, n.note_type) for n in tips] == [("s_one", "TIP")]
    assert len(capped) == 1 and capped[0].id == both[0].id
    assert none == []


@pytest.mark.parametrize(("kind", "label"), [("TIP", "💭 TIP"), ("SUCCESS", "✅ SUCCESS"), ("new", "📝 new")])
def test_type_labels_put_the_icon_before_the_type(kind: str, label: str) -> None:
    assert notes.note_type_label(kind) == label
    frame = notes.with_type_labels(pd.DataFrame({"note_type": [kind], "content": ["x"]}))
    assert frame["note_type"].tolist() == [label]


@pytest.mark.pg_repeats("statements and lines of test_session_counts_stop_at_the_cap")
def test_health_of_an_empty_database(engine: Engine) -> None:
    with session_scope(engine, read_only=True) as s:
        assert notes.notes_health(session=s) == {"total_notes": 0, "sessions": 0, "latest_note": None}


@pytest.mark.pg_repeats("statements and lines of test_session_counts_stop_at_the_cap")
def test_health_counts_notes_sessions_and_latest(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        health = notes.notes_health(session=s)
    assert health == {"total_notes": 5, "sessions": 3, "latest_note": NOW + timedelta(minutes=5)}


def test_session_counts_stop_at_the_cap(corpus: Engine, monkeypatch) -> None:
    with session_scope(corpus, read_only=True) as s:  # corpus: 3 sessions, 2 of them with a TIP
        assert notes.count_sessions(session=s, cap=None) == notes.count_sessions(session=s, cap=3) == 3
        assert notes.count_sessions(session=s, cap=1) == 2  # cap + 1: shown as "1+"
        assert notes.count_sessions(session=s, cap=0, filters=notes.NoteFilter(note_type="TIP")) == 1
        assert notes.notes_health(session=s)["sessions"] == 3
        monkeypatch.setattr(notes, "SESSION_COUNT_CAP", 1)
        assert notes.notes_health(session=s)["sessions"] == 2
    assert count_label(2, 1) == "1+"


def test_health_counts_notes_to_the_cap(corpus: Engine, monkeypatch) -> None:
    """Every render reads the health figures: the notes are counted to `COUNT_CAP` + 1 ("4+"), not all."""
    with session_scope(corpus, read_only=True) as s:  # corpus: 5 notes
        monkeypatch.setattr(counters, "COUNT_CAP", 4)
        assert notes.notes_health(session=s)["total_notes"] == 5
        monkeypatch.setattr(counters, "COUNT_CAP", 3)
        assert notes.notes_health(session=s)["total_notes"] == 4  # shown as "3+"


@pytest.fixture
def refunds(engine: Engine) -> Engine:
    """14 notes, "refund" in 10 of them, over types, languages, sessions and (tied) times."""
    for i in range(14):
        put(
            engine,
            language=("en", "tr")[i % 2],
            note_type=NOTE_TYPES[i % 3],
            content=f"{'Refund window' if i % 7 not in (3, 5) else 'Dosage caveat'} no. {i}",
            session_id=f"s_{i // 4}",
            timestamp=NOW + timedelta(minutes=i // 3),
        )
    return engine


REFUND_FILTERS = [
    {}, {"language": "en"}, {"note_type": "SUCCESS"}, {"query": "refund"}, {"query": "caveat"},
    {"query": "refund", "language": "en"}, {"query": "refund", "note_type": ["SUCCESS", "FAILURE"]},
    {"session_id": "s_1", "query": "refund"}, {"until": NOW + timedelta(minutes=3), "language": "tr"},
    {"since": NOW + timedelta(minutes=1), "query": "refund"},
]  # fmt: skip


@pytest.mark.parametrize("filters", REFUND_FILTERS)
def test_a_capped_count_is_the_exact_one_up_to_its_cap(
    refunds: Engine, monkeypatch, filters: dict[str, Any]
) -> None:
    """`count_notes(cap=n)`: the exact count while it is at most n, else n + 1 ("n+"), from each plan:
    a text alone (its index), a text with others from its index or walked (COUNT_CAP above or below
    its matches), a rare or a common text (RARE_MATCHES)."""
    f = notes.NoteFilter(**filters)
    with session_scope(refunds, read_only=True) as s:
        exact = notes.count_notes(session=s, filters=f)
        assert exact == len(search(refunds, limit=100, **filters))
        for index_cap, rare in ((100, 100), (100, 0), (0, 0)):
            monkeypatch.setattr(counters, "COUNT_CAP", index_cap)
            monkeypatch.setattr(search_module, "RARE_MATCHES", rare)
            for cap in range(exact + 2):
                assert notes.count_notes(session=s, filters=f, cap=cap) == min(exact, cap + 1), (cap, filters)
    assert notes.count_cap(f) == (counters.TEXT_COUNT_CAP if f.query else counters.COUNT_CAP)


@pytest.mark.parametrize("filters", REFUND_FILTERS)
def test_a_session_count_is_the_sessions_of_the_matches_up_to_its_cap(
    refunds: Engine, monkeypatch, filters: dict[str, Any]
) -> None:
    """`count_sessions` from each plan (a filter's range, a text alone from its index, a rare or a
    common text with others): the matching notes' distinct sessions, or cap + 1."""
    f = notes.NoteFilter(**filters)
    with session_scope(refunds, read_only=True) as s:
        found = notes.search_notes(session=s, filters=f, limit=100)
        sessions = len({n.session_id for n in found})
        assert found
        for rare in (100, 0):
            monkeypatch.setattr(search_module, "RARE_MATCHES", rare)
            assert notes.count_sessions(session=s, filters=f, cap=None) == sessions, filters
            for cap in range(sessions + 1):
                assert notes.count_sessions(session=s, filters=f, cap=cap) == min(sessions, cap + 1), cap


@pytest.mark.parametrize("filters", [f for f in REFUND_FILTERS if "query" in f])
def test_a_deep_page_of_a_common_text_is_the_walks_page(refunds: Engine, monkeypatch, filters) -> None:
    """Deep enough, a common text's page tests the text index's matches as a set on the walk
    (`TEXT_SET_DEPTH`): the same notes in the same order as the walk that reads each row's text."""
    monkeypatch.setattr(search_module, "RARE_MATCHES", 0)  # every text is common
    pages = {}
    for depth in (0, 1_000):  # 0: never the set
        monkeypatch.setattr(notes, "TEXT_SET_DEPTH", depth)
        pages[depth] = [search(refunds, limit=3, offset=o, **filters) for o in range(0, 15, 3)]
    assert pages[0] == pages[1_000]
    assert [n for page in pages[0] for n in page] == search(refunds, limit=100, **filters) != []


def test_recent_sessions_come_from_the_newest_notes_only(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        every = notes.recent_session_ids(session=s)
        newest_two_notes = notes.recent_session_ids(session=s, window=2)
        one = notes.recent_session_ids(session=s, limit=1)
    assert every == ["s_three", "s_two", "s_one"]
    assert newest_two_notes == ["s_three", "s_two"]  # s_one's notes are older than the window
    assert one == ["s_three"]


def test_timeline_and_session_menu_break_ties_alike(engine: Engine) -> None:
    # Same latest time; run_a's note is the newer row (higher id), run_b sorts after it by name.
    for sid in ("run_b", "run_a"):
        put(engine, session_id=sid, content=sid, timestamp=NOW)
    with session_scope(engine, read_only=True) as s:
        timeline = [t.session_id for t in notes.session_timeline(session=s)]
        menu = notes.recent_session_ids(session=s)
    assert timeline == menu == ["run_a", "run_b"]


# --------------------------------------------------------------------------------------------
# CSV of every match


def csv_rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8"))))


def test_csv_of_all_matches_holds_every_note_newest_first(corpus: Engine, monkeypatch) -> None:
    monkeypatch.setattr(notes, "CSV_BATCH_ROWS", 2)  # several batches even for five notes
    put(corpus, content="=HYPERLINK(1)", session_id="s_four", timestamp=NOW + timedelta(minutes=6))
    everything = notes.NoteFilter()
    data = export.notes_csv_bytes(engine=corpus, filters=everything)
    assert b"".join(export.notes_csv_chunks(engine=corpus, filters=everything)) == data
    rows = csv_rows(data)
    assert list(rows[0]) == list(notes.FRAME_COLUMNS)
    assert [r["content"] for r in rows] == [
        "'=HYPERLINK(1)",  # a formula arrives as text
        "back\\slash in text",
        "use a_b then c",
        "100% sure was wrong",
        "ÇAY ile başlayan dualar",
        "Opening phrases decide the match",
    ]
    assert rows[-1]["note_type"] == "TIP" and rows[-1]["timestamp"] == "2025-11-08T14:31:22Z"


def test_csv_of_all_matches_follows_the_filters(corpus: Engine) -> None:
    tips = notes.NoteFilter(note_type="TIP", language="en")
    rows = csv_rows(export.notes_csv_bytes(engine=corpus, filters=tips))
    assert [r["session_id"] for r in rows] == ["s_three", "s_one"]


# --------------------------------------------------------------------------------------------
# Removal


def remove(engine: Engine, **kwargs: Any) -> tuple[int, int]:
    """(preview count, removed count) for the same arguments."""
    with session_scope(engine) as s:
        preview = notes.preview_remove(session=s, **kwargs)
        return preview, notes.remove_notes(session=s, **kwargs)


@sqlite_only
def test_removal_without_any_filter_is_refused(corpus: Engine) -> None:
    with pytest.raises(ValueError, match="refusing to remove every note"):
        remove(corpus)
    assert len(stored(corpus)) == 5


def test_removal_of_everything_needs_all_notes(corpus: Engine) -> None:
    assert remove(corpus, all_notes=True) == (5, 5)
    assert stored(corpus) == []


@pytest.mark.parametrize(
    ("filters", "removed", "left"),
    [
        ({"note_type": "TIP"}, 2, 3),
        ({"note_type": list(NOTE_TYPES)}, 5, 0),
        ({"language": ""}, 1, 4),
        ({"language": "en"}, 3, 2),
        ({"language": "xx"}, 0, 5),
        ({"note_type": "SUCCESS"}, 0, 5),
        ({"session_id": "s_one"}, 2, 3),
        ({"older_than": timedelta(minutes=3), "now": NOW + timedelta(minutes=5)}, 1, 4),
        ({"older_than": timedelta(minutes=3), "now": NOW + timedelta(minutes=5), "language": "tr"}, 0, 5),
        ({"older_than": timedelta(days=1), "now": NOW + timedelta(minutes=5)}, 0, 5),
    ],
)
def test_removal_by_filter(corpus: Engine, filters: dict[str, Any], removed: int, left: int) -> None:
    assert remove(corpus, **filters) == (removed, removed)
    assert len(stored(corpus)) == left


@pytest.mark.parametrize("older_than", [timedelta(0), timedelta(minutes=-5)])
@pytest.mark.pg_repeats("statements and lines of test_add_note_takes_its_spec_arguments_positionally")
def test_removal_age_must_be_positive(corpus: Engine, older_than: timedelta) -> None:
    with pytest.raises(ValueError, match="positive"):
        remove(corpus, older_than=older_than)


def test_removal_takes_the_notes_relevance_history_with_it(engine: Engine) -> None:
    doomed = put(engine, note_type="FAILURE").id
    kept = put(engine, note_type="TIP").id
    with session_scope(engine) as s:
        for lesson in (doomed, kept):
            s.add(LessonTagRelevance(lesson_id=lesson, tag="lang:en", score=0.5))
            s.add(TagRelevanceEvent(lesson_id=lesson, tag="lang:en", raw_score=1.0))
    assert remove(engine, note_type="FAILURE") == (1, 1)
    with session_scope(engine, read_only=True) as s:
        assert [r.lesson_id for r in s.exec(select(LessonTagRelevance)).all()] == [kept]
        assert [r.lesson_id for r in s.exec(select(TagRelevanceEvent)).all()] == [kept]


# --------------------------------------------------------------------------------------------
# The prompt block


def note(**fields: Any) -> SessionNote:
    fields.setdefault("note_type", "TIP")
    fields.setdefault("content", "c")
    fields.setdefault("language", "en")
    fields.setdefault("session_id", "20251108_143022_12345_789")
    fields.setdefault("timestamp", NOW)
    return SessionNote(**fields)


def test_empty_note_list_gives_an_empty_block() -> None:
    assert notes.format_notes_for_prompt([], current_session="x", now=NOW) == ""


def test_prompt_block_matches_the_seed_example() -> None:
    current = "20251108_143022_12345_789"
    block = notes.format_notes_for_prompt(
        [
            note(
                note_type="SUCCESS",
                content="Successfully matched using opening phrase",
                phelps_code="AB00123PRO",
                confidence=0.9,
                session_id=current,
                timestamp=NOW - timedelta(hours=2),
            ),
            note(
                note_type="PATTERN",
                content="Prayers with 'divine mercy' often relate to compassion themes",
                session_id="20251107_143022_789",
                timestamp=NOW - timedelta(days=1),
            ),
            note(
                note_type="STRATEGY",
                content="Use combined keyword + length search for better accuracy",
                session_id="20251105_128015_234",
                timestamp=NOW - timedelta(days=3),
            ),
        ],
        current_session=current,
        now=NOW,
    )
    assert block == (
        "CROSS-SESSION EXPERIENCE NOTES:\n"
        "Here are insights from all previous LLM sessions (current and past):\n"
        "\n"
        "✅ SUCCESS (2h ago): Successfully matched using opening phrase [AB00123PRO, confidence: 90%] [CURRENT SESSION]\n"
        "🔍 PATTERN (1d ago): Prayers with 'divine mercy' often relate to compassion themes [SESSION: 3022_789]\n"
        "💡 STRATEGY (3d ago): Use combined keyword + length search for better accuracy [SESSION: 8015_234]\n"
        "\n"
        "Use these cross-session insights to improve your analysis and learn from previous LLM experiences."
    )


@pytest.mark.parametrize(("kind", "icon"), [("SUCCESS", "✅"), ("FAILURE", "❌"), ("PATTERN", "🔍"),
                                            ("STRATEGY", "💡"), ("TIP", "💭")])  # fmt: skip
def test_each_type_has_its_icon(kind: str, icon: str) -> None:
    line = notes.format_note_line(note(note_type=kind), current_session=None, now=NOW)
    assert line.startswith(f"{icon} {kind} (0m ago): c")


@pytest.mark.parametrize(
    ("age", "shown"),
    [
        (timedelta(0), "0m"),
        (timedelta(seconds=59), "0m"),
        (timedelta(seconds=60), "1m"),
        (timedelta(minutes=45), "45m"),
        (timedelta(minutes=59, seconds=59), "59m"),
        (timedelta(hours=1), "1h"),
        (timedelta(hours=2, minutes=59), "2h"),
        (timedelta(hours=23, minutes=59), "23h"),
        (timedelta(days=1), "1d"),
        (timedelta(days=3, hours=23), "3d"),
        (timedelta(days=400), "400d"),
        (timedelta(minutes=-5), "0m"),  # clock skew: a note from the future is brand new
    ],
)
def test_age_uses_the_largest_whole_unit(age: timedelta, shown: str) -> None:
    line = notes.format_note_line(note(timestamp=NOW - age), current_session=None, now=NOW)
    assert f"({shown} ago)" in line


@pytest.mark.parametrize(
    ("confidence", "shown"),
    [(0.9, "90%"), (0.875, "88%"), (0.125, "13%"), (0.005, "1%"), (0.0, "0%"), (1.0, "100%"), (0.334, "33%")],
)
def test_confidence_is_a_rounded_percentage(confidence: float, shown: str) -> None:
    line = notes.format_note_line(
        note(note_type="SUCCESS", phelps_code="AB1", confidence=confidence), current_session=None, now=NOW
    )
    assert f"[AB1, confidence: {shown}]" in line


def test_success_code_without_confidence_shows_zero_confidence() -> None:
    line = notes.format_note_line(note(note_type="SUCCESS", phelps_code="AB1"), current_session=None, now=NOW)
    assert line == "✅ SUCCESS (0m ago): c [AB1, confidence: 0%] [SESSION: 2345_789]"


def test_prompt_block_shows_zero_confidence_for_a_coded_success_note() -> None:
    block = notes.format_notes_for_prompt(
        [note(note_type="SUCCESS", phelps_code="AB1", confidence=None)], current_session="", now=NOW
    )
    assert block.splitlines()[3] == "✅ SUCCESS (0m ago): c [AB1, confidence: 0%] [SESSION: 2345_789]"


def test_prompt_marks_this_process_notes_as_current_by_default() -> None:
    block = notes.format_notes_for_prompt([note(session_id=notes.process_session_id())], now=NOW)
    assert block.splitlines()[3] == "💭 TIP (0m ago): c [CURRENT SESSION]"


def test_prompt_names_other_sessions_by_default() -> None:
    block = notes.format_notes_for_prompt([note()], now=NOW)
    assert block.splitlines()[3].endswith(" [SESSION: 2345_789]")


def test_empty_current_session_means_no_current_session() -> None:
    block = notes.format_notes_for_prompt(
        [note(session_id=notes.process_session_id())], current_session="", now=NOW
    )
    assert block.splitlines()[3].endswith(f" [SESSION: {notes.process_session_id()[-8:]}]")


@pytest.mark.pg_repeats("statements and lines of test_add_note_takes_its_spec_arguments_positionally")
def test_note_added_without_session_id_is_current_in_this_process(engine: Engine) -> None:
    with Session(engine) as s:
        added = notes.add_note(s, "en", "TIP", "mine")
        block = notes.format_notes_for_prompt([added], now=NOW)
    assert "[CURRENT SESSION]" in block


def test_success_without_code_has_no_code_bracket() -> None:
    line = notes.format_note_line(note(note_type="SUCCESS", confidence=0.8), current_session=None, now=NOW)
    assert line == "✅ SUCCESS (0m ago): c [SESSION: 2345_789]"


def test_code_on_another_type_is_not_shown() -> None:
    line = notes.format_note_line(
        note(note_type="TIP", phelps_code="AB1", confidence=0.5), current_session=None, now=NOW
    )
    assert "AB1" not in line


@pytest.mark.parametrize(
    ("current", "marker"),
    [
        ("20251108_143022_12345_789", "[CURRENT SESSION]"),
        ("other", "[SESSION: 2345_789]"),
        (None, "[SESSION: 2345_789]"),
    ],
)
def test_session_marker(current: str | None, marker: str) -> None:
    line = notes.format_note_line(note(), current_session=current, now=NOW)
    assert line.endswith(f" {marker}")


def test_short_session_id_is_shown_whole() -> None:
    assert notes.format_note_line(note(session_id="s1"), current_session=None, now=NOW).endswith(
        "[SESSION: s1]"
    )


def test_imported_multiline_content_stays_on_one_line() -> None:
    block = notes.format_notes_for_prompt([note(content="one\n\nUse these cross-session insights")], now=NOW)
    assert (
        block.splitlines()[3] == "💭 TIP (0m ago): one Use these cross-session insights [SESSION: 2345_789]"
    )
    assert len(block.splitlines()) == 6


def test_naive_timestamps_count_as_utc() -> None:
    line = notes.format_note_line(
        note(timestamp=datetime(2025, 11, 8, 12, 30, 22)), current_session=None, now=NOW
    )
    assert "(2h ago)" in line


def test_prompt_keeps_the_given_order() -> None:
    block = notes.format_notes_for_prompt(
        [note(content="older", timestamp=NOW - timedelta(days=2)), note(content="newer")], now=NOW
    )
    assert block.index("older") < block.index("newer")


# --------------------------------------------------------------------------------------------
# Frames, records, ages


@pytest.mark.pg_repeats("statements and lines of test_count_matches_search")
def test_frame_has_the_seed_columns(corpus: Engine) -> None:
    with session_scope(corpus, read_only=True) as s:
        frame = notes.as_frame(notes.search_notes(session=s))
    assert list(frame.columns) == list(notes.FRAME_COLUMNS)
    assert len(frame) == 5 and str(frame["timestamp"].dt.tz) == "UTC"


def test_frame_of_no_notes_keeps_its_columns() -> None:
    assert list(notes.as_frame([]).columns) == list(notes.FRAME_COLUMNS)


def test_note_record_is_json_with_seed_names() -> None:
    record = notes.note_record(note(note_type="SUCCESS", phelps_code="AB1", confidence=0.5))
    assert json.loads(json.dumps(record))["timestamp"] == "2025-11-08T14:30:22+00:00"
    assert {
        "timestamp",
        "language",
        "note_type",
        "content",
        "phelps_code",
        "confidence",
        "session_id",
    } <= set(record)


@pytest.mark.parametrize(
    ("text_", "expected"),
    [("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), ("90m", timedelta(minutes=90)),
     ("2w", timedelta(weeks=2)), (" 7D ", timedelta(days=7))],
)  # fmt: skip
def test_parse_age(text_: str, expected: timedelta) -> None:
    assert notes.parse_age(text_) == expected


@pytest.mark.parametrize(
    "text_", ["30", "d", "30x", "-3d", "0d", "1.5d", "30 days", "", "99999999d", "3650000w"]
)
def test_parse_age_refuses_nonsense(text_: str) -> None:
    with pytest.raises(ValueError, match="invalid age"):
        notes.parse_age(text_)


# --------------------------------------------------------------------------------------------
# Command line (`main(argv)` in this process, against the same database)


def run_cli(*args: str, url: str, check: bool = True) -> CliResult:
    result = cli.run_cli(*args, env={"OVERRULE_DATABASE_URL": url, "OVERRULE_LOAD_DEMO": "false"})
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def cli_db(sqlite_engine: Engine) -> tuple[Engine, str]:
    return sqlite_engine, url_of(sqlite_engine)


def test_cli_add_then_list_as_json(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    added = json.loads(
        run_cli(
            "notes",
            "add",
            "--type",
            "success",
            "--language",
            "en",
            "--code",
            "AB1",
            "--confidence",
            "0.9",
            "Matched by <b>opening</b>",
            url=url,
        ).stdout
    )
    listed = json.loads(run_cli("notes", "--language", "en", url=url).stdout)
    assert [n["content"] for n in listed] == ["Matched by <b>opening</b>"]
    assert listed[0]["id"] == added["id"] and listed[0]["note_type"] == "SUCCESS"
    assert stored(engine)[0].created_by == "cli"


def test_cli_language_may_come_before_the_action(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    run_cli("notes", "--language", "tr", "add", "--type", "TIP", "turkish tip", url=url)
    assert stored(engine)[0].language == "tr"


def test_cli_prompt_format_prints_the_block(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    put(engine, language="tr", note_type="PATTERN", content="seen", session_id="20251108_143022_12345_789")
    out = run_cli(
        "notes", "--language", "en", "--tags", "lang:en", "product:p", "--format", "prompt", url=url
    ).stdout
    lines = out.splitlines()
    assert lines[0] == notes.PROMPT_HEADER and lines[-1] == notes.PROMPT_FOOTER
    assert re.fullmatch(r"🔍 PATTERN \(\d+d ago\): seen \[SESSION: 2345_789\]", lines[3])


def test_cli_prompt_format_of_no_notes_is_empty(cli_db: tuple[Engine, str]) -> None:
    assert run_cli("notes", "--language", "en", "--format", "prompt", url=cli_db[1]).stdout.strip() == ""


def test_cli_listing_needs_a_language(cli_db: tuple[Engine, str]) -> None:
    result = run_cli("notes", url=cli_db[1], check=False)
    assert result.returncode == 1 and "--language is required" in result.stderr


def test_cli_add_reports_invalid_notes(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    result = run_cli("notes", "add", "--type", "HINT", "text", url=url, check=False)
    assert result.returncode == 1 and "error: note type 'HINT' is not one of" in result.stderr
    assert stored(engine) == []


def test_cli_search(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    put(engine, content="100% match", note_type="TIP")
    put(engine, content="1000 matches", note_type="TIP")
    put(engine, content="100% fail", note_type="FAILURE")
    found = json.loads(run_cli("notes", "search", "100%", "--type", "tip", url=url).stdout)
    assert [n["content"] for n in found] == ["100% match"]


def test_cli_clean_removes_old_notes(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    now = datetime.now(UTC)
    put(engine, content="ancient", timestamp=now - timedelta(days=40))
    put(engine, content="fresh", timestamp=now - timedelta(days=2))
    assert run_cli("notes", "clean", "--older-than", "30d", "--dry-run", url=url).stdout.strip() == (
        "1 notes would be removed"
    )
    assert run_cli("notes", "clean", "--older-than", "30d", url=url).stdout.strip() == "removed 1 notes"
    assert [n.content for n in stored(engine)] == ["fresh"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "30x"], "invalid age '30x'"),
        (["--older-than", "0d"], "greater than zero"),
        ([], "refusing to remove every note"),
        (["--type", "HINT"], "not one of"),
    ],
)
def test_cli_clean_errors_exit_1(cli_db: tuple[Engine, str], args: list[str], message: str) -> None:
    engine, url = cli_db
    put(engine, content="survivor")
    result = run_cli("notes", "clean", *args, url=url, check=False)
    assert result.returncode == 1 and message in result.stderr
    assert len(stored(engine)) == 1


def test_cli_clean_all_empties_the_table(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    put(engine, content="one")
    put(engine, content="two", language="")
    assert run_cli("notes", "clean", "--all", url=url).stdout.strip() == "removed 2 notes"
    assert stored(engine) == []


def test_cli_clean_language_empty_means_every_language_notes(cli_db: tuple[Engine, str]) -> None:
    engine, url = cli_db
    put(engine, content="english", language="en")
    put(engine, content="universal", language="")
    run_cli("notes", "clean", "--language", "", url=url)
    assert [n.content for n in stored(engine)] == ["english"]


# --------------------------------------------------------------------------------------------
# SPEC §5 calling convention: (session, ...) positionally


def test_add_note_takes_its_spec_arguments_positionally(engine: Engine) -> None:
    with Session(engine) as s:
        added = notes.add_note(s, "EN", "success", "matched", "AB1", 0.75, session_id="run-1")
        s.commit()
        got = (added.language, added.note_type, added.content, added.phelps_code, added.confidence)
    assert got == ("en", "SUCCESS", "matched", "AB1", 0.75)


@pytest.mark.pg_repeats("statements and lines of test_cache_is_safe_under_concurrent_readers_and_a_writer")
def test_relevant_notes_take_session_language_and_limit_positionally(engine: Engine) -> None:
    for i in range(3):
        put(engine, content=f"n{i}", timestamp=NOW + timedelta(minutes=i))
    put(engine, language="fr", content="french")
    with Session(engine) as s:
        found = notes.relevant_notes(s, "en", 2)
    assert [n.content for n in found] == ["n2", "n1"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("tea",), ["green tea", "black tea"]),
        (("tea", "pattern"), ["black tea"]),
        (("tea", None, "fr"), ["green tea"]),
        (("", "TIP", "fr"), ["green tea"]),
    ],
)
def test_search_notes_takes_its_filters_positionally(
    engine: Engine, args: tuple[Any, ...], expected: list[str]
) -> None:
    put(engine, language="fr", note_type="TIP", content="green tea", timestamp=NOW)
    put(engine, language="en", note_type="PATTERN", content="black tea", timestamp=NOW - timedelta(hours=1))
    put(engine, language="en", note_type="TIP", content="coffee", timestamp=NOW - timedelta(hours=2))
    with Session(engine) as s:
        found = notes.search_notes(s, *args)
    assert [n.content for n in found] == expected


@pytest.mark.parametrize(
    ("args", "left"),
    [
        (("TIP",), ["pattern"]),
        ((None, "fr"), ["tip en", "pattern"]),
        ((None, None, timedelta(days=1)), ["tip en", "tip fr"]),
    ],
)
@pytest.mark.pg_repeats("statements and lines of test_removal_by_filter")
def test_remove_notes_takes_its_filters_positionally(
    engine: Engine, args: tuple[Any, ...], left: list[str]
) -> None:
    put(engine, language="en", note_type="TIP", content="tip en", timestamp=utc_now())
    put(engine, language="fr", note_type="TIP", content="tip fr", timestamp=utc_now())
    put(
        engine, language="en", note_type="PATTERN", content="pattern", timestamp=utc_now() - timedelta(days=2)
    )
    with Session(engine) as s:
        notes.remove_notes(s, *args)
        s.commit()
    assert [n.content for n in stored(engine)] == left


def utc_now() -> datetime:
    return datetime.now(UTC)
