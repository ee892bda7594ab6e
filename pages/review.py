"""Review queue: a workspace for one evaluation at a time — the highlighted answer beside compact
metric rows, largest gap first, every row reachable from the keyboard."""

import streamlit as st

from lib import display, review_queue
from lib.auth import Permission
from lib.highlight import metric_palette, sanitize_slug
from lib.review_queue import ORDERS, QueueFilter
from lib.safe_markdown import escape_markdown
from lib.ui import current_reviewer, denied_reason, session_scope, show_flash
from lib.ui.evidence import render_answer, render_long_text
from lib.ui.review import fit_to_screen, metric_rows, queue_toolbar

ANY = "Any"
FLASH = "review_flash"

st.session_state.setdefault("review_skipped", [])
fit_to_screen()

with session_scope(read_only=True) as session:
    options = review_queue.queue_options(session=session)

head, filter_box = st.columns([4, 1], vertical_alignment="bottom")
head.markdown("### Review queue")
with filter_box.popover("Filters and order", icon=":material/filter_list:", width="stretch"):
    product = st.selectbox("Product", [ANY, *options["products"]], key="review_product")
    metric = st.selectbox("Metric", [ANY, *options["metrics"]], key="review_metric")
    language = st.selectbox("Language", [ANY, *options["languages"]], key="review_language")
    order = st.radio("Order", list(ORDERS), format_func=ORDERS.__getitem__, key="review_order")
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


def flash_slot() -> None:
    """The outcome of the last action, in a slot that is there with or without a message: the
    elements after it keep their places, so a rerun never draws the rows into the toolbar's old
    place (with the old rows still in it until the run ends: a page 300 px taller for a moment)."""
    with st.empty():
        show_flash(FLASH)


# A reviewer's item is reserved for them and their skips live in the database (a reload, a new
# tab or another device continues there); someone who may only read reserves nothing.
reserver = current_reviewer() if current_reviewer() and not denied_reason(Permission.REVIEW) else None


def _skip(key: str) -> None:
    if reserver:
        with session_scope() as session:
            review_queue.skip_item(session=session, reviewer=reserver, key=key)
    else:
        st.session_state["review_skipped"] = [*st.session_state["review_skipped"], key]
    st.session_state.pop("review_current", None)
    st.session_state.pop("review_pending", None)


def _unskip() -> None:
    if reserver:
        with session_scope() as session:
            review_queue.bring_back_skipped(session=session, reviewer=reserver)
    st.session_state["review_skipped"] = []


@st.fragment
def queue(filters: QueueFilter) -> None:
    """The progress and the current item; reviewing, skipping or undoing reruns only this part."""
    with session_scope(read_only=reserver is None) as session:
        progress = review_queue.queue_progress(session=session, filters=filters)
        item, notice = review_queue.current_item(
            session=session,
            reviewer=reserver,
            filters=filters,
            current=st.session_state.get("review_current"),
            skipped=st.session_state["review_skipped"],
        )
        skipped = (
            review_queue.skipped_items(session=session, reviewer=reserver)
            if reserver
            else st.session_state["review_skipped"]
        )
        workspace = review_queue.load_workspace(session=session, item=item) if item else None
    if notice:
        st.info(escape_markdown(notice), icon="👥")

    if item is None or workspace is None:
        st.progress(progress.fraction, text=progress.label)
        flash_slot()
        st.session_state.pop("review_current", None)
        if skipped:
            st.info(f"Only skipped items are left ({len(skipped)}).")
            st.button("Bring skipped items back", key="review_unskip", on_click=_unskip)
        else:
            st.success("Nothing left to review with these filters.", icon="🎉")
        queue_toolbar(key="review", flash_key=FLASH)
        return
    if st.session_state.get("review_current") != item.key:
        st.session_state["review_selected"] = 0  # a new item starts at its largest gap
    st.session_state["review_current"] = item.key

    snapshot = item.snapshot
    left, right = st.columns([3.9, 6.1], gap="medium")
    with left:
        if snapshot is not None:
            gap = "—" if snapshot.max_metric_gap is None else f"{snapshot.max_metric_gap:.2f}"
            st.markdown(
                f"**{escape_markdown(display.evaluation_title(snapshot.question, limit=60))}**  \n"
                f":small[Evaluation {escape_markdown(snapshot.id)} · "
                f"{escape_markdown(snapshot.product)} · {escape_markdown(snapshot.language)} · "
                f"model {escape_markdown(snapshot.model_name or 'unknown')} · largest gap {gap} · "
                f"[open the full evaluation]({display.evaluation_url(snapshot.id)})]"
            )
            render_long_text(snapshot.question, key="review_question", file_name="question.txt", height=76)
            render_answer(
                snapshot.model_answer,
                spans=workspace.spans,
                legend=workspace.highlighted_metrics,
                colors=metric_palette(workspace.metrics),
                labels=workspace.labels,
                key="review_answer",
                file_name=f"{sanitize_slug(snapshot.id)}-answer.txt",
                height=380,
            )
        else:
            judgment = item.judgments[0]
            st.markdown(
                f"**Judgment {escape_markdown(judgment.change_id)}**  \n:small[{escape_markdown(judgment.product)}]"
            )
            if judgment.description:
                st.markdown(escape_markdown(judgment.description))
            if judgment.url:
                st.text(judgment.url)
    with right:
        st.progress(progress.fraction, text=progress.label)
        flash_slot()
        metric_rows(workspace, key="review", flash_key=FLASH)
        queue_toolbar(key="review", flash_key=FLASH, on_skip=lambda: _skip(item.key))


queue(filters)
