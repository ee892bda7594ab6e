"""The second-opinion widget: a judgment's stored second opinion and a button asking for a new one.

Pages call `second_opinion_panel(judgment, key=...)`, or pass `second_opinion_card_extra` as the
`extra` hook of `lib.ui.evidence.render_metric_cards`. A failure of the evaluation model is shown
and the judgment stays as it was (seed 000 fallback).
"""

from __future__ import annotations

import streamlit as st

from lib import second_opinion
from lib.auth import Permission
from lib.config import get_settings
from lib.inspector import MetricCard
from lib.models import Judgment
from lib.safe_markdown import escape_markdown
from lib.ui import current_actor, denied_reason, get_engine, llm_off_help, require_reviewer

SECOND_OPINIONS_OFF = "No second-opinion buttons: no LLM is configured."
ACTION_ICONS = {"validated": "✅", "improved": "🔁", "questioned": "⚠️", "unchanged": "➖"}
ACTION_TEXT = {
    "validated": "The evaluation model agrees with the judge.",
    "improved": "The evaluation model proposes a better decision.",
    "questioned": "The evaluation model questions the judge's decision.",
    "unchanged": "The evaluation model gave no clear verdict.",
}


def render_opinion(opinion: second_opinion.SecondOpinion, *, decision: str) -> None:
    """One stored or fresh second opinion: verdict, decision and confidence, the explanation."""
    action = opinion.action or "unchanged"
    summary = escape_markdown(second_opinion.describe(opinion, decision=decision))
    st.markdown(f"{ACTION_ICONS.get(action, '➖')} **Second opinion:** {summary}")
    st.caption(ACTION_TEXT.get(action, ""))
    if opinion.explanation:
        st.markdown(escape_markdown(opinion.explanation))


def second_opinion_panel(judgment: Judgment, *, key: str) -> None:
    """A judgment's second opinion, and a button that asks the evaluation model.

    Without an LLM the button is not drawn at all (a page of eight greyed buttons says nothing):
    the page says once why, with `second_opinions_off_caption`; stored opinions still show.
    """
    result_key = f"{key}_result"
    clicked = False
    if get_settings().llm_configured:
        label = (
            "Ask for a second opinion"
            if judgment.second_opinion_at is None
            else "Ask for a new second opinion"
        )
        denied = denied_reason(Permission.SECOND_OPINION) if current_actor() else None
        clicked = st.button(
            label,
            key=key,
            icon="🧐",
            disabled=judgment.id is None or denied is not None,
            help=denied or "A second LLM checks this judgment against the answer and adjusts its confidence.",
        )
    if clicked and judgment.id is not None:
        reviewer = require_reviewer("ask for a second opinion", Permission.SECOND_OPINION)
        if reviewer:
            with st.spinner("Asking the evaluation model…"):
                st.session_state[result_key] = second_opinion.request_second_opinion(
                    engine=get_engine(), judgment_id=judgment.id, reviewer=reviewer
                )
    fresh = st.session_state.get(result_key)
    if isinstance(fresh, second_opinion.SecondOpinion) and fresh.judgment_id == judgment.id:
        if fresh.ok:
            render_opinion(fresh, decision=judgment.decision)
            return
        st.error(escape_markdown(fresh.error or "The second opinion failed."), icon="⚠️")
    stored = second_opinion.opinion_of(judgment)
    if stored is not None:
        render_opinion(stored, decision=judgment.decision)


def second_opinions_off_caption(*, hint: bool = True) -> None:
    """Where the second-opinion buttons would be: one line saying why they are not there.

    `hint=False` when the page already gave the setup hint nearby (the evaluation detail says it once,
    under "Start chat"), so the same instructions are not repeated a few lines apart.
    """
    off = llm_off_help("A second opinion")
    if off:
        st.caption(f"🧐 {escape_markdown(off if hint else SECOND_OPINIONS_OFF)}")


def second_opinion_card_extra(card: MetricCard) -> None:
    """The panel inside a metric card (the `extra` hook of render_metric_cards)."""
    if card.judgment is not None and card.judgment.id is not None:
        # Keyed by the judgment's numeric id: a key becomes a CSS class, and data never should.
        second_opinion_panel(card.judgment, key=f"second_opinion_{card.judgment.id}")
