"""The alignment lab in a real browser: start a small experiment, watch it finish, see the comparison."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from lib.db import init_db, session_scope
from lib.models import AlignmentExperiment
from tests.browser.conftest import open_in_app, settle
from tests.test_alignment import scripted_judge, seed_lab
from tests.waiting import wait_until

pytestmark = pytest.mark.browser


def test_start_a_small_experiment_and_see_the_comparison(streamlit_app, page, tmp_path, llm_server) -> None:
    url = f"sqlite:///{tmp_path / 'align.db'}"
    engine = init_db(url)
    seed_lab(engine)
    llm_server.responder = scripted_judge
    server = streamlit_app(url, OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="test")

    page.goto(f"{server.base_url}/alignment")
    try:
        settle(page)
        name = page.get_by_label("Your name (recorded with every change)")
        name.fill("lena")
        name.press("Enter")
        settle(page)
        size = page.get_by_label("Sample size")
        size.fill("14")
        size.press("Enter")
        settle(page)
        page.get_by_role("button", name="Start").click()
        settle(page)
        expect(page.get_by_text("Experiment 1 started.")).to_be_visible()

        def finished() -> bool:  # the run is a thread in the server: its row says when it is done
            with session_scope(engine, read_only=True) as session:
                experiment = session.get(AlignmentExperiment, 1)
                return experiment is not None and experiment.status == "finished"

        wait_until(finished, "experiment 1 to finish")
        # The Analytics page links the latest experiment of each product back here: the finished
        # experiment is seen through that link (pages opened in the app: no reload of the scripts).
        open_in_app(page, "analytics")
        page.get_by_role("link", name="Latest alignment experiment for lab (#1)").click()
        page.wait_for_url("**/alignment?experiment=1")
        settle(page)
        expect(page.get_by_text("28 calls done, 0 failed, 0 pending (finished)")).to_be_visible()
        expect(page.get_by_role("heading", name="Comparison")).to_be_visible()
        expect(page.get_by_text("Against bare: flipped items")).to_be_visible()
        assert not page.dialogs
    except Exception:
        page.screenshot(path=str(tmp_path / "alignment_fail.png"), full_page=True)
        print("log:", server.log_path.read_text()[-3000:])
        raise
    finally:
        engine.dispose()
