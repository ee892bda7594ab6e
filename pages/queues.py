"""Team queues: where a lead creates review queues and follows them — progress per queue and per
reviewer, agreement between reviewers, and the judgments awaiting a lead's decision. Reviewers
label a queue's items on the Review queue page; anyone may read this one.

`/queues?queue=<id>&tab=<queues|adjudication|new>` opens a queue on a tab.
"""

import streamlit as st

from lib import queues
from lib.auth import Permission
from lib.safe_markdown import escape_markdown
from lib.ui import denied_reason, session_scope, show_flash
from lib.ui.agreement import queue_agreement
from lib.ui.queues import (
    SELECTED,
    adjudication_list,
    create_form,
    manage_queue,
    queue_summary,
    queues_table,
    reviewer_table,
)
from lib.ui.tables import link_to

FLASH = "queues_flash"
TABS = {"queues": "Queues and progress", "adjudication": "Awaiting a lead", "new": "New queue"}
TAB_KEY = "queues_tab"

st.title("Team queues")
st.caption(
    "A lead puts judgments into a queue; each item is labelled by as many reviewers as the queue asks "
    "(on the Review queue page), optionally blind-first. Labels that agree decide a judgment; the others "
    "wait here for a lead. Only decided judgments reach the judge's correction history and the statistics."
)
show_flash(FLASH)

include_closed = st.toggle("Show closed queues", key="queues_closed")
with session_scope(read_only=True) as session:
    listed = queues.list_queues(session=session, include_closed=include_closed)
    progress = {q.id: queues.queue_progress(session=session, queue_id=q.id or 0) for q in listed}
by_id = {q.id: q for q in listed}

if SELECTED not in st.session_state:  # a link names a queue (id or name) and a tab
    wanted = str(st.query_params.get("queue") or "")
    st.session_state[SELECTED] = next((q.id for q in listed if wanted in (str(q.id), q.name)), None)
    if wanted and st.session_state[SELECTED] is None:
        st.info(
            f"There is no queue {escape_markdown(repr(wanted))} (a closed one shows with the toggle above)."
        )
    tab = st.query_params.get("tab")
    if tab in TABS:
        st.session_state[TAB_KEY] = TABS[tab]
if st.session_state[SELECTED] not in by_id:
    st.session_state[SELECTED] = next(iter(by_id), None)
if st.session_state[SELECTED] is not None:
    st.query_params["queue"] = str(st.session_state[SELECTED])

tab_list, tab_disputes, tab_new = st.tabs(list(TABS.values()), key=TAB_KEY, on_change="rerun")
selected = by_id.get(st.session_state[SELECTED])

if tab_list.open:
    with tab_list:
        if not listed:
            st.info(
                "No team queue yet. A lead creates one on the “New queue” tab; until then every reviewer "
                "works the default queue (everything pending, one reviewer per item).",
                icon="👥",
            )
        else:
            queues_table([(q, progress[q.id]) for q in listed], key="queues_table")
            st.selectbox(
                "Queue",
                list(by_id),
                format_func=lambda i: by_id[i].name,
                key=SELECTED,
                help="The queue shown below and on the “Awaiting a lead” tab.",
                persist_state="session",
            )
            if selected is not None:
                assert selected.id is not None
                queue_summary(selected, progress[selected.id], key="queues_summary")
                if selected.status == "active":
                    link_to(
                        "pages/review.py",
                        "Review this queue",
                        url_path="review",
                        query={"queue": str(selected.id)},
                        icon="✅",
                    )
                st.markdown("**Per reviewer**")
                reviewer_table(selected.id, key="queues_reviewers")
                st.markdown("**Agreement between reviewers**")
                queue_agreement(queue_id=selected.id, key="queues_agreement")
                with st.expander("Assign reviewers, describe or close", icon=":material/settings:"):
                    manage_queue(selected, key=f"queues_manage_{selected.id}", flash_key=FLASH)

if tab_disputes.open:
    with tab_disputes:
        if selected is None:
            st.info("Pick a queue on the first tab; its disputed judgments show here.")
        else:
            assert selected.id is not None
            st.selectbox(
                "Queue",
                list(by_id),
                format_func=lambda i: by_id[i].name,
                key=SELECTED,
                persist_state="session",
            )
            if denied := denied_reason(Permission.ADJUDICATE):
                st.caption(f"🔒 {escape_markdown(denied)} You can read every label and reason.")
            adjudication_list(selected, progress[selected.id], key="queues_disputes", flash_key=FLASH)

if tab_new.open:
    with tab_new:
        create_form(key="queues_new", flash_key=FLASH)
