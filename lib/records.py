"""Checks of untrusted records (import files, the judge's input): one message shape for every fault.

A record's fault raises `InvalidField` naming the field; the caller adds where the record is
(`located_failure`) and raises `ImportFailed`, so the CLI, the upload page and the judge all say
"<file> line <n>, field '<name>': <what is wrong>".
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import Table


class ImportFailed(Exception):
    """A file that cannot be imported; the message names the file, line and field at fault."""


class InvalidField(Exception):
    """A fault inside one record; the caller adds where the record is."""

    def __init__(self, field_name: str | None, message: str) -> None:
        super().__init__(message)
        self.field_name = field_name
        self.message = message


class Located(str):
    """A record's location that also knows the source's name for each Overrule field, and where a
    field came from when that is elsewhere (a Langfuse score's own line, a Phoenix evaluation's row)."""

    fields: dict[str, str]
    places: dict[str, str]

    def __new__(cls, where: str, fields: dict[str, str], places: dict[str, str] | None = None) -> Located:
        self = super().__new__(cls, where)
        self.fields = fields
        self.places = places if places is not None else {}
        return self

    def _lookup(self, table: dict[str, str], name: str) -> tuple[str, list[str]] | None:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            found = table.get(".".join(parts[:i]))
            if found is not None:
                return found, parts[i:]
        return None

    def source_field(self, name: str) -> str:
        """The source's name for an Overrule field path (longest matching prefix), else the path."""
        found = self._lookup(self.fields, name)
        return ".".join([found[0], *found[1]]) if found else name

    def place(self, name: str | None) -> str:
        """Where the field came from: its own place when it has one, else the record's."""
        found = self._lookup(self.places, name) if name else None
        return found[0] if found else str(self)


def located_failure(where: str, exc: InvalidField) -> ImportFailed:
    """The ImportFailed for a record's fault, prefixed with where the record is (a `Located` where
    names the field as the source file does)."""
    name = exc.field_name
    if isinstance(where, Located):
        where, name = where.place(name), where.source_field(name) if name else name
    if name:
        return ImportFailed(f"{where}, field {name!r}: {exc.message}")
    return ImportFailed(f"{where}: {exc.message}")


def type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number" if isinstance(value, int | float) else "?"
    )


@cache
def _column_limit(table: Table, column: str) -> int | None:
    return getattr(table.c[column].type, "length", None)


def text_field(
    record: dict[str, Any],
    name: str,
    *,
    table: Table | None = None,
    required: bool = False,
    path: str | None = None,
) -> str | None:
    """A string field, checked for presence, type, NUL characters and the column's length."""
    value = record.get(name)
    if value is None:
        if required:
            raise InvalidField(path or name, "is required")
        return None
    if value.__class__ is not str:
        raise InvalidField(path or name, f"must be a string, got {type_name(value)}")
    if required and not value.strip():
        raise InvalidField(path or name, "must not be empty")
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL; refusing keeps both backends identical.
        raise InvalidField(path or name, "contains a NUL character, which cannot be stored")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # JSON escapes such as "\ud800" decode to lone surrogates that no database can store.
            raise InvalidField(path or name, "contains invalid Unicode (an unpaired surrogate)") from None
    if table is not None:
        limit = _column_limit(table, name)
        if limit is not None and len(value) > limit:
            raise InvalidField(path or name, f"is {len(value)} characters long; at most {limit} allowed")
    return value


def number_field(value: Any, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidField(label, f"must be a number, got {type_name(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidField(label, "is too large") from None
    if not math.isfinite(number):
        raise InvalidField(label, "must be a finite number")
    return number


def timestamp_field(value: Any, label: str, *, required: bool) -> datetime | None:
    """An ISO 8601 time as aware UTC; a time without offset is taken to be UTC. A `datetime` (not a
    subclass) is taken as already parsed: what a decoder hands over typed (lib.otlp: a span's start),
    as it would have written and this read back."""
    if value is None:
        if required:
            raise InvalidField(label, "is required")
        return None
    if value.__class__ is datetime:
        return _utc(value, value, label)
    if not isinstance(value, str):
        raise InvalidField(label, f"must be an ISO 8601 time string, got {type_name(value)}")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidField(label, f"{value[:40]!r} is not an ISO 8601 time") from None
    return _utc(moment, value, label)


def _utc(moment: datetime, given: str | datetime, label: str) -> datetime:
    """`moment` in UTC (naive taken as UTC); `given` is what the refusal quotes."""
    try:
        return moment.replace(tzinfo=UTC) if moment.utcoffset() is None else moment.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise InvalidField(label, f"{str(given)[:40]!r} is out of range (years 1 to 9999 in UTC)") from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _printable(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def _holds_surrogate(value: Any) -> bool:
    """Whether any string or key in `value` may hold an unpaired surrogate; no paths built, ASCII skipped.

    True for subclasses of str/dict/list too, so that `lone_surrogate_at` walks them in full.
    """
    cls = value.__class__
    if cls is str:
        return not value.isascii() and _SURROGATE.search(value) is not None
    if cls is dict:
        for key, item in value.items():
            if key.__class__ is not str or (not key.isascii() and _SURROGATE.search(key)):
                return True
            item_cls = item.__class__
            if item_cls is str:  # inline: most values are strings, a call each would double the cost
                if not item.isascii() and _SURROGATE.search(item):
                    return True
            elif item_cls not in _SCALARS and _holds_surrogate(item):
                return True
        return False
    if cls is list:
        return any(item.__class__ not in _SCALARS and _holds_surrogate(item) for item in value)
    return isinstance(value, dict | list | str)


_SCALARS = frozenset((int, float, bool, type(None)))


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """The path (`a.b[2].c`) of the first string or key holding an unpaired surrogate, else None.

    Python's UTF-8 decoder refuses encoded surrogates, but JSON escapes such as `\\ud800` decode
    to lone surrogates, which no database, page or file can encode.
    """
    if not _holds_surrogate(value):  # every record of every import passes here: no paths built
        return None
    if value.__class__ is str:
        return path if not value.isascii() and _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and not key.isascii() and _SURROGATE.search(key):
                return _printable(here)
            found = lone_surrogate_at(item, here)
            if found is not None:
                return _printable(found)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate_at(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def check_unicode(value: Any) -> None:
    """Refuse a record with an unpaired surrogate in any text, naming the field (every kind, every field)."""
    where = lone_surrogate_at(value)
    if where is not None:
        raise InvalidField(where or None, "contains invalid Unicode (an unpaired surrogate)")


def record_object(record: Any) -> dict[str, Any]:
    """The record as an object, refused unless it is one and all its text is valid Unicode."""
    if not isinstance(record, dict):
        raise InvalidField(None, f"expected a JSON object, got {type_name(record)}")
    check_unicode(record)
    return record
