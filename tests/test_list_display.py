"""The Evaluations list as reviewers read it: review and evidence state in words, links, titles."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lib import inspector


@pytest.mark.parametrize(
    ("judged", "reviewed", "corrected", "expected"),
    [
        (0, 0, 0, None),  # no judgments: nothing to say (shown as "—")
        (8, 5, 1, "3 of 8 pending"),
        (8, 8, 0, "all confirmed"),
        (8, 8, 2, "2 corrected"),
    ],
)
def test_review_summary(judged, reviewed, corrected, expected) -> None:
    assert inspector.review_summary(judged=judged, reviewed=reviewed, corrected=corrected) == expected


@pytest.mark.parametrize(
    ("evidence", "unverified", "unlocated", "expected"),
    [
        (0, 0, 0, None),
        (4, 0, 0, "4 verified"),
        (4, 1, 0, "4 (1 unverified)"),
        (4, 1, 2, "4 (1 unverified, 2 unlocated)"),
    ],
)
def test_evidence_summary(evidence, unverified, unlocated, expected) -> None:
    assert (
        inspector.evidence_summary(evidence=evidence, unverified=unverified, unlocated=unlocated) == expected
    )


def test_display_frame_puts_the_link_title_gaps_and_review_first() -> None:
    row = inspector.EvaluationRow(
        id="snap 1", created_at=datetime(2026, 1, 2, tzinfo=UTC), product="acme", language="tr", model=None,
        category=None, question="İstanbul nerede?\nUzun açıklama", weighted_gap=None, max_gap=2.5,
        judge_meta_score=3, evidence=0, highlighted=0, unlocated=0, unverified=0, status="active",
        judged=4, reviewed=4, corrected=0,
    )  # fmt: skip
    frame = inspector.list_display_frame([row])
    assert list(frame.columns) == inspector.LIST_DISPLAY_COLUMNS
    assert list(frame.columns)[:6] == ["open", "title", "max_gap", "weighted_gap", "review", "reviewed_share"]
    first = frame.iloc[0]
    assert (first["open"], first["title"]) == ("evaluations?snapshot=snap+1", "İstanbul nerede?")
    assert (first["review"], first["reviewed_share"]) == ("all confirmed", 1.0)
    # Missing values stay missing (the table draws "—"), never the text "None".
    assert first[["weighted_gap", "model", "category", "evidence"]].isna().all()
