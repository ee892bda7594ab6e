"""lib.display: evaluation titles and in-app links (pure functions, no database)."""

from __future__ import annotations

import pytest

from lib import display


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("Where is Ankara?\nAnswer in one line.", "Where is Ankara?"),
        ("\n\n   \n  İstanbul'un nüfusu nedir?  ", "İstanbul'un nüfusu nedir?"),
        ("Tabs\tand  double\u00a0spaces", "Tabs and double spaces"),
        ("", display.UNTITLED),
        (None, display.UNTITLED),
        (" \n\t\n", display.UNTITLED),
    ],
)
def test_title_is_the_first_non_empty_line_with_spaces_collapsed(question, expected) -> None:
    assert display.evaluation_title(question) == expected


def test_a_long_title_ends_on_a_whole_word_with_an_ellipsis() -> None:
    question = "How many " + "very " * 30 + "long words?"
    title = display.evaluation_title(question, limit=40)
    assert title.endswith("very…") and len(title) <= 41
    assert question.startswith(title[:-1])


def test_a_long_word_without_spaces_is_cut_at_the_limit() -> None:
    assert display.evaluation_title("x" * 200, limit=10) == "x" * 10 + "…"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (display.evaluation_url("snap_1"), "evaluations?snapshot=snap_1"),
        (display.evaluation_url("a b&c=d#e"), "evaluations?snapshot=a+b%26c%3Dd%23e"),
        (display.judgment_url("owner/repo#12"), "corrections?change_id=owner%2Frepo%2312"),
        (display.coach_url("s"), "coach?snapshot=s"),
        (display.interaction_url("i-1"), "precedents?interaction=i-1"),
        (display.evaluations_list_url({"review": "pending", "product": ""}), "evaluations?review=pending"),
        (display.evaluations_list_url(), "evaluations"),
    ],
)
def test_links_are_relative_and_encode_their_values(url, expected) -> None:
    assert url == expected
