"""Shared fixtures: real databases (a SQLite file per test; PostgreSQL when available), settings
isolation, and Streamlit cache clearing.

PostgreSQL: `OVERRULE_TEST_PG_URL` is an admin URL (see scripts/start-postgres.sh). A template is
migrated once per worker; each worker clones it once and every test starts from it emptied by
TRUNCATE. SQLite tests get a copy of a migrated file. Both make a test's database cost milliseconds. Under CI (`CI=true`) a
missing server is an error, not a skip, so the PostgreSQL runs can never silently vanish.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, SQLModel

import lib.models  # noqa: F401  (every table on SQLModel.metadata, for TRUNCATE)
from lib.config import reset_settings
from lib.db import init_db

PG_ADMIN_URL = os.environ.get("OVERRULE_TEST_PG_URL", "")
# Per process, so concurrent test runs on one server never drop each other's template.
PG_TEMPLATE = f"overrule_test_template_{os.getpid()}"
ROOT = Path(__file__).resolve().parent.parent


def _pg_admin_engine() -> Engine:
    url = PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    return create_engine(url, isolation_level="AUTOCOMMIT")


def _pg_url_for(dbname: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{dbname}"


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database, built once per test run."""
    if not PG_ADMIN_URL:
        if os.environ.get("CI"):
            pytest.fail("CI=true but OVERRULE_TEST_PG_URL is not set: PostgreSQL tests cannot run")
        pytest.skip("no PostgreSQL server (set OVERRULE_TEST_PG_URL, see scripts/start-postgres.sh)")
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{PG_TEMPLATE}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{PG_TEMPLATE}"'))
    engine = init_db(_pg_url_for(PG_TEMPLATE))
    engine.dispose()
    yield PG_TEMPLATE
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{PG_TEMPLATE}" WITH (FORCE)'))
    admin.dispose()


def _fresh_pg_database(template: str) -> tuple[str, str]:
    name = f"overrule_t_{secrets.token_hex(6)}"
    with _pg_admin_engine().connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    return name, _pg_url_for(name)


def _drop_pg_database(name: str) -> None:
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def _sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, built once per worker; tests get copies (4 ms instead of a migration)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    init_db(f"sqlite:///{path}").dispose()
    return path


@pytest.fixture(scope="session")
def _pg_worker_database(pg_template: str) -> Iterator[str]:
    """One PostgreSQL database per worker process, emptied before each test that uses it."""
    name = f"overrule_w_{os.getpid()}"
    with _pg_admin_engine().connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    yield _pg_url_for(name)
    _drop_pg_database(name)


def _empty_pg_database(url: str) -> None:
    """TRUNCATE every table (identities restarted): a clean database in milliseconds, not a new one."""
    tables = ", ".join(f'"{t.name}"' for t in SQLModel.metadata.sorted_tables)
    eng = create_engine(
        url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT"
    )
    try:
        with eng.connect() as conn:
            conn.execute(text("SET lock_timeout = '3s'"))
            try:
                conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
            except OperationalError:
                # A previous test left a connection inside a transaction: end it, then truncate.
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
                conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    finally:
        eng.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database: a SQLite file, then PostgreSQL (the same tests on both)."""
    if request.param == "sqlite":
        target = tmp_path / "overrule.db"
        shutil.copyfile(request.getfixturevalue("_sqlite_migrated"), target)
        yield f"sqlite:///{target}"
        return
    url = request.getfixturevalue("_pg_worker_database")
    _empty_pg_database(url)
    yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file URL, for tests (such as page tests) that only need one backend."""
    return f"sqlite:///{tmp_path / 'overrule.db'}"


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A migrated engine on each backend."""
    eng = init_db(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sqlite_engine(sqlite_url: str, _sqlite_migrated: Path) -> Iterator[Engine]:
    """A migrated SQLite engine only (a copy of the template; at `sqlite_url`)."""
    shutil.copyfile(_sqlite_migrated, sqlite_url.split("///", 1)[1])
    eng = init_db(sqlite_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test starts from the defaults: no LLM, no demo autoload, a private database file."""
    for var in list(os.environ):
        if var.startswith("OVERRULE_") and var != "OVERRULE_TEST_PG_URL":
            monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OVERRULE_DATABASE_URL", f"sqlite:///{tmp_path / 'app.db'}")
    monkeypatch.setenv("OVERRULE_LOAD_DEMO", "false")
    reset_settings()
    _clear_streamlit_caches()
    yield
    reset_settings()
    _clear_streamlit_caches()


def _clear_streamlit_caches() -> None:
    try:
        import streamlit as st
    except ImportError:  # pragma: no cover - streamlit is a runtime dependency
        return
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def llm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The local OpenAI-compatible server, with the app's settings pointed at it."""
    from tests.llm_server import start_llm_server

    server = start_llm_server()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OVERRULE_LLM_TIMEOUT", "5")
    monkeypatch.setenv("OVERRULE_LLM_MAX_RETRIES", "1")
    reset_settings()
    yield server
    server.stop()
    reset_settings()
