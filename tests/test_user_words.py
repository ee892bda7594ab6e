"""No words from our design documents in what users read (issue 25 point 15).

The seeds' names for things ("seed 004", "the seed-004 JSON cache", "Stage 1/2", `phelps_code`)
belong in code comments and the developer docs; users read "judgment cache (JSON)", "the judge's
scores", "mentor feedback", "code". This scans the text the app can show or print:

- every string literal of the pages, `app.py` and `lib/ui` (what Streamlit draws);
- every string literal of `lib` (messages, labels, CLI help, errors that reach a page or the
  terminal), except the instructions written for the LLM (`*_SYSTEM` / `*_PROMPT` constants: the
  model's words, not the user's).

Docstrings and identifier-like strings (column names, widget keys, JSON field names such as the
import format's `phelps_code`) are code, not text, and are left out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JARGON = re.compile(
    r"\bseeds?[\s_-]*\d{3}\b"  # seed 004, seed-004, seeds 000
    r"|\bthe seed(?:'s|s)?\b(?! (?:of|for|value|number))"  # "the seed's rule" (not a sampling seed)
    r"|\bstage[\s_-]*[12]\b"  # the judge's Stage 1 / Stage 2
    r"|\bphelps\b|phelps_code"  # seed 000's name for a note's code
    r"|\bAD-\d+\b",  # seed 002's architecture decisions
    re.IGNORECASE,
)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")
LLM_TEXT = re.compile(r".*(_SYSTEM|PROMPT.*)")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _llm_text_nodes(tree: ast.Module) -> set[int]:
    """String nodes inside module-level constants written for the LLM (STAGE1_SYSTEM, ...)."""
    found = set()
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and LLM_TEXT.fullmatch(t.id) for t in targets):
            found |= {id(n) for n in ast.walk(node)}
    return found


def shown_strings(path: Path, *, skip_llm_text: bool) -> Iterator[tuple[int, str]]:
    """(line, text) of each string literal in `path` a user could read."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _docstring_nodes(tree) | (_llm_text_nodes(tree) if skip_llm_text else set())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skipped
            and not IDENTIFIER.fullmatch(node.value)
        ):
            yield node.lineno, node.value


def _jargon_in(paths: list[Path], *, skip_llm_text: bool) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line}: {JARGON.search(text).group(0)!r} in {text[:90]!r}"  # type: ignore[union-attr]
        for path in paths
        for line, text in shown_strings(path, skip_llm_text=skip_llm_text)
        if JARGON.search(text)
    ]


UI_FILES = sorted([*(ROOT / "pages").glob("*.py"), *(ROOT / "lib" / "ui").glob("*.py"), ROOT / "app.py"])
LIB_FILES = sorted(p for p in (ROOT / "lib").rglob("*.py") if "ui" not in p.relative_to(ROOT / "lib").parts)


def test_pages_and_ui_text_use_the_users_words() -> None:
    assert _jargon_in(UI_FILES, skip_llm_text=False) == []


def test_messages_labels_and_cli_help_from_lib_use_the_users_words() -> None:
    assert _jargon_in(LIB_FILES, skip_llm_text=True) == []


@pytest.mark.parametrize(
    "text",
    [
        "Seed-004 cache file (JSON)",
        "the seed 004 history",
        "(Stage 1, with evidence), then compares (Stage 2)",
        "`timestamp, language, note_type, content, phelps_code, confidence`",
        "Phelps code",
        "the seed's rule",
        "label protocol (AD-2)",
    ],
)
def test_the_scan_catches_each_kind_of_design_word(text: str) -> None:
    assert JARGON.search(text)


@pytest.mark.parametrize(
    "text",
    ["Seed", "Sampling seed (same seed, same sample)", "the judge's scores", "mentor feedback", "Code",
     "judgment cache (JSON)", "the seed of the sampler"],
)  # fmt: skip
def test_the_scan_leaves_ordinary_words_alone(text: str) -> None:
    assert not JARGON.search(text)


def test_identifiers_and_docstrings_are_not_text(tmp_path: Path) -> None:
    source = tmp_path / "page.py"
    source.write_text(
        '"""Seed 004 rules (a docstring)."""\n'
        'COLUMNS = ["phelps_code", "stage1"]\n'
        'STAGE1_SYSTEM = "You are a judge (Stage 1)."\n'
        'LABEL = "Stage 1 failed"\n'
    )
    assert [text for _, text in shown_strings(source, skip_llm_text=True)] == ["Stage 1 failed"]
