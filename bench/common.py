"""What every bench script shares: sizes on the command line, throw-away and cached databases, and an
API served on a loopback port. One home, so that a bench measures its own subject and not a private
variant of the set-up (a bench that builds its database differently measures something else).
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


# ---------------------------------------------------------------------------------------------
# Sizes


def parse_size(text: str) -> int:
    """`1k` → 1000, `100k` → 100000, `1m` → 1000000, `2500` → 2500."""
    text = text.strip().lower().replace("_", "").replace(",", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = float(number) * scale
    except ValueError:
        value = 0.5  # refused below, with the message that says what a size looks like
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use 1k, 100k, 1m or an integer)")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes, smallest first (the ratio's denominator)."""
    return sorted({parse_size(part) for part in text.split(",") if part.strip()})


def label(size: int) -> str:
    """1000 → 1k, 1000000 → 1M."""
    if size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    if size % 1_000 == 0:
        return f"{size // 1_000}k"
    return str(size)


# ---------------------------------------------------------------------------------------------
# Throw-away databases


def fresh_sqlite_url(path: Path) -> str:
    """The URL of an empty SQLite file at `path`: what an earlier (perhaps interrupted) run left there,
    its WAL and shared-memory files included, is removed first."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def _admin(admin_url: str) -> Any:
    from sqlalchemy import create_engine

    from lib.db import normalize_url

    return create_engine(normalize_url(admin_url), isolation_level="AUTOCOMMIT")


def fresh_pg_database(admin_url: str, name: str) -> str:
    """The URL of an empty PostgreSQL database `name` on the server of `admin_url` (dropped first if
    an earlier run left it)."""
    from sqlalchemy import text

    admin = _admin(admin_url)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return f"{admin_url.rpartition('/')[0]}/{name}"


def drop_pg_database(admin_url: str, name: str) -> None:
    """Drop a database that `fresh_pg_database` made (connections still open to it are ended)."""
    from sqlalchemy import text

    admin = _admin(admin_url)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# ---------------------------------------------------------------------------------------------
# Databases that bench/gen.py fills, cached between runs


def schema_tag() -> str:
    """Alembic head + generator version: a database built for another schema or generator is not reused."""
    from alembic.script import ScriptDirectory

    from bench import gen
    from lib.db import alembic_config

    heads = sorted(ScriptDirectory.from_config(alembic_config()).get_heads())
    return f"{'-'.join(h[:8] for h in heads)}_g{gen.GEN_VERSION}"


def sqlite_database(db_dir: Path, evaluations: int, *, build: bool) -> str:
    """URL of the SQLite benchmark database of this size, built with gen.py when missing."""
    from bench import gen

    path = db_dir / f"pages_{label(evaluations)}_{schema_tag()}.db"
    if not path.exists():
        if not build:
            raise SystemExit(f"{path} does not exist (drop --no-build to build it)")
        db_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        print(f"building {path} ({evaluations:,} evaluations) …", flush=True)
        if gen.main(["--evaluations", str(evaluations), "--db", str(partial), "--force"]) != 0:
            raise SystemExit(f"gen.py failed for {partial}")
        for suffix in ("-wal", "-shm"):
            Path(f"{partial}{suffix}").unlink(missing_ok=True)
        partial.rename(path)
    return f"sqlite:///{path}"


def pg_database(admin_url: str, evaluations: int, *, build: bool) -> str:
    """URL of the PostgreSQL benchmark database of this size, built with gen.py when missing."""
    from sqlalchemy import text

    from bench import gen

    name = f"overrule_pages_{label(evaluations).lower()}_{schema_tag().replace('-', '_')}"
    base = admin_url.rpartition("/")[0]
    admin = _admin(admin_url)
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
            if exists is None:
                if not build:
                    raise SystemExit(f"PostgreSQL database {name} does not exist (drop --no-build)")
                partial = f"{name}_partial"
                conn.execute(text(f'DROP DATABASE IF EXISTS "{partial}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{partial}"'))
                print(f"building PostgreSQL {name} ({evaluations:,} evaluations) …", flush=True)
                if gen.main(["--evaluations", str(evaluations), "--url", f"{base}/{partial}"]) != 0:
                    raise SystemExit(f"gen.py failed for {partial}")
                conn.execute(text(f'ALTER DATABASE "{partial}" RENAME TO "{name}"'))
    finally:
        admin.dispose()
    return f"{base}/{name}"


# ---------------------------------------------------------------------------------------------
# PostgreSQL server CPU


def backend_cpu(database: str) -> dict[int, float]:
    """{pid: CPU seconds} of the PostgreSQL server processes serving `database` (their process title
    names it: "postgres: 15/main: USER DATABASE HOST(PORT) state")."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    title = fh.read().decode(errors="replace").split()
            except OSError:
                continue
            if len(title) >= 4 and title[0] == "postgres:" and title[3] == database:
                pids.append(int(entry))
    return cpu_of(pids)


def cpu_of(pids: list[int]) -> dict[int, float]:
    """{pid: CPU seconds} of those of `pids` still alive: the scheduler's nanosecond count
    (/proc/PID/schedstat) where the kernel keeps one, else utime + stime in clock ticks (10 ms: too
    coarse for one query of a few ms)."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as fh:
                found[pid] = int(fh.read().split()[0]) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


# ---------------------------------------------------------------------------------------------
# Serving


def serve_asgi(app: Any) -> tuple[str, Any, threading.Thread]:
    """Serve an ASGI app under uvicorn on a free loopback port, in a daemon thread, as the app's own
    server would (HTTP, not an in-process transport). Returns its base URL, the server (set
    `should_exit` to stop it) and the thread."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start on port {port}")
        threading.Event().wait(0.01)
    return f"http://127.0.0.1:{port}", server, thread
