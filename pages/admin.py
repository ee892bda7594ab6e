"""Admin: who has which role, what each role may do, and the access audit trail."""

import streamlit as st

from lib import auth
from lib.ui import csv_download, current_actor, denied_reason, report_denied, session_scope

st.title("Admin")
actor = current_actor()
reason = denied_reason(auth.Permission.MANAGE_ROLES, actor)
if reason is not None or actor is None:
    st.info(f"Only admins can see this page. {reason or ''}", icon="🔒")
    st.stop()

if auth.open_mode():
    st.warning(
        "Open mode: everyone acts as admin, so roles are not enforced. Set OVERRULE_AUTH_MODE=signin "
        '(see the README, "Sign-in and roles") for the roles below to take effect.',
        icon="⚠️",
    )

st.subheader("Roles")
with session_scope(read_only=True) as session:
    roles = auth.list_roles(session=session)
st.caption(
    f"Identities without a row have the role '{auth.role_of_default('')}' "
    "(OVERRULE_DEFAULT_ROLE); those in OVERRULE_ADMINS start as admin."
)
st.dataframe(auth.roles_frame(roles), hide_index=True, key="admin_roles_table")

with st.form("admin_role_form", clear_on_submit=True):
    cols = st.columns([3, 1])
    identity = cols[0].text_input("Identity (e-mail, else the provider's sub)", key="admin_role_identity")
    role = cols[1].selectbox("Role", auth.ROLES, key="admin_role_role")
    submitted = st.form_submit_button("Set role", key="admin_role_set")
if submitted:
    try:
        with session_scope() as session:
            row = auth.set_role(session=session, actor=actor, identity=identity, role=role)
        st.success(f"{row.identity} is now {row.role}.", icon="✅")
        st.rerun()
    except auth.PermissionDenied as exc:
        report_denied(exc)
    except ValueError as exc:
        st.error(str(exc))

if roles:
    cols = st.columns([3, 1])
    doomed = cols[0].selectbox(
        "Remove a row", [r.identity for r in roles], index=None, key="admin_role_remove"
    )
    if cols[1].button("Remove row", key="admin_role_remove_button", disabled=doomed is None) and doomed:
        with session_scope() as session:
            auth.remove_role(session=session, actor=actor, identity=doomed)
        st.rerun()

with st.expander("What each role may do"):
    st.dataframe(auth.permissions_frame(), hide_index=True, key="admin_permissions_table")

st.subheader("Audit trail")
action = st.selectbox("Show", ["all", "sign_in", "role_change", "denied"], key="admin_audit_action")
with session_scope(read_only=True) as session:
    events = auth.list_events(session=session, action=None if action == "all" else action)
frame = auth.events_frame(events)
st.dataframe(frame, hide_index=True, key="admin_audit_table")
csv_download(frame, "audit.csv", key="admin_audit_csv")
