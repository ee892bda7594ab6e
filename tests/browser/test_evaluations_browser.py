"""The Evaluations page in headless Chromium: hostile data is highlighted as text and never runs;
the CSV download holds exactly the filtered rows.

One database (the hostile evaluation and 40 plain ones) and one server serve the module; the tests
only read.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from lib.db import init_db
from lib.importer import import_evaluations
from tests.browser.conftest import StreamlitServer, settle

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
ANSWER = f"Intro {SCRIPT} middle {IMG} end."

pytestmark = pytest.mark.browser


def _database(folder: Path, records: list[dict]) -> str:
    url = f"sqlite:///{folder / 'browser.db'}"
    engine = init_db(url)
    with Session(engine) as session:
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
    engine.dispose()
    return url


def _hostile_record() -> dict:
    return {
        "id": "snap_xss",
        "question": f"Is this safe? {IMG}",
        "model_answer": ANSWER,
        "product": "acme",
        "model_name": SCRIPT,
        "overall_feedback": f"{SCRIPT} [x](javascript:alert(4))",
        "user_scores": {"clarity": {"score": 2, "reason": IMG}, "safety": 1},
        "judge_scores": {"clarity": {"score": 4, "reason": SCRIPT}, "safety": 5},
        "evidence": {
            "clarity": [{"quote": SCRIPT, "start": 6, "end": 6 + len(SCRIPT), "why": IMG, "better": SCRIPT}],
            # Positions off on purpose: found by the substring stage.
            "safety": [
                {"quote": IMG, "start": 0, "end": 3, "why": "<b onmouseover=alert(5)>x</b>", "better": "-"}
            ],
        },
    }


def _plain_records() -> list[dict]:
    """40 evaluations, every third of product beta (14), for the filtered download."""
    return [
        {
            "id": f"s{i:02d}",
            "question": f"Q{i}",
            "model_answer": "A",
            "product": "beta" if i % 3 == 0 else "acme",
            "created_at": f"2025-03-01T00:{i:02d}:00Z",
            "user_scores": {"clarity": 3},
            "judge_scores": {"clarity": 4},
        }
        for i in range(40)
    ]


@pytest.fixture(scope="module")
def server(module_app, tmp_path_factory: pytest.TempPathFactory) -> StreamlitServer:
    url = _database(tmp_path_factory.mktemp("evaluations"), [_hostile_record(), *_plain_records()])
    return module_app(url, OVERRULE_PAGE_SIZE="5")


def test_hostile_answer_and_evidence_are_highlighted_as_text_and_never_run(server, page) -> None:
    page.goto(f"{server.base_url}/evaluations?snapshot=snap_xss")
    settle(page)
    marks = page.locator("mark.ov-ev")

    assert marks.count() == 2
    assert [marks.nth(i).inner_text() for i in range(2)] == [SCRIPT, IMG]
    assert marks.nth(0).get_attribute("data-metrics") == "clarity"
    assert marks.nth(1).get_attribute("data-metrics") == "safety"
    assert IMG in marks.nth(0).get_attribute("title")
    # Give any injected handler the chance to fire: hover the highlights, open the evidence notes.
    marks.nth(1).hover()
    page.locator(".ov-notes summary").first.click()
    settle(page)  # handlers run on the events themselves; the page is also done with any rerun

    assert page.dialogs == []
    injected = page.evaluate(
        """() => ({
            scripts: [...document.querySelectorAll('script')].filter(s => s.textContent.includes('alert')).length,
            imgs: document.querySelectorAll('img[src="x"]').length,
            handlers: [...document.querySelectorAll('*')].filter(
                el => [...el.attributes].some(a => a.name.startsWith('on'))).length,
            jsLinks: [...document.querySelectorAll('a')].filter(a => /^\\s*javascript:/i.test(a.href)).length,
        })"""
    )
    assert injected == {"scripts": 0, "imgs": 0, "handlers": 0, "jsLinks": 0}
    # The payloads are visible as text wherever they are shown
    # (twice: the page title is the question's first line, then the question itself).
    assert page.get_by_text(f"Is this safe? {IMG}").count() == 2
    # A disabled page link with a tooltip keeps a hidden twin in the DOM: count the visible one.
    assert page.locator('a[href*="coach?snapshot=snap_xss"]:visible').count() == 1


def test_csv_download_holds_every_filtered_row(server, page) -> None:
    page.goto(f"{server.base_url}/evaluations?product=beta")
    settle(page)
    # Served by serve.py, the download is a streamed link (lib.downloads), not a button holding bytes.
    link = page.get_by_role("link", name="Download CSV (all 14 matches)")
    expect(link).to_be_visible()
    href = link.get_attribute("href")
    assert href is not None and href.startswith("/downloads/")
    response = page.request.get(f"{server.base_url}{href}")
    assert response.status == 200
    assert response.headers["content-disposition"] == 'attachment; filename="evaluations_wide.csv"'
    rows = list(csv.DictReader(io.StringIO(response.text())))

    assert [r["id"] for r in rows] == [f"s{i:02d}" for i in range(39, -1, -1) if i % 3 == 0]
    assert {r["product"] for r in rows} == {"beta"}
    assert page.dialogs == []
