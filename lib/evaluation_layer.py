"""The second-opinion evaluation layer (seed 000): a second LLM validates the judge's decision.

The parsing is deliberately forgiving because evaluation models decorate their answers (bold
markers, bullets, code fences, "85%" instead of 0.85); the rules that change a judgment are the
seed's, in the order its original implementation applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEYS = (
    "VALID",
    "CONFIDENCE_APPROPRIATE",
    "IMPROVED_CODE",
    "IMPROVED_CONFIDENCE",
    "IMPROVED_REASONING",
    "EVALUATION",
)
MIN_TEXT_LENGTH = 100
MIN_CONFIDENCE = 0.30
VALIDATED_BOOST = 0.10
QUESTIONED_FACTOR = 0.7

# A key at the start of a line, optionally behind bullets, quotes, headings or bold/italic markers.
_KEY_RE = re.compile(
    r"^[ \t>*_`#-]*(?:\*\*|__)?\s*(" + "|".join(KEYS) + r")\s*(?:\*\*|__)?\s*[:=]\s*(?:\*\*|__)?",
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER_RE = re.compile(r"[-+]?\d+(?:[.,]\d+)?")
_YES = {"YES", "Y", "TRUE", "VALID", "CORRECT", "EVET"}
_NO = {"NO", "N", "FALSE", "INVALID", "INCORRECT", "HAYIR"}


@dataclass(frozen=True)
class EvaluationVerdict:
    """What the evaluation model said; None where it said nothing usable."""

    valid: bool | None = None
    confidence_appropriate: bool | None = None
    improved_code: str | None = None
    improved_confidence: float | None = None
    improved_reasoning: str | None = None
    evaluation: str = ""

    @property
    def has_improvement(self) -> bool:
        return self.improved_code is not None


def _clean(value: str) -> str:
    value = value.strip()
    value = re.sub(r"^```[\w-]*\s*|\s*```$", "", value)
    value = value.strip().strip("*_`").strip()
    return value


# The format line itself ("VALID: YES or NO (is the judge's decision correct?)") echoed back: no answer.
_ECHO_RE = re.compile(r"\b(YES|NO)\s*(?:or|/|\|)\s*(YES|NO)\b", re.IGNORECASE)


def _parse_bool(value: str) -> bool | None:
    if _ECHO_RE.search(value.splitlines()[0] if value.strip() else value):
        return None
    word = re.split(r"[\s,.;:!()\-—]+", _clean(value).upper(), maxsplit=1)[0] if value.strip() else ""
    if word in _YES:
        return True
    if word in _NO:
        return False
    return None


def _parse_confidence(value: str) -> float | None:
    match = _NUMBER_RE.search(_clean(value))
    if not match:
        return None
    number = float(match.group(0).replace(",", "."))
    if number > 1:
        number /= 100.0
    return max(0.0, min(1.0, number))


def _key_values(text: str) -> dict[str, str]:
    matches = list(_KEY_RE.finditer(text))
    values: dict[str, str] = {}
    for i, match in enumerate(matches):
        key = match.group(1).upper()
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        if key not in values:  # the first statement of a key wins over later repetitions
            values[key] = text[match.end() : end]
    return values


def _echoes(value: str, template_value: str) -> bool:
    """Whether a value is the format line's own text copied back (a small model's template echo)."""
    said, asked = _clean(value).lower(), _clean(template_value).lower()
    return bool(asked) and said[:24] == asked[:24]


def parse_evaluation_response(text: str, template: str | None = None) -> EvaluationVerdict:
    """Parse the evaluation model's KEY: value answer (seed 000), tolerant of markdown decoration.

    With the `template` the prompt showed, a value that copies the template's text for its key
    ("VALID: YES or NO (…)") counts as not given, as does any "YES or NO" answer.
    """
    text = (text or "").replace("\r\n", "\n")
    values = _key_values(text)
    if template:
        asked = _key_values(template)
        values = {k: v for k, v in values.items() if not (k in asked and _echoes(v, asked[k]))}
    code = _clean(values.get("IMPROVED_CODE", "")).splitlines()
    improved_code = code[0].strip().strip("*_`\"'").strip() if code else ""
    if improved_code.upper() in {"", "NONE", "N/A", "NULL", "-"}:
        improved_code = ""
    reasoning = _clean(values.get("IMPROVED_REASONING", ""))
    return EvaluationVerdict(
        valid=_parse_bool(values["VALID"]) if "VALID" in values else None,
        confidence_appropriate=(
            _parse_bool(values["CONFIDENCE_APPROPRIATE"]) if "CONFIDENCE_APPROPRIATE" in values else None
        ),
        improved_code=improved_code or None,
        improved_confidence=(
            _parse_confidence(values["IMPROVED_CONFIDENCE"]) if "IMPROVED_CONFIDENCE" in values else None
        ),
        improved_reasoning=reasoning or None,
        evaluation=_clean(values.get("EVALUATION", "")),
    )


def apply_evaluation(code: str, confidence: float, verdict: EvaluationVerdict) -> tuple[str, float, str]:
    """Seed-000 rules: a better-scored improvement wins; else VALID YES +0.10 (≤ 1); NO ×0.7; else unchanged.

    Returns (code, confidence, action) with action in improved / validated / questioned / unchanged.
    """
    if (
        verdict.improved_code is not None
        and verdict.improved_confidence is not None
        and verdict.improved_confidence > confidence
    ):
        return verdict.improved_code, round(verdict.improved_confidence, 10), "improved"
    if verdict.valid is True:
        return code, round(min(1.0, confidence + VALIDATED_BOOST), 10), "validated"
    if verdict.valid is False:
        return code, round(confidence * QUESTIONED_FACTOR, 10), "questioned"
    return code, confidence, "unchanged"


def should_evaluate(
    text: str,
    code: str | None,
    confidence: float | None,
    *,
    min_length: int = MIN_TEXT_LENGTH,
    min_confidence: float = MIN_CONFIDENCE,
) -> bool:
    """Seed-000 threshold: text over 100 characters, a code other than UNKNOWN, confidence ≥ 0.30."""
    if confidence is None or not code or code.strip().upper() == "UNKNOWN":
        return False
    return len(text or "") > min_length and confidence >= min_confidence
