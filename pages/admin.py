"""Admin: who has which role, what each role may do, API tokens, webhooks, what the OTLP receiver keeps
waiting, and the access audit trail."""

import streamlit as st

from lib import auth, judge_versions, otlp_waiting, tokens
from lib.safe_markdown import escape_markdown
from lib.ui import csv_download, current_actor, denied_reason, report_denied, session_scope
from lib.ui.otlp_waiting import otlp_waiting_section
from lib.ui.tables import check_column, datetime_column, show_table, text_column
from lib.ui.webhooks import webhooks_section

st.title("Admin")
actor = current_actor()
reason = denied_reason(auth.Permission.MANAGE_ROLES, actor)
if reason is not None or actor is None:
    webhooks = actor is not None and denied_reason(auth.Permission.MANAGE_WEBHOOKS, actor) is None
    waiting = actor is not None and denied_reason(auth.Permission.SEE_OTLP_WAITING, actor) is None
    if actor is not None and (webhooks or waiting):
        st.caption(
            "As a lead you manage the webhooks here and see what the OpenTelemetry receiver keeps "
            "waiting; roles, tokens and the audit trail are for admins."
        )
        if webhooks:
            webhooks_section(actor)
        if waiting:
            otlp_waiting_section()
        st.stop()
    st.info(f"Only admins can see this page. {reason or ''}", icon="🔒")
    st.stop()

if auth.open_mode():
    st.warning(
        "Open mode: everyone acts as admin, so roles are not enforced. Set OVERRULE_AUTH_MODE=signin "
        '(see docs/deployment.md, "Sign-in and roles") for the roles below to take effect.',
        icon="⚠️",
    )

st.subheader("Roles")
with session_scope(read_only=True) as session:
    roles = auth.list_roles(session=session)
st.caption(
    f"Identities without a row have the role '{auth.role_of_default('')}' "
    "(OVERRULE_DEFAULT_ROLE); those in OVERRULE_ADMINS start as admin."
)
show_table(
    auth.roles_frame(roles),
    key="admin_roles_table",
    columns={
        "identity": text_column("Identity"),
        "role": text_column("Role"),
        "updated_by": text_column("Set by"),
        "updated_at": datetime_column("Set at (UTC)"),
    },
)

with st.form("admin_role_form", clear_on_submit=True):
    cols = st.columns([3, 1])
    identity = cols[0].text_input(
        "Identity (a verified e-mail, else sub:<issuer>#<sub> as the user's sidebar shows it)",
        key="admin_role_identity",
    )
    role = cols[1].selectbox("Role", auth.ROLES, key="admin_role_role")
    submitted = st.form_submit_button("Set role", key="admin_role_set")
if submitted:
    try:
        with session_scope() as session:
            row = auth.set_role(session=session, actor=actor, identity=identity, role=role)
        st.success(escape_markdown(f"{row.identity} is now {row.role}."), icon="✅")
        st.rerun()
    except auth.PermissionDenied as exc:
        report_denied(exc)
    except ValueError as exc:
        st.error(escape_markdown(str(exc)))

if roles:
    cols = st.columns([3, 1])
    doomed = cols[0].selectbox(
        "Remove a row", [r.identity for r in roles], index=None, key="admin_role_remove"
    )
    if cols[1].button("Remove row", key="admin_role_remove_button", disabled=doomed is None) and doomed:
        with session_scope() as session:
            auth.remove_role(session=session, actor=actor, identity=doomed)
        st.rerun()

st.subheader("Sessions")
st.caption(
    "Signed-in browsers. A session ends on sign-out, when an admin ends it here or removes the "
    f"identity's role row, and {auth.session_max_age_text()} after sign-in (OVERRULE_SESSION_HOURS); "
    "the browser then shows the sign-in screen on its next click."
)
with session_scope(read_only=True) as session:
    live_sessions = auth.list_sessions(session=session)
if auth.open_mode():
    st.caption("Open mode has no sessions: nobody signs in.")
elif not live_sessions:
    st.caption("No live sessions.")
else:
    show_table(
        auth.sessions_frame(live_sessions),
        key="admin_sessions_table",
        columns={
            "identity": text_column("Identity"),
            "started_at": datetime_column("Signed in (UTC)"),
            "last_seen_at": datetime_column("Last seen (UTC)", help="updated at most once a minute"),
            "expires_at": datetime_column("Expires (UTC)"),
        },
    )
    labels = {
        row.id: f"{row.identity} · signed in {row.started_at:%Y-%m-%d %H:%M} UTC" for row in live_sessions
    }
    cols = st.columns([3, 1, 1])
    chosen = cols[0].selectbox(
        "End a session", list(labels), format_func=labels.__getitem__, index=None, key="admin_session_end"
    )
    who = next((row.identity for row in live_sessions if row.id == chosen), None)
    end_one = cols[1].button("End session", key="admin_session_end_button", disabled=chosen is None)
    end_all = cols[2].button(
        "End all of theirs",
        key="admin_session_end_all_button",
        disabled=who is None,
        help="every live session of the same identity",
    )
    if (end_one or end_all) and chosen:
        with session_scope() as session:
            ended = auth.admin_end_sessions(
                session=session, actor=actor, key=None if end_all else chosen, identity=who
            )
        st.session_state["admin_sessions_ended"] = f"{ended} session(s) of {who} ended."
        st.rerun()
if notice := st.session_state.pop("admin_sessions_ended", None):
    st.success(notice, icon="✅")

with st.expander("What each role may do"):
    show_table(
        auth.permissions_frame(),
        key="admin_permissions_table",
        columns={"action": text_column("Action"), **{role: check_column(role) for role in auth.ROLES}},
    )

st.subheader("API tokens")
st.caption("Bearer tokens for the pipeline API at /api/v1 (docs/api.md); only their hashes are stored.")
with session_scope(read_only=True) as session:
    token_rows = tokens.list_tokens(session=session)
show_table(
    tokens.tokens_frame(token_rows),
    key="admin_tokens_table",
    columns={
        "name": text_column("Name"),
        "role": text_column("Role"),
        "state": text_column("State"),
        "created_by": text_column("Created by"),
        "created_at": datetime_column("Created (UTC)"),
        "expires_at": datetime_column("Expires (UTC)", help="— until revoked"),
        "last_used_at": datetime_column("Last used (UTC)", help="to the minute; — never used"),
        "revoked_at": datetime_column("Revoked (UTC)", help="— while the token is live"),
    },
)
LIFETIMES = {
    "never (until revoked)": None,
    "1 day": "1d",
    "7 days": "7d",
    "30 days": "30d",
    "90 days": "90d",
    "1 year": "1y",
}
with st.form("admin_token_form", clear_on_submit=True):
    cols = st.columns([3, 1, 1])
    token_name = cols[0].text_input(
        "Token name (recorded as the actor of its writes)", key="admin_token_name"
    )
    token_role = cols[1].selectbox("Role", auth.ROLES, index=2, key="admin_token_role")
    lifetime = cols[2].selectbox("Expires after", list(LIFETIMES), key="admin_token_lifetime")
    create = st.form_submit_button("Create token", key="admin_token_create")
if create:
    try:
        with session_scope() as session:
            _, st.session_state["admin_new_token_secret"] = tokens.create_token(
                session=session,
                actor=actor,
                name=token_name,
                role=token_role,
                expires_in=tokens.parse_lifetime(LIFETIMES[lifetime]) if LIFETIMES[lifetime] else None,
            )
        st.rerun()
    except auth.PermissionDenied as exc:
        report_denied(exc)
    except ValueError as exc:
        st.error(escape_markdown(str(exc)))
new_secret = st.session_state.pop("admin_new_token_secret", None)
if new_secret:
    st.success("Token created. Copy its secret now: it is not stored and will not be shown again.", icon="🔑")
    st.code(new_secret, language=None)
live = [t.name for t in token_rows if t.revoked_at is None]  # expired ones too: revoke to be sure
if live:
    cols = st.columns([3, 1])
    revoked = cols[0].selectbox("Revoke a token", live, index=None, key="admin_token_revoke")
    if cols[1].button("Revoke", key="admin_token_revoke_button", disabled=revoked is None) and revoked:
        with session_scope() as session:
            tokens.revoke_token(session=session, actor=actor, name=revoked)
        st.rerun()

webhooks_section(actor)
otlp_waiting_section()

st.subheader("Audit trail")
action = st.selectbox(
    "Show",
    [
        "all",
        "sign_in",
        "session_end",
        "role_change",
        "denied",
        "api_refused",
        "refusals_dropped",
        judge_versions.AUDIT_ACTION,
        otlp_waiting.SWEPT_ACTION,
        otlp_waiting.REFUSED_ACTION,
    ],
    key="admin_audit_action",
)
with session_scope(read_only=True) as session:
    events = auth.list_events(session=session, action=None if action == "all" else action)
frame = auth.events_frame(events)
show_table(
    frame,
    key="admin_audit_table",
    columns={
        "at": datetime_column("When (UTC)"),
        "identity": text_column("Identity"),
        "action": text_column("Action"),
        "detail": text_column("Detail", width="large"),
    },
)
csv_download(frame, "audit.csv", key="admin_audit_csv")
