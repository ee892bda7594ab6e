"""Reusable review widgets: the correction form for one judgment, its audit trail, and the hook that
puts both into each metric card of the Evaluations detail view.

The write happens in the submit button's callback, before the script reruns: the callback still
knows which version the reviewer was looking at (kept in session state when the form was drawn),
so a change that landed in between is reported as a conflict instead of being overwritten. The
outcome is kept as a "flash" message that the next run shows. All data text is escaped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from lib import corrections
from lib.auth import Permission, PermissionDenied
from lib.corrections import DecisionScale, InvalidDecision, JudgmentNotFound, MissingReviewer, ReviewConflict
from lib.models import Judgment
from lib.safe_markdown import escape_markdown
from lib.ui import audit_denied, csv_download, current_actor, denied_reason, flash, session_scope, show_flash
from lib.ui.tables import datetime_column, show_table, text_column

CONFIRM_SHORTCUT = "Alt+Y"
OVERRULE_SHORTCUT = "Alt+O"


def _submit(
    action: str,
    *,
    judgment_id: int,
    key: str,
    flash_key: str,
) -> None:
    """Button callback: write the review as of the version the reviewer saw, then flash the outcome.

    The rules (an overrule parses on the scale and differs from the judge) are `record_review`'s:
    this callback only passes the button's action and shows what it answers.
    """
    reviewer = current_actor()
    if not reviewer:
        flash(
            flash_key, "warning", "Enter your name in the sidebar first: every review records its reviewer."
        )
        return
    seen = st.session_state.get(f"{key}_seen_version")
    reason = str(st.session_state.get(f"{key}_reason") or "")
    value: Any = st.session_state.get(f"{key}_value") if action == "overrule" else None
    try:
        with session_scope() as session:
            saved = corrections.record_review(
                session=session,
                judgment_id=judgment_id,
                expected_version=int(seen) if seen is not None else -1,
                action=action,
                user_decision=value,
                reviewer=reviewer,
                reason=reason,
            )
            summary = (
                f"Overruled {saved.change_id}: {saved.decision} → {saved.user_decision}."
                if saved.was_corrected
                else f"Confirmed {saved.change_id}: {saved.decision}."
            )
    except ReviewConflict as exc:
        st.session_state[f"{key}_seen_version"] = exc.current.version
        flash(flash_key, "error", exc.describe())
        return
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (InvalidDecision, MissingReviewer, JudgmentNotFound) as exc:
        flash(flash_key, "error", f"Not saved: {exc}")
        return
    st.session_state[f"{key}_reason"] = ""
    flash(flash_key, "success", f"{summary} Saved as {reviewer}.")


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
    shortcuts: bool = False,
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
        cols[0].metric("Judge", judgment.decision)
        if user_score is not None:
            cols[1].metric("User score", corrections.format_score(user_score))
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
                shortcut=CONFIRM_SHORTCUT if shortcuts else None,
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
                shortcut=OVERRULE_SHORTCUT if shortcuts else None,
                width="stretch",
            )
    # The version drawn now is the one the next submission is checked against.
    st.session_state[f"{key}_seen_version"] = judgment.version


def judgment_history(judgment_id: int, *, key: str) -> None:
    """The audit trail of one judgment: who changed it, when, from what to what, and why."""
    with session_scope(read_only=True) as session:
        frame = corrections.events_frame(corrections.events_for(session=session, judgment_id=judgment_id))
    if frame.empty:
        st.caption("No changes recorded yet.")
        return
    show_table(
        frame,
        key=key,
        columns={"when": datetime_column("When (UTC)"), "reason": text_column("Reason", width="large")},
    )
    csv_download(frame, "history.csv", key=f"{key}_csv")


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
