"""Review queue page and the correction form under AppTest: what the reviewer sees and the rows written."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from lib import corrections
from lib.db import session_scope
from lib.highlight import strip_app_markup
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent

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


def overrule(at: AppTest, judgment_id: int, value: object, reason: str) -> AppTest:
    at.text_area(key=f"review_{judgment_id}_reason").input(reason)
    widget = at.number_input if isinstance(value, int | float) else at.selectbox
    widget(key=f"review_{judgment_id}_value").set_value(value)
    return at.button(key=f"review_{judgment_id}_overrule").click().run()


def progress_text(at: AppTest) -> str:
    return at.get("progress")[0].text


def subheaders(at: AppTest) -> list[str]:
    """Subheaders as a reader sees them (ids are Markdown-escaped in the page source)."""
    return [h.value.replace("\\", "") for h in at.subheader]


def test_queue_shows_progress_and_the_oldest_evaluation_first(app_engine, open_page) -> None:
    evaluation(app_engine, "snap_new", hours=5)
    evaluation(app_engine, "snap_old", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    assert progress_text(at).startswith("0 of 4 reviewed")
    assert subheaders(at) == ["Evaluation snap_old"]
    assert not at.exception


@pytest.mark.parametrize("shape", ["list", "seed"])
def test_evidence_shows_verified_items_with_their_stage_label(app_engine, open_page, shape) -> None:
    raw = [{"quote": "Paris", "start": 3, "end": 9, "why": "*names* it"}, {"quote": "Lyon <b>"}]
    evaluation(app_engine, "s1", evidence_json={"clarity": raw if shape == "list" else {"evidence": raw}})
    at = open_page(PAGE, reviewer="ayse")
    assert [e.label for e in at.expander if e.label.startswith("Evidence")] == ["Evidence (2)"]
    shown = [m.value for m in at.markdown]
    assert "> Paris" in shown and "**Why:** \\*names\\* it" in shown
    assert "> Lyon \\<b\\>" in shown
    assert [w.value for w in at.warning] == ["Evidence could not be verified"]
    assert any("Verified, position corrected" in c.value for c in at.caption)
    assert not at.exception


def test_overruling_writes_the_review_and_its_event(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = overrule(open_page(PAGE, reviewer="ayse"), ids["clarity"], 2, "Rambles before answering.")
    j = stored(app_engine, ids["clarity"])
    assert (j.user_decision, j.was_corrected, j.reviewer, j.version) == ("2", True, "ayse", 2)
    assert event_rows(app_engine) == [("snap_a:clarity", "ayse", "4", "2", "Rambles before answering.")]
    assert any("Overruled snap" in s.value for s in at.success)
    assert progress_text(at).startswith("1 of 2 reviewed")
    assert not at.exception


def test_after_the_last_metric_the_next_evaluation_loads(app_engine, open_page) -> None:
    first = evaluation(app_engine, "snap_a", hours=0)
    evaluation(app_engine, "snap_b", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key=f"review_{first['clarity']}_confirm").click().run()
    assert subheaders(at) == ["Evaluation snap_a"]  # one evaluation at a time, until it is done
    at.button(key=f"review_{first['safety']}_confirm").click().run()
    assert subheaders(at) == ["Evaluation snap_b"]
    assert stored(app_engine, first["safety"]).user_decision == "5"
    assert not at.exception


def test_overruling_without_a_reason_is_refused_and_writes_nothing(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")
    at.number_input(key=f"review_{ids['clarity']}_value").set_value(1)
    at.button(key=f"review_{ids['clarity']}_overrule").click().run()
    assert any("reason is required" in e.value for e in at.error)
    assert stored(app_engine, ids["clarity"]).version == 1 and event_rows(app_engine) == []
    assert not at.exception


def test_overruling_with_the_judges_own_score_is_refused(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = overrule(open_page(PAGE, reviewer="ayse"), ids["clarity"], 4, "same")
    assert any("equals the judge" in e.value for e in at.error)
    assert event_rows(app_engine) == []
    assert not at.exception


def test_without_a_reviewer_name_nothing_is_written(app_engine, open_page) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE)
    assert any("Enter your name" in w.value for w in at.warning)
    at.button(key=f"review_{ids['clarity']}_confirm").click().run()
    assert stored(app_engine, ids["clarity"]).user_decision is None and event_rows(app_engine) == []
    assert not at.exception


def test_a_concurrent_change_is_reported_with_the_other_decision_and_not_overwritten(
    app_engine, open_page
) -> None:
    ids = evaluation(app_engine, "snap_a")
    at = open_page(PAGE, reviewer="ayse")  # ayse now looks at version 1
    with session_scope(app_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=ids["clarity"],
            expected_version=1,
            action="overrule",
            user_decision=1,
            reviewer="bob",
            reason="bob's view",
        )
    at.button(key=f"review_{ids['clarity']}_confirm").click().run()
    message = " ".join(e.value for e in at.error)
    assert "Not saved" in message and "bob" in message and "bob's view" in message.replace("\\", "")
    j = stored(app_engine, ids["clarity"])
    assert (j.reviewer, j.user_decision, j.version) == ("bob", "1", 2)
    assert [r[1] for r in event_rows(app_engine)] == ["bob"]
    assert not at.exception


def test_skip_moves_to_the_next_item_and_skipped_items_come_back_on_request(app_engine, open_page) -> None:
    evaluation(app_engine, "snap_a", hours=0)
    evaluation(app_engine, "snap_b", hours=1)
    at = open_page(PAGE, reviewer="ayse")
    at.button(key="review_skip").click().run()
    assert subheaders(at) == ["Evaluation snap_b"]
    at.button(key="review_skip").click().run()
    assert any("Only skipped items are left" in i.value for i in at.info)
    at.button(key="review_unskip").click().run()
    assert subheaders(at) == ["Evaluation snap_a"]
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
    assert subheaders(at) == ["Evaluation snap_b"]
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
    # Everything else: every Markdown-active character arrives backslash-escaped.
    markdown = [v for v in shown if v not in html]
    assert markdown and not any(UNESCAPED.search(v) for v in markdown)
    assert not at.exception


def test_a_label_judgment_is_reviewed_with_its_label_set(app_engine, open_page) -> None:
    with session_scope(app_engine) as s:
        j = Judgment(
            change_id="github.com/o/r#7", product="acme", decision="INCLUDE", description="Adds login"
        )
        s.add(j)
        s.flush()
        jid = j.id
    at = open_page(PAGE, reviewer="ayse")
    assert at.selectbox(key=f"review_{jid}_value").options == ["INCLUDE", "EXCLUDE", "UNCERTAIN"]
    at = overrule(at, jid, "EXCLUDE", "Internal tooling only")
    assert (stored(app_engine, jid).user_decision, stored(app_engine, jid).was_corrected) == ("EXCLUDE", True)
    assert not at.exception


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
