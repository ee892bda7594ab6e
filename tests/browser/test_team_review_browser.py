"""Team queues in Chromium (issue 26, "Done when"): what only a browser shows.

- Overlap 1: two reviewers working one queue at the same time are handed different items.
  Overlap 2: each item reaches both reviewers exactly once, and a third reviewer gets none.
- Blind-first: before the reviewer's label is saved, neither the page's DOM nor any WebSocket frame
  the server sent holds the judge's score, reason or evidence; after the save they appear (so the
  check can fail).
- An abandoned reservation returns to the queue after its lease; a reload restores the reviewer's
  place: the item they were on, the items they skipped, the default queue's filters and an unsent
  reason.

One server for the module; each reviewer is a browser context of its own (their name cookie).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import col, select

from lib import queues
from lib.auth import Actor
from lib.db import init_db, session_scope
from lib.metrics import upsert_metric_definitions
from lib.models import EvaluationSnapshot, Judgment, ReviewAssignment, ReviewLabel, utcnow
from lib.queues import QueueSpec
from lib.ui import REVIEWER_COOKIE
from lib.ui.team_review import DEFAULT_LABEL
from tests.browser.conftest import StreamlitServer, new_app_context, settle
from tests.waiting import wait_until

pytestmark = pytest.mark.browser

LEAD = Actor(identity="lead", role="lead")
# Distinctive judge text and score: if any of it reaches the browser before the label, it is found.
# The markers are letters and digits only: the page sends text Markdown-escaped (a backslash before
# every punctuation mark), which must not hide a leak from the check.
JUDGE_SCORE = "0.7318264"
JUDGE_REASON = "QUOKKA7731 is the judges own reasoning"
JUDGE_WHY = "PANGOLIN2290 is why the judge quoted this"
MARKERS = ("7318264", "QUOKKA7731", "PANGOLIN2290")
ANSWER = "Paris is the capital of France, and it has been since 987."


def _evaluation(s, snapshot_id: str, product: str, metric: str, decision: str, **fields) -> int:
    s.add(
        EvaluationSnapshot(
            id=snapshot_id, question=f"Question of {snapshot_id}?", model_answer=fields.get("answer", "An answer."),
            product=product, evidence_json=fields.get("evidence"),
        )
    )  # fmt: skip
    s.flush()
    j = Judgment(
        change_id=f"{snapshot_id}:{metric}", product=product, metric=metric, snapshot_id=snapshot_id,
        decision=decision, reasoning=fields.get("reasoning", "Reads well."),
    )  # fmt: skip
    s.add(j)
    s.flush()
    assert j.id is not None
    return j.id


def _seed(url: str) -> dict[str, int]:
    """Three queues: 'one' (overlap 1, two items), 'two' (overlap 2, two items), 'blind' (blind-first,
    one item on a 0–1 scale whose judge said JUDGE_SCORE, JUDGE_REASON, and quoted with JUDGE_WHY)."""
    engine = init_db(url)
    with session_scope(engine) as s:
        for i in range(2):
            _evaluation(s, f"one{i}", "solo", "clarity", "4")
            _evaluation(s, f"two{i}", "pair", "clarity", "4")
        upsert_metric_definitions(
            s,
            [
                {
                    "product": "blindco",
                    "slug": "faithfulness",
                    "display_name": "Faithfulness",
                    "min": 0,
                    "max": 1,
                }
            ],
        )
        blind_judgment = _evaluation(
            s, "blind0", "blindco", "faithfulness", JUDGE_SCORE, answer=ANSWER, reasoning=JUDGE_REASON,
            evidence={"faithfulness": [{"quote": "capital of France", "start": 13, "end": 30, "why": JUDGE_WHY}]},
        )  # fmt: skip
        ids = {"blind_judgment": blind_judgment}
        for i in range(3):
            ids[f"lease{i}"] = _evaluation(s, f"lease{i}", "leaseco", "clarity", "4")
        for product in ("freeA", "freeB"):  # in no team queue: the default queue's
            _evaluation(s, f"{product}0", product, "clarity", "4")
        for name, product, overlap, mode in (("one", "solo", 1, "open"), ("two", "pair", 2, "open"),
                                             ("blind", "blindco", 1, "blind"), ("lease", "leaseco", 1, "open")):  # fmt: skip
            queue = queues.create_queue(
                session=s, actor=LEAD, spec=QueueSpec(name=name, product=product, overlap=overlap, mode=mode)
            )
            assert queue.id is not None
            ids[name] = queue.id
    engine.dispose()
    return ids


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StreamlitServer, str, dict[str, int]]]:
    """One server over the seeded database for the module's tests."""
    tmp: Path = tmp_path_factory.mktemp("team")
    url = f"sqlite:///{tmp / 'team.db'}"
    ids = _seed(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_"))}
    env.update({"OVERRULE_DATABASE_URL": url, "OVERRULE_LOAD_DEMO": "false"})
    server = StreamlitServer(env, tmp / "streamlit.log")
    try:
        yield server, url, ids
    finally:
        server.stop()


def _reviewer(browser, server: StreamlitServer, name: str):
    context = new_app_context(browser, viewport={"width": 1400, "height": 900})
    context.add_cookies([{"name": REVIEWER_COOKIE, "value": name, "url": server.base_url}])
    return context, context.new_page()


def _open(page, server: StreamlitServer, queue_id: int) -> None:
    page.goto(f"{server.base_url}/review?queue={queue_id}")
    settle(page)


def _switch(page, queue_name: str) -> None:
    """Choose another queue in the review page's own chooser (no reload: a reviewer stays on the page)."""
    page.get_by_test_id("stSelectbox").filter(has_text="Queue").click()
    page.get_by_role("option", name=re.compile(rf"^{queue_name} · ")).click()
    settle(page)


def _shown(page) -> str | None:
    """The evaluation on screen ('one0' …), None when the queue has nothing for this reviewer."""
    text = page.locator('[data-testid="stMain"]').inner_text()
    if "Nothing left for you in this queue" in text:
        return None
    found = re.search(r"Evaluation (\w+) ·", text)
    assert found, text[:2000]
    return found.group(1)


def _confirm(page, url: str, snapshot_id: str, reviewer: str) -> None:
    """Click ✓ on the item's only metric (a label equal to the judge's), then wait until the label is
    stored and the page has settled after it: settling right after the click could end before the
    click's run began, and the page read next was the one before the save."""
    engine = init_db(url)
    with session_scope(engine, read_only=True) as s:
        jid = s.exec(select(Judgment.id).where(Judgment.snapshot_id == snapshot_id)).one()
    # By role: the button, not the hidden twin Streamlit keeps for its tooltip.
    page.locator(f".st-key-review_row_{jid}_confirm").get_by_role("button", name=re.compile("✓")).click()

    def stored() -> bool:
        with session_scope(engine, read_only=True) as s:
            return (
                s.exec(
                    select(ReviewLabel.id).where(
                        ReviewLabel.judgment_id == jid,
                        ReviewLabel.reviewer == reviewer,
                        col(ReviewLabel.decision).is_not(None),
                    )
                ).first()
                is not None
            )

    try:
        wait_until(stored, f"{reviewer}'s label on {snapshot_id}")
    finally:
        engine.dispose()
    settle(page)


def _labels(url: str) -> list[tuple[str, str]]:
    engine = init_db(url)
    with session_scope(engine, read_only=True) as s:
        rows = s.exec(
            select(ReviewLabel.reviewer, Judgment.snapshot_id)
            .join(Judgment, col(Judgment.id) == col(ReviewLabel.judgment_id))
            .where(col(ReviewLabel.decision).is_not(None))
        ).all()
    engine.dispose()
    return sorted((str(snapshot), reviewer) for reviewer, snapshot in rows)


def test_overlap_one_hands_reviewers_different_items_and_overlap_two_each_item_to_two(team, browser) -> None:
    server, url, ids = team
    people = {name: _reviewer(browser, server, name) for name in ("ayse", "ben", "carla")}
    pages = {name: page for name, (_, page) in people.items()}
    try:
        # Overlap 1, both at once: each holds an item the other is not handed.
        _open(pages["ayse"], server, ids["one"])
        _open(pages["ben"], server, ids["one"])
        first, second = _shown(pages["ayse"]), _shown(pages["ben"])
        assert {first, second} == {"one0", "one1"}
        _confirm(pages["ayse"], url, first, "ayse")
        assert _shown(pages["ayse"]) is None  # the other item is ben's
        _confirm(pages["ben"], url, second, "ben")
        assert _shown(pages["ben"]) is None

        # Overlap 2: ayse and ben each label both items once; carla gets none of them.
        seen: dict[str, list[str]] = {"ayse": [], "ben": []}
        for name in seen:
            _switch(pages[name], "two")
            while (item := _shown(pages[name])) is not None:
                assert item not in seen[name], f"{name} was handed {item} twice"
                seen[name].append(item)
                _confirm(pages[name], url, item, name)
        _open(pages["carla"], server, ids["two"])
        carla = _shown(pages["carla"])
    finally:
        for context, _ in people.values():
            context.close()
    assert sorted(seen["ayse"]) == sorted(seen["ben"]) == ["two0", "two1"]
    assert carla is None
    assert _labels(url) == [
        ("one0", "ayse" if first == "one0" else "ben"),
        ("one1", "ben" if first == "one0" else "ayse"),
        ("two0", "ayse"), ("two0", "ben"), ("two1", "ayse"), ("two1", "ben"),
    ]  # fmt: skip


def _holds_judge(text: str) -> list[str]:
    return [s for s in MARKERS if s in text]


def test_blind_first_sends_nothing_of_the_judge_before_the_label_is_saved(team, browser) -> None:
    server, url, ids = team
    context, page = _reviewer(browser, server, "dana")
    frames: list[str] = []

    def on_socket(ws) -> None:
        def keep(payload) -> None:
            frames.append(payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload)

        ws.on("framereceived", keep)

    page.on("websocket", on_socket)
    jid = ids["blind_judgment"]
    try:
        _open(page, server, ids["blind"])
        assert ANSWER in page.locator('[data-testid="stMain"]').inner_text()  # the item is drawn
        # The reviewer's blind score and reason, kept as a draft: still nothing of the judge's.
        # 0–1 offers five points (0, 0.25, … 1) on keys 1–5: key 2 gives 0.25.
        page.locator(f".st-key-review_blind_{jid}_score_2").get_by_role(
            "button", name=re.compile("0.25")
        ).click()
        settle(page)
        reason = page.locator(f".st-key-review_blind_{jid}_reason input")
        reason.fill("Leaves out the date")
        reason.press("Enter")
        settle(page)
        before_dom, before_frames = page.content(), list(frames)
        highlights = page.locator("mark.ov-ev").count()  # the answer is drawn without the judge's marks
        page.locator(".st-key-review_reveal").get_by_role("button", name=re.compile("show the judge")).click()
        settle(page)
        after_dom = page.content()
    finally:
        context.close()
    assert before_frames and len(frames) > len(before_frames)
    assert _holds_judge(before_dom) == [] and highlights == 0
    assert [found for f in before_frames if (found := _holds_judge(f))] == []
    # Saved: the judge is revealed (the same checks find it now), and the blind label is kept.
    assert JUDGE_REASON in after_dom
    assert any("QUOKKA7731" in f for f in frames[len(before_frames) :])
    engine = init_db(url)
    with session_scope(engine, read_only=True) as s:
        label = s.exec(select(ReviewLabel).where(ReviewLabel.judgment_id == jid)).one()
        assert (label.reviewer, label.blind_decision, label.blind_reason, label.decision) == (
            "dana", "0.25", "Leaves out the date", None,
        )  # fmt: skip
    engine.dispose()


def test_an_abandoned_item_returns_after_its_lease_and_a_reload_restores_the_reviewers_place(
    team, browser
) -> None:
    server, url, ids = team
    engine = init_db(url)
    erin, erin_page = _reviewer(browser, server, "erin")
    try:
        _open(erin_page, server, ids["lease"])
        abandoned = _shown(erin_page)
    finally:
        erin.close()  # erin leaves without a decision: her tab is gone, her lease still runs
    with session_scope(engine) as s:  # the lease runs out (fifteen minutes, here a write)
        row = s.exec(select(ReviewAssignment).where(ReviewAssignment.reviewer == "erin")).one()
        assert row.status == "reserved"
        row.expires_at = utcnow() - timedelta(seconds=1)
        s.add(row)

    context, page = _reviewer(browser, server, "frank")
    try:
        _open(page, server, ids["lease"])
        assert _shown(page) == abandoned  # the abandoned item came back to the queue
        page.locator(".st-key-review_skip").get_by_role("button", name=re.compile("Skip")).click()
        settle(page)
        current = _shown(page)
        assert current not in (None, abandoned)
        # A score and a reason typed but not sent: the reason is kept as a draft when the field is left.
        jid = ids[str(current)]
        page.locator(f".st-key-review_row_{jid}_score_1").get_by_role("button", name="1").click()
        settle(page)
        reason = page.locator(".st-key-review_reason input")
        reason.fill("Half of it is off topic")
        reason.press("Tab")

        def drafted() -> bool:
            with session_scope(engine, read_only=True) as s:
                held = s.exec(
                    select(ReviewAssignment).where(
                        ReviewAssignment.reviewer == "frank", ReviewAssignment.status == "reserved"
                    )
                ).first()
                return held is not None and (held.draft or {}).get(str(jid), {}).get("reason") == (
                    "Half of it is off topic"
                )

        wait_until(drafted, "frank's unsent reason kept as a draft")
        settle(page)

        page.reload()
        settle(page)
        # The same item (not the skipped one, which came first), with the unsent reason in its field.
        assert _shown(page) == current
        assert page.locator(".st-key-review_reason input").input_value() == "Half of it is off topic"
        assert f"queue={ids['lease']}" in page.url

        # The default queue with a product filter: a reload keeps the filter, not "everything".
        page.get_by_test_id("stSelectbox").filter(has_text="Queue").click()
        page.get_by_role("option", name=DEFAULT_LABEL).click()
        settle(page)
        page.get_by_role("button", name=re.compile("Filters and order")).click()
        settle(page)
        page.get_by_test_id("stSelectbox").filter(has_text="Product").click()
        page.get_by_role("option", name="freeB", exact=True).click()
        settle(page)
        page.keyboard.press("Escape")
        settle(page)
        assert _shown(page) == "freeB0"
        # Opened again without the item in the address: only the kept filter can pick freeB0
        # (everything pending starts with the older freeA0).
        page.goto(f"{server.base_url}/review")
        settle(page)
        assert _shown(page) == "freeB0"
    finally:
        context.close()
        engine.dispose()
