"""Precedents: interactions auto-evaluated by precedent (seed 003), why they (did not) match, and the
expert review that turns an interaction into a precedent. `?interaction=<id>` opens one directly."""

import functools

import streamlit as st

from lib import export
from lib import precedent_view as view
from lib.auth import Permission
from lib.display import UNTITLED
from lib.safe_markdown import escape_markdown
from lib.ui import csv_download_all, flash, get_engine, pager, require_reviewer, session_scope, show_flash
from lib.ui.tables import datetime_column, link_column, number_column, show_table, text_column, title_column

ANY = "Any"

st.title("Precedents")
st.caption(
    "Auto-evaluation by precedent: an interaction gets an expert's scores copied only when an expert "
    "already scored a nearly identical question and answer, every sentence has a near-identical "
    "expert-scored sentence and the cited URL is the same. Otherwise the outcome names the gate that "
    "failed. Import interactions on the Import page or run `python -m lib auto-eval`."
)

get_engine()
with session_scope(read_only=True) as session:
    options = view.filter_options(session=session)
if not options.products:
    st.info(
        "No interactions yet. Import a JSONL file of interactions (kind: interactions) on the Import page."
    )
    st.stop()

cols = st.columns(4)
product = cols[0].selectbox("Product", [ANY, *options.products], key="prec_product")
language = cols[1].selectbox("Language", [ANY, *options.languages], key="prec_language")
outcome = cols[2].selectbox("Outcome", [ANY, *view.OUTCOMES], key="prec_outcome")
days = cols[3].date_input("Created between (UTC)", value=(), key="prec_dates")
filters = view.filters_from_widgets(
    None if product == ANY else product,
    None if language == ANY else language,
    None if outcome == ANY else outcome,
    days,
)

with session_scope(read_only=True) as session:
    total = view.count_interactions(session=session, filters=filters)
    counts = view.reason_counts(session=session, filters=filters)
    offset, limit = pager(total, key="prec_page")
    frame = view.list_page(session=session, filters=filters, offset=offset, limit=limit)

if not counts.empty:
    st.plotly_chart(view.reason_figure(counts), key="prec_reasons_chart")
st.caption(f"{total} interactions match the filters; showing {len(frame)} from {offset + 1 if total else 0}.")
show_table(
    view.display_frame(frame),
    key="prec_table",
    alt="Interactions matching the filters, one page",
    columns={
        "open": link_column("", help="Open the interaction's match trace"),
        "title": title_column("Question", help="The question's first line"),
        "outcome": text_column("Outcome", help="matched, the gate that failed, pending or expert-reviewed"),
        "total_score": number_column("Copied total", decimals=1),
        "expert_total": number_column("Expert total", decimals=1),
        "product": text_column("Product"),
        "language": text_column("Lang."),
        "created_at": datetime_column("Created (UTC)"),
        "id": text_column("Id"),
    },
)
csv_download_all(
    f"Download CSV (all {total:,} matches)",
    "precedents.csv",
    # Built only when clicked or fetched, streamed from the database in batches.
    chunks=functools.partial(export.precedents_csv_chunks, engine=get_engine(), filters=filters),
    data=functools.partial(export.precedents_csv_bytes, engine=get_engine(), filters=filters),
    key="prec_csv",
)

ids = list(frame["id"])
wanted = st.query_params.get("interaction")
if wanted and wanted not in ids:
    ids.insert(0, wanted)
if not ids:
    st.stop()
labels = view.pick_labels(frame)
picked = st.selectbox(
    "Interaction",
    ids,
    index=ids.index(wanted) if wanted else 0,
    format_func=lambda iid: labels.get(iid, iid),
    key="prec_pick",
)

with session_scope(read_only=True) as session:
    detail = view.load_detail(session=session, interaction_id=picked)
if detail is None:
    st.warning(f"No interaction with id {escape_markdown(str(picked))}.")
    st.stop()

interaction = detail.interaction
st.subheader(f"Interaction {escape_markdown(interaction.id)}")
st.markdown(
    f"**Outcome:** {escape_markdown(detail.outcome)} · **product** {escape_markdown(interaction.product)} · "
    f"**language** {escape_markdown(interaction.language)}"
)
st.markdown("**Question**")
if (interaction.question or "").strip():
    st.text(interaction.question)
else:
    st.caption(UNTITLED)
st.markdown("**Answer**")
if (interaction.answer or "").strip():
    st.text(interaction.answer)
else:
    st.caption(view.NO_ANSWER)
if detail.auto_eval is not None and detail.auto_eval.total_score is not None:
    st.metric("Copied total", f"{detail.auto_eval.total_score:g}")
if detail.expert_feedback is not None:
    st.metric(
        "Expert total",
        "–" if detail.expert_feedback.total_score is None else f"{detail.expert_feedback.total_score:g}",
    )
    st.caption(f"Reviewed by {escape_markdown(detail.expert_feedback.reviewer or 'unknown')}.")
if detail.distance is not None:
    st.info(f"Distance between the copied and the expert total: {detail.distance:g} points.", icon="📏")

trace = detail.trace
if detail.auto_eval is not None:
    st.markdown("#### Match trace")
    message = detail.trace_message()
    if message is not None:
        level, text = message
        (st.error if level == "error" else st.info)(escape_markdown(text))
    st.markdown("QA neighbours above the threshold")
    show_table(
        detail.qa_frame(),
        key="prec_qa_table",
        columns={"similarity": number_column("Similarity", decimals=3, help="Cosine similarity, 0–1")},
    )
    st.markdown("Sentences")
    show_table(
        detail.sentence_frame(),
        key="prec_sentence_table",
        columns={
            "sentence": text_column("Sentence", width="medium"),
            "best expert sentence": text_column("Best expert sentence", width="medium"),
            "similarity": number_column("Similarity", decimals=3, help="Cosine similarity, 0–1"),
        },
    )
    citation = trace.get("citation") or {}
    if citation:
        st.markdown(
            f"**Citation** {'✅ matches' if citation.get('match') else '❌ differs'} — expected: "
            f"{escape_markdown(str(citation.get('expected') or '–'))}, actual: "
            f"{escape_markdown(str(citation.get('actual') or '–'))}"
        )
    fallback = trace.get("fallback")
    if fallback is not None:
        verdict = {True: "passed", False: "did not pass", None: "not asked"}[fallback.get("llm_pass")]
        st.markdown(
            f"**Fallback** (candidates: {escape_markdown(', '.join(fallback.get('candidates') or []) or 'none')}): "
            f"the LLM comparison {verdict}."
        )
        if fallback.get("llm_reason"):
            st.markdown(f"> {escape_markdown(str(fallback['llm_reason']))}")

st.markdown("#### Expert review")
show_flash("prec_flash")
st.caption(
    "Score each sentence 0–100 (leave blank: counts as 100) and the citation 0–25. Saving makes this "
    "interaction a precedent: later interactions that match it get these scores."
)
# The gate's warning comes and goes with the sign-in: a container of its own keeps the form at the same
# place in the page, so a run after the name is entered replaces the form's elements instead of
# leaving the previous run's sentence beside the new one (seen as the same sentence twice).
with st.container():
    reviewer = require_reviewer("add an expert review", Permission.FEEDBACK)
with st.form(key="prec_review_form"):
    scores = []
    for n, sentence in enumerate(detail.sentences):
        st.text(sentence)  # untrusted: shown as plain text, never as markdown
        scores.append(
            st.number_input(
                f"Score for sentence {n + 1} (0–100)",
                min_value=0,
                max_value=100,
                value=None,
                step=1,
                key=f"prec_score_{n}",
                placeholder="blank",
            )
        )
    citation_score = st.number_input(
        "Citation score", min_value=0, max_value=25, value=25, step=1, key="prec_citation_score"
    )
    citation_url = st.text_input(
        "Accepted citation URL", value=interaction.citation_url or "", key="prec_citation_url"
    )
    submitted = st.form_submit_button("Save expert review", disabled=not reviewer, key="prec_review_save")
if submitted and reviewer:
    try:
        with session_scope() as session:
            view.add_expert_review(
                session=session,
                interaction_id=interaction.id,
                sentence_scores=scores,
                citation_score=citation_score,
                citation_url=citation_url,
                reviewer=reviewer,
            )
    except view.ReviewRefused as exc:
        st.error(f"The review was not saved: {escape_markdown(str(exc))}", icon="🚫")
    else:
        flash("prec_flash", "success", "Expert review saved: this interaction is now a precedent.")
        st.rerun()
