"""Database setup: migrations, pragmas, concurrency, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlmodel import Session, SQLModel, select

from lib.db import alembic_config, init_db, normalize_url, session_scope
from lib.models import ChatMessage, EvaluationSnapshot, Judgment, compute_was_corrected, utcnow
from lib.search import is_search_index_object


def include_object(_object, name, _type, _reflected, _compare_to) -> bool:  # type: ignore[no-untyped-def]
    # The search index's objects are one dialect's (FTS5 tables, trigram indexes, SQLite's list
    # index with the text), on both sides of the comparison: include_name sees only the database's.
    return not is_search_index_object(name)


def test_migrated_schema_matches_models(engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": include_object})
        diff = compare_metadata(ctx, SQLModel.metadata)
    assert diff == []


def test_init_db_is_idempotent(db_url) -> None:
    first = init_db(db_url)
    first.dispose()
    again = init_db(db_url)
    with again.connect() as conn:
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    again.dispose()
    assert version == ScriptDirectory.from_config(alembic_config()).get_current_head()


@pytest.mark.parametrize(
    ("table", "index"),
    [
        ("session_notes", "idx_language"),
        ("session_notes", "idx_type"),
        ("session_notes", "idx_timestamp"),
        ("session_notes", "idx_session"),
        ("chat_messages", "ix_chat_snapshot_created"),
        ("judgments", "ix_judgment_history"),
        ("judgments", "ix_judgment_history_metric"),
    ],
)
def test_seed_indexes_exist(engine, table: str, index: str) -> None:
    names = {ix["name"] for ix in inspect(engine).get_indexes(table)}
    assert index in names


def test_tag_relevance_primary_key_is_lesson_and_tag(engine) -> None:
    pk = inspect(engine).get_pk_constraint("lesson_tag_relevance")
    assert pk["constrained_columns"] == ["lesson_id", "tag"]


def test_chat_message_turn_uniqueness_is_enforced(engine) -> None:
    with session_scope(engine) as s:
        s.add(EvaluationSnapshot(id="snap_1", question="q", model_answer="a", product="p"))
    with session_scope(engine) as s:
        s.add(ChatMessage(id="m1", client_message_id="c1", snapshot_id="snap_1", role="user", content="hi"))
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError), session_scope(engine) as s:
        s.add(
            ChatMessage(id="m2", client_message_id="c1", snapshot_id="snap_1", role="user", content="again")
        )


def test_sqlite_pragmas_are_set(sqlite_engine) -> None:
    with sqlite_engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000


def test_timestamps_round_trip_as_aware_utc(engine) -> None:
    moment = utcnow()
    with session_scope(engine) as s:
        s.add(Judgment(change_id="c", product="p", decision="4", timestamp=moment))
    with session_scope(engine, read_only=True) as s:
        stored = s.exec(select(Judgment)).one().timestamp
    assert stored.tzinfo is not None
    assert abs((stored - moment).total_seconds()) < 0.001


def test_concurrent_read_then_write_transactions_never_lock(engine) -> None:
    """Twenty threads each read a counter and write it back; none fails, none is lost."""
    with session_scope(engine) as s:
        s.add(Judgment(change_id="counter", product="p", decision="0"))
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(5):
                with session_scope(engine) as s:
                    j = s.exec(
                        select(Judgment).where(Judgment.change_id == "counter").with_for_update()
                    ).one()
                    j.version += 1
                    s.add(j)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=bump) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Session(engine) as s:
        assert s.exec(select(Judgment.version)).one() == 1 + 20 * 5


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("postgres://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_normalize_url_routes_postgres_to_psycopg(url: str, expected: str) -> None:
    assert normalize_url(url) == expected


@pytest.mark.parametrize(
    ("decision", "user_decision", "expected"),
    [("4", None, False), ("4", "4", False), ("4", "2", True), ("INCLUDE", "EXCLUDE", True)],
)
def test_was_corrected_rule(decision: str, user_decision: str | None, expected: bool) -> None:
    assert compute_was_corrected(decision, user_decision) is expected


def test_was_corrected_is_computed_on_every_orm_write(engine) -> None:
    with session_scope(engine) as s:
        s.add(Judgment(change_id="c1", product="p", decision="INCLUDE", user_decision="EXCLUDE"))
    with session_scope(engine) as s:
        j = s.exec(select(Judgment)).one()
        assert j.was_corrected is True
        j.user_decision = "INCLUDE"
        s.add(j)
    with Session(engine) as s:
        assert s.exec(select(Judgment.was_corrected)).one() is False


def test_naive_datetimes_are_stored_as_utc(engine) -> None:
    from datetime import datetime

    with session_scope(engine) as s:
        s.add(Judgment(change_id="c2", product="p", decision="4", timestamp=datetime(2024, 1, 1, 12)))
    with Session(engine) as s:
        stored = s.exec(select(Judgment.timestamp)).one()
    assert stored.isoformat() == "2024-01-01T12:00:00+00:00"
