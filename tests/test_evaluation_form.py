"""Tests for lib.evaluation_form's pickers (the New evaluation page)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import Session

from lib import evaluation_form, inspector
from lib.models import EvaluationSnapshot, MetricDefinition


def snapshot(snapshot_id: str, product: str) -> EvaluationSnapshot:
    return EvaluationSnapshot(
        id=snapshot_id,
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
        question="Q?",
        model_answer="A.",
        product=product,
        user_scores_json={"clarity": 4},
        judge_scores_json={"clarity": 3},
    )


def test_known_products_are_rubric_products_and_those_with_live_evaluations(session: Session) -> None:
    session.add(MetricDefinition(product="Rubric only", slug="clarity", display_name="Clarity"))
    session.add_all([snapshot("s1", "Live"), snapshot("s2", "Archived")])
    session.commit()
    inspector.archive_evaluation(session=session, snapshot_id="s2", reviewer="rita")
    session.commit()
    assert evaluation_form.known_products(session=session) == ["Live", "Rubric only"]


def test_known_languages_are_stored_ones_plus_english_and_turkish(session: Session) -> None:
    assert evaluation_form.known_languages(session=session) == ["en", "tr"]
    rows = [snapshot(f"s{i}", "P") for i in range(4)]
    for row, language in zip(rows, ["de", "ar", "de", "tr"], strict=True):
        row.language = language
    session.add_all(rows)
    session.commit()
    inspector.archive_evaluation(session=session, snapshot_id="s1", reviewer="rita")  # "ar": archived only
    session.commit()
    assert evaluation_form.known_languages(session=session) == ["ar", "de", "en", "tr"]
