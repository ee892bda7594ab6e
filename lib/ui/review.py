"""Reusable review widgets: the correction form for one judgment, its audit trail (with Undo), the hook
that puts both into each metric card of the Evaluations detail view, and the review queue's
workspace rows with their keyboard.

The write happens in the submit button's callback, before the script reruns: the callback still
knows which version the reviewer was looking at (kept in session state when the form was drawn),
so a change that landed in between is reported as a conflict instead of being overwritten. The
outcome is kept as a "flash" message that the next run shows. All data text is escaped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from lib import corrections, display, queues, review_queue
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
from lib.highlight import metric_palette, sanitize_slug
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
    write,
)
from lib.ui.evidence import format_score, render_answer, render_evidence_list, render_long_text
from lib.ui.tables import datetime_column, show_table, text_column

log = logging.getLogger(__name__)


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
        saved = write(
            lambda session: corrections.record_review(
                session=session,
                judgment_id=judgment_id,
                expected_version=version,
                action=action,
                user_decision=decision,
                reviewer=reviewer,
                reason=reason,
            )
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
        saved = write(
            lambda session: corrections.undo_review(
                session=session, judgment_id=judgment_id, expected_version=version, reviewer=reviewer
            )
        )
        now = (
            f"back to {saved.user_decision} ({saved.reviewer})" if saved.user_decision else "unreviewed again"
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
# The review queue's workspace: compact metric rows driven by the keyboard, and the selected
# metric's reasons under them

NEXT_KEY, PREVIOUS_KEY, CONFIRM_KEY, CANCEL_KEY, SKIP_KEY, UNDO_KEY = "J", "K", "Y", "Esc", "S", "U"
_UNDO_HINT = f" {UNDO_KEY} undoes it."
KEY_MAP = (
    f"Keys: {NEXT_KEY} / {PREVIOUS_KEY} next / previous metric · {CONFIRM_KEY} confirm the judge · "
    "a score key (1–5 on a 1–5 scale) overrules with that score, then type the reason and press Enter "
    f"({CANCEL_KEY} cancels) · {SKIP_KEY} skip the evaluation · {UNDO_KEY} undo your last decision."
)


@dataclass(frozen=True)
class Target:
    """Where the workspace's decisions go: reviews in the default queue (`queue_id` None, through
    `corrections.record_review`) or the reviewer's labels in a team queue (`lib.queues`), and the
    item whose draft keeps what the reviewer typed but did not send."""

    item_key: str
    queue_id: int | None = None
    item_id: int | None = None
    blind_first: bool = False  # a blind-first queue after the reveal: ✓ keeps the reviewer's own score

    @property
    def team(self) -> bool:
        return self.queue_id is not None


@dataclass(frozen=True)
class Own:
    """The reviewer's own label of a judgment in a team queue, and the judgment's state there."""

    blind: str | None = None
    blind_reason: str | None = None
    final: str | None = None
    reason: str | None = None
    state: str = "open"


def own_labels(labels: Mapping[int, Any], states: Mapping[int, str]) -> dict[int, Own]:
    """`Own` per judgment from a team item's labels (ReviewLabel rows) and queue states."""
    return {
        judgment_id: Own(
            blind=getattr(labels.get(judgment_id), "blind_decision", None),
            blind_reason=getattr(labels.get(judgment_id), "blind_reason", None),
            final=getattr(labels.get(judgment_id), "decision", None),
            reason=getattr(labels.get(judgment_id), "reason", None),
            state=state,
        )
        for judgment_id, state in states.items()
    }


def save_draft(target: Target, draft: Mapping[str, Any]) -> None:
    """Keep the reviewer's unsent input for the item (lib.reservations; the lease is renewed too)."""
    reviewer = current_reviewer()
    if not reviewer:
        return
    try:
        with session_scope() as session:
            if target.team:
                assert target.queue_id is not None and target.item_id is not None
                queues.save_draft(
                    session=session,
                    queue_id=target.queue_id,
                    item_id=target.item_id,
                    reviewer=reviewer,
                    draft=draft,
                )
            else:
                review_queue.save_draft(session=session, reviewer=reviewer, key=target.item_key, draft=draft)
    except (ValueError, LookupError):  # the item is no longer theirs, or the draft is too large
        log.info("draft not kept", exc_info=True)


def _draft_entry(key: str, judgment_id: int, entry: Mapping[str, Any] | None) -> None:
    """Put one judgment's unsent decision and reason into the page's copy of the draft (or drop it)."""
    draft = dict(st.session_state.get(f"{key}_draft") or {})
    if entry is None:
        draft.pop(str(judgment_id), None)
    else:
        draft[str(judgment_id)] = dict(entry)
    st.session_state[f"{key}_draft"] = draft


def _store_draft(key: str) -> None:
    target: Target | None = st.session_state.get(f"{key}_target")
    if target is not None:
        save_draft(target, dict(st.session_state.get(f"{key}_draft") or {}))


def write_label(target: Target, judgment_id: int, decision: Any, reason: str, *, flash_key: str) -> bool:
    """Save the reviewer's label of one judgment in a team queue and flash what happened to it."""
    reviewer = current_actor()
    if not reviewer:
        flash(flash_key, "warning", "Enter your name in the sidebar first: every label records its reviewer.")
        return False
    assert target.queue_id is not None and target.item_id is not None
    try:
        queue_id, item_id = target.queue_id, target.item_id
        outcome = write(
            lambda session: queues.label_item(
                session=session,
                queue_id=queue_id,
                item_id=item_id,
                reviewer=reviewer,
                labels=[queues.LabelInput(judgment_id=judgment_id, decision=decision, reason=reason or None)],
            )
        )
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return False
    except (
        queues.ItemTaken,
        queues.QueueError,
        queues.QueueNotFound,
        queues.NotRevealed,
        InvalidDecision,
        MissingReviewer,
    ) as exc:
        flash(flash_key, "error", f"Not saved: {exc}")
        return False
    state = outcome.states.get(judgment_id, "open")
    after = {
        "open": "it waits for the other reviewers' labels",
        "resolved": "the reviewers agree, so it is decided",
        "disputed": "the reviewers disagree, so a lead will decide it",
    }.get(state, state)
    done = " Every metric of this item has your label: here is the next one." if outcome.item_done else ""
    flash(flash_key, "success", f"Your label {decision} is saved as {reviewer}; {after}.{done}")
    return True


def _decide(key: str, info: Mapping[str, Any], decision: Any, reason: str, flash_key: str) -> bool:
    """Write a row's decision where the workspace's target sends it; True when it was saved."""
    target: Target = st.session_state[f"{key}_target"]
    if target.team:
        saved = write_label(target, info["id"], decision, reason, flash_key=flash_key)
    else:
        action = "confirm" if corrections.same_decision(info["judge"], decision) else "overrule"
        saved = write_review(
            action, info["id"], info["version"], decision=None if action == "confirm" else decision,
            reason=reason, flash_key=flash_key, hint=_UNDO_HINT,
        )  # fmt: skip
    if saved:
        _draft_entry(key, info["id"], None)
        _store_draft(key)
    return saved


def _selected(key: str, rows: Sequence[MetricRow], own: Mapping[int, Own]) -> int:
    """The row the keys act on, kept inside the rows; an undone judgment's row when an undo just
    reopened one; in a team queue, a new item starts at its first row without the reviewer's label."""
    reopened = st.session_state.pop(f"{key}_select_id", None)
    ids = [row.judgment.id for row in rows]
    if reopened in ids:
        st.session_state[f"{key}_selected"] = ids.index(reopened)
    if f"{key}_selected" not in st.session_state and own:
        first_open = next(
            (i for i, j in enumerate(ids) if j is not None and own.get(j, Own()).final is None), 0
        )
        st.session_state[f"{key}_selected"] = first_open
    index = min(max(int(st.session_state.get(f"{key}_selected", 0)), 0), max(len(rows) - 1, 0))
    st.session_state[f"{key}_selected"] = index
    return index


def _move(key: str, step: int) -> None:
    """J / K: the next or previous metric row (clamped when the rows are drawn)."""
    st.session_state[f"{key}_selected"] = int(st.session_state.get(f"{key}_selected", 0)) + step
    _cancel(key)


def _select(key: str, index: int) -> None:
    """A click on a metric's name: its row gets the keys and its reasons show under the rows."""
    st.session_state[f"{key}_selected"] = index
    _cancel(key)


def _confirm(key: str, index: int, row_info: dict[str, Any], flash_key: str) -> None:
    """Y or ✓: confirm the judge on this row (in a blind-first queue: keep your own score)."""
    _score(key, index, row_info, row_info["keep"], flash_key)


def _score(key: str, index: int, row_info: dict[str, Any], decision: str | None, flash_key: str) -> None:
    """A score key on a row: the judge's own score (or, blind-first, your own) is saved at once; any
    other asks for the reason first (the score, and the reason once entered, kept as a draft)."""
    st.session_state[f"{key}_selected"] = index
    if decision is not None and (
        corrections.same_decision(row_info["judge"], decision)
        or (row_info.get("keep_reason") and corrections.same_decision(row_info["keep"], decision))
    ):
        st.session_state.pop(f"{key}_pending", None)
        _decide(key, row_info, decision, row_info.get("keep_reason") or "", flash_key)
        return
    st.session_state[f"{key}_pending"] = {**row_info, "decision": decision}
    reason = str(row_info.get("keep_reason") or "")
    st.session_state[f"{key}_reason"] = reason
    st.session_state[f"{key}_focus"] = int(st.session_state.get(f"{key}_focus", 0)) + 1
    _draft_entry(key, row_info["id"], {"decision": decision, "reason": reason})
    _store_draft(key)


def _save_overrule(key: str, flash_key: str) -> None:
    """Enter in the reason field (or Save): the pending score with the typed reason."""
    pending = st.session_state.get(f"{key}_pending")
    if not pending:
        return
    decision = pending["decision"]
    if decision is None:  # an unbounded scale: the score was typed in the form
        decision = st.session_state.get(f"{key}_value")
    reason = str(st.session_state.get(f"{key}_reason") or "")
    if _decide(key, pending, decision, reason, flash_key):
        st.session_state.pop(f"{key}_pending", None)
        st.session_state[f"{key}_reason"] = ""


def _reason_typed(key: str) -> None:
    """The reason entered (Enter, or the field left): keep it as the item's draft (a reload shows it again)."""
    pending = st.session_state.get(f"{key}_pending")
    if not pending:
        return  # saved or cancelled in the same run: nothing unsent is left
    reason = str(st.session_state.get(f"{key}_reason") or "")
    _draft_entry(key, pending["id"], {"decision": pending["decision"], "reason": reason})
    _store_draft(key)


def _cancel(key: str) -> None:
    pending = st.session_state.pop(f"{key}_pending", None)
    if pending:
        _draft_entry(key, pending["id"], None)
        _store_draft(key)


def _restore_pending(key: str, rows: Sequence[MetricRow], own: Mapping[int, Own]) -> None:
    """A new session on an item with a draft: the unsent score and reason open again on their row."""
    if st.session_state.get(f"{key}_pending"):
        return
    draft = st.session_state.get(f"{key}_draft") or {}
    for index, row in enumerate(rows):
        entry = draft.get(str(row.judgment.id))
        if not isinstance(entry, Mapping) or own.get(row.judgment.id or 0, Own()).state != "open":
            continue
        if entry.get("decision") is None and not entry.get("reason"):
            continue
        st.session_state[f"{key}_pending"] = {**_row_info(row, own), "decision": entry.get("decision")}
        st.session_state[f"{key}_reason"] = str(entry.get("reason") or "")
        st.session_state[f"{key}_selected"] = index
        return


def _score_text(value: float | None) -> str:
    return format_score(value)


def _row_info(row: MetricRow, own: Mapping[int, Own]) -> dict[str, Any]:
    """What a row's buttons pass to their callbacks: the version seen, the judge's decision, and
    what ✓ saves (the judge's decision; blind-first after the reveal, the reviewer's own score)."""
    judgment = row.judgment
    mine = own.get(judgment.id or 0)
    keep, keep_reason = judgment.decision, None
    if mine is not None and mine.blind is not None:
        keep, keep_reason = mine.blind, mine.blind_reason or ""
    return {
        "id": judgment.id, "version": judgment.version, "judge": judgment.decision, "title": row.title,
        "keep": keep, "keep_reason": keep_reason,
    }  # fmt: skip


def metric_rows(
    ws: Workspace,
    *,
    key: str,
    flash_key: str,
    target: Target,
    own: Mapping[int, Own] | None = None,
    draft: Mapping[str, Any] | None = None,
) -> None:
    """One compact row per judgment, largest gap first: metric, judge · user · gap, ✓ and the score
    buttons; the selected row's buttons carry the keys, and its reasons show under the rows.

    `own` (team queues): the reviewer's labels, shown on the rows and changeable while the
    judgment collects labels. `draft`: the item's saved unsent input, reopened in a new session.
    """
    own = own or {}
    if st.session_state.get(f"{key}_target") != target:
        st.session_state[f"{key}_target"] = target
        st.session_state[f"{key}_draft"] = dict(draft or {})
        st.session_state.pop(f"{key}_pending", None)
        _restore_pending(key, ws.rows, own)
    denied = denied_reason(Permission.REVIEW) if current_actor() else None
    if denied:
        st.caption(f"🔒 {escape_markdown(denied)}")
    selected = _selected(key, ws.rows, own)
    pending = st.session_state.get(f"{key}_pending")
    pending_id = pending["id"] if pending else None
    if pending_id is not None and pending_id not in {r.judgment.id for r in ws.rows}:
        st.session_state.pop(f"{key}_pending", None)  # decided elsewhere or gone: nothing to finish
        pending_id = None
    with st.container(gap="xsmall", key=f"{key}_rows"):
        with st.container(horizontal=True, gap="xsmall", key=f"{key}_header"):
            st.caption("Metric", width=_TITLE_PX, help="Largest gap first; click a name to select its row")
            st.caption("Judge·User·Gap", width=_SCORES_PX + 40)
            st.caption(
                "✓ keeps your score, or a new one" if target.blind_first else "✓ confirms, or your score"
            )
        for index, row in enumerate(ws.rows):
            # One slot per row, the reason form inside it: opening the form adds no sibling to the
            # rows, so no row moves into another's place while the rerun is drawn (Streamlit keeps
            # the old elements until the run ends: a shifted row would sit beside stale ones).
            with st.container(gap="xsmall", key=f"{key}_slot_{row.judgment.id}"):
                _metric_row(
                    row, index=index, selected=index == selected, key=key, flash_key=flash_key, denied=denied,
                    mine=own.get(row.judgment.id or 0),
                )  # fmt: skip
                if row.judgment.id == pending_id:
                    _reason_form(key, row, pending, flash_key)
    if ws.rows:
        row_context(
            ws.rows[selected], key=key, mine=own.get(ws.rows[selected].judgment.id or 0), flash_key=flash_key
        )


_TITLE_PX, _LABEL_TITLE_PX, _SCORES_PX, _BUTTON_PX = 128, 110, 64, 36


def _metric_row(
    row: MetricRow,
    *,
    index: int,
    selected: bool,
    key: str,
    flash_key: str,
    denied: str | None,
    mine: Own | None,
) -> None:
    """One line: the metric's name (selects the row), judge · user · gap, ✓, the score buttons.

    Only the selected row's buttons carry the keys (a key can belong to one button only). The
    reviewer's own label (team queues) is the highlighted button; a decided judgment is read-only.
    """
    judgment = row.judgment
    assert judgment.id is not None
    info = _row_info(row, {judgment.id: mine} if mine else {})
    # The selected row's buttons show their key beside the label: they take the width they need.
    width: int | str = "content" if selected else _BUTTON_PX
    labels_only = row.user_score is None and row.gap is None and not row.scale.is_score
    rk = f"{key}_row_{judgment.id}"
    closed = None if mine is None or mine.state == "open" else _CLOSED.get(mine.state, mine.state)
    blocked = denied or closed
    with st.container(horizontal=True, gap="xsmall", vertical_alignment="center", key=rk, wrap=False):
        st.button(
            escape_markdown(f"▸ {row.title}" if selected else row.title),
            key=f"{rk}_name",
            help=escape_markdown(f"{row.title}: select this row (its reasons show under the rows)"),
            type="secondary" if selected else "tertiary",
            width=_LABEL_TITLE_PX if labels_only else _TITLE_PX,
            on_click=_select,
            args=(key, index),
        )
        # A label judgment has no user score or gap, and its labels are long: the judge's label is
        # marked on its button instead, so the row keeps to one line (issue 25.13).
        if not labels_only:
            gap = _score_text(row.gap)
            st.markdown(
                f"{escape_markdown(judgment.decision)} · {_score_text(row.user_score)} · "
                + (f"**{gap}**" if row.gap else gap),
                width=_SCORES_PX,
            )
        keep = info["keep"]
        st.button(
            "✓" if info["keep_reason"] is None else f"✓ {keep}",
            key=f"{rk}_confirm",
            help=blocked
            or (
                f"Keep your score {escape_markdown(keep)}"
                if info["keep_reason"] is not None
                else f"Confirm the judge's {escape_markdown(judgment.decision)}"
            ),
            disabled=blocked is not None,
            on_click=_confirm,
            args=(key, index, info, flash_key),
            shortcut=CONFIRM_KEY if selected else None,
            width=width if info["keep_reason"] is None else "content",
        )
        chosen = mine.final if mine is not None else None
        for score_key, decision in row.keys.items():
            judge_own = corrections.same_decision(judgment.decision, decision)
            st.button(
                decision,
                key=f"{rk}_score_{score_key}",
                help=blocked
                or (
                    "Your label"
                    if chosen is not None and corrections.same_decision(chosen, decision)
                    else "The judge's own decision: confirms"
                    if judge_own
                    else f"Overrule with {escape_markdown(decision)}"
                ),
                type="primary"
                if chosen is not None and corrections.same_decision(chosen, decision)
                else "secondary",
                icon=":material/gavel:" if labels_only and judge_own else None,
                disabled=blocked is not None,
                on_click=_score,
                args=(key, index, info, decision, flash_key),
                shortcut=score_key if selected else None,
                width=width if len(decision) <= 2 else "content",  # labels and 0.25-style scores
            )
        if not row.keys:
            st.button(
                "Other…",
                key=f"{rk}_other",
                help=blocked or "Type your score",
                disabled=blocked is not None,
                on_click=_score,
                args=(key, index, info, None, flash_key),
            )


_CLOSED = {
    "resolved": "Decided: the reviewers agreed.",
    "disputed": "Awaiting a lead: the reviewers disagree. Undo your label to change it.",
    "adjudicated": "Decided by a lead.",
    "released": "Released when the queue closed.",
}


def _withdraw(key: str, judgment_id: int, flash_key: str) -> None:
    """Take back the reviewer's own label of a judgment in a team queue (lib.queues.undo_label): its
    value goes into their draft and the row is open again."""
    target: Target = st.session_state[f"{key}_target"]
    actor = current_actor()
    assert target.queue_id is not None
    try:
        queue_id = target.queue_id
        label = write(
            lambda session: queues.undo_label(
                session=session, queue_id=queue_id, judgment_id=judgment_id, reviewer=actor
            )
        )
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (queues.QueueError, queues.QueueNotFound, NothingToUndo, MissingReviewer) as exc:
        flash(flash_key, "error", f"Not withdrawn: {exc}")
        return
    st.session_state.pop(f"{key}_target", None)  # the draft is read again: it holds the withdrawn label
    flash(flash_key, "success", f"Your label of judgment {label.judgment_id} is withdrawn; label it again.")


def row_context(row: MetricRow, *, key: str, mine: Own | None = None, flash_key: str = "") -> None:
    """The selected metric's reasons, without a click (issue 25.8): the judge's reason, the
    evaluated user's reason for their score, the reviewer's own label, and the judge's evidence."""
    judgment = row.judgment
    with st.container(border=True, gap="xsmall", key=f"{key}_context"):
        facts = [f"scale {row.scale.describe()}", f"judge {judgment.decision}"]
        if row.user_score is not None:
            facts.append(f"user {format_score(row.user_score)}")
        if judgment.confidence is not None:
            facts.append(f"judge confidence {judgment.confidence:.0%}")
        st.markdown(f"**{escape_markdown(row.title)}** :small[{escape_markdown(' · '.join(facts))}]")
        st.markdown(
            "**Judge:** "
            + (escape_markdown(row.judge_reason) if row.judge_reason else ":gray[no reason given]")
        )
        if row.user_reason:
            st.markdown("**User:** " + escape_markdown(row.user_reason))
        if mine is not None and mine.blind is not None:
            why = f" — {mine.blind_reason}" if mine.blind_reason else ""
            st.markdown(escape_markdown(f"Your blind score: {mine.blind}{why}"))
        if mine is not None and mine.final is not None:
            why = f" — {mine.reason}" if mine.reason else ""
            st.markdown(escape_markdown(f"Your label: {mine.final}{why}"))
        if mine is not None and mine.state != "open":
            st.caption(escape_markdown(_CLOSED.get(mine.state, mine.state)))
        if mine is not None and mine.final is not None and mine.state in ("open", "disputed", "resolved"):
            st.button(
                "Withdraw my label",
                key=f"{key}_withdraw",
                icon=":material/undo:",
                help="Take your label back (it is kept as your draft). Once the judgment is decided, only "
                "the label that decided it can be withdrawn, while that decision is its latest change.",
                on_click=_withdraw,
                args=(key, row.judgment.id, flash_key),
                type="tertiary",
            )
        if row.evidence:
            with st.expander(f"The judge's evidence ({len(row.evidence)})", key=f"{key}_evidence"):
                render_evidence_list(row.evidence)


def _reason_form(key: str, row: MetricRow, pending: dict[str, Any], flash_key: str) -> None:
    """The reason a new score needs, right under its row; focused so the reviewer just types, and
    kept as a draft when it is entered or the field is left (a reload shows it again)."""
    decision = pending["decision"]
    question = (
        f"Why {decision} instead of the judge's {row.judgment.decision}?"
        if decision is not None
        else "Your score, and why?"
    )
    st.caption(escape_markdown(f"{question} Enter saves, Esc cancels."))
    with st.container(horizontal=True, gap="xsmall", vertical_alignment="bottom", key=f"{key}_reason_row"):
        if decision is None:  # an unbounded scale: the reviewer types the score too
            st.number_input(f"Your score ({row.scale.describe()})", key=f"{key}_value", value=None, width=140)
        _reason_field(key, escape_markdown(f"Reason for {row.title}"))
        st.button("Save", key=f"{key}_save", type="primary", on_click=_save_overrule, args=(key, flash_key))
        st.button("Cancel", key=f"{key}_cancel", on_click=_cancel, args=(key,), shortcut=CANCEL_KEY)
    focus = int(st.session_state.get(f"{key}_focus", 0))
    # A constant script (no data in it): the cursor goes into the reason field so the keyboard flows
    # on (it keeps trying for a moment: the rerun that draws the field can still move the focus), and
    # Enter in the field presses Save once the field has handed Streamlit its value. No "<" followed
    # by a word character: the sanitizer drops a script whose text has one.
    st.html(
        f"<script>/* focus {focus} */(function f(n){{const el=document.querySelector('.st-key-{key}_reason input');"
        "const busy=document.activeElement&&['INPUT','TEXTAREA'].includes(document.activeElement.tagName);"
        "if(el&&!busy){el.focus();}if(30>n){setTimeout(()=>f(n+1),100);}})(0);"
        f"if(!window.__ov_enter_{key}){{window.__ov_enter_{key}=true;document.addEventListener('keydown',e=>{{"
        f"if(e.key==='Enter'&&!e.isComposing&&e.target.closest&&e.target.closest('.st-key-{key}_reason')){{"
        f"setTimeout(()=>{{const b=document.querySelector('.st-key-{key}_save button');if(b){{b.click();}}}},0);"
        "}},true);}</script>",
        unsafe_allow_javascript=True,
    )


def _reason_field(key: str, label: str) -> None:
    """The reason field: entered or left, it is saved as the draft. Not a fragment of its own: Enter
    commits the text and presses Save (the form's script) in one run of the workspace, so the
    save always sees the text."""
    st.text_input(
        label,
        key=f"{key}_reason",
        max_chars=4000,
        placeholder="Your reason",
        label_visibility="collapsed",
        on_change=_reason_typed,
        args=(key,),
    )


def fit_to_screen() -> None:
    """Drop most of Streamlit's empty space around the page (10rem below, 5rem at the sides), so the
    workspace is one screen and the answer gets the width (issue 25.13).

    A constant style (no data in it), scoped to the page that calls it: it goes when the page does.
    """
    st.html(
        '<style>[data-testid="stMainBlockContainer"]{padding-bottom:1.5rem;padding-top:3rem;'
        "padding-left:2rem;padding-right:2rem}</style>"
    )


def queue_toolbar(
    *,
    key: str,
    flash_key: str,
    on_skip: Callable[[], None] | None = None,
    undo: bool = True,
    walk: bool | None = None,
    keys: str = KEY_MAP,
) -> None:
    """Skip, Undo (of the reviewer's own last decision, named), and moving between rows; the key map.

    `undo=False` in a team queue: its labels are withdrawn from their row (a queue's decisions are
    undone only through the queue). `walk`: Previous / Next between rows (default: when an item is
    open, i.e. it can be skipped)."""
    reviewer = current_reviewer()
    last = None
    version = -1
    if reviewer and undo:
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
        if undo:
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
        if walk or (walk is None and on_skip is not None):  # an item is open: its rows can be walked
            st.button(
                "Previous", key=f"{key}_previous", on_click=_move, args=(key, -1), shortcut=PREVIOUS_KEY
            )
            st.button("Next", key=f"{key}_next", on_click=_move, args=(key, 1), shortcut=NEXT_KEY)
        with st.popover("Keys", icon=":material/keyboard:", key=f"{key}_keys"):
            st.markdown(keys)
    if last is not None:
        st.caption(
            f"{UNDO_KEY} undoes your last decision: {escape_markdown(last.action)} "
            f"{escape_markdown(last.change_id)} ({escape_markdown(last.from_decision or '—')} → "
            f"{escape_markdown(last.to_decision or '—')})."
        )


def item_view(workspace: Workspace, *, key: str, height: int = 470) -> None:
    """The item beside the rows: an evaluation's question and its answer with the judge's verified
    highlights, or a stand-alone judgment's subject."""
    item = workspace.item
    snapshot = item.snapshot
    if snapshot is not None:
        gap = "—" if snapshot.max_metric_gap is None else f"{snapshot.max_metric_gap:.2f}"
        st.markdown(
            f"**{escape_markdown(display.evaluation_title(snapshot.question, limit=60))}**  \n"
            f":small[Evaluation {escape_markdown(snapshot.id)} · "
            f"{escape_markdown(snapshot.product)} · {escape_markdown(snapshot.language)} · "
            f"model {escape_markdown(snapshot.model_name or 'unknown')} · largest gap {gap} · "
            f"[open the full evaluation]({display.evaluation_url(snapshot.id)})]"
        )
        render_long_text(snapshot.question, key=f"{key}_question", file_name="question.txt", height=76)
        render_answer(
            snapshot.model_answer,
            spans=workspace.spans,
            legend=workspace.highlighted_metrics,
            colors=metric_palette(workspace.metrics),
            labels=workspace.labels,
            key=f"{key}_answer",
            file_name=f"{sanitize_slug(snapshot.id)}-answer.txt",
            height=height,
        )
        return
    judgment = item.judgments[0]
    st.markdown(
        f"**Judgment {escape_markdown(judgment.change_id)}**  \n:small[{escape_markdown(judgment.product)}]"
    )
    if judgment.description:
        st.markdown(escape_markdown(judgment.description))
    if judgment.url:
        st.text(judgment.url)
