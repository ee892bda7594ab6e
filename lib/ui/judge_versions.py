"""Judge-version pieces shared by pages: Analytics' "Judge versions" tab, the rubric a judgment was
judged under (evaluation detail), and a version's diff."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from lib import judge_versions, version_agreement
from lib.judge_versions import Change
from lib.safe_markdown import escape_markdown
from lib.ui import csv_download, session_scope
from lib.ui.tables import count_column, date_column, rate_column, show_table
from lib.version_charts import version_agreement_figure, version_timeline_figure

ANY = "Any"


def versions_tab(*, key: str) -> None:
    """Agreement with reviewers by judge version: per version with intervals, two versions compared
    (with the cautions and "same items only"), and the weekly timeline with version changes."""
    st.caption(
        "Each judge version's decisions against the reviewers' decisions on the judgments they reviewed "
        "(archived evaluations left out). Exact: equal decisions. Within 1: at most one step of the 1–5 "
        "span apart. Kappa: Cohen's kappa, quadratic weights on whole-number scales. Mean gap: on the 1–5 "
        "span. Brackets: 95% seeded bootstrap intervals. A re-judge keeps both versions' decisions, so "
        "re-judged items count for both."
    )
    with session_scope(read_only=True) as session:
        products = version_agreement.version_products(session=session)
        languages = version_agreement.version_languages(session=session)
    if not products:
        st.info(
            "No reviewed judgments yet. Once reviewers confirm or overrule judgments, each judge version's "
            "agreement with them shows here."
        )
        return
    cols = st.columns(2)
    chosen = cols[0].multiselect("Products", products, key=f"{key}_products", placeholder="All products")
    language = cols[1].selectbox("Language", [ANY, *languages], key=f"{key}_language")
    filters = version_agreement.VersionFilters(
        products=tuple(chosen), language=None if language == ANY else language
    )
    with session_scope(read_only=True) as session:
        # The cells and weekly pairs once for the table, the choices, the comparison and the timeline.
        counts = version_agreement.read_counts(session, filters)
        frame = version_agreement.agreement_by_version(session=session, filters=filters, counts=counts)
        choices = version_agreement.version_choices(session=session, filters=filters, counts=counts)
        line = (
            None
            if frame.empty
            else version_agreement.timeline(session=session, filters=filters, counts=counts)
        )
    if frame.empty or line is None:
        st.info("No reviewed judgments match these filters.")
        return

    st.subheader("Agreement per version")
    st.plotly_chart(version_agreement_figure(frame), key=f"{key}_chart")
    show_table(
        version_agreement.display_frame(frame),
        key=f"{key}_table",
        columns={
            "pairs": count_column("Pairs", help="Reviewed judgments this version decided"),
            "first_week": date_column("First week"),
            "last_week": date_column("Last week"),
        },
    )
    csv_download(frame, "agreement_by_judge_version.csv", key=f"{key}_csv", label="Download (CSV)")

    _compare_section(choices, filters, counts, key=key)

    st.subheader("Timeline")
    st.plotly_chart(version_timeline_figure(line.weekly, line.starts), key=f"{key}_timeline_chart")
    show_table(
        line.weekly,
        key=f"{key}_timeline_table",
        columns={
            "version_id": None,
            "week": date_column("Week of"),
            "pairs": count_column("Pairs"),
            "exact_agreement": rate_column("Exact agreement"),
            "within_1_agreement": rate_column("Within 1"),
        },
    )
    csv_download(
        line.weekly, "agreement_by_version_per_week.csv", key=f"{key}_timeline_csv", label="Download (CSV)"
    )


def _compare_section(
    choices: Sequence[version_agreement.VersionChoice],
    filters: version_agreement.VersionFilters,
    counts: version_agreement.Counts,
    *,
    key: str,
) -> None:
    st.subheader("Compare two versions")
    if len(choices) < 2:
        st.info("Two versions with reviewed judgments are needed for a comparison.")
        return
    labels = [c.label for c in choices]
    cols = st.columns([2, 2, 1])
    a = cols[0].selectbox(
        "Version A",
        range(len(choices)),
        index=len(choices) - 2,
        format_func=labels.__getitem__,
        key=f"{key}_a",
    )
    b = cols[1].selectbox(
        "Version B",
        range(len(choices)),
        index=len(choices) - 1,
        format_func=labels.__getitem__,
        key=f"{key}_b",
    )
    same = cols[2].toggle(
        "Same items only",
        key=f"{key}_same",
        help="Only the reviewed judgments both versions judged (a re-judge makes these); the interval is paired",
    )
    if a == b:
        st.info("Pick two different versions.")
        return
    with session_scope(read_only=True) as session:
        result = version_agreement.compare_versions(
            session=session, a=choices[a], b=choices[b], filters=filters, same_items=same, counts=counts
        )
    for caution in result.cautions:
        st.warning(escape_markdown(caution), icon="⚠️")
    if result.empty:
        st.info(
            "No reviewed judgment was judged by both versions."
            if same
            else "The two versions share no metric with reviewed judgments."
        )
        return
    st.caption(
        f"B − A: {escape_markdown(choices[b].name)} minus {escape_markdown(choices[a].name)}; an interval that "
        "excludes 0 is a difference beyond chance at 95%."
        + (f" {result.shared_items:,} reviewed judgments were judged by both." if same else "")
    )
    display = version_agreement.comparison_display(result.frame)
    show_table(display, key=f"{key}_compare_table")
    csv_download(
        result.frame, "judge_version_comparison.csv", key=f"{key}_compare_csv", label="Download (CSV)"
    )


def show_changes(changes: Sequence[Change], *, key: str) -> None:
    """A version's diff: a table of changed fields, and each rubric text change as a line diff."""
    if not changes:
        st.caption("No change from the previous version.")
        return
    show_table(judge_versions.changes_frame(changes), key=key)
    for change in changes:
        if change.detail:
            st.caption(escape_markdown(f"{change.field}: rubric text"))
            st.code(change.detail, language="diff")


def judged_under(version_id: int | None, *, key: str) -> None:
    """Which judge version an evaluation was judged by, and the rubric it was judged under."""
    with session_scope(read_only=True) as session:
        found = judge_versions.versions_by_id(session, [version_id] if version_id else [])
    version = found.get(int(version_id)) if version_id else None
    if version is None:
        st.caption(
            "Judge version: unversioned (judged before versions were recorded, or elsewhere without one)."
        )
        return
    st.caption(escape_markdown(f"Judge version: {version.name} ({judge_versions.created_label(version)})"))
    if not version.rubric:
        return
    with st.expander("Rubric this evaluation was judged under", key=key):
        for spec in judge_versions.rubric_specs(version.rubric):
            st.markdown(f"**{escape_markdown(spec.display_name)}** ({escape_markdown(spec.scale_label())})")
            st.markdown(escape_markdown(spec.description or "(no rubric text)"))
