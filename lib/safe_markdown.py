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
  LLM's coach reply that uses bold and lists): Markdown stays, but no link of any kind forms, as in
  every other model text (issue 24): `<` can no longer open raw HTML or an autolink; a word joiner
  (U+2060) after every `]` that a `(` or `:` follows breaks every link target and reference
  definition, whatever the scheme or its obfuscation (`JaVaScRiPt:`, `jav&#x61;script:`, `data:`),
  so `[text](url)` reads as written; the bare addresses GFM would link by itself get one too
  (`http:⁠//`, `www⁠.`, `me⁠@example.com`), and so does every `![`, so no image is ever loaded (a
  prompt-injected image URL would leak data to its server as soon as the reply is shown). Joiners
  are invisible and, unlike entities, read the same inside code. Blockquotes and lists nest at most
  `MAX_NESTING` deep (thousands of levels crash the renderer). A reviewer who wants to follow an
  address the model names copies it.

Neither function returns HTML: both are Markdown source for `st.markdown(text)`.
"""

from __future__ import annotations

import re
import string

# CommonMark lets any ASCII punctuation be backslash-escaped; escaping all of it leaves no syntax.
_PUNCTUATION = frozenset(string.punctuation)

_LEADING_INDENT_RE = re.compile(r"^[ \t]+", re.MULTILINE)

WORD_JOINER = "\u2060"
# Where Streamlit's renderer would find a link or an icon in plain text (after backslash escaping):
# a `:` before text (`http://`, `:smile:`, `:blue[`), an `@` (e-mail), `www.` (a bare web address).
_INERT_RE = re.compile(r"(?<=\\:)(?=\S)|(?=\\@)|(?i:(?<=www)(?=\\\.))")
# Where a link or an image would form in Markdown that keeps its syntax (a model's coach reply):
# after `]` before a link target `(` or a reference definition's `:` (anywhere: definitions may sit
# in a blockquote or list item), after `!` before `[`, and where GFM links plain text (a scheme's
# `://`, an e-mail's `@`, `www.`).
_LINK_RE = re.compile(r"(?<=\])(?=\s*[(:])|(?<=!)(?=\[)|(?<=:)(?=//)|(?<=[\w.+-])(?=@)|(?i:(?<=www)(?=\.))")

# Deepest blockquote/list nesting kept in Markdown from a model; deeper markers are shown as text.
MAX_NESTING = 8
_SPACE_RE = re.compile(r"[ \t]*")
_MARKER_RE = re.compile(r">|[-+*](?=[ \t]|$)|[0-9]{1,9}[.)](?=[ \t]|$)")


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
    """Markdown kept readable (bold, lists, code) with raw HTML, images, links and deep nesting defused."""
    source = _LINK_RE.sub(WORD_JOINER, _limit_nesting(replace_unencodable(str(text))))
    # A `<` as an entity can never open raw HTML or an autolink, whatever backslashes precede it.
    return source.replace("<", "&lt;")
