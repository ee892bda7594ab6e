"""Evaluations: the filtered list of what the judge decided, and one evaluation in detail.

`/evaluations?snapshot=<id>` opens the detail; every other query parameter is a list filter, so a
filtered view can be shared by its URL. The filters are read from the URL when the page opens and
written back whenever they change.
"""

import functools

import streamlit as st

from lib import display, export, inspector
from lib.auth import Permission
from lib.config import get_settings
from lib.highlight import clip_text
from lib.safe_markdown import escape_markdown
from lib.ui import (
    EMPTY_PAGE_TEXT,
    csv_download_all,
    current_actor,
    denied_reason,
    flash,
    get_engine,
    llm_off_help,
    pager,
    require_reviewer,
    session_scope,
    show_flash,
    write,
)
from lib.ui.evidence import (
    NO_EVIDENCE_MESSAGE,
    detail_colors,
    format_score,
    render_highlighted_answer_block,
    render_long_text,
    render_metric_cards,
)
from lib.ui.judge_versions import judged_under
from lib.ui.relevance import shown_notes_feedback
from lib.ui.review import review_card_extra
from lib.ui.second_opinion import second_opinion_card_extra, second_opinions_off_caption
from lib.ui.tables import (
    datetime_column,
    gap_column,
    link_column,
    link_to,
    rate_column,
    score_column,
    show_table,
    text_column,
    title_column,
)

ALL = "All"
FLASH_KEY = "evaluations_flash"
SIG_KEY = "evaluations_filter_sig"
PAGE_KEY = "evaluations_page"
PAGE_ENDS_KEY = "evaluations_page_ends"  # where each shown page ended: the next one is a keyset seek


def _open(snapshot_id: str | None) -> None:
    """Switch between list and detail by the `snapshot` query parameter; the filters stay in the URL."""
    if snapshot_id is None:
        st.query_params.pop("snapshot", None)
    else:
        st.query_params["snapshot"] = snapshot_id
    st.rerun()


def _set_status(snapshot_id: str, *, archive: bool) -> None:
    reviewer = require_reviewer("archive or restore evaluations", Permission.ARCHIVE)
    if reviewer is None:
        return
    action = inspector.archive_evaluation if archive else inspector.restore_evaluation
    write(lambda session: action(session=session, snapshot_id=snapshot_id, reviewer=reviewer))
    flash(FLASH_KEY, "success", "Evaluation archived." if archive else "Evaluation restored.")
    st.rerun()


def _start_chat_link(snapshot_id: str) -> None:
    """The coach chat on this evaluation (`/coach?snapshot=<id>`), greyed with the reason without an LLM.

    Without an LLM this is also where the page gives the setup hint, once, for the coach and the
    second opinions below.
    """
    off = llm_off_help("The coach and second opinions", plural=True)
    link_to(
        "pages/coach.py",
        "Start chat",
        url_path=display.COACH_PATH,
        query={"snapshot": snapshot_id},
        icon="💬",
        help=off or "Talk the judge's reasoning through with the coach (1–3 metrics per chat).",
        disabled=off is not None,
    )
    if off:
        st.caption(f"🔌 {escape_markdown(off)}")


def show_detail(snapshot_id: str) -> None:
    """One evaluation: fields, highlighted answer, a card per metric, chat link, archive/restore."""
    if st.button("← Back to the list", key="evaluations_back"):
        _open(None)
    with session_scope(read_only=True) as session:
        detail = inspector.load_evaluation(session=session, snapshot_id=snapshot_id)
    if detail is None:
        st.error(f"No evaluation has the id “{escape_markdown(snapshot_id)}”. It may have been mistyped.")
        return
    snap = detail.snapshot
    show_flash(FLASH_KEY)
    # No anchor: Streamlit would make the question (data) into a link of its own.
    st.header(escape_markdown(display.evaluation_title(snap.question)), anchor=False)
    st.caption(f"Evaluation `{snap.id}`" if "`" not in snap.id else escape_markdown(f"Evaluation {snap.id}"))
    if detail.archived:
        st.warning("This evaluation is archived: it is hidden from every list and count until restored.")

    cols = st.columns(4)
    cols[0].metric("Judge meta score", format_score(snap.judge_meta_score), help="5 = judge and user agree")
    cols[1].metric(
        "Weighted gap", format_score(snap.weighted_gap), help="0.7 primary + 0.2 bonus + 0.1 others"
    )
    cols[2].metric("Largest metric gap", format_score(snap.max_metric_gap), help="Rescaled to the 1–5 span")
    cols[3].metric("Evidence items", f"{snap.evidence_count}", help="Highlighted, unlocated and unverified")

    fields = {
        "Product": snap.product,
        "Language": snap.language,
        "Model": snap.model_name or "—",
        "Judge model": snap.judge_model or "—",
        "Category": snap.category or "—",
        "Created": f"{snap.created_at:%Y-%m-%d %H:%M} UTC",
        "Status": snap.status,
    }
    st.markdown(" · ".join(f"**{name}:** {escape_markdown(value)}" for name, value in fields.items()))
    judged_under(snap.judge_version_id, key="evaluations_judged_under")

    st.subheader("Question")
    render_long_text(snap.question, key="evaluations_question", file_name="question.txt")
    st.subheader("Model answer")
    colors = detail_colors(detail)
    render_highlighted_answer_block(detail, colors)
    if not detail.has_evidence:
        st.info(NO_EVIDENCE_MESSAGE)
    if snap.overall_feedback:
        st.subheader("Overall feedback")
        st.markdown(escape_markdown(clip_text(snap.overall_feedback)))

    _start_chat_link(snap.id)

    st.subheader("Metrics")
    st.caption("Largest gap first; each metric on its own scale. Gap = |user − judge|.")
    # Review forms (lib/ui/review.py) plug in here through the `extra` hook of each card.
    review_extra = review_card_extra("evaluations")
    second_opinions_off_caption(hint=False)  # without an LLM: one line, not a greyed button per card

    def card_extra(card: inspector.MetricCard) -> None:
        review_extra(card)
        second_opinion_card_extra(card)  # the evaluation layer's check of this judgment

    render_metric_cards(detail.cards, key_prefix="evaluations", extra=card_extra)

    # Tag relevance (seed 001): was each note the judge run was shown useful for this evaluation?
    shown_notes_feedback(snap.id, key="evaluations_notes")

    st.divider()
    denied = denied_reason(Permission.ARCHIVE) if current_actor() else None
    if denied:
        st.caption(f"🔒 {escape_markdown(denied)}")
    if detail.archived:
        if st.button("Restore evaluation", key="evaluations_restore", icon="♻️", disabled=denied is not None):
            _set_status(snap.id, archive=False)
    elif st.button("Archive evaluation", key="evaluations_archive", icon="🗄️", disabled=denied is not None):
        _set_status(snap.id, archive=True)


def _init_filter_state() -> None:
    """Seed the filter widgets from the URL whenever they are not live (first load, back from detail)."""
    url = inspector.filters_from_params(st.query_params.to_dict())
    initial = {
        "evaluations_product": url.product or ALL,
        "evaluations_language": url.language or ALL,
        "evaluations_model": url.model or ALL,
        "evaluations_category": url.category or ALL,
        "evaluations_metric": url.metric or ALL,
        "evaluations_review": url.review,
        "evaluations_evidence": url.evidence,
        "evaluations_min_gap": url.min_gap or 0.0,
        "evaluations_from": url.date_from,
        "evaluations_to": url.date_to,
        "evaluations_q": url.text,
        "evaluations_sort": url.sort,
        "evaluations_archived": url.archived,
    }
    for key, value in initial.items():
        st.session_state.setdefault(key, value)
    page = st.query_params.get("page", "")
    if PAGE_KEY not in st.session_state and page.isdigit() and int(page) > 1:
        st.session_state[PAGE_KEY] = int(page)


def _choice(label: str, options: list[str], key: str, *, labels: dict[str, str] | None = None) -> str | None:
    """A selectbox with an "All" entry; a value from the URL that no row has yet stays selectable."""
    current = st.session_state.get(key, ALL)
    choices = [ALL, *options]
    if current not in choices:
        choices.append(current)
    value = st.selectbox(label, choices, key=key, format_func=lambda v: (labels or {}).get(v, v))
    return None if value == ALL else value


def read_filters() -> inspector.EvaluationFilters:
    """The filter widgets, laid out in three rows, as an EvaluationFilters."""
    with session_scope(read_only=True) as session:
        product = st.session_state.get("evaluations_product")
        options = inspector.filter_options(
            session=session, product=None if product in (None, ALL) else product
        )
    row = st.columns(4)
    with row[0]:
        product = _choice("Product", options.products, "evaluations_product")
    with row[1]:
        language = _choice("Language", options.languages, "evaluations_language")
    with row[2]:
        model = _choice("Model", options.models, "evaluations_model")
    with row[3]:
        category = _choice("Category", options.categories, "evaluations_category")
    row = st.columns(4)
    with row[0]:
        metric = _choice(
            "Judged on metric", list(options.metrics), "evaluations_metric", labels=options.metrics
        )
    review = row[1].selectbox(
        "Review state",
        list(inspector.REVIEW_STATES),
        key="evaluations_review",
        format_func=inspector.REVIEW_STATES.get,
    )
    evidence = row[2].selectbox(
        "Evidence",
        list(inspector.EVIDENCE_STATES),
        key="evaluations_evidence",
        format_func=inspector.EVIDENCE_STATES.get,
    )
    min_gap = row[3].number_input(
        "Minimum metric gap",
        min_value=0.0,
        max_value=inspector.MAX_GAP,
        step=0.5,
        key="evaluations_min_gap",
        help="Largest |user − judge| over the metrics, rescaled to 1–5. 0 shows all.",
    )
    row = st.columns([1, 1, 2, 1.3])
    date_from = row[0].date_input("From", key="evaluations_from", format="YYYY-MM-DD")
    date_to = row[1].date_input("To", key="evaluations_to", format="YYYY-MM-DD")
    text = row[2].text_input("Search questions", key="evaluations_q", placeholder="words in the question")
    sort = row[3].selectbox(
        "Sort", list(inspector.SORTS), key="evaluations_sort", format_func=inspector.SORTS.get
    )
    archived = st.toggle("Show archived", key="evaluations_archived", help="List only archived evaluations")
    return inspector.EvaluationFilters(
        product=product,
        language=language,
        model=model,
        category=category,
        metric=metric,
        min_gap=float(min_gap) if min_gap else None,
        review=review,
        evidence=evidence,
        date_from=date_from or None,
        date_to=date_to or None,
        text=text.strip(),
        sort=sort,
        archived=archived,
    )


def show_list() -> None:
    """The filtered, sorted, paginated list with its match count and the CSV of every match."""
    st.title("Evaluations")
    show_flash(FLASH_KEY)
    _init_filter_state()
    filters = read_filters()
    params = inspector.to_params(filters)

    signature = repr(sorted(params.items()))
    if st.session_state.get(SIG_KEY) not in (None, signature):
        st.session_state.pop(PAGE_KEY, None)  # new filters: back to the first page
        st.session_state.pop(PAGE_ENDS_KEY, None)
    st.session_state[SIG_KEY] = signature
    page_ends = st.session_state.setdefault(PAGE_ENDS_KEY, {})  # page number -> inspector.PageKey

    page_size = get_settings().page_size
    with session_scope(read_only=True) as session:
        cap = inspector.count_cap(filters)  # the count's own default: for the label and the pager
        total = inspector.count_evaluations(session=session, filters=filters)
        offset, limit = pager(
            total, key=PAGE_KEY, page_size=page_size, capped=inspector.count_is_capped(total, cap)
        )
        page = offset // page_size + 1
        rows = inspector.fetch_page(
            session=session, filters=filters, offset=offset, limit=limit, after=page_ends.get(page - 1)
        )
    if rows:
        page_ends[page] = inspector.page_key(rows[-1], filters.sort)

    if page > 1:
        params["page"] = str(page)
    if st.query_params.to_dict() != params:
        st.query_params.from_dict(params)

    noun = "archived evaluation" if filters.archived else "evaluation"
    label = inspector.count_label(total, cap)
    st.markdown(f"**{label}** {noun} matches" if total == 1 else f"**{label}** {noun}s match")
    if not rows:
        st.info("No evaluations match these filters." if total == 0 else EMPTY_PAGE_TEXT)
        return

    event = show_table(
        inspector.list_display_frame(rows),
        key="evaluations_table",
        order=inspector.LIST_DISPLAY_COLUMNS,
        on_select="rerun",
        alt="Evaluations matching the filters, one page",
        columns={
            "open": link_column("", help="Open the evaluation's detail"),
            "title": title_column("Question", help="The question's first line"),
            "max_gap": gap_column(
                "Max gap", help="Largest |user − judge| over the metrics, rescaled to 1–5."
            ),
            "weighted_gap": gap_column(
                "Weighted gap", help="0.7 primary + 0.2 bonus + 0.1 others, 1–5 span."
            ),
            "review": text_column(
                "Review", help="Judgments still pending, or the outcome once all are reviewed"
            ),
            "reviewed_share": rate_column("Reviewed", help="Share of this evaluation's judgments reviewed"),
            "product": text_column("Product"),
            "language": text_column("Lang."),
            "evidence": text_column("Evidence", help="Evidence items, and those not verified or not located"),
            "created_at": datetime_column("Created (UTC)"),
            "model": text_column("Model"),
            "category": text_column("Category"),
            "judge_meta_score": score_column(
                "Meta", low=1, high=5, help="Judge meta score: 5 = judge and user agree."
            ),
            "id": text_column("Id"),
        },
    )
    st.caption(f"Showing {offset + 1:,}–{offset + len(rows):,}. Open a row with its link, or select it.")
    selected = event.selection.rows if event is not None else []
    if selected:
        _open(rows[selected[0]].id)

    cols = st.columns([1, 2], vertical_alignment="bottom")
    form = cols[0].selectbox(
        "CSV form",
        list(inspector.EXPORT_FORMS),
        key="evaluations_csv_form",
        format_func=lambda f: f"{f}: {inspector.EXPORT_FORMS[f]}",
    )
    engine = get_engine()
    csv_download_all(
        f"Download CSV (all {label} matches)",
        f"evaluations_{form}.csv",
        # Built only when clicked or fetched, streamed from the database in batches.
        chunks=functools.partial(export.evaluations_csv_chunks, engine=engine, filters=filters, form=form),
        data=functools.partial(export.evaluations_csv_bytes, engine=engine, filters=filters, form=form),
        key="evaluations_csv",
        container=cols[1],
    )


snapshot = st.query_params.get("snapshot")
if snapshot:
    show_detail(snapshot)
else:
    show_list()
