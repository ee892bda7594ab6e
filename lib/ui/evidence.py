"""Evidence widgets: the highlighted answer, its legend, metric cards and evidence lists.

Rendering rules (SPEC §9): the only HTML handed to `st.markdown(..., unsafe_allow_html=True)` is the
output of `lib.highlight`, which escapes every piece of data before adding its own constant markup.
Every other untrusted string (reasons, quotes, names, ids) goes through `escape_markdown` and is
rendered as plain Markdown text. The seed-002 label protocol is kept per evidence item: stages 1–3
are highlighted, stage 4 shows the quote with "Position could not be located, highlight off",
stage 5 shows the warning "Evidence could not be verified".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import streamlit as st

from lib.display import ROLE_HELP, role_label
from lib.evidence import EvidenceItem
from lib.highlight import (
    INLINE_CHARS,
    Span,
    answer_parts,
    clip_text,
    metric_palette,
    render_highlighted_answer,
    render_legend,
    sanitize_slug,
)
from lib.inspector import EvaluationDetail, MetricCard
from lib.safe_markdown import escape_markdown

# A hook that draws more inside a metric card (e.g. the review form of lib/ui/review.py).
CardExtra = Callable[[MetricCard], None]

NO_EVIDENCE_MESSAGE = "No evidence was recorded for this evaluation."


def format_score(value: float | None) -> str:
    """A score as people write it: 4, 2.67, or an em dash when it is missing."""
    if value is None:
        return "—"
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}".rstrip("0").rstrip(".")


def detail_colors(detail: EvaluationDetail) -> dict[str, str]:
    """One colour per metric of the evaluation, stable across reruns and evaluations of a product."""
    return metric_palette([card.spec.slug for card in detail.cards])


def render_long_text(
    text: str,
    *,
    key: str,
    file_name: str,
    spans: Sequence[Span] = (),
    colors: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    height: int | None = None,
) -> None:
    """Data text (an answer, a question) as escaped HTML, one part of `INLINE_CHARS` at a time.

    The one rendering path for text that may be huge (issue #17): short text shows whole; long text
    gets a part selector, a "show all" toggle and a download of the full text, so no page lays out a
    megabyte unless the reviewer asks for it.
    """
    parts = answer_parts(text)
    window = None
    if len(parts) > 1:
        # Another text under the same key (the queue's next item, another evaluation) starts at part 1.
        digest = hashlib.blake2s(text.encode("utf-8", "replace"), digest_size=8).hexdigest()
        if st.session_state.get(f"{key}_of") != digest:
            st.session_state[f"{key}_of"] = digest
            st.session_state[f"{key}_part"] = 1
            st.session_state[f"{key}_all"] = False
        st.caption(
            f"{len(text):,} characters: shown in {len(parts)} parts of up to {INLINE_CHARS:,} characters "
            "so the page stays responsive. Pick a part, show all at once (slower), or download the full text."
        )
        part, whole, download = st.columns([1, 1, 1.4], vertical_alignment="bottom")
        show_all = whole.toggle("Show all at once", key=f"{key}_all")
        # No `value=`: the part lives in session state (reset above), and Streamlit warns about both.
        number = part.number_input(
            f"Part (of {len(parts)})",
            min_value=1,
            max_value=len(parts),
            step=1,
            key=f"{key}_part",
            disabled=show_all,
        )
        download.download_button(
            "Download the full text",
            # Lone surrogates (from older imports) must not make the download fail.
            data=text.encode("utf-8", "replace"),
            file_name=file_name,
            mime="text/plain",
            key=f"{key}_download",
            on_click="ignore",
        )
        window = None if show_all else parts[int(number) - 1]
    # Safe: lib.highlight escapes the text and every reason before adding its own constant markup.
    html = render_highlighted_answer(text, spans, colors, labels, window=window)
    with st.container(height=height or "content", border=height is not None, key=f"{key}_text"):
        st.markdown(html, unsafe_allow_html=True)


def render_highlighted_answer_block(detail: EvaluationDetail, colors: Mapping[str, str]) -> None:
    """The model answer with stage 1–3 evidence painted in, and a legend of the metrics used."""
    render_answer(
        detail.snapshot.model_answer,
        spans=detail.spans,
        legend=detail.highlighted_metrics,
        colors=colors,
        labels=detail.labels,
        key="evaluations_answer",
        file_name=f"{sanitize_slug(detail.snapshot.id)}-answer.txt",
    )


def render_answer(
    answer: str,
    *,
    spans: Sequence[Span],
    legend: Sequence[str],
    colors: Mapping[str, str],
    labels: Mapping[str, str],
    key: str,
    file_name: str,
    height: int | None = None,
) -> None:
    """An answer with its verified highlights and their legend: the detail view and the queue alike."""
    if spans:
        st.markdown(render_legend(legend, colors, labels), unsafe_allow_html=True)
    render_long_text(
        answer, key=key, file_name=file_name, spans=spans, colors=colors, labels=labels, height=height
    )
    if spans:
        st.caption("Hover a highlight for its reason, or open a numbered item below the answer.")


def render_stage_label(item: EvidenceItem) -> None:
    """The seed-002 AD-2 label of one evidence item."""
    if item.stage == "unverified":
        st.warning(item.label, icon="⚠️")
    elif item.stage == "whitespace":
        st.info(item.label, icon="ℹ️")
    else:
        st.caption(f"🖍️ {item.label}")


def render_evidence_list(items: Sequence[EvidenceItem]) -> None:
    """Each evidence item: its quote, why it matters, a better wording, and its verification label."""
    for item in items:
        quote = escape_markdown(clip_text(item.quote)) if item.quote.strip() else "*(empty quote)*"
        st.markdown(f"> {quote}")
        if item.why:
            st.markdown(f"**Why:** {escape_markdown(clip_text(item.why))}")
        if item.better:
            st.markdown(f"**Better:** {escape_markdown(clip_text(item.better))}")
        render_stage_label(item)


def _judgment_line(card: MetricCard) -> str | None:
    """Where the reviewers stand on this metric's judgment, as escaped Markdown."""
    judgment = card.judgment
    if judgment is None:
        return None
    if judgment.reviewed_at is None:
        return "Review: pending"
    who = escape_markdown(judgment.reviewer or "unknown reviewer")
    if judgment.was_corrected:
        before, after = escape_markdown(judgment.decision), escape_markdown(judgment.user_decision or "")
        return f"Review: overruled by {who} ({before} → {after})"
    return f"Review: confirmed by {who}"


def render_metric_card(card: MetricCard, *, key: str, extra: CardExtra | None = None) -> None:
    """One metric: user and judge score on the metric's own scale, the gap, reasons and evidence."""
    with st.container(border=True, key=key):
        title = f"**{escape_markdown(card.spec.display_name)}**"
        if card.role == "primary":
            title += " :blue-badge[Primary]"
        elif card.role == "bonus":
            title += " :violet-badge[Bonus]"
        if not card.in_rubric:
            title += " :gray-badge[Not in the product's current rubric]"
        st.markdown(title)
        st.caption(f"Scale {escape_markdown(card.spec.scale_label())}")
        user, judge, gap = st.columns(3)
        user.metric(role_label("user", "score"), format_score(card.user_score), help=ROLE_HELP["user"])
        judge.metric(role_label("judge", "score"), format_score(card.judge_score), help=ROLE_HELP["judge"])
        gap.metric("Gap", format_score(card.gap), help="|user's score − judge's score| on the metric's scale")
        if card.user_reason:
            st.markdown(f"**{role_label('user', 'reason')}:** {escape_markdown(clip_text(card.user_reason))}")
        if card.judge_reason:
            st.markdown(
                f"**{role_label('judge', 'reason')}:** {escape_markdown(clip_text(card.judge_reason))}"
            )
        line = _judgment_line(card)
        if line:
            st.caption(line)
        if card.evidence:
            render_evidence_list(card.evidence)
        # The per-metric extension point (e.g. the review form) lives at the bottom of the card.
        if extra is not None:
            extra(card)


def render_metric_cards(
    cards: Sequence[MetricCard], *, key_prefix: str, extra: CardExtra | None = None, per_row: int = 2
) -> None:
    """The cards in rows, largest gap first, so reading order is the order of importance."""
    for start in range(0, len(cards), per_row):
        columns = st.columns(per_row)
        for offset, (column, card) in enumerate(zip(columns, cards[start : start + per_row], strict=False)):
            with column:
                # Keyed by position, not slug: a key becomes a CSS class, and data never should.
                render_metric_card(card, key=f"{key_prefix}_card_{start + offset}", extra=extra)
