"""Review queue: confirm or overrule the judge, one evaluation at a time."""

from urllib.parse import quote

import streamlit as st

from lib import corrections, review_queue
from lib.auth import Permission
from lib.evidence import evidence_items
from lib.metrics import score_of
from lib.review_queue import ORDERS, QueueFilter
from lib.safe_markdown import escape_markdown
from lib.ui import current_reviewer, denied_reason, session_scope, show_flash
from lib.ui.evidence import render_evidence_list, render_long_text
from lib.ui.review import correction_form, judgment_history

ANY = "Any"
FLASH = "review_flash"
SKIP_SHORTCUT = "Alt+N"

st.title("Review queue")
st.caption(
    "Unreviewed judgments, one evaluation at a time. Confirm the judge or overrule it with your own "
    f"decision and a reason. Keys: Alt+Y confirms and Alt+O overrules the first metric, {SKIP_SHORTCUT} skips."
)
st.session_state.setdefault("review_skipped", [])

with session_scope(read_only=True) as session:
    options = review_queue.queue_options(session=session)

cols = st.columns([1, 1, 1, 1.4])
product = cols[0].selectbox("Product", [ANY, *options["products"]], key="review_product")
metric = cols[1].selectbox("Metric", [ANY, *options["metrics"]], key="review_metric")
language = cols[2].selectbox("Language", [ANY, *options["languages"]], key="review_language")
order = cols[3].radio(
    "Order", list(ORDERS), format_func=ORDERS.__getitem__, key="review_order", horizontal=True
)
filters = QueueFilter(
    product=None if product == ANY else product,
    metric=None if metric == ANY else metric,
    language=None if language == ANY else language,
    order=order,
)

if not current_reviewer():
    st.warning("Enter your name in the sidebar to review: every decision records who made it.", icon="👤")
elif denied := denied_reason(Permission.REVIEW):
    st.info(f"🔒 {escape_markdown(denied)} You can still read the queue.")


def _skip(key: str) -> None:
    st.session_state["review_skipped"] = [*st.session_state["review_skipped"], key]
    st.session_state.pop("review_current", None)


def _unskip() -> None:
    st.session_state["review_skipped"] = []


@st.fragment
def queue(filters: QueueFilter) -> None:
    """The progress and the current item; reviewing or skipping reruns only this part."""
    show_flash(FLASH)
    skipped = st.session_state["review_skipped"]
    with session_scope(read_only=True) as session:
        progress = review_queue.queue_progress(session=session, filters=filters)
        item = None
        current = st.session_state.get("review_current")
        if current:
            item = review_queue.load_item(session=session, key=current, filters=filters)
        if item is None:
            item = review_queue.next_item(session=session, filters=filters, skipped=skipped)
        scales = (
            {j.id: corrections.decision_scale(session=session, judgment=j) for j in item.judgments}
            if item
            else {}
        )
        titles = corrections.metric_titles(session=session, judgments=item.judgments) if item else {}

    st.progress(progress.fraction, text=progress.label)
    if item is None:
        st.session_state.pop("review_current", None)
        if skipped:
            st.info(f"Only skipped items are left ({len(skipped)}).")
            st.button("Bring skipped items back", key="review_unskip", on_click=_unskip)
        else:
            st.success("Nothing left to review with these filters.", icon="🎉")
        return
    st.session_state["review_current"] = item.key

    snapshot = item.snapshot
    if snapshot is not None:
        st.subheader(f"Evaluation {escape_markdown(snapshot.id)}")
        st.caption(
            f"{escape_markdown(snapshot.product)} · {escape_markdown(snapshot.language)} · "
            f"model {escape_markdown(snapshot.model_name or 'unknown')} · "
            f"largest gap {'—' if snapshot.max_metric_gap is None else f'{snapshot.max_metric_gap:.2f}'}"
        )
        st.markdown(f"[Open the full evaluation](/evaluations?snapshot={quote(snapshot.id)})")
        st.markdown("**Question**")
        render_long_text(snapshot.question, key="review_question", file_name="question.txt")
        st.markdown("**Model answer**")
        render_long_text(snapshot.model_answer, key="review_answer", file_name="answer.txt", height=260)
    else:
        judgment = item.judgments[0]
        st.subheader(f"Judgment {escape_markdown(judgment.change_id)}")
        st.caption(escape_markdown(judgment.product))
        if judgment.description:
            st.markdown(escape_markdown(judgment.description))
        if judgment.url:
            st.text(judgment.url)

    for position, judgment in enumerate(item.judgments):
        assert judgment.id is not None
        key = f"review_{judgment.id}"
        with st.container(border=True):
            user_scores = snapshot.user_scores_json if snapshot is not None else {}
            correction_form(
                judgment,
                scales[judgment.id],
                key=key,
                title=titles.get(judgment.id),
                user_score=score_of(user_scores.get(judgment.metric or "")),
                flash_key=FLASH,
                shortcuts=position == 0,
            )
            evidence = (
                evidence_items(snapshot.model_answer, snapshot.evidence_json, judgment.metric)
                if snapshot is not None and judgment.metric
                else ()
            )
            if evidence:
                with st.expander(f"Evidence ({len(evidence)})"):
                    render_evidence_list(evidence)
            with st.expander("History"):
                judgment_history(judgment.id, key=f"{key}_history")
    st.button("Skip", key="review_skip", on_click=_skip, args=(item.key,), shortcut=SKIP_SHORTCUT)


queue(filters)
