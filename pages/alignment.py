"""Alignment lab: does the correction history and do notes make the judge agree with reviewers (issue 16)?"""

import streamlit as st

from lib import alignment, corrections
from lib.alignment_charts import MEASURE_TITLES, comparison_figure
from lib.auth import Permission
from lib.metrics import metrics_for_product
from lib.safe_markdown import escape_markdown
from lib.ui import (
    csv_download,
    flash,
    get_engine,
    llm_off_help,
    llm_unavailable_message,
    require_reviewer,
    session_scope,
    show_flash,
)
from lib.ui.tables import count_column, number_column, show_table

st.title("Alignment lab")
st.caption(
    "Re-judges a sample of reviewed judgments once per prompt arm and measures each arm against the "
    "reviewers' final decisions. History and notes are taken as of each evaluation's creation, "
    "without its own judgments, so no arm sees the answer it is measured against."
)
show_flash("alignment_flash")

with session_scope(read_only=True) as session:
    products = corrections.distinct_products(session=session)
    experiments = alignment.experiments_frame(session)

with st.expander("Start an experiment", expanded=experiments.empty):
    unavailable = llm_unavailable_message()
    if unavailable:
        st.info(unavailable)
    cols = st.columns(4)
    product = cols[0].selectbox("Product", products, key="alignment_product")
    sample = cols[1].number_input("Sample size", 1, 10_000, 200, key="alignment_sample")
    seed = cols[2].number_input("Seed", 0, 2**31 - 1, 0, key="alignment_seed")
    concurrency = cols[3].number_input("Calls at once", 1, 16, 1, key="alignment_concurrency")
    arms = st.multiselect(
        "Arms",
        list(alignment.ARMS),
        default=["bare", "full"],
        key="alignment_arms",
        format_func=lambda arm: f"{arm}: {alignment.ARM_DESCRIPTIONS[arm]}",
    )
    rubric, texts = [], {}
    if "rubric" in arms and product:
        with session_scope(read_only=True) as session:
            rubric = metrics_for_product(session=session, product=product)
        st.caption(
            "The `rubric` arm judges with this text instead of the current rubric; edit at least one metric."
        )
        for metric in rubric:
            texts[metric.slug] = st.text_area(
                escape_markdown(f"{metric.display_name} ({metric.slug})"),
                value=metric.description,
                key=f"alignment_rubric_{product}_{metric.slug}",
            )
    start = st.button(
        "Start",
        key="alignment_start",
        disabled=bool(unavailable) or not products,
        help=llm_off_help("An experiment") or (None if products else "Import reviewed judgments first."),
    )
    reviewer = require_reviewer("start an experiment", Permission.JUDGE) if start else None
    if reviewer:
        spec = alignment.ExperimentSpec(
            product=product or "",
            sample_size=int(sample),
            seed=int(seed),
            arms=tuple(arms),
            edited_rubric=alignment.rubric_edits(rubric, texts),
            created_by=reviewer,
        )
        try:
            experiment_id = alignment.create_experiment(get_engine(), spec)
        except alignment.ExperimentError as exc:
            flash("alignment_flash", "error", f"Nothing was started: {exc}.")
        else:
            alignment.start_in_background(get_engine(), experiment_id, concurrency=int(concurrency))
            flash("alignment_flash", "success", f"Experiment {experiment_id} started.")
        st.rerun()

if experiments.empty:
    st.info("No experiments yet. Start one above, or run `python -m lib align --product P`.")
    st.stop()

labels = {int(r.id): f"#{r.id} {r.name} ({r.status})" for r in experiments.itertuples()}
asked = st.query_params.get("experiment", "")  # the Analytics page links the latest per product
ids = list(labels)
chosen = st.selectbox(
    "Experiment",
    ids,
    index=ids.index(int(asked)) if asked.isdigit() and int(asked) in labels else 0,
    format_func=labels.__getitem__,
    key="alignment_experiment",
)
row = experiments.set_index("id").loc[chosen]
if alignment.is_scripted(row["judge_model"]):
    st.warning(
        "These figures come from a scripted judge, not a real model: a deterministic policy "
        f"({escape_markdown(row['judge_model'])}) served by a local test server. They show what the lab measures, "
        "not what a real judge gains. Start an experiment with your own judge model to measure that.",
        icon="🧪",
    )
total = int(row["done"] + row["failed"] + row["pending"])
st.progress(
    (total - int(row["pending"])) / total if total else 1.0,
    text=f"{row['done']} calls done, {row['failed']} failed, {row['pending']} pending ({row['status']})",
)
if row["edited_rubric"]:
    with st.expander("Edited rubric of the `rubric` arm"):
        for slug, text in row["edited_rubric"].items():
            st.code(f"{slug}: {text}", language=None)
if row["status"] in ("pending", "running"):
    cols = st.columns(2)
    if cols[0].button("Refresh", key="alignment_refresh"):
        st.rerun()
    canceller = (
        require_reviewer("cancel an experiment", Permission.JUDGE)
        if cols[1].button("Cancel", key="alignment_cancel")
        else None
    )
    if canceller:
        alignment.request_cancel(get_engine(), int(chosen), by=canceller)
        flash("alignment_flash", "info", f"Experiment {chosen} stops before its next call.")
        st.rerun()
elif row["failed"]:
    st.caption(f"Failed calls are retried by `python -m lib align --experiment {chosen}`.")

with session_scope(read_only=True) as session:
    report = alignment.measure(session, int(chosen))
    items = alignment.item_frame(session, int(chosen))
    calls = alignment.calls_frame(session, int(chosen))

st.subheader("Comparison")
show_table(
    alignment.display_frame(report),
    key="alignment_table",
    columns={"pairs": count_column("Pairs", help="Items scored by the arm and reviewed")},
)
measure = st.selectbox(
    "Chart", list(MEASURE_TITLES), format_func=MEASURE_TITLES.__getitem__, key="alignment_measure"
)
st.plotly_chart(comparison_figure(report.measures, measure), key="alignment_chart")
csv_download(report.measures, f"alignment-{chosen}-measures.csv", key="alignment_measures_csv")

st.subheader("Against bare: flipped items")
if report.paired.empty:
    st.caption("Add the `bare` arm and another one to compare them item by item.")
else:
    show_table(
        report.paired,
        key="alignment_paired",
        columns={
            "pairs": count_column("Pairs"),
            "flipped_to_agree": count_column("Flipped to agree", help="bare disagreed, this arm agrees"),
            "flipped_away": count_column("Flipped away", help="bare agreed, this arm disagrees"),
            "net": count_column("Net"),
        },
    )
    show_table(report.flips, key="alignment_flips")
    if not report.flips.empty:
        choices = list(report.flips.index)
        pick = st.selectbox(
            "Open a flipped item",
            choices,
            key="alignment_flip",
            format_func=lambda i: (
                f"{report.flips.loc[i, 'snapshot_id']} · {report.flips.loc[i, 'metric']} · "
                f"{report.flips.loc[i, 'arm']} ({report.flips.loc[i, 'direction']})"
            ),
        )
        flip = report.flips.loc[pick]
        left, right = st.columns(2)
        for column, arm in ((left, "bare"), (right, str(flip["arm"]))):
            with session_scope(read_only=True) as session:
                call = alignment.call_prompt(session, int(chosen), arm, str(flip["snapshot_id"]))
            column.markdown(f"**{arm}**")
            column.json(call.scores if call else {})
            column.code(call.prompt if call and call.prompt else "(no prompt recorded)", language=None)

st.subheader("Cost per arm")
show_table(
    report.cost,
    key="alignment_cost",
    columns={
        "done": count_column("Done"),
        "failed": count_column("Failed"),
        "llm_calls": count_column("LLM calls"),
        "prompt_tokens": count_column("Prompt tokens"),
        "completion_tokens": count_column("Completion tokens"),
        "wall_seconds": number_column("Wall time (s)", decimals=1),
    },
)
csv_download(items, f"alignment-{chosen}-items.csv", key="alignment_items_csv", label="Download items CSV")
csv_download(
    calls,
    f"alignment-{chosen}-calls.csv",
    key="alignment_calls_csv",
    label="Download calls CSV (prompts, scores, cost)",
)
