"""CSV text as every export writes it: cells a spreadsheet would read as a formula neutralised,
times in ISO 8601 UTC, scores in their one text form, RFC 4180 quoting and line ends; and the
columnar encoder that writes a batch of columns with Arrow kernels (issue 27): the same bytes the
row-by-row `csv.writer` wrote for `_stream_cell` of each value, several times faster.

The one home of these rules, and lean on purpose (Arrow and the standard library; no
SQLModel, SQLAlchemy or pandas): the export's DuckDB worker (`lib.wide_scan`) writes its CSV with
them without importing the app. `lib.export` builds every streamed CSV on them.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from lib.judgment_text import format_score

# OWASP "CSV injection": cells a spreadsheet would read as a formula or a control sequence, and the
# full-width forms (U+FF1D, U+FF0B, U+FF0D, U+FF20) that East Asian spreadsheets convert on input.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def neutralise_cell(value: Any) -> Any:
    """The value a spreadsheet shows as text: formula-like strings get a leading quote."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def iso_utc(moment: datetime, timespec: str = "auto") -> str:
    """ISO 8601 in UTC with a `Z`, as the seed-004 cache writes timestamps (`timespec` as
    `datetime.isoformat`'s: "auto" drops a zero fraction)."""
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def _stream_cell(value: Any) -> Any:
    """A value as a streamed CSV writes it: text neutralised, times ISO 8601 UTC, nothing as empty."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return iso_utc(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_score(value)  # "4", "2.67": the one text form of a score
    return neutralise_cell(value)


def _cell_text(value: Any) -> str:
    """The text `csv.writer` writes for `_stream_cell(value)` (it calls str() on what is not text)."""
    cell = _stream_cell(value)
    return cell if isinstance(cell, str) else str(cell)


# Characters that make `csv.writer` (QUOTE_MINIMAL, CRLF line ends) quote a cell.
_NEEDS_QUOTES = '[",\r\n]'
_CRLF = pa.scalar("\r\n")
# A column as the encoder takes it: typed Arrow values, or Python values of one row batch.
CsvColumn = pa.Array | pa.ChunkedArray | Sequence[Any]
ValueRule = Callable[[Any], Any]


# FORMULA_PREFIXES as one RE2 pattern anchored at the start, every character written as \\x{...}.
_FORMULA_PATTERN = "^(?:" + "|".join("".join(f"\\x{{{ord(c):X}}}" for c in p) for p in FORMULA_PREFIXES) + ")"


def _neutralised_array(text: pa.Array) -> pa.Array:
    """`neutralise_cell` over an Arrow string array: the same FORMULA_PREFIXES, tested in C++."""
    formula = pc.match_substring_regex(text, _FORMULA_PATTERN)
    return pc.if_else(formula, pc.binary_join_element_wise("'", text, ""), text)


def _rendered_distinct(values: pa.Array, render: Callable[[Any], str]) -> pa.Array:
    """`render` applied once per distinct value (scores, gaps, decisions: a handful per batch), the
    results taken back to every row: the Python rule stays the one rule at columnar speed."""
    distinct = pc.unique(values)
    texts = pa.array([render(v) for v in distinct.to_pylist()], pa.string())
    return pc.take(texts, pc.index_in(values, value_set=distinct))


def _iso_utc_array(moments: pa.Array) -> pa.Array:
    """`iso_utc` over an Arrow timestamp array (naive values are UTC): microseconds only when set."""
    utc = moments.cast(pa.timestamp("us"))  # Arrow keeps UTC instants: dropping the zone keeps them
    # Arrow's cast writes "YYYY-MM-DD HH:MM:SS.ffffff" (7x cheaper than strftime): a "T", then the
    # fraction dropped where it is zero.
    text = pc.utf8_replace_slice(utc.cast(pa.string()), 10, 11, "T")
    text = pc.if_else(pc.ends_with(text, ".000000"), pc.utf8_slice_codeunits(text, 0, 19), text)
    return pc.binary_join_element_wise(text, "Z", "")


def _arrow_values(values: Sequence[Any]) -> pa.Array | None:
    """A batch of Python values as a typed Arrow array when they are of one plain kind (nulls aside),
    else None (then each cell goes through `_cell_text`)."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if not kinds:
        return pa.nulls(len(values), pa.string())
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    arrow_type = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}.get(kind)
    if arrow_type is None and kind is not datetime:
        return None
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None  # ints beyond 64 bits, naive and aware times mixed: cell by cell


def _csv_cells(column: CsvColumn, rule: ValueRule | None = None) -> pa.Array:
    """A column as the text of its CSV cells (before quoting), as `_cell_text` renders each value."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not isinstance(column, pa.Array):
        values = list(column)
        typed = _arrow_values(values)
        if typed is None:
            if rule is not None:
                values = [rule(v) for v in values]
            return pa.array([_cell_text(v) for v in values], pa.string())
        column = typed
    kind = column.type
    if rule is not None:
        cells = _rendered_distinct(column, lambda v: _cell_text(rule(v)))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        cells = _neutralised_array(column.cast(pa.string()))
    elif pa.types.is_floating(kind):
        cells = _rendered_distinct(column, _cell_text)  # format_score, once per distinct value
    elif pa.types.is_integer(kind):
        cells = column.cast(pa.string())
    elif pa.types.is_boolean(kind):
        cells = pc.if_else(column, "true", "false")
    elif pa.types.is_timestamp(kind):
        cells = _iso_utc_array(column)
    elif pa.types.is_null(kind):
        cells = pa.nulls(len(column), pa.string())
    else:
        return pa.array([_cell_text(v) for v in column.to_pylist()], pa.string())
    return pc.fill_null(cells, "") if cells.null_count else cells


def _quoted(cells: pa.Array) -> pa.Array:
    """CSV quoting as `csv.writer` does it: a cell holding a quote, comma, CR or LF is enclosed in
    quotes with its quotes doubled; others are written as they are."""
    needs = pc.match_substring_regex(cells, _NEEDS_QUOTES)
    enclosed = pc.binary_join_element_wise('"', pc.replace_substring(cells, '"', '""'), '"', "")
    return pc.if_else(needs, enclosed, cells)


def _csv_lines(cells: Sequence[pa.Array]) -> bytes:
    """Cell texts, column by column (quoted), as CSV lines with RFC 4180 CRLF ends, in UTF-8."""
    if len(cells) == 1:
        # csv.writer writes a row of one empty cell as "" (an empty line would be no row at all).
        cells = [pc.if_else(pc.equal(cells[0], ""), '""', cells[0])]
    lines = pc.binary_join_element_wise(pc.binary_join_element_wise(*cells, ","), _CRLF, "")
    if len(lines) == 0:
        return b""
    offsets, data = lines.buffers()[1], lines.buffers()[2]
    # The offsets as an int32 array (Arrow, not numpy: the export worker runs without numpy).
    bounds = pa.Array.from_buffers(pa.int32(), len(lines) + 1, [None, offsets], offset=lines.offset)
    first, last = bounds[0].as_py(), bounds[-1].as_py()
    return data.slice(first, last - first).to_pybytes()


# A text column (or one with a rule) of at least this many rows with at most half as many distinct
# values (product, language, status, a decision) is encoded once per distinct value, then taken.
_DISTINCT_MIN_ROWS = 16


def _column_text(column: CsvColumn, rule: ValueRule | None = None, *, distinct: bool = True) -> pa.Array:
    """A column's CSV cells, quoted where needed (numbers, flags and times never need it)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not isinstance(column, pa.Array):
        values = list(column)
        typed = _arrow_values(values)
        column = values if typed is None else typed  # values: cell by cell (`_csv_cells`)
    if (
        distinct
        and isinstance(column, pa.Array)
        and len(column) >= _DISTINCT_MIN_ROWS
        and (rule is not None or pa.types.is_string(column.type))
    ):
        encoded = column.dictionary_encode(null_encoding="encode")  # a null is a value like others
        if 2 * len(encoded.dictionary) <= len(column):
            return pc.take(_column_text(encoded.dictionary, rule, distinct=False), encoded.indices)
    cells = _csv_cells(column, rule)
    plain = rule is None and isinstance(column, pa.Array) and not pa.types.is_string(column.type)
    return cells if plain else _quoted(cells)


def csv_header(columns: Sequence[str]) -> bytes:
    """The header line: column names are neutralised and quoted like any cell (all names encoded
    as one array: a kernel call per name cost ~10 ms of a small export's 50)."""
    names = _quoted(_csv_cells(list(columns)))
    return _csv_lines([names.slice(i, 1) for i in range(len(names))])


def csv_batch(columns: Sequence[CsvColumn], rules: Mapping[int, ValueRule] | None = None) -> bytes:
    """One batch of rows, given column by column, as CSV lines: the bytes `csv.writer` writes for
    `_stream_cell` of each value (tests/test_export.py holds the two side by side), encoded by
    Arrow kernels instead of a Python call per cell. `rules[i]` turns column i's values into what
    is written (e.g. a decision's number or label) once per distinct value."""
    rules = rules or {}
    return _csv_lines([_column_text(column, rules.get(i)) for i, column in enumerate(columns)])


def iter_csv_batches(
    columns: Sequence[str],
    batches: Iterable[Sequence[CsvColumn]],
    rules: Mapping[int, ValueRule] | None = None,
) -> Iterator[bytes]:
    """A header and batches of columns as UTF-8 CSV chunks, one per batch, in constant memory."""
    yield csv_header(columns)
    for batch in batches:
        yield csv_batch(batch, rules)


def counted_chunks(
    columns: Sequence[str],
    batches: Iterable[Sequence[CsvColumn]],
    rules: Mapping[int, ValueRule] | None = None,
) -> Generator[bytes, None, int]:
    """`iter_csv_batches` of these; returns the number of rows written."""
    count = 0

    def counted() -> Iterator[Sequence[CsvColumn]]:
        nonlocal count
        for batch in batches:
            count += len(batch[0]) if batch else 0
            yield batch

    yield from iter_csv_batches(columns, counted(), rules)
    return count


class ByteSink(Protocol):
    """Where `write_chunks` writes: a binary file, or the export worker's FIFO (`lib.wide_scan`)."""

    def write(self, data: bytes, /) -> object: ...


def write_chunks(out: ByteSink, chunks: Generator[bytes, None, int]) -> int:
    """Write the chunks to `out`; returns what the generator returns (the rows written)."""
    while True:
        try:
            out.write(next(chunks))
        except StopIteration as done:
            return int(done.value)
