"""The seed-000 evaluation layer: parsing messy answers and applying the confidence rules."""

from __future__ import annotations

import pytest

from lib.evaluation_layer import (
    EvaluationVerdict,
    apply_evaluation,
    parse_evaluation_response,
    should_evaluate,
)

CLEAN = """VALID: YES
CONFIDENCE_APPROPRIATE: NO
IMPROVED_CODE: NONE
IMPROVED_CONFIDENCE: 0
IMPROVED_REASONING: none needed
EVALUATION: The quote supports the score."""


def test_parses_a_clean_response() -> None:
    v = parse_evaluation_response(CLEAN)
    assert v.valid is True
    assert v.confidence_appropriate is False
    assert v.improved_code is None
    assert v.evaluation == "The quote supports the score."


@pytest.mark.parametrize(
    "text",
    [
        "**VALID:** YES",
        "**VALID**: yes",
        "valid: Yes - the match is right",
        "- VALID: TRUE",
        "```\nVALID: YES\n```",
        "```text\nVALID: YES\nEVALUATION: fine\n```",
        "> __VALID__: yes",
        "Here is my review.\n\nVALID: YES",
    ],
)
def test_valid_yes_is_found_through_decoration(text: str) -> None:
    assert parse_evaluation_response(text).valid is True


@pytest.mark.parametrize("text", ["VALID: NO", "**Valid:** no, wrong metric", "VALID: false", "VALID = NO"])
def test_valid_no_variants(text: str) -> None:
    assert parse_evaluation_response(text).valid is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [("85", 0.85), ("85%", 0.85), ("0.85", 0.85), ("**90**", 0.9), ("0,7", 0.7), ("100", 1.0), ("1", 1.0)],
)
def test_improved_confidence_above_one_is_a_percentage(value: str, expected: float) -> None:
    v = parse_evaluation_response(f"IMPROVED_CODE: 3\nIMPROVED_CONFIDENCE: {value}")
    assert v.improved_confidence == pytest.approx(expected)


@pytest.mark.parametrize("code", ["NONE", "none", "", "**NONE**", "N/A"])
def test_improved_code_none_or_empty_means_no_improvement(code: str) -> None:
    v = parse_evaluation_response(f"VALID: NO\nIMPROVED_CODE: {code}\nIMPROVED_CONFIDENCE: 95")
    assert v.improved_code is None
    assert not v.has_improvement


def test_multiline_evaluation_is_kept_until_the_next_key() -> None:
    v = parse_evaluation_response("EVALUATION: first line\nsecond line\nVALID: YES")
    assert v.evaluation == "first line\nsecond line"
    assert v.valid is True


def test_garbage_yields_an_empty_verdict() -> None:
    assert parse_evaluation_response("I cannot help with that.") == EvaluationVerdict()
    assert parse_evaluation_response("") == EvaluationVerdict()


# Seed 000 "Evaluation Logic", row by row.
@pytest.mark.parametrize(
    ("verdict", "code", "confidence", "expected"),
    [
        (
            EvaluationVerdict(valid=False, improved_code="B", improved_confidence=0.9),
            "A",
            0.6,
            ("B", 0.9, "improved"),
        ),
        (
            EvaluationVerdict(valid=True, improved_code="B", improved_confidence=0.6),
            "A",
            0.6,
            ("A", 0.7, "validated"),
        ),
        (
            EvaluationVerdict(valid=False, improved_code="B", improved_confidence=0.5),
            "A",
            0.6,
            ("A", 0.42, "questioned"),
        ),
        (EvaluationVerdict(valid=True), "A", 0.8, ("A", 0.9, "validated")),
        (EvaluationVerdict(valid=True), "A", 0.95, ("A", 1.0, "validated")),
        (EvaluationVerdict(valid=False), "A", 0.5, ("A", 0.35, "questioned")),
        (EvaluationVerdict(), "A", 0.5, ("A", 0.5, "unchanged")),
        (EvaluationVerdict(improved_code="B", improved_confidence=None), "A", 0.5, ("A", 0.5, "unchanged")),
    ],
)
def test_apply_evaluation_follows_the_seed_rules(verdict, code, confidence, expected) -> None:
    new_code, new_conf, action = apply_evaluation(code, confidence, verdict)
    assert (new_code, action) == (expected[0], expected[2])
    assert new_conf == pytest.approx(expected[1])


def test_validated_boost_is_exact_not_float_noise() -> None:
    assert apply_evaluation("A", 0.8, EvaluationVerdict(valid=True))[1] == 0.9


@pytest.mark.parametrize(
    ("text_len", "code", "confidence", "expected"),
    [
        (101, "4", 0.30, True),
        (100, "4", 0.9, False),
        (101, "UNKNOWN", 0.9, False),
        (101, "unknown", 0.9, False),
        (101, "4", 0.29, False),
        (101, "", 0.9, False),
        (101, "4", None, False),
    ],
)
def test_should_evaluate_thresholds(text_len: int, code: str, confidence, expected: bool) -> None:
    assert should_evaluate("x" * text_len, code, confidence) is expected
