"""The review queue in a real browser (issue 15): five judgments reviewed with the keyboard only, one
undone, the rows written; the whole 8-metric evaluation on one 1400×900 screen; the reason shown
literally on the Corrections page."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from sqlmodel import select

from lib.db import init_db, session_scope
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent
from lib.ui import REVIEWER_COOKIE
from tests.browser.conftest import new_app_context, open_in_app, settle

pytestmark = pytest.mark.browser

REASON = 'Rambles first <img src=x onerror=alert("xss")>'
SCREEN = {"width": 1400, "height": 900}
# Judge 4 on every metric; the user's scores make the gaps 3, 2, 1, then 0 (rubric order breaks ties).
USER = {"truthfulness": 1, "helpfulness": 2, "safety": 3, "bias": 4, "clarity": 4, "consistency": 4,
        "efficiency": 4, "robustness": 4}  # fmt: skip


def _seed(url: str) -> dict[str, int]:
    engine = init_db(url)
    ids: dict[str, int] = {}
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id="snap_keys",
                question="How do plants make food?",
                model_answer="Plants use light. Photosynthesis turns light, water and CO2 into sugar. " * 12,
                product="acme",
                user_scores_json={m: {"score": v} for m, v in USER.items()},
                evidence_json={
                    "truthfulness": [{"quote": "Plants use light", "start": 0, "end": 16, "why": "w"}]
                },
            )
        )
        s.add(EvaluationSnapshot(id="snap_next", question="Q2", model_answer="A2", product="acme"))
        s.flush()
        for metric in USER:
            j = Judgment(change_id=f"snap_keys:{metric}", product="acme", metric=metric, snapshot_id="snap_keys",
                         decision="4", reasoning=f"why {metric}")  # fmt: skip
            s.add(j)
            s.flush()
            assert j.id is not None
            ids[metric] = j.id
        s.add(Judgment(change_id="snap_next:clarity", product="acme", metric="clarity", snapshot_id="snap_next",
                       decision="3"))  # fmt: skip
    engine.dispose()
    return ids


_WATCH_TALLEST = """() => { window.__tallest = 0; const main = document.querySelector('[data-testid="stMain"]');
  const tick = () => { window.__tallest = Math.max(window.__tallest, document.scrollingElement.scrollHeight,
                                                   main.scrollHeight); requestAnimationFrame(tick); };
  tick(); }"""


def _page_height(page) -> int:
    """The page's scroll height: the document's and the main area's, whichever is larger (never
    below the viewport's), and, printed for the record, where the content really ends."""
    height, content = page.evaluate(
        """() => [Math.max(document.scrollingElement.scrollHeight,
                           document.querySelector('[data-testid="stMain"]').scrollHeight),
                  Math.ceil(document.querySelector('[data-testid="stMainBlockContainer"]')
                                    .getBoundingClientRect().bottom)]"""
    )
    print(f"scroll height {height} px, content ends at {content} px")
    return height


def test_five_reviews_by_keyboard_one_undo_and_the_workspace_fits_one_screen(
    streamlit_app, browser, tmp_path
) -> None:
    url = f"sqlite:///{tmp_path / 'review.db'}"
    ids = _seed(url)
    server = streamlit_app(url)
    context = new_app_context(browser, viewport=SCREEN)
    # The reviewer's name comes from its cookie (as after any earlier visit): no field to type in.
    context.add_cookies([{"name": REVIEWER_COOKIE, "value": "ayse", "url": server.base_url}])
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    heights: dict[str, int] = {}

    # After each key: `settle` (the run it started has ended and Streamlit dropped the elements it
    # kept from the run before: the next key reaches the buttons now drawn, and a height is the
    # page's, not a frame drawn half old, half new), then what the key changed.
    def reviewed(n: int) -> None:
        settle(page)
        expect(page.get_by_test_id("stProgress").get_by_text(f"{n} of 9 reviewed")).to_be_visible()

    def selected(title: str) -> None:
        settle(page)
        # By role: the metric's popover button, not the hidden twin Streamlit keeps for its tooltip.
        rows = page.locator(".st-key-review_rows")
        expect(rows.get_by_role("button", name=re.compile(f"^▸ {title}"))).to_be_visible()

    def reason_focused() -> None:
        settle(page)
        # Focus moves by the page's script once the field is drawn: wait for that state.
        page.wait_for_function(
            "document.activeElement && document.activeElement.closest('.st-key-review_reason') !== null"
        )

    try:
        page.goto(f"{server.base_url}/review")
        settle(page)
        expect(page.get_by_text("Evaluation snap_keys").first).to_be_visible()
        reviewed(0)
        selected("Truthfulness")  # largest gap first
        expect(page.locator(".st-key-review_answer_text mark.ov-ev").first).to_be_visible()
        heights["8 rows"] = _page_height(page)
        # The keys act through the selected row's buttons: enabled once the reviewer is known.
        expect(page.locator('[class*="_confirm"] button:not([disabled])').first).to_be_visible()

        page.keyboard.press("y")  # 1: confirm truthfulness
        reviewed(1)
        selected("Helpfulness")
        # For the record: the tallest frame while the reason field opens (old and new elements mixed).
        page.evaluate(_WATCH_TALLEST)
        page.keyboard.press("2")  # 2: overrule helpfulness with 2, the reason typed in the focused field
        reason_focused()
        heights["reason field open"] = _page_height(page)
        print(f"tallest frame while it opened: {page.evaluate('window.__tallest')} px")
        page.keyboard.type(REASON)  # letters such as "u", "s", "y" go into the field, not to the keys
        page.keyboard.press("Enter")
        reviewed(2)
        heights["after a decision (flash)"] = _page_height(page)
        selected("Safety")
        page.keyboard.press("j")  # move down to bias
        selected("Bias")
        page.keyboard.press("y")  # 3: confirm bias
        reviewed(3)
        selected("Clarity")
        page.keyboard.press("5")  # 4: overrule clarity with 5
        reason_focused()
        page.keyboard.type("Clearer than the judge says")
        page.keyboard.press("Enter")
        reviewed(4)
        page.keyboard.press("k")  # back up to safety
        selected("Safety")
        page.keyboard.press("y")  # 5: confirm safety
        reviewed(5)
        page.keyboard.press("u")  # undo the last one: safety is open again
        reviewed(4)
        selected("Safety")
        expect(
            page.get_by_text("Undid your decision on snap_keys").first
        ).to_be_visible()  # a joiner after ":"
        page.keyboard.press("s")  # skip the rest of this evaluation
        settle(page)
        expect(page.get_by_text("Evaluation snap_next").first).to_be_visible()

        open_in_app(page, "corrections")
        block = page.get_by_test_id("stCode")
        expect(block.get_by_text("[CORRECTED] snap_keys:helpfulness")).to_be_visible()
        history = block.inner_text()
    except Exception:
        page.screenshot(path=str(tmp_path / "review_flow_failure.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise
    finally:
        context.close()

    print(f"queue page scroll height at 1400×900: {heights}")
    assert max(heights.values()) <= SCREEN["height"], heights
    assert "Reviewer's decision: 2 | Reviewer's reason: " + REASON in history  # shown literally
    assert dialogs == []  # the reason's markup never ran
    engine = init_db(url)
    with session_scope(engine, read_only=True) as s:
        state = {m: s.get(Judgment, jid) for m, jid in ids.items()}
        decided = {m: (j.user_decision, j.reviewer) for m, j in state.items() if j and j.user_decision}
        assert decided == {
            "truthfulness": ("4", "ayse"),
            "helpfulness": ("2", "ayse"),
            "bias": ("4", "ayse"),
            "clarity": ("5", "ayse"),
        }
        safety = state["safety"]
        assert safety is not None and (safety.reviewed_at, safety.version) == (None, 3)
        trail = s.exec(select(JudgmentEvent).order_by(JudgmentEvent.id)).all()
        assert [(e.change_id.split(":")[1], e.action) for e in trail] == [
            ("truthfulness", "confirmed"),
            ("helpfulness", "overruled"),
            ("bias", "confirmed"),
            ("clarity", "overruled"),
            ("safety", "confirmed"),
            ("safety", "undone"),
        ]
    engine.dispose()
