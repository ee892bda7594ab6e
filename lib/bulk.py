"""Bulk writes for large loads (imports, benchmark databases): tuples, COPY, indexes built after.

Why not `conn.execute(insert(table), dicts)`: at millions of rows SQLAlchemy's per-row work (dict
keys, bind processing, `insertmanyvalues` batching) costs more than the database's own insert.
Here rows are plain tuples in a fixed column order, converted by the column types' own bind
processors (so a value is stored exactly as SQLAlchemy would store it) and handed to the driver:
`executemany` on SQLite, `COPY … FROM STDIN` on PostgreSQL.

Index upkeep dominates a large insert into an indexed table (each row touches every index at a
random place). `deferred_indexes` drops a table's non-unique secondary indexes, lets the caller
load, and builds them again from the stored definitions (one sorted pass each), all inside the
caller's transaction: a failure rolls the drop back with the rows. Unique indexes and the ones
backing constraints stay, since the load itself relies on them (duplicate checks, lookups).
On PostgreSQL only a caller that owns the database defers them (`worth_deferring`).
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from typing import Any

from sqlalchemy import (
    ARRAY,
    Connection,
    Dialect,
    Enum,
    String,
    Table,
    TypeDecorator,
    any_,
    bindparam,
    func,
    literal_column,
    select,
    text,
    tuple_,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

COPY_ROWS = 20_000
SQLITE_ROWS = 5_000
# Below this many new rows (or new rows under half the table) indexes are kept: rebuilding a large
# table's indexes costs more than maintaining them for a small load.
DEFER_MIN_ROWS = 50_000


_frozen_lock = threading.Lock()
_loads: dict[int, int] = {}  # thread id -> how deep that thread's loads are inside `frozen_heap` now
_freezer: int | None = None  # the thread whose load froze the heap (and unfreezes it), if any
# Set by a process that freezes its heap itself and keeps it frozen (the test suite's conftest):
# `frozen_heap` then leaves the heap alone, as its unfreeze would undo that freeze too (also one
# made while a load is inside). A flag, not `gc.get_freeze_count()`: that walks the frozen objects
# (28 ms for 220,000).
HEAP_FROZEN_ELSEWHERE = False
# While a load runs in a heap frozen elsewhere, full collections wait (`frozen_heap`): the oldest
# generation's threshold is set this high, and the thresholds it had are kept here until the load
# that raised it leaves.
HELD_OFF_THRESHOLD = 1_000_000_000
_held: tuple[int, int, int] | None = None
# ...for at most this long: past it, the next young collection puts the thresholds back, so a long
# import, or loads back to back, cannot keep every thread's cyclic garbage that reached the oldest
# generation for as long as they last (review6 R3). A 10,000-span OTLP request takes ~2 s.
HOLD_SECONDS = 5.0
_held_since = 0.0


def _end_a_long_hold(phase: str, _info: dict[str, Any]) -> None:
    """A `gc.callbacks` entry while a load holds full collections off: the hold ends past
    HOLD_SECONDS. No lock: a collection may start in a thread that holds `_frozen_lock`."""
    global _held
    held = _held
    if phase == "start" and held is not None and time.monotonic() - _held_since > HOLD_SECONDS:
        _held = None
        gc.set_threshold(*held)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside the block, garbage collections leave out the objects that were alive when it began.

    Why: a bulk load (an import, an OTLP request) keeps tens of thousands of its own objects alive
    until it commits, and once enough of them have survived two young collections CPython runs a
    full collection, which walks every object of the process: the app's modules, caches and
    sessions (~200,000 objects) on each pass. Frozen (`gc.freeze`), those are skipped; what the
    load makes inside the block is collected as usual, so its cyclic garbage still goes. A load
    that enters again, nested, freezes what it has built since (its decoded or planned input, alive
    until written). Frozen objects are still freed when their last reference goes; only cyclic
    garbage among them waits, for the first full collection after the block (`gc.unfreeze` hands
    them back to the oldest generation).

    The freeze is process-wide (every thread's objects), so it is bounded to one load: a load
    freezes only when no other thread's load is inside, and the heap is unfrozen when the load
    that froze it leaves its outermost block, whoever else is inside then. Loads that overlap skip
    the freeze (their collections walk the heap, as without this block) rather than keep every
    request's cyclic garbage for as long as the overlap lasts (the freeze used to be undone only
    once no load was inside, which an OTLP receiver under steady load may never reach).

    A heap someone else keeps frozen (`HEAP_FROZEN_ELSEWHERE`: the app's server freezes what it
    imported at start, `lib.ui.server.freeze_imported_heap`; the test suite's conftest) is left
    frozen as it is: freezing the load's input too could not be undone without undoing that freeze.
    There the load holds off full collections instead, bounded the same way (the load alone inside
    sets the oldest generation's threshold out of reach and puts it back when it leaves, or after
    HOLD_SECONDS, whichever comes first): each one
    would walk the load's own objects, a 10,000-span OTLP request's ~100,000 of them four times
    over (0.19 CPU s measured), while what it finds is alive until the load commits. Young
    collections go on, so the load's short-lived cycles are still collected; the full collection
    that the load's survivors are owed runs once it has left, when they are garbage.
    """
    global _freezer, _held, _held_since
    me = threading.get_ident()
    with _frozen_lock:
        depth = _loads.get(me, 0) + 1
        _loads[me] = depth
        if len(_loads) == 1 and _freezer in (None, me):
            if not HEAP_FROZEN_ELSEWHERE:
                gc.freeze()
            elif _freezer is None:
                _held, _held_since = gc.get_threshold(), time.monotonic()
                gc.set_threshold(_held[0], _held[1], HELD_OFF_THRESHOLD)
                gc.callbacks.append(_end_a_long_hold)
            _freezer = me
    try:
        yield
    finally:
        with _frozen_lock:
            if depth == 1:
                del _loads[me]
            else:
                _loads[me] = depth - 1
            if depth == 1 and _freezer == me:
                _freezer = None
                if _end_a_long_hold in gc.callbacks:
                    gc.callbacks.remove(_end_a_long_hold)
                held, _held = _held, None
                if held is not None:
                    gc.set_threshold(*held)
                elif not HEAP_FROZEN_ELSEWHERE:  # frozen for good by its owner while this load ran
                    gc.unfreeze()


def dialect_of(bind: Any) -> Any:
    """The SQLAlchemy dialect of `bind` (a Session, Connection or Engine)."""
    return bind.get_bind().dialect if hasattr(bind, "get_bind") else bind.dialect


def kept_on(dialect: Any, name: str) -> dict[Any, Any]:
    """The dict `dialect` keeps under attribute `name`, made empty the first time: a memo of one
    engine (each engine has its own dialect object: its JSON serializer, its database's collation),
    gone with it (`row_binder`'s binders, lib.counters' metric-set spellings)."""
    kept = dialect.__dict__.get(name)
    if kept is None:
        kept = dialect.__dict__[name] = {}
    return kept


def dialect_name(bind: Any) -> str:
    """The dialect name of `bind` (a Session, Connection or Engine): "sqlite" or "postgresql"."""
    return str(dialect_of(bind).name)


def among(bind: Any, column: Any, values: Collection[Any]) -> ColumnElement[bool]:
    """`column IN (values)` with the values as one bound parameter: a JSON array read through
    `json_each` on SQLite, an array compared with `= ANY` on PostgreSQL. Both read the column's index.

    Why not `column.in_(values)`: SQLAlchemy renders an expanding IN list value by value at every
    execution and binds one parameter per value; an import's batch of 512 evaluations ran ten such
    statements (its counters), and rendering them cost more than the indexed reads themselves.
    """
    return _among(bind, column, bindparam(None, among_value(bind, values), type_=_among_type(bind, column)))


def among_rows(bind: Any, columns: Sequence[Any], rows: Collection[Sequence[Any]]) -> ColumnElement[bool]:
    """`(columns…) IN (rows)` with the rows as bound values of fixed number, whatever the rows':
    one JSON array of rows read through `json_each` on SQLite, one array per column `unnest`ed on
    PostgreSQL.

    Why not `tuple_(…).in_(rows)`: that binds one parameter per value (so a caller must split the
    rows to stay under the databases' limits), SQLAlchemy renders it value by value, and
    PostgreSQL tests a row-value IN list one row at a time: the Judge versions timeline's 543
    combinations against 93k count rows took 1.5 s there, against 33 ms as a (hashed) subquery. SQLite
    reads either form into one temporary index (44 ms both ways).

    Keys are JSON scalars (text, numbers, None; SQLite serialises them, so a date is refused
    there), each compared as its column's type on both dialects: 1 for a text column finds "1".
    """
    if dialect_name(bind) == "postgresql":
        arrays = [
            bindparam(None, [row[i] for row in rows], type_=_array_type(column))
            for i, column in enumerate(columns)
        ]
        return tuple_(*columns).in_(select(literal_column("*")).select_from(func.unnest(*arrays)))
    param = bindparam(None, json.dumps([list(row) for row in rows]), type_=String())
    items = [func.json_extract(literal_column("value"), f"$[{i}]") for i in range(len(columns))]
    return tuple_(*columns).in_(select(*items).select_from(func.json_each(param)))


def among_template(bind: Any, column: Any, name: str) -> ColumnElement[bool]:
    """`among` with its values left to a parameter `name` (given as `among_value` when it runs):
    a statement built from it once can run for every batch (lib.prepared)."""
    return _among(bind, column, bindparam(name, type_=_among_type(bind, column)))


def among_value(bind: Any, values: Collection[Any]) -> Any:
    """The parameter value `among` binds: a list (PostgreSQL) or its JSON text (SQLite)."""
    return list(values) if dialect_name(bind) == "postgresql" else json.dumps(list(values))


def _among_type(bind: Any, column: Any) -> Any:
    return _array_type(column) if dialect_name(bind) == "postgresql" else String()


def _array_type(column: Any) -> Any:
    """The PostgreSQL array type `among` and `among_rows` bind a column's values as: the column's type,
    a text column's without its length. `::VARCHAR(200)[]` truncates a longer value silently, so a key
    longer than the column matched the stored value it begins with (review8 F2); SQLite and a plain
    IN list match nothing."""
    kind = column.type
    base = kind.impl_instance if isinstance(kind, TypeDecorator) else kind  # SQLModel's AutoString
    if isinstance(base, String) and not isinstance(base, Enum) and base.length is not None:
        kind = String(collation=base.collation)
    return ARRAY(kind)


def _among(bind: Any, column: Any, param: Any) -> ColumnElement[bool]:
    if dialect_name(bind) == "postgresql":
        return column == any_(param)
    return column.in_(select(literal_column("value")).select_from(func.json_each(param)))


def dialect_insert(bind: Any, model: Any) -> Any:
    """INSERT with ON CONFLICT support (`on_conflict_do_nothing`/`_do_update`) for the dialect of
    `bind` (a Session or Connection on SQLite or PostgreSQL)."""
    name = dialect_name(bind)
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - Overrule supports these two
        raise RuntimeError(f"unsupported database dialect {name!r}")
    return insert(model)


def insert_tuples(
    conn: Connection,
    table: Table,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    encoded: Collection[str] = (),
) -> int:
    """Insert `rows` (tuples of Python values in `columns` order) into `table`; returns the count.

    Columns named in `encoded` already hold their stored form (e.g. JSON serialized once by the
    importer) and are passed through unconverted. Columns left out get their model's scalar
    default, as a Core `insert()` would give them. A refused row raises SQLAlchemy's
    `IntegrityError` (or other `DBAPIError`), as `conn.execute` would.
    """
    dialect = conn.dialect
    names, convert = row_binder(dialect, table, columns, encoded=encoded)
    if dialect.name == "postgresql":
        sql = f'COPY "{table.name}" ({_names(names)}) FROM STDIN'
    else:
        sql = f'INSERT INTO "{table.name}" ({_names(names)}) VALUES ({", ".join("?" * len(names))})'
    total = 0
    iterator = iter(rows)
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        if dialect.name == "postgresql":
            with cursor.copy(sql) as copy:
                while batch := list(islice(iterator, COPY_ROWS)):
                    for row in convert(batch):
                        copy.write_row(row)
                    total += len(batch)
        else:
            while batch := list(islice(iterator, SQLITE_ROWS)):
                cursor.executemany(sql, convert(batch))
                total += len(batch)
    except dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(sql, None, exc, dialect.loaded_dbapi.Error) from exc
    finally:
        cursor.close()
    return total


def held_values(conn: Connection, column: Any, values: Sequence[Any], *, slice_size: int = 500) -> set[Any]:
    """Which of `values` the table's `column` already holds: indexed `IN` lookups in slices, sent
    to the driver as they are. Why not `select(column).where(column.in_(values))`: SQLAlchemy
    renders an expanding IN list value by value, which costs more than the indexed lookup itself
    (an import checks three such lists per chunk of rows)."""
    dialect = conn.dialect
    mark = "%s" if dialect.name == "postgresql" else "?"
    process = column.type.dialect_impl(dialect).bind_processor(dialect)
    found: set[Any] = set()
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        for i in range(0, len(values), slice_size):
            part = list(values[i : i + slice_size])
            if process is not None:
                part = [process(value) for value in part]
            sql = (
                f'SELECT "{column.name}" FROM "{column.table.name}" '
                f'WHERE "{column.name}" IN ({", ".join([mark] * len(part))})'
            )
            cursor.execute(sql, part)
            found.update(row[0] for row in cursor.fetchall())
    except dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(sql, None, exc, dialect.loaded_dbapi.Error) from exc
    finally:
        cursor.close()
    return found


def row_binder(
    dialect: Dialect, table: Table, columns: Sequence[str], *, encoded: Collection[str] = ()
) -> tuple[list[str], Callable[[list[Sequence[Any]]], Iterable[Sequence[Any]]]]:
    """(stored column names, batch converter): `insert_tuples`' binding of rows, for a caller that
    binds elsewhere (e.g. in worker processes) and inserts the result with `encoded` = every name.

    The names are `columns` plus the omitted columns with a scalar default; the converter turns a
    batch of tuples in `columns` order into rows of values as the driver receives them.

    Made once per dialect (engine) and (table, columns, encoded): finding each column's default and
    bind processor cost 20-30 us a table, a tenth of an OTLP request's one-row insert (issue 29).
    """
    key = (table, tuple(columns), frozenset(encoded))
    kept = kept_on(dialect, _BINDERS)  # per dialect instance (an engine's: its own JSON serializer)
    found = kept.get(key)
    if found is None:
        found = kept[key] = _row_binder(dialect, table, columns, encoded)
    return list(found[0]), found[1]


_BINDERS = "_overrule_row_binders"  # the dialect's attribute holding its binders: gone with it


def _row_binder(
    dialect: Dialect, table: Table, columns: Sequence[str], encoded: Collection[str]
) -> tuple[list[str], Callable[[list[Sequence[Any]]], Iterable[Sequence[Any]]]]:
    defaults = _omitted_defaults(table, columns)
    names = [*columns, *defaults]
    processors: list[Callable[[Any], Any] | None] = [
        None if name in encoded else table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
        for name in names
    ]
    return names, _converter(processors, tuple(defaults.values()))


def _names(columns: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in columns)


def _omitted_defaults(table: Table, columns: Sequence[str]) -> dict[str, Any]:
    """Scalar Python-side defaults of the columns a load leaves out (a Core insert applies them)."""
    given = set(columns)
    defaults: dict[str, Any] = {}
    for column in table.columns:
        if column.name in given or column.default is None:
            continue
        if not column.default.is_scalar:
            raise ValueError(f"{table.name}.{column.name} has a computed default: pass its values")
        defaults[column.name] = column.default.arg
    return defaults


def _converter(
    processors: Sequence[Callable[[Any], Any] | None], extra: tuple[Any, ...] = ()
) -> Callable[[list[Sequence[Any]]], Iterable[Sequence[Any]]]:
    """Rows → rows (plus `extra` values) with each value bound as its column type binds it."""
    active = [(i, p) for i, p in enumerate(processors) if p is not None]
    if not active:
        return (lambda batch: [(*row, *extra) for row in batch]) if extra else (lambda batch: batch)

    def convert(batch: list[Sequence[Any]]) -> Iterator[Sequence[Any]]:
        for row in batch:
            values = [*row, *extra]
            for i, process in active:
                value = values[i]
                if value is not None:
                    values[i] = process(value)
            yield values

    return convert


def worth_deferring(conn: Connection, table: Table, new_rows: int, *, exclusive: bool = False) -> bool:
    """True when `new_rows` is a large load for `table`: big, and at least half its current size.

    Never on PostgreSQL unless the caller owns the database (`exclusive`: a bench build): there
    DROP INDEX holds an ACCESS EXCLUSIVE lock on the table until commit, so every page reading it
    would wait for the whole import. SQLite serialises writers anyway and readers keep their
    snapshot (WAL), so dropping there blocks no one.
    """
    if new_rows < DEFER_MIN_ROWS:
        return False
    if conn.dialect.name == "postgresql" and not exclusive:
        return False
    existing = conn.execute(text(f'SELECT count(*) FROM "{table.name}"')).scalar_one()
    return new_rows * 2 >= existing


def secondary_indexes(conn: Connection, table: Table) -> list[tuple[str, str]]:
    """(name, CREATE statement) of the table's non-unique indexes that no constraint owns."""
    if conn.dialect.name == "postgresql":
        found = conn.execute(
            text(
                "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace "
                "WHERE t.relname = :table AND n.nspname = current_schema() AND NOT x.indisunique "
                "AND NOT x.indisprimary "
                "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)"
            ),
            {"table": table.name},
        )
    else:
        found = conn.execute(
            text(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :table "
                "AND sql IS NOT NULL AND upper(sql) NOT LIKE 'CREATE UNIQUE%'"
            ),
            {"table": table.name},
        )
    return [(name, sql) for name, sql in found]


@contextmanager
def deferred_indexes(conn: Connection, tables: Sequence[Table], *, defer: bool = True) -> Iterator[None]:
    """Without the tables' secondary indexes inside the block, rebuilt after it (same transaction)."""
    if not defer:
        yield
        return
    saved = [index for table in tables for index in secondary_indexes(conn, table)]
    # The driver's cursor, not text(): a stored definition may hold ':' or '%' in a literal.
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        for name, _sql in saved:
            cursor.execute(f'DROP INDEX "{name}"')
        yield
        for _name, sql in saved:
            cursor.execute(sql)
    finally:
        cursor.close()
