"""Imports in lib run one way (STYLE.md): no module imports one that imports it back, however far round.

The graph is read from the source with `ast`, so it counts every import a module makes: at the top,
inside a function (a lazy import is still a dependency, it only hides the cycle until run time), or
under `if TYPE_CHECKING:`. Issue 25 found two cycles (`metrics → models → scores → metrics` and
`notes ↔ relevance`); this test keeps any new one from landing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "lib"


def module_name(path: Path) -> str:
    """`lib/ui/server.py` -> `lib.ui.server`; a package's `__init__.py` is the package itself."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lib_modules(root: Path = LIB) -> dict[str, Path]:
    """Every module under `root`, by dotted name."""
    return {module_name(p): p for p in sorted(root.rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the file at `path` imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import lib.a.b` imports lib, lib.a and lib.a.b; the deepest known one is the edge.
                parts = alias.name.split(".")
                for n in range(len(parts), 0, -1):
                    if ".".join(parts[:n]) in known:
                        found.add(".".join(parts[:n]))
                        break
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:  # `from lib import notes`: the module lib.notes
                    found.add(f"{base}.{alias.name}")
                elif base in known:  # `from lib.notes import add_note`: the module lib.notes
                    found.add(base)
    found.discard(name)
    return found


def import_graph(root: Path = LIB) -> dict[str, set[str]]:
    """Module -> the modules under `root` it imports."""
    modules = lib_modules(root)
    known = set(modules)
    return {name: imported_modules(path, known) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan), each written as a path back to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group (for the message)."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(group)} is not a cycle")  # pragma: no cover


def test_lib_has_no_import_cycles() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles in lib (move the shared piece down into its own module): " + "; ".join(
        " → ".join(c) for c in cycles
    )


def test_the_graph_sees_the_imports_lib_makes() -> None:
    """The checker is only as good as its graph: it must see top-level, relative and lazy imports."""
    graph = import_graph()
    assert "lib.models" in graph["lib.metrics"]  # from lib.models import MetricDefinition
    assert "lib.llm" in graph["lib.judge"]  # from lib import llm
    assert "lib.counters" in graph["lib.db"]  # import lib.counters
    assert "lib.precedent_view" in graph["lib.export"]  # a function-level `from lib import precedent_view`


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        # a → b → c → a, through each import form the graph reads
        (
            {
                "a.py": "from pkg.b import thing\n",
                "b.py": "def f():\n    from pkg import c\n",
                "c.py": "import pkg.a\n",
            },
            ["pkg.a", "pkg.b", "pkg.c", "pkg.a"],
        ),
        ({"a.py": "from . import b\n", "b.py": "from .a import x\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
                "b.py": "from pkg.a import A\n",
            },
            ["pkg.a", "pkg.b", "pkg.a"],
        ),
        ({"a.py": "from pkg import b\n", "b.py": "import os\n"}, None),
    ],
)
def test_a_cycle_is_found_whatever_the_import_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], cycle: list[str] | None
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in files.items():
        (package / name).write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    cycles = import_cycles(import_graph(package))
    assert cycles == ([] if cycle is None else [cycle])
