"""Tag scores: which notes help the judge in which context (seed 001), and why a note is shown or not."""

import streamlit as st

from lib import notes, relevance
from lib.auth import Permission
from lib.config import get_settings
from lib.models import NOTE_TYPES
from lib.relevance_charts import (
    HISTORY_LINES_PER_FAMILY,
    ema_history_figure,
    history_tags,
    tag_heatmap_figure,
)
from lib.ui import csv_download, flash, require_reviewer, session_scope, show_flash
from lib.ui.relevance import manual_pin_controls
from lib.ui.tables import check_column, count_column, datetime_column, number_column, show_table, text_column

ANY = "Any"
HEATMAP_NOTES = 40
SCORE_HELP = (
    f"Tag relevance (an EMA), clamped to ±{get_settings().score_clamp:g} (OVERRULE_SCORE_CLAMP): "
    "above 0 the note helped under this tag, below 0 it misled."
)
DECISION_TEXT = {
    "filtered": "filtered out",
    "penalized": "shown, slightly penalised",
    "neutral": "shown, no boost",
    "boosted": "shown, boosted",
}

st.title("Tag scores")
st.caption(
    "How useful each note has been to the judge under each context tag, learnt from the evaluator "
    "LLM (weight 1.0) and from reviewers' useful / not useful marks (weight 2.0), as an exponential "
    "moving average (α 0.3, clamped to ±3). Red: misleading or unused there; blue: it helped."
)

with session_scope(read_only=True) as session:
    tags = relevance.known_tags(session=session)
    languages = notes.note_languages(session=session)
    context_tags = relevance.latest_audit_tags(session=session)
    abandoned = [mark.session_id for mark in relevance.abandoned_audits(session=session)]

show_flash("tag_scores_flash")
if abandoned:
    with st.expander(f"The evaluator gave up on {len(abandoned)} judge run(s)"):
        st.caption(
            f"Each failed {relevance.MAX_EVALUATION_RETRIES} times on the LLM server (timeouts, server "
            "errors). Once the server works again, give a run its retries back and the next "
            "`python -m lib evaluate` scores its notes."
        )
        audit = st.selectbox("Judge run", abandoned, key="tag_scores_abandoned_audit")
        if st.button("Reset its retries", key="tag_scores_reset_retries") and (
            lead := require_reviewer("reset an audit's retries", Permission.JUDGE)
        ):
            try:
                with session_scope() as session:
                    relevance.reset_retries(session=session, audit_session_id=audit, reviewer=lead)
            except ValueError as exc:  # evaluated or removed since the page was drawn
                flash("tag_scores_flash", "error", f"Nothing was reset: {exc}.")
            else:
                flash("tag_scores_flash", "success", f"Judge run {audit} will be evaluated again.")
            st.rerun()

if not tags:
    st.info(
        "No tag scores yet. They appear once judge runs that showed notes have been evaluated "
        "(`python -m lib evaluate`) or reviewers have marked shown notes useful or not useful on an "
        "evaluation."
    )
    st.stop()

cols = st.columns(3)
chosen_tags = cols[0].multiselect("Tags", tags, key="tag_scores_tags", placeholder="All tags")
note_type = cols[1].selectbox(
    "Note type",
    [ANY, *NOTE_TYPES],
    key="tag_scores_type",
    format_func=lambda value: value if value == ANY else notes.note_type_label(value),
)
language = cols[2].selectbox(
    "Language",
    [ANY, *languages],
    key="tag_scores_language",
    format_func=lambda value: "(every language)" if value == "" else value,
)
filters = {
    "tags": chosen_tags or None,
    "note_type": None if note_type == ANY else note_type,
    "language": None if language == ANY else language,
}

with session_scope(read_only=True) as session:
    scores = relevance.scores_frame(session=session, **filters, limit_notes=HEATMAP_NOTES)
    all_scores = relevance.scores_frame(session=session, **filters, limit_notes=None)

# --- Heatmap -------------------------------------------------------------------------------
st.subheader("Scores by note and tag")
if scores.empty:
    st.info("No scores match these filters.")
else:
    st.plotly_chart(tag_heatmap_figure(scores), key="tag_scores_heatmap")
    shown_notes, total_notes = len(relevance.note_labels(scores)), len(relevance.note_labels(all_scores))
    if shown_notes < total_notes:
        st.caption(f"The {shown_notes} most-evaluated of {total_notes} notes; the CSV holds them all.")
    show_table(
        notes.with_type_labels(scores),
        key="tag_scores_table",
        alt="Scores by note and tag",
        columns={
            "note_id": count_column("Note"),
            "note_type": text_column("Type"),
            "language": text_column("Lang."),
            "content": text_column("Note text", width="medium"),
            "pinned": check_column("Pinned"),
            "pin": text_column("Pin"),
            "tag": text_column("Tag"),
            "score": number_column("Score", help=SCORE_HELP),
            "positive_evals": count_column("+ evals", help="Evaluations where the note helped"),
            "negative_evals": count_column("− evals", help="Evaluations where the note misled"),
            "last_evaluated": datetime_column("Last evaluated (UTC)"),
        },
    )
csv_download(all_scores, "tag_scores.csv", key="tag_scores_csv", label="Download scores (CSV)")

# --- EMA history ---------------------------------------------------------------------------
st.subheader("EMA history of a note")
if not scores.empty:
    labels = relevance.note_labels(scores)
    note_id = st.selectbox(
        "Note", list(labels), format_func=labels.__getitem__, key="tag_scores_history_note"
    )
    with session_scope(read_only=True) as session:
        history = relevance.history_frame(session=session, note_id=note_id, tags=chosen_tags or None)
    st.caption(f"{len(history)} scores applied · pinned state: {relevance.pin_of(scores, note_id)}")
    history_picked = st.multiselect(
        "Tags in the chart",
        history_tags(history),
        key=f"tag_scores_history_tags_{note_id}",
        placeholder=f"The {HISTORY_LINES_PER_FAMILY} most evaluated of each kind",
        help="Lines are grouped by kind of tag (lang, product, metric, …), one panel each; pick tags "
        "to draw exactly those.",
    )
    st.plotly_chart(ema_history_figure(history, tags=history_picked), key="tag_scores_history_chart")
    csv_download(
        history, f"note_{note_id}_history.csv", key="tag_scores_history_csv", label="Download history (CSV)"
    )

# --- Pinned notes --------------------------------------------------------------------------
st.subheader("Pinned notes")
st.caption(
    "Pinned notes are shown to every judge run of their language unless their tag scores filter them. "
    "Auto-pin: average over the note's tags > 0.6 with ≥ 5 evaluations (removed again below 0.2), or "
    "shown 15 times under a tag subset. Manual pins are never removed automatically."
)
with session_scope(read_only=True) as session:
    pinned = relevance.pinned_frame(session=session)
if pinned.empty:
    st.caption("No note is pinned.")
else:
    show_table(
        notes.with_type_labels(pinned),
        key="tag_scores_pinned",
        columns={
            "note_id": count_column("Note"),
            "note_type": text_column("Type"),
            "language": text_column("Lang."),
            "content": text_column("Note text", width="medium"),
            "pin": text_column("Pin"),
            "pin_tags": text_column("Pin tags"),
            "avg_score": number_column("Avg score", help=SCORE_HELP),
            "total_evals": count_column("Evaluations"),
        },
    )
    csv_download(pinned, "pinned_notes.csv", key="tag_scores_pinned_csv", label="Download pinned notes (CSV)")
manual_pin_controls(key="tag_scores_pin")

# --- Explainer -----------------------------------------------------------------------------
st.subheader("Why is a note shown or not?")
st.caption(
    "Pick the env tags of a judge run. For each note: its scores averaged over ALL these tags (a tag "
    "it was never evaluated under counts 0.0), its evaluations, and what `relevant_notes` does: "
    "filtered when there are ≥ 3 evaluations and the average is below -0.1; otherwise its rank moves "
    "by (avg / 3) × 0.01."
)
explain_tags = st.multiselect(
    "Env tags of the judge run",
    sorted(set(tags) | set(context_tags)),
    default=context_tags,
    accept_new_options=True,
    key="tag_scores_explain_tags",
)
include_all = st.checkbox(
    "Include notes never evaluated under these tags", key="tag_scores_explain_all", value=False
)
if not explain_tags:
    st.info("Pick at least one env tag to see the decisions.")
    st.stop()
with session_scope(read_only=True) as session:
    explained = relevance.explain(
        session=session,
        tags=explain_tags,
        note_type=filters["note_type"],
        language=filters["language"],
        include_unscored=include_all,
    )
if explained.empty:
    st.info("No note has a score under these tags (and none is pinned).")
    st.stop()
counts = relevance.decision_counts(explained)
metric_cols = st.columns(4)
for column, decision in zip(metric_cols, ("filtered", "penalized", "neutral", "boosted"), strict=True):
    column.metric(DECISION_TEXT[decision], counts[decision])
show_table(
    notes.with_type_labels(explained),
    key="tag_scores_explain_table",
    order=[
        "note_id",
        "decision",
        "avg_score",
        "total_evals",
        "boost",
        "note_type",
        "language",
        "content",
        "pinned",
    ],
    columns={
        "note_id": count_column("Note"),
        "decision": text_column("Decision"),
        "avg_score": number_column(
            "Avg score", help="Averaged over ALL picked tags; never evaluated counts 0"
        ),
        "total_evals": count_column("Evaluations"),
        "boost": number_column("Boost", decimals=4, help="Rank change: (avg / clamp) × relevance weight"),
        "note_type": text_column("Type"),
        "language": text_column("Lang."),
        "content": text_column("Note text", width="medium"),
        "pinned": check_column("Pinned"),
    },
)
csv_download(explained, "tag_relevance_explained.csv", key="tag_scores_explain_csv", label="Download (CSV)")
rows = relevance.explain_records(explained)
explained_labels = relevance.note_labels(explained)
picked = st.selectbox(
    "Explain one note", list(rows), format_func=explained_labels.__getitem__, key="tag_scores_explain_note"
)
st.markdown(f"**Note #{picked}: {DECISION_TEXT[rows[picked]['decision']]}**")
st.code(rows[picked]["arithmetic"], language=None, wrap_lines=True)
