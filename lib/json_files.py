"""Reading JSON and JSON Lines files that come from outside: size-capped before they are read, and
every fault an ImportFailed naming the file, line and column. Overrule's own import files and other
tools' result files (lib.source_files) are read here, so both refuse a broken file the same way."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lib.records import ImportFailed

MIB = 1024 * 1024
# A JSONL line holds one record; anything longer is a broken or hostile file, refused unread.
MAX_LINE_BYTES = 10 * MIB
# JSON documents (cache, metric list) must be parsed whole; this caps the memory that takes.
MAX_DOCUMENT_BYTES = 128 * MIB
BOM = b"\xef\xbb\xbf"


def jsonl_records(path: Path, source: str) -> Iterator[tuple[str, Any]]:
    """(location, parsed object) per non-blank line; refuses overlong lines without reading them whole."""
    with path.open("rb") as fh:
        lineno = 0
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            where = f"{source} line {lineno}"
            if len(raw) > MAX_LINE_BYTES:
                raise ImportFailed(
                    f"{where}: the line is longer than the {MAX_LINE_BYTES // MIB} MB limit for one record"
                )
            yield where, _parse_json(raw.removeprefix(BOM) if lineno == 1 else raw, where)


def _parse_json(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{where}: not valid UTF-8 text (byte {exc.start + 1})") from None
    if not text.strip():
        return _BLANK
    text = text.rstrip("\r\n")  # the line end is not part of the record: errors point into the line
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFailed(f"{where}: invalid JSON ({_json_error(exc, text)})") from None
    except (ValueError, RecursionError) as exc:  # integers over 4300 digits, absurd nesting
        raise ImportFailed(f"{where}: invalid JSON ({_reason(exc)})") from None


def _json_error(exc: json.JSONDecodeError, text: str) -> str:
    """What is wrong and where; a value cut short says so (not "column 1" of the line after it)."""
    end = text.rstrip()
    # The decoder reports an unterminated string at its opening quote; the text ran out after it.
    if exc.pos >= len(end) or exc.msg.startswith("Unterminated string"):
        line = end.count("\n") + 1
        column = len(end) - end.rfind("\n") - 1  # of the last character
        at = f"column {column}" if line == 1 else f"line {line}, column {column}"
        detail = (
            f"a string opened at column {exc.colno} is not closed"
            if exc.msg.startswith("Unterminated string")
            else exc.msg.lower()
        )
        return f"truncated: the text stops after {at} before the JSON value is complete; {detail}"
    where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno}, column {exc.colno}"
    return f"{exc.msg.removesuffix(' at')} at {where}"


_BLANK = object()


def _reason(exc: Exception) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]


def nonblank(records: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    return ((where, obj) for where, obj in records if obj is not _BLANK)


def check_document_size(size: int, source: str) -> None:
    if size > MAX_DOCUMENT_BYTES:
        raise ImportFailed(
            f"{source}: {size // MIB} MB is over the {MAX_DOCUMENT_BYTES // MIB} MB limit for a JSON document"
        )


def parse_document(raw: bytes, source: str) -> Any:
    """A whole JSON document (cache or metric list); errors give line and column."""
    raw = raw.removeprefix(BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{source}: not valid UTF-8 text (byte {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFailed(f"{source}: invalid JSON ({_json_error(exc, text)})") from None
    except (ValueError, RecursionError) as exc:
        raise ImportFailed(f"{source}: invalid JSON ({_reason(exc)})") from None


def read_document(path: Path, source: str) -> Any:
    """A whole JSON document from a file, size-capped before it is read."""
    check_document_size(path.stat().st_size, source)
    return parse_document(path.read_bytes(), source)
