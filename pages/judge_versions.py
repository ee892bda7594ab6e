"""Judge versions: which judge made each judgment; edit a product's rubric (each save a version with
its diff), re-judge a sample with a chosen version, promote a winning alignment-lab arm."""

import streamlit as st
from sqlmodel import col, select

from lib import evaluation_form, judge, judge_changes, judge_versions
from lib.auth import Permission
from lib.judge_versions import VersionError
from lib.metrics import metrics_for_product
from lib.models import AlignmentExperiment
from lib.safe_markdown import escape_markdown
from lib.ui import (
    csv_download,
    current_actor,
    denied_reason,
    flash,
    get_engine,
    llm_off_help,
    llm_unavailable_message,
    require_reviewer,
    session_scope,
    show_flash,
)
from lib.ui.judge_versions import show_changes
from lib.ui.tables import check_column, datetime_column, show_table

FLASH = "versions_flash"
PICK_NEXT = "versions_pick_next"
CURRENT = "(the product's current judge)"

st.title("Judge versions")
st.caption(
    "A judge version is one configuration of a product's judge: model, rubric, prompt templates, "
    "correction-history and notes settings, temperature and reply caps. The same configuration is "
    "always the same version; the built-in judge stamps each evaluation and judgment it writes with "
    "its version. Analytics → Judge versions shows whether each version agrees with reviewers more."
)
show_flash(FLASH)

with session_scope(read_only=True) as session:
    products = evaluation_form.known_products(session=session)
if not products:
    st.info("No products yet. Import evaluations or a metric set to see and edit a product's judge.")
    st.stop()
product = st.selectbox("Product", products, key="versions_product")
denied = denied_reason(Permission.JUDGE) if current_actor() else None

with session_scope(read_only=True) as session:
    frame = judge_versions.versions_frame(session, [product])
    versions = judge_versions.versions_of(session, product)
    metrics = metrics_for_product(session=session, product=product)

st.subheader("Versions")
if frame.empty:
    st.info(
        "No version of this product's judge yet: its judgments are unversioned. The next judge run, "
        "rubric save or import that names a `judge_version` makes one."
    )
else:
    show_table(
        frame,
        key="versions_table",
        order=["name", "origin", "judge_model", "changes", "created_by", "created_at", "current"],
        columns={
            "created_at": datetime_column("Created (UTC)"),
            "current": check_column("Current", help="The options the product's judge runs with now"),
        },
    )
    csv_download(frame, f"judge_versions_{product}.csv", key="versions_csv", label="Download (CSV)")
    names = [v.name for v in reversed(versions)]  # newest first
    if st.session_state.get(PICK_NEXT) in names:  # a save or promotion just made it: show it
        st.session_state["versions_pick"] = st.session_state.pop(PICK_NEXT)
    picked = st.selectbox("Version", names, key="versions_pick", help="Newest first")
    with session_scope(read_only=True) as session:
        version = judge_versions.require_version(session, product, picked)
        changes = judge_versions.changes_since_previous(session, version)
        previous = judge_versions.previous_of(session, version)
        record = judge_versions.version_record(version)
    st.caption(
        escape_markdown(
            f"{version.name}: made {judge_versions.created_label(version)} ({version.origin})"
            + (
                f", from alignment experiment #{version.experiment_id} arm {version.experiment_arm}"
                if version.experiment_id
                else ""
            )
            + (f". {version.description}" if version.description else "")
        )
    )
    st.markdown(
        f"**Changes since {escape_markdown(previous.name) if previous else 'nothing (first version)'}**"
    )
    show_changes(changes, key="versions_changes")
    with st.expander("Full configuration", key="versions_config"):
        st.json(record)
    if (
        version.complete
        and not denied
        and st.button(
            "Make this version's options current",
            key="versions_use",
            help="Model, history, notes, temperature and caps",
        )
    ):
        by = require_reviewer("change the judge", Permission.JUDGE)
        if by:
            with session_scope() as session:
                stored = judge_versions.require_version(session, product, picked)
                judge_versions.set_current_options(session=session, version=stored, set_by=by)
            flash(
                FLASH,
                "success",
                f"{picked} is now {product}'s judge (model and options; the rubric stays as defined).",
            )
            st.rerun()

st.subheader("Edit the rubric")
st.caption(
    "Each save becomes a new version with its diff against the previous one; judgments already made keep "
    "the rubric they were judged under. A removed metric's judgments keep showing under the version that "
    "judged them (reviewers can still review them); the new version simply does not judge it."
)
if denied:
    st.caption(f"🔒 {escape_markdown(denied)}")
with st.form("versions_rubric"):
    edited = []
    removed = []
    for spec in metrics:
        st.markdown(f"**{escape_markdown(spec.slug)}**")
        if spec.scale_inferred:
            st.caption(
                f"Scale {spec.scale_label()} inferred from imported scores: a later import's scores "
                "outside it widen it. Change the scale here to fix it."
            )
        cols = st.columns([2, 1, 1, 1, 1])
        display_name = cols[0].text_input(
            "Display name", spec.display_name, key=f"rubric_name_{product}_{spec.slug}"
        )
        low = cols[1].number_input(
            "Min", value=float(spec.min_value), key=f"rubric_min_{product}_{spec.slug}"
        )
        high = cols[2].number_input(
            "Max", value=float(spec.max_value), key=f"rubric_max_{product}_{spec.slug}"
        )
        integer = cols[3].checkbox(
            "Whole numbers", spec.integer_scale, key=f"rubric_int_{product}_{spec.slug}"
        )
        drop = cols[4].checkbox(
            "Remove",
            key=f"rubric_remove_{product}_{spec.slug}",
            help="The new version does not judge this metric. Judgments already made keep showing "
            "under the version that judged them.",
        )
        text = st.text_area(
            "Rubric text", spec.description, key=f"rubric_text_{product}_{spec.slug}", height=90
        )
        if drop:
            removed.append(spec.slug)
            continue
        edited.append(
            {
                "slug": spec.slug,
                "display_name": display_name,
                "min": low,
                "max": high,
                "integer_scale": integer,
                "description": text,
            }
        )
    st.markdown("**Add a metric** (leave the slug empty to add none)")
    cols = st.columns([1, 2, 1, 1, 1])
    add_slug = cols[0].text_input(
        "Slug",
        key=f"rubric_add_slug_{product}",
        placeholder="e.g. tone",
        help="Lowercase letters, digits, '_' or '-'; how imports and the API name the metric",
    )
    add_name = cols[1].text_input("Display name", key=f"rubric_add_name_{product}", placeholder="e.g. Tone")
    add_low = cols[2].number_input("Min", value=1.0, key=f"rubric_add_min_{product}")
    add_high = cols[3].number_input("Max", value=5.0, key=f"rubric_add_max_{product}")
    add_integer = cols[4].checkbox("Whole numbers", True, key=f"rubric_add_int_{product}")
    add_text = st.text_area("Rubric text", key=f"rubric_add_text_{product}", height=90)
    if add_slug.strip():
        edited.append(
            {
                "slug": add_slug.strip(),
                "display_name": add_name.strip(),
                "min": add_low,
                "max": add_high,
                "integer_scale": add_integer,
                "description": add_text,
            }
        )
    cols = st.columns(2)
    new_name = cols[0].text_input(
        "Version name",
        key="rubric_version_name",
        placeholder="e.g. v3: stricter clarity rubric (default: v<n>)",
    )
    note = cols[1].text_input("Why (optional)", key="rubric_version_note")
    saved = st.form_submit_button(
        "Save rubric as a new version", key="rubric_save", type="primary", disabled=denied is not None
    )
if saved:
    by = require_reviewer("edit the rubric", Permission.JUDGE)
    if by:
        try:
            with session_scope() as session:
                made = judge_changes.save_rubric(
                    session=session,
                    product=product,
                    metrics=edited,
                    actor=by,
                    name=new_name or None,
                    description=note,
                )
                label = made.version.name
                metric_changes = judge_changes.metric_changes_text(session, made) if made.created else ""
            st.session_state[PICK_NEXT] = label
        except ValueError as exc:  # VersionError is one
            st.error(escape_markdown(f"Nothing was saved: {exc}"), icon="⚠️")
        else:
            for key in [k for k in st.session_state if str(k).startswith("rubric_add_")]:
                del st.session_state[key]  # an added metric is now one of the rubric's own rows
            flash(
                FLASH,
                "success" if made.created else "info",
                f"Saved as version {label}{metric_changes}."
                if made.created
                else f"This rubric is version {label} already; nothing new was made.",
            )
            st.rerun()

st.subheader("Re-judge a sample")
st.caption(
    "The judge scores a sample of this product's evaluations again with the chosen version. Reviewers' "
    "decisions are kept; an unreviewed judgment takes the new decision; both versions' decisions are kept "
    "for Analytics' “same items only” comparison. The evaluation's own judge scores are not rewritten."
)
unavailable = llm_unavailable_message()
runnable = [CURRENT, *(v.name for v in versions if judge.runnable_problem(v) is None)]
with st.form("versions_rejudge"):
    cols = st.columns([2, 1, 1, 1])
    chosen = cols[0].selectbox("Judge version", runnable, index=0, key="rejudge_version")
    size = cols[1].number_input("Evaluations", 1, judge_changes.REJUDGE_LIMIT, 20, key="rejudge_size")
    seed = cols[2].number_input("Seed", 0, 2**31 - 1, 0, key="rejudge_seed")
    reviewed_only = cols[3].checkbox(
        "Reviewed only", True, key="rejudge_reviewed", help="Only evaluations with a reviewer's decision"
    )
    run = st.form_submit_button(
        "Run the judge",
        key="rejudge_run",
        icon="⚖️",
        disabled=unavailable is not None or denied is not None,
        help=llm_off_help("The judge") or denied,
    )
if run:
    by = require_reviewer("run the judge", Permission.JUDGE)
    if by:
        bar = st.progress(0.0, text="Re-judging…")

        def step(done: int, total: int) -> None:
            bar.progress(done / total if total else 1.0, text=f"Re-judging… {done}/{total}")

        try:
            report = judge_changes.rejudge_sample(
                engine=get_engine(),
                product=product,
                reviewer=by,
                version=None if chosen == CURRENT else chosen,
                size=int(size),
                seed=int(seed),
                reviewed_only=reviewed_only,
                progress=step,
            )
        except ValueError as exc:
            st.error(escape_markdown(str(exc)), icon="⚠️")
        else:
            level = "warning" if report.failed else "success"
            failures = "; ".join(f"{s}: {m}" for s, m in report.failed[:3])
            flash(FLASH, level, report.summary() + (f" ({failures})" if failures else ""))
            st.rerun()

st.subheader("Promote an alignment-lab arm")
with session_scope(read_only=True) as session:
    experiments = session.exec(
        select(AlignmentExperiment)
        .where(col(AlignmentExperiment.product) == product)
        .order_by(col(AlignmentExperiment.id).desc())
    ).all()
if not experiments:
    st.caption("No alignment experiment for this product yet (Alignment lab).")
else:
    with st.form("versions_promote"):
        cols = st.columns([2, 1, 2])
        labels = {e.id: f"#{e.id} {e.name or ''} ({e.status})" for e in experiments}
        experiment_id = cols[0].selectbox(
            "Experiment", list(labels), format_func=labels.get, key="promote_experiment"
        )
        arm = cols[1].selectbox("Arm", list(judge_changes.ARM_OPTIONS), index=3, key="promote_arm")
        promote_name = cols[2].text_input("Version name", key="promote_name", placeholder="default: v<n>")
        promoted = st.form_submit_button(
            "Promote to a judge version", key="promote_run", disabled=denied is not None
        )
    if promoted:
        by = require_reviewer("promote an arm", Permission.JUDGE)
        if by:
            try:
                with session_scope() as session:
                    made = judge_changes.promote_arm(
                        session=session,
                        experiment_id=int(experiment_id),
                        arm=arm,
                        actor=by,
                        name=promote_name or None,
                    )
                    label = made.version.name
                st.session_state[PICK_NEXT] = label
            except VersionError as exc:
                st.error(escape_markdown(str(exc)), icon="⚠️")
            else:
                flash(
                    FLASH,
                    "success",
                    f"Arm {arm} of experiment #{experiment_id} is now {product}'s judge: version {label}.",
                )
                st.rerun()
