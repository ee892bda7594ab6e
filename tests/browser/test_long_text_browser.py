"""Issue #17 in headless Chromium: huge answers are shown a part at a time on the detail page and the
review queue (what keeps them responsive; bench/bench_render.py measures the time), with highlights
and the full text still reachable; text from data never becomes a link or an icon.

One database (both huge answers and the inert one) and one server serve the module; the tests only
read (no reviewer name is set, so the queue reserves nothing), and each opens its own evaluation.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from lib.db import init_db
from lib.highlight import INLINE_CHARS, answer_parts
from lib.importer import import_evaluations
from lib.models import Judgment
from lib.review_queue import item_key
from tests.browser.conftest import StreamlitServer, settle
from tests.long_text import long_record, markup_answer, word_answer

pytestmark = pytest.mark.browser


ANSWERS = {"markup": markup_answer(), "word": word_answer()}


def _database(folder: Path, records: list[dict]) -> str:
    url = f"sqlite:///{folder / 'long.db'}"
    engine = init_db(url)
    with Session(engine) as session:
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
    engine.dispose()
    return url


def _open(page, url: str) -> float:  # type: ignore[no-untyped-def]
    """Open `url` and wait until the app has drawn it; the seconds it took (printed, not asserted)."""
    started = time.perf_counter()
    page.goto(url)
    settle(page)
    return time.perf_counter() - started


def _queue_link(snapshot_id: str) -> str:
    """The review queue showing this evaluation (the address the queue gives it)."""
    return "/review?" + urlencode({"item": item_key(Judgment(snapshot_id=snapshot_id))})


@pytest.mark.parametrize("kind", ["markup", "word"], ids=["1MB-markup", "300k-word"])
def test_huge_answer_shows_one_part_on_detail_and_queue_with_highlights_and_full_text(
    server, page, kind: str
) -> None:
    """Only one part of the answer is in the page at a time (the cap that keeps these pages fast;
    bench/bench_render.py measures how fast), with its highlights; the rest is a part number or a
    download away. Times are printed for the record, never asserted."""
    answer = ANSWERS[kind]
    parts = answer_parts(answer)

    seconds = _open(page, f"{server.base_url}/evaluations?snapshot=big_{kind}")
    print(f"\ndetail page, {len(answer):,} characters: drawn after {seconds:.2f} s")
    expect(page.locator(".st-key-evaluations_card_0")).to_be_visible()
    shown = page.locator(".st-key-evaluations_answer_text .ov-answer")
    # Part 1 only (at most INLINE_CHARS), with evidence 1's footnote number after its 10 characters.
    assert parts[0][1] <= INLINE_CHARS
    assert shown.inner_text() == answer[:10] + "1" + answer[10 : parts[0][1]]
    # Evidence 1 is at the start: highlighted in part 1. Evidence 2 is at the very end: in the last part.
    assert page.locator(".st-key-evaluations_answer_text mark.ov-ev").first.get_attribute("data-refs") == "1"
    part = page.locator(".st-key-evaluations_answer_part input")
    part.fill(str(len(parts)))
    part.press("Enter")
    settle(page)
    last = page.locator('.st-key-evaluations_answer_text mark.ov-ev[data-refs="2"]')
    expect(last).to_be_visible()
    assert last.inner_text() == answer[-9:]
    start, end = parts[-1]
    assert shown.inner_text() == answer[start:end] + "2"  # the part, then evidence 2's footnote number
    # The full text, byte for byte, is one click away.
    with page.expect_download() as info:
        page.locator(".st-key-evaluations_answer_download button").click()
    assert Path(info.value.path()).read_text(encoding="utf-8") == answer
    # "Show all at once" renders the whole text (slower, the reviewer's choice), both highlights in it.
    started = time.perf_counter()
    page.locator(".st-key-evaluations_answer_all label").click()
    settle(page)
    expect(page.locator('.st-key-evaluations_answer_text mark.ov-ev[data-refs="1"]')).to_be_visible()
    print(f"detail page, show all: {time.perf_counter() - started:.2f} s")
    assert len(shown.inner_text()) == len(answer) + 2  # and the two footnote numbers
    assert page.get_by_text("created with a default value").count() == 0

    seconds = _open(page, f"{server.base_url}{_queue_link(f'big_{kind}')}")
    print(f"review queue, {len(answer):,} characters: drawn after {seconds:.2f} s")
    expect(page.locator(".st-key-review_skip")).to_be_visible()
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


@pytest.fixture(scope="module")
def server(module_app, tmp_path_factory: pytest.TempPathFactory) -> StreamlitServer:
    records = [*(long_record(f"big_{kind}", answer) for kind, answer in ANSWERS.items()), _inert_record()]
    return module_app(_database(tmp_path_factory.mktemp("long"), records))


def test_urls_emails_and_shortcodes_from_data_read_literally(server, page) -> None:
    for path, ready in (
        ("/evaluations?snapshot=inert", ".st-key-evaluations_card_0"),
        (_queue_link("inert"), ".st-key-review_skip"),
    ):
        page.goto(server.base_url + path)
        settle(page)
        expect(page.locator(ready)).to_be_visible()
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
