"""Untrusted text made safe for `st.markdown` (always WITHOUT `unsafe_allow_html`).

Which one the pages use:

- `escape_markdown(text)` — for untrusted text (model answers, quotes, reasons, notes, feedback,
  chat, titles): every ASCII punctuation character is backslash-escaped, so nothing is Markdown any
  more — no link, image, HTML, heading, list, table, code or LaTeX. Backslashes are not enough for
  what Streamlit's renderer finds in plain text after parsing (GFM autolinks of `http://`, `www.`
  and e-mail addresses; `:smile:` emoji and `:streamlit:`-style shortcodes; `:blue[...]` colours), so
  an invisible WORD JOINER (U+2060) is put after each `:` that is followed by text, before each `@`
  and inside `www.`: the text reads exactly as written, and none of it becomes a link or an icon.
  This is the default for every page.
- `safe_markdown(text)` — only where formatting is part of the content and worth keeping (e.g. an
  LLM's coach reply that uses bold and lists): Markdown stays, but `<` can no longer open raw HTML or
  an autolink, any link or reference definition whose target is not http, https, mailto or a
  relative path is broken apart, including obfuscated variants (`JaVaScRiPt:`, `java\tscript:`,
  `jav&#x61;script:`, `data:`, `vbscript:`, `file:`), no image is ever loaded (`![` becomes a
  literal `!` before a link: a prompt-injected image URL would leak data to its server as soon as
  the reply is shown), and blockquotes and lists nest at most `MAX_NESTING` deep (thousands of
  levels crash the browser's renderer).

Neither function returns HTML: both are Markdown source for `st.markdown(text)`.
"""

from __future__ import annotations

import html
import re
import string

_SAFE_SCHEMES = frozenset({"http", "https", "mailto"})

# CommonMark lets any ASCII punctuation be backslash-escaped; escaping all of it leaves no syntax.
_PUNCTUATION = frozenset(string.punctuation)

# The start of a link/image target `](`, or of a reference definition `]:` (which may sit in a
# blockquote or list item, so it is matched anywhere, not only at the start of a line).
_TARGET_OPENER_RE = re.compile(r"\]\s*[(:]")
_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.\-]*:")
_INVISIBLE_RE = re.compile(r"[\s\x00-\x1f\x7f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]+")
_BACKSLASH_ESCAPE_RE = re.compile(r"\\([!-/:-@\[-`{-~])")
_SCHEME_PREFIX_RE = re.compile(r"[a-z][a-z0-9+.\-]*|")
_LEADING_SPACE_RE = re.compile(r"\s*")
_TARGET_WINDOW = 2048
_LEADING_INDENT_RE = re.compile(r"^[ \t]+", re.MULTILINE)

WORD_JOINER = "\u2060"
# Where Streamlit's renderer would find a link or an icon in plain text (after backslash escaping):
# a `:` before text (`http://`, `:smile:`, `:blue[`), an `@` (e-mail), `www.` (a bare web address).
_INERT_RE = re.compile(r"(?<=\\:)(?=\S)|(?=\\@)|(?i:(?<=www)(?=\\\.))")

# Deepest blockquote/list nesting kept in Markdown from a model; deeper markers are shown as text.
MAX_NESTING = 8
_SPACE_RE = re.compile(r"[ \t]*")
_MARKER_RE = re.compile(r">|[-+*](?=[ \t]|$)|[0-9]{1,9}[.)](?=[ \t]|$)")
_IMAGE_RE = re.compile(r"!(?=\[)")


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def replace_unencodable(text: str) -> str:
    """Text with unpaired surrogates replaced by U+FFFD, so a page or file can encode it as UTF-8.

    Imports refuse such text (issue #17), but a JSON field stored earlier can still hold an escaped
    lone surrogate; every renderer of untrusted text goes through this (escape_markdown, highlight.esc).
    """
    return text if text.isascii() else _SURROGATE_RE.sub("\ufffd", text)


def escape_markdown(text: str) -> str:
    """Untrusted text as Markdown that renders literally: no link, HTML, formatting or LaTeX."""
    escaped = "".join(
        f"\\{char}" if char in _PUNCTUATION else char for char in replace_unencodable(str(text))
    )
    lines = _INERT_RE.sub(WORD_JOINER, escaped).replace("\r\n", "\n").replace("\r", "\n")
    # Two trailing spaces make each newline a hard break, so line structure survives rendering.
    return _keep_indentation(lines).replace("\n", "  \n")


def _keep_indentation(text: str) -> str:
    """Leading spaces/tabs as no-break spaces, so indented lines don't become code blocks."""
    return _LEADING_INDENT_RE.sub(lambda m: m.group(0).replace("\t", "    ").replace(" ", "\u00a0"), text)


def _normalize_target(raw: str) -> str:
    """A link target as a browser would parse it, with every obfuscation layer an attacker can stack undone."""
    target = raw
    for _ in range(8):  # entities and backslash escapes, repeatedly (double encoding)
        decoded = _BACKSLASH_ESCAPE_RE.sub(r"\1", html.unescape(target))
        if decoded == target:
            break
        target = decoded
    # Browsers drop tabs/newlines inside URLs and trim leading controls; invisible characters go too.
    return _INVISIBLE_RE.sub("", target).lstrip("<").lower()


def is_safe_link_target(raw: str) -> bool:
    """True when a Markdown link target is http(s), mailto or relative (checked after de-obfuscation)."""
    match = _SCHEME_RE.match(_normalize_target(raw))
    return match is None or match.group(0)[:-1] in _SAFE_SCHEMES


def _target_is_safe(source: str, pos: int) -> bool:
    """Whether the link target starting at `pos` is safe; undecidable (huge, padded) targets are not."""
    pos = _LEADING_SPACE_RE.match(source, pos).end()
    window = source[pos : pos + _TARGET_WINDOW]
    if pos + _TARGET_WINDOW < len(source):
        # Cut at literal whitespace, never inside an entity or escape, and refuse to guess if the
        # visible prefix could still grow into a scheme (e.g. thousands of `&#32;` before `javascript:`).
        cut = max(window.rfind(c) for c in " \t\n\r")
        if cut <= 0:
            return False
        window = window[:cut]
        if _SCHEME_PREFIX_RE.fullmatch(_normalize_target(window)):
            return False
    return is_safe_link_target(window)


def _limit_line(line: str) -> str:
    """One line with at most `MAX_NESTING` container levels (markers, and indentation as 2 columns a level)."""
    levels, pos = 0, 0
    while True:
        space = _SPACE_RE.match(line, pos)
        indent = len(space.group().replace("\t", "    ")) // 2
        if levels + indent > MAX_NESTING:  # deep indentation nests lists too: keep what the budget allows
            if _MARKER_RE.match(line, space.end()) is None:
                return line  # no marker, no new level: an indented code line or text keeps its spaces
            keep = " " * (2 * (MAX_NESTING - levels))
            line, levels = line[:pos] + keep + line[space.end() :], MAX_NESTING
            space = _SPACE_RE.match(line, pos)
        levels += indent
        marker = _MARKER_RE.match(line, space.end())
        if marker is None:
            return line
        if levels >= MAX_NESTING:
            # A backslash before the marker (`\>`, `\-`, `1\.`) makes it, and all after it, plain text.
            cut = marker.end() - 1
            return f"{line[:cut]}\\{line[cut:]}"
        levels += 1
        pos = marker.end() + (1 if line[marker.end() : marker.end() + 1] in {" ", "\t"} else 0)


def _limit_nesting(text: str) -> str:
    """Blockquotes and lists nested at most `MAX_NESTING` deep; deeper markers are shown as text."""
    return "\n".join(_limit_line(line) for line in text.split("\n"))


def safe_markdown(text: str) -> str:
    """Markdown kept readable (bold, lists, code) with raw HTML, images, deep nesting and unsafe links defused."""
    source = _limit_nesting(str(text))
    out: list[str] = []
    cursor = 0
    for match in _TARGET_OPENER_RE.finditer(source):
        if _target_is_safe(source, match.end()):
            continue
        # `&#93;` is a literal `]` that Markdown never reads as syntax, so no link can form here.
        out.append(source[cursor : match.start()])
        out.append("&#93;" + source[match.start() + 1 : match.end()])
        cursor = match.end()
    out.append(source[cursor:])
    # A `<` as an entity can never open raw HTML or an autolink, whatever backslashes precede it;
    # likewise `&#33;` is a literal `!`, so `![alt](url)` and `![alt][ref]` stay links, never images.
    return _IMAGE_RE.sub("&#33;", "".join(out)).replace("<", "&lt;")
