"""The review flow in a real browser: open the queue, overrule a judgment, see it on the Corrections page."""

from __future__ import annotations

import re

import pytest
from sqlmodel import select

from lib.db import init_db, session_scope
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent

pytestmark = pytest.mark.browser

REASON = 'Rambles first <img src=x onerror=alert("xss")>'


def test_overrule_in_the_queue_then_see_it_in_the_judges_history(streamlit_app, page, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'review.db'}"
    engine = init_db(url)
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id="snap_browser",
                question="What is the capital of France?",
                model_answer="Well, there are many cities. Paris.",
                product="acme",
                user_scores_json={"clarity": {"score": 2}},
            )
        )
        s.flush()
        judgment = Judgment(
            change_id="snap_browser:clarity",
            product="acme",
            metric="clarity",
            snapshot_id="snap_browser",
            decision="4",
        )
        s.add(judgment)
        s.flush()
        judgment_id = judgment.id
    server = streamlit_app(url)
    try:
        # Load the router first: on a fresh server, Streamlit 1.67 serves a deep link from its
        # legacy pages/ mode (no app.py, no sidebar) until app.py has called st.navigation once.
        page.goto(server.base_url)
        page.get_by_text("Your name (recorded with every change)").wait_for(timeout=30_000)
        page.goto(f"{server.base_url}/review")
        name = page.get_by_label("Your name (recorded with every change)")
        name.wait_for(timeout=30_000)
        name.fill("ayse")
        name.press("Enter")
        # The rerun with the name is over once the page stops asking for it.
        page.get_by_text("Enter your name in the sidebar to review").wait_for(state="hidden", timeout=30_000)
        page.get_by_text("Evaluation snap_browser").first.wait_for(timeout=30_000)
        page.get_by_text("0 of 1 reviewed").first.wait_for(timeout=30_000)

        score = page.get_by_label("Your score (1–5)")
        score.fill("2")
        score.press("Tab")
        page.get_by_label("Reason (required when overruling)").fill(REASON)
        page.get_by_role("button", name=re.compile(r"^Overrule")).click()
        # The queue moves on (the success flash may already be gone by the next rerun).
        page.get_by_text("Nothing left to review with these filters").wait_for(timeout=30_000)

        page.goto(f"{server.base_url}/corrections")
        block = page.get_by_test_id("stCode")
        block.get_by_text("[CORRECTED] snap_browser:clarity").wait_for(timeout=30_000)
        text = block.inner_text()
    except Exception:
        page.screenshot(path=str(tmp_path / "review_flow_failure.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise

    assert "Reviewer's decision: 2 | Reviewer's reason: " + REASON in text  # shown literally
    assert page.dialogs == []  # type: ignore[attr-defined]  # the reason's markup never ran
    with session_scope(engine, read_only=True) as s:
        stored = s.get(Judgment, judgment_id)
        assert stored is not None and (stored.user_decision, stored.reviewer, stored.version) == (
            "2",
            "ayse",
            2,
        )
        assert len(s.exec(select(JudgmentEvent)).all()) == 1
    engine.dispose()
