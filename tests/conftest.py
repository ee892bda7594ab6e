"""Shared fixtures: real databases (a SQLite file per test; PostgreSQL when available), settings
isolation, and Streamlit cache clearing.

PostgreSQL: `OVERRULE_TEST_PG_URL` is an admin URL (see scripts/start-postgres.sh). Each worker
claims a migrated database from a pool kept on the server between runs (see `PgDatabase`) and
empties it (DELETE) before each test, plus one for module-scoped data (`pg_module_url`); no test
creates or drops a database. SQLite tests get
a copy of a migrated file. Both make a test's database cost milliseconds. Under CI (`CI=true`) a
missing server is an error, not a skip, so the PostgreSQL runs can never silently vanish.
"""

from __future__ import annotations

import fcntl
import gc
import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, SQLModel

import lib.models  # noqa: F401  (every table on SQLModel.metadata, for TRUNCATE)
from lib import bulk
from lib.config import reset_settings
from lib.db import create_db_engine, init_db
from lib.isolated import TRUST_EXTENSIONS_VAR
from tests import compiled_cache, pg_sessions

# Engines configured alike share compiled SQL, as the app's one engine reuses its own (a new engine
# per test otherwise compiles every statement again): see tests/compiled_cache.py.
compiled_cache.install()
# And PostgreSQL server sessions: a connection an engine closes is kept, reset, for the next engine
# to the same database instead of a new server process each time (tests/pg_sessions.py).
pg_sessions.install()

# Garbage collection. Collecting the tests imports Streamlit, pandas, SQLAlchemy, openai and every
# test module: millions of objects that live as long as the process, and every full collection
# walked all of them again (7% of a worker's CPU time; 1 CPU s of its 7 s of collecting). So none
# runs while the tests are collected; then what exists is frozen (gc.freeze: never walked again)
# and the youngest generation is collected every 7,000 allocations instead of 700.
gc.disable()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        gc.enable()  # the xdist controller: its workers collect the tests, it does not


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()
    bulk.HEAP_FROZEN_ELSEWHERE = True  # imports' own freeze (lib.bulk.frozen_heap) would undo this one
    gc.set_threshold(7_000, 10, 10)
    gc.enable()


# Hypothesis: no per-example deadline. A deadline is a wall-clock assertion: on a shared or loaded
# machine it fails a correct example at random (FlakyFailure: "took 375 ms, which exceeded the
# deadline of 200 ms, but on a subsequent run it took 18 ms"). Example counts stay as each test sets
# them: all property tests together cost about 2% of the suite's CPU time.
# And the same examples every run (derandomize: drawn from a hash of each test): with a random seed a
# fresh clone tried examples no run had tried, so a run could fail where the one before, on the same
# code, passed. To look for new examples, `pytest --hypothesis-profile=explore` (docs/development.md).
settings.register_profile("overrule", deadline=None, derandomize=True)
settings.register_profile("explore", deadline=None)
settings.load_profile("overrule")

# DuckDB checks a scanner extension's signature on every LOAD, hashing the whole 35-42 MB file:
# 0.15-0.2 CPU s per DuckDB connection, thousands of times per run, in this process, in the DuckDB
# child processes and in the app servers the tests start (they all inherit the environment).
# The suite trusts the pip-installed files; test_scanner_loads_from_the_package_without_install
# loads them as deployed, signature checked.
os.environ[TRUST_EXTENSIONS_VAR] = "1"
KEPT_VARIABLES = {"OVERRULE_TEST_PG_URL", TRUST_EXTENSIONS_VAR}

PG_ADMIN_URL = os.environ.get("OVERRULE_TEST_PG_URL", "")
PG_POOL_PREFIX = "overrule_test_"
PG_POOL_LOCK = 7_140_513  # advisory-lock class of the test database pool (any constant of its own)
ROOT = Path(__file__).resolve().parent.parent


def _pg_admin_engine() -> Engine:
    url = PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    return create_engine(url, isolation_level="AUTOCOMMIT")


def _pg_url_for(dbname: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{dbname}"


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The admin URL of the PostgreSQL test server; skips PostgreSQL tests without one (fails under CI)."""
    if not PG_ADMIN_URL:
        if os.environ.get("CI"):
            pytest.fail("CI=true but OVERRULE_TEST_PG_URL is not set: PostgreSQL tests cannot run")
        pytest.skip("no PostgreSQL server (set OVERRULE_TEST_PG_URL, see scripts/start-postgres.sh)")
    return PG_ADMIN_URL


def _schema_fingerprint() -> str:
    """A hash of every migration file: a kept test database is reused only while this is unchanged."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "migrations").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return f"overrule test database, migrations {digest.hexdigest()[:16]}"


class PgDatabase:
    """A migrated PostgreSQL test database held by this process, emptied in milliseconds before use.

    The databases are a pool kept on the server between runs (`overrule_test_0`, `_1`, ...): a
    process claims a free one with an advisory lock held for its session, so parallel runs and
    xdist workers never share one, and nothing is dropped at the end. CREATE and DROP DATABASE each
    cost the whole server a checkpoint (tens of seconds when other runs share it); a kept database
    costs nothing. It is rebuilt when the migrations changed (their hash is the database's comment).
    """

    def __init__(self) -> None:
        fingerprint = _schema_fingerprint()
        self._admin = _pg_admin_engine()
        self._lock = self._admin.connect()  # the advisory lock lasts as long as this connection
        kept = {
            int(name.removeprefix(PG_POOL_PREFIX)): comment
            for name, comment in self._lock.execute(
                text(
                    "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database "
                    "WHERE starts_with(datname, :prefix)"
                ),
                {"prefix": PG_POOL_PREFIX},
            )
            if name.removeprefix(PG_POOL_PREFIX).isdigit()
        }
        # Up-to-date databases first, then outdated ones (rebuilt), then new ones.
        candidates = itertools.chain(
            sorted(kept, key=lambda i: (kept[i] != fingerprint, i)),
            (i for i in itertools.count() if i not in kept),
        )
        index = next(
            i
            for i in candidates
            if self._lock.execute(
                text("SELECT pg_try_advisory_lock(:pool, :index)"), {"pool": PG_POOL_LOCK, "index": i}
            ).scalar()
        )
        self.name = f"{PG_POOL_PREFIX}{index}"
        self.url = _pg_url_for(self.name)
        if kept.get(index) != fingerprint:
            self._lock.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
            self._lock.execute(text(f'CREATE DATABASE "{self.name}"'))
            init_db(self.url).dispose()
            self._lock.execute(text(f"COMMENT ON DATABASE \"{self.name}\" IS '{fingerprint}'"))
        self.engine = create_engine(
            self.url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT"
        )
        with self.engine.connect() as conn:
            sequences = conn.execute(
                text("SELECT schemaname, sequencename FROM pg_sequences WHERE schemaname = current_schema()")
            ).all()
        # Children before parents; then every sequence back to 1 (what TRUNCATE ... RESTART IDENTITY
        # would do, without its file rewrites). In replica mode the foreign keys' triggers do not
        # fire: every table ends empty, so no reference can dangle, and a DELETE after a test that
        # wrote 13,000 judgments no longer checks five referencing tables per row (66,000 queries).
        deletes = [f'DELETE FROM "{t.name}"' for t in reversed(SQLModel.metadata.sorted_tables)]
        restarts = [f'SELECT setval(\'"{schema}"."{seq}"\', 1, false)' for schema, seq in sequences]
        replica = "SET LOCAL session_replication_role = replica"
        self._reset_sql = "; ".join(["BEGIN", replica, *deletes, *restarts, "COMMIT"])

    def empty(self) -> None:
        """Delete every row and restart every sequence.

        DELETE, not TRUNCATE: on tables this small TRUNCATE costs 50-500 ms (it creates new files
        and waits for their fsync), DELETE about 5 ms. `synchronous_commit = off` skips the WAL
        flush wait; a crash of the test server cannot matter.
        """
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SET lock_timeout = '3s'; SET synchronous_commit = off")
            try:
                conn.exec_driver_sql(self._reset_sql)
            except OperationalError:
                # A previous test left a connection inside a transaction: end it, then empty.
                conn.exec_driver_sql("ROLLBACK")
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
                conn.exec_driver_sql(self._reset_sql)

    def copy_rows_from(self, source: PgDatabase) -> None:
        """Every row of `source` (a database of the same migrations) into this one, which must be
        empty, and each sequence where `source` has it: the same database, row for row. Binary COPY
        per table in one transaction, foreign-key triggers off as in `empty` (generated columns are
        computed again)."""
        with source.engine.connect() as src_conn, self.engine.connect() as dst_conn:
            src, dst = src_conn.connection.driver_connection, dst_conn.connection.driver_connection
            with dst.transaction():
                dst.execute("SET LOCAL session_replication_role = replica")
                for table in SQLModel.metadata.sorted_tables:
                    names = [
                        row[0]
                        for row in src.execute(
                            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                            "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                            (f'"{table.name}"',),
                        )
                    ]
                    columns = ", ".join(f'"{name}"' for name in names)
                    copy_out = f'COPY (SELECT {columns} FROM "{table.name}") TO STDOUT (FORMAT binary)'
                    copy_in = f'COPY "{table.name}" ({columns}) FROM STDIN (FORMAT binary)'
                    with src.cursor().copy(copy_out) as out, dst.cursor().copy(copy_in) as into:
                        for data in out:
                            into.write(data)
                for schema, sequence in src.execute(
                    "SELECT schemaname, sequencename FROM pg_sequences WHERE schemaname = current_schema()"
                ).fetchall():
                    name = f'"{schema}"."{sequence}"'
                    last, called = src.execute(f"SELECT last_value, is_called FROM {name}").fetchone()
                    dst.execute("SELECT setval(%s, %s, %s)", (name, last, called))

    def release(self) -> None:
        """Hand the database back to the pool (its rows stay until the next user empties it)."""
        self.engine.dispose()
        self._lock.close()
        self._admin.dispose()  # closes the connection, which releases the advisory lock


@pytest.fixture(scope="session")
def _sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, built once per worker; tests get copies (4 ms instead of a migration)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    init_db(f"sqlite:///{path}").dispose()
    return path


@dataclass(frozen=True)
class DemoTemplate:
    """A SQLite file holding the demo exactly as a first `load_demo` left it, and what that load returned."""

    path: Path
    reported: dict[str, int]

    def copy_to(self, target: Path) -> str:
        """A private copy at `target` (no engine may hold it open); returns its URL."""
        shutil.copyfile(self.path, target)
        return f"sqlite:///{target}"


def _run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that every xdist worker shares (the parent of the workers' own folders)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def sqlite_demo(tmp_path_factory: pytest.TempPathFactory, _sqlite_migrated: Path) -> DemoTemplate:
    """The demo loaded once per run into a SQLite file, for tests that only read a loaded demo.

    A whole load costs about 5 CPU s; the first worker to ask builds it under a file lock, the
    others wait and copy it. Tests of the load itself (idempotence, partial databases, the CLI, two
    fresh loads equal) load into databases of their own.
    """
    from lib.demo import load_demo

    folder = _run_root(tmp_path_factory) / "sqlite-demo"
    folder.mkdir(exist_ok=True)
    path, counts = folder / "demo.db", folder / "reported.json"
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not counts.exists():
            building = folder / "building.db"
            shutil.copyfile(_sqlite_migrated, building)
            engine = create_db_engine(f"sqlite:///{building}")
            try:
                reported = load_demo(engine=engine)
            finally:
                engine.dispose()
            building.replace(path)
            counts.write_text(json.dumps(reported), encoding="utf-8")  # last: the template is complete
    return DemoTemplate(path, json.loads(counts.read_text(encoding="utf-8")))


@pytest.fixture(scope="session")
def _sqlite_filled(
    tmp_path_factory: pytest.TempPathFactory, _sqlite_migrated: Path
) -> Callable[[Callable[[Engine], object]], Path]:
    """SQLite files filled once per worker, one per fill function (see `fill_database`)."""
    made: dict[Callable[[Engine], object], Path] = {}

    def template(fill: Callable[[Engine], object]) -> Path:
        if fill not in made:
            path = tmp_path_factory.mktemp("filled") / "filled.db"
            shutil.copyfile(_sqlite_migrated, path)
            engine = create_db_engine(f"sqlite:///{path}")
            try:
                fill(engine)
            finally:
                engine.dispose()  # the last connection checkpoints the WAL into the file
            made[fill] = path
        return made[fill]

    return template


@pytest.fixture(scope="session")
def _pg_filled(pg_server: str) -> Iterator[Callable[[Callable[[Engine], object]], PgDatabase]]:
    """A PostgreSQL database of this worker holding what a fill function wrote (see `fill_database`):
    the last one asked for, filled again when another is."""
    database = PgDatabase()
    holds: list[Callable[[Engine], object]] = []

    def template(fill: Callable[[Engine], object]) -> PgDatabase:
        if holds != [fill]:
            database.empty()
            holds.clear()
            engine = create_db_engine(database.url)
            try:
                fill(engine)
            finally:
                engine.dispose()
            holds.append(fill)
        return database

    yield template
    database.release()


def fill_database(request: pytest.FixtureRequest, engine: Engine, fill: Callable[[Engine], object]) -> Engine:
    """What `fill(engine)`, a deterministic fill through the write paths, leaves in `engine`'s empty
    database, as a copy of a database `fill` filled once per worker: a copied file on SQLite (a
    millisecond instead of a fill), the rows copied by COPY on PostgreSQL (`PgDatabase.copy_rows_from`,
    tens of milliseconds). The rows and the counts the fill maintained are the same, the fill being
    deterministic; it still runs once per worker and backend. Nothing may have connected to a SQLite
    `engine`'s database yet."""
    if engine.dialect.name == "sqlite":
        shutil.copyfile(request.getfixturevalue("_sqlite_filled")(fill), str(engine.url.database))
        return engine
    for kept in ("_pg_worker_database", "_pg_module_database"):
        database: PgDatabase = request.getfixturevalue(kept)
        if engine.url.database == database.name:
            database.copy_rows_from(request.getfixturevalue("_pg_filled")(fill))
            return engine
    fill(engine)  # a database of its own
    return engine


@pytest.fixture(scope="session")
def _pg_worker_database(pg_server: str) -> Iterator[PgDatabase]:
    """The database of this worker's function-scoped PostgreSQL tests (`db_url`), emptied before each."""
    database = PgDatabase()
    yield database
    database.release()


@pytest.fixture(scope="session")
def _pg_module_database(pg_server: str) -> Iterator[PgDatabase]:
    """A second database for module-scoped data (`pg_module_url`), beside the per-test one."""
    database = PgDatabase()
    yield database
    database.release()


@pytest.fixture(scope="module")
def pg_module_url(_pg_module_database: PgDatabase) -> str:
    """An empty migrated PostgreSQL database that a module's tests share (for module-scoped fixtures)."""
    _pg_module_database.empty()
    return _pg_module_database.url


def module_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """For a module-scoped fixture parametrized over "sqlite"/"postgresql": an empty migrated database
    its module's tests share (a copy of the SQLite template, or `pg_module_url`)."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "overrule.db"
        shutil.copyfile(request.getfixturevalue("_sqlite_migrated"), path)
        return f"sqlite:///{path}"
    return str(request.getfixturevalue("pg_module_url"))


# For tests of refusals that happen before any write (validation, parsing): the database only
# proves nothing was written, which one backend shows as well as two. Overrides `db_url`'s params.
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _runs_on_postgresql(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "postgresql" in callspec.params.values()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the PostgreSQL variant of tests marked `pg_repeats` (their SQLite variant runs).

    `@pytest.mark.pg_repeats("why")` on a test, a `pytest.param` case or a module (`pytestmark`)
    says: this variant sends PostgreSQL only statement shapes, and runs only lib lines, that the
    kept PostgreSQL tests of the file already do, and its point is not dialect behaviour.
    `scripts/pg_cover.py check FILE` proves it (docs/development.md, "PostgreSQL variants"); it sets
    OVERRULE_PG_COVER, under which every variant runs.
    """
    dropped = []
    for item in items:
        mark = item.get_closest_marker("pg_repeats")
        if mark is None:
            continue
        if not (mark.args and str(mark.args[0]).strip()):
            raise pytest.UsageError(f"{item.nodeid}: pg_repeats needs a reason (which kept test covers it)")
        if _runs_on_postgresql(item) and not os.environ.get("OVERRULE_PG_COVER"):
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database: a SQLite file, then PostgreSQL (the same tests on both)."""
    if request.param == "sqlite":
        target = tmp_path / "overrule.db"
        shutil.copyfile(request.getfixturevalue("_sqlite_migrated"), target)
        yield f"sqlite:///{target}"
        return
    database = request.getfixturevalue("_pg_worker_database")
    database.empty()
    yield database.url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file URL, for tests (such as page tests) that only need one backend."""
    return f"sqlite:///{tmp_path / 'overrule.db'}"


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A migrated engine on each backend (the database is a migrated copy: no Alembic run per test)."""
    eng = create_db_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sqlite_engine(sqlite_url: str, _sqlite_migrated: Path) -> Iterator[Engine]:
    """A migrated SQLite engine only (a copy of the template; at `sqlite_url`)."""
    shutil.copyfile(_sqlite_migrated, sqlite_url.split("///", 1)[1])
    eng = create_db_engine(sqlite_url)
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
        if var.startswith("OVERRULE_") and var not in KEPT_VARIABLES:
            monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OVERRULE_DATABASE_URL", f"sqlite:///{tmp_path / 'app.db'}")
    monkeypatch.setenv("OVERRULE_LOAD_DEMO", "false")
    # OTLP refusals' audit rows are limited a token and hour, process-wide: each test an hour of its own.
    from lib import auth, otlp_waiting

    monkeypatch.setattr(otlp_waiting, "_refused_rate", auth.AuditRate(otlp_waiting.REFUSED_PER_HOUR, 3600))
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
    from lib.scripted_llm import start_llm_server

    server = start_llm_server()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OVERRULE_LLM_TIMEOUT", "5")
    monkeypatch.setenv("OVERRULE_LLM_MAX_RETRIES", "1")
    reset_settings()
    yield server
    server.stop()
    # What lib.llm negotiated (JSON mode, tools) is keyed by URL; a later server may get this port.
    from lib import llm

    llm.close_clients()
    reset_settings()
