"""Corrections: the correction cache the judge learns from — browse, measure, preview, import, export."""

import functools

import pandas as pd
import streamlit as st

from lib import charts, corrections, counters, export, importer, judge_versions
from lib.auth import Permission
from lib.config import get_settings, setting_range
from lib.corrections import REVIEW_STATES, JudgmentFilter
from lib.display import REVIEWED_BY, ROLE_HELP, role_label
from lib.importer import ImportFailed
from lib.safe_markdown import escape_markdown
from lib.ui import (
    csv_download,
    csv_download_all,
    current_actor,
    denied_reason,
    flash,
    get_engine,
    pager,
    require_reviewer,
    session_scope,
    show_flash,
)
from lib.ui.review import correction_form, judgment_history
from lib.ui.tables import (
    check_column,
    count_column,
    datetime_column,
    link_column,
    rate_column,
    show_table,
    text_column,
)

ANY = "Any"
CACHE_SECONDS = 60
FLASH = "corrections_flash"
PERIODS = {"D": "day", "W": "week", "M": "month"}

st.title("Corrections")
st.caption(
    "Every judgment with its review. Corrections become the judge's learning context: the newest of "
    "them go into the next judge prompt for the same product (three in four entries are corrections, "
    "interleaved with confirmed judgments)."
)
show_flash(FLASH)
settings = get_settings()
engine = get_engine()


# Full-table aggregates (distinct reviewers, the daily trend) are cached briefly: at a million
# judgments each costs a scan, and neither needs to be exact to the second.
@st.cache_data(ttl=CACHE_SECONDS, max_entries=16, show_spinner=False)
def cached_options(database_url: str) -> dict[str, list[str]]:
    with session_scope(read_only=True) as session:
        return corrections.filter_options(session=session)


@st.cache_data(ttl=CACHE_SECONDS, max_entries=64, show_spinner=False)
def cached_trend(database_url: str, product: str | None, metric: str | None, freq: str) -> pd.DataFrame:
    with session_scope(read_only=True) as session:
        return corrections.corrected_of_reviewed_over_time(
            session=session, product=product, metric=metric, freq=freq
        )


def forget_cached() -> None:
    cached_options.clear()
    cached_trend.clear()


options = cached_options(settings.database_url)
products = options["products"]

# Deep links (Overview's figures and activity rows): `?state=corrected&product=…&change_id=…`
# seed the filters when the page opens; after that the widgets own them.
linked = corrections.filter_params(st.query_params.to_dict())
for name, value in linked.items():
    st.session_state.setdefault(f"corrections_{name}", value)
st.session_state.setdefault("corrections_change_id", st.query_params.get("change_id", ""))


def choices(name: str, values: list[str] | tuple[str, ...]) -> list[str]:
    """ "Any" plus the known values, and a linked value no row has yet (so it still selects)."""
    current = st.session_state.get(f"corrections_{name}", ANY)
    return [ANY, *values] + ([current] if current not in (ANY, *values) else [])


cols = st.columns(4)
product = cols[0].selectbox("Product", choices("product", products), key="corrections_product")
metric = cols[1].selectbox("Metric", choices("metric", options["metrics"]), key="corrections_metric")
state = cols[2].selectbox("Review state", choices("state", REVIEW_STATES), key="corrections_state")
reviewer = cols[3].selectbox(
    "Reviewer", choices("reviewer", options["reviewers"]), key="corrections_reviewer"
)
filters = JudgmentFilter(
    product=None if product == ANY else product,
    metric=None if metric == ANY else metric,
    state=None if state == ANY else state,
    reviewer=None if reviewer == ANY else reviewer,
)

with session_scope(read_only=True) as session:
    # The statistics honour every filter but the review state, which they break down themselves.
    summary = corrections.stats(
        session=session, product=filters.product, metric=filters.metric, reviewer=filters.reviewer
    )
    total = corrections.count_judgments(session=session, filters=filters)

scope = [
    f"{label} {escape_markdown(value)}"
    for label, value in (
        ("product", filters.product),
        ("metric", filters.metric),
        ("reviewer", filters.reviewer),
    )
    if value is not None
]
st.subheader("Cache statistics" + (f" for {', '.join(scope)}" if scope else ""))
if filters.state is not None:
    st.caption("The review state filter applies to the list below; these figures count every state.")
cols = st.columns(4)
cols[0].metric("Judgments", f"{summary['total_judgments']:,}")
cols[1].metric("Corrected", f"{summary['corrected_count']:,}")
cols[2].metric("Correct (or unreviewed)", f"{summary['correct_count']:,}")
of_reviewed = counters.corrected_of_reviewed(summary["corrected_count"], summary["reviewed_count"])
of_all = summary["correction_rate"]
cols[3].metric(
    counters.CORRECTED_OF_REVIEWED_LABEL,
    "—" if of_reviewed is None else f"{of_reviewed:.0%}",
    help=f"{counters.CORRECTED_OF_REVIEWED_HELP} {summary['corrected_count']:,} of "
    f"{summary['reviewed_count']:,} reviewed."
    + (
        ""
        if of_all is None
        else f" Counting unreviewed judgments as correct, {summary['corrected_count']:,} of "
        f"{summary['total_judgments']:,} ({of_all:.0%}) are corrected: the cache file's correction rate."
    ),
)
st.caption(
    f"Products: {escape_markdown(', '.join(summary['products']) or '—')} · "
    f"oldest {summary['oldest_judgment'] or '—'} · newest {summary['newest_judgment'] or '—'}"
)

st.subheader("Judgments")
offset, limit = pager(total, key="corrections_page", capped=counters.count_is_capped(total))
with session_scope(read_only=True) as session:
    frame = corrections.judgments_display_frame(
        corrections.list_judgments(session=session, filters=filters, offset=offset, limit=limit),
        judge_versions.names_of(session),
    )
if frame.empty:
    st.info("No judgments match these filters.")
else:
    show_table(
        frame,
        key="corrections_table",
        order=corrections.JUDGMENT_DISPLAY_COLUMNS,
        alt="Judgments matching the filters, one page",
        columns={
            "open": link_column("", help="Open the judgment's evaluation (its card and audit trail)"),
            "change_id": text_column("Change id"),
            "product": text_column("Product"),
            "metric": text_column("Metric"),
            corrections.JUDGE_DECISION: text_column(role_label("judge", "decision"), help=ROLE_HELP["judge"]),
            corrections.REVIEWER_DECISION: text_column(
                role_label("reviewer", "decision"), help=ROLE_HELP["reviewer"]
            ),
            "state": text_column("State"),
            "was_corrected": check_column("Corrected"),
            REVIEWED_BY: text_column("Reviewed by"),
            "reviewed_at": datetime_column("Reviewed (UTC)"),
            corrections.REVIEWER_REASON: text_column(role_label("reviewer", "reason"), width="medium"),
            corrections.JUDGE_REASON: text_column(role_label("judge", "reason"), width="medium"),
            "confidence": rate_column("Confidence", help="The judge's confidence in its decision"),
            "timestamp": datetime_column("Judged (UTC)"),
            "version": count_column("Version", help="Optimistic-locking version: one more per change"),
        },
    )
    capped = total > corrections.CSV_ROW_LIMIT
    st.caption(
        f"{counters.count_label(total)} judgments match; showing {offset + 1:,}–{offset + len(frame):,}."
        + (f" The CSV holds the newest {corrections.CSV_ROW_LIMIT:,}." if capped else "")
    )
    csv_download_all(
        "Download CSV (all matching rows)",
        "judgments.csv",
        chunks=functools.partial(export.judgments_csv_chunks, engine=engine, filters=filters),
        data=functools.partial(export.judgments_csv_bytes, engine=engine, filters=filters),
        key="corrections_csv",
    )

st.subheader("One judgment: review and history")
change_id = st.text_input(
    "Change id",
    key="corrections_change_id",
    placeholder="e.g. snap_20250101_120000_ab12cd34:clarity or owner/repo#123",
).strip()
if change_id:
    with session_scope(read_only=True) as session:
        judgment = corrections.get_judgment(session=session, change_id=change_id)
        scale = corrections.decision_scale(session=session, judgment=judgment) if judgment else None
    if judgment is None or judgment.id is None or scale is None:
        st.info("No judgment has this change id.")
    else:
        with st.container(border=True):
            correction_form(judgment, scale, key=f"corrections_review_{judgment.id}")
            judgment_history(judgment.id, key=f"corrections_review_{judgment.id}_history")

st.subheader(f"{counters.CORRECTED_OF_REVIEWED_LABEL} over time")
freq = st.segmented_control(
    "Per", list(PERIODS), format_func=PERIODS.__getitem__, default="W", key="corrections_freq"
)
trend = cached_trend(settings.database_url, filters.product, filters.metric, freq or "W")
if trend.empty:
    st.caption("No reviewed judgments yet: the trend appears once reviewers confirm or overrule the judge.")
else:
    st.caption(
        "Share of reviewed judgments that reviewers overruled, by when the judge made them "
        f"(refreshed every {CACHE_SECONDS} s)."
    )
    st.plotly_chart(charts.corrected_of_reviewed_figure(trend), key="corrections_trend")
    csv_download(trend, "corrected_of_reviewed.csv", key="corrections_trend_csv")

st.subheader("What the judge will see")
st.caption("The exact history block the next judge prompt gets for this product (and metric).")
cols = st.columns(4)
history_product = cols[0].selectbox(
    "Product",
    products,
    index=products.index(filters.product) if filters.product in products else 0,
    key="corrections_history_product",
)
history_metric = cols[1].selectbox("Metric", [ANY, *options["metrics"]], key="corrections_history_metric")
entries_low, entries_high = setting_range("history_max_entries")
ratio_low, ratio_high = setting_range("history_correction_ratio")
size = cols[2].number_input(
    "Entries",
    min_value=int(entries_low),
    max_value=int(entries_high),
    value=settings.history_max_entries,
    key="corrections_history_size",
)
ratio = cols[3].slider(
    "Correction ratio",
    min_value=float(ratio_low),
    max_value=float(ratio_high),
    value=float(settings.history_correction_ratio),
    step=0.05,
    key="corrections_history_ratio",
)
if history_product is None:
    st.code(corrections.HISTORY_EMPTY_TEXT, language=None)
else:
    with session_scope(read_only=True) as session:
        block = corrections.history_block(
            session=session,
            product=history_product,
            metric=None if history_metric == ANY else history_metric,
            max_entries=int(size),
            correction_ratio=float(ratio),
        )
    st.code(block, language=None, wrap_lines=True)

st.subheader("Import and export the cache")
left, right = st.columns(2)
with left:
    upload = st.file_uploader("Judgment cache (JSON)", type=["json"], key="corrections_upload")
    import_denied = denied_reason(Permission.IMPORT) if current_actor() else None
    if import_denied:
        st.caption(f"🔒 {escape_markdown(import_denied)}")
    if (
        st.button("Import", key="corrections_import", disabled=upload is None or import_denied is not None)
        and upload is not None
    ):
        name = require_reviewer("import a cache file", Permission.IMPORT)
        if name:
            try:
                with session_scope() as session:
                    report = importer.import_cache_bytes(
                        session=session, raw=upload.getvalue(), source=upload.name, reviewer=name
                    )
            except ImportFailed as exc:
                st.warning(escape_markdown(str(exc)), icon="⚠️")
            else:
                flash(FLASH, "success", f"Imported {upload.name}: {report.summary()}.")
                forget_cached()
                st.rerun()
with right:
    export_product = st.selectbox("Products to export", [ANY, *products], key="corrections_export_product")
    exporter = current_actor()
    st.download_button(
        "Download cache JSON",
        data=lambda: export.export_cache_bytes(
            engine=engine, product=None if export_product == ANY else export_product, actor=exporter
        ),
        file_name="ai_cache.json",
        mime="application/json",
        key="corrections_export",
        on_click="ignore",
    )

with st.expander("Admin: clear a product's judgments"):
    st.caption(
        "Deletes every judgment of the product and its history, and the product's alignment "
        "experiments (they are measured against these judgments). This cannot be undone."
    )
    target = st.selectbox("Product to clear", products, index=None, key="corrections_clear_product")
    doomed_experiments = []
    if target is not None:
        with session_scope(read_only=True) as session:
            doomed_experiments = corrections.experiments_on_product(session=session, product=target)
    if doomed_experiments:
        listed = ", ".join(f"#{e.id} {e.name}".strip() for e in doomed_experiments)
        st.warning(
            escape_markdown(
                f"This also deletes {len(doomed_experiments):,} alignment "
                f"experiment{'s' if len(doomed_experiments) != 1 else ''} of {target}: {listed}."
            ),
            icon="⚠️",
        )
    typed = st.text_input("Type the product name to confirm", key="corrections_clear_confirm")
    confirmed = target is not None and typed == target
    clear_denied = denied_reason(Permission.CLEAR_CACHE) if current_actor() else None
    if clear_denied:
        st.caption(f"🔒 {escape_markdown(clear_denied)}")
    if st.button(
        "Delete all its judgments",
        type="primary",
        key="corrections_clear",
        disabled=not confirmed or clear_denied is not None,
    ):
        name = require_reviewer("clear a product", Permission.CLEAR_CACHE)
        if name and target is not None:
            with session_scope() as session:
                gone = len(corrections.experiments_on_product(session=session, product=target))
                removed = corrections.clear_product(session=session, product=target, reviewer=name)
            also = f" and {gone:,} alignment experiment{'s' if gone != 1 else ''}" if gone else ""
            flash(FLASH, "success", f"Deleted {removed:,} judgments of {target}{also}.")
            forget_cached()
            st.rerun()
