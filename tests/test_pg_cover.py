"""The cheap half of the PostgreSQL-variant policy (docs/development.md, "PostgreSQL variants").

`scripts/pg_cover.py check FILE` proves a file's `pg_repeats` marks by running its PostgreSQL
variants (too costly for every run). What can be checked without a database is checked here on
every run: the statement normalizer folds values and nothing else, every mark gives its reason, and
no test named for dialect behaviour is marked.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.pg_cover import normalize

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from pg_cover import DIALECT_WORDS  # noqa: E402


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("SELECT a FROM t WHERE id = %(id_1)s LIMIT %(param_1)s", "SELECT a FROM t WHERE id = %(id_2)s LIMIT 5"),
        ("SELECT a FROM t WHERE b IN (%(b_1_1)s, %(b_1_2)s)", "SELECT a FROM t WHERE b IN (%(b_1_1)s)"),
        ("INSERT INTO t (a, b) VALUES (%(a_m0)s, %(b_m0)s), (%(a_m1)s, %(b_m1)s)",
         "INSERT INTO t (a, b) VALUES (%(a_m0)s, %(b_m0)s)"),
        ("SAVEPOINT sa_savepoint_1", "SAVEPOINT sa_savepoint_12"),
        ("SELECT p0::INTEGER FROM (VALUES (%(x)s::INTEGER, 0))", "SELECT p0::INTEGER FROM (VALUES (%(x)s::INTEGER, 1))"),
        ("SELECT 'it''s'  AS x", "SELECT 'other' AS x"),
        ("UPDATE t SET a=%(a)s::TIMESTAMP WITH TIME ZONE WHERE t.id = 1", "UPDATE t SET a=%(b)s WHERE t.id = 2"),
    ],
)  # fmt: skip
def test_statements_that_differ_only_in_values_have_one_shape(one: str, other: str) -> None:
    assert normalize(one) == normalize(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("SELECT a FROM t WHERE b = %(b)s", "SELECT a FROM t WHERE b ILIKE %(b)s"),
        ("SELECT a FROM t ORDER BY a", "SELECT a FROM t ORDER BY a DESC"),
        ("SELECT a FROM t1", "SELECT a FROM t2"),
        ("SELECT a FROM t WHERE b IS NULL", "SELECT a FROM t WHERE b IS NOT NULL"),
        ("UPDATE t SET a=%(a)s::INTEGER WHERE t.id = 1", "UPDATE t SET a=%(a)s::INTEGER WHERE u.id = 1"),
    ],
)
def test_statements_that_differ_in_shape_stay_apart(one: str, other: str) -> None:
    assert normalize(one) != normalize(other)


def _pg_repeats_calls(node: ast.AST) -> list[ast.Call]:
    return [
        n for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pg_repeats"
    ]  # fmt: skip


def _marks() -> list[tuple[str, str, ast.Call]]:
    """(file, test function, mark) for every pg_repeats mark in the tests, module-wide ones per test."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        named = {}  # module-level names bound to a mark (`pytestmark = ...`, `REPEATS = ...`)
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and _pg_repeats_calls(stmt.value):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        named[target.id] = _pg_repeats_calls(stmt.value)
        functions = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
        ]
        for function in functions:
            calls = [c for d in function.decorator_list for c in _pg_repeats_calls(d)]
            names = {n.id for d in function.decorator_list for n in ast.walk(d) if isinstance(n, ast.Name)}
            calls += [c for name in names & set(named) for c in named[name]]
            calls += named.get("pytestmark", [])
            found += [(path.relative_to(ROOT).as_posix(), function.name, call) for call in calls]
    return found


def test_every_pg_repeats_mark_says_why_and_none_is_on_a_dialect_test() -> None:
    marks = _marks()
    for file, name, call in marks:
        reason = call.args[0] if call.args else None
        assert isinstance(reason, ast.Constant) and str(reason.value).strip(), f"{file}::{name}: no reason"
        word = DIALECT_WORDS.search(name)
        assert word is None, (
            f"{file}::{name} is about dialect behaviour ({word.group(0)!r}): keep it on PostgreSQL"
        )
