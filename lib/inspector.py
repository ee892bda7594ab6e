"""The evaluation inspector: the filtered list, its filter options, one evaluation's detail, archiving.

Everything the Evaluations page shows comes from here, and all of the list's work happens in SQL:
the filters, the sort, the page (LIMIT/OFFSET) and the match count. A page rerun fetches one page
of narrow rows, never a whole table, so it stays fast at 100k evaluations. The filters round-trip
through the URL query string (`to_params` / `filters_from_params`) so a filtered view can be shared.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, date, datetime, time, timedelta
from functools import partial
from typing import Any, Literal

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import (
    String,
    Text,
    and_,
    case,
    cast,
    func,
    or_,
    text,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.sql import ColumnElement, Select
from sqlmodel import Session, col, select

from lib import counters, judge_versions, scores, search
from lib.auth import Actor, Permission
from lib.corrections import distinct_metrics, require_reviewer
from lib.display import REVIEWED_BY, evaluation_title, evaluation_url, metric_field, role_field
from lib.evidence import EvidenceItem, evidence_items, metric_entry
from lib.highlight import Span
from lib.isolated import RAW_QUERY_FUNCTIONS
from lib.judgment_text import (
    check_slugs,
    decision_value,
    name_for,
    parse_score,
    score_of,
    scores_of_json,
)
from lib.metrics import DEFAULT_METRICS, MetricSpec, metrics_for_product
from lib.models import EvaluationSnapshot, Judgment, MetricDefinition, utcnow
from lib.search import text_match
from lib.wide_scan import WideScan, wide_columns

ReviewState = Literal["any", "pending", "reviewed", "corrected"]
EvidenceState = Literal["any", "unverified", "unlocated", "verified", "none"]
SortKey = Literal["newest", "weighted_gap", "max_gap"]

REVIEW_STATES: dict[str, str] = {
    "any": "Any review state",
    "pending": "Pending review",
    "reviewed": "All metrics reviewed",
    "corrected": "Corrected by a reviewer",
}
EVIDENCE_STATES: dict[str, str] = {
    "any": "Any evidence state",
    "unverified": "Has unverified evidence",
    "unlocated": "Has evidence without position",
    "verified": "All evidence verified",
    "none": "No evidence recorded",
}
SORTS: dict[str, str] = {
    "newest": "Newest first",
    "weighted_gap": "Largest weighted gap",
    "max_gap": "Largest single-metric gap",
}
# Gaps are rescaled to the 1–5 span (SPEC §5), so no gap is ever larger than this.
MAX_GAP = 4.0
QUESTION_PREVIEW_CHARS = 160
FILTER_OPTION_COLUMNS = ("product", "language", "model_name", "category")

_S = EvaluationSnapshot
_J = Judgment


@dataclass(frozen=True)
class EvaluationFilters:
    """What the reviewer narrowed the list to; the defaults mean "everything live, newest first"."""

    product: str | None = None
    language: str | None = None
    model: str | None = None
    category: str | None = None
    metric: str | None = None
    min_gap: float | None = None
    review: ReviewState = "any"
    evidence: EvidenceState = "any"
    date_from: date | None = None
    date_to: date | None = None
    text: str = ""
    sort: SortKey = "newest"
    archived: bool = False


# Short, stable names for the URL; the dataclass field names are an implementation detail.
_PARAM_NAMES: dict[str, str] = {
    "product": "product",
    "language": "language",
    "model": "model",
    "category": "category",
    "metric": "metric",
    "min_gap": "min_gap",
    "review": "review",
    "evidence": "evidence",
    "date_from": "from",
    "date_to": "to",
    "text": "q",
    "sort": "sort",
    "archived": "archived",
}
PARAM_NAMES: frozenset[str] = frozenset(_PARAM_NAMES.values())


def to_params(filters: EvaluationFilters) -> dict[str, str]:
    """The query-string form of the filters: only what differs from the defaults, so URLs stay short."""
    default = EvaluationFilters()
    params: dict[str, str] = {}
    for f in fields(EvaluationFilters):
        value = getattr(filters, f.name)
        if value == getattr(default, f.name) or value is None or value == "":
            continue
        if isinstance(value, bool):
            text_value = "1"
        elif isinstance(value, date):
            text_value = value.isoformat()
        elif isinstance(value, float):
            text_value = f"{value:g}"
        else:
            text_value = str(value)
        params[_PARAM_NAMES[f.name]] = text_value
    return params


def _parse_date(raw: str | None) -> date | None:
    try:
        return date.fromisoformat(raw) if raw else None
    except ValueError:
        return None


def _parse_gap(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    return min(value, MAX_GAP)


def filters_from_params(params: Mapping[str, str]) -> EvaluationFilters:
    """Filters from a (possibly hand-edited, shared) query string; bad values fall back to defaults."""

    def get(name: str) -> str | None:
        value = params.get(_PARAM_NAMES[name])
        return str(value).strip() or None if value is not None else None

    review = get("review") or "any"
    evidence = get("evidence") or "any"
    sort = get("sort") or "newest"
    return EvaluationFilters(
        product=get("product"),
        language=get("language"),
        model=get("model"),
        category=get("category"),
        metric=get("metric"),
        min_gap=_parse_gap(get("min_gap")),
        review=review if review in REVIEW_STATES else "any",  # type: ignore[arg-type]
        evidence=evidence if evidence in EVIDENCE_STATES else "any",  # type: ignore[arg-type]
        date_from=_parse_date(get("date_from")),
        date_to=_parse_date(get("date_to")),
        text=(params.get(_PARAM_NAMES["text"]) or "").strip(),
        sort=sort if sort in SORTS else "newest",  # type: ignore[arg-type]
        archived=get("archived") in {"1", "true", "yes"},
    )


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def filter_conditions(filters: EvaluationFilters, *, text_form: str = "match") -> list[ColumnElement[bool]]:
    """The WHERE clauses of the list, shared by the page query, the count and the CSV export.

    `text_form` says how the text filter is stated (lib.search): "match" lets the database pick (the
    index on SQLite), "scan" tests each walked row's stored text, "rows" tests it on the rows the
    other filters keep with a test no index serves (`search.text_match(rows=True)`: strpos on
    PostgreSQL, the scan's LIKE on SQLite), "none" leaves it to a FROM that starts from the index
    (`search.index_matched_rows`).
    """
    conds: list[ColumnElement[bool]] = [
        col(_S.deleted_at).is_not(None) if filters.archived else col(_S.deleted_at).is_(None)
    ]
    for value, column in (
        (filters.product, _S.product),
        (filters.language, _S.language),
        (filters.model, _S.model_name),
        (filters.category, _S.category),
    ):
        if value is not None:
            conds.append(col(column) == value)
    # Review state and judged metric read the evaluation's own counters (lib.counters), inside the
    # list index: no probe of its judgments per row, which at 1M evaluations is 1M probes. The
    # states are lib.counters' definitions, which `evaluation_counts` counts too.
    if filters.metric:
        conds.append(counters.metric_judged(_S.judged_metrics, filters.metric))
    if filters.min_gap is not None and filters.min_gap > 0:
        conds.append(col(_S.max_metric_gap) >= filters.min_gap)
    if filters.review != "any":
        conds.append(counters.review_state(filters.review))
    if filters.evidence != "any":
        conds.append(counters.evidence_state(filters.evidence))
    if filters.date_from is not None:
        conds.append(col(_S.created_at) >= _day_start(filters.date_from))
    if filters.date_to is not None:
        # The whole "to" day is included.
        conds.append(col(_S.created_at) < _day_start(filters.date_to + timedelta(days=1)))
    if filters.text and text_form != "none":
        # Unicode-aware and literal, through the trigram index or row by row (lib.search); a list
        # the index does not hold (the archived one) tests its own rows one by one.
        # The archived list is a small range of the list index: its rows, each tested (PostgreSQL
        # would otherwise intersect it with every trigram match of a common text).
        rows = text_form == "rows" or not _index_covers(filters)
        conds.append(text_match(_S.__table__, filters.text, scan=text_form == "scan", rows=rows))
    return conds


def _order_by(sort: str) -> list[Any]:
    newest = [col(_S.created_at).desc(), col(_S.id).desc()]
    if sort == "weighted_gap":
        return [col(_S.weighted_gap).desc().nulls_last(), *newest]
    if sort == "max_gap":
        return [col(_S.max_metric_gap).desc().nulls_last(), *newest]
    return newest


_LIST_COLUMNS = (
    col(_S.id).label("id"),
    col(_S.created_at).label("created_at"),
    col(_S.product).label("product"),
    col(_S.language).label("language"),
    col(_S.model_name).label("model"),
    col(_S.category).label("category"),
    col(_S.weighted_gap).label("weighted_gap"),
    col(_S.max_metric_gap).label("max_gap"),
    col(_S.judge_meta_score).label("judge_meta_score"),
    col(_S.evidence_count).label("evidence"),
    col(_S.evidence_highlighted).label("highlighted"),
    col(_S.evidence_unlocated).label("unlocated"),
    col(_S.evidence_unverified).label("unverified"),
    col(_S.status).label("status"),
)


@dataclass(frozen=True)
class EvaluationRow:
    """One line of the list: narrow on purpose (no answer, no JSON), so a page is cheap to fetch."""

    id: str
    created_at: datetime
    product: str
    language: str
    model: str | None
    category: str | None
    question: str
    weighted_gap: float | None
    max_gap: float | None
    judge_meta_score: int | None
    evidence: int
    highlighted: int
    unlocated: int
    unverified: int
    status: str
    judged: int = 0
    reviewed: int = 0
    corrected: int = 0


@dataclass(frozen=True)
class EvaluationPage:
    """One page of the filtered list and how many evaluations match in all."""

    rows: list[EvaluationRow]
    total: int
    offset: int
    limit: int


def _list_select(filters: EvaluationFilters) -> Select[Any]:
    """Every matching row with the full question, in list order (for the CSV export)."""
    return (
        select(*_LIST_COLUMNS, col(_S.question).label("question"))
        .where(*filter_conditions(filters))
        .order_by(*_order_by(filters.sort))
    )


COUNT_CAP = counters.COUNT_CAP
count_label = counters.count_label
count_is_capped = counters.count_is_capped
# `count_cap` of a count the counters answer exactly: never shown as capped, whatever its size.
EXACT_COUNT_CAP = 2**62


# ---------------------------------------------------------------------------------------------
# Plans (issue 27): how a count and a page are read, whichever filters and sort the reviewer picked.
#
# Counts: `evaluation_counts` (lib.counters) holds evaluations per combination of every filter value
# but dates and text, so those combinations are counted exactly from a few hundred rows. With dates
# or text the count stops at its cap, walking the index that starts from the dates (or the text
# index, lib.search); the counters' figure for the other filters bounds it (0 there: no walk at all).
# Pages: each sort has an index in its order that carries every filter column (lib.models), so a
# page walks it, tests the filters on its entries and stops after the page: about (offset + limit) ×
# listed ÷ matches entries. With exact counts a page past the middle walks from the end instead,
# and when the dates or a minimum gap keep fewer rows than that walk would read, the page seeks
# their range and sorts it. "All metrics reviewed" has an index of its own rows (partial, lib.models):
# its count walks that, and a page walks it newest first or seeks it and sorts, whichever is fewer
# entries than the sort's walk. Gap sorts read the rows with a gap (a plain descending index walk on
# SQLite and PostgreSQL alike), then those without one, newest first.

# Which index gives each sort's order; SQLite is told which one to walk (INDEXED BY), PostgreSQL
# picks by its own statistics among the same indexes.
ORDER_INDEXES: dict[str, str] = {
    "newest": "ix_snapshot_live_created",
    "weighted_gap": "ix_snapshot_live_weighted_gap",
    "max_gap": "ix_snapshot_live_max_gap",
}
# SQLite's newest-first index that also holds the normalised question (lib.models): a text filter's
# walk tests the text on its entries.
TEXT_INDEX = search.LIST_TEXT_INDEX
# The fully reviewed live evaluations only, newest first, with the filter columns (and the question
# on SQLite): the "All metrics reviewed" list is this index's whole range, counted by the counters.
REVIEWED_INDEX = search.LIST_REVIEWED_INDEX
# A range probe (dates) counts at most this many entries: beyond it the range's share is estimated.
RANGE_PROBE = 20_000
# A seek that reads n entries and sorts them costs about this many entries' walk per entry.
SORT_COST = 2.0
# Dates sorted by a gap (SQLite): past this many distinct gap values the dates are not sought inside
# each value (one seek per value, for the count and each page) but tested along the gap's index, as
# before that plan. gen.py's weighted gaps take 92 values; a weighted mean can take thousands.
GAP_VALUES_CAP = 256


def _cube_conditions(filters: EvaluationFilters) -> tuple[list[ColumnElement[bool]], bool]:
    """The filters as conditions on `evaluation_counts`, and whether they are all of them (no text,
    no dates, a minimum gap in steps of 0.5): then the counters' figure is the exact count."""
    c = counters.evaluation_counts_table().c
    conds: list[ColumnElement[bool]] = [c.archived.is_(filters.archived)]
    for value, column in (
        (filters.product, c.product),
        (filters.language, c.language),
        (filters.model, c.model_name),
        (filters.category, c.category),
    ):
        if value is not None:
            conds.append(column == value)
    if filters.metric:
        conds.append(counters.metric_judged(c.judged_metrics, filters.metric))
    complete = not filters.text and not _has_dates(filters)
    if filters.min_gap is not None and filters.min_gap > 0:
        halves = counters.gap_halves_at_least(filters.min_gap)
        if halves is None:
            complete = False
        else:
            conds.append(c.gap_halves >= halves)
    if filters.review != "any":
        conds.append(c[f"review_{filters.review}"].is_(True))
    if filters.evidence != "any":
        conds.append(c[f"evidence_{filters.evidence}"].is_(True))
    return conds, complete


def counted_exactly(filters: EvaluationFilters) -> bool:
    """Whether the counters answer this list's count exactly (every filter but text and dates)."""
    return _cube_conditions(filters)[1]


def count_cap(filters: EvaluationFilters) -> int:
    """Where the list's count stops (`count_label` / `count_is_capped` take it too): nowhere when
    the counters answer it (`EXACT_COUNT_CAP`), else a text filter's `counters.TEXT_COUNT_CAP`
    ("1,000+") or `counters.COUNT_CAP` ("10,000+")."""
    if counted_exactly(filters):
        return EXACT_COUNT_CAP
    return counters.TEXT_COUNT_CAP if filters.text else counters.COUNT_CAP  # read now: tests lower them


def _counted(session: Session, filters: EvaluationFilters, *, bound: bool = False) -> int | None:
    """The counters' figure: the exact count (None when they cannot answer), or with `bound` the
    count of the filters they hold, an upper bound of the real one."""
    if _only_product(filters):
        totals = counters.evaluation_totals_by_product(session=session)
        picked = [t for p, t in totals.items() if filters.product in (None, p)]
        return sum(t.archived if filters.archived else t.evaluations for t in picked)
    conds, complete = _cube_conditions(filters)
    if not (complete or bound):
        return None
    return counters.evaluation_count(session=session, where=conds)


def _listed(session: Session, filters: EvaluationFilters) -> int:
    """How many evaluations the list holds before any filter (live, or archived)."""
    return _counted(session, EvaluationFilters(archived=filters.archived)) or 0


def _walk_hint(stmt: Select[Any], index: str | None) -> Select[Any]:
    """Tell SQLite which of the list's indexes to read (`INDEXED BY`); other databases choose."""
    return stmt if index is None else stmt.with_hint(_S, f"INDEXED BY {index}", "sqlite")


def _text_index(session: Session, filters: EvaluationFilters) -> str | None:
    """SQLite's index holding the question text, for a text filter tested row by row (a common
    query, a short one, the archived list); None without text or on PostgreSQL."""
    return TEXT_INDEX if filters.text and session.get_bind().dialect.name == "sqlite" else None


def _reviewed_only(filters: EvaluationFilters) -> bool:
    """Whether the list is the fully reviewed live evaluations (a part of them): `REVIEWED_INDEX`'s rows."""
    return filters.review == "reviewed" and not filters.archived


def _count_index(session: Session, filters: EvaluationFilters) -> str | None:
    """The index a capped count walks: the fully reviewed evaluations' own (never more entries than
    any other: dates are a range of it, the text is on its entries), the one whose range the dates
    or a minimum gap fix, or the one with the question text (all carry every filter column), so no
    row is read to test a filter."""
    if _reviewed_only(filters):
        return REVIEWED_INDEX
    if text_index := _text_index(session, filters):
        return text_index
    if filters.min_gap and not _has_dates(filters) and not filters.archived:
        return ORDER_INDEXES["max_gap"]
    return ORDER_INDEXES["newest"]


def count_evaluations(*, session: Session, filters: EvaluationFilters, cap: int | None = None) -> int:
    """How many evaluations match: exact, or `cap` + 1 when more match (`count_label` says "10,000+").

    Exact from lib.counters whenever they answer (`counted_exactly`: every filter but text and
    dates), whatever `cap` says. Otherwise `cap` defaults to `count_cap(filters)` and
    the count reads at most `cap` + 1 matching entries of an index that starts from the dates (or of
    the text index), so a broad filter at a million rows costs the same as at 10k.
    """
    exact = _counted(session, filters)
    if exact is not None:
        return exact
    if _counted(session, filters, bound=True) == 0:
        return 0  # the filters the counters hold already keep nothing
    cap = count_cap(filters) if cap is None else cap
    text_only = _text_alone(filters)
    matched = _text_matched_rows(session, filters)
    found = None
    if matched is not None:
        # One read of the text index serves the count and the page's plan (`_rare_text_rows`).
        found = search.count_index_matches(
            session=session, table=_S.__table__, query=filters.text, limit=max(cap, search.RARE_MATCHES) + 1
        )
    if found is not None and text_only:
        # Text alone over a list the index holds exactly (lib.search.index_covers): its own count,
        # stopped at cap + 1, is the answer; no row is read.
        return min(found, cap + 1)
    if found is not None and found <= search.RARE_MATCHES:
        # A rare text with other filters: from the text index, testing the others on its few rows.
        stmt = select(col(_S.id)).select_from(matched).where(*filter_conditions(filters, text_form="none"))
    else:
        # A common text (starting from its index would read every match and its row: 1M, a phrase
        # in a fifth of the rows plus four filters, 2.9 s), dates, an odd minimum gap: a walk of the
        # index whose range the filters fix, testing them all on its entries (the text too, on
        # SQLite's index with the question) and stopping at cap + 1.
        text_form = "rows" if _scan_text_rows(session, filters) else "scan" if filters.text else "match"
        stmt = select(col(_S.id)).where(*filter_conditions(filters, text_form=text_form))
        # The short questions' walk and the long live ones (few), counted together up to cap + 1.
        index = _count_index(session, filters)
        parts = [_walk_hint(stmt.where(part), index) for part in _short_text_walk(session, filters)]
        stmt = union_all(*parts) if len(parts) > 1 else parts[0] if parts else _walk_hint(stmt, index)
    matches = stmt.limit(cap + 1).subquery()
    return int(session.exec(select(func.count()).select_from(matches)).one())


# PostgreSQL, dates and a text (issue 27): the text's share among this many rows of the date range
# (newest first) tells a common text from a rare one, which the trigram index cannot say cheaply.
TEXT_SAMPLE = 200
# From this share of the sample on, the text is tested on the date range's rows (`_scan_text_rows`).
COMMON_TEXT_SHARE = 0.05
_SAMPLED_KEY = "lib.inspector.text_share"  # session.info: filters without sort -> the sample's share


def _scan_text_rows(session: Session, filters: EvaluationFilters) -> bool:
    """Whether the count and the page test a text on the date range's rows (PostgreSQL, a common text
    with dates): then they stop at the count's cap or after the page's rows, while PostgreSQL, given
    a LIKE, intersects the range with every trigram match of the text (20,000 of 100k evaluations:
    the count of "last 30 days + a common text" 48 ms cold, 20 warm; 15 ms this way). A rare text
    keeps the LIKE: the trigram index finds its few rows (2 ms) where the range's rows take 20.
    The share is read off `TEXT_SAMPLE` rows of the range, newest first (~1 ms), once a session."""
    dates = _has_dates(filters)
    if not (filters.text and dates and _index_covers(filters)):
        return False
    if session.get_bind().dialect.name != "postgresql":
        return False  # SQLite's list index holds the text: its walk tests it on the entries
    key = replace(filters, sort="newest")
    shares: dict[EvaluationFilters, float] = session.info.setdefault(_SAMPLED_KEY, {})
    if key not in shares:
        hit = text_match(_S.__table__, filters.text, rows=True).label("hit")
        others = filter_conditions(replace(filters, text=""))
        order = (col(_S.deleted_at).desc(), col(_S.created_at).desc(), col(_S.id).desc())
        sample = select(hit).where(*others).order_by(*order).limit(TEXT_SAMPLE).subquery()
        seen, hits = session.exec(
            select(func.count(), func.count().filter(sample.c.hit)).select_from(sample)
        ).one()
        shares[key] = hits / seen if seen else 0.0
    return shares[key] >= COMMON_TEXT_SHARE


def _short_text_walk(session: Session, filters: EvaluationFilters) -> list[ColumnElement[bool]]:
    """PostgreSQL, a text alone on the live list: the list split by the question's length, as
    conditions that together keep every row once (`_ordered` reads the parts in list order), so the
    planner may walk `search.LIST_SHORT_TEXT_INDEX` (newest first, with the question) and test the
    text on its entries, reading no row: page 400 of a text in a fifth of 100k questions otherwise
    read ~13,600 pages of the table (the trigram index's matches, then a sort): 70-85 ms a render. A
    rare text keeps the trigram index (the planner's choice; its estimate of the LIKE decides).

    `[search.short_text]` when no live question is longer than that index holds (one probe of an
    empty range of `search.TEXT_BYTES_INDEX`, ~0.01 ms, asked by each call: a session that has
    stored a long question since must not reuse an earlier answer); with one, the long ones too, as
    a second part (few rows, found through `search.TEXT_BYTES_INDEX`), so that one long question
    does not turn the walk off for every list. `[]` for anything else: with another filter or a date
    the index has no column to test it on; the caller uses it for a newest-first page or a count
    only (the index's order). The probe and the list's read are two READ COMMITTED statements: a
    long question committed between them is left out of that one render (the next one lists it)."""
    live_text_alone = filters.text and not filters.archived and _text_alone(filters)
    if not live_text_alone or session.get_bind().dialect.name != "postgresql":
        return []
    question = col(_S.search_text)
    longer = search.short_text(question, longer=True)
    found = session.exec(select(col(_S.id)).where(col(_S.deleted_at).is_(None), longer).limit(1)).first()
    return [search.short_text(question)] if found is None else [search.short_text(question), longer]


def _ordered(
    base: Select[Any],
    conds: list[ColumnElement[bool]],
    order: list[Any],
    parts: Sequence[ColumnElement[bool]],
    index: str | None,
    *,
    descending: bool,
    offset: int,
    limit: int,
) -> Select[Any]:
    """Rows [offset, offset + limit) of `base` (the ids) under `conds`, by `order` (descending or
    not). With several `parts` (disjoint conditions that together keep the list: `_short_text_walk`)
    each part is read in that order and stopped at offset + limit rows, and PostgreSQL merges the
    reads (a Merge Append that stops at the page), so the OFFSET and LIMIT apply to the whole list.
    The parts need their own ORDER BY and LIMIT: PostgreSQL 15 does not flatten a UNION ALL whose
    parts have conditions, and read every part whole and sorted it (page 400 of a common text at
    100k: 24,000 rows, 37 ms; 10 ms this way)."""

    def by(c: Any) -> Any:
        return c.desc() if descending else c.asc()

    if len(parts) < 2:
        stmt = _walk_hint(base.where(*conds, *parts), index)
        return stmt.order_by(*map(by, order)).offset(offset).limit(limit)
    keys = [c.label(f"key_{i}") for i, c in enumerate(order)]
    reads = [
        base.with_only_columns(*keys).where(*conds, part).order_by(*map(by, order)).limit(offset + limit)
        for part in parts
    ]
    merged = union_all(*reads).subquery()
    columns = [merged.c[k.name] for k in keys]
    return select(columns[-1]).order_by(*map(by, columns)).offset(offset).limit(limit)


def _text_matched_rows(session: Session, filters: EvaluationFilters) -> Any:
    """The list's snapshots joined to their text index's matches; None without a text filter, for a
    list the index does not hold (the archived one) or without an index."""
    if not filters.text or not _index_covers(filters):
        return None
    return search.index_matched_rows(session=session, table=_S.__table__, query=filters.text)


def _rare_text_rows(session: Session, filters: EvaluationFilters) -> Any:
    """The FROM of a page when its text is rare (lib.search): the text index's matches, at most
    `search.RARE_MATCHES` rows to sort; None when the text is common or there is no text index."""
    if not (filters.text and _index_covers(filters)):
        return None
    found = search.count_index_matches(
        session=session,
        table=_S.__table__,
        query=filters.text,
        limit=search.RARE_MATCHES + 1,
        for_plan=True,
    )
    if found is None or found > search.RARE_MATCHES:
        return None
    return _text_matched_rows(session, filters)


def _index_covers(filters: EvaluationFilters) -> bool:
    """Whether SQLite's search index holds exactly this list's rows (lib.search.index_covers)."""
    return search.index_covers(_S.__table__.name, archived=filters.archived)


def _text_alone(filters: EvaluationFilters) -> bool:
    """Whether no filter but the text (which may be empty) is set, in any sort, live or archived."""
    return filters == EvaluationFilters(text=filters.text, sort=filters.sort, archived=filters.archived)


def _has_dates(filters: EvaluationFilters) -> bool:
    """Whether a date bound (from, to or both) is set."""
    return filters.date_from is not None or filters.date_to is not None


def _only_product(filters: EvaluationFilters) -> bool:
    return filters == EvaluationFilters(product=filters.product, sort=filters.sort, archived=filters.archived)


@dataclass(frozen=True)
class PageKey:
    """Where a page ended, in list order: the next page starts right after it (keyset paging)."""

    gap: float | None
    created_at: datetime
    id: str


def page_key(row: EvaluationRow, sort: str) -> PageKey:
    """The key of a page's last row, to ask for the page after it."""
    gap = row.weighted_gap if sort == "weighted_gap" else row.max_gap if sort == "max_gap" else None
    return PageKey(gap=gap, created_at=row.created_at, id=row.id)


def _before(key: PageKey) -> ColumnElement[bool]:
    """Rows after `key` in newest-first order; the `<=` bound lets the index seek instead of skip."""
    created, sid = col(_S.created_at), col(_S.id)
    return and_(created <= key.created_at, or_(created < key.created_at, sid < key.id))


def _gap_column(sort: str) -> Any:
    return col(_S.weighted_gap) if sort == "weighted_gap" else col(_S.max_metric_gap)


@dataclass(frozen=True)
class _Segment:
    """Part of the list in one index order: its conditions, its order (every column descending) and,
    when known, how many rows it holds."""

    conds: list[ColumnElement[bool]]
    order: list[Any]
    size: int | None = None
    parts: tuple[ColumnElement[bool], ...] = ()  # read as one list in `order` (`_ordered`)


def _segments(
    session: Session,
    filters: EvaluationFilters,
    conds: list[ColumnElement[bool]],
    total: int | None,
    index: str | None = None,
) -> list[_Segment]:
    """The list in its sort's order: newest first, or the rows with a gap (largest first) then the
    rows without one (newest first). The live list's orders start with `deleted_at` (always NULL
    there) so that PostgreSQL reads them off the index too, which `IS NULL` alone does not fix.
    `index`: the one SQLite reads (`_choose_index`); PostgreSQL picks its own."""
    lead = [] if filters.archived else [col(_S.deleted_at)]
    newest = [*lead, col(_S.created_at), col(_S.id)]
    if filters.sort == "newest":
        return [_Segment(conds, newest, total)]
    gap = _gap_column(filters.sort)
    gapped = None
    if total is not None:  # the counters tell the rows with a gap from those without
        cube, _complete = _cube_conditions(filters)
        c = counters.evaluation_counts_table().c
        has_gap = c.gap_halves >= 0 if filters.sort == "max_gap" else c.has_weighted_gap.is_(True)
        gapped = counters.evaluation_count(session=session, where=[*cube, has_gap])
    gap_cond, gapped_conds = gap.is_not(None), conds
    dates = _has_dates(filters)
    sqlite = session.get_bind().dialect.name == "sqlite"  # PostgreSQL plans by its own statistics
    if dates and not filters.archived and sqlite and index == ORDER_INDEXES[filters.sort]:
        # Each gap value's rows are newest first in the gap's index, so the dates are a range of
        # each value's part of it: one seek per value, in the sort's order, instead of a walk that
        # skips every row outside the dates (a gap taking 3 values: the first 30 days by largest
        # gap walked 610k entries at 1M before its first match, 70 ms; 0.3 ms this way).
        at_least = filters.min_gap if filters.sort == "max_gap" else None
        values = _gap_values(filters.sort, at_least)
        if _count_up_to(session, values, GAP_VALUES_CAP) <= GAP_VALUES_CAP:
            gap_cond = gap.in_(values)
            if at_least:  # the values hold the minimum gap: its range would win the seek over them
                minimum = _gap_column("max_gap") >= at_least
                gapped_conds = [c for c in conds if not c.compare(minimum)]
    return [
        _Segment([*gapped_conds, gap_cond], [*lead, gap, col(_S.created_at), col(_S.id)], gapped),
        _Segment(
            [*conds, gap.is_(None)], newest, None if gapped is None or total is None else total - gapped
        ),
    ]


def _gap_values(sort: str, at_least: float | None = None) -> Select[Any]:
    """The distinct values of a gap sort's column among live evaluations (SQLite), `at_least` and
    up, read off its index one seek per value (a recursive "next smaller value" walk: 92 values at
    1M take 2.4 ms)."""
    gap, index = _gap_column(sort), ORDER_INDEXES[sort]

    def largest(*below: ColumnElement[bool]) -> Any:
        stmt = select(func.max(gap)).where(col(_S.deleted_at).is_(None), *below)
        return _walk_hint(stmt, index).scalar_subquery()

    walk = select(largest().label("value")).cte("gap_values", recursive=True)
    more = [walk.c.value.is_not(None)] if at_least is None else [walk.c.value >= at_least]
    walk = walk.union_all(select(largest(gap < walk.c.value)).where(*more))  # stops below `at_least`
    values = select(walk.c.value).where(walk.c.value.is_not(None))
    return values if at_least is None else values.where(walk.c.value >= at_least)


def _count_up_to(session: Session, rows: Select[Any], cap: int) -> int:
    """How many rows `rows` has, reading at most `cap` + 1 of them (a recursive walk stops there)."""
    return int(session.exec(select(func.count()).select_from(rows.limit(cap + 1).subquery())).one())


def _date_range_size(session: Session, filters: EvaluationFilters) -> int:
    """Entries the dates keep in the list index (up to `RANGE_PROBE` + 1: a bounded probe)."""
    conds = filter_conditions(
        EvaluationFilters(date_from=filters.date_from, date_to=filters.date_to, archived=filters.archived)
    )
    probe = _walk_hint(select(col(_S.id)).where(*conds), ORDER_INDEXES["newest"]).limit(RANGE_PROBE + 1)
    return int(session.exec(select(func.count()).select_from(probe.subquery())).one())


def _choose_index(
    session: Session, filters: EvaluationFilters, offset: int, limit: int, total: int | None, bound: int
) -> str:
    """Which index a page reads (SQLite): its sort's, walked until the page is found, or the one
    whose range the dates or a minimum gap fix, read whole and sorted, when that range is smaller
    than the walk. Costs are index entries, from the counters' figures (`total` exact, or `bound` for
    the filters they hold) and a bounded range probe. The archived list (1% of the rows here) is a
    range of the newest-first index, read and sorted; a common text walks the index with its text;
    the fully reviewed evaluations are the whole range of their own index, walked or sorted."""
    if filters.archived:
        return _text_index(session, filters) or ORDER_INDEXES["newest"]
    if _reviewed_only(filters) and filters.sort == "newest":
        return REVIEWED_INDEX  # the list order, over the reviewed rows alone; dates a range of it
    walk_index = ORDER_INDEXES[filters.sort]
    if filters.sort == "newest" and (text_index := _text_index(session, filters)):
        return text_index  # the dates are a range of it too
    dates = _has_dates(filters)
    if not dates and not filters.min_gap and not _reviewed_only(filters):
        return walk_index
    listed = max(1, _listed(session, filters))
    matches = total if total is not None else bound
    ranges: dict[str, float] = {}
    if _reviewed_only(filters):
        # Seek the reviewed rows and sort them, or walk the sort's index until the page: its matches
        # are at most the counters' figure, and a common text keeps a share of them (the text index's
        # count, stopped at its cap, so the share is a lower bound: the seek is preferred on doubt).
        ranges[REVIEWED_INDEX] = _counted(session, EvaluationFilters(review="reviewed")) or 0
        found = (
            search.count_index_matches(
                session=session,
                table=_S.__table__,
                query=filters.text,
                limit=search.RARE_MATCHES + 1,
                for_plan=True,
            )
            if filters.text
            else None
        )
        if found is not None:
            matches = matches * min(1.0, found / listed)
    if dates:
        size = _date_range_size(session, filters)
        ranges[ORDER_INDEXES["newest"]] = size
        if total is None:  # the dates' share of the filters the counters hold
            matches = matches * size / listed
    if filters.min_gap:
        c = counters.evaluation_counts_table().c
        halves = counters.gap_halves_at_least(filters.min_gap)
        gap_only = EvaluationFilters(min_gap=filters.min_gap, archived=filters.archived)
        ranges[ORDER_INDEXES["max_gap"]] = (
            counters.evaluation_count(
                session=session, where=[c.archived.is_(filters.archived), c.gap_halves >= halves]
            )
            if halves is not None
            else count_evaluations(session=session, filters=gap_only, cap=RANGE_PROBE)
        )
    if REVIEWED_INDEX in ranges and ORDER_INDEXES["newest"] in ranges:
        # The dates are a range of the reviewed index too: its seek reads the smaller of the two.
        ranges[REVIEWED_INDEX] = min(ranges[REVIEWED_INDEX], ranges.pop(ORDER_INDEXES["newest"]))
    # The walk reads the part of its index the filters' range fixes, until offset + limit matches.
    walked = ranges.get(walk_index, listed)
    costs = {walk_index: (offset + limit) * walked / max(matches, 1)}
    for index, size in ranges.items():
        if index != walk_index:
            costs[index] = size * SORT_COST
    return min(costs, key=costs.__getitem__)


def _read_segment(
    session: Session, base: Select[Any], segment: _Segment, start: int, count: int, index: str | None
) -> list[str]:
    """Rows [start, start + count) of a segment: walked from its start, or from its end (in reverse,
    then turned around) when its size is known and the rows lie nearer the end."""
    if segment.size is not None:
        count = min(count, segment.size - start)
    if count <= 0:
        return []
    read = partial(_ordered, base, segment.conds, segment.order, segment.parts, index, limit=count)
    if segment.size is not None and segment.size - start - count < start:
        back = read(descending=False, offset=segment.size - start - count)
        return list(reversed(session.exec(back).all()))
    return list(session.exec(read(descending=True, offset=start)).all())


def _page_ids(
    session: Session, filters: EvaluationFilters, offset: int, limit: int, after: PageKey | None
) -> list[str]:
    """One page of ids, read off the list's indexes (see Plans above): after `after` (keyset: an
    index seek) or, without it, at `offset`."""
    offset = max(0, offset)
    total = _counted(session, filters)
    bound = _counted(session, filters, bound=True) if total is None else total
    if not bound or (after is None and total is not None and offset >= total):
        return []
    rare = _rare_text_rows(session, filters)
    parts: list[ColumnElement[bool]] = []
    if rare is not None:  # a rare text: its index matches, sorted (lib.search)
        base = select(col(_S.id)).select_from(rare)
        conds = filter_conditions(filters, text_form="none")
        index = None
    else:
        base = select(col(_S.id))
        common_text = filters.text and _index_covers(filters)
        text_form = "rows" if _scan_text_rows(session, filters) else "scan" if common_text else "match"
        conds = filter_conditions(filters, text_form=text_form)
        parts = _short_text_walk(session, filters) if filters.sort == "newest" else []
        # SQLite is told which index to read; PostgreSQL chooses by its own statistics, so the
        # choice's range probe and counts would be read for nothing there.
        sqlite = session.get_bind().dialect.name == "sqlite"
        index = _choose_index(session, filters, offset, limit, total, bound or 0) if sqlite else None
    segments = _segments(session, filters, conds, total, index)
    if parts:  # newest first: one segment
        segments = [replace(segments[0], parts=tuple(parts))]
    with _whole_sorts_only(session, filters):
        return _read_page(session, base, filters, segments, offset, limit, after, index)


@contextmanager
def _whole_sorts_only(session: Session, filters: EvaluationFilters) -> Iterator[None]:
    """PostgreSQL, dates and a common text sorted by a gap (`_scan_text_rows`): the page's reads plan
    no incremental sort (the setting is restored after).

    The live list's orders start with `deleted_at` (NULL on every live row: one group), but the
    planner costs an incremental sort on it as many small groups, so it seeks the date range and
    sorts it (last 30 days + a common text by weighted gap: 8,300 rows read, 12-33 ms at 100k)
    instead of walking the gap's index, testing the dates on its entries, until the page (~110
    entries, under 1 ms warm; a common text keeps a fifth of the range). Without that mis-costing the
    planner still seeks and sorts a range small enough to be cheaper (its ordinary sort's cost is
    right). A rare text keeps its plan: the trigram index's few rows, sorted."""
    if filters.sort == "newest" or not _scan_text_rows(session, filters):
        yield
        return
    conn = session.connection()
    was = conn.exec_driver_sql(
        "SELECT current_setting('enable_incremental_sort'), set_config('enable_incremental_sort', 'off', true)"
    ).scalar_one()
    # On an error the setting simply ends with the transaction (set_config's is_local): a restore in
    # a transaction the error aborted would fail, and its error would hide the read's own.
    yield
    conn.exec_driver_sql("SELECT set_config('enable_incremental_sort', %(was)s, true)", {"was": was})


def _read_page(
    session: Session,
    base: Select[Any],
    filters: EvaluationFilters,
    segments: list[_Segment],
    offset: int,
    limit: int,
    after: PageKey | None,
    index: str | None,
) -> list[str]:
    """The page's ids off its segments: after `after` (keyset) or at `offset` (`_page_ids`)."""
    if after is not None:
        return _after_key(session, base, filters, segments, after, limit, index)
    ids: list[str] = []
    start = offset
    for segment in segments:
        if len(ids) >= limit:
            break
        got = _read_segment(session, base, segment, start, limit - len(ids), index)
        ids += got
        if segment is segments[-1] or len(ids) >= limit:
            break
        # The next segment starts where this one ends: `start` counts its rows before the page.
        size = segment.size
        if size is None:
            if got or start == 0:
                size = start + len(got)
            else:
                capped = _walk_hint(base.where(*segment.conds), index).limit(start)
                size = int(session.exec(select(func.count()).select_from(capped.subquery())).one())
        start = max(0, start - size)
    return ids


def _after_key(
    session: Session,
    base: Select[Any],
    filters: EvaluationFilters,
    segments: list[_Segment],
    after: PageKey,
    limit: int,
    index: str | None,
) -> list[str]:
    """The page after `after` (keyset): an index seek to the key, then a walk of `limit` rows."""
    if filters.sort == "newest":
        segment = segments[0]
        conds = [*segment.conds, _before(after)]
        stmt = _ordered(
            base, conds, segment.order, segment.parts, index, descending=True, offset=0, limit=limit
        )
        return list(session.exec(stmt).all())
    # Gap sorts put rows without a gap last: the rest of the gapped rows, then the gapless ones.
    gap = _gap_column(filters.sort)
    gapped, gapless = segments
    ids: list[str] = []
    if after.gap is not None:
        later = or_(gap < after.gap, and_(gap == after.gap, _before(after)))
        stmt = _walk_hint(base.where(*gapped.conds, gap <= after.gap, later), index)
        ids = list(session.exec(stmt.order_by(*(c.desc() for c in gapped.order)).limit(limit)).all())
    if len(ids) < limit:
        stmt = _walk_hint(base.where(*gapless.conds), index)
        if after.gap is None:
            stmt = stmt.where(_before(after))
        stmt = stmt.order_by(*(c.desc() for c in gapless.order)).limit(limit - len(ids))
        ids += session.exec(stmt).all()
    return ids


def fetch_page(
    *,
    session: Session,
    filters: EvaluationFilters,
    offset: int = 0,
    limit: int = 25,
    after: PageKey | None = None,
) -> list[EvaluationRow]:
    """One page of matching evaluations in the chosen order: only `limit` narrow rows leave the database.

    With `after` (the previous page's `page_key`) the page is a keyset seek, whatever its depth;
    `offset` is for a jump to a page whose predecessor was never shown.
    """
    # Deferred join: filter, sort and cut the page on the narrow list index alone (ids only), then
    # read the wide rows of just this page. Sorting full rows would read every match's answer and JSON.
    ids = _page_ids(session, filters, offset, max(1, limit), after)
    if not ids:
        return []
    question = func.substr(col(_S.question), 1, QUESTION_PREVIEW_CHARS).label("question")
    counts = (
        col(_S.judgments_total).label("judged"),
        col(_S.judgments_reviewed).label("reviewed"),
        col(_S.judgments_corrected).label("corrected"),
    )
    stmt = select(*_LIST_COLUMNS, question, *counts).where(col(_S.id).in_(ids))
    found = {r.id: r for r in session.exec(stmt).all()}
    # An id gone between the two reads (deleted) is left out.
    return [EvaluationRow(**found[sid]._mapping) for sid in ids if sid in found]


def list_evaluations(
    *, session: Session, filters: EvaluationFilters, offset: int = 0, limit: int = 25
) -> EvaluationPage:
    """One page of matching evaluations with the total match count."""
    total = count_evaluations(session=session, filters=filters)
    rows = fetch_page(session=session, filters=filters, offset=offset, limit=limit)
    return EvaluationPage(rows=rows, total=total, offset=max(0, offset), limit=limit)


LIST_FRAME_COLUMNS = [f.name for f in fields(EvaluationRow)]


def review_summary(*, judged: int, reviewed: int, corrected: int) -> str | None:
    """One evaluation's review state in words, as the list shows it ("3 of 8 pending", "corrected")."""
    if judged == 0:
        return None
    if reviewed < judged:
        return f"{judged - reviewed} of {judged} pending"
    return f"{corrected} corrected" if corrected else "all confirmed"


def evidence_summary(*, evidence: int, unverified: int, unlocated: int) -> str | None:
    """One evaluation's evidence state in words: how many items, and which could not be verified/located."""
    if evidence == 0:
        return None
    problems = [f"{n} {what}" for n, what in ((unverified, "unverified"), (unlocated, "unlocated")) if n]
    return f"{evidence} ({', '.join(problems)})" if problems else f"{evidence} verified"


# The list's columns in reading order: what opens the row, what it is, how far judge and reviewer
# are apart and how far the review got come first, so they fit a 1400 px window; the rest follows.
LIST_DISPLAY_COLUMNS = [
    "open", "title", "max_gap", "weighted_gap", "review", "reviewed_share", "product", "language",
    "evidence", "created_at", "model", "category", "judge_meta_score", "id",
]  # fmt: skip


def list_display_frame(rows: Sequence[EvaluationRow]) -> pd.DataFrame:
    """The list rows as reviewers read them: a link to the detail, the question's first line as the
    title, gaps, review and evidence state in words; missing values stay missing (shown as "—")."""
    return pd.DataFrame(
        [
            {
                "open": evaluation_url(r.id),
                "title": evaluation_title(r.question),
                "max_gap": r.max_gap,
                "weighted_gap": r.weighted_gap,
                "review": review_summary(judged=r.judged, reviewed=r.reviewed, corrected=r.corrected),
                "reviewed_share": r.reviewed / r.judged if r.judged else None,
                "product": r.product,
                "language": r.language,
                "evidence": evidence_summary(
                    evidence=r.evidence, unverified=r.unverified, unlocated=r.unlocated
                ),
                "created_at": r.created_at,
                "model": r.model,
                "category": r.category,
                "judge_meta_score": r.judge_meta_score,
                "id": r.id,
            }
            for r in rows
        ],
        columns=LIST_DISPLAY_COLUMNS,
    )


# ---------------------------------------------------------------------------------------------
# Export of every match (the CSV download): streamed, never a frame


EXPORT_FORMS: dict[str, str] = {
    "wide": "one row per evaluation: per metric the user's score, the judge's score, the gap and the "
    "reviewer's decision",
    "long": "one row per judgment",
}
# Rows fetched from the database at a time: the export's memory is one batch, whatever the match count.
EXPORT_BATCH_ROWS = 2_500
# The three roles named by lib.display's rule (issue 25): the evaluated user's score, the judge's
# score, the reviewer's decision, each with its reason.
LONG_EXPORT_COLUMNS = [
    "id",
    "created_at",
    "product",
    "language",
    "model",
    "category",
    "question",
    "answer",
    "metric",
    role_field("user", "score"),
    role_field("user", "reason"),
    role_field("judge", "score"),
    role_field("judge", "reason"),
    "gap",
    role_field("reviewer", "decision"),
    role_field("reviewer", "reason"),
    REVIEWED_BY,
    "reviewed_at",
    "was_corrected",
    "change_id",
    "judge_version",  # the judge version whose decision the judge score is (lib.judge_versions)
]
# Per metric in the wide form: whose score, then how far user and judge are apart.
WIDE_METRIC_FIELDS = (
    role_field("user", "score"),
    role_field("judge", "score"),
    "gap",
    role_field("reviewer", "decision"),
)


@dataclass(frozen=True)
class EvaluationExport:
    """The header and the lazily fetched rows of an export, as batches of columns (typed Arrow
    arrays or Python values, what `lib.csv_text.csv_batch` writes), and `rules`: the columns whose
    values go through a rule before they are written (a decision's number or label). Iterate
    `batches` or `rows` inside the session."""

    columns: list[str]
    batches: Iterator[Sequence[Any]]
    rules: Mapping[int, Callable[[Any], Any]] = field(default_factory=dict)

    @property
    def rows(self) -> Iterator[tuple[Any, ...]]:
        """The same rows as tuples of Python values (each `rules` applied), for callers that want them."""
        for batch in self.batches:
            columns = [c.to_pylist() if isinstance(c, pa.Array) else list(c) for c in batch]
            for index, rule in self.rules.items():
                columns[index] = [rule(v) for v in columns[index]]
            yield from zip(*columns, strict=True)


def export_metrics(*, session: Session, filters: EvaluationFilters) -> list[str]:
    """The metrics the wide form has columns for: the rubrics in scope plus every metric judged."""
    options = filter_options(session=session, product=filters.product)
    slugs = dict.fromkeys(options.metrics)
    products = [filters.product] if filters.product else options.products
    for slug in distinct_metrics(session=session, products=products):
        slugs.setdefault(slug)
    return list(slugs)


def _scores(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _gap(user: float | None, judge: float | None) -> float | None:
    """|user − judge| on the metric's own scale, as the detail card shows it."""
    return abs(user - judge) if user is not None and judge is not None else None


def _stream(session: Session, stmt: Select[Any]) -> Iterator[Any]:
    yield from session.execute(stmt.execution_options(yield_per=EXPORT_BATCH_ROWS))


def _batches(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while batch := list(itertools.islice(rows, size)):
        yield batch


# The reviewed decisions of a batch of evaluations, handed over as ONE parameter (a JSON array of
# their ids) rather than a bind per id, and read through the driver's own cursor: neither SQLAlchemy
# nor the driver processes thousands of parameters per batch, and no Row is built per decision
# (together half the cost of this read). Each row names its evaluation by its position in the
# array, and comes in review order (ix_judgment_snapshot_state's order, then the id), so a later
# review of the same metric comes last. SQLite walks the array first (CROSS JOIN) and seeks the
# index once per id; PostgreSQL unnests it WITH ORDINALITY. Written in each driver's paramstyle.
_DECISIONS_SQL = {
    "sqlite": (
        "SELECT e.key AS at, j.metric, j.user_decision FROM json_each(:ids) AS e "
        "CROSS JOIN judgments AS j ON j.snapshot_id = e.value "
        "WHERE j.reviewed_at IS NOT NULL AND j.metric IS NOT NULL AND j.user_decision IS NOT NULL "
        "ORDER BY e.key, j.reviewed_at, j.was_corrected, j.metric, j.id"
    ),
    "postgresql": (
        "SELECT e.at - 1 AS at, j.metric, j.user_decision "
        "FROM json_array_elements_text(CAST(%(ids)s AS json)) WITH ORDINALITY AS e(value, at) "
        "JOIN judgments AS j ON j.snapshot_id = e.value "
        "WHERE j.reviewed_at IS NOT NULL AND j.metric IS NOT NULL AND j.user_decision IS NOT NULL "
        "ORDER BY e.at, j.reviewed_at, j.was_corrected, j.metric, j.id"
    ),
}


def _read_decisions(conn: Any, ids: Sequence[str]) -> list[tuple[int, str, str]]:
    """(position in `ids`, metric, decision) of every reviewed judgment of these evaluations, in
    review order: one indexed read per export batch, inside `conn`'s transaction."""
    cursor = conn.connection.driver_connection.cursor()
    try:
        cursor.execute(_DECISIONS_SQL[conn.dialect.name], {"ids": json.dumps(list(ids))})
        return cursor.fetchall()
    finally:
        cursor.close()


def _reviewer_decisions(session: Session, snapshot_ids: Sequence[str]) -> dict[tuple[str, str], str]:
    """{(snapshot id, metric): the reviewer's decision} for the reviewed judgments of these
    evaluations (the last review of a metric wins)."""
    found = _read_decisions(session.connection(), snapshot_ids)
    return {(snapshot_ids[at], metric): decision for at, metric, decision in found}


def _decision_columns(conn: Any, ids: Sequence[str], slugs: Sequence[str]) -> list[pa.Array]:
    """Per slug, the reviewer's decision of each evaluation in `ids` (as `_reviewer_decisions`
    gives it: the last review wins), pivoted for all slugs at once by Arrow kernels: each decision's
    cell (slug, position) is looked up among the cells read last first, so the first match is the
    last review."""
    found = _read_decisions(conn, ids)
    types = (pa.int64(), pa.string(), pa.string())
    values = list(zip(*found, strict=True)) if found else [(), (), ()]
    at, metrics, decisions = (pa.array(v, t) for v, t in zip(values, types, strict=True))
    n = len(ids)
    slug_at = pc.index_in(metrics, value_set=pa.array(list(slugs), pa.string()))  # null: no column
    cells = pc.add(pc.multiply(slug_at.cast(pa.int64()), n), at)
    last_first = pa.array(np.arange(len(cells) - 1, -1, -1, dtype=np.int64))
    cells, decisions = pc.take(cells, last_first), pc.take(decisions, last_first)
    grid = pc.take(
        decisions, pc.index_in(pa.array(np.arange(len(slugs) * n, dtype=np.int64)), value_set=cells)
    )
    return [grid.slice(i * n, n) for i in range(len(slugs))]


def _wide_select(filters: EvaluationFilters, **replaced: Any) -> Select[Any]:
    """The list's SQL (filters, order: one definition) with what the wide form reads of each row;
    `replaced` swaps a column's expression by its label (e.g. a time read as text)."""
    columns = [
        *_LIST_COLUMNS,
        col(_S.question).label("question"),
        col(_S.judgments_total).label("judged"),  # the counters lib.counters keeps on write
        col(_S.judgments_reviewed).label("reviewed"),
        col(_S.judgments_corrected).label("corrected"),
        col(_S.model_answer).label("answer"),
        cast(col(_S.user_scores_json), Text).label("user_scores"),  # JSON text, not decoded per row
        cast(col(_S.judge_scores_json), Text).label("judge_scores"),
        col(_S.judge_version_id).label("judge_version_id"),
    ]
    stmt = _list_select(filters).with_only_columns(
        *[replaced[c.name].label(c.name) if c.name in replaced else c for c in columns]
    )
    # The archived list is a short range at the head of the list index (deleted_at leads it): SQLite
    # otherwise walks the whole created_at index reading every row to test deleted_at (1M reads).
    return _walk_hint(stmt, ORDER_INDEXES["newest"]) if filters.archived else stmt


def _wide_batches(session: Session, filters: EvaluationFilters, slugs: Sequence[str]) -> Iterator[list[Any]]:
    """The wide export a batch at a time, column by column, in the app's own session: the list's
    SQL read through the driver without per-row conversions, times parsed by Arrow, scores read
    from the JSON by `metrics.scores_of_json`, decisions pivoted by `_decision_columns`."""
    stmt = _wide_select(filters, created_at=type_coerce(col(_S.created_at), String))  # no per-row parsing
    versions = judge_versions.names_of(session)
    conn = session.connection()  # Core rows: no ORM row processing
    result = conn.execute(stmt.execution_options(yield_per=EXPORT_BATCH_ROWS))
    names = list(result.keys())
    con = duckdb.connect(config={"threads": 1})  # in memory: reads the batch's JSON, never the app database
    try:
        for part in result.partitions():
            values = dict(zip(names, zip(*part, strict=True), strict=True))
            user = scores_of_json(con, pa.array(values["user_scores"], pa.string()), slugs)
            judge = scores_of_json(con, pa.array(values["judge_scores"], pa.string()), slugs)
            decided = _decision_columns(conn, values["id"], slugs)
            yield wide_columns(values, LIST_FRAME_COLUMNS, user, judge, decided, versions)
    finally:
        con.close()


# ---------------------------------------------------------------------------------------------
# The scanner path of the wide export (issue 27): "Download CSV (all matches)", the CLI and the API
# hand the list's own SQL (`_wide_select`, rendered with its values for the app's dialect) to DuckDB
# in an isolated worker (lib.duck), whose scanner runs it inside the database (`sqlite_query`,
# `postgres_query`): the rows stream in the list's order without crossing a Python driver value by
# value. Each row's reviewer decisions come with it as one JSON object, latest review first: the
# evaluation's `reviewer_decisions`, kept on write by lib.counters (`reviewer_decisions_sql`), so the
# scan reads no judgment. DuckDB cuts it per metric: the first entry of a metric is the last review,
# as `_decision_columns` has it (an evaluation with no reviewed decision holds NULL: no decision).
# SQLite hands every value over as text, with floats at 15 digits: the two gap columns are rendered
# with 20 significant digits, which read back to the same float. Scores, gaps, names and the CSV itself are
# the same functions as the in-session path, so both write the same bytes (tests/test_export_csv.py).

# SQLite's `printf` with this format writes a float with enough digits to read back the same value
# (and 0 for NULL: a missing gap is kept NULL by a CASE around it).
_EXACT_FLOAT_FORMAT = "%!.20g"


def wide_header(slugs: Sequence[str]) -> tuple[list[str], dict[int, Callable[[Any], Any]]]:
    """The wide form's header for these metrics, and its value rules (each decision column's
    number or label, `decision_value`). Raises ValueError for slugs equal up to case (`check_slugs`):
    both paths refuse before the first byte."""
    check_slugs(slugs)
    columns = [*LIST_FRAME_COLUMNS, "answer", "judge_version"]
    for slug in slugs:
        columns += [metric_field(slug, name) for name in WIDE_METRIC_FIELDS]
    first = len(LIST_FRAME_COLUMNS) + 2
    decisions = range(first + len(WIDE_METRIC_FIELDS) - 1, len(columns), len(WIDE_METRIC_FIELDS))
    return columns, dict.fromkeys(decisions, decision_value)


# An export of at least this many evaluations, and at least this share of every stored one, reads
# SQLite's table in file order and sorts the rows (a temporary B-tree on disk) instead of walking the
# list's index and reading each row where it lies: at 1M evaluations the walk's million random page
# reads cost 7 CPU s from a warm page cache but 27 from a cold one (the kernel's work per read), the
# scan and sort 9 and 15 (issue 27; docs/benchmarks.md). Below the size the file is small enough to
# stay cached, and the walk is the cheaper.
EXPORT_SCAN_MIN_ROWS = 200_000
EXPORT_SCAN_SHARE = 0.5


def _exports_most_rows(session: Session, filters: EvaluationFilters) -> bool:
    """Whether the wide export of `filters` should scan and sort (`EXPORT_SCAN_MIN_ROWS`): only
    where the counters say exactly how many rows match, and they are most of the table."""
    if filters.archived:
        return False  # a short range at the head of the list index (`_wide_select`)
    matches = _counted(session, filters)
    if matches is None or matches < EXPORT_SCAN_MIN_ROWS:
        return False
    totals = counters.evaluation_totals_by_product(session=session).values()
    stored = sum(t.evaluations + t.archived for t in totals)  # the scan reads archived rows too
    return matches >= EXPORT_SCAN_SHARE * stored


def wide_scan(*, session: Session, filters: EvaluationFilters) -> WideScan | None:
    """The wide export's scanner plan, or None where the app database has no scanner SQL (then the
    in-session path `export_evaluations` writes it)."""
    dialect = session.get_bind().dialect
    if dialect.name not in RAW_QUERY_FUNCTIONS:
        return None
    replaced: dict[str, Any] = {}
    if dialect.name == "sqlite":
        replaced = {
            label: case((column.is_(None), None), else_=func.printf(_EXACT_FLOAT_FORMAT, column))
            for label, column in (("weighted_gap", _S.weighted_gap), ("max_gap", _S.max_metric_gap))
        }
    stmt = _wide_select(filters, **replaced).add_columns(col(_S.reviewer_decisions).label("decided"))
    if dialect.name == "sqlite" and _exports_most_rows(session, filters):
        stmt = stmt.with_hint(_S, "NOT INDEXED", "sqlite")
    # Values rendered as literals (the scanner takes no parameters); "named" keeps a % a single %.
    literal_dialect = type(dialect)(paramstyle="named")
    literal_dialect.statement_compiler = dialect.statement_compiler  # lib.db's: it renders index hints
    sql = str(stmt.compile(dialect=literal_dialect, compile_kwargs={"literal_binds": True}))
    if "\x00" in sql:
        return None  # a NUL in a filter's text cannot be written into SQL: the in-session path reads it
    slugs = export_metrics(session=session, filters=filters)
    columns, rules = wide_header(slugs)
    return WideScan(
        columns=columns,
        list_columns=LIST_FRAME_COLUMNS,
        slugs=slugs,
        decision_columns=sorted(rules),
        versions=judge_versions.names_of(session),
        sql=sql,
    )


def _long_rows(session: Session, filters: EvaluationFilters) -> Iterator[tuple[Any, ...]]:
    stmt = (
        select(
            col(_S.id),
            col(_S.created_at),
            col(_S.product),
            col(_S.language),
            col(_S.model_name),
            col(_S.category),
            col(_S.question),
            col(_S.model_answer),
            col(_S.user_scores_json),
            col(_J.metric),
            col(_J.decision),
            col(_J.reasoning),
            col(_J.user_decision),
            col(_J.user_reasoning),
            col(_J.reviewer),
            col(_J.reviewed_at),
            col(_J.was_corrected),
            col(_J.change_id),
            col(_J.judge_version_id),
        )
        .select_from(_S)
        .join(_J, col(_J.snapshot_id) == col(_S.id))
        .where(*filter_conditions(filters))
        .order_by(*_order_by(filters.sort), col(_J.metric), col(_J.id))
    )
    names = judge_versions.names_of(session)
    for row in _stream(session, stmt):
        (sid, created, product, language, model, category, question, answer, user, metric, decision,
         reason, reviewer_decision, reviewer_reason, reviewer, reviewed_at, corrected, change_id,
         version_id) = row  # fmt: skip
        judge_score = parse_score(decision)
        entry = _scores(user).get(metric) if metric else None
        user_score = score_of(entry)
        reviewed = reviewed_at is not None  # an imported decision without a review is not one
        yield (
            sid, created, product, language, model, category, question, answer, metric, user_score,
            _reason(entry) or None, judge_score, reason, _gap(user_score, judge_score),
            decision_value(reviewer_decision) if reviewed else None,
            reviewer_reason if reviewed else None, reviewer, reviewed_at, bool(corrected), change_id,
            name_for(version_id, names),
        )  # fmt: skip


def export_evaluations(
    *, session: Session, filters: EvaluationFilters, form: str = "wide"
) -> EvaluationExport:
    """Every matching evaluation (all pages) in list order, as rows fetched a batch at a time.

    Columns follow lib.display's naming of the three roles. "wide": the list's columns, the
    answer, `judge_version` (the version whose scores the judge columns are, or "unversioned"),
    then per metric `<slug> user_score` (the evaluated user's score, stored with the
    evaluation, as the detail cards show it), `<slug> judge_score`, `<slug> gap` (|user − judge|)
    and `<slug> reviewer_decision` (empty until a reviewer confirms or overrules it). "long": one
    row per judgment with the same three roles, their reasons, the gap and who reviewed it when.
    Memory is one batch, never every match.
    """
    if form not in EXPORT_FORMS:
        raise ValueError(f"unknown export form {form!r}; choose one of: {', '.join(EXPORT_FORMS)}")
    if form == "long":
        rows = _long_rows(session, filters)
        return EvaluationExport(
            columns=list(LONG_EXPORT_COLUMNS),
            batches=(list(zip(*batch, strict=True)) for batch in _batches(rows, EXPORT_BATCH_ROWS)),
        )
    slugs = export_metrics(session=session, filters=filters)
    columns, rules = wide_header(slugs)
    return EvaluationExport(columns=columns, batches=_wide_batches(session, filters, slugs), rules=rules)


def _distinct_values(session: Session, column: str) -> list[str]:
    """Distinct live values of an indexed column by a loose index scan: one index probe per value.

    `SELECT DISTINCT` reads the whole index (PostgreSQL has no skip scan); this recursive walk asks
    the index for the next larger value instead, so the cost grows with the number of values, not rows.
    """
    if column not in FILTER_OPTION_COLUMNS:
        raise ValueError(f"not a filter column: {column!r}")
    sql = text(
        f"""
        WITH RECURSIVE walk(value) AS (
            SELECT (SELECT MIN({column}) FROM evaluation_snapshots)
            UNION ALL
            SELECT (SELECT MIN({column}) FROM evaluation_snapshots WHERE {column} > walk.value)
            FROM walk WHERE walk.value IS NOT NULL
        )
        SELECT value FROM walk WHERE value IS NOT NULL
        """  # the column name comes from the whitelist above, never from input
    )
    return [str(v) for (v,) in session.connection().execute(sql).all()]


def distinct_languages(*, session: Session) -> list[str]:
    """Every language of a stored evaluation (live or archived), sorted: one index probe per language."""
    return _distinct_values(session, "language")


@dataclass(frozen=True)
class FilterOptions:
    """The values the filter selectboxes offer."""

    products: list[str] = field(default_factory=list)
    languages: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)  # slug -> display name


def filter_options(*, session: Session, product: str | None = None) -> FilterOptions:
    """Distinct products, languages, models and categories, and the metrics a product can be judged on.

    Values of archived rows are offered too: the "Show archived" list filters with the same boxes.
    """
    products = _distinct_values(session, "product")
    slugs: dict[str, str] = {}
    if product:
        specs = metrics_for_product(session=session, product=product)
    else:
        # Two queries whatever the number of products: every defined rubric, plus the default set
        # when some product has none of its own.
        rows = session.exec(
            select(MetricDefinition).order_by(col(MetricDefinition.position), col(MetricDefinition.id))
        ).all()
        defined = {row.product for row in rows}
        specs = list(DEFAULT_METRICS) if not products or set(products) - defined else []
        specs += [MetricSpec(slug=row.slug, display_name=row.display_name) for row in rows]
    for spec in specs:
        slugs.setdefault(spec.slug, spec.display_name)
    return FilterOptions(
        products=products,
        languages=_distinct_values(session, "language"),
        models=_distinct_values(session, "model_name"),
        categories=_distinct_values(session, "category"),
        metrics=slugs,
    )


# ---------------------------------------------------------------------------------------------
# Detail


@dataclass(frozen=True)
class MetricCard:
    """Everything a metric card shows: both scores on the metric's own scale, reasons, evidence."""

    spec: MetricSpec
    user_score: float | None
    judge_score: float | None
    user_reason: str
    judge_reason: str
    evidence: tuple[EvidenceItem, ...]
    role: Literal["primary", "bonus"] | None
    in_rubric: bool = True
    judgment: Judgment | None = None

    @property
    def gap(self) -> float | None:
        """|user − judge| on the metric's own scale (what the card shows)."""
        if self.user_score is None or self.judge_score is None:
            return None
        return abs(self.user_score - self.judge_score)

    @property
    def rescaled_gap(self) -> float | None:
        """The gap rescaled to 1–5, so cards on different scales sort fairly."""
        if self.user_score is None or self.judge_score is None:
            return None
        return self.spec.rescaled_gap(self.user_score, self.judge_score)


@dataclass(frozen=True)
class EvaluationDetail:
    """One evaluation as the detail view shows it."""

    snapshot: EvaluationSnapshot
    cards: list[MetricCard]
    spans: list[Span]
    has_evidence: bool

    @property
    def archived(self) -> bool:
        return self.snapshot.deleted_at is not None

    @property
    def labels(self) -> dict[str, str]:
        return {card.spec.slug: card.spec.display_name for card in self.cards}

    @property
    def highlighted_metrics(self) -> list[str]:
        """Metrics with at least one highlight, in card order (for the legend)."""
        used = {span.metric for span in self.spans}
        return [card.spec.slug for card in self.cards if card.spec.slug in used]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _reason(entry: Any) -> str:
    return _text(entry.get("reason")) if isinstance(entry, Mapping) else ""


def _card_sort_key(indexed: tuple[int, MetricCard]) -> tuple[int, float, int]:
    position, card = indexed
    gap = card.rescaled_gap
    # Largest gap first; cards without a gap (a side did not score) after all others, in rubric order.
    return (1, 0.0, position) if gap is None else (0, -gap, position)


def build_cards(
    snapshot: EvaluationSnapshot,
    metrics: Sequence[MetricSpec],
    judgments: Sequence[Judgment] = (),
    judged_under: Sequence[MetricSpec] = (),
) -> list[MetricCard]:
    """A card per rubric metric (plus any metric the data holds beyond the rubric), largest gap first.

    A metric the rubric no longer names (removed by a rubric edit) keeps the display name and scale
    of `judged_under`, the rubric of the judge version that judged the evaluation, when it has them.
    """
    user = snapshot.user_scores_json if isinstance(snapshot.user_scores_json, Mapping) else {}
    judge = snapshot.judge_scores_json if isinstance(snapshot.judge_scores_json, Mapping) else {}
    stored = snapshot.evidence_json
    evidence = stored if isinstance(stored, Mapping) else {}
    by_metric = {j.metric: j for j in judgments if j.metric}
    bonus = set(snapshot.bonus_metrics or [])
    specs = list(metrics)
    known = {spec.slug for spec in specs}
    former = {spec.slug: spec for spec in judged_under}
    for slug in dict.fromkeys([*user, *judge, *evidence]):
        if isinstance(slug, str) and slug not in known:
            # Data the rubric no longer names is still shown rather than silently dropped.
            specs.append(former.get(slug) or MetricSpec(slug=slug, display_name=slug))
    cards: list[MetricCard] = []
    for spec in specs:
        entry = metric_entry(stored, spec.slug)
        role: Literal["primary", "bonus"] | None = None
        if spec.slug == snapshot.primary_metric:
            role = "primary"
        elif spec.slug in bonus:
            role = "bonus"
        cards.append(
            MetricCard(
                spec=spec,
                user_score=score_of(user.get(spec.slug)),
                judge_score=score_of(judge.get(spec.slug)),
                user_reason=_reason(user.get(spec.slug)) or _text(entry.get("user_reason")),
                judge_reason=_reason(judge.get(spec.slug)) or _text(entry.get("judge_reason")),
                evidence=evidence_items(snapshot.model_answer, stored, spec.slug),
                role=role,
                in_rubric=spec.slug in known,
                judgment=by_metric.get(spec.slug),
            )
        )
    return [card for _, card in sorted(enumerate(cards), key=_card_sort_key)]


def highlight_spans(cards: Sequence[MetricCard]) -> list[Span]:
    """The evidence that may be painted on the answer: stages 1–3 only (seed 002 UI protocol)."""
    return [
        Span(start=i.start, end=i.end, metric=i.metric, why=i.why, better=i.better, quote=i.quote)
        for card in cards
        for i in card.evidence
        if i.highlighted and i.start is not None and i.end is not None
    ]


def judged_under_rubric(
    session: Session, snapshot: EvaluationSnapshot, metrics: Sequence[MetricSpec]
) -> list[MetricSpec]:
    """The rubric of the version that judged the evaluation, read only when its data holds a metric
    `metrics` (the current rubric) no longer names; [] otherwise, or when unversioned or unstated."""
    known = {spec.slug for spec in metrics}
    held = [
        slug
        for stored in (snapshot.user_scores_json, snapshot.judge_scores_json, snapshot.evidence_json)
        if isinstance(stored, Mapping)
        for slug in stored
    ]
    if not snapshot.judge_version_id or all(slug in known for slug in held):
        return []
    return judge_versions.version_rubric(session, snapshot.judge_version_id)


def load_evaluation(*, session: Session, snapshot_id: str) -> EvaluationDetail | None:
    """One evaluation with its cards and highlights (archived ones too: they can be restored), or None."""
    snapshot = session.get(EvaluationSnapshot, snapshot_id)
    if snapshot is None:
        return None
    judgments = session.exec(select(Judgment).where(col(Judgment.snapshot_id) == snapshot_id)).all()
    metrics = metrics_for_product(session=session, product=snapshot.product)
    cards = build_cards(snapshot, metrics, judgments, judged_under_rubric(session, snapshot, metrics))
    return EvaluationDetail(
        snapshot=snapshot,
        cards=cards,
        spans=highlight_spans(cards),
        has_evidence=any(card.evidence for card in cards),
    )


# ---------------------------------------------------------------------------------------------
# Archive / restore (seed 002 AD-13)


def archive_evaluation(*, session: Session, snapshot_id: str, reviewer: Actor | str) -> bool:
    """Soft-delete an evaluation (deleted_at + status archived); False when it was already archived."""
    name = require_reviewer(reviewer, Permission.ARCHIVE, bind=session)
    now = utcnow()
    stmt = (
        update(_S)
        .where(col(_S.id) == snapshot_id, col(_S.deleted_at).is_(None))
        .values(deleted_at=now, status="archived", status_changed_by=name, status_changed_at=now)
    )
    with counters.snapshots_change(session=session, where=counters.one_evaluation(snapshot_id)):
        changed = session.connection().execute(stmt).rowcount == 1
    if changed:
        scores.set_snapshots_live(session=session, snapshot_ids=[snapshot_id], live=False)
    else:
        _ensure_exists(session, snapshot_id)
    return changed


def restore_evaluation(*, session: Session, snapshot_id: str, reviewer: Actor | str) -> bool:
    """Bring an archived evaluation back into every list; False when it was not archived."""
    name = require_reviewer(reviewer, Permission.ARCHIVE, bind=session)
    now = utcnow()
    # The status before archiving is not kept; a chat that used all its turns is what "completed" means.
    status = case((col(_S.chat_turn_count) >= col(_S.max_chat_turns), "completed"), else_="active")
    stmt = (
        update(_S)
        .where(col(_S.id) == snapshot_id, col(_S.deleted_at).is_not(None))
        .values(deleted_at=None, status=status, status_changed_by=name, status_changed_at=now)
    )
    with counters.snapshots_change(session=session, where=counters.one_evaluation(snapshot_id)):
        changed = session.connection().execute(stmt).rowcount == 1
    if changed:
        scores.set_snapshots_live(session=session, snapshot_ids=[snapshot_id], live=True)
    else:
        _ensure_exists(session, snapshot_id)
    return changed


def _ensure_exists(session: Session, snapshot_id: str) -> None:
    if session.get(EvaluationSnapshot, snapshot_id) is None:
        raise LookupError(f"no evaluation with id {snapshot_id!r}")
