"""Note tools for the judge (seed 000 "New LLM Functions"): add_note, search_notes, clear_notes.

Stage 1 offers the judge model three OpenAI function tools that mirror the seed's text commands
`ADD_NOTE:type,content[,phelps,confidence]`, `SEARCH_NOTES:query[,type,language]` and
`CLEAR_NOTES:[type],[language],[days_old]`. A server that refuses `tools` (HTTP 400/422 naming
tools), or ignores them (`lib.llm.uses_tools`, probed once per server and model), gets the same
Stage 1 prompt without them plus a paragraph describing the text commands; command lines in a
reply are executed and removed before its JSON is read. Under structured output the commands go
in the reply's `note_commands` list instead (searches need a round trip, so there only add and
clear are run).

Decisions, pinned down here (and tested):

- Session id: the notes a judge run writes carry the run's own id, the snapshot id, which is the
  session id its `SessionAudit` (seed 001) is recorded under. A note can then be traced to the
  evaluation that wrote it, and the Notes page groups a run's notes as one session.
- Atomicity (AD-7): notes are buffered in a `PendingNotes` while the judge works and written only
  after the snapshot was saved, in their own transaction (`save_pending_notes`); a run that fails
  at any stage writes no note. Searches read the database (plus this run's pending notes). A note
  write that fails after the snapshot was saved is logged and never fails the run, like the audit.
- clear_notes clears as seed 000 says ("ClearNotesFunction can clear notes by session, type, or
  age"; "all existing note functions now work cross-session"; `CLEAR_NOTES:[type],[language],
  [days_old]` "clean persistent notes"): the notes matching every filter given, across sessions
  (the notes this run added and stored notes of earlier runs alike). One description,
  `CLEAR_NOTES_DESCRIPTION`, tells the model so in every mode (tools, text commands, structured
  output). Filters combine as on the Notes page (`lib.notes.remove_notes`, the one rule), not as the
  seed's in-memory original (any filter matching), which would remove far more than asked.
- The guard: a judge run never removes more than the Notes page lets the person who started it
  remove. Stored notes of other sessions go only in a run started by someone with the bulk
  removal permission (admin; everyone in open mode); otherwise only the notes this run added are
  taken back, and the model is told why the rest stayed. Never everything: a call without a type,
  language or days_old is refused and changes nothing. In a judge run the removal of stored notes
  is buffered with the run's notes and applied only when the evaluation is saved (AD-7), as of the
  moment it was asked for, checked again then. `days_old` counts whole days; 0 or absent means any
  age.
- Bounds: at most `MAX_NOTES_PER_RUN` notes per run (an exact repeat is acknowledged, not added
  twice), `MAX_CALLS_PER_ROUND` tool calls executed per reply, `SEARCH_RESULT_LIMIT` search hits
  shown, and `max_rounds` tool rounds before the run fails with kind "tool_loop".
- Arguments the model gets wrong (a missing content, an unknown type, a code on a TIP) come back
  to it as "Error: …" text; nothing is raised into the pipeline. A confidence above 1 is read as a
  percentage (90 → 0.9), as `lib.evaluation_layer` reads the seed's confidences.
- For search and clear, an empty or absent `language` means any language; for add_note it means
  the note applies to every language, and absent means the evaluation's language.
- Tool-call arguments that are not JSON make `lib.llm.chat` fail the whole reply; the run then
  falls back to the text commands rather than failing Stage 1.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from lib import llm, notes
from lib.auth import Actor, PermissionDenied, agent_actor, removal_permission
from lib.config import Settings, get_settings
from lib.db import session_scope
from lib.models import NOTE_TYPES, SessionNote, utcnow
from lib.search import normalize_search_text

log = logging.getLogger(__name__)

TOOL_NAMES = ("add_note", "search_notes", "clear_notes")
MAX_NOTES_PER_RUN = 10
MAX_CALLS_PER_ROUND = 8
SEARCH_RESULT_LIMIT = 10
MAX_QUERY_CHARS = 500
DEFAULT_MAX_ROUNDS = 3
AUTHOR_PREFIX = "judge:"

# CLEAR_NOTES in the one wording every mode shows the model (the tool, the text commands, the
# structured reply's `note_commands`), so what it is told is what it does.
CLEAR_NOTES_DESCRIPTION = (
    "removes the notes that match every filter you give (a type, a language, at least days_old days "
    "old) from every session: the notes you added in this run and, when this run was started by an "
    "admin, the stored notes of earlier runs and reviewers too. Give at least one filter: clearing "
    "every note is refused."
)
STORED_CLEAR_DENIED = "removing notes of other sessions needs a judge run started by an admin"

_LANGUAGE_PARAM = {
    "type": "string",
    "description": "A language code such as 'en' or 'tr'; empty or absent for any language.",
}
NOTE_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "add_note",
            "description": (
                "Leave a short lesson for later judge runs (they see recent notes in their prompt): "
                "a pattern you noticed, a strategy that worked, a failure to avoid, a tip. "
                "Saved only if this evaluation is saved."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": list(NOTE_TYPES), "description": "The kind of note."},
                    "content": {"type": "string", "description": "The lesson, one or two sentences."},
                    "phelps_code": {
                        "type": "string",
                        "description": "SUCCESS notes only: the short code the successful judgment is about.",
                    },
                    "confidence": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": 1,
                        "description": "SUCCESS notes only: how sure you are, from 0 to 1.",
                    },
                    "language": {
                        "type": "string",
                        "description": (
                            "The language the note applies to; absent for this evaluation's language, "
                            "empty for every language."
                        ),
                    },
                },
                "required": ["type", "content"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_notes",
            "description": (
                "Search the notes of all sessions (earlier judge runs and reviewers) for a phrase, "
                "newest first."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "Text to find in the notes (case-insensitive); empty matches every note.",
                    },
                    "type": {"type": "string", "enum": list(NOTE_TYPES), "description": "Only this kind."},
                    "language": _LANGUAGE_PARAM,
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "clear_notes",
            "description": "Clear notes: " + CLEAR_NOTES_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": list(NOTE_TYPES), "description": "Only this kind."},
                    "language": _LANGUAGE_PARAM,
                    "days_old": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Only notes at least this many days old; 0 or absent for any age.",
                    },
                },
                "additionalProperties": False,
            },
        },
    },
)

TOOLS_INSTRUCTION = f"""Cross-session notes: you may call search_notes to look up what earlier judge runs
and reviewers noted, and add_note to leave one short lesson that would help a later judge (a
pattern, a strategy, a failure to avoid, a tip). clear_notes {CLEAR_NOTES_DESCRIPTION}
The tools are optional; always finish with the JSON reply."""

TEXT_COMMANDS_INSTRUCTION = f"""Cross-session notes (optional), as command lines of their own:
- ADD_NOTE:<TYPE>,<content>[,<code>,<confidence 0-1>] leaves a lesson for later judge runs; TYPE is
  one of SUCCESS, FAILURE, PATTERN, STRATEGY, TIP; only SUCCESS notes carry a code and confidence.
- SEARCH_NOTES:<query>[,<TYPE>,<language>] looks notes up: reply with only such lines and no JSON,
  and the results come back before you answer.
- CLEAR_NOTES:[<TYPE>],[<language>],[<days_old>] {CLEAR_NOTES_DESCRIPTION}
Put command lines before your JSON; they are removed before the JSON is read."""

_COMMANDS = {"ADD_NOTE": "add_note", "SEARCH_NOTES": "search_notes", "CLEAR_NOTES": "clear_notes"}
_COMMAND_RE = re.compile(
    r"^[ \t]*(?:[-*][ \t]+)?`?(?:\*\*)?(ADD_NOTE|SEARCH_NOTES|CLEAR_NOTES)(?:\*\*)?[ \t]*:(.*?)`?[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*")
_CODE_RE = re.compile(r"\S*")
_LANGUAGE_FIELD_RE = re.compile(r"[A-Za-z0-9_-]*")
_TOOLS_REJECTED_RE = re.compile(r"tool", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# Argument checking


class ToolArgumentError(ValueError):
    """A tool call's arguments the model got wrong; the message goes back to the model."""


def judge_author(model: str) -> str:
    """The `created_by` of notes a judge model writes: "judge:<model>", within the column's width."""
    return f"{AUTHOR_PREFIX}{model}"[: notes.MAX_CREATED_BY_CHARS]


def _text_arg(args: Mapping[str, Any], name: str) -> str | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ToolArgumentError(f"'{name}' must be text, got {type(value).__name__}")
    return str(value)


def _confidence_arg(value: Any) -> float | None:
    """A 0..1 confidence from a number or text ("0.9", "90", "90%"); above 1 is a percentage."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ToolArgumentError("'confidence' must be a number between 0 and 1")
    if isinstance(value, str):
        match = _NUMBER_RE.fullmatch(value)
        if not match:
            raise ToolArgumentError(f"'confidence' must be a number between 0 and 1, got {value!r}")
        number = float(match.group(1)) / (100 if match.group(2) else 1)
    elif isinstance(value, int | float):
        number = float(value)
    else:
        raise ToolArgumentError("'confidence' must be a number between 0 and 1")
    if 1 < number <= 100:
        number /= 100
    if not 0 <= number <= 1:  # NaN fails this too
        raise ToolArgumentError(f"'confidence' must be between 0 and 1, got {value!r}")
    return number


def _filter_language(args: Mapping[str, Any]) -> str | None:
    """A language filter for search and clear: None (any language) when empty or absent."""
    value = _text_arg(args, "language")
    if value is None or not value.strip():
        return None
    try:
        return notes.normalize_language(value)
    except ValueError as exc:
        raise ToolArgumentError(str(exc)) from None


def _filter_type(args: Mapping[str, Any]) -> str | None:
    value = _text_arg(args, "type")
    if value is None or not value.strip():
        return None
    try:
        return notes.normalize_note_type(value)
    except ValueError as exc:
        raise ToolArgumentError(str(exc)) from None


def _days_old(args: Mapping[str, Any]) -> timedelta | None:
    value = args.get("days_old")
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ToolArgumentError(f"'days_old' must be a whole number of days (0 or more), got {value!r}")
    return timedelta(days=value) if value else None


@dataclass(frozen=True)
class PendingNote:
    """A note a judge run added, checked as `lib.notes.add_note` checks it, not yet written."""

    language: str
    note_type: str
    content: str
    phelps_code: str | None
    confidence: float | None
    timestamp: datetime

    def as_session_note(self, session_id: str, created_by: str) -> SessionNote:
        """An unsaved row, so search results and prompt lines format it like a stored note."""
        return SessionNote(
            timestamp=self.timestamp,
            language=self.language,
            note_type=self.note_type,
            content=self.content,
            phelps_code=self.phelps_code,
            confidence=self.confidence,
            session_id=session_id,
            created_by=created_by,
        )


def check_note(args: Mapping[str, Any], *, default_language: str = "") -> PendingNote:
    """add_note's arguments checked by `lib.notes.validate_note`, as `add_note` checks them; ToolArgumentError otherwise."""
    raw_type = _text_arg(args, "type")
    if raw_type is None or not raw_type.strip():
        raise ToolArgumentError(f"'type' is required: one of {', '.join(NOTE_TYPES)}")
    content = _text_arg(args, "content")
    if content is None:
        raise ToolArgumentError("'content' is required: the lesson, one or two sentences")
    # The seed calls the code "phelps"; both names are accepted.
    code = _text_arg(args, "phelps_code") or _text_arg(args, "phelps")
    language = _text_arg(args, "language")
    confidence = _confidence_arg(args.get("confidence"))  # models say "85%"; notes want 0.85
    try:
        f = notes.validate_note(default_language if language is None else language, raw_type, content, code,
                                confidence)  # fmt: skip
    except ValueError as exc:
        raise ToolArgumentError(str(exc)) from None
    return PendingNote(f.language, f.note_type, f.content, f.phelps_code, f.confidence, utcnow())


# --------------------------------------------------------------------------------------------
# The buffer of a run's notes


@dataclass
class PendingNotes:
    """The notes one judge run added, kept until its snapshot is saved (AD-7)."""

    session_id: str
    created_by: str
    language: str = ""
    notes: list[PendingNote] = field(default_factory=list)
    # Removals of stored notes asked for during the run: remove_notes arguments, applied on save.
    clears: list[dict[str, Any]] = field(default_factory=list)
    # Who started the run: its CLEAR_NOTES removes stored notes only as far as they may (None: none).
    acting_for: Actor | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, note: PendingNote) -> tuple[bool, int]:
        """(added, position); an exact repeat of a pending note is not added twice."""
        with self._lock:
            for n, existing in enumerate(self.notes, start=1):
                if _same_note(existing, note):
                    return False, n
            if len(self.notes) >= MAX_NOTES_PER_RUN:
                raise ToolArgumentError(
                    f"this run already added {MAX_NOTES_PER_RUN} notes, the most one run may add"
                )
            self.notes.append(note)
            return True, len(self.notes)

    def remove(self, *, note_type: str | None, language: str | None, older_than: timedelta | None) -> int:
        """Drop this run's matching notes; returns how many went."""
        cutoff = utcnow() - older_than if older_than is not None else None
        with self._lock:
            keep = [n for n in self.notes if not _matches(n, note_type, language, cutoff)]
            removed = len(self.notes) - len(keep)
            self.notes = keep
        return removed

    def matching(self, *, query: str, note_type: str | None, language: str | None) -> list[PendingNote]:
        """This run's notes that a search with these filters would find, newest first."""
        needle = normalize_search_text(query.strip())  # the rule the stored notes' search uses
        with self._lock:
            found = [
                n
                for n in self.notes
                if _matches(n, note_type, language, None) and needle in normalize_search_text(n.content)
            ]
        return found[::-1]

    def save(self, session: Session) -> list[SessionNote]:
        """Apply the run's clears, then write its notes, in the caller's transaction.

        A note add_note refuses is skipped. Clears go first: a note the run added after a clear
        must survive it (those it added before were already dropped from the buffer).
        """
        remover = clearing_actor(self.created_by, self.acting_for)
        for clear in self.clears if remover is not None else ():
            try:
                notes.remove_notes(session=session, removed_by=remover, **clear)
            except PermissionDenied:  # checked when asked for; a role taken away since stops it here
                log.warning("judge run %s: notes not removed: %s", self.session_id, STORED_CLEAR_DENIED)
        saved = []
        for note in list(self.notes):
            try:
                saved.append(
                    notes.add_note(
                        session=session,
                        language=note.language,
                        note_type=note.note_type,
                        content=note.content,
                        phelps_code=note.phelps_code,
                        confidence=note.confidence,
                        session_id=self.session_id,
                        created_by=agent_actor(self.created_by),
                        timestamp=note.timestamp,
                    )
                )
            except ValueError as exc:
                # add_note validates before touching the session, so the transaction stays usable.
                log.warning("judge run %s: note not saved: %s", self.session_id, exc)
        return saved


def clearing_actor(created_by: str, acting_for: Actor | None) -> Actor | None:
    """Who a run's removal of stored notes acts as: its agent, with the starter's role and name, and
    only when that role may remove notes across sessions (the Notes page's bulk removal); else None."""
    if acting_for is None or not acting_for.can(removal_permission(one_session=False)):
        return None
    return agent_actor(f"{created_by} for {acting_for.identity}", role=acting_for.role)


def _same_note(a: PendingNote, b: PendingNote) -> bool:
    return (a.language, a.note_type, a.content, a.phelps_code, a.confidence) == (
        b.language,
        b.note_type,
        b.content,
        b.phelps_code,
        b.confidence,
    )


def _matches(note: PendingNote, note_type: str | None, language: str | None, cutoff: datetime | None) -> bool:
    if note_type is not None and note.note_type != note_type:
        return False
    if language is not None and note.language != language:
        return False
    return cutoff is None or note.timestamp < cutoff


def save_pending_notes(engine: Engine, pending: PendingNotes | None) -> int:
    """After the snapshot is saved: write the run's notes in their own transaction; never fails the run."""
    if pending is None or not (pending.notes or pending.clears):
        return 0
    try:
        with session_scope(engine) as session:
            return len(pending.save(session))
    except SQLAlchemyError:
        # The snapshot is saved; losing a judge's note only means later runs do not see it.
        log.warning("could not save the notes of judge run %s", pending.session_id, exc_info=True)
        return 0


# --------------------------------------------------------------------------------------------
# Executing one call


def execute_tool_call(
    *,
    session: Session | None,
    name: str,
    args: Any,
    session_id: str,
    created_by: str,
    language: str = "",
    pending: PendingNotes | None = None,
    acting_for: Actor | None = None,
) -> str:
    """Run one note tool and return the text the model reads; argument errors come back as text.

    With `pending`, add_note and clear_notes work on the run's buffer (written only on success);
    without it they write in `session` (the caller commits). clear_notes removes stored notes only
    for `acting_for` (the run's starter; `pending.acting_for` with a buffer) allowed to remove notes
    across sessions. search_notes always reads `session` (pass None to search only the pending notes).
    """
    try:
        if not isinstance(args, Mapping):
            raise ToolArgumentError(f"the arguments must be a JSON object, got {type(args).__name__}")
        if name == "add_note":
            return _add(session, args, session_id, created_by, language, pending)
        if name == "search_notes":
            return _search(session, args, session_id, created_by, pending)
        if name == "clear_notes":
            return _clear(session, args, created_by, pending, pending.acting_for if pending else acting_for)
        raise ToolArgumentError(f"there is no tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
    except ToolArgumentError as exc:
        return f"Error: {exc}. Nothing was changed."
    except SQLAlchemyError:
        log.warning("note tool %s failed on the database", name, exc_info=True)
        return "Error: the notes database could not be reached just now. Nothing was changed."


def _add(
    session: Session | None,
    args: Mapping[str, Any],
    session_id: str,
    created_by: str,
    language: str,
    pending: PendingNotes | None,
) -> str:
    note = check_note(args, default_language=language)
    where = f"{note.note_type} note for {repr(note.language) if note.language else 'every language'}"
    if pending is not None:
        added, position = pending.add(note)
        if not added:
            return f"You already added this note in this run (note {position}); it was not added again."
        return f"Added {where} (note {position} of this run); it is saved when this evaluation is saved."
    if session is None:
        raise ToolArgumentError("notes cannot be saved here")
    stored = notes.add_note(
        session=session,
        language=note.language,
        note_type=note.note_type,
        content=note.content,
        phelps_code=note.phelps_code,
        confidence=note.confidence,
        session_id=session_id,
        created_by=agent_actor(created_by),
        timestamp=note.timestamp,
    )
    return f"Saved {where} (#{stored.id})."


def _search(
    session: Session | None,
    args: Mapping[str, Any],
    session_id: str,
    created_by: str,
    pending: PendingNotes | None,
) -> str:
    query = _text_arg(args, "query") or ""
    if len(query) > MAX_QUERY_CHARS:
        raise ToolArgumentError(f"'query' is longer than {MAX_QUERY_CHARS} characters")
    note_type = _filter_type(args)
    language = _filter_language(args)
    mine = [
        n.as_session_note(session_id, created_by)
        for n in (pending.matching(query=query, note_type=note_type, language=language) if pending else [])
    ]
    stored: list[SessionNote] = []
    total = len(mine)
    if session is not None:
        stored = notes.search_notes(
            session=session, query=query, note_type=note_type, language=language, limit=SEARCH_RESULT_LIMIT
        )
        if len(stored) == SEARCH_RESULT_LIMIT:
            total += notes.count_notes(
                session=session, filters=notes.NoteFilter(query=query, note_type=note_type, language=language)
            )
        else:
            total += len(stored)
    shown = (mine + stored)[:SEARCH_RESULT_LIMIT]
    if not shown:
        return "No notes match."
    now = utcnow()
    found = f"Found {total} note{'' if total == 1 else 's'}"
    lines = [f"{found}; the newest {len(shown)}:" if total > len(shown) else f"{found}:"]
    for note in shown:
        line = notes.format_note_line(note, current_session=session_id, now=now)
        lang = f"[{note.language}] " if note.language else "[every language] "
        lines.append(lang + line)
    return "\n".join(lines)


def _clear(
    session: Session | None,
    args: Mapping[str, Any],
    created_by: str,
    pending: PendingNotes | None,
    acting_for: Actor | None,
) -> str:
    """Seed 000 CLEAR_NOTES: by type, language and age, across sessions; never everything, and
    stored notes only as far as the run's starter may remove them on the Notes page."""
    note_type = _filter_type(args)
    language = _filter_language(args)
    older_than = _days_old(args)
    if session is None:
        raise ToolArgumentError("notes cannot be removed here")
    clear = {"note_type": note_type, "language": language, "older_than": older_than, "now": utcnow()}
    try:
        stored = notes.preview_remove(session=session, **clear)  # the Notes page's rule: never everything
    except ValueError as exc:
        raise ToolArgumentError(f"{exc}; give a type, language or days_old") from None
    remover = clearing_actor(created_by, acting_for)
    if pending is None:
        if remover is None:
            raise ToolArgumentError(STORED_CLEAR_DENIED)
        removed = notes.remove_notes(session=session, removed_by=remover, **clear)
        return f"Removed {removed} note{'' if removed == 1 else 's'}."
    own = pending.remove(note_type=note_type, language=language, older_than=older_than)
    mine = f"Removed {own} of the notes you added in this run; "
    if remover is None:
        return (
            f"{mine}{stored} stored note{' of other sessions was' if stored == 1 else 's of other sessions were'} "
            f"left: {STORED_CLEAR_DENIED}."
        )
    with pending._lock:
        pending.clears.append(clear)
    return f"{mine}{stored} stored note{' is' if stored == 1 else 's are'} removed when this evaluation is saved."


# --------------------------------------------------------------------------------------------
# Text commands (servers without tools)


def _field(value: str) -> str | None:
    value = value.strip().strip('"').strip()
    return value or None


def _is_number(value: str) -> bool:
    return bool(_NUMBER_RE.fullmatch(value))


def _add_args(rest: str) -> dict[str, Any]:
    kind, _, body = rest.partition(",")
    args: dict[str, Any] = {"type": kind.strip(), "content": body.strip()}
    # `content[,phelps,confidence]`: content may hold commas, so the optional pair is only peeled
    # off the end when the last field is a number (or empty) and the one before it a bare code.
    parts = body.rsplit(",", 2)
    if (
        len(parts) == 3
        and (not parts[2].strip() or _is_number(parts[2]))
        and _CODE_RE.fullmatch(parts[1].strip())
    ):
        args["content"] = parts[0].strip()
        code, confidence = _field(parts[1]), _field(parts[2])
        if code is not None:
            args["phelps_code"] = code
        if confidence is not None:
            args["confidence"] = confidence
    args["content"] = args["content"].strip('"').strip()
    return args


def _is_type_field(value: str) -> bool:
    return not value.strip() or value.strip().upper() in NOTE_TYPES


def _is_language_field(value: str) -> bool:
    return len(value.strip()) <= notes.MAX_LANGUAGE_CHARS and bool(
        _LANGUAGE_FIELD_RE.fullmatch(value.strip())
    )


def _search_args(rest: str) -> dict[str, Any]:
    # `query[,type,language]`: the query may hold commas, so the filters are read from the end.
    parts = rest.rsplit(",", 2)
    args: dict[str, Any]
    if len(parts) == 3 and _is_type_field(parts[1]) and _is_language_field(parts[2]):
        args = {"query": parts[0], "type": _field(parts[1]), "language": _field(parts[2])}
    elif len(parts) >= 2 and _is_type_field(parts[-1]):
        query, _, kind = rest.rpartition(",")
        args = {"query": query, "type": _field(kind)}
    else:
        args = {"query": rest}
    args["query"] = args["query"].strip().strip('"').strip()
    return {k: v for k, v in args.items() if v is not None}


def _clear_args(rest: str) -> dict[str, Any]:
    # `[type],[language],[days_old]`; extra fields stay in days_old, whose check then names the problem.
    parts = rest.split(",", 2) if rest.strip() else []
    names = ("type", "language", "days_old")
    return {name: value for name, value in zip(names, map(_field, parts), strict=False) if value is not None}


def parse_text_commands(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The seed's ADD_NOTE / SEARCH_NOTES / CLEAR_NOTES lines in a reply, as (tool name, arguments)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for match in _COMMAND_RE.finditer(text or ""):
        name = _COMMANDS[match.group(1).upper()]
        rest = match.group(2).strip()
        if name == "add_note":
            out.append((name, _add_args(rest)))
        elif name == "search_notes":
            out.append((name, _search_args(rest)))
        else:
            out.append((name, _clear_args(rest)))
    return out


def strip_text_commands(text: str) -> str:
    """The reply without its command lines, so only the JSON (and prose) is left to parse."""
    return _COMMAND_RE.sub("", text or "").strip()


# --------------------------------------------------------------------------------------------
# The conversation loop


SessionFactory = Callable[[], AbstractContextManager[Session]]


@dataclass
class ToolRun:
    """What a Stage 1 conversation with note tools produced."""

    text: str  # the final reply, command lines removed
    pending: PendingNotes
    mode: Literal["tools", "text"]
    rounds: int  # tool (or text-command) rounds before the final reply
    finish_reason: str | None
    messages: list[dict[str, Any]]  # the whole conversation, final reply included


def _with_instruction(messages: Sequence[Mapping[str, Any]], instruction: str) -> list[dict[str, Any]]:
    """The messages with the instruction added to the leading system message (one system message only)."""
    sent = [dict(m) for m in messages]
    if sent and sent[0].get("role") == "system" and isinstance(sent[0].get("content"), str):
        sent[0]["content"] = f"{sent[0]['content']}\n\n{instruction}"
    else:
        sent.insert(0, {"role": "system", "content": instruction})
    return sent


def rejects_tools(exc: llm.LLMError) -> bool:
    """Whether a failed request was refused because of `tools` (a server without function calling)."""
    if exc.kind != "request" or exc.status not in (400, 422):
        return False
    cause = exc.__cause__
    detail = f"{getattr(cause, 'message', '')} {json.dumps(getattr(cause, 'body', None), default=str)}"
    return bool(_TOOLS_REJECTED_RE.search(detail if cause is not None else str(exc)))


def _assistant_with_calls(result: llm.ChatResult) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": result.text or None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in result.tool_calls
        ],
    }


NOTE_COMMANDS_INSTRUCTION = f"""Cross-session notes (optional): put command lines in the "note_commands"
list of your JSON reply, at most 3:
- "ADD_NOTE:<TYPE>,<content>[,<code>,<confidence 0-1>]" leaves a lesson for later judge runs; TYPE is
  one of SUCCESS, FAILURE, PATTERN, STRATEGY, TIP; only SUCCESS notes carry a code and confidence.
- "CLEAR_NOTES:[<TYPE>],[<language>],[<days_old>]" {CLEAR_NOTES_DESCRIPTION}
Leave the list empty when you have no lesson worth keeping."""
MAX_JSON_NOTE_COMMANDS = 3


def with_note_commands(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The reply schema plus an optional `note_commands` list (text mode under structured output)."""
    out = dict(schema)
    out["properties"] = {
        **dict(schema.get("properties") or {}),
        "note_commands": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_JSON_NOTE_COMMANDS},
    }
    return out


def _text_instruction(schema: Mapping[str, Any] | None) -> str:
    return TEXT_COMMANDS_INSTRUCTION if schema is None else NOTE_COMMANDS_INSTRUCTION


def _json_note_commands(text: str) -> list[tuple[str, dict[str, Any]]]:
    """ADD_NOTE / CLEAR_NOTES lines from the reply's `note_commands` list (searches need a round trip)."""
    try:
        lines = llm.parse_json_loose(text).get("note_commands")
    except llm.LLMError:
        return []
    if not isinstance(lines, list):
        return []
    picked = [line for line in lines if isinstance(line, str)][:MAX_JSON_NOTE_COMMANDS]
    return [(n, a) for n, a in parse_text_commands("\n".join(picked)) if n != "search_notes"]


def _has_json_object(text: str) -> bool:
    try:
        llm.parse_json_loose(text)
    except llm.LLMError:
        return False
    return True


def run_with_tools(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str,
    session_factory: SessionFactory,
    session_id: str,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    created_by: str | None = None,
    language: str = "",
    settings: Settings | None = None,
    schema: Mapping[str, Any] | None = None,
    purpose: str | None = None,
    acting_for: Actor | None = None,
) -> ToolRun:
    """Chat with the note tools until the model answers with content; text commands when tools are refused.

    Tools are offered only to a server that calls them (`lib.llm.uses_tools`, probed once); one
    that ignores them gets the text commands from the start. `schema` asks every call for
    structured output; in text mode it gains an optional `note_commands` list, since a server that
    enforces the schema leaves no room for command lines around the JSON.

    Tool calls are executed between calls (each in a short session from `session_factory`, never
    held across an LLM call); their writes go to the returned `ToolRun.pending`. A model still
    calling tools after `max_rounds` rounds fails with `LLMError(kind="tool_loop")`. `acting_for`
    is who started the run: its clear_notes removes stored notes only as far as they may.
    """
    settings = settings or get_settings()
    if max_rounds < 0:
        raise ValueError("max_rounds must be 0 or more")
    try:
        default_language = notes.normalize_language(language)
    except ValueError:
        # A language the notes table cannot hold: the judge's notes then apply to every language.
        default_language = ""
    pending = PendingNotes(
        session_id=session_id,
        created_by=created_by or judge_author(model),
        language=default_language,
        acting_for=acting_for,
    )

    def execute(name: str, args: Any) -> str:
        with session_factory() as session:
            return execute_tool_call(
                session=session,
                name=name,
                args=args,
                session_id=session_id,
                created_by=pending.created_by,
                language=pending.language,
                pending=pending,
            )

    mode: Literal["tools", "text"] = "tools" if llm.uses_tools(model=model, settings=settings) else "text"
    conversation = _with_instruction(
        messages, TOOLS_INSTRUCTION if mode == "tools" else _text_instruction(schema)
    )
    rounds = 0
    while True:
        try:
            result = llm.chat(
                conversation,
                model=model,
                tools=NOTE_TOOLS if mode == "tools" else None,
                settings=settings,
                purpose=purpose,
                schema=schema if mode == "tools" or schema is None else with_note_commands(schema),
                json_mode=schema is not None,
            )
        except llm.LLMError as exc:
            # invalid_json from chat() can only be a tool call's arguments: this model's tool use is broken.
            if mode == "tools" and (rejects_tools(exc) or exc.kind == "invalid_json"):
                log.info("note tools unavailable for %s (%s); using text commands", model, exc)
                mode, rounds = "text", 0
                conversation = _with_instruction(messages, _text_instruction(schema))
                continue
            raise
        if result.tool_calls:
            if rounds >= max_rounds:
                raise llm.LLMError(
                    f"The judge was still calling note tools after {max_rounds} rounds instead of answering.",
                    kind="tool_loop",
                )
            rounds += 1
            conversation.append(_assistant_with_calls(result))
            for n, call in enumerate(result.tool_calls):
                content = (
                    execute(call.name, call.arguments)
                    if n < MAX_CALLS_PER_ROUND
                    else f"Error: skipped; at most {MAX_CALLS_PER_ROUND} tool calls are run per reply."
                )
                conversation.append({"role": "tool", "tool_call_id": call.id, "content": content})
            continue
        commands = parse_text_commands(result.text)
        final = strip_text_commands(result.text) if commands else result.text
        commands += _json_note_commands(final)
        conversation.append({"role": "assistant", "content": result.text})
        asks = any(name == "search_notes" for name, _ in commands)
        if commands and asks and not _has_json_object(final) and rounds < max_rounds:
            # A reply of SEARCH_NOTES lines (and no answer yet): give it the results, then ask again.
            rounds += 1
            outcomes = [f"{name} → {execute(name, args)}" for name, args in commands[:MAX_CALLS_PER_ROUND]]
            conversation.append(
                {
                    "role": "user",
                    "content": "Results of your note commands:\n\n"
                    + "\n\n".join(outcomes)
                    + "\n\nNow reply with the JSON object.",
                }
            )
            continue
        for name, args in commands[:MAX_CALLS_PER_ROUND]:
            if name != "search_notes":  # the answer is final; a search now could change nothing
                execute(name, args)
        return ToolRun(
            text=final,
            pending=pending,
            mode=mode,
            rounds=rounds,
            finish_reason=result.finish_reason,
            messages=conversation,
        )
