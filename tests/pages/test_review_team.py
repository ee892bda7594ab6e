"""The review page with team queues (issue 26) and its reviewer papercuts (issue 25 points 8, 13)
under AppTest: which queue a reviewer is offered, links to an item, labels instead of reviews,
blind-first (nothing of the judge's before the reviewer's scores), drafts, filters and skips kept in
the database, a lease that ran out, and the selected metric's reasons without a click."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine
from sqlmodel import col, select
from streamlit.testing.v1 import AppTest

from lib import queues, reservations
from lib.auth import Actor
from lib.config import reset_settings
from lib.db import session_scope
from lib.models import (
    EvaluationSnapshot,
    Judgment,
    ReviewAssignment,
    ReviewLabel,
    ReviewQueueItem,
    utcnow,
)
from lib.preferences import load_preference
from lib.queues import QueueSpec
from tests.pages.conftest import APPTEST_TIMEOUT, signed_in
from tests.pages.test_admin import AUTH
from tests.pages.test_review import PAGE, ROOT, evaluation, headings, plain, row_key

LEAD = Actor(identity="lead", role="lead")
# Distinctive judge text: if any of it reaches a blind page, the assertions below find it.
JUDGE_REASON = "QUOKKA-7731 the judge's own reasoning"
JUDGE_WHY = "PANGOLIN-2290 why the judge quoted this"


def create(engine: Engine, **spec) -> int:
    spec.setdefault("name", "team")
    with session_scope(engine) as s:
        queue = queues.create_queue(session=s, actor=LEAD, spec=QueueSpec(**spec))
        assert queue.id is not None
        return queue.id


def labels(engine: Engine) -> list[tuple[str, int, str | None, str | None, str | None]]:
    with session_scope(engine, read_only=True) as s:
        return [
            (lab.reviewer, lab.judgment_id, lab.blind_decision, lab.decision, lab.reason)
            for lab in s.exec(select(ReviewLabel).order_by(col(ReviewLabel.id))).all()
        ]


def assignment(engine: Engine, reviewer: str, queue_id: int | None = None) -> ReviewAssignment:
    with session_scope(engine, read_only=True) as s:
        rows = s.exec(
            select(ReviewAssignment).where(
                ReviewAssignment.reviewer == reviewer,
                ReviewAssignment.queue_id == queue_id
                if queue_id is not None
                else col(ReviewAssignment.queue_id).is_(None),
            )
        ).all()
        held = [r for r in rows if r.status == "reserved"] or list(rows)
        assert held, f"{reviewer} holds nothing"
        return held[0]


def item_id_of(engine: Engine, queue_id: int, snapshot_id: str) -> int:
    with session_scope(engine, read_only=True) as s:
        found = s.exec(
            select(ReviewQueueItem.id).where(
                ReviewQueueItem.queue_id == queue_id, ReviewQueueItem.item_key == f"snapshot:{snapshot_id}"
            )
        ).first()
        assert found is not None
        return found


def texts(at: AppTest) -> str:
    """Everything the page shows as text: Markdown, captions, alerts, button labels and help."""
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += [e.value for kind in (at.info, at.success, at.warning, at.error) for e in kind]
    parts += [b.label for b in at.button] + [b.help or "" for b in at.button]
    parts += [t.value or "" for t in at.text_input] + [t.placeholder or "" for t in at.text_input]
    return plain("\n".join(parts))


def said(elements) -> list[str]:
    """What alerts or captions say, as the reader sees it."""
    return [plain(e.value) for e in elements]


def test_a_reviewer_is_offered_their_queue_first_then_open_ones_then_the_default(
    app_engine, open_page
) -> None:
    for i in range(4):
        evaluation(app_engine, f"s{i}", hours=i)
    mine = create(app_engine, name="Mine", reviewers=("ayse", "ben"), size=1)
    everyone = create(app_engine, name="Everyone", size=1)
    create(app_engine, name="Others", reviewers=("carla",), size=1)
    at = open_page(PAGE, reviewer="ayse")
    chooser = at.selectbox(key="review_queue_choice")
    assert chooser.options == [
        "Mine · assigned to you · Open (judge shown) · 1 reviewer per item",
        "Everyone · open to all · Open (judge shown) · 1 reviewer per item",
        "Everything pending (default queue)",
    ]
    assert chooser.value == mine  # their own queue is where they start
    assert headings(at) == ["Evaluation s0"]
    assert at.query_params["queue"] == str(mine)
    assert at.query_params["item"] == str(item_id_of(app_engine, mine, "s0"))
    chooser.set_value(everyone).run()
    assert headings(at) == ["Evaluation s1"]
    at.selectbox(key="review_queue_choice").set_value(0).run()
    assert headings(at) == ["Evaluation s3"]  # the default queue leaves out what the queues hold
    assert at.query_params["item"] == "snapshot:s3" and "queue" not in at.query_params
    with session_scope(app_engine, read_only=True) as s:
        assert load_preference(session=s, reviewer="ayse", name="review")["queue"] == 0
    assert not at.exception


def test_in_a_team_queue_a_click_writes_a_label_and_the_judgment_waits_for_the_second_reviewer(
    any_app_engine, open_page
) -> None:
    ids = evaluation(any_app_engine, "s0")
    queue = create(any_app_engine, overlap=2)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['clarity'])}_confirm").click().run()  # the judge's 4
    assert labels(any_app_engine) == [("ayse", ids["clarity"], None, "4", None)]
    with session_scope(any_app_engine, read_only=True) as s:
        assert s.get(Judgment, ids["clarity"]).user_decision is None  # one label decides nothing
    assert any("waits for the other reviewers" in t for t in said(at.success))
    # The row stays with ayse's label marked, changeable while the judgment collects labels.
    assert at.button(key=f"{row_key(ids['clarity'])}_score_4").proto.type == "primary"
    assert headings(at) == ["Evaluation s0"]
    bob = open_page(PAGE, reviewer="bob")
    assert headings(bob) == ["Evaluation s0"]  # overlap 2: the same item reaches a second reviewer
    bob.button(key=f"{row_key(ids['clarity'])}_confirm").click().run()
    assert any("the reviewers agree" in t for t in said(bob.success))
    with session_scope(any_app_engine, read_only=True) as s:
        assert s.get(Judgment, ids["clarity"]).user_decision == "4"
    assert queue and not at.exception and not bob.exception


def test_a_link_to_an_item_opens_it_and_a_full_item_says_so_and_moves_on(app_engine, open_page) -> None:
    evaluation(app_engine, "s0", hours=0)
    evaluation(app_engine, "s1", hours=1)
    queue = create(app_engine)
    second = item_id_of(app_engine, queue, "s1")
    at = open_page(PAGE, reviewer="ayse", query={"queue": str(queue), "item": str(second)})
    assert headings(at) == ["Evaluation s1"]
    assert assignment(app_engine, "ayse", queue).item_id == second
    other = open_page(PAGE, reviewer="bob", query={"queue": "team", "item": str(second)})  # by name
    assert headings(other) == ["Evaluation s0"]
    assert any("has the 1 reviewer(s) it needs" in t for t in said(other.info))
    again = open_page(PAGE, reviewer="ayse")  # a reload without the link: still her item
    assert headings(again) == ["Evaluation s1"]
    assert not (at.exception or other.exception or again.exception)


def test_an_unknown_queue_in_a_link_says_so(app_engine, open_page) -> None:
    evaluation(app_engine, "s0")
    at = open_page(PAGE, reviewer="ayse", query={"queue": "nope"})
    assert any("no active queue 'nope'" in t for t in said(at.info))
    assert headings(at) == ["Evaluation s0"]
    assert not at.exception


def blind_setup(engine: Engine) -> tuple[int, dict[str, int]]:
    ids = evaluation(
        engine,
        "s0",
        model_answer="Paris is the capital of France.",
        reasoning=JUDGE_REASON,
        evidence_json={
            "clarity": [{"quote": "Paris is the capital", "start": 0, "end": 20, "why": JUDGE_WHY}]
        },
    )
    return create(engine, mode="blind", overlap=2), ids


def test_the_blind_stage_shows_nothing_the_judge_said(app_engine, open_page) -> None:
    queue, ids = blind_setup(app_engine)
    at = open_page(PAGE, reviewer="ayse")
    shown = texts(at)
    assert "Paris is the capital of France." in shown  # the answer, plain
    assert JUDGE_REASON not in shown and JUDGE_WHY not in shown
    assert "ov-ev" not in shown and "ov-legend" not in shown  # no highlight, no legend
    assert "Judge" not in shown.replace("show the judge", "").replace("the judge is shown", "")
    assert "open the full evaluation" not in shown  # its detail view would show the judge
    # Each metric row holds its name, its scale's buttons (none marked) and a reason field: the same
    # whatever the judge decided.
    for metric, jid in ids.items():
        buttons = [b for b in at.button if b.key and b.key.startswith(f"review_blind_{jid}_score_")]
        assert [b.label for b in buttons] == ["1", "2", "3", "4", "5"], metric
        assert {b.proto.type for b in buttons} == {"secondary"}
    assert queue and not at.exception


def test_blind_scores_and_reasons_are_drafts_until_saved_then_the_judge_is_revealed(
    app_engine, open_page
) -> None:
    queue, ids = blind_setup(app_engine)
    at = open_page(PAGE, reviewer="ayse")
    assert at.button(key="review_reveal").disabled  # every metric needs a score first
    at.button(key=f"review_blind_{ids['clarity']}_score_2").click().run()
    at.text_input(key=f"review_blind_{ids['clarity']}_reason").input("Too terse to follow").run()
    draft = assignment(app_engine, "ayse", queue).draft
    assert draft[str(ids["clarity"])] == {"decision": "2", "reason": "Too terse to follow"}
    assert labels(app_engine) == []  # nothing is a label yet
    # A reload (a new session) shows the draft again, still blind.
    again = open_page(PAGE, reviewer="ayse")
    assert again.text_input(key=f"review_blind_{ids['clarity']}_reason").value == "Too terse to follow"
    assert again.button(key=f"review_blind_{ids['clarity']}_score_2").proto.type == "primary"
    again.button(key=f"review_blind_{ids['safety']}_score_5").click().run()
    again.button(key="review_reveal").click().run()
    assert sorted(labels(app_engine)) == sorted(
        [("ayse", ids["clarity"], "2", None, None), ("ayse", ids["safety"], "5", None, None)]
    )
    shown = texts(again)
    assert JUDGE_REASON in shown  # revealed: the judge's reason for the selected metric
    assert any("Your blind scores are saved" in t for t in said(again.success))
    # ✓ keeps the blind score (2, with its reason); both the blind and the final label are kept.
    keep = again.button(key=f"{row_key(ids['clarity'])}_confirm")
    assert keep.label == "✓ 2"
    keep.click().run()
    final = {jid: (blind, dec, reason) for _, jid, blind, dec, reason in labels(app_engine)}
    assert final[ids["clarity"]] == ("2", "2", "Too terse to follow")
    assert not again.exception


def test_a_typed_reason_is_a_draft_that_a_reload_opens_again(any_app_engine, open_page) -> None:
    ids = evaluation(any_app_engine, "s0")
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['clarity'])}_score_1").click().run()
    at.text_input(key="review_reason").input("Half of it is off topic").run()
    held = assignment(any_app_engine, "ayse")
    assert held.draft == {str(ids["clarity"]): {"decision": "1", "reason": "Half of it is off topic"}}
    again = open_page(PAGE, reviewer="ayse")
    assert again.text_input(key="review_reason").value == "Half of it is off topic"
    assert any("Why 1 instead of the judge's 4?" in t for t in said(again.caption))
    again.button(key="review_save").click().run()
    with session_scope(any_app_engine, read_only=True) as s:
        j = s.get(Judgment, ids["clarity"])
        assert (j.user_decision, j.user_reasoning) == ("1", "Half of it is off topic")
    assert assignment(any_app_engine, "ayse").draft == {}  # sent: nothing unsent is left
    assert not again.exception


def test_cancel_drops_the_draft(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "s0")
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['clarity'])}_score_1").click().run()
    at.text_input(key="review_reason").input("maybe").run()
    at.button(key="review_cancel").click().run()
    assert assignment(app_engine, "ayse").draft == {}
    assert not [w for w in open_page(PAGE, reviewer="ayse").text_input if w.key == "review_reason"]
    assert not at.exception


def test_filters_come_back_from_the_database_after_a_reload(app_engine, open_page) -> None:
    evaluation(app_engine, "a", hours=0, product="acme")
    evaluation(app_engine, "b", hours=1, product="beta")
    at = open_page(PAGE, reviewer="ayse")
    at.selectbox(key="review_product").set_value("beta").run()
    at.radio(key="review_order").set_value("largest_gap").run()
    assert headings(at) == ["Evaluation b"]
    again = open_page(PAGE, reviewer="ayse")
    assert again.selectbox(key="review_product").value == "beta"
    assert again.radio(key="review_order").value == "largest_gap"
    assert headings(again) == ["Evaluation b"]
    other = open_page(PAGE, reviewer="bob")  # someone else's filters are theirs
    assert other.selectbox(key="review_product").value == "Any"
    assert not (again.exception or other.exception)


def test_skipping_in_a_team_queue_is_kept_and_skipped_items_come_back(app_engine, open_page) -> None:
    evaluation(app_engine, "s0", hours=0)
    evaluation(app_engine, "s1", hours=1)
    queue = create(app_engine)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key="review_skip").click().run()
    assert headings(at) == ["Evaluation s1"]
    again = open_page(PAGE, reviewer="ayse")
    again.button(key="review_skip").click().run()
    assert any("Only items you skipped are left for you (2)" in t for t in said(again.info))
    again.button(key="review_unskip").click().run()
    assert headings(again) == ["Evaluation s0"]
    assert queue and not again.exception


def test_a_lease_that_ran_out_and_went_to_someone_else_is_said_so(app_engine, open_page) -> None:
    evaluation(app_engine, "s0", hours=0)
    evaluation(app_engine, "s1", hours=1)
    queue = create(app_engine)
    at = open_page(PAGE, reviewer="ayse")
    assert headings(at) == ["Evaluation s0"]
    with session_scope(app_engine) as s:  # fifteen minutes pass without ayse doing anything
        row = s.exec(select(ReviewAssignment).where(ReviewAssignment.reviewer == "ayse")).one()
        row.expires_at = utcnow() - timedelta(seconds=1)
        s.add(row)
    bob = open_page(PAGE, reviewer="bob")
    assert headings(bob) == ["Evaluation s0"]  # the abandoned item returned to the queue
    at.button(key="review_next").click().run()  # ayse does something on her (former) item
    assert any("ran out and another reviewer took it" in t for t in said(at.info))
    assert headings(at) == ["Evaluation s1"]
    assert queue and not (at.exception or bob.exception)


def test_a_label_can_be_withdrawn_from_its_row(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "s0")
    create(app_engine, overlap=2)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['clarity'])}_confirm").click().run()
    at.button(key=f"{row_key(ids['clarity'])}_name").click().run()
    at.button(key="review_withdraw").click().run()
    assert [(r, j, d) for r, j, _, d, _ in labels(app_engine)] == [("ayse", ids["clarity"], None)]
    assert any("withdrawn" in t for t in said(at.success))
    assert not at.exception


def test_a_viewer_choosing_a_team_queue_is_sent_to_read_it(
    app_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    evaluation(app_engine, "s0")
    create(app_engine)
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "signin")
    reset_settings()
    at = AppTest.from_file(str(ROOT / PAGE), default_timeout=APPTEST_TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = signed_in(app_engine, "viewer@example.com")
    at.run()
    assert any("Only reviewers take items of a team queue" in t for t in said(at.info))
    with session_scope(app_engine, read_only=True) as s:
        assert s.exec(select(ReviewAssignment)).all() == []  # reading reserves nothing
    assert not at.exception


def test_the_selected_metric_shows_the_judges_and_the_users_reason_without_a_click(
    app_engine, open_page
) -> None:
    ids = evaluation(app_engine, "s0", reasoning="Reads well.")
    with session_scope(app_engine) as s:
        snap = s.get(EvaluationSnapshot, "s0")
        snap.user_scores_json = {
            "clarity": {"score": 2, "reason": "Oksijen sudan gelir"},
            "safety": {"score": 5},
        }
        s.add(snap)
    at = open_page(PAGE, reviewer="ayse")
    assert [m for m in said(at.markdown) if m.startswith(("**Judge:**", "**User:**"))] == [
        "**Judge:** Reads well.",
        "**User:** Oksijen sudan gelir",
    ]
    at.button(key=f"{row_key(ids['safety'])}_name").click().run()  # another row: its reasons
    assert [m for m in said(at.markdown) if m.startswith(("**Judge:**", "**User:**"))] == [
        "**Judge:** Reads well."
    ]
    assert not at.exception


def test_a_label_judgment_row_keeps_its_name_and_marks_the_judges_label(app_engine, open_page) -> None:
    with session_scope(app_engine) as s:
        j = Judgment(change_id="github.com/acme/fungear#1412", product="acme", decision="EXCLUDE")
        s.add(j)
        s.flush()
        jid = j.id
    at = open_page(PAGE, reviewer="ayse")
    assert at.button(key=f"{row_key(jid)}_name").label == "▸ Decision"  # the change id heads the item
    marked = [
        b.label for b in at.button if b.key and b.key.startswith(f"{row_key(jid)}_score_") and b.proto.icon
    ]
    assert marked == ["EXCLUDE"]
    assert not at.exception


def test_lease_status_names_until_when_the_item_is_reserved(app_engine, open_page) -> None:
    evaluation(app_engine, "s0")
    at = open_page(PAGE, reviewer="ayse")
    held = assignment(app_engine, "ayse")
    assert any(f"Reserved for you until {held.expires_at:%H:%M} UTC" in t for t in said(at.caption))
    assert held.expires_at - held.reserved_at == reservations.lease()
    assert not at.exception


def test_a_queue_closed_since_the_last_visit_falls_back_to_the_default_and_says_so(
    app_engine, open_page
) -> None:
    evaluation(app_engine, "s0", hours=0)
    evaluation(app_engine, "s1", hours=1)
    queue = create(app_engine, name="Short-lived", size=1)
    at = open_page(PAGE, reviewer="ayse")
    assert headings(at) == ["Evaluation s0"]  # her first queue: this one
    with session_scope(app_engine) as s:
        queues.close_queue(session=s, actor=LEAD, queue_id=queue)
    again = open_page(PAGE, reviewer="ayse", query={"queue": str(queue)})  # an old link, a new session
    assert any("no active queue" in t for t in said(again.info))
    assert headings(again) == ["Evaluation s0"]  # released: the default queue hands it out again
    assert "queue" not in again.query_params
    assert not again.exception
