"""Cross-session notes (seed 000): the memory that judge runs leave for each other.

Every judge run (or app process) has a session id; the notes it writes survive restarts and are
shown to later runs through `relevant_notes` + `format_notes_for_prompt`. Reviewers browse, add
and remove them on the Notes page; pipelines use the CLI (`python -m lib notes ...`).

Decisions the seed leaves open, pinned down here (and tested):

- Session ids are `YYYYMMDD_HHMMSS_PID_RANDOM` (UTC clock) with a 6-digit RANDOM, so two runs
  started in the same second by one process still get different ids (the seed example has 3).
- `note_type` is accepted in any case and stored upper case. `language` is stripped and lower
  cased (`"EN"` and `"en"` are one language), at most 10 characters of letters, digits, `-`
  and `_`; `''` means "every language". Queries lower-case the language they are given too.
- `content` is one line: runs of whitespace (newlines included) collapse to one space and control
  characters go, so a note can never forge extra lines in the prompt block. At most
  `MAX_CONTENT_CHARS` characters after that; empty is refused.
- `phelps_code` and `confidence` describe a successful match, so only SUCCESS notes carry them.
  Following the seed's calling convention (`addSessionNote("es", "PATTERN", "...", "", 0.0)`),
  an empty code and a 0.0 confidence on other types mean "absent"; anything else there is refused.
  Confidence is a fraction 0..1.
- Ages in the prompt use the largest whole unit: under an hour in minutes ("0m" for under a
  minute, and for a timestamp in the future), under a day in hours, else in days.
- A confidence prints as c×100 rounded half up ("confidence: 88%"); a SUCCESS note with a code
  but no confidence prints `[<code>, confidence: 0%]` (SPEC §5 has one form for coded notes).
- The four SPEC §5 functions take their leading arguments positionally in the SPEC's order
  (`add_note(session, language, note_type, content, ...)`); the rest are keyword-only.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache, partial
from typing import Any, TypedDict

import pandas as pd
from sqlalchemy import ColumnElement, Engine, Table, and_, delete, false, func, or_, true
from sqlmodel import Session, SQLModel, col, select

from lib import counters, search
from lib.auth import Actor, Permission, authorize, removal_permission
from lib.config import get_settings
from lib.display import TYPE_ICONS, TYPE_LABELS, note_type_label  # noqa: F401  (re-exported)
from lib.models import NOTE_TYPES, SessionNote, TagRelevanceEvent, utcnow
from lib.relevance import pinned_as_of, relevance_for_notes
from lib.search import text_match

log = logging.getLogger(__name__)

# Seed 000: these types are useful whatever the language, so every query includes them.
CROSS_LANGUAGE_TYPES = ("STRATEGY", "PATTERN")
PROMPT_HEADER = "CROSS-SESSION EXPERIENCE NOTES:"
PROMPT_INTRO = "Here are insights from all previous LLM sessions (current and past):"
PROMPT_FOOTER = (
    "Use these cross-session insights to improve your analysis and learn from previous LLM experiences."
)
MAX_CONTENT_CHARS = 2000
MAX_LANGUAGE_CHARS = 10
MAX_CODE_CHARS = 20
MAX_SESSION_ID_CHARS = 100
MAX_CREATED_BY_CHARS = 200
# With tag relevance, this many times `limit` candidates are fetched so filtering cannot starve.
RELEVANCE_POOL_FACTOR = 3

_LANGUAGE_RE = re.compile(r"[a-z0-9_-]*")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_AGE_RE = re.compile(r"\s*(\d{1,7})\s*([mhdw])\s*", re.IGNORECASE)
_AGE_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_MAX_AGE = timedelta(days=36_500)

# Called as relevance(session, note_ids, tags) -> {note_id: (decision, boost)}; decision
# "filtered" drops a note, boost re-ranks it (seed 001). Notes missing from the map stay as they are.
RelevanceHook = Callable[[Session, Sequence[int], Sequence[str]], Mapping[int, tuple[str, float]]]


# --------------------------------------------------------------------------------------------
# Session ids


def new_session_id(*, at: datetime | None = None, pid: int | None = None) -> str:
    """A fresh `YYYYMMDD_HHMMSS_PID_RANDOM` id for one app process or pipeline run."""
    moment = (at or utcnow()).astimezone(UTC)
    return f"{moment:%Y%m%d_%H%M%S}_{os.getpid() if pid is None else pid}_{secrets.randbelow(1_000_000):06d}"


_process_lock = threading.Lock()
_process_session: tuple[int, str] | None = None


def process_session_id() -> str:
    """This process's session id, made on first use (and anew in a forked child)."""
    global _process_session
    with _process_lock:
        pid = os.getpid()
        if _process_session is None or _process_session[0] != pid:
            _process_session = (pid, new_session_id(pid=pid))
        return _process_session[1]


# --------------------------------------------------------------------------------------------
# Validation


def normalize_note_type(note_type: str) -> str:
    """A note type as stored (upper case), or ValueError naming the allowed types."""
    value = str(note_type or "").strip().upper()
    if value not in NOTE_TYPES:
        raise ValueError(f"note type {note_type!r} is not one of {', '.join(NOTE_TYPES)}")
    return value


def normalize_language(language: str | None) -> str:
    """A language as stored: stripped, lower case, '' for every language."""
    value = str(language or "").strip().lower()
    if len(value) > MAX_LANGUAGE_CHARS or not _LANGUAGE_RE.fullmatch(value):
        raise ValueError(
            f"language {language!r} must be at most {MAX_LANGUAGE_CHARS} letters, digits, '-' or '_' "
            "(empty for every language)"
        )
    return value


def clean_content(content: str) -> str:
    """Note text as one line: control characters dropped, whitespace runs collapsed."""
    return " ".join(_CONTROL_RE.sub("", str(content)).split())


def _validate_confidence(confidence: float | None) -> float | None:
    if confidence is None:
        return None
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise ValueError(f"confidence must be a number between 0 and 1, got {confidence!r}")
    value = float(confidence)
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    return value


def _bounded_text(value: str | None, name: str, limit: int) -> str | None:
    text = _CONTROL_RE.sub("", str(value or "")).strip()
    if len(text) > limit:
        raise ValueError(f"{name} is longer than {limit} characters")
    return text or None


@dataclass(frozen=True)
class NoteFields:
    """A note's content fields, cleaned and checked."""

    language: str
    note_type: str
    content: str
    phelps_code: str | None
    confidence: float | None


def validate_note(
    language: str | None,
    note_type: str,
    content: str,
    phelps_code: str | None = None,
    confidence: float | None = None,
) -> NoteFields:
    """The rules every note passes, whoever writes it (reviewer, CLI, judge tool); ValueError says why."""
    kind = normalize_note_type(note_type)
    text = clean_content(content)
    if not text:
        raise ValueError("note content is empty")
    if len(text) > MAX_CONTENT_CHARS:
        raise ValueError(f"note content is longer than {MAX_CONTENT_CHARS} characters ({len(text)})")
    code = _bounded_text(phelps_code, "code", MAX_CODE_CHARS)
    conf = _validate_confidence(confidence)
    if kind != "SUCCESS":
        # The seed's convention: an empty code and a 0.0 confidence mean "absent".
        if code is not None:
            raise ValueError(f"only SUCCESS notes carry a code; this is a {kind} note")
        if conf:
            raise ValueError(f"only SUCCESS notes carry a confidence; this is a {kind} note")
        conf = None
    return NoteFields(normalize_language(language), kind, text, code, conf)


# --------------------------------------------------------------------------------------------
# Writing


def add_note(
    session: Session,
    language: str | None,
    note_type: str,
    content: str,
    phelps_code: str | None = None,
    confidence: float | None = None,
    *,
    session_id: str | None = None,
    created_by: Actor | str | None = None,
    timestamp: datetime | None = None,
) -> SessionNote:
    """Persist one validated note (flushed, so it has an id); the caller's transaction commits it."""
    created_by = authorize(session, created_by, Permission.NOTE).identity or None
    fields = validate_note(language, note_type, content, phelps_code, confidence)
    sid = _bounded_text(session_id, "session id", MAX_SESSION_ID_CHARS) or process_session_id()
    if timestamp is not None and timestamp.utcoffset() is None:
        raise ValueError("timestamp must be timezone-aware")
    note = SessionNote(
        timestamp=(timestamp or utcnow()).astimezone(UTC),
        language=fields.language,
        note_type=fields.note_type,
        content=fields.content,
        phelps_code=fields.phelps_code,
        confidence=fields.confidence,
        session_id=sid,
        created_by=_bounded_text(created_by, "author", MAX_CREATED_BY_CHARS),
    )
    session.add(note)
    session.flush()
    invalidate_notes_cache(session=session)
    return note


# --------------------------------------------------------------------------------------------
# Filters shared by search, counting, the timeline and removal


def _as_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


@dataclass(frozen=True)
class NoteFilter:
    """Filters of the notes list, its counts, the session timeline and removal; None means "any".

    `query` matches content case-insensitively and literally; `note_type` and `language` take one
    value or several (an empty list matches nothing; `language=""` means notes for every language);
    `since` is inclusive and `until` exclusive.
    """

    query: str = ""
    note_type: str | Sequence[str] | None = None
    language: str | Sequence[str] | None = None
    session_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


# The Notes page's Age choices (label: (newer than, older than)), as `NoteFilter.since` / `until`
# relative to now; the page and its benchmark read them here.
AGES: dict[str, tuple[timedelta | None, timedelta | None]] = {
    "Any time": (None, None),
    "Last 24 hours": (timedelta(days=1), None),
    "Last 7 days": (timedelta(days=7), None),
    "Last 30 days": (timedelta(days=30), None),
    "Older than 30 days": (None, timedelta(days=30)),
    "Older than 90 days": (None, timedelta(days=90)),
}


def _filters(session: Session, filters: NoteFilter, *, text_form: str = "match") -> list[ColumnElement[bool]]:
    """The filters as conditions. `text_form`: "match" (the text index where it answers), "scan"
    (the stored text tested row by row, for a walk that stops early) or "none" (the caller starts
    from the text index's rows: `_Plan.source`)."""
    conds: list[ColumnElement[bool]] = []
    query = str(filters.query or "").strip()
    if query and text_form != "none":
        # Unicode-aware, literal; indexed for "match". A walk's or a few sessions' rows ("scan") are
        # each tested (`rows`): on PostgreSQL a LIKE made the planner read the trigram index's matches
        # of a common text (50,000 of 200k notes: 18 ms) to intersect them with a timeline page's 250.
        scan = text_form == "scan"
        conds.append(text_match(SessionNote.__table__, query, scan=scan, rows=scan))
    types = _as_list(filters.note_type)
    if types is not None:
        conds.append(
            col(SessionNote.note_type).in_([normalize_note_type(t) for t in types]) if types else false()
        )
    languages = _as_list(filters.language)
    if languages is not None:
        normalized = [normalize_language(lang) for lang in languages]
        conds.append(col(SessionNote.language).in_(normalized) if normalized else false())
    if filters.session_id is not None:
        conds.append(col(SessionNote.session_id) == filters.session_id)
    if filters.since is not None:
        conds.append(col(SessionNote.timestamp) >= filters.since)
    if filters.until is not None:
        conds.append(col(SessionNote.timestamp) < filters.until)
    return conds


def _newest_first() -> tuple[Any, Any]:
    return col(SessionNote.timestamp).desc(), col(SessionNote.id).desc()


# --------------------------------------------------------------------------------------------
# Plans (issue 27): which index a list, a count or the timeline reads for the filters picked.
#
# Each of the table's four indexes (lib.models, migration 0026) starts with a filter (type,
# language, session, or none: the time walk), continues in list order (newest first) and holds the
# other filter columns. A page walks the index of its most selective equality filter newest first
# (the age is a range of it), tests the other filters on its entries and stops after the page; a
# count reads that index's range. A text is where the rows come from when it is rare (its trigram
# index's few matches, sorted); a common one is tested row by row on the walk, which then finds a
# page within a few entries per row listed (lib.search's rule, as the Evaluations list applies it).

_T: Table = SessionNote.__table__  # type: ignore[attr-defined]
# Which index each leading filter seeks; SQLite is told (INDEXED BY), PostgreSQL picks among them.
NOTE_INDEXES: dict[str, str] = {
    "session_id": "idx_session",
    "note_type": "idx_type",
    "language": "idx_language",
    "timestamp": "idx_timestamp",
}


@dataclass(frozen=True)
class _Plan:
    """How the matching notes are read: `conds` on `source` (the table, or a rare text's index
    matches joined to it) through SQLite's `index` (None: the planner's choice)."""

    conds: list[ColumnElement[bool]]
    index: str | None = None
    source: Any = None

    def select(self, *columns: Any) -> Any:
        stmt = select(*columns)
        if self.source is not None:
            stmt = stmt.select_from(self.source)
        stmt = stmt.where(*self.conds)
        return (
            stmt if self.index is None else stmt.with_hint(SessionNote, f"INDEXED BY {self.index}", "sqlite")
        )


def _single(value: str | Sequence[str] | None) -> bool:
    return value is not None and len(_as_list(value) or []) == 1


def _index_for(filters: NoteFilter) -> str:
    """The index whose leading filter keeps the fewest notes, in the usual case: a session (a few
    notes), one type (of five), one language; else the time walk (an age is its range, several
    types or languages are tested on its entries)."""
    if filters.session_id is not None:
        return NOTE_INDEXES["session_id"]
    if _single(filters.note_type):
        return NOTE_INDEXES["note_type"]
    if _single(filters.language):
        return NOTE_INDEXES["language"]
    return NOTE_INDEXES["timestamp"]


# A deep page of a common text (SQLite): the walk reads each walked note's row to test its text,
# about 5 µs per match skipped when a quarter of the notes match (page 400 of 200k notes: 47 ms). The
# text index's matches, read once (0.2 µs each) and tested on the walk's entries as a set, cost less
# once the page lies deeper than 1/TEXT_SET_DEPTH of the matches (the same page: 19 ms). Page 1
# keeps the walk: a few rows, where the set would read every match.
TEXT_SET_DEPTH = 20


def _plan(session: Session, filters: NoteFilter, *, depth: int = 0) -> _Plan:
    """The plan of a page (`depth`: its offset + limit), a count or the timeline's walk for
    `filters` (see Plans above)."""
    sqlite = session.get_bind().dialect.name == "sqlite"
    index = _index_for(filters) if sqlite else None
    query = str(filters.query or "").strip()
    if query and filters.session_id is None:
        found = search.count_index_matches(
            session=session, table=_T, query=query, limit=search.RARE_MATCHES + 1, for_plan=True
        )
        if found is not None and found <= search.RARE_MATCHES:
            source = search.index_matched_rows(session=session, table=_T, query=query)
            return _Plan(_filters(session, filters, text_form="none"), None, source)
        if found is not None and depth * TEXT_SET_DEPTH > search.RARE_MATCHES:
            most = depth * TEXT_SET_DEPTH
            every = search.count_index_matches(session=session, table=_T, query=query, limit=most + 1)
            if every is not None and every <= most:
                return _Plan(_filters(session, filters, text_form="match"), index)
    # A session's few notes, or a common text: the text is tested on the rows the walk keeps.
    form = "scan" if query and (sqlite or filters.session_id is not None) else "match"
    return _Plan(_filters(session, filters, text_form=form), index)


# --------------------------------------------------------------------------------------------
# Reading


def search_notes(
    session: Session,
    query: str = "",
    note_type: str | Sequence[str] | None = None,
    language: str | Sequence[str] | None = None,
    *,
    filters: NoteFilter | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[SessionNote]:
    """Notes across all sessions whose content contains `query` (case-insensitive, literal), newest first.

    The positional form `search_notes(session, query, note_type, language)` is SPEC §5's; any
    other filter comes as `filters`, which then holds every filter.
    """
    if filters is None:
        filters = NoteFilter(query=query, note_type=note_type, language=language)
    elif (query, note_type, language) != ("", None, None):
        raise TypeError("give the filters as query/note_type/language or as a NoteFilter, not both")
    if limit <= 0:
        return []
    plan = _plan(session, filters, depth=max(0, offset) + limit)
    # Ids first, off the plan's index (an offset skips index entries, not rows), then the page's rows.
    page = plan.select(col(SessionNote.id)).order_by(*_newest_first()).offset(max(0, offset)).limit(limit)
    ids = list(session.exec(page).all())
    if not ids:
        return []
    found = {n.id: n for n in session.exec(select(SessionNote).where(col(SessionNote.id).in_(ids))).all()}
    return [found[i] for i in ids if i in found]


CSV_BATCH_ROWS = 1_000


def iter_note_rows(*, session: Session, filters: NoteFilter = NoteFilter()) -> Iterator[tuple[Any, ...]]:
    """Every note matching `filters` as FRAME_COLUMNS tuples, newest first, a batch at a time.

    For "Download CSV (all matches)": plain rows, not ORM objects, so memory stays one batch and
    the time is the rows' alone, however many notes match.
    """
    stmt = (
        _plan(session, filters)
        .select(*(_T.c[name] for name in FRAME_COLUMNS))
        .order_by(*_newest_first())
        .execution_options(yield_per=CSV_BATCH_ROWS)
    )
    for row in session.execute(stmt):
        yield tuple(row)


def count_cap(filters: NoteFilter) -> int:
    """Where the Notes list's count stops (`count_label` / `count_is_capped` take it too), as the
    Evaluations list's does: a text filter's `counters.TEXT_COUNT_CAP` ("1,000+"; with another
    filter each match is a row read to test the text), else `counters.COUNT_CAP` ("10,000+")."""
    return counters.TEXT_COUNT_CAP if str(filters.query or "").strip() else counters.COUNT_CAP


def count_notes(
    *,
    session: Session,
    filters: NoteFilter = NoteFilter(),
    cap: int | None = None,
) -> int:
    """How many notes `search_notes` would find with the same filters and no limit: exact, or with
    `cap` at most `cap` + 1 (more match: "10,000+", `lib.counters.count_label`).

    From a range of the plan's index (lib.models holds every filter column in each), or a text
    alone counted by its index alone (no row read), or a rare text's matches. A capped count reads at
    most `cap` + 1 matches of that range, and starts from the selective side (issue 27): a text with
    at most `counters.COUNT_CAP` matches is counted from its index, testing the other filters on those
    rows; a commoner one walks the other filters' range, testing the text on its rows, until `cap` + 1
    match (a common text matches within a few rows each). Never every note of a type or an age."""
    limit = EXACT_COUNT if cap is None else max(0, cap) + 1
    query = str(filters.query or "").strip()
    if query and filters == NoteFilter(query=filters.query):
        found = search.count_index_matches(session=session, table=_T, query=query, limit=limit)
        if found is not None:
            return found
    source = None
    if cap is not None and query and filters.session_id is None:
        seek = max(counters.COUNT_CAP, search.RARE_MATCHES)
        found = search.count_index_matches(session=session, table=_T, query=query, limit=seek + 1)
        if found is not None and found <= counters.COUNT_CAP:
            source = search.index_matched_rows(session=session, table=_T, query=query)
    if source is not None:
        plan = _Plan(_filters(session, filters, text_form="none"), None, source)
    else:
        plan = _plan(session, filters)  # reuses the text index's count just taken (for_plan)
    return _count(session, plan, None if cap is None else limit)


def _count(session: Session, plan: _Plan, limit: int | None) -> int:
    """How many notes the plan reads, at most `limit` (a walk that stops there)."""
    ids = plan.select(col(SessionNote.id))
    if limit is not None:
        ids = ids.limit(limit)
    return int(session.exec(select(func.count()).select_from(ids.subquery())).one())


EXACT_COUNT = 2**62  # a limit no count reaches
# Sessions are counted to this many ("1,000+"; the health figure, the timeline): a count reads about
# a session's notes per session counted, so it stays a few thousand index entries at any size.
SESSION_COUNT_CAP = 1_000


def note_languages(*, session: Session) -> list[str]:
    """Every language that has notes ('' first when present), for filter menus.

    One index seek per language (the least one after the last found: a recursive query over the
    language index), not a read of every note: every render of the Notes page asks, and a DISTINCT
    read all 200k entries of the index on PostgreSQL (35 ms at 200k notes; issue 27)."""
    language = col(SessionNote.language)
    found = select(func.min(language).label("language")).cte("languages", recursive=True)
    following = select(func.min(language)).where(language > found.c.language).scalar_subquery()
    found = found.union_all(select(following).where(found.c.language.is_not(None)))
    stmt = select(found.c.language).where(found.c.language.is_not(None)).order_by(found.c.language)
    return list(session.exec(stmt).all())


def _distinct_sessions(plan: _Plan, cap: int | None) -> Any:
    """Count of the distinct sessions of the matching notes, stopped after `cap` + 1 of them: an
    uncapped distinct count reads every matching note (a synthetic 1M notes in 100k sessions on SQLite:
    156 ms, 5.6 ms capped)."""
    distinct = plan.select(col(SessionNote.session_id)).distinct()
    if cap is not None:
        distinct = distinct.limit(max(0, cap) + 1)
    return select(func.count()).select_from(distinct.subquery())


class NotesHealth(TypedDict):
    total_notes: int
    sessions: int
    latest_note: datetime | None


def notes_health(*, session: Session) -> NotesHealth:
    """The seed's health query: how many notes, from how many sessions, and the newest one's time.
    Notes are counted up to `counters.COUNT_CAP` + 1, sessions up to `SESSION_COUNT_CAP` + 1 (shown
    as "10,000+" and "1,000+" by `lib.counters.count_label`): every render of the Notes page and the
    Overview reads these, so they read a bounded stretch of an index however many notes exist
    (issue 27; an exact count read all 200k entries of an index, 2.4 ms on SQLite, 60-100 ms on
    PostgreSQL, which counts by reading index entries and their visibility)."""
    # Three scalar subqueries, not one SELECT: each is then answered from its own index (count,
    # distinct sessions, newest time) instead of one scan of the table rows (5x faster at 10k notes).
    every = _Plan([], NOTE_INDEXES["timestamp"]).select(col(SessionNote.id)).limit(counters.COUNT_CAP + 1)
    total, sessions, latest = session.exec(
        select(
            select(func.count()).select_from(every.subquery()).scalar_subquery(),
            _distinct_sessions(_Plan([], NOTE_INDEXES["session_id"]), SESSION_COUNT_CAP).scalar_subquery(),
            select(func.max(SessionNote.timestamp)).scalar_subquery(),
        )
    ).one()
    return NotesHealth(total_notes=int(total), sessions=int(sessions), latest_note=latest)


@dataclass(frozen=True)
class SessionSummary:
    """One session in the timeline: its notes' count per type and its time span."""

    session_id: str
    notes: int
    first_note: datetime
    last_note: datetime
    counts: dict[str, int] = field(default_factory=dict)


TIMELINE_SCAN_BATCH = 500  # note rows fetched at a time while looking for a timeline page's sessions


def _latest_session_ids(session: Session, plan: _Plan, count: int, *, window: int | None = None) -> list[str]:
    """The first `count` sessions met walking the matching notes newest first (the timestamp index),
    i.e. the sessions with the latest activity, in that order. The walk stops there: it reads the
    notes of the sessions asked for (and of the pages before them), not every note; `window` bounds
    it to that many notes.

    The one ordering rule for sessions (the timeline and the Session menu): by their newest note,
    ties between sessions broken as `_newest_first` breaks them between notes (the newer row first)."""
    if count <= 0:
        return []
    stmt = (
        plan.select(col(SessionNote.session_id))
        .order_by(*_newest_first())
        .execution_options(yield_per=TIMELINE_SCAN_BATCH)
    )
    if window is not None:
        stmt = stmt.limit(max(0, window))
    seen: dict[str, None] = {}
    result = session.execute(stmt)
    try:
        for (session_id,) in result:
            seen.setdefault(session_id, None)
            if len(seen) >= count:
                break
    finally:
        result.close()
    return list(seen)


def session_timeline(
    *,
    session: Session,
    filters: NoteFilter = NoteFilter(),
    limit: int = 50,
    offset: int = 0,
) -> list[SessionSummary]:
    """Sessions with matching notes, latest activity first (their newest matching note), counted
    per type. Finds the page's sessions by walking the notes newest first, then counts only those
    sessions' notes: the work is the sessions shown (and skipped), not every session and note."""
    offset, limit = max(0, offset), max(0, limit)
    wanted = _latest_session_ids(session, _plan(session, filters), offset + limit)[offset:]
    if not wanted:
        return []
    kind = col(SessionNote.note_type)
    stmt = (
        _of_sessions(session, filters, wanted)
        .select(
            col(SessionNote.session_id),
            func.count(),
            func.min(SessionNote.timestamp),
            func.max(SessionNote.timestamp),
            *(func.count().filter(kind == t) for t in NOTE_TYPES),
        )
        .group_by(col(SessionNote.session_id))
    )
    found = {row[0]: row for row in session.exec(stmt).all()}
    return [
        SessionSummary(
            session_id=row[0],
            notes=int(row[1]),
            first_note=row[2],
            last_note=row[3],
            counts={t: int(n) for t, n in zip(NOTE_TYPES, row[4:], strict=True)},
        )
        for row in (found[sid] for sid in wanted if sid in found)
    ]


# Notes read to name the recent sessions of the filter menu. The newest notes lie scattered over the
# table's pages (a page read per note when the cache is cold), so the window stays small.
RECENT_SESSIONS_WINDOW = 300


def recent_session_ids(*, session: Session, limit: int = 100, window: int | None = None) -> list[str]:
    """The sessions of the newest `window` notes, newest activity first, at most `limit`: the
    Session filter's menu. Bounded by `window` however many notes and sessions exist; an older
    session is typed into the menu, opened by link (`/notes?session=<id>`) or paged to on the timeline.
    Ordered as the timeline orders sessions (`_latest_session_ids`)."""
    window = RECENT_SESSIONS_WINDOW if window is None else window  # read now: tests lower it
    return _latest_session_ids(session, _Plan([], NOTE_INDEXES["timestamp"]), limit, window=window)


def _of_sessions(session: Session, filters: NoteFilter, session_ids: Sequence[str]) -> _Plan:
    """The matching notes of a few sessions: their notes off the session index, every filter (a
    text too) tested on them."""
    conds = _filters(session, filters, text_form="scan")
    return _Plan([*conds, col(SessionNote.session_id).in_(list(session_ids))], NOTE_INDEXES["session_id"])


def notes_of_sessions(
    *,
    session: Session,
    session_ids: Sequence[str],
    filters: NoteFilter = NoteFilter(),
    limit: int = 2000,
) -> list[SessionNote]:
    """The notes matching `filters` of these sessions (a timeline page), newest first, at most `limit`."""
    if not session_ids:
        return []
    stmt = _of_sessions(session, filters, session_ids).select(SessionNote)
    return list(session.exec(stmt.order_by(*_newest_first()).limit(max(0, limit))).all())


def count_sessions(
    *,
    session: Session,
    filters: NoteFilter = NoteFilter(),
    cap: int | None = SESSION_COUNT_CAP,
) -> int:
    """How many sessions `session_timeline` would list with the same filters and no limit, counted
    up to `cap` + 1 (a larger result means "more than `cap`": `lib.counters.count_label`).

    Read off the plan's range (the filters' index, or a rare text's matches), each new session
    kept as it comes, and stopped at the `cap` + 1st: about a session's matching notes per session
    counted, so with `SESSION_COUNT_CAP` a few thousand entries at any size (a range of 8,600 notes
    whose sessions were all sorted, or a walk of the session index to 10,001 sessions, grew with the
    notes: issue 27). A common text alone is read off its index's matches in stored order (each
    match's row read once, near the last one read), not the time walk's rows in time order."""
    plan = _plan(session, filters)
    query = str(filters.query or "").strip()
    if plan.source is None and query and filters == NoteFilter(query=filters.query):
        source = search.index_matched_rows(session=session, table=_T, query=query)
        if source is not None:
            plan = _Plan([], None, source)
    return int(session.exec(_distinct_sessions(plan, cap)).one())


# --------------------------------------------------------------------------------------------
# Relevant notes (the seed's query) behind a bounded, multi-process-safe cache


def _relevance_condition(language: str) -> ColumnElement[bool]:
    return or_(
        col(SessionNote.language) == language,
        col(SessionNote.language) == "",
        col(SessionNote.note_type).in_(CROSS_LANGUAGE_TYPES),
    )


def _is_relevant(note: Mapping[str, Any], language: str) -> bool:
    """The seed's WHERE clause, in Python, for notes served from the cache."""
    return note["language"] in (language, "") or note["note_type"] in CROSS_LANGUAGE_TYPES


_NOTE_COLUMNS = tuple(SessionNote.model_fields)
Fingerprint = tuple[int, int | None, datetime | None]


@dataclass(frozen=True)
class _CacheEntry:
    rows: tuple[Mapping[str, Any], ...]  # newest first, plain column values (never shared ORM objects)
    fingerprint: Fingerprint
    complete: bool  # the rows are the whole table


class _RecentNotesCache:
    """The 50 most recent notes per database (seed 000 "Memory Management").

    A hit costs one statement of three index lookups: the number of notes at or after the oldest
    cached timestamp, the highest id and the newest timestamp. Any insert (anywhere) moves the
    highest id; any removal inside the cached window moves the count; so writes by other processes
    or engines are seen. Writes through this module also drop the entry at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _CacheEntry] = {}

    def invalidate(self, key: str | None = None) -> None:
        with self._lock:
            if key is None:
                self._entries.clear()
            else:
                self._entries.pop(key, None)

    def rows(self, session: Session, size: int) -> _CacheEntry:
        """A current entry for the session's database: the cached one if still valid, else reloaded."""
        key = _engine_key(session)
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None and len(entry.rows) <= size:
            since = entry.rows[-1]["timestamp"] if entry.rows else None
            if _fingerprint(session, since) == entry.fingerprint and (
                entry.complete or len(entry.rows) == size
            ):
                return entry
        entry = _load_recent(session, size)
        with self._lock:
            self._entries[key] = entry
        return entry


@cache
def _recent_cache() -> _RecentNotesCache:
    return _RecentNotesCache()


def _engine_key(session: Session) -> str:
    bind = session.get_bind()
    engine: Engine = bind if isinstance(bind, Engine) else bind.engine
    return str(engine.url)  # the password is masked, so the key is safe to log


def invalidate_notes_cache(*, session: Session | None = None) -> None:
    """Drop the cached recent notes (of the session's database, or all) after a write elsewhere."""
    _recent_cache().invalidate(None if session is None else _engine_key(session))


def _fingerprint_columns(oldest: Any) -> tuple[Any, Any, Any]:
    notes: Table = SessionNote.__table__  # type: ignore[attr-defined]
    window = select(func.count()).select_from(notes)
    if oldest is not None:
        window = window.where(notes.c.timestamp >= oldest)
    return (
        window.scalar_subquery().label("fp_count"),
        select(func.max(notes.c.id)).scalar_subquery().label("fp_max_id"),
        select(func.max(notes.c.timestamp)).scalar_subquery().label("fp_max_ts"),
    )


def _fingerprint(session: Session, since: datetime | None) -> Fingerprint:
    count, max_id, max_ts = session.exec(select(*_fingerprint_columns(since))).one()
    return int(count), max_id, max_ts


def _load_recent(session: Session, size: int) -> _CacheEntry:
    """The newest `size` notes and their fingerprint from ONE statement, so both see one snapshot."""
    notes: Table = SessionNote.__table__  # type: ignore[attr-defined]
    recent = select(notes).order_by(notes.c.timestamp.desc(), notes.c.id.desc()).limit(size).cte("recent")
    oldest = select(func.min(recent.c.timestamp)).scalar_subquery()
    fp = select(*_fingerprint_columns(oldest)).subquery("fp")
    stmt = (
        select(fp, *(recent.c[name] for name in _NOTE_COLUMNS))
        .select_from(fp.outerjoin(recent, true()))
        .order_by(recent.c.timestamp.desc(), recent.c.id.desc())
    )
    result = session.exec(stmt).mappings().all()  # type: ignore[call-overload]
    rows = tuple({name: r[name] for name in _NOTE_COLUMNS} for r in result if r["id"] is not None)
    first = result[0]
    fingerprint = (int(first["fp_count"]), first["fp_max_id"], first["fp_max_ts"])
    return _CacheEntry(rows=rows, fingerprint=fingerprint, complete=len(rows) < size)


def _written_by(as_of: datetime | None) -> list[ColumnElement[bool]]:
    """Notes that existed at `as_of` (all when None): the alignment lab's no-leakage rule."""
    return [] if as_of is None else [col(SessionNote.timestamp) <= as_of]


def _seed_query(
    session: Session, language: str, limit: int, as_of: datetime | None = None
) -> list[SessionNote]:
    stmt = (
        select(SessionNote)
        .where(_relevance_condition(language), *_written_by(as_of))
        .order_by(*_newest_first())
        .limit(limit)
    )
    return list(session.exec(stmt).all())


def _relevant_from_cache(session: Session, language: str, limit: int) -> list[SessionNote] | None:
    size = get_settings().notes_cache_size
    if limit > size:
        return None
    entry = _recent_cache().rows(session, size)
    matches = [row for row in entry.rows if _is_relevant(row, language)]
    if len(matches) < limit and not entry.complete:
        return None  # older notes beyond the cached window could still qualify
    return [SessionNote(**dict(row)) for row in matches[:limit]]


def relevant_notes(
    session: Session,
    language: str,
    limit: int | None = None,
    *,
    tags: Sequence[str] = (),
    relevance: RelevanceHook | None = None,
    use_cache: bool = True,
    as_of: datetime | None = None,
) -> list[SessionNote]:
    """Notes to show a judge for this language, newest first (seed 000 query), optionally tag-filtered.

    The seed's rule: notes of this language, notes for every language (''), and STRATEGY/PATTERN
    notes of any language; newest first; at most `limit` (default 20). With `tags`, a larger pool
    is fetched and tag relevance applies (seed 001; `lib.relevance.relevance_for_notes` unless
    another `relevance` hook is given): "filtered" notes are dropped, the rest are re-ranked by
    recency rank + boost, and pinned notes of this language that pass the check come first.
    With `as_of`, only notes written by then count, with the tag relevance and pins recorded by
    then (`lib.relevance`'s `as_of`); the cache is bypassed.
    """
    limit = get_settings().notes_limit if limit is None else int(limit)
    if limit < 1:
        raise ValueError("limit must be at least 1")
    lang = normalize_language(language)
    if tags and relevance is None:
        relevance = partial(relevance_for_notes, as_of=as_of)
    ranked = bool(tags) and relevance is not None
    pool = limit * RELEVANCE_POOL_FACTOR if ranked else limit
    found = _relevant_from_cache(session, lang, pool) if use_cache and as_of is None else None
    notes = found if found is not None else _seed_query(session, lang, pool, as_of)
    if ranked:
        assert relevance is not None
        notes = _rerank(session, notes, list(tags), relevance)
        notes = _pinned_first(session, notes, lang, list(tags), relevance, as_of)
    return notes[:limit]


def _rerank(
    session: Session, notes: list[SessionNote], tags: list[str], hook: RelevanceHook
) -> list[SessionNote]:
    """Drop filtered notes; order the rest by recency (1 … ~0) plus the hook's boost."""
    verdicts = hook(session, [n.id for n in notes if n.id is not None], tags)
    scored: list[tuple[float, int, SessionNote]] = []
    for rank, note in enumerate(notes):
        decision, boost = verdicts.get(note.id or -1, ("neutral", 0.0))
        if decision == "filtered":
            continue
        scored.append((1.0 - rank / len(notes) + float(boost), -rank, note))
    scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return [note for _, _, note in scored]


def _pinned_first(
    session: Session,
    notes: list[SessionNote],
    language: str,
    tags: list[str],
    hook: RelevanceHook,
    as_of: datetime | None = None,
) -> list[SessionNote]:
    """Seed 001: pinned notes are always shown once they pass the language and relevance checks.

    With `as_of`, the notes pinned at that moment (`lib.relevance.pinned_as_of`), not today's: a
    candidate is pinned now or was scored by then (a note unpinned since may have been pinned then).
    """
    pin_condition: ColumnElement[bool] = col(SessionNote.pinned)
    if as_of is not None:
        scored_by_then = select(TagRelevanceEvent.lesson_id).where(col(TagRelevanceEvent.at) <= as_of)
        pin_condition = or_(pin_condition, col(SessionNote.id).in_(scored_by_then))
    stmt = (
        select(SessionNote)
        .where(pin_condition, _relevance_condition(language), *_written_by(as_of))
        .order_by(*_newest_first())
    )
    pinned = list(session.exec(stmt).all())
    if as_of is not None:
        then = pinned_as_of(session=session, notes=pinned, as_of=as_of)
        pinned = [n for n in pinned if n.id in then]
    if not pinned:
        return notes
    listed = {n.id for n in notes}
    extra = [n for n in pinned if n.id not in listed]
    verdicts = hook(session, [n.id for n in extra if n.id is not None], tags) if extra else {}
    passing = {n.id for n in pinned if n.id in listed}
    passing |= {n.id for n in extra if verdicts.get(n.id or -1, ("neutral", 0.0))[0] != "filtered"}
    ranked = [n for n in notes if n.id in passing] + [n for n in extra if n.id in passing]
    return ranked + [n for n in notes if n.id not in passing]


# --------------------------------------------------------------------------------------------
# Removal


def _removal_conditions(
    session: Session,
    *,
    note_type: str | Sequence[str] | None,
    language: str | Sequence[str] | None,
    older_than: timedelta | None,
    session_id: str | None,
    all_notes: bool,
    now: datetime | None,
) -> list[ColumnElement[bool]]:
    if older_than is not None and older_than <= timedelta(0):
        raise ValueError("older_than must be a positive duration")
    until = (now or utcnow()) - older_than if older_than is not None else None
    conds = _filters(
        session, NoteFilter(note_type=note_type, language=language, session_id=session_id, until=until)
    )
    if not conds and not all_notes:
        raise ValueError(
            "refusing to remove every note: give a type, language, session or age (or all_notes=True)"
        )
    return conds


def preview_remove(
    *,
    session: Session,
    note_type: str | Sequence[str] | None = None,
    language: str | Sequence[str] | None = None,
    older_than: timedelta | None = None,
    session_id: str | None = None,
    all_notes: bool = False,
    now: datetime | None = None,
) -> int:
    """How many notes `remove_notes` would delete with the same arguments."""
    conds = _removal_conditions(
        session,
        note_type=note_type,
        language=language,
        older_than=older_than,
        session_id=session_id,
        all_notes=all_notes,
        now=now,
    )
    return int(session.exec(select(func.count()).select_from(SessionNote).where(and_(true(), *conds))).one())


def _dependent_tables() -> list[Table]:
    """Tables whose rows point at a note (tag scores, their history, match counts)."""
    notes = SessionNote.__table__  # type: ignore[attr-defined]
    return [
        table
        for table in SQLModel.metadata.sorted_tables
        if any(fk.column.table is notes for fk in table.foreign_keys)
    ]


def remove_notes(
    session: Session,
    note_type: str | Sequence[str] | None = None,
    language: str | Sequence[str] | None = None,
    older_than: timedelta | None = None,
    *,
    session_id: str | None = None,
    all_notes: bool = False,
    now: datetime | None = None,
    removed_by: Actor | str | None = None,
) -> int:
    """Delete matching notes (and the relevance rows that point at them); returns how many notes went.

    With no filter at all this refuses (ValueError) unless `all_notes=True`. `language=''` means the
    notes written for every language, not "any language" (that is `None`). Removing one session's
    notes needs `lead`; any wider removal is the admin's bulk removal.
    """
    removed_by = authorize(
        session, removed_by, removal_permission(one_session=session_id is not None)
    ).identity
    conds = _removal_conditions(
        session,
        note_type=note_type,
        language=language,
        older_than=older_than,
        session_id=session_id,
        all_notes=all_notes,
        now=now,
    )
    where = and_(true(), *conds)
    doomed = select(SessionNote.id).where(where)
    for table in _dependent_tables():
        for fk in table.foreign_keys:
            if fk.column.table is SessionNote.__table__:  # type: ignore[attr-defined]
                session.exec(delete(table).where(fk.parent.in_(doomed)))
    result = session.exec(delete(SessionNote).where(where).execution_options(synchronize_session="fetch"))
    session.flush()
    invalidate_notes_cache(session=session)
    removed = int(result.rowcount or 0)
    # No table records deletions, so the log is where "who removed what" survives.
    log.info(
        "removed %d notes (type=%r language=%r older_than=%s session=%r all=%s) by %s",
        removed,
        note_type,
        language,
        older_than,
        session_id,
        all_notes,
        removed_by or "unknown",
    )
    return removed


# --------------------------------------------------------------------------------------------
# Presentation


def format_age(delta: timedelta) -> str:
    """An age in its largest whole unit: "45m", "2h", "3d" (anything under a minute is "0m")."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86_400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86_400}d"


def format_confidence(confidence: float) -> str:
    """A 0..1 confidence as a whole percentage, rounded half up ("0.875" → "88%")."""
    return f"{math.floor(round(confidence * 100, 6) + 0.5)}%"


def _aware(moment: datetime) -> datetime:
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def format_note_line(note: SessionNote, *, current_session: str | None, now: datetime) -> str:
    """One prompt line: `<icon> <TYPE> (<age> ago): <content>` plus code and session markers."""
    kind = str(note.note_type).upper()
    line = f"{note_type_label(kind)} ({format_age(now - _aware(note.timestamp))} ago): "
    line += clean_content(note.content)
    if kind == "SUCCESS" and note.phelps_code:
        # SPEC §5 gives a coded SUCCESS note one form only; a missing confidence counts as 0.
        line += f" [{note.phelps_code}, confidence: {format_confidence(note.confidence or 0.0)}]"
    if current_session and note.session_id == current_session:
        line += " [CURRENT SESSION]"
    else:
        line += f" [SESSION: {note.session_id[-8:]}]"
    return line


def format_notes_for_prompt(
    notes: Iterable[SessionNote], current_session: str | None = None, now: datetime | None = None
) -> str:
    """The seed-000 prompt block for these notes, in the order given ("" when there are none).

    `current_session` is the run's own id (its notes say [CURRENT SESSION]); None means this
    process (`process_session_id()`, the id `add_note` stamps by default); "" means no current
    session, so every note names its session, as a brand-new run would see them.
    """
    notes = list(notes)
    if not notes:
        return ""
    if current_session is None:
        current_session = process_session_id()
    moment = _aware(now or utcnow())
    lines = [PROMPT_HEADER, PROMPT_INTRO, ""]
    lines += [format_note_line(n, current_session=current_session, now=moment) for n in notes]
    lines += ["", PROMPT_FOOTER]
    return "\n".join(lines)


FRAME_COLUMNS = (
    "id", "timestamp", "note_type", "language", "content", "phelps_code", "confidence",
    "session_id", "created_by", "pinned",
)  # fmt: skip


def as_frame(notes: Iterable[SessionNote], *, type_labels: bool = False) -> pd.DataFrame:
    """Notes as a table with the seed's column names (what the page shows and the CSV holds).

    `type_labels=True` shows each type with its icon (`note_type_label`), for screens; CSVs and
    the CLI keep the bare type, which is what an import reads back.
    """
    frame = pd.DataFrame(
        [{c: getattr(n, c) for c in FRAME_COLUMNS} for n in notes], columns=list(FRAME_COLUMNS)
    )
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return with_type_labels(frame) if type_labels else frame


def with_type_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of a table to show, its `note_type` column with icons ("💭 TIP"); CSVs keep the bare type."""
    if "note_type" not in frame.columns:
        return frame
    return frame.assign(note_type=frame["note_type"].map(note_type_label))


def timeline_frame(summaries: Iterable[SessionSummary]) -> pd.DataFrame:
    """The session timeline as a table: one row per session, a column per note type."""
    columns = ["session_id", "notes", *NOTE_TYPES, "first_note", "last_note"]
    frame = pd.DataFrame(
        [
            {
                "session_id": s.session_id,
                "notes": s.notes,
                **s.counts,
                "first_note": s.first_note,
                "last_note": s.last_note,
            }
            for s in summaries
        ],
        columns=columns,
    )
    for column in ("first_note", "last_note"):
        frame[column] = pd.to_datetime(frame[column], utc=True)
    return frame


def note_record(note: SessionNote) -> dict[str, Any]:
    """A note as JSON-ready data with the seed-000 column names (the CLI and the import format)."""
    return {
        "id": note.id,
        "timestamp": _aware(note.timestamp).isoformat(),
        "language": note.language,
        "note_type": note.note_type,
        "content": note.content,
        "phelps_code": note.phelps_code,
        "confidence": note.confidence,
        "session_id": note.session_id,
        "created_by": note.created_by,
    }


def parse_age(text: str) -> timedelta:
    """A duration like "30d", "12h", "90m" or "2w" (the seed's `-clean-notes=30d`); ValueError otherwise."""
    match = _AGE_RE.fullmatch(str(text))
    if not match:
        raise ValueError(
            f"invalid age {text!r}: use a whole number and a unit m, h, d or w (e.g. 30d, 12h, 90m)"
        )
    amount = int(match.group(1))
    if amount <= 0:
        raise ValueError(f"invalid age {text!r}: it must be greater than zero")
    age = timedelta(**{_AGE_UNITS[match.group(2).lower()]: amount})
    if age > _MAX_AGE:
        raise ValueError(f"invalid age {text!r}: at most {_MAX_AGE.days} days")
    return age
