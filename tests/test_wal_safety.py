"""The app's SQLite WAL survives other processes (issue #17, point 1), in real processes.

POSIX advisory locks belong to a process and a file: if a second SQLite library inside the app's
process (DuckDB's sqlite scanner) opened and closed the database file, the app's own connections
lost their locks, and the next other process to close the database (a CLI `notes add`) deleted the
`-wal`/`-shm` files the app still used: later writes vanished and the file could become malformed.

Here process A is the "app": a long-lived Python process holding pooled connections that has read
the database through every DuckDB path (analytics and exports). Process B runs the CLI and exits.
Then A writes, and a third process must see the write, with the WAL still in place and
`PRAGMA integrity_check` ok.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine

ROOT = Path(__file__).resolve().parent.parent

# The "app": reads like the Analytics page and the export buttons do, then obeys commands on stdin.
_APP = """
import sys
from pathlib import Path
from sqlalchemy import text
from lib import analytics
from lib.db import create_db_engine, session_scope
from lib.export import export_table
from lib.notes import add_note

engine = create_db_engine(sys.argv[1])
out = Path(sys.argv[2])
held = engine.connect()  # a connection the app keeps, as the pool does between reruns
held.execute(text("SELECT count(*) FROM session_notes")).scalar_one()
held.commit()
with session_scope(engine, read_only=True) as session:
    analytics.load_filter_options(session=session)
    analytics.load_report(session=session, filters=analytics.AnalyticsFilters())
export_table(engine=engine, table="judgments", fmt="json", out=out / "j.json")  # the cache writer
export_table(engine=engine, table="evaluations", fmt="csv", out=out / "e.csv")  # the COPY writer
with session_scope(engine) as session:
    add_note(session, content="written by the app before the CLI ran", note_type="TIP", language="en")
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "write":
        with session_scope(engine) as session:
            add_note(session, content="written by the app after the CLI ran", note_type="TIP", language="en")
        print("written", flush=True)
    elif line.strip() == "quit":
        break
held.close()
"""


def _deleted_wal_handles(pid: int, db_path: Path) -> list[str]:
    """The app's open handles on the database's -wal/-shm files that were unlinked under it."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(db_path)) and target.endswith("(deleted)"):
            found.append(target)
    return found


def _readline(proc: subprocess.Popen[str]) -> str:
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"the app process died: {err}")
    return line.strip()


def test_cli_process_does_not_delete_the_wal_of_an_app_that_used_duckdb(
    sqlite_engine: Engine, sqlite_url: str, tmp_path: Path
) -> None:
    db_path = Path(sqlite_engine.url.database or "")
    db_url = sqlite_url
    sqlite_engine.dispose()  # this test process must hold no lock: only the app's locks may protect the WAL
    env = {**os.environ, "OVERRULE_DATABASE_URL": db_url}
    app = subprocess.Popen(
        [sys.executable, "-c", _APP, db_url, str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _readline(app) == "ready"
        assert Path(f"{db_path}-wal").exists()

        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "lib",
                "notes",
                "add",
                "--type",
                "TIP",
                "--language",
                "en",
                "from the CLI",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr

        assert _deleted_wal_handles(app.pid, db_path) == []
        assert Path(f"{db_path}-wal").exists()
        assert Path(f"{db_path}-shm").exists()

        assert app.stdin is not None
        app.stdin.write("write\n")
        app.stdin.flush()
        assert _readline(app) == "written"

        # A third process sees every acknowledged write, and the file is sound.
        third = sqlite3.connect(db_path)
        try:
            contents = {row[0] for row in third.execute("SELECT content FROM session_notes")}
            assert third.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            third.close()
        assert contents == {
            "written by the app before the CLI ran",
            "from the CLI",
            "written by the app after the CLI ran",
        }
        app.stdin.write("quit\n")
        app.stdin.flush()
        assert app.wait(timeout=60) == 0
    finally:
        if app.poll() is None:
            app.kill()
            app.communicate(timeout=30)
