"""One cache of compiled SQL for every engine the tests open, as one long-lived engine has.

SQLAlchemy compiles each distinct statement once per engine and keeps the result in that engine's
cache (and, for the ORM's INSERT/UPDATE/DELETE, in each mapper's cache), keyed by the engine's
dialect object. The app opens one engine and keeps it; the suite opens a new one for nearly every
test (a fresh database per test), so each test compiled every statement it ran again: a quarter of
the CPU time of a database test, and most of the garbage the collector then had to walk.

`install()` gives every engine, and every mapper for its statements, caches whose keys
name the dialect by its configuration (its class and its plain settings: compiler class, server
version, paramstyle, ...) instead of by object identity, so two engines configured alike share
compiled statements (both dialects: see SHARED_DIALECTS). What SQLAlchemy
compiles depends only on that configuration and the statement (the same assumption its per-engine
cache makes); engines configured differently (another compiler class, an AUTOCOMMIT admin engine)
get keys of their own. Nothing changes in what is executed or returned.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from sqlalchemy.engine.base import Engine
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.orm.mapper import Mapper
from sqlalchemy.util import LRUCache
from sqlalchemy.util.langhelpers import HasMemoized, memoized_property

_PLAIN = (str, int, float, bool, type(None), type)
_BY_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType)
_SIGNATURE = "_tests_compiled_cache_signature"
# Both dialects. PostgreSQL was left out for a while: test_importer's 5,000-record import then ran
# into its 300 s timeout; the cause was planner statistics that said "empty" during the import (fixed
# by lib.db.LoadStatistics), not the shared cache. PostgreSQL variants: 31 -> 27 CPU s on 4 files.
SHARED_DIALECTS = frozenset({"sqlite", "postgresql"})


def _setting(value: Any) -> Any:
    if isinstance(value, _PLAIN + _BY_IDENTITY):
        return value
    if isinstance(value, tuple) and all(isinstance(item, _PLAIN) for item in value):
        return value
    return type(value)  # per-dialect helper objects (identifier preparer, type compiler, memo dicts)


@functools.cache  # a question about a class: every engine's dialect asked it again (1 ms an engine)
def _derived(cls: type, name: str) -> bool:
    """Whether `name` is a value the dialect memoizes on first use (a memoized property or method):
    computed from its settings, and present or not depending only on whether something asked yet."""
    return name == _SIGNATURE or isinstance(
        inspect.getattr_static(cls, name, None), memoized_property | types.FunctionType
    )


def dialect_signature(dialect: Dialect) -> tuple[Any, ...]:
    """The dialect's class and settings: equal for two engines that compile a statement alike."""
    kept = dialect.__dict__.get(_SIGNATURE)
    if kept is not None and kept[0] == dialect.server_version_info:  # set when it first connects
        return kept[1]
    cls = type(dialect)
    settings = tuple(
        (name, _setting(value)) for name, value in sorted(vars(dialect).items()) if not _derived(cls, name)
    )
    signature = (type(dialect), settings)
    dialect.__dict__[_SIGNATURE] = (dialect.server_version_info, signature)
    return signature


def _by_configuration(key: Any) -> Any:
    if type(key) is tuple and key and isinstance(key[0], Dialect) and key[0].name in SHARED_DIALECTS:
        return (dialect_signature(key[0]), *key[1:])
    return key


class SharedCompiledCache(LRUCache):
    """SQLAlchemy's LRU cache of compiled statements, with the dialect in each key replaced by its
    configuration."""

    __slots__ = ()

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(_by_configuration(key), default)

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(_by_configuration(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(_by_configuration(key), value)


# Room for every statement of the suite (a few thousand): an evicted one is only compiled again.
ENGINE_CACHE = SharedCompiledCache(20_000)


def install() -> None:
    """From now on, every new engine uses `ENGINE_CACHE` and every mapper a shared cache of its own."""
    if getattr(Engine.__init__, "_shares_compiled_cache", False):
        return
    engine_init = Engine.__init__

    def __init__(self: Engine, *args: Any, **kwargs: Any) -> None:
        engine_init(self, *args, **kwargs)
        # query_cache_size=0 asks for no cache: keep none
        if self._compiled_cache is not None and self.dialect.name in SHARED_DIALECTS:
            self._compiled_cache = ENGINE_CACHE

    __init__._shares_compiled_cache = True  # type: ignore[attr-defined]
    Engine.__init__ = __init__  # type: ignore[method-assign]

    def _compiled_cache(self: Mapper[Any]) -> SharedCompiledCache:
        # The mapper's cache of flush statements (INSERT/UPDATE/DELETE), one per mapper as before.
        return SharedCompiledCache(self._compiled_cache_size * 10)

    Mapper._compiled_cache = HasMemoized.memoized_attribute(_compiled_cache)  # type: ignore[assignment,method-assign]
