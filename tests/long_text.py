"""Huge answers for the rendering tests and `bench/bench_render.py`: one home for both.

Issue #17: a 300k-character unbroken word and 1 MB of markup-like text froze the detail page and the
review queue for minutes. These records reproduce both, with verified evidence inside and beyond the
part that is rendered inline, so highlights are exercised too.
"""

from __future__ import annotations

import time
from typing import Any

MARKUP_UNIT = "<b>bold</b> *em* [link](http://x.test) `code` ## head\n> quote &amp; <i>x</i> _u_ | a | b |\n"
MEGABYTE = 1_000_000
WORD_CHARS = 300_000


def markup_answer(size: int = MEGABYTE) -> str:
    """About `size` characters of markup-like text (HTML tags, Markdown syntax, entities, newlines)."""
    return (MARKUP_UNIT * (size // len(MARKUP_UNIT) + 1))[:size]


WORD_UNIT = "a_"  # snake_case-like: underscores (emphasis delimiters) made Markdown take minutes


def word_answer(size: int = WORD_CHARS) -> str:
    """One unbroken word of `size` characters (`a_a_a_…`) between two short sentences."""
    return "Start here. " + (WORD_UNIT * (size // len(WORD_UNIT) + 1))[:size] + " The end."


def long_record(snapshot_id: str, answer: str) -> dict[str, Any]:
    """An evaluation of `answer` with evidence at the start and near the end (beyond any inline cap)."""
    head, tail = answer[:10], answer[-9:]
    return {
        "id": snapshot_id,
        "question": "Is this long?",
        "model_answer": answer,
        "product": "acme",
        "language": "en",
        "user_scores": {"clarity": {"score": 2, "reason": "long"}},
        "judge_scores": {"clarity": {"score": 4, "reason": "fine"}},
        "evidence": {
            "clarity": [
                {"quote": head, "start": 0, "end": len(head), "why": "starts", "better": "-"},
                {"quote": tail, "start": len(answer) - len(tail), "end": len(answer), "why": "ends"},
            ]
        },
    }


def time_until_interactive(page: Any, url: str, ready: str, *, timeout_ms: int) -> float:
    """Seconds from navigation until `ready` is visible and the page's main thread answers again.

    Playwright's `evaluate` only returns once the renderer is free, so a frozen page shows up here.
    """
    started = time.perf_counter()
    page.goto(url)
    page.locator(ready).first.wait_for(state="visible", timeout=timeout_ms)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))")
    return time.perf_counter() - started
