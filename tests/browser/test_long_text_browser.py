"""Issue #17 in headless Chromium: huge answers keep the detail page and the review queue responsive,
with highlights and the full text still reachable; text from data never becomes a link or an icon."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from sqlmodel import Session

from lib.db import init_db
from lib.highlight import INLINE_CHARS, answer_parts
from lib.importer import import_evaluations
from tests.long_text import long_record, markup_answer, time_until_interactive, word_answer

pytestmark = pytest.mark.browser

# Generous: a part renders in about a second; before the cap these pages took minutes.
INTERACTIVE_MS = 15_000


def _database(tmp_path: Path, records: list[dict]) -> str:
    url = f"sqlite:///{tmp_path / 'long.db'}"
    engine = init_db(url)
    with Session(engine) as session:
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
    engine.dispose()
    return url


@pytest.mark.parametrize("answer", [markup_answer(), word_answer()], ids=["1MB-markup", "300k-word"])
def test_huge_answer_renders_quickly_on_detail_and_queue_with_highlights_and_full_text(
    tmp_path, streamlit_app, page, answer: str
) -> None:
    server = streamlit_app(_database(tmp_path, [long_record("big", answer)]))
    parts = answer_parts(answer)

    seconds = time_until_interactive(
        page,
        f"{server.base_url}/evaluations?snapshot=big",
        ".st-key-evaluations_card_0",
        timeout_ms=INTERACTIVE_MS,
    )
    print(f"\ndetail page, {len(answer):,} characters: interactive after {seconds:.2f} s")
    shown = page.locator(".st-key-evaluations_answer_text .ov-answer")
    # Part 1 only (at most INLINE_CHARS), with evidence 1's footnote number after its 10 characters.
    assert parts[0][1] <= INLINE_CHARS
    assert shown.inner_text() == answer[:10] + "1" + answer[10 : parts[0][1]]
    # Evidence 1 is at the start: highlighted in part 1. Evidence 2 is at the very end: in the last part.
    assert page.locator(".st-key-evaluations_answer_text mark.ov-ev").first.get_attribute("data-refs") == "1"
    part = page.locator(".st-key-evaluations_answer_part input")
    part.fill(str(len(parts)))
    part.press("Enter")
    last = page.locator('.st-key-evaluations_answer_text mark.ov-ev[data-refs="2"]')
    last.wait_for(state="visible", timeout=INTERACTIVE_MS)
    assert last.inner_text() == answer[-9:]
    start, end = parts[-1]
    assert shown.inner_text() == answer[start:end] + "2"  # the part, then evidence 2's footnote number
    # The full text, byte for byte, is one click away.
    with page.expect_download(timeout=30_000) as info:
        page.locator(".st-key-evaluations_answer_download button").click()
    assert Path(info.value.path()).read_text(encoding="utf-8") == answer
    # "Show all at once" renders the whole text (slower, the reviewer's choice), both highlights in it.
    started = time.perf_counter()
    page.locator(".st-key-evaluations_answer_all label").click()
    page.locator('.st-key-evaluations_answer_text mark.ov-ev[data-refs="1"]').wait_for(timeout=60_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))")
    print(f"detail page, show all: {time.perf_counter() - started:.2f} s")
    assert len(shown.inner_text()) == len(answer) + 2  # and the two footnote numbers
    assert page.get_by_text("created with a default value").count() == 0

    seconds = time_until_interactive(
        page, f"{server.base_url}/review", ".st-key-review_skip", timeout_ms=INTERACTIVE_MS
    )
    print(f"review queue, {len(answer):,} characters: interactive after {seconds:.2f} s")
    queue_text = page.locator(".st-key-review_answer_text .ov-answer").inner_text()
    # The queue shows part 1 with the same highlights as the detail view (issue 15).
    assert queue_text == answer[:10] + "1" + answer[10 : parts[0][1]]
    assert page.locator(".st-key-review_answer_text mark.ov-ev").first.get_attribute("data-refs") == "1"
    assert page.dialogs == []


INERT = "Visit https://evil.test/a, www.evil.test or mail me@evil.test — I :smile: at :streamlit: :blue[x]"


def _inert_record() -> dict:
    record = long_record("inert", f"Answer: {INERT}")
    record.update(
        question=f"Question: {INERT}",
        overall_feedback=f"Feedback: {INERT}",
        user_scores={"clarity": {"score": 2, "reason": f"Reason: {INERT}"}},
    )
    # Evidence 1 ends before the URL, so its footnote number does not split the sentence.
    record["evidence"]["clarity"][0].update(
        quote="Answer:", end=7, why=f"Why: {INERT}", better=f"Better: {INERT}"
    )
    return record


def test_urls_emails_and_shortcodes_from_data_read_literally(tmp_path, streamlit_app, page) -> None:
    server = streamlit_app(_database(tmp_path, [_inert_record()]))
    for path, ready in (
        ("/evaluations?snapshot=inert", ".st-key-evaluations_card_0"),
        ("/review", ".st-key-review_skip"),
    ):
        page.goto(server.base_url + path)
        page.locator(ready).wait_for(state="visible", timeout=30_000)
        page.wait_for_timeout(500)
        main = page.locator("section.stMain, [data-testid='stMain']").first
        found = main.evaluate(
            """el => ({
                links: [...el.querySelectorAll('a')].map(a => a.href).filter(h => /evil|mailto/.test(h)),
                images: el.querySelectorAll('img').length,
                text: el.innerText.replaceAll('\\u2060', ''),
            })"""
        )
        assert found["links"] == [], path
        assert found["images"] == 0, path
        assert "😄" not in found["text"], path
        # Each field shows the text exactly as written (word joiners are invisible).
        shown = len(re.findall(re.escape(INERT), found["text"]))
        assert shown >= (5 if path.startswith("/evaluations") else 2), (path, found["text"][:2000])
