"""The review page's team-queue pieces (issue 26): which queues a reviewer is offered, the status
of their reservation, and the blind stage of a blind-first queue.

The blind stage is drawn from `queues.BlindItem` alone, which is built from selected columns with
nothing the judge said in them: the question, the plain answer (no highlights) and each metric's
scale. So the judge's score, reason and evidence are neither on the page nor in the websocket
until the reviewer's own scores are saved and the item is revealed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st
from sqlmodel import Session

from lib import queues, reservations
from lib.auth import Permission, PermissionDenied
from lib.corrections import InvalidDecision, MissingReviewer, same_decision
from lib.highlight import sanitize_slug
from lib.models import ReviewQueue, utcnow
from lib.safe_markdown import escape_markdown
from lib.ui import audit_denied, current_actor, current_reviewer, denied_reason, flash, session_scope, write
from lib.ui.evidence import render_long_text
from lib.ui.review import CANCEL_KEY, NEXT_KEY, PREVIOUS_KEY, Target, save_draft

REVEAL_KEY = "Ctrl+Enter"


def queue_label(queue: ReviewQueue, reviewer: str | None) -> str:
    """How a queue reads in the review page's chooser: its name, whose it is, its mode and overlap."""
    whose = (
        "assigned to you"
        if queues.is_assigned(queue, reviewer)
        else "open to all"
        if not queue.reviewers
        else "assigned"
    )
    per_item = f"{queue.overlap} reviewers per item" if queue.overlap > 1 else "1 reviewer per item"
    return f"{queue.name} · {whose} · {queues.MODE_LABELS.get(queue.mode, queue.mode)} · {per_item}"


DEFAULT_LABEL = "Everything pending (default queue)"


def queue_choices(team: Sequence[ReviewQueue], reviewer: str | None) -> list[ReviewQueue]:
    """The team queues a reviewer is offered, theirs first, then those open to everyone (the order of
    `queues.list_queues`); someone who may not review sees every active queue, to read about it."""
    if reviewer and denied_reason(Permission.REVIEW) is None:
        return [q for q in team if queues.may_label(q, reviewer)]
    return list(team)


def lease_status(*, queue_id: int | None, item_key: str, reviewer: str, key: str) -> None:
    """The reviewer's hold on the item, as of this run: until when it is theirs, or that it ran out
    and another reviewer took it (what they typed is kept). Reads only: an open tab alone does not
    keep an item, work on it does. (Not refreshed on a timer: with a 30-second fragment timer the
    keyboard browser test saw a key act on the previously selected row, 3 runs in 4.)"""
    with session_scope(read_only=True) as session:
        row = reservations.find(session, queue_id=queue_id, item_key=item_key, reviewer=reviewer)
    if row is None:
        return
    now = utcnow()
    if row.status == reservations.RESERVED and row.expires_at > now:
        st.caption(
            f"Reserved for you until {row.expires_at:%H:%M} UTC.",
            help="Nobody else is handed this item while it is reserved for you; anything you do on it "
            "(a score, a reason entered) extends the reservation. Leave it, and it returns to the queue.",
        )
    elif row.status == reservations.RESERVED:
        st.caption(
            f"Your reservation ran out at {row.expires_at:%H:%M} UTC. The item is still yours until "
            "another reviewer takes it; anything you do on it renews the reservation."
        )
    elif row.status == reservations.EXPIRED:
        st.warning(
            "Your reservation ran out and another reviewer took this item. What you typed is kept with "
            "it; nothing you do here is saved.",
            icon="⏱️",
        )
        if st.button("Take my next item", key=f"{key}_lease_next", type="primary"):
            st.session_state.pop(f"{key}_shown", None)
            st.query_params.pop("item", None)
            st.rerun()


# ---------------------------------------------------------------------------------------------
# Blind-first: the reviewer's own scores before anything of the judge's


def _blind_draft(key: str) -> dict[str, dict[str, Any]]:
    return dict(st.session_state.get(f"{key}_blind_draft") or {})


def _blind_set(key: str, judgment_id: int, **values: Any) -> None:
    draft = _blind_draft(key)
    draft[str(judgment_id)] = {**draft.get(str(judgment_id), {}), **values}
    st.session_state[f"{key}_blind_draft"] = draft
    target: Target | None = st.session_state.get(f"{key}_blind_target")
    if target is not None:
        save_draft(target, draft)


def _blind_score(key: str, index: int, judgment_id: int, decision: str) -> None:
    """A score button (or its key) in the blind stage: the score is kept as a draft, the cursor goes
    to the row's reason."""
    st.session_state[f"{key}_selected"] = index
    _blind_set(key, judgment_id, decision=decision)
    st.session_state[f"{key}_focus"] = int(st.session_state.get(f"{key}_focus", 0)) + 1


def _blind_reason_typed(key: str, judgment_id: int) -> None:
    _blind_set(key, judgment_id, reason=str(st.session_state.get(f"{key}_blind_{judgment_id}_reason") or ""))


def _blind_value(key: str, judgment_id: int) -> None:
    """A typed score (a scale without score keys) is kept as the draft's decision."""
    value = st.session_state.get(f"{key}_blind_{judgment_id}_value")
    _blind_set(key, judgment_id, decision=None if value is None else str(value))


def _blind_select(key: str, index: int) -> None:
    st.session_state[f"{key}_selected"] = index


def _reveal(key: str, item: queues.BlindItem, flash_key: str) -> None:
    """Save every blind score with its reason; the judge's side is shown once they are all in."""
    actor = current_actor()
    if not actor:
        flash(flash_key, "warning", "Enter your name in the sidebar first: every label records its reviewer.")
        return
    draft = _blind_draft(key)
    labels = [
        queues.LabelInput(
            judgment_id=m.judgment_id,
            decision=draft.get(str(m.judgment_id), {}).get("decision"),
            reason=str(draft.get(str(m.judgment_id), {}).get("reason") or "") or None,
        )
        for m in item.metrics
    ]
    missing = [m.title for m, lab in zip(item.metrics, labels, strict=True) if lab.decision in (None, "")]
    if missing:
        flash(flash_key, "warning", f"Score every metric first; still open: {', '.join(missing)}.")
        return
    try:

        def save(session: Session) -> queues.LabelOutcome:
            outcome = queues.label_item(
                session=session, queue_id=item.queue_id, item_id=item.item_id, reviewer=actor, labels=labels
            )
            queues.save_draft(
                session=session,
                queue_id=item.queue_id,
                item_id=item.item_id,
                reviewer=actor.identity,
                draft={},
            )
            return outcome

        outcome = write(save)
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (
        queues.ItemTaken,
        queues.QueueError,
        queues.QueueNotFound,
        InvalidDecision,
        MissingReviewer,
    ) as exc:
        flash(flash_key, "error", f"Not saved: {exc}")
        return
    st.session_state.pop(f"{key}_blind_draft", None)
    st.session_state.pop(f"{key}_blind_target", None)
    st.session_state[f"{key}_revealed"] = True
    if outcome.revealed:
        flash(
            flash_key,
            "success",
            "Your blind scores are saved. Here is what the judge said: keep your score (✓) or change it; "
            "both are kept.",
        )


def blind_item(item: queues.BlindItem, *, key: str) -> None:
    """The question and the answer of a blind-first item, without highlights or a link to the
    evaluation (its detail view shows the judge)."""
    if item.snapshot_id is not None:
        from lib import display

        st.markdown(
            f"**{escape_markdown(display.evaluation_title(item.question, limit=60))}**  \n"
            f":small[Item {item.position} · {escape_markdown(item.product)} · "
            f"{escape_markdown(item.language or 'unknown language')} · blind-first: the judge is shown "
            "after your scores]"
        )
        render_long_text(item.question, key=f"{key}_question", file_name="question.txt", height=76)
        render_long_text(
            item.answer,
            key=f"{key}_answer",
            file_name=f"{sanitize_slug(item.snapshot_id)}-answer.txt",
            height=470,
        )
    else:
        st.markdown(
            f"**Judgment {escape_markdown(item.change_id or '')}**  \n"
            f":small[Item {item.position} · {escape_markdown(item.product)} · blind-first]"
        )
        if item.description:
            st.markdown(escape_markdown(item.description))
        if item.url:
            st.text(item.url)


@st.fragment
def blind_rows(item: queues.BlindItem, *, key: str, flash_key: str, draft: Mapping[str, Any]) -> None:
    """One row per metric: its name and scale, the score buttons and a reason; then "Save my scores
    and show the judge". Each choice and each reason entered (or left) is kept as the item's draft; only this
    part reruns for it."""
    target = Target(item_key=item.item_key, queue_id=item.queue_id, item_id=item.item_id)
    if st.session_state.get(f"{key}_blind_target") != target:
        st.session_state[f"{key}_blind_target"] = target
        start: dict[str, dict[str, Any]] = {}
        for m in item.metrics:
            saved = (
                dict(draft.get(str(m.judgment_id)) or {})
                if isinstance(draft.get(str(m.judgment_id)), Mapping)
                else {}
            )
            start[str(m.judgment_id)] = {
                "decision": saved.get("decision", m.blind_decision),
                "reason": saved.get("reason", m.blind_reason or ""),
            }
            st.session_state[f"{key}_blind_{m.judgment_id}_reason"] = str(
                start[str(m.judgment_id)]["reason"] or ""
            )
        st.session_state[f"{key}_blind_draft"] = start
        st.session_state[f"{key}_selected"] = 0
    if st.session_state.pop(f"{key}_revealed", False):
        st.rerun()  # the whole page: the judge's side comes with the final stage
    denied = denied_reason(Permission.REVIEW) if current_reviewer() else None
    if denied:
        st.caption(f"🔒 {escape_markdown(denied)}")
    current = _blind_draft(key)
    selected = min(max(int(st.session_state.get(f"{key}_selected", 0)), 0), max(len(item.metrics) - 1, 0))
    st.session_state[f"{key}_selected"] = selected
    st.caption("Score each metric from the answer alone, with a reason; the judge is shown after that.")
    with st.container(gap="xsmall", key=f"{key}_blind_rows"):
        for index, metric in enumerate(item.metrics):
            chosen = current.get(str(metric.judgment_id), {}).get("decision")
            rk = f"{key}_blind_{metric.judgment_id}"
            with st.container(gap="xsmall", key=rk, border=index == selected):
                with st.container(horizontal=True, gap="xsmall", vertical_alignment="center", wrap=False):
                    st.button(
                        escape_markdown(f"▸ {metric.title}" if index == selected else metric.title),
                        key=f"{rk}_name",
                        help=escape_markdown(f"{metric.title} · scale {metric.scale.describe()}"),
                        type="tertiary",
                        width=150,
                        on_click=_blind_select,
                        args=(key, index),
                    )
                    for score_key, decision in metric.keys.items():
                        mine = chosen is not None and same_decision(str(chosen), decision)
                        st.button(
                            decision,
                            key=f"{rk}_score_{score_key}",
                            help=denied or ("Your score" if mine else f"Score {escape_markdown(decision)}"),
                            type="primary" if mine else "secondary",
                            disabled=denied is not None,
                            on_click=_blind_score,
                            args=(key, index, metric.judgment_id, decision),
                            shortcut=score_key if index == selected else None,
                            width=48
                            if index == selected and len(decision) <= 2
                            else 36
                            if len(decision) <= 2
                            else "content",
                        )
                    if not metric.keys:
                        st.number_input(
                            escape_markdown(f"Score for {metric.title} ({metric.scale.describe()})"),
                            key=f"{rk}_value",
                            value=None if chosen in (None, "") else float(chosen),
                            label_visibility="collapsed",
                            placeholder=metric.scale.describe(),
                            on_change=_blind_value,
                            args=(key, metric.judgment_id),
                            width=140,
                        )
                st.text_input(
                    escape_markdown(f"Why, for {metric.title}"),
                    key=f"{rk}_reason",
                    max_chars=4000,
                    placeholder=f"Why, for {metric.title} (kept as a draft when you press Enter or leave the field)",
                    label_visibility="collapsed",
                    on_change=_blind_reason_typed,
                    args=(key, metric.judgment_id),
                    disabled=denied is not None,
                )
    missing = [
        m.title for m in item.metrics if current.get(str(m.judgment_id), {}).get("decision") in (None, "")
    ]
    st.button(
        "Save my scores and show the judge",
        key=f"{key}_reveal",
        type="primary",
        icon=":material/visibility:",
        disabled=denied is not None or bool(missing),
        help=denied
        or (
            f"Score every metric first; still open: {', '.join(missing)}"
            if missing
            else "Your scores are kept as your blind labels"
        ),
        on_click=_reveal,
        args=(key, item, flash_key),
        shortcut=REVEAL_KEY,
    )
    focus = int(st.session_state.get(f"{key}_focus", 0))
    if focus:
        selected_id = item.metrics[selected].judgment_id if item.metrics else 0
        # A constant script apart from two numbers: the selected row's reason takes the cursor.
        st.html(
            f"<script>/* focus {focus} */(function f(n){{const el=document.querySelector("
            f"'.st-key-{key}_blind_{int(selected_id)}_reason input');"
            "if(el&&document.activeElement!==el){el.focus();}if(10>n){setTimeout(()=>f(n+1),100);}})(0);</script>",
            unsafe_allow_javascript=True,
        )


def blind_keys_help() -> str:
    """The key map of the blind stage."""
    return (
        f"Keys: {NEXT_KEY} / {PREVIOUS_KEY} next / previous metric · a score key (1–5 on a 1–5 scale) scores "
        f"the selected metric, then type why · {REVEAL_KEY} saves your scores and shows the judge · "
        f"{CANCEL_KEY} leaves a field."
    )
