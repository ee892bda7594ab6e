"""Safe HTML for a model answer with its verified evidence highlighted, coloured per metric.

The Evaluations page passes this HTML to `st.markdown(..., unsafe_allow_html=True)`, so this module
is the only thing between hostile data (answers, quotes, reasons, metric names) and a reviewer's
browser. The rules it keeps:

- every piece of data is escaped with `html.escape(quote=True)` before any markup is added;
- markup comes only from constants here; colours only from a validated `#rrggbb` palette;
  metric names reach attributes only as `[a-z0-9_-]` slugs;
- no `<script>`, no event-handler attribute, no link of any kind is ever emitted;
- the output holds no literal line break (newlines are `&#10;` / `&#13;` character references), so
  Markdown sees one single HTML block and never re-interprets part of the answer as Markdown.

Colours: pages compute `colors = metric_palette(<the product's metric slugs>)` once and pass it to
both `render_highlighted_answer` and `render_legend`; without it each call picks colours for the
metrics it sees, and two calls with different metric sets may disagree.

Details open on hover (`title`) or click (a `<details>` per evidence in the numbered list after the
answer), without any JavaScript.

Long answers (issue #17): a browser needs minutes to lay out a megabyte of text or a 300k-character
word, so at most `INLINE_CHARS` characters are rendered at once. `answer_parts` cuts an answer into
parts of that size and `render_highlighted_answer(..., window=part)` renders one of them, with the
highlights that fall inside it (clipped at its edges) and the evidence numbers of the whole answer.
The answer's box breaks unbroken runs anywhere (`overflow-wrap:anywhere`), which is all Chromium
needs once a run is no longer than a part.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from html.parser import HTMLParser
from itertools import pairwise

from lib.safe_markdown import replace_unencodable

# Light backgrounds that keep dark text readable (Tailwind's 200 shades).
PALETTE: tuple[str, ...] = (
    "#fde68a",
    "#bfdbfe",
    "#bbf7d0",
    "#fbcfe8",
    "#ddd6fe",
    "#fed7aa",
    "#a5f3fc",
    "#d9f99d",
    "#fecaca",
    "#c7d2fe",
    "#99f6e4",
    "#f5d0fe",
)

# Every tag this module can emit; strip_app_markup rejects anything else.
APP_TAGS: frozenset[str] = frozenset({"div", "mark", "sup", "ol", "li", "details", "summary", "span", "b"})

# Text inside these classes is the app's own (footnote numbers, legend, evidence list), not the answer.
_NON_ANSWER_CLASSES = frozenset({"ov-ref", "ov-notes", "ov-legend"})

_COLOR_RE = re.compile(r"#[0-9a-fA-F]{6}")
_SLUG_BAD_RE = re.compile(r"[^a-z0-9_-]+")
_SCRIPT_SCHEME_RE = re.compile(r"(?i)script(?=\s*:)")
_QUOTE_PREVIEW_CHARS = 160
_TEXT_COLOR = "#111827"
# Characters of text rendered at once (one part); a part renders in well under a second in Chromium.
INLINE_CHARS = 20_000
# A part ends at the last line break or space this close to its limit, so words are rarely cut.
_CUT_LOOKBACK = 200
_TITLE_CHARS = 500  # dark text on light marks, so highlights stay readable in dark theme too


@dataclass(frozen=True)
class Span:
    """One verified evidence position in the answer, in Python `str` indices (code points)."""

    start: int
    end: int
    metric: str
    why: str = ""
    better: str = ""
    quote: str = ""


def esc(value: object) -> str:
    """Escape data for HTML text or a quoted attribute, with line breaks as character references."""
    text = replace_unencodable(str(value))
    # Literal newlines could end Markdown's HTML block (a blank line) and expose the rest as Markdown.
    return escape(text, quote=True).replace("\r", "&#13;").replace("\n", "&#10;")


def defang_attribute(text: str) -> str:
    """A zero-width space after `script` before `:`, so no attribute value ever reads `javascript:`."""
    # A title is never a URL, but defence in depth: if a value is ever copied into a link, it is dead.
    return _SCRIPT_SCHEME_RE.sub(lambda m: m.group(0) + "\u200b", text)


def sanitize_slug(metric: str) -> str:
    """A metric name reduced to `[a-z0-9_-]`, safe inside any attribute whatever the data holds."""
    slug = _SLUG_BAD_RE.sub("-", str(metric).lower()).strip("-")
    return slug or "metric"


def metric_palette(slugs: Sequence[str]) -> dict[str, str]:
    """A stable light colour per metric: same set of metrics, same colours, whatever their order."""
    colors: dict[str, str] = {}
    used: set[int] = set()
    for slug in sorted(set(slugs)):
        # hashlib, not hash(): Python's string hash changes between processes.
        home = int.from_bytes(hashlib.blake2s(slug.encode("utf-8", "surrogatepass")).digest()[:4], "big")
        home %= len(PALETTE)
        index = home
        if len(used) < len(PALETTE):
            while index in used:
                index = (index + 1) % len(PALETTE)
        used.add(index)
        colors[slug] = PALETTE[index]
    return colors


def valid_spans(answer: str, spans: Sequence[Span]) -> list[Span]:
    """The spans that can be highlighted, clamped to the answer and in reading order (= their numbers)."""
    length = len(answer)
    kept: list[tuple[int, int, int, Span]] = []
    for order, span in enumerate(spans):
        start, end = span.start, span.end
        # Data may carry None, floats or bools where ints belong; such spans are skipped, not fatal.
        if type(start) is not int or type(end) is not int:
            continue
        start, end = min(max(start, 0), length), min(max(end, 0), length)
        if start >= end:
            continue
        kept.append((start, -end, order, Span(start, end, span.metric, span.why, span.better, span.quote)))
    kept.sort(key=lambda item: item[:3])
    return [item[3] for item in kept]


def answer_parts(text: str, size: int = INLINE_CHARS) -> list[tuple[int, int]]:
    """`(start, end)` of each part of `text`: at most `size` characters, cut after a break when one is near."""
    if size <= 0:
        raise ValueError("size must be positive")
    parts: list[tuple[int, int]] = []
    start, length = 0, len(text)
    while True:
        end = min(start + size, length)
        if end < length:
            floor = max(start + 1, end - _CUT_LOOKBACK)
            cut = max(text.rfind("\n", floor, end), text.rfind(" ", floor, end))
            if cut >= floor:
                end = cut + 1
        parts.append((start, end))
        if end >= length:
            return parts
        start = end


def clip_text(text: str, limit: int = INLINE_CHARS) -> str:
    """`text` cut to `limit` characters plus a note of what is left: quotes and reasons shown inline."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters]"


def _resolve_colors(metrics: Sequence[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    """Caller colours where they are valid `#rrggbb`, palette colours for everything else."""
    resolved = metric_palette(metrics)
    for metric in metrics:
        candidate = (colors or {}).get(metric)
        if isinstance(candidate, str) and _COLOR_RE.fullmatch(candidate):
            resolved[metric] = candidate.lower()
    return resolved


def _label(metric: str, labels: Mapping[str, str] | None) -> str:
    """Display name for a metric; the raw name when no label is known (escaped by the caller)."""
    label = (labels or {}).get(metric)
    return str(label) if label else str(metric)


def _background(colors: Sequence[str]) -> str:
    """One colour, or diagonal stripes of every overlapping metric's colour."""
    if len(colors) == 1:
        return colors[0]
    stops = ", ".join(f"{color} {i * 6}px {(i + 1) * 6}px" for i, color in enumerate(colors))
    return f"repeating-linear-gradient(135deg, {stops})"


def _span_title(number: int, span: Span, labels: Mapping[str, str] | None) -> str:
    """Hover text for one span: `[n] Metric: why — Better: better` (unescaped)."""
    text = f"[{number}] {_label(span.metric, labels)}"
    # Repeated on every segment the span covers, so kept short; the full text is in the list below.
    if span.why:
        text += f": {clip_text(span.why, _TITLE_CHARS)}"
    if span.better:
        text += f" — Better: {clip_text(span.better, _TITLE_CHARS)}"
    return text


def _swatch(color: str) -> str:
    """A small colour square; `color` has already been validated."""
    return (
        f'<span class="ov-swatch" style="display:inline-block;width:0.8em;height:0.8em;'
        f'margin-right:0.3em;border-radius:2px;vertical-align:middle;background:{color};"></span>'
    )


def render_highlighted_answer(
    answer: str,
    spans: Sequence[Span],
    colors: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    *,
    notes: bool = True,
    window: tuple[int, int] | None = None,
) -> str:
    """HTML of the answer with each evidence span highlighted and a numbered, click-to-open list after it.

    With `window=(start, end)` only that part of the answer is shown (see `answer_parts`), spans
    clipped to it; evidence numbers and the list after it stay those of the whole answer.
    """
    kept = valid_spans(answer, spans)
    numbered = list(enumerate(kept, start=1))
    palette = _resolve_colors([span.metric for span in kept], colors)
    low, high = (0, len(answer)) if window is None else window
    low, high = min(max(low, 0), len(answer)), min(max(high, 0), len(answer))
    high = max(low, high)

    boundaries = sorted(
        {low, high}
        | {min(max(s.start, low), high) for s in kept}
        | {min(max(s.end, low), high) for s in kept}
    )
    starts_at: dict[int, list[int]] = {}
    ends_at: dict[int, list[int]] = {}
    for number, span in numbered:
        if span.end <= low or span.start >= high:
            continue  # entirely in another part
        starts_at.setdefault(max(span.start, low), []).append(number)
        # A span running on into the next part gets its footnote number where it really ends.
        if span.end <= high:
            ends_at.setdefault(span.end, []).append(number)

    # Sweep the boundaries once, keeping the open spans, so many spans stay linear-ish, not quadratic.
    active: set[int] = set()
    parts: list[str] = []
    for left, right in pairwise(boundaries):
        active.difference_update(ends_at.get(left, ()))
        active.update(starts_at.get(left, ()))
        text = esc(answer[left:right])
        covering = [numbered[n - 1] for n in sorted(active)]
        if not covering:
            parts.append(text)
        else:
            metrics = list(dict.fromkeys(s.metric for _, s in covering))
            slugs = " ".join(dict.fromkeys(sanitize_slug(m) for m in metrics))
            refs = " ".join(str(n) for n, _ in covering)
            title = "\n".join(_span_title(n, s, labels) for n, s in covering)
            background = _background([palette[m] for m in metrics])
            parts.append(
                f'<mark class="ov-ev" data-metrics="{slugs}" data-refs="{refs}" '
                f'style="background:{background};color:{_TEXT_COLOR};padding:0 1px;border-radius:2px;" '
                f'title="{esc(defang_attribute(title))}">{text}</mark>'
            )
        if notes:
            for number in ends_at.get(right, []):
                parts.append(
                    f'<sup class="ov-ref" style="font-size:0.7em;opacity:0.7;unicode-bidi:isolate;">{number}</sup>'
                )

    html = (
        '<div class="ov-highlight">'
        '<div class="ov-answer" style="white-space:pre-wrap;overflow-wrap:anywhere;">'
        f"{''.join(parts)}</div>"
    )
    if notes and numbered:
        html += _render_notes(answer, numbered, palette, labels)
    return html + "</div>"


def _render_notes(
    answer: str,
    numbered: Sequence[tuple[int, Span]],
    palette: Mapping[str, str],
    labels: Mapping[str, str] | None,
) -> str:
    """The numbered evidence list: click a row to see the metric's `why` and `better`."""
    items: list[str] = []
    for number, span in numbered:
        # A one-line preview: the full text, newlines and all, is highlighted in the answer above.
        quote = " ".join(answer[span.start : span.end].split())
        if len(quote) > _QUOTE_PREVIEW_CHARS:
            quote = quote[:_QUOTE_PREVIEW_CHARS] + "…"
        body = ""
        if span.why:
            body += f'<div class="ov-why"><b>Why:</b> {esc(clip_text(span.why))}</div>'
        if span.better:
            body += f'<div class="ov-better"><b>Better:</b> {esc(clip_text(span.better))}</div>'
        if not body:
            body = '<div class="ov-why">No reason given.</div>'
        items.append(
            f'<li value="{number}" data-metric="{sanitize_slug(span.metric)}"><details>'
            # bidi isolation: an RTL override in a label or quote must not reorder the rest of the row.
            f"<summary>{_swatch(palette[span.metric])}"
            f'<b style="unicode-bidi:isolate;">{esc(_label(span.metric, labels))}</b> '
            f'<span class="ov-quote" style="unicode-bidi:isolate;">“{esc(quote)}”</span></summary>'
            f'<div style="white-space:pre-wrap;margin:0.2em 0 0.4em 1.1em;">{body}</div></details></li>'
        )
    return f'<ol class="ov-notes" style="margin-top:0.6em;font-size:0.9em;">{"".join(items)}</ol>'


def render_legend(
    metrics: Sequence[str], colors: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None
) -> str:
    """A one-line key of metric colours (use the same `colors` as the answer), readable at a glance."""
    unique = list(dict.fromkeys(metrics))
    palette = _resolve_colors(unique, colors)
    items = "".join(
        f'<span class="ov-legend-item" data-metric="{sanitize_slug(m)}" style="margin-right:1em;">'
        f'{_swatch(palette[m])}<span style="unicode-bidi:isolate;">{esc(_label(m, labels))}</span></span>'
        for m in unique
    )
    return f'<div class="ov-legend">{items}</div>'


class _AnswerTextExtractor(HTMLParser):
    """Collects the answer's text from rendered HTML, refusing any tag the app does not emit."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self._stack: list[bool] = []  # per open element: is it (inside) app-only text?

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in APP_TAGS:
            raise ValueError(f"tag not emitted by the app: <{tag}>")
        classes = set((dict(attrs).get("class") or "").split())
        inherited = self._stack[-1] if self._stack else False
        self._stack.append(inherited or bool(classes & _NON_ANSWER_CLASSES))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raise ValueError(f"self-closing tag not emitted by the app: <{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        if tag not in APP_TAGS or not self._stack:
            raise ValueError(f"unexpected end tag: </{tag}>")
        self._stack.pop()

    def handle_data(self, data: str) -> None:
        if not (self._stack and self._stack[-1]):
            self.chunks.append(data)

    def handle_comment(self, data: str) -> None:
        raise ValueError("comment not emitted by the app")

    def handle_decl(self, decl: str) -> None:
        raise ValueError("declaration not emitted by the app")

    def handle_pi(self, data: str) -> None:
        raise ValueError("processing instruction not emitted by the app")

    def unknown_decl(self, data: str) -> None:
        raise ValueError("declaration not emitted by the app")


def strip_app_markup(html: str) -> str:
    """The answer text back out of rendered HTML (app tags removed, entities unescaped), for tests."""
    parser = _AnswerTextExtractor()
    parser.feed(html)
    parser.close()
    return "".join(parser.chunks)
