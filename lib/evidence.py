"""Evidence verification: the seed-002 AD-2 five-stage self-healing check of a judge's quotes.

A judge cites spans of the model answer as evidence, with character positions that are often off.
Before evidence is stored or shown, each quote is checked against the answer, from the most to the
least trustworthy method, and its positions are repaired where that can be done safely:

1. ``exact``       the claimed slice is the quote;
2. ``substring``   the quote occurs verbatim elsewhere (the occurrence nearest the claimed start);
3. ``anchor``      quotes of 50+ characters: its first and last 25 characters occur close together;
4. ``whitespace``  the quote occurs once runs of whitespace are collapsed: verified, but positions
                   in the normalized text cannot be mapped back safely, so the highlight is off;
5. ``unverified``  none of the above.

Indices are Python ``str`` positions (code points). Pure module: no I/O, no database.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ANCHOR_LEN = 25
ANCHOR_WINDOW_TOLERANCE = 2000

STAGES: tuple[str, ...] = ("exact", "substring", "anchor", "whitespace", "unverified")
HIGHLIGHT_STAGES: frozenset[str] = frozenset({"exact", "substring", "anchor"})

STAGE_LABELS: dict[str, str] = {
    "exact": "Verified at the cited position, highlighted",
    "substring": "Verified, position corrected, highlighted",
    "anchor": "Verified by its opening and closing words, highlighted",
    "whitespace": "Position could not be located, highlight off",
    "unverified": "Evidence could not be verified",
}

_INT_TEXT = re.compile(r"\s*[+-]?\d+\s*")


@dataclass(frozen=True)
class EvidenceResult:
    """The outcome of verifying one quote: whether it holds, where it is, and how it was found."""

    verified: bool
    highlight_available: bool
    start: int | None
    end: int | None
    stage: str


def _as_text(value: object) -> str:
    """Untrusted inputs may be None or other JSON values; they count as no text at all."""
    return value if isinstance(value, str) else ""


def _as_index(value: object) -> int | None:
    """A real int index, or None: bools and other types are not positions."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace (any Unicode kind, CRLF, tabs) to one space and strip the ends."""
    return " ".join(text.split())


def _nearest_occurrence(answer: str, quote: str, claimed_start: int | None) -> int:
    """Index of the occurrence of quote nearest claimed_start (earliest on ties or with no claim), or -1."""
    best = answer.find(quote)
    if best < 0 or claimed_start is None:
        return best
    idx = best
    while idx >= 0:
        if abs(idx - claimed_start) < abs(best - claimed_start):
            best = idx
        # Occurrences come in increasing order, so past the claim every later one is farther away.
        if idx >= claimed_start:
            break
        idx = answer.find(quote, idx + 1)
    return best


def _anchor_span(answer: str, quote: str) -> tuple[int, int] | None:
    """Span from the first head anchor whose window holds the tail anchor, or None."""
    if len(quote) < 2 * ANCHOR_LEN:
        return None
    head = quote[:ANCHOR_LEN]
    tail = quote[-ANCHOR_LEN:]
    window = len(quote) + ANCHOR_WINDOW_TOLERANCE
    head_idx = answer.find(head)
    tail_idx = -1
    while head_idx >= 0:
        # The first tail at or after the head only moves forward as heads do, so it is searched once
        # per move rather than once per head: repetitive answers would otherwise take quadratic time.
        if tail_idx < head_idx:
            tail_idx = answer.find(tail, head_idx)
            if tail_idx < 0:
                return None
        # The window keeps a tail far away in a long answer from pairing with this head.
        if tail_idx + ANCHOR_LEN <= min(head_idx + window, len(answer)):
            return head_idx, tail_idx + ANCHOR_LEN
        head_idx = answer.find(head, head_idx + 1)
    return None


class _Answer:
    """A model answer and, computed on first need, its whitespace-collapsed form.

    Collapsing is linear in the answer (about 1.8 ms at 200k characters) and only the whitespace
    stage needs it: every quote of one answer shares one collapse instead of redoing it.
    """

    __slots__ = ("_collapsed", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._collapsed: str | None = None

    def collapsed(self) -> str:
        if self._collapsed is None:
            self._collapsed = normalize_whitespace(self.text)
        return self._collapsed


def verify_evidence(
    model_answer: str, quote: str, start: int | None = None, end: int | None = None
) -> EvidenceResult:
    """Check a judge's quote against the answer and repair its positions where that is safe."""
    return _verify(_Answer(_as_text(model_answer)), quote, start, end)


def _verify(answer_text: _Answer, quote: str, start: int | None, end: int | None) -> EvidenceResult:
    answer = answer_text.text
    text = _as_text(quote)
    claimed_start = _as_index(start)
    claimed_end = _as_index(end)

    def unverified() -> EvidenceResult:
        return EvidenceResult(False, False, claimed_start, claimed_end, "unverified")

    if not text.strip():
        return unverified()

    if (
        claimed_start is not None
        and claimed_end is not None
        and 0 <= claimed_start < claimed_end <= len(answer)
        and answer[claimed_start:claimed_end] == text
    ):
        return EvidenceResult(True, True, claimed_start, claimed_end, "exact")

    idx = _nearest_occurrence(answer, text, claimed_start)
    if idx >= 0:
        return EvidenceResult(True, True, idx, idx + len(text), "substring")

    span = _anchor_span(answer, text)
    if span is not None:
        return EvidenceResult(True, True, span[0], span[1], "anchor")

    if normalize_whitespace(text) in answer_text.collapsed():
        # Safe mode: positions in the collapsed text do not map back reliably, so keep the claim.
        return EvidenceResult(True, False, claimed_start, claimed_end, "whitespace")

    return unverified()


def _parse_index(value: object) -> int | None:
    """Judges and files send positions as ints, integral floats or digit strings; anything else is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):
        return int(value)
    return None


def verify_evidence_item(model_answer: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of one evidence item with its verification fields computed from the answer."""
    return _verify_item(_Answer(_as_text(model_answer)), item)


def verify_evidence_items(model_answer: str, items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`verify_evidence_item` for several quotes of one answer, which is prepared once for all."""
    answer = _Answer(_as_text(model_answer))
    return [_verify_item(answer, item) for item in items]


def _verify_item(answer: _Answer, item: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        item = {}
    quote = _as_text(item.get("quote"))
    result = _verify(answer, quote, _parse_index(item.get("start")), _parse_index(item.get("end")))
    return {
        **item,
        "quote": quote,
        "start": result.start,
        "end": result.end,
        "verified": result.verified,
        "highlight_available": result.highlight_available,
        "stage": result.stage,
    }


# ---------------------------------------------------------------------------------------------
# Reading stored evidence: the one reader of "either shape" for every caller


def items_of(value: object) -> list[Any] | None:
    """One metric's evidence in either shape — a list of items, or the seed's `{"evidence": [...]}` —
    as its list of items: [] when absent, None when it is neither (the caller decides what that means).
    """
    if isinstance(value, Mapping):
        value = value.get("evidence")
    if value is None:
        return []
    return value if isinstance(value, list) else None


def metric_entry(evidence_json: object, metric: str) -> dict[str, Any]:
    """A metric's entry of a stored evidence_json in the seed-002 shape, from either stored shape.

    The entry keeps its other keys (scores, reasons); "evidence" holds the well-formed items only.
    A missing metric, a null evidence_json (AD-8 "no evidence") or a malformed entry give no items.
    """
    entry = evidence_json.get(metric) if isinstance(evidence_json, Mapping) else None
    items = items_of(entry) or []
    base = dict(entry) if isinstance(entry, Mapping) else {}
    return {**base, "evidence": [dict(item) for item in items if isinstance(item, Mapping)]}


def _metric_evidence(evidence_json: object) -> list[tuple[object, dict[str, Any], list[dict[str, Any]]]]:
    """(slug, metric entry, well-formed items) per metric of an evidence_json in either shape."""
    if not isinstance(evidence_json, Mapping):
        return []
    out = []
    for slug, value in evidence_json.items():
        if not isinstance(value, Mapping | list):
            continue
        entry = metric_entry(evidence_json, slug)
        out.append((slug, entry, entry["evidence"]))
    return out


@dataclass(frozen=True)
class EvidenceItem:
    """One evidence quote ready to show: where verification placed it and how (seed 002 AD-2 stage)."""

    metric: str
    quote: str
    why: str
    better: str
    start: int | None
    end: int | None
    stage: str

    @property
    def highlighted(self) -> bool:
        return self.stage in HIGHLIGHT_STAGES

    @property
    def label(self) -> str:
        return STAGE_LABELS[self.stage]


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def evidence_item(model_answer: str, metric: str, raw: Mapping[str, Any]) -> EvidenceItem:
    """A stored item as shown; re-verified when its stage is missing or its highlight positions are unusable."""
    return _evidence_item(_Answer(model_answer), metric, raw)


def _evidence_item(answer: _Answer, metric: str, raw: Mapping[str, Any]) -> EvidenceItem:
    model_answer = answer.text
    stage = raw.get("stage")
    start, end = raw.get("start"), raw.get("end")
    usable = stage in STAGES and (
        stage not in HIGHLIGHT_STAGES
        or (_is_index(start) and _is_index(end) and 0 <= start < end <= len(model_answer))
    )
    if not usable:
        checked = _verify_item(answer, raw)
        stage, start, end = checked["stage"], checked["start"], checked["end"]
    return EvidenceItem(
        metric=metric,
        quote=_text(raw.get("quote")),
        why=_text(raw.get("why")),
        better=_text(raw.get("better")),
        start=start if _is_index(start) else None,
        end=end if _is_index(end) else None,
        stage=str(stage),
    )


def evidence_items(model_answer: str, evidence_json: object, metric: str) -> tuple[EvidenceItem, ...]:
    """The verified evidence items of one metric of a stored evaluation, in either stored shape."""
    answer = _Answer(model_answer)
    return tuple(
        _evidence_item(answer, metric, raw) for raw in metric_entry(evidence_json, metric)["evidence"]
    )


def verify_evidence_map(model_answer: str, evidence_json: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a seed-002 evidence_json with every item verified and malformed parts dropped."""
    answer = _Answer(_as_text(model_answer))
    return {
        slug: {**metric, "evidence": [_verify_item(answer, item) for item in items]}
        for slug, metric, items in _metric_evidence(evidence_json)
    }


def stage_counts(evidence_json: Mapping[str, Any]) -> dict[str, int]:
    """How many items of an evidence_json ended in each stage, every stage present, for the overview."""
    counts = dict.fromkeys(STAGES, 0)
    for _slug, _metric, items in _metric_evidence(evidence_json):
        for item in items:
            stage = item.get("stage")
            # An item without a known stage never went through verification, so nothing vouches for it.
            counts[stage if isinstance(stage, str) and stage in counts else "unverified"] += 1
    return counts
