"""Tests for lib.evidence: the seed-002 AD-2 five-stage verification with SPEC §5's precisions."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.evidence import (
    ANCHOR_LEN,
    STAGE_LABELS,
    STAGES,
    EvidenceItem,
    EvidenceResult,
    evidence_items,
    items_of,
    metric_entry,
    normalize_whitespace,
    stage_counts,
    verify_evidence,
    verify_evidence_item,
    verify_evidence_map,
)

ANSWER = "Einstein received the Nobel Prize in Physics in 1921 for the photoelectric effect."
QUOTE = "Nobel Prize in Physics"
QUOTE_AT = ANSWER.index(QUOTE)

# 25-character anchors that occur nowhere else in the texts built from them.
HEAD = "The judge quoted this hea"
TAIL = "and this is how it ended."
assert len(HEAD) == len(TAIL) == ANCHOR_LEN
MIDDLE = " -- a middle the model paraphrased -- "
LONG_QUOTE = HEAD + MIDDLE + TAIL
WINDOW = len(LONG_QUOTE) + 2000


def anchored_answer(gap: int, prefix: str = "") -> str:
    """An answer holding HEAD, then `gap` filler characters, then TAIL: the quote's middle differs."""
    return prefix + HEAD + "." * gap + TAIL


# --- the result object -------------------------------------------------------------------------


def test_result_is_frozen() -> None:
    result = verify_evidence(ANSWER, QUOTE, QUOTE_AT, QUOTE_AT + len(QUOTE))
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.verified = False  # type: ignore[misc]


def test_result_fields_are_the_spec_names() -> None:
    names = [field.name for field in dataclasses.fields(EvidenceResult)]
    assert names == ["verified", "highlight_available", "start", "end", "stage"]


# --- stage 1: exact ----------------------------------------------------------------------------


def test_exact_slice_is_verified_with_indices_kept() -> None:
    result = verify_evidence(ANSWER, QUOTE, QUOTE_AT, QUOTE_AT + len(QUOTE))
    assert result == EvidenceResult(True, True, QUOTE_AT, QUOTE_AT + len(QUOTE), "exact")


@pytest.mark.parametrize(
    ("answer", "quote"),
    [
        ("abc", "abc"),  # the whole answer: end == len(answer) is valid
        ("abc", "a"),  # one character at position 0
        ("abc", "c"),  # the last character
    ],
)
def test_exact_accepts_boundary_indices(answer: str, quote: str) -> None:
    start = answer.index(quote)
    result = verify_evidence(answer, quote, start, start + len(quote))
    assert (result.stage, result.start, result.end) == ("exact", start, start + len(quote))


def test_exact_wins_over_an_earlier_occurrence() -> None:
    answer = "same words here, then same words here again"
    second = answer.rindex("same words")
    result = verify_evidence(answer, "same words", second, second + len("same words"))
    assert (result.stage, result.start) == ("exact", second)


# --- bad indices fail stage 1 and never raise --------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end"),
    [
        pytest.param(-len(ANSWER) + QUOTE_AT, -len(ANSWER) + QUOTE_AT + len(QUOTE), id="negative-both"),
        pytest.param(-len(ANSWER) + QUOTE_AT, QUOTE_AT + len(QUOTE), id="negative-start"),
        pytest.param(QUOTE_AT, -(len(ANSWER) - QUOTE_AT - len(QUOTE)), id="negative-end"),
        pytest.param(QUOTE_AT + len(QUOTE), QUOTE_AT, id="reversed"),
        pytest.param(QUOTE_AT, QUOTE_AT, id="empty-span"),
        pytest.param(0, 0, id="zero-zero"),
        pytest.param(QUOTE_AT, len(ANSWER) + 50, id="end-beyond-length"),
        pytest.param(len(ANSWER) + 10, len(ANSWER) + 40, id="both-beyond-length"),
        pytest.param(None, None, id="none"),
        pytest.param(QUOTE_AT, None, id="end-none"),
        pytest.param(None, QUOTE_AT + len(QUOTE), id="start-none"),
        pytest.param(str(QUOTE_AT), str(QUOTE_AT + len(QUOTE)), id="strings"),
        pytest.param(float(QUOTE_AT), float(QUOTE_AT + len(QUOTE)), id="floats"),
        pytest.param([QUOTE_AT], {"end": 1}, id="containers"),
    ],
)
def test_bad_indices_fall_through_to_substring(start: object, end: object) -> None:
    result = verify_evidence(ANSWER, QUOTE, start, end)  # type: ignore[arg-type]
    assert (result.stage, result.start, result.end) == ("substring", QUOTE_AT, QUOTE_AT + len(QUOTE))


def test_negative_indices_that_python_would_slice_correctly_are_not_exact() -> None:
    start, end = -len(ANSWER) + QUOTE_AT, -len(ANSWER) + QUOTE_AT + len(QUOTE)
    assert ANSWER[start:end] == QUOTE
    assert verify_evidence(ANSWER, QUOTE, start, end).stage == "substring"


def test_end_past_the_answer_that_python_would_clamp_is_not_exact() -> None:
    answer = "short answer"
    assert answer[0:999] == answer
    result = verify_evidence(answer, answer, 0, 999)
    assert (result.stage, result.start, result.end) == ("substring", 0, len(answer))


def test_bool_indices_are_not_positions() -> None:
    assert "x"[False:True] == "x"
    result = verify_evidence("xyz", "x", False, True)
    assert result.stage == "substring"


@pytest.mark.parametrize(
    ("start", "end", "kept"),
    [
        (-5, 3, (-5, 3)),
        (900, 1000, (900, 1000)),
        (7, 2, (7, 2)),
        (None, None, (None, None)),
        ("3", "9", (None, None)),
        (True, 4, (None, 4)),
    ],
)
def test_unverified_keeps_int_indices_as_given(start: object, end: object, kept: tuple) -> None:
    result = verify_evidence(ANSWER, "a sentence the answer never contains", start, end)  # type: ignore[arg-type]
    assert (result.stage, result.verified, result.highlight_available) == ("unverified", False, False)
    assert (result.start, result.end) == kept


# --- stage 2: substring ------------------------------------------------------------------------


def test_substring_repairs_shifted_indices() -> None:
    result = verify_evidence(ANSWER, QUOTE, QUOTE_AT + 3, QUOTE_AT + 3 + len(QUOTE))
    assert result == EvidenceResult(True, True, QUOTE_AT, QUOTE_AT + len(QUOTE), "substring")


# "abc" occurs at 0, 7 and 14.
REPEATED = "abc xx abc yy abc"


@pytest.mark.parametrize(
    ("claimed_start", "expected"),
    [
        pytest.param(None, 0, id="none-earliest"),
        pytest.param(1, 0, id="near-first"),
        pytest.param(6, 7, id="near-second-from-left"),
        pytest.param(9, 7, id="near-second-from-right"),
        pytest.param(11, 14, id="nearer-third"),
        pytest.param(13, 14, id="just-before-third"),
        pytest.param(500, 14, id="far-beyond-picks-last"),
        pytest.param(-40, 0, id="negative-picks-first"),
        pytest.param("7", 0, id="string-start-counts-as-none"),
    ],
)
def test_substring_picks_occurrence_nearest_claimed_start(claimed_start: object, expected: int) -> None:
    result = verify_evidence(REPEATED, "abc", claimed_start, None)  # type: ignore[arg-type]
    assert (result.stage, result.start, result.end) == ("substring", expected, expected + 3)


@pytest.mark.parametrize(
    ("answer", "claimed_start", "expected"),
    [
        pytest.param("ab----ab", 3, 0, id="tie-0-and-6"),
        pytest.param("xx ab----ab----ab", 6, 3, id="tie-3-and-9"),
        pytest.param("xx ab----ab----ab", 12, 9, id="tie-9-and-15"),
    ],
)
def test_substring_tie_goes_to_earliest(answer: str, claimed_start: int, expected: int) -> None:
    result = verify_evidence(answer, "ab", claimed_start, None)
    assert (result.stage, result.start) == ("substring", expected)


def test_substring_considers_overlapping_occurrences() -> None:
    # Non-overlapping occurrences of "aa" in "aaaa" are 0 and 2; the overlapping one at 1 is nearest.
    result = verify_evidence("aaaa", "aa", 1, 99)
    assert (result.stage, result.start, result.end) == ("substring", 1, 3)


# --- stage 3: anchor ---------------------------------------------------------------------------


def test_anchor_heals_a_paraphrased_middle() -> None:
    answer = anchored_answer(40, prefix="Intro text. ")
    result = verify_evidence(answer, LONG_QUOTE, 0, 5)
    head_at = answer.index(HEAD)
    tail_end = answer.index(TAIL) + ANCHOR_LEN
    assert result == EvidenceResult(True, True, head_at, tail_end, "anchor")


def test_anchor_tail_ending_exactly_at_window_edge_is_inside() -> None:
    gap = WINDOW - 2 * ANCHOR_LEN  # tail ends at head + WINDOW, the window's last position
    answer = anchored_answer(gap) + " trailing text so the window is not capped"
    result = verify_evidence(answer, LONG_QUOTE)
    assert (result.stage, result.start, result.end) == ("anchor", 0, WINDOW)


def test_anchor_tail_one_character_past_window_is_outside() -> None:
    answer = anchored_answer(WINDOW - 2 * ANCHOR_LEN + 1) + " trailing text"
    assert verify_evidence(answer, LONG_QUOTE).stage == "unverified"


def test_anchor_window_is_measured_from_the_head_not_the_answer_start() -> None:
    prefix = "p" * 3000
    answer = anchored_answer(WINDOW - 2 * ANCHOR_LEN, prefix=prefix)
    result = verify_evidence(answer, LONG_QUOTE)
    assert (result.stage, result.start, result.end) == ("anchor", len(prefix), len(prefix) + WINDOW)


def test_anchor_window_capped_at_answer_length_still_finds_final_tail() -> None:
    answer = anchored_answer(10)  # tail is the answer's last 25 characters
    result = verify_evidence(answer, LONG_QUOTE)
    assert (result.stage, result.end) == ("anchor", len(answer))


def test_anchor_uses_first_head_whose_window_holds_the_tail() -> None:
    lonely_head = HEAD + "x" * (WINDOW + 10)  # no tail within this head's window
    answer = lonely_head + anchored_answer(30)
    result = verify_evidence(answer, LONG_QUOTE)
    assert (result.stage, result.start) == ("anchor", len(lonely_head))
    assert result.end == len(answer)


def test_anchor_ignores_a_tail_that_lies_between_two_heads() -> None:
    # The first head's tail is beyond its window; that tail precedes the second head, so it cannot
    # pair with it either: the second head pairs with the tail after it.
    first = HEAD + "x" * WINDOW + TAIL + "y" * 100
    answer = first + anchored_answer(7)
    result = verify_evidence(answer, LONG_QUOTE)
    assert (result.stage, result.start, result.end) == ("anchor", len(first), len(answer))


def test_anchor_prefers_first_head_when_several_heads_hold_the_tail() -> None:
    answer = anchored_answer(5) + " then " + anchored_answer(5)
    result = verify_evidence(answer, LONG_QUOTE)
    assert (result.stage, result.start, result.end) == ("anchor", 0, 2 * ANCHOR_LEN + 5)


def test_anchor_tail_before_head_does_not_count() -> None:
    answer = TAIL + " in between " + HEAD
    assert verify_evidence(answer, LONG_QUOTE).stage == "unverified"


def test_anchor_tail_is_searched_from_the_head_index_so_it_may_overlap_the_head() -> None:
    quote = "ab" * 25  # head "abab…a", tail "baba…b": in "abab…" the tail starts one after the head
    answer = "ab" * 13 + "!"
    result = verify_evidence(answer, quote)
    assert (result.stage, result.start, result.end) == ("anchor", 0, 1 + ANCHOR_LEN)


def test_anchor_on_repetitive_answer_finds_the_first_head_with_a_tail_in_window() -> None:
    quote = "a" * 30 + "c" + "a" * 30 + "b"
    answer = "a" * 5000 + "b"  # every position is a head; only the last heads' windows reach the tail
    result = verify_evidence(answer, quote)
    assert (result.stage, result.start, result.end) == ("anchor", 5001 - len(quote) - 2000, 5001)


def test_anchor_needs_both_anchors() -> None:
    assert verify_evidence(HEAD + " and nothing else matches here", LONG_QUOTE).stage == "unverified"


LETTERS_49 = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW"
LETTERS_50 = LETTERS_49 + "X"


@pytest.mark.parametrize(
    ("quote", "stage"),
    [
        pytest.param(LETTERS_49, "unverified", id="49-too-short-for-anchors"),
        pytest.param(LETTERS_50, "anchor", id="50-long-enough"),
    ],
)
def test_anchor_applies_only_from_fifty_characters(quote: str, stage: str) -> None:
    # Both anchors occur in the answer with a gap the quote does not have, so only the length gates it.
    head, tail = quote[:ANCHOR_LEN], quote[-ANCHOR_LEN:]
    answer = head + "~~~" + tail
    assert quote not in answer
    assert verify_evidence(answer, quote).stage == stage


def test_anchor_span_on_a_fifty_character_quote() -> None:
    answer = "> " + LETTERS_50[:ANCHOR_LEN] + "~~~" + LETTERS_50[ANCHOR_LEN:]
    result = verify_evidence(answer, LETTERS_50)
    assert (result.start, result.end) == (2, len(answer))


def test_substring_beats_anchor_when_quote_is_verbatim() -> None:
    answer = anchored_answer(20) + " later the exact quote: " + LONG_QUOTE
    result = verify_evidence(answer, LONG_QUOTE)
    assert (result.stage, result.start) == ("substring", answer.index(LONG_QUOTE))


# --- stage 4: whitespace (safe mode) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "quote"),
    [
        pytest.param("line one\r\nline two", "line one line two", id="crlf-in-answer"),
        pytest.param("line one line two", "line one\r\nline two", id="crlf-in-quote"),
        pytest.param("col a\tcol b", "col a col b", id="tab"),
        pytest.param("many    spaces here", "many spaces here", id="space-run"),
        pytest.param("end of a\n\n\nparagraph", "end of a paragraph", id="blank-lines"),
        pytest.param("non\u00a0breaking space", "non breaking space", id="nbsp"),
        pytest.param("one two", "  one two\n", id="quote-padded"),
        pytest.param("alpha \t\r\n beta", "alpha\nbeta", id="mixed-run-vs-newline"),
    ],
)
def test_whitespace_stage_verifies_without_highlight(answer: str, quote: str) -> None:
    result = verify_evidence(answer, quote, 3, 9)
    assert result == EvidenceResult(True, False, 3, 9, "whitespace")


@pytest.mark.parametrize(("start", "end"), [(None, None), (-1, 500), (12, 4)])
def test_whitespace_stage_keeps_claimed_indices_unchanged(start: int | None, end: int | None) -> None:
    result = verify_evidence("first\tsecond", "first second", start, end)
    assert (result.stage, result.start, result.end) == ("whitespace", start, end)


def test_whitespace_stage_does_not_ignore_missing_whitespace() -> None:
    assert verify_evidence("first second", "firstsecond").stage == "unverified"


def test_long_quote_with_only_whitespace_differences_and_no_anchors_is_whitespace() -> None:
    quote = "word " * 20  # 100 characters, but the answer wraps lines
    answer = "word\n" * 20
    assert verify_evidence(answer, quote).stage == "whitespace"


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("  a \r\n b\t\tc  ", "a b c"),
        ("", ""),
        (" \n\t ", ""),
        ("a\u2003b\u3000c", "a b c"),
    ],
)
def test_normalize_whitespace_collapses_and_strips(text: str, normalized: str) -> None:
    assert normalize_whitespace(text) == normalized


# --- stage 5: unverified and empty quotes ------------------------------------------------------


def test_quote_not_in_answer_is_unverified() -> None:
    result = verify_evidence(ANSWER, "Einstein won the Chemistry prize", 0, 10)
    assert result == EvidenceResult(False, False, 0, 10, "unverified")


@pytest.mark.parametrize("quote", ["", " ", "\n", "\t \r\n", "\u00a0", None, 42, ["x"]])
def test_empty_whitespace_or_non_text_quote_is_unverified(quote: object) -> None:
    answer = "text with spaces \n\t and \u00a0 other whitespace"
    result = verify_evidence(answer, quote, 0, 1)  # type: ignore[arg-type]
    assert result == EvidenceResult(False, False, 0, 1, "unverified")


@pytest.mark.parametrize("answer", [None, 12, "", b"bytes answer"])
def test_non_text_or_empty_answer_is_unverified(answer: object) -> None:
    result = verify_evidence(answer, "answer", 0, 6)  # type: ignore[arg-type]
    assert (result.verified, result.stage) == (False, "unverified")


def test_matching_is_case_sensitive() -> None:
    assert verify_evidence(ANSWER, QUOTE.lower()).stage == "unverified"


# --- Unicode: indices are code points ----------------------------------------------------------

TURKISH = "Işık İstanbul'da şöyle parlıyor; ğ harfi yumuşak, çiçekler güzel."


@pytest.mark.parametrize("quote", ["Işık", "İstanbul'da", "şöyle parlıyor", "ğ harfi yumuşak", "güzel."])
def test_turkish_exact_with_code_point_indices(quote: str) -> None:
    start = TURKISH.index(quote)
    result = verify_evidence(TURKISH, quote, start, start + len(quote))
    assert (result.stage, result.start, result.end) == ("exact", start, start + len(quote))


@pytest.mark.parametrize("quote", ["İstanbul'da", "yumuşak"])
def test_turkish_utf8_byte_offsets_are_repaired_to_code_points(quote: str) -> None:
    byte_start = TURKISH.encode().index(quote.encode())
    byte_end = byte_start + len(quote.encode())
    result = verify_evidence(TURKISH, quote, byte_start, byte_end)
    assert result.stage == "substring"
    assert TURKISH[result.start : result.end] == quote
    assert result.start == TURKISH.index(quote) != byte_start


@pytest.mark.parametrize(
    ("answer", "quote"),
    [
        pytest.param("İstanbul", "istanbul", id="dotted-capital-I-not-folded"),
        pytest.param("ılık", "ilik", id="dotless-i-is-another-letter"),
        pytest.param("kafe\u0301 açık", "kafé açık", id="decomposed-vs-precomposed"),
    ],
)
def test_unicode_is_not_case_folded_or_normalized(answer: str, quote: str) -> None:
    assert verify_evidence(answer, quote).stage == "unverified"


def test_combining_characters_count_as_their_own_code_points() -> None:
    answer = "kafe\u0301 ve çay"  # "kafé" written as e + combining acute: 5 code points
    result = verify_evidence(answer, "ve çay")
    assert (result.stage, result.start, result.end) == ("substring", 6, 12)


@pytest.mark.parametrize(
    ("answer", "quote", "start"),
    [
        pytest.param("😀😀 great answer", "great", 3, id="emoji"),
        pytest.param("👍🏽 onaylandı", "onaylandı", 3, id="emoji-with-skin-tone"),
        pytest.param("👨‍👩‍👧 aile", "aile", 6, id="zwj-family"),
    ],
)
def test_emoji_positions_are_code_points(answer: str, quote: str, start: int) -> None:
    exact = verify_evidence(answer, quote, start, start + len(quote))
    assert (exact.stage, exact.start) == ("exact", start)
    utf16_start = len(answer[:start].encode("utf-16-le")) // 2
    repaired = verify_evidence(answer, quote, utf16_start, utf16_start + len(quote))
    assert (repaired.stage, repaired.start) == ("substring", start)


def test_turkish_anchor_stage() -> None:
    head = "Kısacası, özetle söylemek"
    tail = "şeklinde açıklanabilir ğü"
    assert len(head) == len(tail) == ANCHOR_LEN
    quote = head + " gerekirse fotoelektrik etki, " + tail
    answer = "Giriş. " + head + " bence ışığın parçacık doğası " + tail + " Son."
    result = verify_evidence(answer, quote)
    assert (result.stage, result.start) == ("anchor", answer.index(head))
    assert answer[result.start : result.end].endswith(tail)


def test_turkish_whitespace_stage() -> None:
    result = verify_evidence(
        "Einstein 1921'de\r\nNobel\tFizik Ödülü aldı", "Einstein 1921'de Nobel Fizik Ödülü"
    )
    assert (result.stage, result.highlight_available) == ("whitespace", False)


# --- labels ------------------------------------------------------------------------------------


def test_every_stage_has_a_label() -> None:
    assert set(STAGE_LABELS) == set(STAGES)


@pytest.mark.parametrize(
    ("stage", "label"),
    [
        ("whitespace", "Position could not be located, highlight off"),
        ("unverified", "Evidence could not be verified"),
    ],
)
def test_seed_label_protocol_texts(stage: str, label: str) -> None:
    assert STAGE_LABELS[stage] == label


@pytest.mark.parametrize("stage", ["exact", "substring", "anchor"])
def test_highlight_stage_labels_say_highlighted(stage: str) -> None:
    assert "highlighted" in STAGE_LABELS[stage]


# --- verify_evidence_item ----------------------------------------------------------------------


def test_item_keeps_its_other_fields_and_gets_verification_fields() -> None:
    item = {"quote": QUOTE, "start": 0, "end": 3, "why": "claim", "better": "rewrite"}
    out = verify_evidence_item(ANSWER, item)
    assert out == {
        "quote": QUOTE,
        "start": QUOTE_AT,
        "end": QUOTE_AT + len(QUOTE),
        "why": "claim",
        "better": "rewrite",
        "verified": True,
        "highlight_available": True,
        "stage": "substring",
    }


def test_item_is_not_mutated() -> None:
    item = {"quote": QUOTE, "start": 0, "end": 3}
    before = copy.deepcopy(item)
    out = verify_evidence_item(ANSWER, item)
    assert item == before and out is not item


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (str(QUOTE_AT), str(QUOTE_AT + len(QUOTE))),
        (f" {QUOTE_AT} ", f"+{QUOTE_AT + len(QUOTE)}"),
        (float(QUOTE_AT), float(QUOTE_AT + len(QUOTE))),
    ],
)
def test_item_parses_string_and_integral_float_indices(start: object, end: object) -> None:
    out = verify_evidence_item(ANSWER, {"quote": QUOTE, "start": start, "end": end})
    assert (out["stage"], out["start"], out["end"]) == ("exact", QUOTE_AT, QUOTE_AT + len(QUOTE))


@pytest.mark.parametrize("bad", ["12.5", "twelve", "", 12.5, True, None, [3], {"i": 1}])
def test_item_unparseable_indices_become_none(bad: object) -> None:
    out = verify_evidence_item(ANSWER, {"quote": "not in the answer at all", "start": bad, "end": bad})
    assert (out["stage"], out["start"], out["end"]) == ("unverified", None, None)


def test_item_negative_string_index_is_kept_when_unverified() -> None:
    out = verify_evidence_item(ANSWER, {"quote": "absent quote", "start": "-4", "end": "9"})
    assert (out["start"], out["end"]) == (-4, 9)


@pytest.mark.parametrize(
    "item",
    [
        pytest.param({}, id="empty"),
        pytest.param({"quote": None, "start": 0, "end": 5}, id="null-quote"),
        pytest.param({"start": 0, "end": 5}, id="no-quote"),
        pytest.param({"quote": 123}, id="number-quote"),
    ],
)
def test_item_without_usable_quote_is_unverified_with_text_quote(item: dict) -> None:
    out = verify_evidence_item(ANSWER, item)
    assert (out["stage"], out["verified"], out["highlight_available"], out["quote"]) == (
        "unverified",
        False,
        False,
        "",
    )


def test_item_missing_indices_are_found_by_substring() -> None:
    out = verify_evidence_item(ANSWER, {"quote": QUOTE})
    assert (out["stage"], out["start"], out["end"]) == ("substring", QUOTE_AT, QUOTE_AT + len(QUOTE))


def test_item_stale_verification_flags_are_overwritten() -> None:
    item = {"quote": "fabricated", "verified": True, "highlight_available": True, "stage": "exact"}
    out = verify_evidence_item(ANSWER, item)
    assert (out["verified"], out["highlight_available"], out["stage"]) == (False, False, "unverified")


@pytest.mark.parametrize("item", [None, "quote", 7, ["quote"]])
def test_item_that_is_not_a_mapping_is_unverified(item: object) -> None:
    out = verify_evidence_item(ANSWER, item)  # type: ignore[arg-type]
    assert out["stage"] == "unverified"


# --- verify_evidence_map -----------------------------------------------------------------------


def seed_evidence_json() -> dict:
    """The seed-002 evidence_json shape with one item per stage."""
    return {
        "truthfulness": {
            "user_score": 2,
            "judge_score": 2,
            "metric_gap": 0,
            "user_reason": "Yanlış bilgi",
            "judge_reason": "Factual error",
            "evidence": [
                {"start": QUOTE_AT, "end": QUOTE_AT + len(QUOTE), "quote": QUOTE, "why": "w", "better": "b"},
                {"start": 0, "end": 0, "quote": "photoelectric effect", "why": "w", "better": "b"},
            ],
        },
        "clarity": {
            "user_score": 5,
            "judge_score": 4,
            "metric_gap": 1,
            "evidence": [
                {"start": 1, "end": 2, "quote": "Einstein  received", "why": "w", "better": "b"},
                {"start": 1, "end": 2, "quote": "Bohr received", "why": "w", "better": "b"},
            ],
        },
    }


def test_map_verifies_every_item() -> None:
    out = verify_evidence_map(ANSWER, seed_evidence_json())
    stages = {slug: [item["stage"] for item in metric["evidence"]] for slug, metric in out.items()}
    assert stages == {"truthfulness": ["exact", "substring"], "clarity": ["whitespace", "unverified"]}


def test_map_keeps_metric_fields() -> None:
    out = verify_evidence_map(ANSWER, seed_evidence_json())
    assert {k: v for k, v in out["truthfulness"].items() if k != "evidence"} == {
        "user_score": 2,
        "judge_score": 2,
        "metric_gap": 0,
        "user_reason": "Yanlış bilgi",
        "judge_reason": "Factual error",
    }


def test_map_does_not_mutate_input() -> None:
    data = seed_evidence_json()
    before = copy.deepcopy(data)
    verify_evidence_map(ANSWER, data)
    assert data == before


@pytest.mark.parametrize("metric_value", [None, 3, "text"])
def test_map_drops_metric_value_that_is_neither_stored_shape(metric_value: object) -> None:
    data = seed_evidence_json()
    data["bad"] = metric_value
    assert set(verify_evidence_map(ANSWER, data)) == {"truthfulness", "clarity"}


@pytest.mark.parametrize("evidence", [None, "a quote", {"quote": QUOTE}, 5])
def test_map_replaces_evidence_that_is_not_a_list_with_empty(evidence: object) -> None:
    out = verify_evidence_map(ANSWER, {"m": {"judge_score": 3, "evidence": evidence}})
    assert out == {"m": {"judge_score": 3, "evidence": []}}


def test_map_metric_without_evidence_key_gets_empty_list() -> None:
    assert verify_evidence_map(ANSWER, {"m": {"judge_score": 3}}) == {"m": {"judge_score": 3, "evidence": []}}


def test_map_drops_items_that_are_not_dicts() -> None:
    data = {"m": {"evidence": [None, "text", 4, ["x"], {"quote": QUOTE}]}}
    out = verify_evidence_map(ANSWER, data)
    assert [item["stage"] for item in out["m"]["evidence"]] == ["substring"]


@pytest.mark.parametrize("evidence_json", [None, [], "{}", 7])
def test_map_of_non_dict_is_empty(evidence_json: object) -> None:
    assert verify_evidence_map(ANSWER, evidence_json) == {}  # type: ignore[arg-type]


def test_map_with_null_answer_marks_everything_unverified() -> None:
    out = verify_evidence_map(None, seed_evidence_json())  # type: ignore[arg-type]
    assert stage_counts(out)["unverified"] == 4


# --- stage_counts ------------------------------------------------------------------------------


def test_stage_counts_over_verified_map() -> None:
    counts = stage_counts(verify_evidence_map(ANSWER, seed_evidence_json()))
    assert counts == {"exact": 1, "substring": 1, "anchor": 0, "whitespace": 1, "unverified": 1}


def test_stage_counts_empty_has_every_stage_at_zero() -> None:
    assert stage_counts({}) == dict.fromkeys(STAGES, 0)


@pytest.mark.parametrize("stage", [None, "bogus", 3, ["exact"]])
def test_stage_counts_unknown_or_missing_stage_counts_as_unverified(stage: object) -> None:
    data = {"m": {"evidence": [{"quote": "q", "stage": stage}, {"quote": "q"}]}}
    assert stage_counts(data)["unverified"] == 2


def test_stage_counts_ignores_malformed_shapes() -> None:
    data = {"a": None, "b": {"evidence": "x"}, "c": {"evidence": [None, {"stage": "anchor"}]}}
    assert stage_counts(data) == {"exact": 0, "substring": 0, "anchor": 1, "whitespace": 0, "unverified": 0}


@pytest.mark.parametrize("evidence_json", [None, [], "x"])
def test_stage_counts_of_non_dict_is_all_zero(evidence_json: object) -> None:
    assert stage_counts(evidence_json) == dict.fromkeys(STAGES, 0)  # type: ignore[arg-type]


# --- properties --------------------------------------------------------------------------------

ANY_TEXT = st.text(alphabet=st.sampled_from(list("ab ıİşğ\t\r\n\u0301😀")) | st.characters(), max_size=120)


@st.composite
def answer_and_slice(draw: st.DrawFn) -> tuple[str, int, int]:
    answer = draw(ANY_TEXT.filter(lambda s: s.strip()))
    start = draw(st.integers(0, len(answer) - 1))
    end = draw(st.integers(start + 1, len(answer)))
    return answer, start, end


@given(
    answer_and_slice().filter(lambda t: t[0][t[1] : t[2]].strip()),
    st.one_of(st.none(), st.integers(-200, 200)),
    st.one_of(st.none(), st.integers(-200, 200)),
)
def test_property_any_slice_is_found_verbatim(
    data: tuple[str, int, int], claimed_start: int | None, claimed_end: int | None
) -> None:
    answer, start, end = data
    quote = answer[start:end]
    result = verify_evidence(answer, quote, claimed_start, claimed_end)
    assert result.verified and result.highlight_available
    assert result.stage in {"exact", "substring"}
    assert answer[result.start : result.end] == quote


@given(answer_and_slice().filter(lambda t: t[0][t[1] : t[2]].strip()))
def test_property_correct_indices_are_exact_and_kept(data: tuple[str, int, int]) -> None:
    answer, start, end = data
    result = verify_evidence(answer, answer[start:end], start, end)
    assert (result.stage, result.start, result.end) == ("exact", start, end)


@given(
    ANY_TEXT,
    ANY_TEXT,
    st.one_of(st.none(), st.integers(), st.text(max_size=3)),
    st.one_of(st.none(), st.integers(), st.text(max_size=3)),
)
def test_property_never_raises_and_flags_are_consistent(
    answer: str, quote: str, start: object, end: object
) -> None:
    result = verify_evidence(answer, quote, start, end)  # type: ignore[arg-type]
    assert result.stage in STAGES
    assert result.verified == (result.stage != "unverified")
    assert result.highlight_available == (result.stage in {"exact", "substring", "anchor"})
    if result.highlight_available:
        assert 0 <= result.start < result.end <= len(answer)
    else:
        claimed = tuple(v if isinstance(v, int) and not isinstance(v, bool) else None for v in (start, end))
        assert (result.start, result.end) == claimed


def seed_anchor_reference(answer: str, quote: str) -> tuple[int, int] | None:
    """The seed-002 anchor loop written naively: every head occurrence, tail searched in its window."""
    head, tail = quote[:ANCHOR_LEN], quote[-ANCHOR_LEN:]
    head_idx = answer.find(head)
    while head_idx >= 0:
        search_end = min(head_idx + len(quote) + 2000, len(answer))
        tail_idx = answer.find(tail, head_idx, search_end)
        if tail_idx >= 0:
            return head_idx, tail_idx + ANCHOR_LEN
        head_idx = answer.find(head, head_idx + 1)
    return None


SMALL_ALPHABET = st.text(alphabet="ab", min_size=0, max_size=30)


@given(
    st.lists(st.tuples(st.sampled_from(["H", "T", "x"]), st.integers(0, 2200)), max_size=6),
    st.integers(0, 40),
    SMALL_ALPHABET,
)
def test_property_anchor_stage_matches_the_seed_loop(
    pieces: list[tuple[str, int]], middle_len: int, noise: str
) -> None:
    quote = HEAD + "m" * middle_len + TAIL
    parts = {"H": HEAD, "T": TAIL, "x": ""}
    answer = noise + "".join(parts[kind] + "." * gap for kind, gap in pieces)
    result = verify_evidence(answer, quote)
    expected = seed_anchor_reference(answer, quote)
    if quote in answer:
        assert result.stage == "substring"
    elif expected is None:
        assert result.stage == "unverified"
    else:
        assert (result.stage, result.start, result.end) == ("anchor", *expected)


# --- reading stored evidence (either shape) ---------------------------------------------------


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        ({"clarity": [{"quote": "x"}]}, [{"quote": "x"}]),
        ({"clarity": {"evidence": [{"quote": "y"}]}}, [{"quote": "y"}]),
        ({"clarity": ["not an item", {"quote": "z"}]}, [{"quote": "z"}]),
        ({"clarity": {"evidence": "not a list"}}, []),
        ({"clarity": "neither shape"}, []),
        ({"safety": [{"quote": "x"}]}, []),
        (None, []),
        ([{"quote": "x"}], []),
    ],
)
def test_metric_entry_reads_either_stored_shape(evidence, expected) -> None:
    assert metric_entry(evidence, "clarity")["evidence"] == expected


def test_metric_entry_keeps_the_seed_entry_keys() -> None:
    stored = {"clarity": {"user_score": 4, "judge_reason": "r", "evidence": [{"quote": "q"}]}}
    assert metric_entry(stored, "clarity") == {
        "user_score": 4,
        "judge_reason": "r",
        "evidence": [{"quote": "q"}],
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([1], [1]),
        ({"evidence": [2]}, [2]),
        (None, []),
        ({"evidence": None}, []),
        ("x", None),
        ({"evidence": 3}, None),
    ],
)
def test_items_of_gives_the_list_of_either_shape_or_none(value, expected) -> None:
    assert items_of(value) == expected


def test_verify_evidence_map_accepts_the_list_shape_too() -> None:
    out = verify_evidence_map(ANSWER, {"clarity": [{"quote": QUOTE}], "junk": 3})
    assert list(out) == ["clarity"]
    assert out["clarity"]["evidence"][0]["stage"] == "substring"


@pytest.mark.parametrize("shape", ["list", "seed"])
def test_evidence_items_are_verified_the_same_for_both_stored_shapes(shape) -> None:
    raw = [{"quote": QUOTE, "start": 0, "end": 3, "why": "w"}, {"quote": "not in the answer"}]
    stored = {"clarity": raw if shape == "list" else {"evidence": raw}}
    items = evidence_items(ANSWER, stored, "clarity")
    assert items == (
        EvidenceItem("clarity", QUOTE, "w", "", QUOTE_AT, QUOTE_AT + len(QUOTE), "substring"),
        EvidenceItem("clarity", "not in the answer", "", "", None, None, "unverified"),
    )
    assert items[0].highlighted and not items[1].highlighted
    assert items[1].label == STAGE_LABELS["unverified"]


def test_evidence_items_trust_a_stored_stage_with_usable_positions() -> None:
    stored = {"m": [{"quote": "Q", "start": 1, "end": 2, "stage": "exact"}]}
    # A stored, usable verification is shown as stored (not recomputed on every page view).
    assert evidence_items(ANSWER, stored, "m")[0].stage == "exact"
    broken = {"m": [{"quote": QUOTE, "start": 5, "end": 999, "stage": "exact"}]}
    assert evidence_items(ANSWER, broken, "m")[0].start == QUOTE_AT


def test_an_answer_is_collapsed_once_for_all_its_quotes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19 item 7: the whitespace stage collapses the answer once per answer, not once per quote."""
    import lib.evidence as evidence

    answer = "Line one  of\tthe answer.\n\nLine   two, with more   words. " * 50
    collapsed: list[str] = []
    real = evidence.normalize_whitespace

    def counting(text: str) -> str:
        collapsed.append(text)
        return real(text)

    monkeypatch.setattr(evidence, "normalize_whitespace", counting)
    quotes = ["one of the answer.", "two, with more words.", "never said at all", "Line two,\nwith"]
    evidence_json = {
        "clarity": {"evidence": [{"quote": q} for q in quotes[:2]]},
        "truthfulness": {"evidence": [{"quote": q} for q in quotes[2:]]},
    }
    verified = verify_evidence_map(answer, evidence_json)
    stages = [item["stage"] for slug in ("clarity", "truthfulness") for item in verified[slug]["evidence"]]
    assert stages == ["whitespace", "whitespace", "unverified", "whitespace"]
    assert collapsed.count(answer) == 1
    assert sorted(text for text in collapsed if text != answer) == sorted(quotes)
    collapsed.clear()
    items = evidence.verify_evidence_items(answer, [{"quote": q} for q in quotes])
    assert [item["stage"] for item in items] == ["whitespace", "whitespace", "unverified", "whitespace"]
    assert collapsed.count(answer) == 1
