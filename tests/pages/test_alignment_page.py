"""The Alignment lab page under AppTest: start an experiment, its progress, the comparison, flips, CSV."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from sqlmodel import select

from lib import alignment
from lib.config import get_settings
from lib.db import session_scope
from lib.models import AlignmentCall, AlignmentExperiment
from tests.test_alignment import ITEMS, PRODUCT, scripted_judge, seed_lab

pytestmark = pytest.mark.timeout(120)
PAGE = "pages/alignment.py"


def test_without_experiments_or_llm_the_page_says_what_to_do(app_engine, open_page) -> None:
    seed_lab(app_engine)
    at = open_page(PAGE)
    assert not at.exception
    assert any("No experiments yet" in i.value for i in at.info)
    assert any("No LLM is configured" in i.value for i in at.info)
    assert at.button(key="alignment_start").disabled
    assert "An experiment needs an LLM" in (at.button(key="alignment_start").help or "")


def test_a_finished_experiment_shows_the_comparison_and_the_flips(app_engine, open_page, llm_server) -> None:
    seed_lab(app_engine)
    llm_server.responder = scripted_judge
    spec = alignment.ExperimentSpec(product=PRODUCT, sample_size=ITEMS, arms=("bare", "history"))
    experiment_id = alignment.create_experiment(app_engine, spec)
    alignment.run_experiment(app_engine, experiment_id)
    at = open_page(PAGE)
    assert not at.exception
    table, paired, flips, cost = (frame.value for frame in at.dataframe)  # in page order
    assert list(table["arm"]) == ["bare", "history"]
    assert table.set_index("arm").loc["history", "exact_agreement"].startswith(f"{8 / ITEMS:.2f} [")
    assert paired.set_index("arm").loc["history", "flipped_to_agree"] == 6
    assert list(cost["llm_calls"]) == [ITEMS, ITEMS]
    assert set(flips["direction"]) == {"to_agree"} and len(flips) == 6
    assert any("topic-" in c.value for c in at.code)  # the prompt each arm saw
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download CSV", "Download items CSV", "Download calls CSV (prompts, scores, cost)"]
    with session_scope(app_engine, read_only=True) as session:
        calls = alignment.calls_frame(session, experiment_id)
    assert len(calls) == 2 * ITEMS and calls["prompt"].str.contains("topic-").all()
    assert set(calls["status"]) == {"done"} and calls["scores"].str.contains('"accuracy"').all()
    at.selectbox(key="alignment_measure").set_value("mean_rescaled_gap").run()
    assert not at.exception


def test_starting_from_the_page_runs_the_experiment(app_engine, open_page, llm_server) -> None:
    seed_lab(app_engine)
    llm_server.responder = scripted_judge
    at = open_page(PAGE, reviewer="lena")
    at.number_input(key="alignment_sample").set_value(4)
    at.multiselect(key="alignment_arms").set_value(["bare", "history"])
    at.button(key="alignment_start").click().run()
    assert not at.exception
    with session_scope(app_engine, read_only=True) as session:
        experiment = session.exec(select(AlignmentExperiment)).one()
        assert (experiment.created_by, experiment.arms, experiment.sample_size) == (
            "lena",
            ["bare", "history"],
            4,
        )
    assert experiment.id is not None
    wait_until_finished(app_engine, experiment.id)
    at.run()
    assert not at.exception
    assert "finished" in at.selectbox(key="alignment_experiment").format_func(experiment.id)


def wait_until_finished(engine, experiment_id: int) -> None:  # type: ignore[no-untyped-def]
    """The page ran the experiment in a thread of this process (lib.alignment.start_in_background):
    wait for that thread to end, then its row says finished."""
    for thread in threading.enumerate():
        if thread.name == f"alignment-{experiment_id}":
            thread.join()
    with session_scope(engine, read_only=True) as session:
        assert session.get(AlignmentExperiment, experiment_id).status == "finished"  # type: ignore[union-attr]


def test_the_rubric_arm_is_edited_on_the_page_stored_and_used(app_engine, open_page, llm_server) -> None:
    seed_lab(app_engine)
    llm_server.responder = scripted_judge
    at = open_page(PAGE, reviewer="lena")
    at.number_input(key="alignment_sample").set_value(2)
    at.multiselect(key="alignment_arms").set_value(["bare", "rubric"]).run()
    editor = at.text_area(key=f"alignment_rubric_{PRODUCT}_accuracy")
    assert editor.value == "Is it right?"  # prefilled with the current rubric
    at.button(key="alignment_start").click().run()  # unchanged: the same refusal as the CLI's
    assert not at.exception
    assert any("needs edited rubric text" in e.value for e in at.error)
    with session_scope(app_engine, read_only=True) as session:
        assert session.exec(select(AlignmentExperiment)).first() is None
    at.text_area(key=f"alignment_rubric_{PRODUCT}_accuracy").set_value("Score 5 only for <b>cited</b> facts.")
    at.button(key="alignment_start").click().run()
    assert not at.exception
    with session_scope(app_engine, read_only=True) as session:
        experiment = session.exec(select(AlignmentExperiment)).one()
        assert experiment.edited_rubric == {"accuracy": "Score 5 only for <b>cited</b> facts."}
    assert experiment.id is not None
    wait_until_finished(app_engine, experiment.id)
    with session_scope(app_engine, read_only=True) as session:
        calls = session.exec(select(AlignmentCall).where(AlignmentCall.experiment_id == experiment.id)).all()
        prompts = {c.arm: c.prompt or "" for c in calls}
    assert "only for <b>cited</b> facts" in prompts["rubric"]
    assert "only for" not in prompts["bare"] and "Is it right?" in prompts["bare"]
    at.run()
    assert not at.exception
    assert any("<b>cited</b>" in c.value for c in at.code)  # shown as text, never as HTML


def test_cancel_on_the_page_needs_a_name_and_then_flags_the_run(app_engine, open_page) -> None:
    seed_lab(app_engine)
    experiment_id = alignment.create_experiment(
        app_engine, alignment.ExperimentSpec(product=PRODUCT, sample_size=2)
    )

    def requested() -> bool:
        with session_scope(app_engine, read_only=True) as session:
            return bool(session.get(AlignmentExperiment, experiment_id).cancel_requested)  # type: ignore[union-attr]

    at = open_page(PAGE)
    at.button(key="alignment_cancel").click().run()
    assert any("to cancel an experiment" in w.value for w in at.warning) and not requested()
    at = open_page(PAGE, reviewer="lena")
    at.button(key="alignment_cancel").click().run()
    assert not at.exception
    assert requested()
    assert any(f"Experiment {experiment_id} stops" in i.value for i in at.info)


def test_a_scripted_judges_figures_are_labelled_as_such(app_engine, open_page) -> None:
    seed_lab(app_engine)
    scripted = replace(get_settings(), judge_model=alignment.SCRIPTED_JUDGE_PREFIX + "demo history policy")
    real = alignment.create_experiment(app_engine, alignment.ExperimentSpec(product=PRODUCT, sample_size=2))
    demo = alignment.create_experiment(
        app_engine, alignment.ExperimentSpec(product=PRODUCT, sample_size=2), settings=scripted
    )
    at = open_page(PAGE, query={"experiment": str(demo)})
    assert not at.exception
    assert any("come from a scripted judge, not a real model" in w.value for w in at.warning)
    at = open_page(PAGE, query={"experiment": str(real)})
    assert not any("scripted judge" in w.value for w in at.warning)


def test_the_latest_experiment_per_product_opens_by_its_link(app_engine, open_page) -> None:
    """The Analytics page links `/alignment?experiment=ID` for `latest_per_product` (its own page
    test cannot run here: the DuckDB worker of tests/pages/test_analytics.py dies on this machine)."""
    seed_lab(app_engine)
    first = alignment.create_experiment(app_engine, alignment.ExperimentSpec(product=PRODUCT, sample_size=2))
    latest = alignment.create_experiment(app_engine, alignment.ExperimentSpec(product=PRODUCT, sample_size=3))
    with session_scope(app_engine, read_only=True) as session:
        assert alignment.latest_per_product(session) == {PRODUCT: latest}
    at = open_page(PAGE, query={"experiment": str(first)})
    assert not at.exception
    assert at.selectbox(key="alignment_experiment").value == first
    at = open_page(PAGE)
    assert at.selectbox(key="alignment_experiment").value == latest  # newest first by default
