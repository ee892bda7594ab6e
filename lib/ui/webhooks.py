"""The Admin page's Webhooks section (issue 29.3): register, pause, rotate, the delivery log, replay.

Leads see it (they may manage webhooks); the rest of the Admin page is for admins.
"""

from __future__ import annotations

import streamlit as st

from lib import auth, webhooks
from lib.safe_markdown import escape_markdown
from lib.ui import csv_download, report_denied, session_scope
from lib.ui.tables import check_column, count_column, datetime_column, show_table, text_column

STATUS_FILTER = ["all", "pending", "delivered", "failed"]


def webhooks_section(actor: auth.Actor) -> None:
    """Webhooks and their delivery log, for a lead or an admin."""
    st.subheader("Webhooks")
    st.caption(
        "Overrule POSTs a signed JSON body to each URL when a judgment is reviewed, overruled, undone "
        "or adjudicated (docs/webhooks.md). Deliveries are sent in the background and retried with "
        "backoff; a receiver that is down never slows or fails a review."
    )
    problem = webhooks.worker_problem()
    if problem:  # an exception's text may quote a URL or a database message
        st.error(escape_markdown(problem))
    with session_scope(read_only=True) as session:
        hooks = webhooks.list_webhooks(session=session)
    if hooks:
        show_table(
            webhooks.webhooks_frame(hooks),
            key="admin_webhooks_table",
            columns={
                "id": count_column("Id"),
                "url": text_column("URL", width="large"),
                "events": text_column("Events", width="medium"),
                "description": text_column("Description"),
                "active": check_column("Active"),
                "created_by": text_column("Registered by"),
                "created_at": datetime_column("Registered (UTC)"),
            },
        )
    else:
        st.caption("No webhooks yet.")
    with st.form("admin_webhook_form", clear_on_submit=True):
        url = st.text_input("URL (https://…)", key="admin_webhook_url")
        events = st.multiselect(
            "Events",
            list(webhooks.WEBHOOK_EVENTS),
            default=["judgment.overruled"],
            format_func=lambda e: f"{e} — {webhooks.EVENT_LABELS[e]}",
            key="admin_webhook_events",
        )
        description = st.text_input("Description (optional)", key="admin_webhook_description")
        add = st.form_submit_button("Register webhook", key="admin_webhook_add")
    if add:
        try:
            with session_scope() as session:
                _, st.session_state["admin_webhook_secret"] = webhooks.register_webhook(
                    session=session, actor=actor, url=url, events=events, description=description
                )
            st.rerun()
        except auth.PermissionDenied as exc:
            report_denied(exc)
        except webhooks.WebhookError as exc:
            st.error(escape_markdown(str(exc)))
    secret = st.session_state.pop("admin_webhook_secret", None)
    if secret:
        st.success(
            "Webhook registered. Copy its signing secret now: it is shown only once. Your receiver "
            "checks the Overrule-Signature header with it.",
            icon="🔑",
        )
        st.code(secret, language=None)
    if hooks:
        labels = {h.id: f"{h.id} · {h.url}" + ("" if h.active else " (paused)") for h in hooks}
        cols = st.columns([3, 1, 1])
        chosen = cols[0].selectbox(
            "Webhook", list(labels), format_func=labels.__getitem__, index=None, key="admin_webhook_chosen"
        )
        current = next((h for h in hooks if h.id == chosen), None)
        toggle = cols[1].button(
            "Resume" if current is not None and not current.active else "Pause",
            key="admin_webhook_toggle",
            disabled=current is None,
        )
        rotate = cols[2].button("New secret", key="admin_webhook_rotate", disabled=current is None)
        if (toggle or rotate) and current is not None and current.id is not None:
            try:
                with session_scope() as session:
                    if toggle:
                        webhooks.set_active(
                            session=session, actor=actor, webhook_id=current.id, active=not current.active
                        )
                    else:
                        st.session_state["admin_webhook_secret"] = webhooks.rotate_secret(
                            session=session, actor=actor, webhook_id=current.id
                        )
                st.rerun()
            except auth.PermissionDenied as exc:
                report_denied(exc)
        _delivery_log(actor)


def _delivery_log(actor: auth.Actor) -> None:
    st.markdown("**Delivery log**")
    with session_scope(read_only=True) as session:
        retention = webhooks.log_retention(session=session)
    st.caption(retention.describe())  # numbers, dates and our own words only: nothing to escape
    status = st.selectbox("Show", STATUS_FILTER, key="admin_webhook_status")
    with session_scope(read_only=True) as session:
        rows = webhooks.list_deliveries(session=session, status=None if status == "all" else status)
    if not rows:
        st.caption("No deliveries yet." if status == "all" else f"No {status} deliveries.")
        return
    frame = webhooks.deliveries_frame(rows)
    show_table(
        frame,
        key="admin_webhook_deliveries",
        columns={
            "id": count_column("Delivery"),
            "webhook_id": count_column("Webhook"),
            "event": text_column("Event"),
            "status": text_column("Status"),
            "attempts": count_column("Attempts"),
            "last_status_code": count_column("Response", help="the last HTTP status; — no response"),
            "last_error": text_column("Last error", width="medium"),
            "created_at": datetime_column("Created (UTC)"),
            "delivered_at": datetime_column("Delivered (UTC)"),
            "next_attempt_at": datetime_column("Next attempt (UTC)"),
            "change_id": text_column("Judgment"),
        },
    )
    csv_download(frame, "webhook-deliveries.csv", key="admin_webhook_deliveries_csv")
    done = [r.id for r in rows if r.status != "pending"]
    if done:
        cols = st.columns([3, 1])
        chosen = cols[0].selectbox("Replay a delivery", done, index=None, key="admin_webhook_replay_choice")
        if (
            cols[1].button("Replay", key="admin_webhook_replay", disabled=chosen is None)
            and chosen is not None
        ):
            try:
                with session_scope() as session:
                    webhooks.replay_delivery(session=session, actor=actor, delivery_id=chosen)
                st.session_state["admin_webhook_notice"] = f"Delivery {chosen} will be sent again."
                st.rerun()
            except auth.PermissionDenied as exc:
                report_denied(exc)
            except webhooks.WebhookError as exc:
                st.error(escape_markdown(str(exc)))
    if notice := st.session_state.pop("admin_webhook_notice", None):
        st.success(notice, icon="✅")
