"""Notes: the memory that judge runs leave for each other (seed 000), for reviewers to browse.

Note text is untrusted (judge models write most of it): it is only ever shown inside a dataframe
cell or a code block, never as Markdown or HTML. `/notes?session=<id>` opens one session's notes.
"""

import functools
import zlib

import streamlit as st

from lib import export, notes
from lib.auth import Permission, PermissionDenied
from lib.charts import notes_timeline_figure
from lib.config import get_settings
from lib.counters import count_is_capped, count_label
from lib.models import NOTE_TYPES, utcnow
from lib.safe_markdown import escape_markdown
from lib.ui import (
    EMPTY_PAGE_TEXT,
    audit_denied,
    csv_download,
    csv_download_all,
    current_actor,
    flash,
    get_engine,
    pager,
    require_reviewer,
    session_scope,
    show_flash,
)
from lib.ui.tables import check_column, count_column, datetime_column, rate_column, show_table, text_column

ANY = "(any)"
TAB_KEY = "notes_tab"
TABS = ("Notes", "Timeline", "Add a note", "Remove", "Prompt preview")
EVERY_LANGUAGE = "(notes for every language)"
FLASH = "notes_flash"
ADD_ERROR = "notes_add_error"
SIG_KEY = "notes_filter_sig"
PAGE_KEYS = ("notes_page", "notes_timeline_page")
# Widgets in a tab are drawn only while it is open; Streamlit deletes the value of a keyed widget a
# run does not draw, so theirs are kept while the reviewer stays on this page (a draft, the removal
# filters and the page numbers survive a look at another tab).
KEEP = "page"
ADD_DEFAULTS = {
    "notes_add_language": "",
    "notes_add_content": "",
    "notes_add_code": "",
    "notes_add_confidence": None,
}


def _language_label(value: str) -> str:
    return EVERY_LANGUAGE if value == "" else value


def _note_session_id() -> str:
    """Notes a reviewer adds carry one session id per browser session, like a judge run's."""
    return st.session_state.setdefault("notes_session_id", notes.new_session_id())


def _add_note() -> None:
    """Button callback: write the note, then clear the fields (only a callback may reset its widgets)."""
    reviewer = current_actor()
    if reviewer is None:
        return
    state = st.session_state
    try:
        with session_scope() as session:
            notes.add_note(
                session=session,
                language=state["notes_add_language"],
                note_type=state["notes_add_type"],
                content=state["notes_add_content"],
                phelps_code=state["notes_add_code"],
                confidence=state["notes_add_confidence"],
                session_id=_note_session_id(),
                created_by=reviewer,
            )
    except PermissionDenied as exc:
        state[ADD_ERROR] = audit_denied(exc)
        return
    except ValueError as exc:
        state[ADD_ERROR] = str(exc)
        return
    state.update(ADD_DEFAULTS)
    flash(FLASH, "success", "Note added.")


def _remove_notes(filters: dict) -> None:
    """Button callback: remove what the preview counted, with the confirmation reset afterwards."""
    reviewer = current_actor()
    if reviewer is None:
        return
    try:
        with session_scope() as session:
            removed = notes.remove_notes(session=session, removed_by=reviewer, **filters)
    except PermissionDenied as exc:
        flash(FLASH, "error", audit_denied(exc))
        return
    flash(FLASH, "success", f"Removed {removed:,} note{'' if removed == 1 else 's'}.")


st.title("Notes")
st.caption(
    "Cross-session notes: what judge runs learned and left for the next runs. The judge sees the "
    "relevant ones for its language in its prompt (see the prompt preview)."
)
show_flash(FLASH)

with session_scope(read_only=True) as session:
    health = notes.notes_health(session=session)
    languages = notes.note_languages(session=session)
    recent_sessions = notes.recent_session_ids(session=session)

cols = st.columns(3)
# Both counted to a cap (lib.notes.notes_health): "10,000+" notes, "1,000+" sessions.
cols[0].metric("Notes", count_label(health["total_notes"]))
cols[1].metric("Sessions", count_label(health["sessions"], notes.SESSION_COUNT_CAP))
latest = health["latest_note"]
cols[2].metric(
    "Latest note",
    latest.strftime("%Y-%m-%d %H:%M UTC") if latest else "—",
    help=f"{notes.format_age(utcnow() - latest)} ago" if latest else None,
)
if not health["total_notes"]:
    st.info("No notes yet. Judge runs add them as they learn; you can add one in the “Add a note” tab.")

# Filters: shared by the list, the timeline and the CSV.
linked_session = st.query_params.get("session")
if linked_session and linked_session not in recent_sessions:
    recent_sessions.insert(0, linked_session)
if linked_session:
    st.session_state.setdefault("notes_session", linked_session)
query = st.text_input("Search note text", key="notes_query", placeholder="words anywhere in a note")
cols = st.columns(4)
types = cols[0].multiselect(
    "Type", NOTE_TYPES, key="notes_types", placeholder="All types", format_func=notes.note_type_label
)
language = cols[1].selectbox("Language", [ANY, *languages], key="notes_language", format_func=_language_label)
session_choice = cols[2].selectbox(
    "Session",
    [ANY, *recent_sessions],
    key="notes_session",
    accept_new_options=True,  # the menu offers recent sessions; any other id can be typed
    help="The sessions of the latest notes; type another session's id to see its notes.",
)
age_label = cols[3].selectbox("Age", list(notes.AGES), key="notes_age")
newer, older = notes.AGES[age_label]
now = utcnow()
filters = notes.NoteFilter(
    query=query,
    note_type=types or None,
    language=None if language == ANY else language,
    session_id=None if session_choice == ANY else session_choice,
    since=now - newer if newer else None,
    until=now - older if older else None,
)
signature = repr((query, types, language, session_choice, age_label))
if st.session_state.get(SIG_KEY) not in (None, signature):
    for key in PAGE_KEYS:  # new filters: back to the first page
        st.session_state.pop(key, None)
st.session_state[SIG_KEY] = signature

# Only the open tab runs (on_change="rerun"): a render reads what the reviewer looks at, not the
# timeline, removal preview and prompt of hidden tabs as well.
tab_list, tab_timeline, tab_add, tab_remove, tab_prompt = st.tabs(list(TABS), key=TAB_KEY, on_change="rerun")

if tab_list.open:
    with tab_list, session_scope(read_only=True) as session:
        # Counted to a cap, as the Evaluations list is ("10,000+", "1,000+" with a text): an exact
        # count read every note of a type or age, and every row of it with a text (issue 27).
        cap = notes.count_cap(filters)
        total = notes.count_notes(session=session, filters=filters, cap=cap)
        matched = count_label(total, cap)
        st.caption(f"{matched} note{'' if total == 1 else 's'} match")
        if total == 0:
            st.info("No notes match these filters.")
        else:
            offset, limit = pager(
                total, key="notes_page", capped=count_is_capped(total, cap), persist_state=KEEP
            )
            found = notes.search_notes(session=session, limit=limit, offset=offset, filters=filters)
            if found:
                shown = notes.as_frame(found, type_labels=True)
                show_table(
                    shown,
                    key="notes_table",
                    order=[
                        "timestamp",
                        "note_type",
                        "language",
                        "content",
                        "confidence",
                        "pinned",
                        "phelps_code",
                        "session_id",
                        "created_by",
                        "id",
                    ],
                    alt="Notes matching the filters, one page",
                    columns={
                        "timestamp": datetime_column("When (UTC)"),
                        "note_type": text_column("Type"),
                        "language": text_column("Lang."),
                        "content": text_column("Note", width="large"),
                        "confidence": rate_column(
                            "Confidence", help="How sure the judge run was of this note"
                        ),
                        "pinned": check_column("Pinned", help="Shown to every judge run of its language"),
                        "phelps_code": text_column(
                            "Code", help="SUCCESS notes: what the successful judgment decided"
                        ),
                        "session_id": text_column("Session"),
                        "created_by": text_column("Added by"),
                        "id": count_column("Id"),
                    },
                )
            else:  # a capped count ("1,000+") offers a page past the last match, as the Evaluations list does
                st.info(EMPTY_PAGE_TEXT)
            csv_download_all(
                f"Download CSV (all {matched} matches)",
                "notes.csv",
                # Built only when clicked or fetched, streamed from the database a batch at a time.
                chunks=functools.partial(export.notes_csv_chunks, engine=get_engine(), filters=filters),
                data=functools.partial(export.notes_csv_bytes, engine=get_engine(), filters=filters),
                key="notes_csv",
            )

if tab_timeline.open:
    with tab_timeline, session_scope(read_only=True) as session:
        st.caption(
            "Each row is a session (newest on top), a grey span from its first to its last note; each "
            "mark is a note, shaped and coloured by type. Hover a mark to read the note; drag across "
            "the chart to zoom into a session's minutes, double-click to zoom out."
        )
        sessions_total = notes.count_sessions(session=session, filters=filters)
        if sessions_total == 0:
            st.info("No sessions have notes matching these filters.")
        else:
            capped = count_is_capped(sessions_total, notes.SESSION_COUNT_CAP)
            offset, limit = pager(
                sessions_total, key="notes_timeline_page", capped=capped, persist_state=KEEP
            )
            summaries = notes.session_timeline(session=session, limit=limit, offset=offset, filters=filters)
            if not summaries:  # notes removed between the count and this read: no "11–10 of 12"
                st.info(
                    f"No sessions left on page {offset // limit + 1:,}: their notes were removed "
                    "meanwhile. Go back a page or reload."
                )
            else:
                st.caption(
                    f"Showing the latest sessions {offset + 1:,}–{offset + len(summaries):,} of "
                    f"{count_label(sessions_total, notes.SESSION_COUNT_CAP)} (newest activity first); page back "
                    "to look further back."
                )
                timeline = notes.timeline_frame(summaries)
                marks = notes.as_frame(
                    notes.notes_of_sessions(
                        session=session, session_ids=[s.session_id for s in summaries], filters=filters
                    )
                )
                st.plotly_chart(notes_timeline_figure(timeline, marks), key="notes_timeline_chart")
                with st.expander("Notes per session and type (table)"):
                    show_table(
                        timeline,
                        key="notes_timeline_table",
                        columns={
                            "session_id": text_column("Session"),
                            "notes": count_column("Notes"),
                            **{kind: count_column(notes.note_type_label(kind)) for kind in NOTE_TYPES},
                            "first_note": datetime_column("First note (UTC)"),
                            "last_note": datetime_column("Last note (UTC)"),
                        },
                    )
                csv_download(timeline, "note_sessions.csv", key="notes_timeline_csv")

if tab_add.open:
    with tab_add:
        reviewer = require_reviewer("add notes", Permission.NOTE)
        if error := st.session_state.pop(ADD_ERROR, None):
            st.error(escape_markdown(error), icon="⚠️")
        for key, value in {"notes_add_type": "TIP", **ADD_DEFAULTS}.items():
            st.session_state.setdefault(key, value)
        # Plain widgets, not a form: a form's unsent values live only in the browser and vanish when
        # another tab is opened (the hidden tab is not drawn); these reach the server as typed.
        with st.container(key="notes_add_fields"):
            st.selectbox(
                "Type",
                NOTE_TYPES,
                key="notes_add_type",
                format_func=notes.note_type_label,
                persist_state=KEEP,
            )
            st.text_input(
                "Language",
                key="notes_add_language",
                max_chars=notes.MAX_LANGUAGE_CHARS,
                persist_state=KEEP,
                help="A language code such as en or tr; leave empty for a note about every language.",
            )
            st.text_area(
                "Note", key="notes_add_content", max_chars=notes.MAX_CONTENT_CHARS, persist_state=KEEP
            )
            st.text_input(
                "Code (SUCCESS notes only)",
                key="notes_add_code",
                max_chars=notes.MAX_CODE_CHARS,
                persist_state=KEEP,
            )
            st.number_input(
                "Confidence 0–1 (SUCCESS notes only)",
                min_value=0.0,
                max_value=1.0,
                step=0.05,
                key="notes_add_confidence",
                persist_state=KEEP,
            )
            st.button("Add note", key="notes_add_submit", on_click=_add_note, disabled=reviewer is None)

if tab_remove.open:
    with tab_remove:
        st.caption("Remove notes by type, language and age. Their tag-relevance history goes with them.")
        cols = st.columns(3)
        remove_types = cols[0].multiselect(
            "Type",
            NOTE_TYPES,
            key="notes_remove_types",
            placeholder="All types",
            format_func=notes.note_type_label,
            persist_state=KEEP,
        )
        remove_language = cols[1].selectbox(
            "Language",
            [ANY, *languages],
            key="notes_remove_language",
            format_func=_language_label,
            persist_state=KEEP,
        )
        remove_age = cols[2].text_input(
            "Older than", key="notes_remove_age", placeholder="e.g. 30d, 12h, 90m", persist_state=KEEP
        )
        remove_all = st.checkbox("No filter: remove every note", key="notes_remove_all", persist_state=KEEP)
        remove_filters: dict = {
            "note_type": remove_types or None,
            "language": None if remove_language == ANY else remove_language,
            "all_notes": remove_all,
        }
        count: int | None = None
        if not (remove_types or remove_language != ANY or remove_age.strip() or remove_all):
            st.info("Choose a type, a language or an age first (or tick “No filter: remove every note”).")
        else:
            try:
                if remove_age.strip():
                    remove_filters["older_than"] = notes.parse_age(remove_age)
                with session_scope(read_only=True) as session:
                    count = notes.preview_remove(session=session, **remove_filters)
            except ValueError as exc:
                st.warning(escape_markdown(str(exc)), icon="⚠️")
        if count is not None:
            st.metric("Notes that will be removed", f"{count:,}")
            remove_signature = zlib.crc32(
                repr(sorted((k, str(v)) for k, v in remove_filters.items())).encode()
            )
            remover = require_reviewer("remove notes", Permission.REMOVE_NOTES)
            # A new filter gives a new checkbox, so a confirmation never carries over to other notes.
            confirmed = st.checkbox(
                f"Yes, permanently remove these {count:,} notes",
                key=f"notes_remove_confirm_{remove_signature}",
                disabled=count == 0 or remover is None,
            )
            st.button(
                "Remove notes",
                type="primary",
                key="notes_remove_button",
                disabled=not (confirmed and count and remover),
                on_click=_remove_notes,
                args=(remove_filters,),
            )

if tab_prompt.open:
    with tab_prompt:
        st.caption(
            "The notes section of the judge prompt for a language, exactly as a new judge run sees it."
        )
        preview_language = st.text_input(
            "Judge language", value="en", key="notes_preview_language", persist_state=KEEP
        )
        try:
            with session_scope(read_only=True) as session:
                relevant = notes.relevant_notes(session=session, language=preview_language)
        except ValueError as exc:
            st.error(escape_markdown(str(exc)), icon="⚠️")
        else:
            block = notes.format_notes_for_prompt(relevant)
            if block:
                st.code(block, language=None, wrap_lines=True)
                limit = get_settings().notes_limit
                st.caption(
                    f"{len(relevant)} note{'' if len(relevant) == 1 else 's'}; a judge prompt gets at most {limit}."
                )
            else:
                st.info("No relevant notes: this section of the judge prompt is empty for this language.")
