"""The highlighted answer is safe HTML whatever the data holds, and shows exactly the answer's text."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lib.highlight import (
    APP_TAGS,
    INLINE_CHARS,
    PALETTE,
    Span,
    answer_parts,
    clip_text,
    metric_palette,
    render_highlighted_answer,
    render_legend,
    sanitize_slug,
    strip_app_markup,
    valid_spans,
)

ALLOWED_ATTRS = {"class", "style", "title", "data-metrics", "data-refs", "data-metric", "value"}
HEX = re.compile(r"#[0-9a-f]{6}")
STYLE_OK = re.compile(r"[a-z0-9#:;.,() %\-]*")


class _Collector(HTMLParser):
    """Every element in a rendered fragment, as parsed by a real HTML parser."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.other: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.other.append(f"<{tag}/>")

    def handle_comment(self, data: str) -> None:
        self.other.append("comment")

    def handle_decl(self, decl: str) -> None:
        self.other.append("decl")

    def handle_pi(self, data: str) -> None:
        self.other.append("pi")


def _elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    collector = _Collector()
    collector.feed(html)
    collector.close()
    assert collector.other == []
    return collector.elements


def assert_safe(html: str) -> None:
    """Only the app's tags and attributes; no handlers, links, scripts or data-chosen styles."""
    assert "\n" not in html and "\r" not in html  # one Markdown HTML block, never split
    for tag, attrs in _elements(html):
        assert tag in APP_TAGS, tag
        for name, value in attrs.items():
            assert name in ALLOWED_ATTRS, name
            assert not name.startswith("on")
            assert "javascript:" not in re.sub(r"\s", "", (value or "").lower())
            if name == "style":
                assert STYLE_OK.fullmatch(value or ""), value
                assert "url(" not in (value or "")
            if name in {"data-metrics", "data-metric"}:
                assert re.fullmatch(r"[a-z0-9_-]+( [a-z0-9_-]+)*", value or ""), value


def _segments(html: str) -> list[tuple[str, str, str, str]]:
    """(text, data-metrics, data-refs, title) of every piece of answer text, marked or not, in order."""

    class _Segments(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.found: list[tuple[str, str, str, str]] = []
            self.stack: list[tuple[str, dict[str, str | None]]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.stack.append((tag, dict(attrs)))

        def handle_endtag(self, tag: str) -> None:
            self.stack.pop()

        def handle_data(self, data: str) -> None:
            classes = [a.get("class") for _, a in self.stack]
            if "ov-answer" not in classes or "ov-ref" in classes:
                return
            tag, a = self.stack[-1]
            if tag == "mark":
                self.found.append((data, a["data-metrics"] or "", a["data-refs"] or "", a["title"] or ""))
            else:
                self.found.append((data, "", "", ""))

    parser = _Segments()
    parser.feed(html)
    parser.close()
    return parser.found


def _marks(html: str) -> list[tuple[str, str, str, str]]:
    """Only the highlighted segments."""
    return [segment for segment in _segments(html) if segment[1]]


HOSTILE_ANSWERS = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "&lt;script&gt; already escaped &amp; &#x3C; &#60;",
    "<a href=\"javascript:alert('x')\">click</a>",
    "</div></mark><script>alert(1)</script><div>",
    "<!-- comment --> <![CDATA[x]]> <?php echo 1 ?> <!DOCTYPE html>",
    "quotes \" and ' and ` and \\",
    "مرحبا بالعالم — שלום עולם \u202eevil\u202c end",
    "e\u0301 a\u0300\u0316 Z\u0351\u036b\u0343\u036a combining",
    "emoji 👩‍👩‍👧‍👦 🏳️‍🌈 🇹🇷 1️⃣",
    "line one\r\nline two\rline three\n\nline five",
    "\n\n<img src=x onerror=alert(1)>\n\n[x](javascript:alert(1))",
    "  leading spaces\tand\ttabs  ",
    "\x00 \x0b \x0c \x7f controls",
    "$\\alpha$ and *markdown* and `code`",
    "<style>body{display:none}</style><iframe src=javascript:alert(1)>",
    "",
]


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS)
def test_hostile_answer_renders_safe_and_round_trips(answer: str) -> None:
    spans = [Span(0, len(answer) // 2, "faithfulness"), Span(len(answer) // 3, len(answer), "relevance")]
    html = render_highlighted_answer(answer, spans)
    assert_safe(html)
    assert strip_app_markup(html) == answer


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS)
def test_hostile_answer_renders_safe_without_spans(answer: str) -> None:
    html = render_highlighted_answer(answer, [])
    assert_safe(html)
    assert "<mark" not in html
    assert strip_app_markup(html) == answer


@pytest.mark.parametrize(
    ("start", "end"),
    [(3, 12), (0, 4), (5, 20), (10, 29), (1, 2), (28, 29)],
)
def test_span_cutting_through_img_tag_is_text_not_markup(start: int, end: int) -> None:
    answer = '<img src=x onerror="alert(1)">'
    html = render_highlighted_answer(answer, [Span(start, end, "faithfulness")])
    assert_safe(html)
    assert [m[0] for m in _marks(html)] == [answer[start:end]]
    assert strip_app_markup(html) == answer


HOSTILE_FIELDS = [
    '" onmouseover="alert(1)',
    "' onmouseover='alert(1)",
    "<script>alert(1)</script>",
    "javascript:alert(1)",
    '"><img src=x onerror=alert(1)>',
    "a\n\nb\r\nc",
    "\u202eevil",
    "&quot; onfocus=&quot;x",
]


@pytest.mark.parametrize("metric", HOSTILE_FIELDS)
def test_hostile_metric_name_never_escapes_its_attribute(metric: str) -> None:
    html = render_highlighted_answer("some answer text", [Span(0, 4, metric, "why", "better")])
    assert_safe(html)
    assert render_highlighted_answer("x", [Span(0, 1, metric)]).count("<mark") == 1


@pytest.mark.parametrize("text", HOSTILE_FIELDS)
def test_hostile_why_and_better_stay_text(text: str) -> None:
    html = render_highlighted_answer("some answer text", [Span(0, 4, "faithfulness", text, text)])
    assert_safe(html)
    assert strip_app_markup(html) == "some answer text"
    title = _marks(html)[0][3].replace("\u200b", "")  # the zero-width space that defangs `script:`
    assert title == f"[1] faithfulness: {text} — Better: {text}"


@pytest.mark.parametrize(
    "why",
    ["javascript:alert(1)", "JavaScript :x", "vbscript:\nmsgbox", "java\tscript:x", "see javascript docs"],
)
def test_title_never_reads_as_a_script_url(why: str) -> None:
    title = _marks(render_highlighted_answer("abc", [Span(0, 2, "m", why)]))[0][3]
    assert not re.search(r"script\s*:", title, re.IGNORECASE)
    assert title.replace("\u200b", "") == f"[1] m: {why}"


@pytest.mark.parametrize("labels", [{"m": '"><script>alert(1)</script>'}, {"m": "a\nb"}, None])
def test_hostile_label_stays_text(labels: dict[str, str] | None) -> None:
    html = render_highlighted_answer("abc", [Span(0, 2, "m", "w")], labels=labels)
    assert_safe(html)
    name = (labels or {}).get("m", "m")
    assert _marks(html)[0][3] == f"[1] {name}: w"


def test_title_lists_metric_why_and_better_with_quotes_intact() -> None:
    span = Span(0, 5, "faithfulness", why='He said "no" and it\'s wrong', better="Say 'yes'")
    html = render_highlighted_answer("Hello world", [span], labels={"faithfulness": "Faithfulness"})
    assert _marks(html) == [
        ("Hello", "faithfulness", "1", "[1] Faithfulness: He said \"no\" and it's wrong — Better: Say 'yes'")
    ]


def test_overlapping_spans_split_into_exact_segments() -> None:
    html = render_highlighted_answer("abcdefghij", [Span(0, 6, "a"), Span(3, 9, "b")])
    assert [(t, m, r) for t, m, r, _ in _marks(html)] == [
        ("abc", "a", "1"),
        ("def", "a b", "1 2"),
        ("ghi", "b", "2"),
    ]
    assert strip_app_markup(html) == "abcdefghij"


def test_nested_span_splits_outer_into_three_segments() -> None:
    html = render_highlighted_answer("abcdefghij", [Span(2, 4, "inner"), Span(0, 10, "outer")])
    assert [(t, m, r) for t, m, r, _ in _marks(html)] == [
        ("ab", "outer", "1"),
        ("cd", "outer inner", "1 2"),
        ("efghij", "outer", "1"),
    ]


def test_identical_spans_of_two_metrics_form_one_striped_segment() -> None:
    colors = {"a": "#111111", "b": "#222222"}
    html = render_highlighted_answer("abcdef", [Span(1, 3, "a"), Span(1, 3, "b")], colors=colors)
    assert [(t, m) for t, m, _, _ in _marks(html)] == [("bc", "a b")]
    assert "repeating-linear-gradient(135deg, #111111 0px 6px, #222222 6px 12px)" in html


def test_adjacent_spans_stay_separate_segments() -> None:
    html = render_highlighted_answer("abcdef", [Span(0, 3, "a"), Span(3, 6, "a")])
    assert [(t, r) for t, _, r, _ in _marks(html)] == [("abc", "1"), ("def", "2")]


def test_same_metric_overlap_lists_metric_once_and_both_reasons() -> None:
    html = render_highlighted_answer("abcdef", [Span(0, 4, "a", "first"), Span(2, 6, "a", "second")])
    middle = _marks(html)[1]
    assert middle[:3] == ("cd", "a", "1 2")
    assert middle[3] == "[1] a: first\n[2] a: second"
    assert "repeating-linear-gradient" not in html


def test_title_of_overlap_names_every_covering_metric() -> None:
    spans = [Span(0, 4, "faith", "w1", "b1"), Span(2, 6, "rel", "w2")]
    title = _marks(render_highlighted_answer("abcdef", spans))[1][3]
    assert title == "[1] faith: w1 — Better: b1\n[2] rel: w2"


@pytest.mark.parametrize(
    "span",
    [
        Span(5, 2, "reversed"),
        Span(3, 3, "empty"),
        Span(20, 30, "after-end"),
        Span(-9, -1, "before-start"),
        Span(10, 10, "empty-at-end"),
        Span(None, 3, "none-start"),  # type: ignore[arg-type]
        Span(0, 2.5, "float-end"),  # type: ignore[arg-type]
        Span(True, 3, "bool-start"),
    ],
)
def test_unusable_span_is_ignored(span: Span) -> None:
    html = render_highlighted_answer("0123456789", [span])
    assert "<mark" not in html
    assert strip_app_markup(html) == "0123456789"


@pytest.mark.parametrize(
    ("span", "highlighted"),
    [(Span(-5, 3, "m"), "012"), (Span(7, 999, "m"), "789"), (Span(-1, 99, "m"), "0123456789")],
)
def test_partly_out_of_range_span_is_clamped(span: Span, highlighted: str) -> None:
    assert [m[0] for m in _marks(render_highlighted_answer("0123456789", [span]))] == [highlighted]


def test_valid_spans_are_numbered_in_reading_order() -> None:
    spans = [Span(5, 8, "b"), Span(0, 2, "a"), Span(0, 9, "c"), Span(4, 1, "bad")]
    assert [(s.start, s.end, s.metric) for s in valid_spans("0123456789", spans)] == [
        (0, 9, "c"),
        (0, 2, "a"),
        (5, 8, "b"),
    ]


def test_evidence_list_has_one_details_per_span_with_why_and_better() -> None:
    spans = [Span(6, 11, "rel", "off topic"), Span(0, 5, "faith", "wrong", "say hi")]
    html = render_highlighted_answer("Hello world", spans, labels={"faith": "Faithfulness"})
    tags = [tag for tag, _ in _elements(html)]
    assert tags.count("details") == 2 and tags.count("summary") == 2
    values = [a["value"] for tag, a in _elements(html) if tag == "li"]
    assert values == ["1", "2"]
    assert html.index("Faithfulness") < html.index("off topic")
    assert "<b>Better:</b> say hi" in html


def test_evidence_list_quote_is_a_one_line_preview() -> None:
    html = render_highlighted_answer("a\r\n\n  b\tc d", [Span(0, 9, "m")])
    assert "“a b c”" in html


def test_footnote_numbers_follow_span_ends_and_are_not_answer_text() -> None:
    html = render_highlighted_answer("Hello world", [Span(0, 5, "a"), Span(6, 11, "b")])
    assert re.findall(r'<sup class="ov-ref"[^>]*>(\d+)</sup>', html) == ["1", "2"]
    assert strip_app_markup(html) == "Hello world"


def test_notes_can_be_turned_off() -> None:
    html = render_highlighted_answer("Hello world", [Span(0, 5, "a", "why")], notes=False)
    assert "<details" not in html and "<sup" not in html and "<ol" not in html
    assert _marks(html)[0][0] == "Hello"


def test_long_quote_in_evidence_list_is_shortened() -> None:
    answer = "x" * 500
    html = render_highlighted_answer(answer, [Span(0, 500, "a")])
    assert "x" * 160 + "…" in html and "x" * 161 not in html.split('class="ov-notes"')[1]


def test_answer_is_wrapped_in_pre_wrap_div() -> None:
    html = render_highlighted_answer("a\r\nb", [])
    assert html.startswith('<div class="ov-highlight"><div class="ov-answer" style="white-space:pre-wrap;')
    assert "a&#13;&#10;b" in html


def test_lone_surrogate_becomes_replacement_character() -> None:
    html = render_highlighted_answer("a\ud800b", [Span(0, 2, "m", "\udfff")])
    html.encode("utf-8")  # would raise on a surrogate
    assert strip_app_markup(html) == "a\ufffdb"


@pytest.mark.parametrize(
    "bad_color",
    [
        "red",
        "#fff",
        "#12345g",
        "#123456; background:url(javascript:alert(1))",
        "expression(alert(1))",
        None,
        7,
    ],
)
def test_invalid_caller_colour_falls_back_to_palette(bad_color: object) -> None:
    html = render_highlighted_answer("abc", [Span(0, 2, "m")], colors={"m": bad_color})  # type: ignore[dict-item]
    assert_safe(html)
    assert f"background:{metric_palette(['m'])['m']};" in html


def test_valid_caller_colour_is_used_lowercased() -> None:
    html = render_highlighted_answer("abc", [Span(0, 2, "m")], colors={"m": "#ABCDEF"})
    assert "background:#abcdef;" in html


def test_palette_has_at_least_ten_light_hex_colours() -> None:
    assert len(set(PALETTE)) >= 10
    for color in PALETTE:
        assert HEX.fullmatch(color)
        r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
        assert 0.2126 * r + 0.7152 * g + 0.0722 * b > 170  # light enough for dark text


def test_metric_palette_ignores_order() -> None:
    slugs = ["faithfulness", "relevance", "completeness", "tone", "safety"]
    assert metric_palette(slugs) == metric_palette(list(reversed(slugs)))


def test_metric_palette_gives_distinct_colours_up_to_palette_size() -> None:
    slugs = [f"metric_{i}" for i in range(len(PALETTE))]
    assert sorted(metric_palette(slugs).values()) == sorted(PALETTE)


def test_metric_palette_reuses_colours_beyond_palette_size() -> None:
    colors = metric_palette([f"m{i}" for i in range(30)])
    assert len(colors) == 30 and set(colors.values()) <= set(PALETTE)


@pytest.mark.parametrize(
    ("metric", "slug"),
    [
        ("Faithfulness", "faithfulness"),
        ("answer_relevance", "answer_relevance"),
        ('" onmouseover="alert(1)', "onmouseover-alert-1"),
        ("Ölçüm Doğruluğu", "l-m-do-rulu-u"),
        ("!!!", "metric"),
        ("", "metric"),
    ],
)
def test_metric_slug_is_sanitized(metric: str, slug: str) -> None:
    assert sanitize_slug(metric) == slug


def test_legend_shows_each_metric_once_with_its_colour() -> None:
    html = render_legend(["a", "b", "a"], colors={"a": "#123456"}, labels={"b": "<b>Bee</b>"})
    assert_safe(html)
    assert html.count('class="ov-legend-item"') == 2
    assert "background:#123456;" in html
    assert "&lt;b&gt;Bee&lt;/b&gt;" in html
    assert strip_app_markup(html) == ""


@pytest.mark.parametrize("metric", HOSTILE_FIELDS)
def test_legend_with_hostile_metric_is_safe(metric: str) -> None:
    assert_safe(render_legend([metric]))


@pytest.mark.parametrize(
    "html",
    [
        '<div class="ov-answer"><script>alert(1)</script></div>',
        '<div class="ov-answer"><img src=x/></div>',
        '<div class="ov-answer"><!-- x --></div>',
        '<div class="ov-answer"><a href="javascript:alert(1)">x</a></div>',
    ],
)
def test_strip_app_markup_rejects_foreign_markup(html: str) -> None:
    with pytest.raises(ValueError):
        strip_app_markup(html)


# Text that stresses HTML escaping, Markdown, bidi and newlines, plus anything else Unicode offers.
_ANSWER_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(
            [*"<>&\"'`=/;#\\\r\n\t []()!*_$", "\u202e", "\u0301", "👩", "\u200d", "👧", "ש", "ع"]
        ),
        # Lone surrogates are excluded: they become U+FFFD by design (tested above), not round-tripped.
        st.characters(exclude_categories=["Cs"]),
    ),
    max_size=60,
)
_METRIC = st.sampled_from(["faithfulness", "relevance", '" onmouseover="x', "<b>", "Ton Ü", ""])


@st.composite
def _answer_and_spans(draw: st.DrawFn) -> tuple[str, list[Span]]:
    answer = draw(_ANSWER_TEXT)
    bound = st.integers(min_value=-3, max_value=len(answer) + 3)
    spans = draw(
        st.lists(
            st.builds(Span, bound, bound, _METRIC, st.text(max_size=8), st.text(max_size=8)),
            max_size=6,
        )
    )
    return answer, spans


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_answer_and_spans())
def test_property_rendered_text_equals_answer(case: tuple[str, list[Span]]) -> None:
    answer, spans = case
    html = render_highlighted_answer(answer, spans)
    assert strip_app_markup(html) == answer
    assert_safe(html)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_answer_and_spans())
def test_property_each_character_is_marked_by_exactly_the_spans_covering_it(
    case: tuple[str, list[Span]],
) -> None:
    answer, spans = case
    kept = valid_spans(answer, spans)
    expected = [[n for n, s in enumerate(kept, 1) if s.start <= i < s.end] for i in range(len(answer))]
    seen: list[list[int]] = []
    for text, _, refs, _ in _segments(render_highlighted_answer(answer, spans)):
        seen.extend([int(r) for r in refs.split()] for _ in text)
    assert seen == expected


# --- Issue #17: long answers are rendered one part at a time, highlights intact.


@pytest.mark.parametrize(
    "text",
    ["", "short", "x" * 50_001, ("word " * 9_000) + "\n" + ("line\n" * 5_000), "é" * 20_000, "a b" * 7_000],
)
def test_answer_parts_cover_the_text_in_order_within_the_limit(text: str) -> None:
    parts = answer_parts(text)
    assert parts[0][0] == 0 and parts[-1][1] == len(text)
    assert all(end == nxt for (_, end), (nxt, _) in pairwise(parts))
    assert all(0 < end - start <= INLINE_CHARS for start, end in parts) or text == ""
    assert len(parts) == max(1, -(-len(text) // INLINE_CHARS)) or " " in text or "\n" in text


def test_answer_parts_cut_after_a_space_when_one_is_near() -> None:
    text = "word " * 10_000
    assert all(text[end - 1] == " " for _, end in answer_parts(text)[:-1])


def test_window_shows_exactly_its_part_with_highlights_clipped_and_global_numbers() -> None:
    answer = "a" * 100 + "B" * 50 + "c" * 100
    spans = [Span(0, 10, "m1"), Span(90, 160, "m2", why="crosses"), Span(200, 250, "m3")]
    parts = [(0, 120), (120, 250)]
    html = [render_highlighted_answer(answer, spans, window=w) for w in parts]

    assert [strip_app_markup(h) for h in html] == [answer[:120], answer[120:]]
    first, second = ([(refs, text) for text, _, refs, _ in _marks(h)] for h in html)
    assert first == [("1", "a" * 10), ("2", "a" * 10 + "B" * 20)]
    assert second == [("2", "B" * 30 + "c" * 10), ("3", "c" * 50)]
    # The footnote number sits where the span really ends: in the second part, not at the cut.
    assert '">2</sup>' not in html[0].split('class="ov-notes"')[0]
    assert '">2</sup>' in html[1].split('class="ov-notes"')[0]
    # The evidence list is that of the whole answer, in both parts.
    assert all(h.count("<li ") == 3 for h in html)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(alphabet="ab \n<&", min_size=1, max_size=300),
    st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=6),
    st.integers(1, 120),
)
def test_property_parts_together_show_the_answer_and_every_highlighted_character(
    answer: str, raw: list[tuple[int, int]], size: int
) -> None:
    spans = [Span(a, b, f"m{i}") for i, (a, b) in enumerate(raw)]
    whole = _segments(render_highlighted_answer(answer, spans))
    pieces = [render_highlighted_answer(answer, spans, window=w) for w in answer_parts(answer, size)]
    assert "".join(strip_app_markup(p) for p in pieces) == answer
    # Character by character, each part marks exactly what the whole answer marks, with the same numbers.
    per_char = [(ch, refs) for text, _, refs, _ in whole for ch in text]
    assert [(ch, refs) for p in pieces for text, _, refs, _ in _segments(p) for ch in text] == per_char


def test_clip_text_keeps_short_text_and_says_how_much_is_cut() -> None:
    assert clip_text("abc", 3) == "abc"
    assert clip_text("abcdef", 3) == "abc… [3 more characters]"
    assert clip_text("x" * (INLINE_CHARS + 1234)) == "x" * INLINE_CHARS + "… [1,234 more characters]"


def test_huge_reason_is_clipped_in_the_title_and_the_list() -> None:
    html = render_highlighted_answer("abc", [Span(0, 3, "m", why="w" * 1_000_000, better="b" * 1_000_000)])
    assert len(html) < 2 * INLINE_CHARS + 5_000
