"""What the Precedents page shows and writes (seed 003): the list, the reason chart, one detail, a review.

The page stays thin: every query, every frame and the expert-review rule live here. Filtering,
counting and paging run in SQL, so only one page of interactions is ever read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from sqlalchemy import Select, and_, exists, func, select
from sqlmodel import Session, col

from lib import precedents
from lib.auth import Actor, Permission, authorize, identity_of
from lib.charts import OKABE_ITO, plotly_text
from lib.display import evaluation_title, interaction_url
from lib.interaction_records import expert_feedback_fields
from lib.models import AutoEval, ExpertFeedback, Interaction, utcnow
from lib.records import InvalidField

MATCHED = "matched"
NO_TEXT_MESSAGE = (
    "This interaction was logged without its question and answer, so there is nothing to compare "
    "with precedents (outcome no_embeddings)."
)
NO_ANSWER = "(no answer text)"
PENDING = "pending"
EXPERT = "expert-reviewed"
OUTCOMES = (MATCHED, *precedents.REASON_CODES, PENDING, EXPERT)
QUESTION_PREVIEW = 120
LIST_COLUMNS = [
    "id",
    "created_at",
    "product",
    "language",
    "question",
    "outcome",
    "total_score",
    "expert_total",
]


DISPLAY_COLUMNS = [
    "open",
    "title",
    "outcome",
    "total_score",
    "expert_total",
    "product",
    "language",
    "created_at",
    "id",
]


def display_frame(page: pd.DataFrame) -> pd.DataFrame:
    """A list page as reviewers read it: a link that opens the interaction's trace on this page and
    the question's first line as its title (the CSV keeps LIST_COLUMNS)."""
    frame = page.copy()
    frame.insert(0, "open", [interaction_url(str(i)) for i in frame["id"]])
    frame.insert(1, "title", [evaluation_title(q) for q in frame["question"]])
    return frame[DISPLAY_COLUMNS]


def pick_labels(page: pd.DataFrame) -> dict[str, str]:
    """The interaction picker's label per id on a list page: the title and the outcome."""
    return {
        str(i): f"{evaluation_title(q)} · {o}"
        for i, q, o in zip(page["id"], page["question"], page["outcome"], strict=True)
    }


@dataclass(frozen=True)
class PrecedentFilters:
    """The page's filters; None means any. Dates are whole UTC days, both ends included."""

    product: str | None = None
    language: str | None = None
    outcome: str | None = None
    start: date | None = None
    end: date | None = None


def filters_from_widgets(
    product: str | None, language: str | None, outcome: str | None, days: Sequence[date] | date | None
) -> PrecedentFilters:
    """Filters from the widgets; a date range still being picked (one day) means from that day."""
    picked = [days] if isinstance(days, date) else list(days or ())
    return PrecedentFilters(
        product=product or None,
        language=language or None,
        outcome=outcome or None,
        start=picked[0] if picked else None,
        end=picked[1] if len(picked) > 1 else None,
    )


def _reviewed() -> Any:
    return exists().where(ExpertFeedback.interaction_id == Interaction.id, ExpertFeedback.type == "expert")


def _filtered(query: Select[Any], filters: PrecedentFilters) -> Select[Any]:
    """`query` (over interactions LEFT JOIN auto_evals) narrowed by the filters."""
    if filters.product:
        query = query.where(Interaction.product == filters.product)
    if filters.language:
        query = query.where(Interaction.language == filters.language)
    if filters.start:
        query = query.where(col(Interaction.created_at) >= datetime.combine(filters.start, time(), UTC))
    if filters.end:
        query = query.where(
            col(Interaction.created_at) < datetime.combine(filters.end + timedelta(days=1), time(), UTC)
        )
    outcome = filters.outcome
    if outcome == MATCHED:
        query = query.where(col(AutoEval.has_matches).is_(True))
    elif outcome in precedents.REASON_CODES:
        query = query.where(AutoEval.no_match_reason == outcome)
    elif outcome == PENDING:
        query = query.where(col(AutoEval.id).is_(None), ~_reviewed())
    elif outcome == EXPERT:
        query = query.where(_reviewed())
    return query


def _base(*columns: Any) -> Select[Any]:
    return (
        select(*columns)
        .select_from(Interaction)
        .outerjoin(AutoEval, AutoEval.interaction_id == Interaction.id)
    )


@dataclass(frozen=True)
class FilterOptions:
    products: list[str]
    languages: list[str]


def filter_options(*, session: Session) -> FilterOptions:
    """The products and languages that have interactions, for the filter widgets."""
    products = session.execute(select(Interaction.product).distinct().order_by(Interaction.product)).scalars()
    languages = session.execute(
        select(Interaction.language).distinct().order_by(Interaction.language)
    ).scalars()
    return FilterOptions([p for p in products if p], [lang for lang in languages if lang])


def count_interactions(*, session: Session, filters: PrecedentFilters) -> int:
    return session.execute(_filtered(_base(func.count()), filters)).scalar_one()


def _latest_expert_totals(session: Session, ids: Sequence[str]) -> dict[str, float | None]:
    rows = session.execute(
        select(ExpertFeedback.interaction_id, ExpertFeedback.total_score)
        .where(col(ExpertFeedback.interaction_id).in_(list(ids)), ExpertFeedback.type == "expert")
        .order_by(col(ExpertFeedback.created_at), col(ExpertFeedback.id))
    ).all()
    return dict(rows)


def _list_select(filters: PrecedentFilters) -> Select[Any]:
    """Matching interactions, newest first, with their auto-evaluation outcome fields."""
    return _filtered(
        _base(
            Interaction.id,
            Interaction.created_at,
            Interaction.product,
            Interaction.language,
            func.substr(Interaction.question, 1, QUESTION_PREVIEW),
            AutoEval.has_matches,
            AutoEval.no_match_reason,
            AutoEval.total_score,
        ),
        filters,
    ).order_by(col(Interaction.created_at).desc(), col(Interaction.id).desc())


def _records(session: Session, rows: Sequence[Any]) -> list[dict[str, Any]]:
    """List rows with their outcome and latest expert total (one query for the whole batch)."""
    experts = _latest_expert_totals(session, [r[0] for r in rows])
    records = []
    for iid, created, product, language, question, has_matches, reason, total in rows:
        if has_matches is None:
            outcome = EXPERT if iid in experts else PENDING
        else:
            outcome = MATCHED if has_matches else (reason or "unknown")
        records.append(
            {
                "id": iid,
                "created_at": created,
                "product": product,
                "language": language,
                "question": question,
                "outcome": outcome,
                "total_score": total,
                "expert_total": experts.get(iid),
            }
        )
    return records


def list_page(*, session: Session, filters: PrecedentFilters, offset: int, limit: int) -> pd.DataFrame:
    """One page of interactions, newest first, with their outcome and (copied / expert) totals."""
    rows = session.execute(_list_select(filters).offset(offset).limit(limit)).all()
    return pd.DataFrame.from_records(_records(session, rows), columns=LIST_COLUMNS)


# Interactions fetched at a time by the CSV download: its memory is one batch, whatever the matches.
CSV_BATCH_ROWS = 1_000


def iter_list_rows(*, session: Session, filters: PrecedentFilters, limit: int) -> Iterator[tuple[Any, ...]]:
    """Every matching interaction (newest `limit`) as LIST_COLUMNS tuples, a batch at a time."""
    result = session.execute(_list_select(filters).limit(limit).execution_options(yield_per=CSV_BATCH_ROWS))
    for batch in result.partitions():
        for record in _records(session, batch):
            yield tuple(record[c] for c in LIST_COLUMNS)


def reason_counts(*, session: Session, filters: PrecedentFilters) -> pd.DataFrame:
    """Auto-evaluations per outcome (matched or no-match reason) over the filter, for the chart."""
    outcome = func.coalesce(AutoEval.no_match_reason, MATCHED)
    rows = session.execute(
        _filtered(_base(outcome, func.count()), filters)
        .where(col(AutoEval.id).is_not(None))
        .group_by(outcome)
        .order_by(outcome)
    ).all()
    return pd.DataFrame.from_records(rows, columns=["outcome", "count"])


def reason_figure(counts: pd.DataFrame) -> go.Figure:
    """A bar per outcome: why interactions were (not) scored by precedent."""
    fig = go.Figure(
        go.Bar(
            x=[plotly_text(o) for o in counts["outcome"]],
            y=counts["count"],
            marker_color=[OKABE_ITO[2] if o == MATCHED else OKABE_ITO[5] for o in counts["outcome"]],
            hovertemplate="%{x}: %{y}<extra></extra>",
        )
    )
    fig.update_layout(
        title="Auto-evaluation outcomes",
        xaxis_title="outcome (no-match reason)",
        yaxis_title="interactions",
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


# ---------------------------------------------------------------------------------------------
# One interaction


@dataclass
class PrecedentDetail:
    """Everything the detail shows: the interaction, its auto-evaluation and trace, and reviews."""

    interaction: Interaction
    auto_eval: AutoEval | None
    ai_feedback: ExpertFeedback | None
    expert_feedback: ExpertFeedback | None
    sentences: list[str] = field(default_factory=list)

    @property
    def trace(self) -> dict[str, Any]:
        return dict(self.auto_eval.sentence_match_trace or {}) if self.auto_eval else {}

    @property
    def outcome(self) -> str:
        if self.auto_eval is None:
            return EXPERT if self.expert_feedback else PENDING
        return MATCHED if self.auto_eval.has_matches else (self.auto_eval.no_match_reason or "unknown")

    def qa_frame(self) -> pd.DataFrame:
        """The QA neighbours above the threshold, with similarity."""
        return pd.DataFrame(self.trace.get("qa_matches") or [], columns=["interaction_id", "similarity"])

    def sentence_frame(self) -> pd.DataFrame:
        """Each answer sentence, its best expert sentence, similarity and the copied score."""
        copied = [s.get("score") for s in (self.ai_feedback.sentence_scores if self.ai_feedback else [])]
        rows = []
        for n, item in enumerate(self.trace.get("sentences") or []):
            rows.append(
                {
                    "sentence": item.get("sentence"),
                    "best expert sentence": item.get("best_match"),
                    "similarity": item.get("similarity"),
                    "copied score": copied[n] if n < len(copied) else None,
                }
            )
        return pd.DataFrame(rows, columns=["sentence", "best expert sentence", "similarity", "copied score"])

    @property
    def has_text(self) -> bool:
        """Whether the interaction was logged with a question or an answer to compare."""
        return bool((self.interaction.question or "").strip() or (self.interaction.answer or "").strip())

    def trace_message(self) -> tuple[str, str] | None:
        """What the trace reports beyond its tables, and how: ("info", …) when the outcome follows
        from the data (an interaction logged without text has nothing to embed: an empty state, not
        a fault), ("error", …) when the evaluation itself failed (an embedding or LLM server)."""
        error = self.trace.get("error")
        if self.auto_eval is None or not error:
            return None
        if not self.has_text and self.outcome == precedents.NO_EMBEDDINGS:
            return "info", NO_TEXT_MESSAGE
        return "error", f"The evaluation failed: {error}"

    @property
    def distance(self) -> float | None:
        """|copied total − expert total| once both exist: how far the precedent copy was off."""
        if self.ai_feedback is None or self.expert_feedback is None:
            return None
        if self.ai_feedback.total_score is None or self.expert_feedback.total_score is None:
            return None
        return round(abs(self.ai_feedback.total_score - self.expert_feedback.total_score), 2)


def load_detail(*, session: Session, interaction_id: str) -> PrecedentDetail | None:
    """One interaction with its auto-evaluation, the AI copy and the newest expert review."""
    interaction = session.get(Interaction, interaction_id)
    if interaction is None:
        return None
    auto = session.execute(
        select(AutoEval).where(AutoEval.interaction_id == interaction_id)
    ).scalar_one_or_none()
    ai = session.get(ExpertFeedback, auto.expert_feedback_id) if auto and auto.expert_feedback_id else None
    expert = session.execute(
        select(ExpertFeedback)
        .where(and_(ExpertFeedback.interaction_id == interaction_id, ExpertFeedback.type == "expert"))
        .order_by(col(ExpertFeedback.created_at).desc(), col(ExpertFeedback.id).desc())
        .limit(1)
    ).scalar_one_or_none()
    return PrecedentDetail(interaction, auto, ai, expert, precedents.split_sentences(interaction.answer))


class ReviewRefused(ValueError):
    """An expert review that cannot be stored; the message names the field."""


def add_expert_review(
    *,
    session: Session,
    interaction_id: str,
    sentence_scores: Sequence[float | None],
    citation_score: float | None,
    citation_url: str | None,
    reviewer: Actor | str,
) -> ExpertFeedback:
    """Store an expert's review of an interaction, which makes it a precedent for later ones.

    The same checks as an imported `expert` object (`lib.interaction_records`): scores 0–100 or
    blank, citation score 0–25; the total follows seed 003's rule.
    """
    if not identity_of(reviewer):
        raise ReviewRefused("a reviewer name is required")
    reviewer = authorize(session, reviewer, Permission.FEEDBACK).identity
    interaction = session.get(Interaction, interaction_id)
    if interaction is None:
        raise ReviewRefused(f"no interaction with id {interaction_id!r}")
    sentences = precedents.split_sentences(interaction.answer)
    if len(sentence_scores) != len(sentences):
        raise ReviewRefused(f"{len(sentences)} sentence scores are needed, got {len(sentence_scores)}")
    raw = {
        "sentence_scores": [
            {"sentence": s, "score": v} for s, v in zip(sentences, sentence_scores, strict=True)
        ],
        "citation_score": citation_score,
        "citation_url": (citation_url or "").strip() or None,
        "reviewer": reviewer.strip(),
    }
    try:
        fields = expert_feedback_fields(raw, reviewer=reviewer.strip(), label="review")
    except InvalidField as exc:
        raise ReviewRefused(f"{exc.field_name}: {exc.message}") from None
    feedback = ExpertFeedback(interaction_id=interaction_id, created_at=utcnow(), **fields)
    session.add(feedback)
    session.flush()
    return feedback
