"""Tag-relevance widgets: "was this note useful here?" on an evaluation, and manual pinning.

Writes go through `lib.relevance` and record the reviewer; note text is untrusted, so it is
rendered escaped. Outcomes are flashed across the rerun that refreshes the vote state.
"""

from __future__ import annotations

import streamlit as st

from lib import relevance
from lib.auth import Permission, PermissionDenied
from lib.notes import note_type_label
from lib.safe_markdown import escape_markdown
from lib.ui import (
    audit_denied,
    current_actor,
    current_reviewer,
    denied_reason,
    flash,
    require_reviewer,
    session_scope,
    show_flash,
)

_VOTE_ICON = {"useful": "👍", "not useful": "👎"}


def _vote(key: str, audit_session_id: str, note_id: int, useful: bool) -> None:
    reviewer = current_actor()
    if not reviewer:
        flash(f"{key}_flash", "error", "Enter your name in the sidebar to score notes.")
        return
    try:
        with session_scope() as session:
            update = relevance.record_feedback(
                session=session,
                audit_session_id=audit_session_id,
                note_id=note_id,
                useful=useful,
                reviewer=reviewer,
            )
    except PermissionDenied as exc:
        flash(f"{key}_flash", "error", audit_denied(exc))
        return
    except (relevance.AlreadyRated, relevance.UnknownNote, LookupError, ValueError) as exc:
        flash(f"{key}_flash", "error", str(exc))
        return
    verdict = "useful" if useful else "not useful"
    pin = {"pinned": " It is now auto-pinned.", "unpinned": " Its auto-pin was removed."}.get(
        update.pin or "", ""
    )
    flash(
        f"{key}_flash",
        "success",
        f"Recorded: note #{note_id} was {verdict} here (weight {update.weight:g}).{pin}",
    )


def shown_notes_feedback(snapshot_id: str, *, key: str = "relevance_feedback") -> None:
    """The notes a judge run showed for this evaluation, each with useful / not useful buttons."""
    reviewer = current_reviewer()
    with session_scope(read_only=True) as session:
        shown = relevance.shown_notes_for_snapshot(
            session=session, snapshot_id=snapshot_id, reviewer=reviewer
        )
    st.subheader("Notes shown to this judge run")
    show_flash(f"{key}_flash")
    if not shown:
        st.caption("The judge run of this evaluation showed no cross-session notes.")
        return
    st.caption(
        "Was each note useful for judging this answer? Your answer moves the note's score under this "
        "run's tags (weight 2.0): " + escape_markdown(", ".join(shown[0].env_tags))
    )
    if reviewer is None:
        require_reviewer("score notes", Permission.FEEDBACK)
    denied = denied_reason(Permission.FEEDBACK) if reviewer else None
    if denied:
        st.caption(f"🔒 {escape_markdown(denied)}")
    for item in shown:
        cols = st.columns([6, 1, 1])
        if item.note is None:
            cols[0].caption(f"Note #{item.note_id} was removed since.")
            continue
        avg, evals = item.evidence.avg_score, item.evidence.total_evals
        cols[0].markdown(
            f"`#{item.note_id}` **{note_type_label(item.note.note_type)}** · {escape_markdown(item.note.content)}"
        )
        cols[0].caption(f"avg {avg:+.3f} over {evals} evaluations for these tags")
        if item.vote is not None:
            cols[1].markdown(f"{_VOTE_ICON[item.vote]} {item.vote}")
            continue
        base = f"{key}_{item.audit_session_id}_{item.note_id}"
        cols[1].button(
            "👍 Useful",
            key=f"{base}_useful",
            disabled=reviewer is None or denied is not None,
            on_click=_vote,
            args=(key, item.audit_session_id, item.note_id, True),
        )
        cols[2].button(
            "👎 Not useful",
            key=f"{base}_not_useful",
            disabled=reviewer is None or denied is not None,
            on_click=_vote,
            args=(key, item.audit_session_id, item.note_id, False),
        )


def _pin(key: str, pinned: bool) -> None:
    reviewer = current_actor()
    note_id = st.session_state.get(f"{key}_note")
    if not reviewer:
        flash(f"{key}_flash", "error", "Enter your name in the sidebar to pin or unpin notes.")
        return
    if note_id is None:
        flash(f"{key}_flash", "error", "Enter a note id first.")
        return
    try:
        with session_scope() as session:
            relevance.set_manual_pin(session=session, note_id=int(note_id), pinned=pinned, reviewer=reviewer)
    except PermissionDenied as exc:
        flash(f"{key}_flash", "error", audit_denied(exc))
        return
    except (relevance.UnknownNote, ValueError) as exc:
        flash(f"{key}_flash", "error", str(exc))
        return
    flash(
        f"{key}_flash", "success", f"Note #{int(note_id)} {'pinned' if pinned else 'unpinned'} by {reviewer}."
    )


def manual_pin_controls(*, key: str = "relevance_pin") -> None:
    """Pin or unpin a note by id; a manual pin is never removed automatically."""
    show_flash(f"{key}_flash")
    cols = st.columns([2, 1, 1])
    cols[0].number_input("Note id", min_value=1, step=1, value=None, key=f"{key}_note")
    denied = denied_reason(Permission.NOTE)
    disabled = denied is not None
    cols[1].button("📌 Pin", key=f"{key}_pin", on_click=_pin, args=(key, True), disabled=disabled)
    cols[2].button("Unpin", key=f"{key}_unpin", on_click=_pin, args=(key, False), disabled=disabled)
    if denied:
        st.caption(f"🔒 {escape_markdown(denied)}")
