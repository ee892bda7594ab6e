"""`python -m lib ...` for tests: in this process (`run_cli`) or as a real one (`run_cli_process`).

A subprocess spends about a second importing SQLAlchemy, Alembic and pandas before it does
anything; the commands' own behaviour (arguments, exit status, stdout, stderr, the database they
write) is the same in-process. A real process is for what only another process shows: the entry
point itself (`tests/test_cli.py`) and state one process cannot see another change (caches).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Mapping
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

import lib.__main__ as cli
from lib.config import reset_settings

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CliResult:
    """What a finished command left: the fields of `subprocess.CompletedProcess` tests read."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> CliResult:
    """Run `python -m lib *args` with `env` added to the environment; return status and output.

    Settings are re-read from the environment before and after, and every engine the command
    opened is disposed, so no connection outlives the command (as when its process exits).
    """
    out, err = io.StringIO(), io.StringIO()
    engines: list[Engine] = []
    open_engine = cli._engine

    def _tracked_engine() -> Engine:
        engine = open_engine()
        engines.append(engine)
        return engine

    with pytest.MonkeyPatch.context() as mp:
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        mp.setattr(cli, "_engine", _tracked_engine)
        reset_settings()
        try:
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    status = cli.main(list(args))
                except SystemExit as exc:  # argparse: usage errors exit 2, --help exits 0
                    status = exc.code if isinstance(exc.code, int) else 1
        finally:
            for engine in engines:
                engine.dispose()
            reset_settings()
    return CliResult(status, out.getvalue(), err.getvalue())


def run_cli_process(*args: str, env: Mapping[str, str] | None = None) -> CliResult:
    """Run `python -m lib *args` as a new process, with `env` added to this one's environment."""
    done = subprocess.run(
        [sys.executable, "-m", "lib", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)
