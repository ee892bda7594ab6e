"""Tables in headless Chromium at 1400 px: the Evaluations list shows a whole page of rows, and the
columns a reviewer works from (question, gaps, review state) are on screen without scrolling sideways.

The grid draws on a canvas; its accessibility layer lists only the rows and columns in view, which
is exactly what these tests need to count.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from lib.db import init_db
from lib.importer import import_evaluations
from tests.browser.conftest import settle
from tests.test_inspector import record

pytestmark = pytest.mark.browser


def _database(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'tables.db'}"
    engine = init_db(url)
    records = [
        record(
            f"snap_{i:02d}",
            question=f"Question number {i} about a fairly long topic that needs a wide column?\nDetails",
            model_name="a-model-with-a-long-name",
            category="a-category",
            created_at=f"2026-02-01T00:{i:02d}:00Z",
        )
        for i in range(30)
    ]
    with Session(engine) as session:
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
    engine.dispose()
    return url


def test_a_page_of_evaluations_is_shown_whole_with_gaps_and_review_in_view(
    tmp_path, streamlit_app, page
) -> None:
    server = streamlit_app(_database(tmp_path))
    page.goto(f"{server.base_url}/evaluations")
    settle(page)
    grid = page.locator('[data-testid="stDataFrame"]').first
    expect(grid).to_be_visible()
    # The grid fills its accessibility table from the rows it loads after the run: wait for them.
    # 25 rows (OVERRULE_PAGE_SIZE) plus the header: the whole page, not Streamlit's default ten.
    expect(page.locator('[data-testid="stDataFrame"] [role="row"]')).to_have_count(26)
    headers = page.locator('[data-testid="stDataFrame"] [role="columnheader"]')
    shown = [h.strip() for h in headers.all_inner_texts()]
    for column in ("Question", "Max gap", "Weighted gap", "Review", "Reviewed"):
        assert column in shown, shown
    assert "Id" not in shown  # the id is last: off to the right, not in the way
    assert page.dialogs == []  # type: ignore[attr-defined]
