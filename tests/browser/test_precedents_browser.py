"""Precedents in a real browser: an expert reviews an interaction, a later one is matched against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlmodel import select

from lib import importer
from lib.db import init_db, session_scope
from lib.models import AutoEval, ExpertFeedback
from tests.browser.conftest import settle

pytestmark = pytest.mark.browser

CITE = "https://help.acme.test/reset-password"
S1 = "Open Settings and choose Reset password."
S2 = "We email you a link that works for one hour."
QUESTION = 'How do I reset my password? <img src=x onerror=alert("xss")>'


def _import(engine, path: Path, iid: str) -> importer.ImportReport:  # type: ignore[no-untyped-def]
    line = {"id": iid, "product": "acme", "question": QUESTION, "answer": f"{S1} {S2}", "citation_url": CITE}
    path.write_text(json.dumps(line) + "\n")
    return importer.import_path(engine=engine, path=path, kind="interactions", reviewer="cli")


def test_expert_feedback_makes_a_precedent_for_a_later_interaction(streamlit_app, page, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'precedents.db'}"
    engine = init_db(url)
    first = _import(engine, tmp_path / "first.jsonl", "first")
    assert first.evaluation.reasons == {"no_qa_match": 1}  # nothing to match yet
    server = streamlit_app(url)
    try:
        page.goto(f"{server.base_url}/precedents?interaction=first")
        settle(page)
        name = page.get_by_label("Your name (recorded with every change)")
        name.fill("ayse")
        name.press("Enter")
        settle(page)
        expect(page.get_by_text("Enter your name in the sidebar to add an expert review")).to_have_count(0)
        expect(page.get_by_text("Interaction first")).to_be_visible()
        expect(page.get_by_text(S1, exact=True)).to_be_visible()  # each sentence above its score box
        for n, score in ((1, "90"), (2, "70")):
            box = page.get_by_label(f"Score for sentence {n} (0–100)")
            box.fill(score)
            box.press("Tab")
        citation = page.get_by_label("Citation score")
        citation.fill("15")
        citation.press("Tab")
        settle(page)
        page.get_by_role("button", name="Save expert review").click()
        settle(page)
        expect(page.get_by_text("this interaction is now a precedent")).to_be_visible()

        # A later interaction arrives (the CLI import) and is matched against the new precedent.
        later = _import(engine, tmp_path / "later.jsonl", "later")
        assert later.evaluation.matched == 1
        page.goto(f"{server.base_url}/precedents?interaction=later")
        settle(page)
        expect(page.get_by_text("Interaction later")).to_be_visible()
        expect(page.get_by_text("Outcome: matched")).to_be_visible()
        # The metric, not the list's column of the same name.
        expect(page.get_by_test_id("stMetric").filter(has_text="Copied total")).to_contain_text("75")
        body = page.inner_text("body")
    except Exception:
        page.screenshot(path=str(tmp_path / "precedents_failure.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise

    assert "Citation ✅ matches" in body
    assert QUESTION in body  # the question shown literally, its markup never interpreted
    assert page.dialogs == []  # type: ignore[attr-defined]
    with session_scope(engine, read_only=True) as s:
        [review] = s.exec(select(ExpertFeedback).where(ExpertFeedback.type == "expert")).all()
        assert (review.interaction_id, review.reviewer, review.citation_score) == ("first", "ayse", 15)
        row = s.exec(select(AutoEval).where(AutoEval.interaction_id == "later")).one()
        assert (row.has_matches, row.matched_interaction_id, row.total_score) == (True, "first", 75.0)
