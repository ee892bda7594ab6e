"""Precedents in a real browser: an expert reviews an interaction, a later one is matched against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlmodel import select

from lib import importer
from lib.db import init_db, session_scope
from lib.models import AutoEval, ExpertFeedback

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
        page.goto(server.base_url)
        page.get_by_text("Your name (recorded with every change)").wait_for(timeout=30_000)
        page.goto(f"{server.base_url}/precedents?interaction=first")
        name = page.get_by_label("Your name (recorded with every change)")
        name.wait_for(timeout=30_000)
        name.fill("ayse")
        name.press("Enter")
        page.get_by_text("Enter your name in the sidebar to add an expert review").wait_for(
            state="hidden", timeout=30_000
        )
        page.get_by_text("Interaction first").wait_for(timeout=30_000)
        page.get_by_text(S1, exact=True).wait_for(timeout=30_000)  # each sentence above its score box
        for n, score in ((1, "90"), (2, "70")):
            box = page.get_by_label(f"Score for sentence {n} (0–100)")
            box.fill(score)
            box.press("Tab")
        citation = page.get_by_label("Citation score")
        citation.fill("15")
        citation.press("Tab")
        page.get_by_role("button", name="Save expert review").click()
        page.get_by_text("this interaction is now a precedent").wait_for(timeout=30_000)

        # A later interaction arrives (the CLI import) and is matched against the new precedent.
        later = _import(engine, tmp_path / "later.jsonl", "later")
        assert later.evaluation.matched == 1
        page.goto(f"{server.base_url}/precedents?interaction=later")
        page.get_by_text("Interaction later").wait_for(timeout=30_000)
        page.get_by_text("Outcome: matched").wait_for(timeout=30_000)
        page.get_by_text("Copied total").wait_for(timeout=30_000)
        # The match trace streams in after the metrics: wait for its last part before reading.
        page.get_by_text("Citation ✅ matches").wait_for(timeout=30_000)
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
