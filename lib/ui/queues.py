"""The Team queues page's widgets (issue 26): the list of queues with their progress, one queue's
progress per reviewer and its agreement, the adjudication list (every label and reason side by
side, and the lead's decision), and the form that creates a queue with a preview of what it takes.

Every rule is lib.queues': these widgets read, call and report. Who may do what comes from the
permission table (a lead creates, assigns, closes and adjudicates; a viewer reads).
"""

from __future__ import annotations

from datetime import date
from typing import Any

import streamlit as st

from lib import corrections, display, queues, review_queue
from lib.auth import Permission, PermissionDenied
from lib.corrections import InvalidDecision, NothingToUndo
from lib.models import ReviewQueue
from lib.safe_markdown import escape_markdown
from lib.ui import (
    audit_denied,
    csv_download,
    current_actor,
    current_reviewer,
    denied_reason,
    flash,
    pager,
    session_scope,
    show_flash,
    write,
)
from lib.ui.tables import count_column, datetime_column, link_column, rate_column, show_table, text_column

ANY = "Any"
CSV_ROWS = 10_000  # judgments in the adjudication list's CSV at most (a queue holds up to 100k items)
SELECTED = "queues_selected"  # the page's chosen queue id (session state)
STATE_LABELS = {
    "disputed": "Awaiting a lead",
    "adjudicated": "Decided by a lead",
    "resolved": "Decided by agreement",
}
REVIEW_STATE_LABELS = {
    "unreviewed": "Pending (not reviewed yet)",
    "confirmed": "Confirmed",
    "corrected": "Corrected",
    "reviewed": "Reviewed (confirmed or corrected)",
    None: "Any",
}


def queue_url(queue_id: int, tab: str | None = None) -> str:
    """This page for one queue (`/queues?queue=…`), optionally on a tab."""
    return display.page_url("queues", {"queue": str(queue_id), "tab": tab or ""})


def queues_table(rows: list[tuple[ReviewQueue, queues.QueueProgress]], *, key: str) -> None:
    """Every queue with its progress, and the CSV of what is shown."""
    frame = queues.queue_overview_frame(rows)
    shown = frame.assign(open=[queue_url(int(i)) for i in frame["id"]])
    show_table(
        shown,
        key=key,
        columns={
            "open": link_column("Queue", text="Open"),
            "name": text_column("Name", width="medium"),
            "status": text_column("Status"),
            "mode": text_column("Mode"),
            "overlap": count_column("Reviewers per item"),
            "reviewers": text_column("Assigned to"),
            "items": count_column("Items"),
            "items_done": count_column("Done"),
            "reserved": count_column("Reserved now"),
            "remaining": count_column("Remaining"),
            "awaiting_adjudication": count_column("Awaiting a lead"),
            "resolved": count_column("Agreed"),
            "adjudicated": count_column("Adjudicated"),
            "progress": rate_column("Progress"),
            "created_by": text_column("Created by"),
            "created_at": datetime_column("Created (UTC)"),
            "id": None,
        },
        order=[
            "open", "name", "status", "progress", "items", "items_done", "reserved", "remaining",
            "awaiting_adjudication", "mode", "overlap", "reviewers", "resolved", "adjudicated", "created_by",
            "created_at",
        ],
    )  # fmt: skip
    csv_download(frame, "queues.csv", key=f"{key}_csv")


def queue_summary(queue: ReviewQueue, progress: queues.QueueProgress, *, key: str) -> None:
    """One queue at a glance: its settings, and items done / reserved / remaining / awaiting a lead."""
    who = ", ".join(queue.reviewers or []) or "any reviewer"
    st.markdown(f"#### {escape_markdown(queue.name)}")
    if queue.description:
        st.markdown(escape_markdown(queue.description))
    facts = [
        queues.MODE_LABELS.get(queue.mode, queue.mode),
        f"{queue.overlap} reviewer(s) per item",
        queues.ORDER_LABELS.get(queue.item_order, queue.item_order),
        f"assigned to {who}",
        f"created by {queue.created_by or 'unknown'}",
    ]
    if queue.tolerance is not None:
        facts.append(f"tolerance {queue.tolerance:g}")
    if queue.status != "active":
        facts.append(f"closed {queue.closed_at:%Y-%m-%d %H:%M} UTC" if queue.closed_at else "closed")
    st.caption(escape_markdown(" · ".join(facts)))
    cols = st.columns(5)
    cols[0].metric("Items done", f"{progress.items_done:,} of {progress.items:,}")
    cols[1].metric("Reserved now", f"{progress.reserved:,}")
    cols[2].metric("Remaining", f"{progress.remaining:,}")
    cols[3].metric("Awaiting a lead", f"{progress.disputed:,}")
    cols[4].metric("Decided", f"{progress.decided:,} of {progress.judgments:,}", help="Judgments decided by "
                   "agreeing labels or by a lead; only these reach the judgment and everything downstream.")  # fmt: skip
    st.progress(progress.fraction, text=f"{progress.fraction:.0%} of the items have every label they need")


def reviewer_table(queue_id: int, *, key: str) -> None:
    """Per reviewer: done, reserved, skipped, labels, awaiting a lead, items per hour; and its CSV."""
    with session_scope(read_only=True) as session:
        frame = queues.reviewer_progress_frame(queues.reviewer_progress(session=session, queue_id=queue_id))
    if frame.empty:
        st.caption("No reviewer has taken an item yet.")
        return
    show_table(
        frame,
        key=key,
        columns={
            "reviewer": text_column("Reviewer"),
            "assigned": text_column("Assigned"),
            "done": count_column("Items done"),
            "reserved": count_column("Reserved now"),
            "skipped": count_column("Skipped"),
            "labels": count_column("Labels"),
            "awaiting_adjudication": count_column("Labels awaiting a lead"),
            "items_per_hour": st.column_config.NumberColumn(
                "Items per hour", format="%.1f", help="Items done ÷ the time spent holding items"
            ),
            "last_active": datetime_column("Last active (UTC)"),
        },
    )
    csv_download(frame, f"queue-{queue_id}-reviewers.csv", key=f"{key}_csv")


def _save_assignment(queue_id: int, key: str, flash_key: str) -> None:
    reviewers = list(st.session_state.get(f"{key}_reviewers") or [])
    description = str(st.session_state.get(f"{key}_description") or "")
    try:
        with session_scope() as session:
            queues.update_queue(
                session=session,
                actor=current_actor(),
                queue_id=queue_id,
                reviewers=reviewers,
                description=description,
            )
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (queues.QueueError, queues.QueueNotFound) as exc:
        flash(flash_key, "error", f"Not saved: {exc}")
        return
    flash(flash_key, "success", f"Saved: assigned to {', '.join(reviewers) or 'any reviewer'}.")


def _close(queue_id: int, flash_key: str) -> None:
    try:
        with session_scope() as session:
            queue = queues.close_queue(session=session, actor=current_actor(), queue_id=queue_id)
            name = queue.name
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (queues.QueueError, queues.QueueNotFound) as exc:
        flash(flash_key, "error", f"Not closed: {exc}")
        return
    flash(
        flash_key,
        "success",
        f"Closed {name}: its undecided judgments are back in the default queue; labels and decisions stay.",
    )


def manage_queue(queue: ReviewQueue, *, key: str, flash_key: str) -> None:
    """Assign reviewers, describe or close a queue (a lead); others see why they cannot."""
    assert queue.id is not None
    denied = denied_reason(Permission.MANAGE_QUEUES)
    if denied:
        st.caption(f"🔒 {escape_markdown(denied)}")
        return
    if queue.status != "active":
        st.caption("This queue is closed.")
        return
    with session_scope(read_only=True) as session:
        names = queues.reviewer_names(session=session)
    st.session_state.setdefault(f"{key}_reviewers", list(queue.reviewers or []))
    st.session_state.setdefault(f"{key}_description", queue.description or "")
    st.multiselect(
        "Assigned reviewers (none: any reviewer may take items)",
        sorted({*names, *(queue.reviewers or [])}),
        key=f"{key}_reviewers",
        accept_new_options=True,
        help="Names or e-mails as they sign in (compared case-insensitively). Reviewers taken off keep "
        "their labels but take no new items.",
    )
    st.text_area("Description", key=f"{key}_description", height=68, max_chars=2000)
    st.button("Save", key=f"{key}_save", on_click=_save_assignment, args=(queue.id, key, flash_key))
    st.divider()
    sure = st.checkbox(
        "Close this queue: its undecided judgments go back to the default queue", key=f"{key}_close_sure"
    )
    st.button(
        "Close queue",
        key=f"{key}_close",
        disabled=not sure,
        on_click=_close,
        args=(queue.id, flash_key),
        icon=":material/lock:",
    )


# ---------------------------------------------------------------------------------------------
# Adjudication: every label and reason side by side, and the lead's decision


def _adjudicate(queue_id: int, judgment_id: int, key: str, flash_key: str) -> None:
    decision = st.session_state.get(f"{key}_decision")
    reason = str(st.session_state.get(f"{key}_reason") or "")
    if decision in (None, ""):
        flash(flash_key, "warning", "Pick the decision first.")
        return
    try:
        actor = current_actor()
        write(
            lambda session: queues.adjudicate(
                session=session, queue_id=queue_id, judgment_id=judgment_id, actor=actor,
                decision=decision, reason=reason or None,
            )
        )  # fmt: skip
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (queues.QueueError, queues.QueueNotFound, InvalidDecision) as exc:
        flash(flash_key, "error", f"Not decided: {exc}")
        return
    flash(
        flash_key,
        "success",
        f"Decided judgment {judgment_id}: {decision}. It reaches the judgment as a review.",
    )


def _undo_adjudication(queue_id: int, judgment_id: int, flash_key: str) -> None:
    try:
        actor = current_actor()
        write(
            lambda session: queues.undo_adjudication(
                session=session, queue_id=queue_id, judgment_id=judgment_id, actor=actor
            )
        )
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except (queues.QueueError, queues.QueueNotFound, NothingToUndo) as exc:
        flash(flash_key, "error", f"Not undone: {exc}")
        return
    flash(flash_key, "success", f"Your decision on judgment {judgment_id} is undone: it awaits a lead again.")


def _label_card(view: queues.LabelView, blind: bool) -> None:
    """One reviewer's label: who, their blind score (blind-first), their final one, why, when."""
    with st.container(border=True, gap="xsmall"):
        st.markdown(f"**{escape_markdown(view.reviewer)}**")
        if blind:
            reason = f" — {view.blind_reason}" if view.blind_reason else ""
            st.caption(escape_markdown(f"Blind: {view.blind_decision or '—'}{reason}"))
        st.markdown(f"**{escape_markdown(view.decision or '—')}**")
        st.markdown(escape_markdown(view.reason) if view.reason else ":gray[no reason]")
        if view.labelled_at:
            st.caption(f"{view.labelled_at:%Y-%m-%d %H:%M} UTC")


def _decision_widget(scale: corrections.DecisionScale, *, key: str, suggestions: list[str]) -> None:
    """The lead's decision on the judgment's scale: a label, or a score within its bounds."""
    if not scale.is_score:
        st.selectbox("Decision", scale.labels, index=None, key=key, placeholder="Pick a label")
        return
    spec = scale.spec
    assert spec is not None
    bounded = spec.min_value != float("-inf") and spec.max_value != float("inf")
    integer = spec.integer_scale
    st.number_input(
        f"Decision ({scale.describe()})",
        min_value=(int(spec.min_value) if integer else spec.min_value) if bounded else None,
        max_value=(int(spec.max_value) if integer else spec.max_value) if bounded else None,
        value=None,
        step=1 if integer else 0.05,
        key=key,
        placeholder=f"e.g. {suggestions[0]}" if suggestions else None,
    )


def dispute_card(dispute: queues.Dispute, queue: ReviewQueue, *, key: str, flash_key: str) -> None:
    """A judgment with every reviewer's label and reason side by side, the judge's for reference,
    and (awaiting a lead) the decision form; (decided by this lead) an undo."""
    judgment = dispute.judgment
    assert judgment.id is not None and queue.id is not None
    with session_scope(read_only=True) as session:
        scale = corrections.decision_scale(session=session, judgment=judgment)
    ck = f"{key}_{judgment.id}"
    with st.container(border=True, key=ck):
        where = (
            f"[evaluation {escape_markdown(judgment.snapshot_id)}]({display.evaluation_url(judgment.snapshot_id)})"
            if judgment.snapshot_id
            else escape_markdown(judgment.change_id)
        )
        title = (
            scale.spec.display_name if scale.spec is not None and judgment.metric else judgment.metric
        ) or "Decision"
        st.markdown(
            f"**Item {dispute.position}** · {escape_markdown(title)} · {where} :small[scale "
            f"{escape_markdown(scale.describe())}]"
        )
        st.markdown(
            f"Judge: **{escape_markdown(judgment.decision)}**"
            + (f" — {escape_markdown(judgment.reasoning)}" if judgment.reasoning else "")
        )
        if dispute.labels:
            for column, view in zip(st.columns(len(dispute.labels)), dispute.labels, strict=True):
                with column:
                    _label_card(view, blind=queue.mode == "blind")
        if dispute.state == "disputed":
            denied = denied_reason(Permission.ADJUDICATE)
            if denied:
                st.caption(f"🔒 {escape_markdown(denied)}")
                return
            with st.container(horizontal=True, gap="small", vertical_alignment="bottom"):
                _decision_widget(
                    scale, key=f"{ck}_decision", suggestions=[v.decision or "" for v in dispute.labels]
                )
                st.text_input(
                    "Reason (needed when it differs from the judge)",
                    key=f"{ck}_reason",
                    max_chars=4000,
                    width=420,
                )
                st.button(
                    "Decide",
                    key=f"{ck}_decide",
                    type="primary",
                    on_click=_adjudicate,
                    args=(queue.id, judgment.id, ck, flash_key),
                )
        elif dispute.state == "adjudicated":
            st.caption(escape_markdown(f"Decided {dispute.decision} by {dispute.decided_by}."))
            if dispute.decided_by and dispute.decided_by == current_reviewer():
                st.button(
                    "Undo my decision",
                    key=f"{ck}_undo",
                    icon=":material/undo:",
                    on_click=_undo_adjudication,
                    args=(queue.id, judgment.id, flash_key),
                )
        else:
            st.caption(escape_markdown(f"Agreed: {dispute.decision}."))


def adjudication_list(
    queue: ReviewQueue, progress: queues.QueueProgress, *, key: str, flash_key: str
) -> None:
    """The queue's judgments awaiting a lead (or decided), a page at a time, each with its labels."""
    assert queue.id is not None
    state = st.segmented_control(
        "Show",
        list(STATE_LABELS),
        format_func=STATE_LABELS.__getitem__,
        default="disputed",
        key=f"{key}_state",
        required=True,
    )
    total = {
        "disputed": progress.disputed,
        "adjudicated": progress.adjudicated,
        "resolved": progress.resolved,
    }[state]
    show_flash(flash_key)
    if not total:
        st.info(
            "Nothing awaits a lead in this queue."
            if state == "disputed"
            else "No judgment is in this state yet.",
            icon="✅" if state == "disputed" else None,
        )
        return
    offset, limit = pager(total, key=f"{key}_page", page_size=10)
    with session_scope(read_only=True) as session:
        rows = queues.disputes(session=session, queue_id=queue.id, state=state, offset=offset, limit=limit)
        every = queues.disputes(session=session, queue_id=queue.id, state=state, limit=CSV_ROWS)
    st.caption(f"{total:,} judgment(s) {STATE_LABELS[state].lower()}.")
    csv_download(
        queues.disputes_frame(every),
        f"queue-{queue.id}-{state}.csv",
        key=f"{key}_csv",
        label="Download CSV (every judgment in this list, labels side by side)"
        if total <= CSV_ROWS
        else f"Download CSV (the first {CSV_ROWS:,})",
    )
    for dispute in rows:
        dispute_card(dispute, queue, key=f"{key}_card", flash_key=flash_key)


# ---------------------------------------------------------------------------------------------
# Creating a queue


def _spec(key: str) -> queues.QueueSpec:
    """The form's values as a QueueSpec (unchecked: lib checks it)."""
    state = st.session_state

    def pick(name: str) -> Any:
        value = state.get(f"{key}_{name}")
        return None if value in (ANY, "", None) else value

    tolerance = pick("tolerance")
    return queues.QueueSpec(
        name=str(state.get(f"{key}_name") or ""),
        description=str(state.get(f"{key}_description") or ""),
        product=pick("product"),
        metrics=tuple(state.get(f"{key}_metrics") or ()),
        language=pick("language"),
        since=pick("since"),
        until=pick("until"),
        review_state=state.get(f"{key}_review_state", "unreviewed"),
        size=int(state.get(f"{key}_size") or 100),
        order=str(state.get(f"{key}_order") or "oldest"),
        seed=int(state.get(f"{key}_seed") or 0),
        overlap=int(state.get(f"{key}_overlap") or 1),
        mode=str(state.get(f"{key}_mode") or "open"),
        tolerance=None if tolerance is None else float(tolerance),
        reviewers=tuple(state.get(f"{key}_reviewers") or ()),
    )


def _create(key: str, flash_key: str) -> None:
    try:
        with session_scope() as session:
            queue = queues.create_queue(session=session, actor=current_actor(), spec=_spec(key))
            queue_id, name, items, judgments = queue.id, queue.name, queue.items, queue.judgments
    except PermissionDenied as exc:
        flash(flash_key, "error", audit_denied(exc))
        return
    except queues.QueueError as exc:
        flash(flash_key, "error", f"Not created: {exc}")
        return
    st.session_state[SELECTED] = queue_id  # the page shows the new queue
    st.session_state[f"{key}_name"] = ""
    # Flashed by the form's next run, just before it reruns the whole page (which shows it).
    st.session_state[f"{key}_created"] = (
        f"Created {name}: {items:,} items ({judgments:,} judgments). Reviewers find it on the Review queue page."
    )


@st.fragment
def create_form(*, key: str, flash_key: str) -> None:
    """The new queue's filter, size, order, reviewers per item, mode and reviewers, with a live
    preview of how many items match. Creating one reruns the whole page, which then shows it."""
    denied = denied_reason(Permission.MANAGE_QUEUES)
    if denied:
        st.info(f"🔒 {escape_markdown(denied)} Leads create queues; you can read the existing ones.")
        return
    created = st.session_state.pop(f"{key}_created", None)
    if created is not None:
        flash(flash_key, "success", created)
        st.rerun()  # the whole page: the new queue is in the list, the outcome shows at its top
    show_flash(flash_key)
    with session_scope(read_only=True) as session:
        options = review_queue.queue_options(session=session)
        product = st.session_state.get(f"{key}_product", ANY)
        metric_choices = (
            corrections.distinct_metrics(session=session, products=[product])
            if product in options["products"]
            else options["metrics"]
        )
        names = queues.reviewer_names(session=session)
    chosen = st.session_state.get(f"{key}_metrics")
    if chosen:  # a product change can leave metrics the new product does not have
        st.session_state[f"{key}_metrics"] = [m for m in chosen if m in metric_choices]
    st.text_input("Name", key=f"{key}_name", max_chars=queues.MAX_NAME_CHARS, placeholder="e.g. Acme week 12")
    st.text_input("Description (optional)", key=f"{key}_description", max_chars=2000)
    st.markdown("**Which judgments**")
    a, b, c = st.columns(3)
    a.selectbox("Product", [ANY, *options["products"]], key=f"{key}_product")
    b.multiselect("Metrics (none: all)", metric_choices, key=f"{key}_metrics")
    c.selectbox("Language", [ANY, *options["languages"]], key=f"{key}_language")
    a, b, c = st.columns(3)
    a.date_input("Judged on or after", value=None, key=f"{key}_since", max_value=date(2100, 1, 1))
    b.date_input("Judged on or before", value=None, key=f"{key}_until", max_value=date(2100, 1, 1))
    c.selectbox(
        "Review state",
        list(REVIEW_STATE_LABELS),
        format_func=REVIEW_STATE_LABELS.__getitem__,
        key=f"{key}_review_state",
        help="Pending: not reviewed yet. A queue over reviewed judgments gives past reviews a second opinion.",
    )
    st.markdown("**How many, in which order**")
    a, b, c = st.columns(3)
    a.number_input(
        "Size (items)", min_value=1, max_value=queues.MAX_QUEUE_ITEMS, value=100, step=10, key=f"{key}_size"
    )
    b.radio(
        "Order", list(queues.ORDER_LABELS), format_func=queues.ORDER_LABELS.__getitem__, key=f"{key}_order"
    )
    if st.session_state.get(f"{key}_order") == "random":
        c.number_input("Seed", min_value=0, value=0, step=1, key=f"{key}_seed",
                       help="The same seed over the same data draws the same sample.")  # fmt: skip
    st.markdown("**How it is reviewed**")
    a, b, c = st.columns(3)
    a.number_input(
        "Reviewers per item (overlap)",
        min_value=1,
        max_value=queues.MAX_OVERLAP,
        value=1,
        step=1,
        key=f"{key}_overlap",
    )
    b.radio(
        "Mode",
        list(queues.MODE_LABELS),
        format_func=queues.MODE_LABELS.__getitem__,
        key=f"{key}_mode",
        help="Blind-first: reviewers score each metric before the judge's score, reason and highlights "
        "are shown; then they keep or change their score. Both are kept.",
    )
    c.number_input(
        "Tolerance (continuous scales)",
        min_value=0.0,
        value=None,
        step=0.05,
        key=f"{key}_tolerance",
        help="Labels this close on a continuous scale (e.g. 0–1) count as agreeing; their mean decides.",
    )
    st.multiselect(
        "Assigned reviewers (none: any reviewer may take items)",
        names,
        key=f"{key}_reviewers",
        accept_new_options=True,
        help="Names or e-mails as they sign in. With reviewers assigned, only they take items.",
    )
    spec = _spec(key)
    try:
        with session_scope(read_only=True) as session:
            preview = queues.preview_queue(session=session, spec=spec)
    except queues.QueueError as exc:
        st.warning(escape_markdown(str(exc)), icon="⚠️")
        preview = None
    if preview is not None:
        more = "+" if preview.capped else ""
        if preview.items:
            st.info(
                f"{preview.items:,}{more} items match ({preview.judgments:,}{more} judgments, leaving out "
                f"judgments another queue holds). The queue takes {preview.taken(spec.size):,} of them, "
                f"{queues.ORDER_LABELS[spec.order].lower()}; each is labelled by {spec.overlap} reviewer(s).",
                icon="🔎",
            )
        else:
            st.warning(
                "No judgments match these filters (judgments already in a queue are left out).", icon="🔎"
            )
    st.button(
        "Create queue",
        key=f"{key}_create",
        type="primary",
        disabled=not (preview and preview.items and spec.name.strip()),
        help=None if spec.name.strip() else "Name the queue first",
        on_click=_create,
        args=(key, flash_key),
    )
