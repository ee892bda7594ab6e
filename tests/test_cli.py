"""The command line as a whole: every command documented (docs/cli.md), clean errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from lib.__main__ import build_parser
from tests.cli import run_cli, run_cli_process

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _commands())
def test_every_command_is_documented_on_the_command_line_page(command: str) -> None:
    assert f"python -m lib {command}" in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [("nonsense://x", "Can't load plugin"), ("postgresql://u:p@127.0.0.1:1/x", "Connection refused")],
)
def test_a_bad_database_url_is_a_one_line_error(url: str, fragment: str) -> None:
    done = run_cli("demo", env={"OVERRULE_DATABASE_URL": url})
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "check OVERRULE_DATABASE_URL" in done.stderr and fragment in done.stderr


@pytest.mark.slow  # a new interpreter importing the whole stack
def test_python_dash_m_lib_runs_main_and_exits_with_its_status() -> None:
    """The entry point itself, as a real process: `main`'s status becomes the exit code, errors go to stderr."""
    done = run_cli_process("demo", env={"OVERRULE_DATABASE_URL": "nonsense://x"})
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("error: cannot use the database (") and "Traceback" not in done.stderr
