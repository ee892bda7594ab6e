"""Statements built once per dialect and run many times with their values as parameters.

Building a SQLAlchemy statement (coercing every column, operator and literal, then its cache key)
costs more than running it when the statement is a counter upsert over a few rows: 1-3 CPU ms to
build one of `lib.counters`' statements against about 0.2 ms to run it, and the flush hooks,
a review and a queue label each run five to twenty of them. SQLAlchemy caches the compiled SQL,
not the Python construct, so the counters keep the construct here and pass the values each time.

`Among` is a condition on a set of ids (`column IN (...)`), stated once as a template with an
expanding parameter: statements built from it are kept per template (`run`), while a condition
given as a plain SQL expression is built into a new statement as before. Either way the SQL sent
is the same (SQLAlchemy expands an IN list into parameters in both).

Statements that need no template (the review UPDATE in lib.corrections, the queue's locks and
candidate reads in lib.queues) are kept by `built` directly, under a key naming them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam

from lib.bulk import dialect_name, dialect_of

_BUILT: dict[tuple[Hashable, ...], Any] = {}


def update_returning(bind: Any) -> bool:
    """Whether `bind`'s database answers UPDATE … RETURNING (SQLite before 3.35 does not).

    The writes that read back what they wrote (a review's row, whether a review moved its
    evaluation between counters) ask here, and without it write, then read in the same transaction.
    """
    return bool(dialect_of(bind).update_returning)


def built(bind: Any, key: tuple[Hashable, ...], build: Callable[[], Any]) -> Any:
    """The statement `build()` makes, built once per dialect (of `bind`: a Session or Connection)
    and `key` (constant SQL, no data: everything that varies between runs is a parameter, or part
    of `key`)."""
    full = (dialect_name(bind), *key)
    stmt = _BUILT.get(full)
    if stmt is None:
        stmt = _BUILT[full] = build()
    return stmt


@dataclass(frozen=True)
class Among:
    """`where` (a template whose ids are expanding parameters) with the ids it is run with."""

    shape: Hashable  # names the template: statements built from it are kept under it
    where: Any
    params: dict[str, Any]


def bind_ids(shape: Hashable, where: Any, **ids: Collection[Any]) -> Among:
    """A condition from a template (`template` below) and the ids for each of its parameters.

    (Not `lib.bulk.among`, which builds a new condition binding its ids as one array or JSON
    parameter; this one keeps the template and passes the ids when a statement built from it runs.)
    """
    return Among(shape, where, {name: sorted(values) for name, values in ids.items()})


def derived(where: Any, tag: Hashable, make: Callable[[Any], Any]) -> Any:
    """`make(where)`: for an `Among`, another template (same ids) kept under its own shape."""
    if isinstance(where, Among):
        return Among((tag, where.shape), make(where.where), where.params)
    return make(where)


def template(column: Any, name: str) -> Any:
    """`column IN (:name)`, the list given when the statement runs."""
    return column.in_(bindparam(name, expanding=True))


def run(session: Any, where: Any, key: tuple[Hashable, ...], build: Callable[[Any], Any]) -> Any:
    """Execute `build(where)`: kept per template and `key` when `where` is an `Among`."""
    if isinstance(where, Among):
        stmt = built(session, (*key, where.shape), lambda: build(where.where))
        return session.execute(stmt, where.params)
    return session.execute(build(where))


def run_all(session: Any, where: Any, key: tuple[Hashable, ...], build: Callable[[Any], list[Any]]) -> None:
    """Execute each statement of `build(where)` in order, as `run` does one."""
    if isinstance(where, Among):
        stmts = built(session, (*key, where.shape), lambda: build(where.where))
        for stmt in stmts:
            session.execute(stmt, where.params)
        return
    for stmt in build(where):
        session.execute(stmt)
