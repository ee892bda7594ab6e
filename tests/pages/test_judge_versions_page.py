"""The Judge versions page (/judge-versions) under AppTest: edit a rubric, re-judge against the local
OpenAI-compatible server, find the new version on Analytics; an older evaluation keeps its rubric."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from lib import judge
from lib.corrections import record_review
from lib.db import session_scope
from lib.metrics import upsert_metric_definitions
from lib.models import JudgeVerdict, JudgeVersion, Judgment
from lib.safe_markdown import escape_markdown
from tests.llm_server import LLMServer, json_reply
from tests.test_judge import RUBRIC, STAGE2_PAYLOAD, evaluation, stage1_payload

pytestmark = pytest.mark.timeout(240)

PAGE = "pages/judge_versions.py"
NEW_TEXT = "Strict: one unsupported step breaks the argument."


def _judged_and_reviewed(engine: Engine, llm_server: LLMServer) -> str:
    """One evaluation judged by the built-in judge (its v1) and every judgment reviewed."""
    with session_scope(engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    snapshot_id = judge.judge_evaluation(engine=engine, evaluation=evaluation(), reviewer="ayse")
    with Session(engine) as session:
        rows = session.exec(select(Judgment).where(col(Judgment.snapshot_id) == snapshot_id)).all()
        targets = [(j.id, j.version, j.metric) for j in rows]
    for judgment_id, version, metric in targets:
        with session_scope(engine) as session:
            overrule = metric == "coherence"
            record_review(
                session=session, judgment_id=judgment_id, expected_version=version,
                action="overrule" if overrule else "confirm", user_decision="2" if overrule else None,
                reviewer="ayse", reason="needs a clearer line" if overrule else None,
            )  # fmt: skip
    return snapshot_id


def test_edit_rubric_rejudge_and_see_the_new_version_on_analytics(
    app_engine: Engine, llm_server: LLMServer, open_page
) -> None:
    snapshot_id = _judged_and_reviewed(app_engine, llm_server)
    at = open_page(PAGE, reviewer="ayse")
    assert not at.exception
    assert at.selectbox(key="versions_product").value == "acme"
    assert at.selectbox(key="versions_pick").value == "v1"

    at.text_area(key="rubric_text_acme_coherence").input(NEW_TEXT)
    at.text_input(key="rubric_version_name").input("v2: stricter coherence")
    at.button(key="rubric_save").click().run()
    assert not at.exception
    assert any(escape_markdown("Saved as version v2: stricter coherence.") == s.value for s in at.success)
    assert at.selectbox(key="versions_pick").value == "v2: stricter coherence"
    assert any(NEW_TEXT in c.value for c in at.code)  # the rubric text's line diff

    # Re-judge the reviewed evaluation with v2: the reviewer's decisions stay, v2's are recorded.
    reply = stage1_payload()
    reply["independent_scores"]["coherence"]["score"] = 2
    llm_server.script(json_reply(reply))
    at.selectbox(key="rejudge_version").select("v2: stricter coherence")
    at.number_input(key="rejudge_size").set_value(1)
    at.button(key="rejudge_run").click().run()
    assert not at.exception
    assert any(
        escape_markdown("re-judged 1 of 1 evaluations of acme with v2: stricter coherence") in s.value
        for s in at.success
    )
    assert (
        NEW_TEXT
        in llm_server.requests[-1]["messages"][0]["content"]
        + llm_server.requests[-1]["messages"][-1]["content"]
    )
    with Session(app_engine) as session:
        v2 = session.exec(select(JudgeVersion).where(JudgeVersion.name == "v2: stricter coherence")).one()
        judgments = {j.metric: j for j in session.exec(select(Judgment)).all()}
        # Every re-judge agreed with the reviewer, so every entry is kept as reviewed (seed 004) and
        # v2's decisions are kept beside them.
        assert {m: (j.decision, j.user_decision) for m, j in judgments.items()} == {
            "coherence": ("3", "2"), "groundedness": ("0.5", "0.5"), "fluency": ("4", "4")}  # fmt: skip
        verdicts = session.exec(select(JudgeVerdict).where(JudgeVerdict.judge_version_id == v2.id)).all()
        assert sorted(v.decision for v in verdicts) == ["0.5", "2", "4"]

    analytics = open_page("pages/analytics.py", reviewer="ayse")
    assert not analytics.exception
    # AppTest exposes no dataframe keys: the per-version table is the one with a "version" column and kappa.
    table = next(d.value for d in analytics.dataframe if {"version", "kappa"} <= set(d.value.columns))
    rows = table[table["version"] == "v2: stricter coherence"]
    assert len(rows) == 3 and rows["exact_agreement"].str.contains(r"\[").all()
    assert set(table["version"]) == {"v1", "v2: stricter coherence"}

    # The older evaluation still shows the rubric it was judged under.
    detail = open_page("pages/evaluations.py", query={"snapshot": snapshot_id}, reviewer="ayse")
    assert not detail.exception
    assert any(escape_markdown("Judge version: v1 (") in c.value for c in detail.caption)
    rubric = [e for e in detail.expander if e.label == "Rubric this evaluation was judged under"]
    shown = " ".join(m.value for m in rubric[0].markdown)
    assert "Does the answer hang together" in shown and NEW_TEXT not in shown
