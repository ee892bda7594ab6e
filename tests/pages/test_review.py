"""Review queue page (the workspace of issue 15) and the correction form under AppTest: what the
reviewer sees (order by gap, compact rows, highlights, keys, undo) and the rows a click writes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from lib import corrections
from lib.config import reset_settings
from lib.db import session_scope
from lib.highlight import strip_app_markup
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent
from lib.safe_markdown import escape_markdown
from tests.pages.conftest import APPTEST_TIMEOUT, signed_in
from tests.pages.test_admin import AUTH  # the sign-in settings of the page tests

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/review.py"
UNESCAPED = re.compile(r"(?<!\\)[<>\[\]()*]")
T0 = datetime(2024, 5, 1, tzinfo=UTC)


def evaluation(
    engine: Engine, snapshot_id: str, *, hours: int = 0, product: str = "acme", **fields
) -> dict[str, int]:
    """An evaluation judged on clarity (4) and safety (5); returns the judgment ids by metric."""
    ids: dict[str, int] = {}
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id=snapshot_id,
                question=fields.get("question", "What is the capital of France?"),
                model_answer=fields.get("model_answer", "Paris."),
                product=product,
                user_scores_json={"clarity": {"score": 2}, "safety": {"score": 5}},
                evidence_json=fields.get("evidence_json"),
                created_at=T0 + timedelta(hours=hours),
            )
        )
        s.flush()
        for metric, decision in (("clarity", "4"), ("safety", "5")):
            j = Judgment(
                change_id=f"{snapshot_id}:{metric}",
                product=product,
                metric=metric,
                snapshot_id=snapshot_id,
                decision=decision,
                reasoning=fields.get("reasoning", "Reads well."),
                timestamp=T0 + timedelta(hours=hours),
            )
            s.add(j)
            s.flush()
            assert j.id is not None
            ids[metric] = j.id
    return ids


def stored(engine: Engine, judgment_id: int) -> Judgment:
    with session_scope(engine, read_only=True) as s:
        j = s.get(Judgment, judgment_id)
        assert j is not None
        return j


def event_rows(engine: Engine) -> list[tuple[str, str, str | None, str | None, str | None]]:
    with session_scope(engine, read_only=True) as s:
        return [
            (e.change_id, e.reviewer, e.from_decision, e.to_decision, e.reason)
            for e in s.exec(select(JudgmentEvent).order_by(JudgmentEvent.id)).all()
        ]


def row_key(judgment_id: int) -> str:
    return f"review_row_{judgment_id}"


def overrule(at: AppTest, judgment_id: int, score_key: str, reason: str) -> AppTest:
    """Pick a score on the row (the reason field opens under it), type the reason, save."""
    at.button(key=f"{row_key(judgment_id)}_score_{score_key}").click().run()
    at.text_input(key="review_reason").input(reason)
    return at.button(key="review_save").click().run()


def progress_text(at: AppTest) -> str:
    return at.get("progress")[0].text


def headings(at: AppTest) -> list[str]:
    """Which item is shown: "Evaluation <id>" (the line under the question's title) or "Judgment <id>"
    (ids are Markdown-escaped in the page source)."""
    shown = []
    for m in at.markdown:
        value = m.value.replace("\\", "")
        if value.startswith("**Judgment "):
            shown.append(value.split("**")[1])
        elif "  \n:small[Evaluation " in value:
            shown.append("Evaluation " + value.split(":small[Evaluation ", 1)[1].split(" · ", 1)[0])
    return shown


def test_the_item_is_titled_by_its_questions_first_line(app_engine, open_page) -> None:
    with session_scope(app_engine) as s:
        s.add(EvaluationSnapshot(id="snap_t", question="Where is *Ankara*?\nSecond line", model_answer="a",
                                 product="acme"))  # fmt: skip
        s.flush()
        s.add(Judgment(change_id="snap_t:clarity", snapshot_id="snap_t", product="acme", metric="clarity",
                       decision="4"))  # fmt: skip
    at = open_page(PAGE, reviewer="ayse")
    titles = [m.value.split("  \n", 1)[0] for m in at.markdown if "  \n:small[Evaluation " in m.value]
    assert titles == [f"**{escape_markdown('Where is *Ankara*?')}**"]
    assert headings(at) == ["Evaluation snap_t"]
    assert not at.exception


def plain(markdown: str) -> str:
    """Escaped Markdown as the reader sees it (backslashes and the shortcode-breaking joiner gone)."""
    return markdown.replace("\\", "").replace("\u2060", "")


def row_order(at: AppTest) -> list[int]:
    """Judgment ids of the metric rows, top to bottom."""
    return [int(b.key.split("_")[2]) for b in at.button if b.key and b.key.endswith("_confirm")]


def shortcut_of(at: AppTest, key: str) -> str:
    return at.button(key=key).proto.shortcut


def test_queue_shows_progress_and_the_oldest_evaluation_first(app_engine, open_page) -> None:
    evaluation(app_engine, "snap_new", hours=5)
    evaluation(app_engine, "snap_old", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    assert progress_text(at).startswith("0 of 4 reviewed")
    assert headings(at) == ["Evaluation snap_old"]
    assert not at.exception


def test_rows_are_compact_and_sorted_by_gap_largest_first(app_engine, open_page) -> None:
    # The rubric puts safety (gap 0) before clarity (judge 4, user 2: gap 2); the queue puts clarity first.
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")
    assert row_order(at) == [ids["clarity"], ids["safety"]]
    rows = [m.value for m in at.markdown if " · " in m.value and len(m.value) < 20]
    assert rows == ["4 · 2 · **2**", "5 · 5 · 0"]  # judge · user · gap, one line per metric
    # Score keys on the selected (first) row only; the others are clicked.
    assert shortcut_of(at, f"{row_key(ids['clarity'])}_confirm") == "y"
    assert shortcut_of(at, f"{row_key(ids['clarity'])}_score_2") == "2"
    assert shortcut_of(at, f"{row_key(ids['safety'])}_confirm") == ""
    assert not at.exception


def test_next_moves_the_keys_to_the_next_row(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")
    at.button(key="review_next").click().run()
    assert shortcut_of(at, f"{row_key(ids['safety'])}_confirm") == "y"
    assert shortcut_of(at, f"{row_key(ids['clarity'])}_confirm") == ""
    at.button(key="review_previous").click().run()
    assert shortcut_of(at, f"{row_key(ids['clarity'])}_confirm") == "y"
    assert [shortcut_of(at, k) for k in ("review_skip", "review_undo", "review_next")] == ["s", "u", "j"]
    assert not at.exception


def test_the_answer_carries_the_same_highlights_as_the_detail_view(app_engine, open_page) -> None:
    evaluation(
        app_engine,
        "snap_a",
        model_answer="Paris is the capital of France.",
        evidence_json={"clarity": [{"quote": "Paris is the capital", "start": 0, "end": 20, "why": "w1"}]},
    )
    queue = open_page(PAGE, reviewer="ayse")
    detail = open_page("pages/evaluations.py", query={"snapshot": "snap_a"}, reviewer="ayse")

    def answer_html(at: AppTest) -> str:
        return [m.value for m in at.markdown if m.value.startswith('<div class="ov-highlight">')][1]

    shown = answer_html(queue)
    assert '<mark class="ov-ev"' in shown and strip_app_markup(shown).startswith("Paris is the capital")
    assert shown == answer_html(detail)
    assert any(m.value.startswith('<div class="ov-legend">') for m in queue.markdown)
    assert not queue.exception and not detail.exception


@pytest.mark.parametrize("shape", ["list", "seed"])
def test_evidence_shows_verified_items_with_their_stage_label(app_engine, open_page, shape) -> None:
    raw = [{"quote": "Paris", "start": 3, "end": 9, "why": "*names* it"}, {"quote": "Lyon <b>"}]
    evaluation(app_engine, "s1", evidence_json={"clarity": raw if shape == "list" else {"evidence": raw}})
    at = open_page(PAGE, reviewer="ayse")
    shown = [m.value for m in at.markdown]  # inside the row's popover, drawn on demand in the browser
    assert "> Paris" in shown and "**Why:** \\*names\\* it" in shown
    assert "> Lyon \\<b\\>" in shown
    assert [w.value for w in at.warning] == ["Evidence could not be verified"]
    assert any("Verified, position corrected" in c.value for c in at.caption)
    assert not at.exception


def test_overruling_with_a_score_and_a_reason_writes_the_review_and_its_event(
    any_app_engine, open_page
) -> None:
    ids = evaluation(any_app_engine, "snap_a")
    at = overrule(open_page(PAGE, reviewer="ayse"), ids["clarity"], "2", "Rambles before answering.")
    j = stored(any_app_engine, ids["clarity"])
    assert (j.user_decision, j.was_corrected, j.reviewer, j.version) == ("2", True, "ayse", 2)
    assert event_rows(any_app_engine) == [("snap_a:clarity", "ayse", "4", "2", "Rambles before answering.")]
    assert any("Overruled snap" in s.value for s in at.success)
    assert progress_text(at).startswith("1 of 2 reviewed")
    assert row_order(at) == [ids["safety"]]  # the decided row leaves; the keys move to the next one
    assert shortcut_of(at, f"{row_key(ids['safety'])}_confirm") == "y"
    assert not at.exception


def test_the_judges_own_score_confirms_without_a_reason(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['clarity'])}_score_4").click().run()
    assert (
        stored(app_engine, ids["clarity"]).user_decision,
        stored(app_engine, ids["clarity"]).was_corrected,
    ) == (
        "4",
        False,
    )
    assert [r[3] for r in event_rows(app_engine)] == ["4"]
    assert not at.exception


def test_after_the_last_metric_the_next_evaluation_loads(any_app_engine, open_page) -> None:
    first = evaluation(any_app_engine, "snap_a", hours=0)
    evaluation(any_app_engine, "snap_b", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(first['clarity'])}_confirm").click().run()
    assert headings(at) == ["Evaluation snap_a"]  # one evaluation at a time, until it is done
    at.button(key=f"{row_key(first['safety'])}_confirm").click().run()
    assert headings(at) == ["Evaluation snap_b"]
    assert stored(any_app_engine, first["safety"]).user_decision == "5"
    assert not at.exception


def test_overruling_without_a_reason_is_refused_and_writes_nothing(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['clarity'])}_score_1").click().run()
    at.button(key="review_save").click().run()
    assert any("reason is required" in e.value for e in at.error)
    assert stored(app_engine, ids["clarity"]).version == 1 and event_rows(app_engine) == []
    assert at.text_input(key="review_reason") is not None  # the field stays open for the reason
    at.button(key="review_cancel").click().run()
    assert not [w for w in at.text_input if w.key == "review_reason"]
    assert not at.exception


def test_without_a_reviewer_name_nothing_is_written(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE)
    assert any("Enter your name" in w.value for w in at.warning)
    at.button(key=f"{row_key(ids['clarity'])}_confirm").click().run()
    assert stored(app_engine, ids["clarity"]).user_decision is None and event_rows(app_engine) == []
    assert not at.exception


def test_a_viewer_reads_the_queue_but_every_decision_button_is_disabled(
    app_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = evaluation(app_engine, "snap_a")
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "signin")
    reset_settings()
    at = AppTest.from_file(str(ROOT / PAGE), default_timeout=APPTEST_TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = signed_in(app_engine, "viewer@example.com")
    at.run()
    assert headings(at) == ["Evaluation snap_a"]
    decide = [
        b
        for b in at.button
        if b.key and b.key.startswith(row_key(ids["clarity"])) and not b.key.endswith("_name")
    ]
    assert decide and all(b.disabled for b in decide)
    assert at.button(key="review_undo").disabled
    assert any("cannot confirm or overrule" in c.value for c in at.caption)
    assert not at.exception


def test_a_concurrent_change_is_reported_with_the_other_decision_and_not_overwritten(
    any_app_engine, open_page
) -> None:
    ids = evaluation(any_app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")  # ayse now looks at version 1
    with session_scope(any_app_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=ids["clarity"],
            expected_version=1,
            action="overrule",
            user_decision=1,
            reviewer="bob",
            reason="bob's view",
        )
    at.button(key=f"{row_key(ids['clarity'])}_confirm").click().run()
    message = " ".join(e.value for e in at.error)
    assert "Not saved" in message and "bob" in message and "bob's view" in message.replace("\\", "")
    j = stored(any_app_engine, ids["clarity"])
    assert (j.reviewer, j.user_decision, j.version) == ("bob", "1", 2)
    assert [r[1] for r in event_rows(any_app_engine)] == ["bob"]
    assert not at.exception


def test_undo_in_the_queue_reopens_your_last_decision_with_a_new_event(any_app_engine, open_page) -> None:
    first = evaluation(any_app_engine, "snap_a", hours=0)
    evaluation(any_app_engine, "snap_b", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    assert at.button(key="review_undo").disabled  # nothing of ayse's to undo yet
    at.button(key=f"{row_key(first['clarity'])}_confirm").click().run()
    at = overrule(at, first["safety"], "3", "Too cautious")
    assert headings(at) == ["Evaluation snap_b"]
    # The UI names what Undo takes back: the latest decision, the overrule of safety.
    assert any(
        "undoes your last decision: overruled snap_a:safety (5 → 3)" in plain(c.value) for c in at.caption
    )
    at.button(key="review_undo").click().run()
    j = stored(any_app_engine, first["safety"])
    assert (j.user_decision, j.reviewer, j.reviewed_at, j.version) == (None, None, None, 3)
    assert [a for a, *_ in actions(any_app_engine)] == ["confirmed", "overruled", "undone"]
    assert headings(at) == ["Evaluation snap_a"]  # back to the evaluation, its row open again
    assert row_order(at) == [first["safety"]]
    assert any("Undid your decision on snap_a:safety" in plain(s.value) for s in at.success)
    assert progress_text(at).startswith("1 of 4 reviewed")
    at.button(key="review_undo").click().run()  # and the one before it: the confirmation of clarity
    assert stored(any_app_engine, first["clarity"]).user_decision is None
    assert not at.exception


def test_skip_moves_to_the_next_item_and_skipped_items_come_back_on_request(app_engine, open_page) -> None:
    evaluation(app_engine, "snap_a", hours=0)
    evaluation(app_engine, "snap_b", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key="review_skip").click().run()
    assert headings(at) == ["Evaluation snap_b"]
    at.button(key="review_skip").click().run()
    assert any("Only skipped items are left" in i.value for i in at.info)
    at.button(key="review_unskip").click().run()
    assert headings(at) == ["Evaluation snap_a"]
    assert event_rows(app_engine) == []
    assert not at.exception


def test_an_empty_queue_says_nothing_is_left(app_engine, open_page) -> None:
    at = open_page(PAGE, reviewer="ayse")
    assert any("Nothing left to review" in s.value for s in at.success)
    assert not at.exception


def test_the_product_filter_limits_the_queue(app_engine, open_page) -> None:
    evaluation(app_engine, "snap_a", hours=0, product="acme")
    evaluation(app_engine, "snap_b", hours=1, product="beta")
    at = open_page(PAGE, reviewer="ayse")
    at.selectbox(key="review_product").set_value("beta").run()
    assert headings(at) == ["Evaluation snap_b"]
    assert progress_text(at).startswith("0 of 2 reviewed")
    assert not at.exception


@pytest.mark.parametrize(
    "payload", ["<img src=x onerror=alert(1)>", "[click](javascript:alert(1))", "**bold** <script>x</script>"]
)
def test_untrusted_text_is_shown_escaped(app_engine, open_page, payload) -> None:
    evaluation(app_engine, "snap_a", question=payload, model_answer=payload, reasoning=payload)
    at = open_page(PAGE, reviewer="ayse")
    shown = [m.value for m in at.markdown if "alert" in m.value or "bold" in m.value]
    html = [v for v in shown if v.startswith('<div class="ov-highlight">')]
    # Question and answer: lib.highlight's HTML, holding only app tags and the payload as text.
    assert [strip_app_markup(v) for v in html] == [payload, payload]
    # Everything else: every Markdown-active character arrives backslash-escaped. The item's title
    # line is "**<question's first line>**  \n:small[<the app's line>]": its inner text is checked.
    markdown = [
        v.split("  \n", 1)[0].removeprefix("**").removesuffix("**")
        if "  \n:small[Evaluation " in v
        else v.removeprefix("**Judge:** ")  # the selected metric's reason, under the app's own label
        for v in shown
        if v not in html
    ]
    assert markdown and not any(UNESCAPED.search(v) for v in markdown)
    assert not at.exception


def test_a_label_judgment_is_reviewed_with_its_label_keys(app_engine, open_page) -> None:
    with session_scope(app_engine) as s:
        j = Judgment(
            change_id="github.com/o/r#7", product="acme", decision="INCLUDE", description="Adds login"
        )
        s.add(j)
        s.flush()
        jid = j.id
    at = open_page(PAGE, reviewer="ayse")
    labels = [b.label for b in at.button if b.key and b.key.startswith(f"{row_key(jid)}_score_")]
    assert labels == ["INCLUDE", "EXCLUDE", "UNCERTAIN"]
    at = overrule(at, jid, "2", "Internal tooling only")
    assert (stored(app_engine, jid).user_decision, stored(app_engine, jid).was_corrected) == ("EXCLUDE", True)
    assert not at.exception


def test_undo_from_the_audit_trail_on_the_evaluation_detail(any_app_engine, open_page) -> None:
    ids = evaluation(any_app_engine, "snap_a")
    with session_scope(any_app_engine) as s:
        corrections.record_review(
            session=s, judgment_id=ids["clarity"], expected_version=1, action="overrule", user_decision=2,
            reviewer="ayse", reason="mine",
        )  # fmt: skip
    key = f"evaluations_review_{ids['clarity']}_history"
    other = open_page("pages/evaluations.py", query={"snapshot": "snap_a"}, reviewer="bob")
    assert not [b for b in other.button if b.key == f"{key}_undo"]  # not bob's decision
    at = open_page("pages/evaluations.py", query={"snapshot": "snap_a"}, reviewer="ayse")
    assert at.button(key=f"{key}_undo").label.startswith("Undo your overruled decision (4 → 2")
    at.button(key=f"{key}_undo").click().run()
    assert stored(any_app_engine, ids["clarity"]).user_decision is None
    history = next(d.value for d in at.dataframe if "action" in d.value.columns)
    assert history["action"].tolist() == ["overruled", "undone"]  # a new event; the decision stays in history
    assert any("Undid your decision" in s.value for s in at.success)
    assert not at.exception


def actions(engine: Engine) -> list[tuple[str, str]]:
    with session_scope(engine, read_only=True) as s:
        return [
            (e.action, e.reviewer) for e in s.exec(select(JudgmentEvent).order_by(JudgmentEvent.id)).all()
        ]


def test_the_evaluation_detail_card_reviews_its_metric_and_shows_the_history(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page("pages/evaluations.py", query={"snapshot": "snap_a"}, reviewer="ayse")
    key = f"evaluations_review_{ids['clarity']}"
    at.number_input(key=f"{key}_value").set_value(3)
    at.text_area(key=f"{key}_reason").input("Too long")
    at.button(key=f"{key}_overrule").click().run()
    assert stored(app_engine, ids["clarity"]).user_decision == "3"
    assert any("Overruled snap" in s.value for s in at.success)
    history = next(d.value for d in at.dataframe if "action" in d.value.columns)
    assert history[["reviewer", "action", "from", "to", "reason"]].values.tolist() == [
        ["ayse", "overruled", "4", "3", "Too long"]
    ]
    assert not at.exception


def test_an_undo_puts_the_keys_on_the_reopened_row(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['safety'])}_confirm").click().run()  # the second row, by mouse
    assert row_order(at) == [ids["clarity"]]
    at.button(key="review_undo").click().run()
    assert row_order(at) == [ids["clarity"], ids["safety"]]
    assert shortcut_of(at, f"{row_key(ids['safety'])}_confirm") == "y"
    assert not at.exception


def test_tooltips_escape_the_change_id_and_the_judges_decision(app_engine, open_page) -> None:
    """help= texts render Markdown too: an imported change id or decision must not become a link."""
    payload = "[click](https://evil.example)"
    ids = evaluation(app_engine, payload, hours=0)
    with session_scope(app_engine) as s:
        j = s.get(Judgment, ids["safety"])
        assert j is not None
        j.decision = "**5**"
        s.add(j)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"{row_key(ids['clarity'])}_confirm").click().run()
    confirm_help = at.button(key=f"{row_key(ids['safety'])}_confirm").help
    assert "5" in confirm_help and not UNESCAPED.search(confirm_help), confirm_help
    undo_help = at.button(key="review_undo").help
    assert "evil" in undo_help and not UNESCAPED.search(undo_help), undo_help
    assert not at.exception


def test_two_reviewers_are_handed_different_evaluations_and_a_reload_returns_to_yours(
    any_app_engine, open_page
) -> None:
    """Issue 26's first complaint: both were handed the same evaluation and one's work was refused."""
    evaluation(any_app_engine, "snap_a", hours=0)
    evaluation(any_app_engine, "snap_b", hours=1)
    ayse = open_page(PAGE, reviewer="ayse")
    bora = open_page(PAGE, reviewer="bora")
    assert headings(ayse) == ["Evaluation snap_a"]
    assert headings(bora) == ["Evaluation snap_b"]
    # A reload (a new session of the same reviewer) continues at her evaluation, not the oldest free one.
    bora_again = open_page(PAGE, reviewer="bora")
    assert headings(bora_again) == ["Evaluation snap_b"]
    assert not (ayse.exception or bora.exception or bora_again.exception)


def test_skipped_items_are_remembered_after_a_reload(app_engine, open_page) -> None:
    evaluation(app_engine, "snap_a", hours=0)
    evaluation(app_engine, "snap_b", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key="review_skip").click().run()
    assert headings(at) == ["Evaluation snap_b"]
    again = open_page(PAGE, reviewer="ayse")
    assert headings(again) == ["Evaluation snap_b"]
    again.button(key="review_skip").click().run()
    assert any("Only skipped items are left (2)" in i.value for i in again.info)
    assert not again.exception
