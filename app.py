"""Overrule: page router and shared sidebar. Pages live in pages/, the work in lib/."""

import streamlit as st

from lib.auth import PermissionDenied
from lib.config import ConfigError, get_settings
from lib.ui import report_denied, reviewer_sidebar, sign_in_gate

st.set_page_config(page_title="Overrule", page_icon="⚖️", layout="wide")

try:
    get_settings()
except ConfigError as exc:
    st.error(f"Overrule cannot start: {exc}")
    st.stop()

sign_in_gate()  # sign-in mode: nothing of the app before the provider has signed the user in

pages = [
    st.Page("pages/overview.py", title="Overview", icon="🏠", url_path="", default=True),
    st.Page("pages/import_data.py", title="Import", icon="📥", url_path="import"),
    st.Page("pages/evaluations.py", title="Evaluations", icon="🔎", url_path="evaluations"),
    st.Page("pages/review.py", title="Review queue", icon="✅", url_path="review"),
    st.Page("pages/queues.py", title="Team queues", icon="👥", url_path="queues"),
    st.Page("pages/corrections.py", title="Corrections", icon="🧠", url_path="corrections"),
    st.Page("pages/new_evaluation.py", title="New evaluation", icon="➕", url_path="new"),
    st.Page("pages/coach.py", title="Coach", icon="💬", url_path="coach"),
    st.Page("pages/notes.py", title="Notes", icon="🗒️", url_path="notes"),
    st.Page("pages/tag_scores.py", title="Tag scores", icon="🏷️", url_path="tag-scores"),
    st.Page("pages/analytics.py", title="Analytics", icon="📊", url_path="analytics"),
    st.Page("pages/alignment.py", title="Alignment lab", icon="🧪", url_path="alignment"),
    st.Page("pages/judge_versions.py", title="Judge versions", icon="🧬", url_path="judge-versions"),
    st.Page("pages/precedents.py", title="Precedents", icon="🧾", url_path="precedents"),
    st.Page("pages/admin.py", title="Admin", icon="🛡️", url_path="admin"),
]
navigation = st.navigation(pages)
reviewer_sidebar()
try:
    navigation.run()
except PermissionDenied as exc:  # lib refused a write: the page's transaction rolled back
    report_denied(exc)
