"""Reusable review widgets: the correction form for one judgment, its audit trail (with Undo), the hook
that puts both into each metric card of the Evaluations detail view, and the review queue's
workspace rows with their keyboard.

The write happens in the submit button's callback, before the script reruns: the callback still
knows which version the reviewer was looking at (kept in session state when the form was drawn),
so a change that landed in between is reported as a conflict instead of being overwritten. The
outcome is kept as a "flash" message that the next run shows. All data text is escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from lib import corrections, review_queue
from lib.auth import Permission, PermissionDenied
from lib.corrections import (
    DecisionScale,
    InvalidDecision,
    JudgmentNotFound,
    MissingReviewer,
    NothingToUndo,
    ReviewConflict,
)
from lib.display import role_label
from lib.models import Judgment, JudgmentEvent
from lib.review_queue import MetricRow, Workspace
from lib.safe_markdown import escape_markdown
from lib.ui import (
    audit_denied,
    csv_download,
    current_actor,
    current_reviewer,
    denied_reason,
    flash,
    session_scope,
    show_flash,
)
from lib.ui.evidence import format_score, render_evidence_list
from lib.ui.tables import datetime_column, show_table, text_column


def _submit(
    action: str,
    *,
    judgment_id: int,
    key: str,
    flash_key: str,
) -> None:
    """Form button callback: write the review as of the version the reviewer saw (kept when the
    form was drawn), then flash the outcome; a saved review clears the reason."""
    seen = st.session_state.get(f"{key}_seen_version")
    reason = str(st.session_state.get(f"{key}_reason") or "")
    value: Any = st.session_state.get(f"{key}_value") if action == "overrule" else None
    version = int(seen) if seen is not None else -1
    if write_review(action, judgment_id, version, decision=value, reason=reason, flash_key=flash_key):
        st.session_state[f"{key}_reason"] = ""


def write_review(
    action: str,
    judgment_id: int,
    version: int,
    *,
    decision: Any = None,
    reason: str = "",
    flash_key: str,
    hint: str = "",
) -> bool:
    """Record one review as of `version` and flash the outcome; True when it was saved.

    The rules (an overrule parses on the scale and differs from the judge, a reason) are
    `record_review`'s: every review button — the detail form and the queue's rows — only passes
    the action and shows what it answers.
    """
    reviewer = current_actor()
    if not reviewer:
        flash(
            flash_key, "warning", "Enter your name in the sidebar first: every review records its reviewer."
        )
        return False
    try:
        with session_scope() as session:
            saved = corrections.record_review(
                session=session,
                judgment_id=judgment_id,
                expected_version=version,
                action=action,
                user_decision=decision,
                reviewer=reviewer,
                reason=reason,
            )
            summary = (
                f"Overruled {saved.change_id}: {saved.decision} → {saved.user_decision}."
                if saved.was_corrected
                else f"Confirmed {saved.change_id}: {saved.decision}."
            )
    except ReviewConflict as exc:
        flash(flash_key, "error", exc.describe())
        return False
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return False
    except (InvalidDecision, MissingReviewer, JudgmentNotFound) as exc:
        flash(flash_key, "error", f"Not saved: {exc}")
        return False
    flash(flash_key, "success", f"{summary} Saved as {reviewer}.{hint}")
    return True


def _review_state_text(judgment: Judgment) -> str | None:
    if judgment.user_decision is None:
        return None
    when = f" on {judgment.reviewed_at:%Y-%m-%d %H:%M} UTC" if judgment.reviewed_at else ""
    who = judgment.reviewer or "an unknown reviewer"
    if judgment.was_corrected:
        text = f"Overruled by {who}{when}: {judgment.decision} → {judgment.user_decision}."
    else:
        text = f"Confirmed by {who}{when}."
    if judgment.user_reasoning:
        text += f" Reason: {judgment.user_reasoning}"
    return text


def _default_value(judgment: Judgment, scale: DecisionScale) -> Any:
    current = judgment.user_decision if judgment.user_decision is not None else judgment.decision
    if not scale.is_score:
        return current if current in scale.labels else scale.labels[0]
    spec = scale.spec
    assert spec is not None
    number = corrections.parse_score(current)
    if number is None:
        number = spec.min_value if abs(spec.min_value) != float("inf") else 0.0
    return min(max(number, spec.min_value), spec.max_value)


def correction_form(
    judgment: Judgment,
    scale: DecisionScale,
    *,
    key: str,
    title: str | None = None,
    user_score: float | None = None,
    flash_key: str | None = None,
    compact: bool = False,
) -> None:
    """Confirm the judge or overrule it (a score on the metric's scale, or a label) with a reason.

    `compact` leaves out what a surrounding metric card already shows (scores, reasoning, state).
    """
    assert judgment.id is not None
    flash_key = flash_key or f"{key}_flash"
    if flash_key == f"{key}_flash":
        show_flash(flash_key)
    if not compact:
        heading = title or (judgment.metric or judgment.change_id)
        st.markdown(f"**{escape_markdown(heading)}** · scale {escape_markdown(scale.describe())}")
        cols = st.columns(3)
        cols[0].metric(role_label("judge", "decision"), judgment.decision)
        if user_score is not None:
            cols[1].metric(role_label("user", "score"), corrections.format_score(user_score))
        if judgment.confidence is not None:
            cols[2].metric("Judge confidence", f"{judgment.confidence:.0%}")
        if judgment.reasoning:
            st.markdown("Judge's reasoning: " + escape_markdown(judgment.reasoning))
        state = _review_state_text(judgment)
        if state:
            st.info(escape_markdown(state), icon="📝")

    callback_kwargs = {
        "judgment_id": judgment.id,
        "key": key,
        "flash_key": flash_key,
    }
    with st.form(key=f"{key}_form", border=True):
        default = _default_value(judgment, scale)
        if scale.is_score:
            spec = scale.spec
            assert spec is not None
            bounded = abs(spec.min_value) != float("inf") and abs(spec.max_value) != float("inf")
            integer = spec.integer_scale and float(default).is_integer()
            st.number_input(
                f"Your score ({scale.describe()})",
                min_value=(int(spec.min_value) if integer else spec.min_value) if bounded else None,
                max_value=(int(spec.max_value) if integer else spec.max_value) if bounded else None,
                value=int(default) if integer else float(default),
                step=1 if integer else 0.05,
                format=None if integer else "%.2f",
                key=f"{key}_value",
            )
        else:
            st.selectbox("Your decision", scale.labels, index=scale.labels.index(default), key=f"{key}_value")
        st.text_area("Reason (required when overruling)", key=f"{key}_reason", height=80, max_chars=4000)
        # Only a role can disable these; without a name the click explains what is missing.
        denied = denied_reason(Permission.REVIEW) if current_actor() else None
        if denied:
            st.caption(f"🔒 {escape_markdown(denied)}")
        left, right = st.columns(2)
        with left:
            st.form_submit_button(
                "Confirm judge",
                disabled=denied is not None,
                key=f"{key}_confirm",
                on_click=_submit,
                args=("confirm",),
                kwargs=callback_kwargs,
                width="stretch",
            )
        with right:
            st.form_submit_button(
                "Overrule",
                disabled=denied is not None,
                key=f"{key}_overrule",
                type="primary",
                on_click=_submit,
                args=("overrule",),
                kwargs=callback_kwargs,
                width="stretch",
            )
    # The version drawn now is the one the next submission is checked against.
    st.session_state[f"{key}_seen_version"] = judgment.version


def judgment_history(judgment_id: int, *, key: str, flash_key: str | None = None) -> None:
    """The audit trail of one judgment: who changed it, when, from what to what, and why; and an
    Undo button when its latest change is a decision of the reviewer looking at it."""
    if flash_key is None:
        flash_key = f"{key}_flash"
        show_flash(flash_key)
    with session_scope(read_only=True) as session:
        events = corrections.events_for(session=session, judgment_id=judgment_id)
        judgment = session.get(Judgment, judgment_id)
        version = judgment.version if judgment is not None else -1
    frame = corrections.events_frame(events)
    if frame.empty:
        st.caption("No changes recorded yet.")
        return
    show_table(
        frame,
        key=key,
        columns={"when": datetime_column("When (UTC)"), "reason": text_column("Reason", width="large")},
    )
    csv_download(frame, "history.csv", key=f"{key}_csv")
    mine = corrections.undoable_event(events, current_reviewer())
    if mine is not None:
        denied = denied_reason(Permission.REVIEW)
        st.button(
            f"Undo your {mine.action} decision ({describe_decision(mine)})",
            key=f"{key}_undo",
            icon=":material/undo:",
            help=denied
            or "Restores the state before it; the undo is added to this history, nothing is deleted.",
            disabled=denied is not None,
            on_click=undo_decision,
            args=(judgment_id, version),
            kwargs={"flash_key": flash_key},
        )
    elif events and current_reviewer():
        st.caption("Undo is offered only for your own decision while it is this judgment's latest change.")


def describe_decision(event: JudgmentEvent) -> str:
    """ "4 → 2 at 2024-05-01 12:00 UTC": what a decision changed, for an Undo button and its flash."""
    return f"{event.from_decision or '—'} → {event.to_decision or '—'} at {event.at:%Y-%m-%d %H:%M} UTC"


def undo_decision(judgment_id: int, version: int, *, flash_key: str, queue_key: str | None = None) -> None:
    """Button callback: undo the reviewer's own latest decision on a judgment, as of the version seen.

    In the queue (`queue_key`, its session-state prefix) the judgment's item becomes the current one
    with the keys on its row, so the reviewer sees it open again and can decide anew.
    """
    reviewer = current_actor()
    if not reviewer:
        flash(
            flash_key, "warning", "Enter your name in the sidebar first: every change records its reviewer."
        )
        return
    try:
        with session_scope() as session:
            saved = corrections.undo_review(
                session=session, judgment_id=judgment_id, expected_version=version, reviewer=reviewer
            )
            now = (
                f"back to {saved.user_decision} ({saved.reviewer})"
                if saved.user_decision
                else "unreviewed again"
            )
            summary = f"Undid your decision on {saved.change_id}: {now}."
            key = review_queue.item_key(saved)
    except ReviewConflict as exc:
        flash(flash_key, "error", exc.describe())
        return
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (NothingToUndo, MissingReviewer, JudgmentNotFound) as exc:
        flash(flash_key, "error", f"Not undone: {exc}")
        return
    if queue_key is not None:  # the queue: show the judgment's evaluation, the keys on its row
        st.session_state[f"{queue_key}_current"] = key
        st.session_state[f"{queue_key}_select_id"] = judgment_id
    flash(flash_key, "success", f"{summary} The undo is recorded in its history.")


def review_card_extra(key_prefix: str) -> Callable[[Any], None]:
    """The `extra` hook for `lib.ui.evidence.render_metric_cards`: a review form and history per card."""

    def extra(card: Any) -> None:
        judgment: Judgment | None = getattr(card, "judgment", None)
        if judgment is None or judgment.id is None:
            return
        with session_scope(read_only=True) as session:
            scale = corrections.decision_scale(session=session, judgment=judgment)
        key = f"{key_prefix}_review_{judgment.id}"
        with st.expander("Confirm or overrule", expanded=judgment.user_decision is None):
            correction_form(judgment, scale, key=key, compact=True)
        with st.expander("History"):
            judgment_history(judgment.id, key=f"{key}_history")

    return extra


# ---------------------------------------------------------------------------------------------
# The review queue's workspace: compact metric rows driven by the keyboard

NEXT_KEY, PREVIOUS_KEY, CONFIRM_KEY, CANCEL_KEY, SKIP_KEY, UNDO_KEY = "J", "K", "Y", "Esc", "S", "U"
_UNDO_HINT = f" {UNDO_KEY} undoes it."
KEY_MAP = (
    f"Keys: {NEXT_KEY} / {PREVIOUS_KEY} next / previous metric · {CONFIRM_KEY} confirm the judge · "
    "a score key (1–5 on a 1–5 scale) overrules with that score, then type the reason and press Enter "
    f"({CANCEL_KEY} cancels) · {SKIP_KEY} skip the evaluation · {UNDO_KEY} undo your last decision."
)


def _selected(key: str, rows: Sequence[MetricRow]) -> int:
    """The row the keys act on, kept inside the rows that are still open; an undone judgment's row
    when an undo just reopened one."""
    reopened = st.session_state.pop(f"{key}_select_id", None)
    ids = [row.judgment.id for row in rows]
    if reopened in ids:
        st.session_state[f"{key}_selected"] = ids.index(reopened)
    index = min(max(int(st.session_state.get(f"{key}_selected", 0)), 0), max(len(rows) - 1, 0))
    st.session_state[f"{key}_selected"] = index
    return index


def _move(key: str, step: int) -> None:
    """J / K: the next or previous metric row (clamped when the rows are drawn)."""
    st.session_state[f"{key}_selected"] = int(st.session_state.get(f"{key}_selected", 0)) + step
    st.session_state.pop(f"{key}_pending", None)


def _confirm(key: str, index: int, judgment_id: int, version: int, flash_key: str) -> None:
    """Y or ✓: confirm the judge on this row."""
    st.session_state[f"{key}_selected"] = index
    st.session_state.pop(f"{key}_pending", None)
    write_review("confirm", judgment_id, version, flash_key=flash_key, hint=_UNDO_HINT)


def _score(key: str, index: int, row_info: dict[str, Any], decision: str, flash_key: str) -> None:
    """A score key on a row: the judge's own score confirms; any other asks for the reason first."""
    st.session_state[f"{key}_selected"] = index
    if corrections.same_decision(row_info["judge"], decision):
        st.session_state.pop(f"{key}_pending", None)
        write_review("confirm", row_info["id"], row_info["version"], flash_key=flash_key, hint=_UNDO_HINT)
        return
    st.session_state[f"{key}_pending"] = {**row_info, "decision": decision}
    st.session_state[f"{key}_reason"] = ""
    st.session_state[f"{key}_focus"] = int(st.session_state.get(f"{key}_focus", 0)) + 1


def _save_overrule(key: str, flash_key: str) -> None:
    """Enter in the reason field: overrule with the pending score and the typed reason."""
    pending = st.session_state.get(f"{key}_pending")
    if not pending:
        return
    decision = pending["decision"]
    if decision is None:  # an unbounded scale: the score was typed in the form
        decision = st.session_state.get(f"{key}_value")
    reason = str(st.session_state.get(f"{key}_reason") or "")
    saved = write_review(
        "overrule", pending["id"], pending["version"], decision=decision, reason=reason, flash_key=flash_key,
        hint=_UNDO_HINT,
    )  # fmt: skip
    if saved:
        st.session_state.pop(f"{key}_pending", None)
        st.session_state[f"{key}_reason"] = ""


def _cancel(key: str) -> None:
    st.session_state.pop(f"{key}_pending", None)


def _score_text(value: float | None) -> str:
    return format_score(value)


def _row_help(row: MetricRow) -> None:
    """The judge's reason and evidence for one row, on demand (inside its popover)."""
    st.markdown(f"**{escape_markdown(row.title)}** · scale {escape_markdown(row.scale.describe())}")
    if row.judgment.confidence is not None:
        st.caption(f"Judge confidence {row.judgment.confidence:.0%}")
    st.markdown("Judge's reason: " + (escape_markdown(row.judge_reason) if row.judge_reason else "—"))
    if row.evidence:
        render_evidence_list(row.evidence)
    else:
        st.caption("No evidence recorded for this metric.")


def metric_rows(ws: Workspace, *, key: str, flash_key: str) -> None:
    """One compact row per open judgment, largest gap first: metric, judge, user, gap, why, and the
    buttons that decide. The selected row's buttons carry the keys, so the keyboard reaches every row.
    """
    denied = denied_reason(Permission.REVIEW) if current_actor() else None
    if denied:
        st.caption(f"🔒 {escape_markdown(denied)}")
    selected = _selected(key, ws.rows)
    pending = st.session_state.get(f"{key}_pending")
    pending_id = pending["id"] if pending else None
    if pending_id is not None and pending_id not in {r.judgment.id for r in ws.rows}:
        st.session_state.pop(f"{key}_pending", None)  # decided elsewhere or gone: nothing to finish
        pending_id = None
    with st.container(gap="xsmall", key=f"{key}_rows"):
        with st.container(horizontal=True, gap="xsmall", key=f"{key}_header"):
            st.caption(
                "Metric (why)", width=_TITLE_PX, help="Largest gap first; click a name for the judge's reason"
            )
            st.caption("Judge·User·Gap", width=_SCORES_PX + 40)
            st.caption("✓ confirms, or your score")
        for index, row in enumerate(ws.rows):
            # One slot per row, the reason form inside it: opening the form adds no sibling to the
            # rows, so no row moves into another's place while the rerun is drawn (Streamlit keeps
            # the old elements until the run ends; a shifted row would sit beside stale ones).
            with st.container(gap="xsmall", key=f"{key}_slot_{row.judgment.id}"):
                _metric_row(
                    row, index=index, selected=index == selected, key=key, flash_key=flash_key, denied=denied
                )
                if row.judgment.id == pending_id:
                    _reason_form(key, row, pending, flash_key)


_TITLE_PX, _SCORES_PX, _BUTTON_PX, _KEYED_BUTTON_PX = 124, 64, 36, 50


def _metric_row(
    row: MetricRow, *, index: int, selected: bool, key: str, flash_key: str, denied: str | None
) -> None:
    """One line: metric, judge · user · gap, a popover with the reason and evidence, ✓, score buttons.

    Only the selected row's buttons carry the keys (a key can belong to one button only); their
    width is left to Streamlit so the key hints fit.
    """
    judgment = row.judgment
    assert judgment.id is not None
    info = {"id": judgment.id, "version": judgment.version, "judge": judgment.decision, "title": row.title}
    width = _KEYED_BUTTON_PX if selected else _BUTTON_PX
    rk = f"{key}_row_{judgment.id}"
    with st.container(horizontal=True, gap="xsmall", vertical_alignment="center", key=rk):
        title = f"▸ {row.title}" if selected else row.title
        # The metric's name opens the judge's reason and evidence: on demand, no room taken.
        with st.popover(
            escape_markdown(title),
            key=f"{rk}_why",
            help="The judge's reason and evidence",
            type="secondary" if selected else "tertiary",
            width=_TITLE_PX,
        ):
            _row_help(row)
        gap = _score_text(row.gap)
        st.markdown(
            f"{escape_markdown(judgment.decision)} · {_score_text(row.user_score)} · "
            + (f"**{gap}**" if row.gap else gap),
            width=_SCORES_PX,
        )
        st.button(
            "✓",
            key=f"{rk}_confirm",
            help=denied or f"Confirm the judge's {escape_markdown(judgment.decision)}",
            disabled=denied is not None,
            on_click=_confirm,
            args=(key, index, judgment.id, judgment.version, flash_key),
            shortcut=CONFIRM_KEY if selected else None,
            width=width,
        )
        for score_key, decision in row.keys.items():
            judge_own = corrections.same_decision(judgment.decision, decision)
            st.button(
                decision,
                key=f"{rk}_score_{score_key}",
                help=denied
                or (
                    "The judge's own score: confirms"
                    if judge_own
                    else f"Overrule with {escape_markdown(decision)}"
                ),
                disabled=denied is not None,
                on_click=_score,
                args=(key, index, info, decision, flash_key),
                shortcut=score_key if selected else None,
                width=width if len(decision) <= 2 else "content",  # labels and 0.25-style scores
            )
        if not row.keys:
            st.button(
                "Other…",
                key=f"{rk}_other",
                help=denied or "Type your score",
                disabled=denied is not None,
                on_click=_score,
                args=(key, index, info, None, flash_key),
            )


def _reason_form(key: str, row: MetricRow, pending: dict[str, Any], flash_key: str) -> None:
    """The reason an overrule needs, right under its row; focused so the reviewer just types."""
    decision = pending["decision"]
    question = (
        f"Why {decision} instead of the judge's {row.judgment.decision}? Enter saves, Esc cancels"
        if decision is not None
        else "Why? Enter saves, Esc cancels"
    )
    with st.container(horizontal=True, gap="xsmall", vertical_alignment="bottom", key=f"{key}_reason_row"):
        with (
            st.form(f"{key}_reason_form", border=False, enter_to_submit=True, width="stretch"),
            st.container(horizontal=True, gap="xsmall", vertical_alignment="bottom"),
        ):
            if decision is None:  # an unbounded scale: the reviewer types the score too
                st.number_input(f"Your score ({row.scale.describe()})", key=f"{key}_value", value=None)
            st.text_input(
                escape_markdown(f"Reason for overruling {row.title}"),
                key=f"{key}_reason",
                max_chars=4000,
                placeholder=question,
                label_visibility="collapsed",
            )
            st.form_submit_button(
                "Save", key=f"{key}_save", type="primary", on_click=_save_overrule, args=(key, flash_key)
            )
        st.button("Cancel", key=f"{key}_cancel", on_click=_cancel, args=(key,), shortcut=CANCEL_KEY)
    focus = int(st.session_state.get(f"{key}_focus", 0))
    # A constant script (no data in it) puts the cursor in the reason field, so the keyboard flows on.
    # It keeps trying for a moment: the rerun that draws the field can still move the focus after it.
    # No "<" followed by a word character: the sanitizer drops a script whose text has one.
    st.html(
        f"<script>/* focus {focus} */(function f(n){{const el=document.querySelector('.st-key-{key}_reason input');"
        "const busy=document.activeElement&&['INPUT','TEXTAREA'].includes(document.activeElement.tagName);"
        "if(el&&!busy){el.focus();}if(30>n){setTimeout(()=>f(n+1),100);}})(0);</script>",
        unsafe_allow_javascript=True,
    )


def fit_to_screen() -> None:
    """Drop most of Streamlit's empty space below the page (10rem), so the workspace is one screen.

    A constant style (no data in it), scoped to the page that calls it: it goes when the page does.
    """
    st.html('<style>[data-testid="stMainBlockContainer"]{padding-bottom:1.5rem}</style>')


def queue_toolbar(*, key: str, flash_key: str, on_skip: Callable[[], None] | None = None) -> None:
    """Skip, Undo (of the reviewer's own last decision, named), and moving between rows; the key map."""
    reviewer = current_reviewer()
    last = None
    version = -1
    if reviewer:
        with session_scope(read_only=True) as session:
            found = corrections.undoable_reviews(session=session, reviewer=reviewer, limit=1)
            if found:
                last = found[0]
                judgment = session.get(Judgment, last.judgment_id)
                version = judgment.version if judgment is not None else -1
    denied = denied_reason(Permission.REVIEW) if reviewer else None
    with st.container(horizontal=True, gap="small", vertical_alignment="center", key=f"{key}_toolbar"):
        if on_skip is not None:
            st.button(
                "Skip", key=f"{key}_skip", on_click=on_skip, shortcut=SKIP_KEY, icon=":material/skip_next:"
            )
        st.button(
            "Undo",
            key=f"{key}_undo",
            icon=":material/undo:",
            disabled=last is None or denied is not None,
            help=denied
            or (
                "Only your own decision that is still its judgment's latest change can be undone."
                if last is None
                else escape_markdown(
                    f"Undo your {last.action} decision on {last.change_id} ({describe_decision(last)})"
                )
            ),
            on_click=undo_decision,
            args=(last.judgment_id if last else -1, version),
            kwargs={"flash_key": flash_key, "queue_key": key},
            shortcut=UNDO_KEY,
        )
        if on_skip is not None:  # an item is open: its rows can be walked
            st.button(
                "Previous", key=f"{key}_previous", on_click=_move, args=(key, -1), shortcut=PREVIOUS_KEY
            )
            st.button("Next", key=f"{key}_next", on_click=_move, args=(key, 1), shortcut=NEXT_KEY)
        with st.popover("Keys", icon=":material/keyboard:", key=f"{key}_keys"):
            st.markdown(KEY_MAP)
    if last is not None:
        st.caption(
            f"{UNDO_KEY} undoes your last decision: {escape_markdown(last.action)} "
            f"{escape_markdown(last.change_id)} ({escape_markdown(last.from_decision or '—')} → "
            f"{escape_markdown(last.to_decision or '—')})."
        )
