"""The Team queues page under AppTest (issue 26): a lead creates a queue over a filter with a
preview, follows its progress per queue and per reviewer, decides what awaits adjudication with every
label side by side, assigns and closes; a viewer reads and writes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import col, select
from streamlit.testing.v1 import AppTest

from lib import queues
from lib.config import reset_settings
from lib.db import session_scope
from lib.models import Judgment, ReviewQueue, ReviewQueueJudgment
from lib.queues import LabelInput
from tests.pages.conftest import APPTEST_TIMEOUT, ROOT, signed_in
from tests.pages.test_admin import AUTH
from tests.pages.test_review import evaluation, plain
from tests.pages.test_review_team import create

PAGE = "pages/queues.py"


def said(elements) -> list[str]:
    return [plain(e.value) for e in elements]


def label_all(engine: Engine, queue_id: int, reviewer: str, decisions: dict[int, str], reason: str) -> None:
    """`reviewer` takes their next item and labels every judgment of it."""
    with session_scope(engine) as s:
        held = queues.next_assignment(session=s, queue_id=queue_id, reviewer=reviewer)
        assert held is not None
        queues.label_item(
            session=s, queue_id=queue_id, item_id=held.item_id, reviewer=reviewer,
            labels=[LabelInput(judgment_id=j, decision=d, reason=reason) for j, d in decisions.items()],
        )  # fmt: skip


def disputed_queue(engine: Engine) -> tuple[int, dict[str, int]]:
    """A queue with overlap 2 whose one item ayse and ben labelled: they agree on safety (the judge's
    5) and disagree on clarity (2 against 4)."""
    ids = evaluation(engine, "s0")
    evaluation(engine, "s1", hours=1)
    queue = create(engine, name="Week 12", overlap=2)
    label_all(engine, queue, "ayse", {ids["clarity"]: "2", ids["safety"]: "5"}, "Hard to follow")
    label_all(engine, queue, "ben", {ids["clarity"]: "4", ids["safety"]: "5"}, "Clear enough")
    return queue, ids


def test_without_a_queue_the_page_says_how_to_start(app_engine, open_page) -> None:
    at = open_page(PAGE, reviewer="lead")
    assert any("No team queue yet" in t for t in said(at.info))
    assert not at.exception


def test_a_lead_creates_a_queue_over_a_filter_after_a_preview(app_engine, open_page) -> None:
    evaluation(app_engine, "a0", product="acme")
    evaluation(app_engine, "a1", product="acme", hours=1)
    evaluation(app_engine, "b0", product="beta")
    at = open_page(PAGE, reviewer="lead", query={"tab": "new"})
    assert at.button(key="queues_new_create").disabled  # a queue needs a name
    at.selectbox(key="queues_new_product").set_value("acme").run()
    assert any("2 items match (4 judgments" in t for t in said(at.info)), said(at.info)
    at.text_input(key="queues_new_name").input("Acme blind").run()
    at.number_input(key="queues_new_size").set_value(1).run()
    at.number_input(key="queues_new_overlap").set_value(2).run()
    at.radio(key="queues_new_mode").set_value("blind").run()
    assert any("The queue takes 1 of them" in t for t in said(at.info))
    at.button(key="queues_new_create").click().run()
    with session_scope(app_engine, read_only=True) as s:
        made = s.exec(select(ReviewQueue)).one()
        held = s.exec(select(ReviewQueueJudgment.judgment_id)).all()
        products = {s.get(Judgment, j).product for j in held}
    assert (made.name, made.product, made.size, made.overlap, made.mode, made.items) == (
        "Acme blind", "acme", 1, 2, "blind", 1,
    )  # fmt: skip
    assert made.created_by == "lead" and products == {"acme"} and len(held) == 2
    assert any("Created Acme blind: 1 items (2 judgments)" in t for t in said(at.success))
    assert not at.exception


def test_a_spec_that_matches_nothing_cannot_be_created(app_engine, open_page) -> None:
    evaluation(app_engine, "a0")
    at = open_page(PAGE, reviewer="lead", query={"tab": "new"})
    at.text_input(key="queues_new_name").input("Reviewed only").run()
    at.selectbox(key="queues_new_review_state").set_value("corrected").run()
    assert any("No judgments match" in t for t in said(at.warning))
    assert at.button(key="queues_new_create").disabled
    assert not at.exception


def test_progress_per_queue_and_per_reviewer_with_csv(app_engine, open_page) -> None:
    queue, _ = disputed_queue(app_engine)
    at = open_page(PAGE, reviewer="lead", query={"queue": str(queue)})
    listed = at.dataframe[0].value
    assert listed[["name", "items", "items_done", "remaining", "awaiting_adjudication"]].values.tolist() == [
        ["Week 12", 2, 1, 1, 1]
    ]
    shown = {m.label: m.value for m in at.metric}
    assert shown["Items done"] == "1 of 2" and shown["Awaiting a lead"] == "1"
    assert shown["Decided"] == "1 of 4"  # safety agreed; clarity waits
    per_reviewer = at.dataframe[1].value
    assert per_reviewer[["reviewer", "done", "labels", "awaiting_adjudication"]].values.tolist() == [
        ["ayse", 1, 2, 1],
        ["ben", 1, 2, 1],
    ]
    downloads = {b.key for b in at.get("download_button")}
    assert {"queues_table_csv", "queues_reviewers_csv"} <= downloads
    assert "queues_agreement_pairs_csv" in downloads  # two reviewers labelled one item: agreement shows
    assert not at.exception


def test_a_lead_decides_a_disagreement_with_both_labels_side_by_side(any_app_engine, open_page) -> None:
    queue, ids = disputed_queue(any_app_engine)
    at = open_page(PAGE, reviewer="lead", query={"queue": str(queue), "tab": "adjudication"})
    card = f"queues_disputes_card_{ids['clarity']}"
    shown = "\n".join(said(at.markdown))
    assert "**Item 1** · Clarity ·" in shown  # the metric's display name, as on the review page
    assert (
        "**ayse**" in shown and "**ben**" in shown and "Hard to follow" in shown and "Clear enough" in shown
    )
    at.number_input(key=f"{card}_decision").set_value(3).run()
    at.text_input(key=f"{card}_reason").input("Between the two").run()
    at.button(key=f"{card}_decide").click().run()
    with session_scope(any_app_engine, read_only=True) as s:
        j = s.get(Judgment, ids["clarity"])
        qj = s.exec(
            select(ReviewQueueJudgment).where(ReviewQueueJudgment.judgment_id == ids["clarity"])
        ).one()
        assert (j.user_decision, j.user_reasoning, j.reviewer) == ("3", "Between the two", "lead")
        assert (qj.state, qj.decision, qj.decided_by) == ("adjudicated", "3", "lead")
    assert any("Decided judgment" in t for t in said(at.success))
    assert any("Nothing awaits a lead" in t for t in said(at.info))
    # Among the decided ones, the lead's own decision can be undone: the judgment awaits a lead again.
    at.segmented_control(key="queues_disputes_state").set_value("adjudicated").run()
    at.button(key=f"{card}_undo").click().run()
    with session_scope(any_app_engine, read_only=True) as s:
        qj = s.exec(
            select(ReviewQueueJudgment).where(ReviewQueueJudgment.judgment_id == ids["clarity"])
        ).one()
        assert (qj.state, s.get(Judgment, ids["clarity"]).user_decision) == ("disputed", None)
    assert not at.exception


def test_a_lead_assigns_reviewers_and_closes_a_queue(app_engine, open_page) -> None:
    evaluation(app_engine, "s0")
    queue = create(app_engine, name="Small")
    at = open_page(PAGE, reviewer="lead", query={"queue": str(queue)})
    manage = f"queues_manage_{queue}"
    at.multiselect(key=f"{manage}_reviewers").set_value(["ayse", "ben"]).run()
    at.button(key=f"{manage}_save").click().run()
    with session_scope(app_engine, read_only=True) as s:
        assert s.get(ReviewQueue, queue).reviewers == ["ayse", "ben"]
    assert at.button(key=f"{manage}_close").disabled  # a close needs its checkbox
    at.checkbox(key=f"{manage}_close_sure").check().run()
    at.button(key=f"{manage}_close").click().run()
    with session_scope(app_engine, read_only=True) as s:
        assert s.get(ReviewQueue, queue).status == "closed"
        assert s.exec(select(ReviewQueueJudgment).where(col(ReviewQueueJudgment.held))).all() == []
    assert any("Closed Small" in t for t in said(at.success))
    assert not at.exception


def test_a_viewer_reads_the_queue_and_cannot_create_or_decide(
    app_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, ids = disputed_queue(app_engine)
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "signin")
    reset_settings()
    at = AppTest.from_file(str(ROOT / PAGE), default_timeout=APPTEST_TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = signed_in(app_engine, "viewer@example.com")
    at.query_params["queue"] = str(queue)
    at.query_params["tab"] = "adjudication"
    at.run()
    assert not [w for w in at.button if w.key and w.key.endswith("_decide")]
    assert any("Clear enough" in t for t in said(at.markdown))  # every label and reason is readable
    assert at.get("download_button")
    with session_scope(app_engine, read_only=True) as s:
        assert s.get(Judgment, ids["clarity"]).user_decision is None
    assert not at.exception
