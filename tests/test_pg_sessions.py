"""tests/pg_sessions.py: a kept PostgreSQL session comes back as a new connection would start."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from lib.db import create_db_engine
from tests import pg_sessions
from tests.conftest import PgDatabase


@pytest.fixture
def database(_pg_worker_database: PgDatabase) -> PgDatabase:
    _pg_worker_database.empty()
    return _pg_worker_database


def test_a_closed_session_is_reused_as_a_new_one_starts(database: PgDatabase) -> None:
    first = create_db_engine(database.url)
    with first.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        conn.exec_driver_sql("SET lock_timeout = '7s'")
        conn.execute(text("SELECT pg_advisory_lock(4242)"))
        conn.exec_driver_sql("CREATE TEMP TABLE scratch (x int)")
        conn.exec_driver_sql("LISTEN overrule_test")
        for _ in range(6):  # past psycopg's prepare threshold: prepared on the server
            conn.execute(text("SELECT count(*) FROM evaluation_snapshots")).scalar()
        conn.commit()
        raw = conn.connection.driver_connection
        assert isinstance(raw, pg_sessions.KeptConnection) and raw._prepared._names
    first.dispose()  # the session goes back to the idle list instead of ending

    second = create_db_engine(database.url)
    try:
        with second.connect() as conn:
            raw = conn.connection.driver_connection
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar() == pid  # no new server process
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "0"
            assert (
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                    )
                ).scalar()
                == 0
            )
            assert conn.execute(text("SELECT to_regclass('pg_temp.scratch')")).scalar() is None
            assert conn.execute(text("SELECT count(*) FROM pg_listening_channels()")).scalar() == 0
            assert conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar() == 0
            assert not raw._prepared._names and raw.autocommit is False
            conn.rollback()
    finally:
        second.dispose()


def test_a_session_the_server_ended_is_not_handed_out(database: PgDatabase) -> None:
    engine = create_db_engine(database.url)
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
    engine.dispose()  # kept, idle
    with psycopg.connect(database.url, autocommit=True) as admin:  # an option it does not keep: plain
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    engine = create_db_engine(database.url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar() != pid
    finally:
        engine.dispose()
