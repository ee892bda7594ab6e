"""The Judge versions page (/judge-versions) under AppTest: edit a rubric, re-judge against the local
OpenAI-compatible server, find the new version on Analytics; an older evaluation keeps its rubric."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from lib import importer, judge
from lib.corrections import record_review
from lib.db import session_scope
from lib.metrics import metrics_for_product, upsert_metric_definitions
from lib.models import EvaluationSnapshot, JudgeVerdict, JudgeVersion, Judgment
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
    # v1 against v2 on the evaluation both judged: one pair per metric each side, and the weekly
    # timeline pools each version's three pairs (v1 missed coherence, 3 against the reviewer's 2).
    compared = next(d.value for d in analytics.dataframe if "pairs_a" in d.value.columns)
    assert sorted(compared["metric_name"]) == ["Coherence", "Fluency", "Groundedness"]
    assert (compared["pairs_a"] == 1).all() and (compared["pairs_b"] == 1).all()
    weekly = next(d.value for d in analytics.dataframe if {"version_id", "week"} <= set(d.value.columns))
    assert {r.version: (r.pairs, r.exact_agreement) for r in weekly.itertuples()} == {
        "v1": (3, pytest.approx(2 / 3)), "v2: stricter coherence": (3, 1.0)}  # fmt: skip
    assert set(table["first_week"]) == set(table["last_week"]) == set(weekly["week"])

    # The older evaluation still shows the rubric it was judged under.
    detail = open_page("pages/evaluations.py", query={"snapshot": snapshot_id}, reviewer="ayse")
    assert not detail.exception
    assert any(escape_markdown("Judge version: v1 (") in c.value for c in detail.caption)
    rubric = [e for e in detail.expander if e.label == "Rubric this evaluation was judged under"]
    shown = " ".join(m.value for m in rubric[0].markdown)
    assert "Does the answer hang together" in shown and NEW_TEXT not in shown


def test_add_and_remove_a_metric_and_a_refused_edit_changes_nothing(app_engine: Engine, open_page) -> None:
    old = [{k: v for k, v in m.items() if k != "product"} for m in RUBRIC]
    with session_scope(app_engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
        importer.import_evaluations(
            session=session,
            records=[{"question": "q", "model_answer": "a", "product": "acme",
                      "judge_scores": {"coherence": 2, "fluency": 4}, "user_scores": {"fluency": 3},
                      "judge_version": {"name": "pipeline v1", "rubric": old}}],
            reviewer="ayse",
        )  # fmt: skip
        snapshot_id = session.exec(select(EvaluationSnapshot.id)).one()
    at = open_page(PAGE, reviewer="ayse")
    assert not at.exception
    assert any("A removed metric's judgments keep showing under the version" in c.value for c in at.caption)

    at.checkbox(key="rubric_remove_acme_fluency").check()
    at.text_input(key="rubric_add_slug_acme").input("tone")
    at.text_input(key="rubric_add_name_acme").input("Tone")
    at.number_input(key="rubric_add_min_acme").set_value(0.0)
    at.number_input(key="rubric_add_max_acme").set_value(10.0)
    at.text_area(key="rubric_add_text_acme").input("Is it polite?")
    at.button(key="rubric_save").click().run()
    assert not at.exception
    assert [s.value for s in at.success] == [
        escape_markdown("Saved as version v3: rubric tone, rubric fluency (added tone; removed fluency).")
    ]
    diff = next(d.value for d in at.dataframe if {"what", "change"} <= set(d.value.columns))
    assert set(zip(diff["what"], diff["change"], strict=True)) == {
        ("rubric: tone", "Metric added"), ("rubric: fluency", "Metric removed")}  # fmt: skip
    # The added metric is now one of the form's own rows; the add fields are empty again.
    assert at.text_input(key="rubric_name_acme_tone").value == "Tone"
    assert at.text_input(key="rubric_add_slug_acme").value == ""
    assert not [w for w in at.checkbox if w.key == "rubric_remove_acme_fluency"]

    def state() -> tuple[list[tuple[str, float]], int]:
        with Session(app_engine) as session:
            return (
                [(m.slug, m.max_value) for m in metrics_for_product(session=session, product="acme")],
                len(session.exec(select(JudgeVersion)).all()),
            )

    assert state() == ([("coherence", 3.0), ("groundedness", 1.0), ("tone", 10.0)], 3)
    at.text_input(key="rubric_add_slug_acme").input("coherence")
    at.text_input(key="rubric_add_name_acme").input("Coherence again")
    at.button(key="rubric_save").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        escape_markdown(
            "Nothing was saved: metric 'coherence' is in the rubric already; a slug can appear only once"
        )
    ]
    assert state() == ([("coherence", 3.0), ("groundedness", 1.0), ("tone", 10.0)], 3)

    # The evaluation judged with fluency still shows it, under the rubric it was judged with.
    detail = open_page("pages/evaluations.py", query={"snapshot": snapshot_id}, reviewer="ayse")
    assert not detail.exception
    assert any(
        "**Fluency**" in m.value and "Not in the product's current rubric" in m.value for m in detail.markdown
    )


def test_a_scale_an_import_inferred_is_marked_and_stays_inferred_until_the_lead_changes_it(
    app_engine: Engine, open_page
) -> None:
    from lib.source_records import SourceEvaluation, SourceVerdict

    tone = SourceEvaluation(
        where="x", product="acme", question="q", answer="a", verdicts=[SourceVerdict("tone", 3)]
    )
    with session_scope(app_engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
        importer.import_source_evaluations(session=session, evaluations=[tone], source="t")

    def inferred() -> dict[str, tuple[float, bool]]:
        with Session(app_engine) as session:
            return {
                m.slug: (m.max_value, m.scale_inferred)
                for m in metrics_for_product(session=session, product="acme")
            }

    at = open_page(PAGE, reviewer="ayse")
    assert not at.exception
    marked = [c.value for c in at.caption if "inferred from imported scores" in c.value]
    assert marked == ["Scale 0–3 inferred from imported scores: a later import's scores outside it widen it. "
                      "Change the scale here to fix it."]  # fmt: skip
    at.text_area(key="rubric_text_acme_tone").input("Is the tone warm?")
    at.button(key="rubric_save").click().run()
    assert not at.exception and at.success
    assert inferred()["tone"] == (3.0, True)  # only its text changed: still growing
    at.number_input(key="rubric_max_acme_tone").set_value(5.0)
    at.button(key="rubric_save").click().run()
    assert not at.exception and at.success
    assert inferred()["tone"] == (5.0, False)
    assert not [c for c in at.caption if "inferred from imported scores" in c.value]
