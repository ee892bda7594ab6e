"""The judge-alignment lab (issue 16): no leakage, sampling, measures, resume, cancel, CLI.

The experiment tests run the real openai client against tests/llm_server.py, scripted as a judge
that can only find the reviewers' answer in the correction history: for an answer about topic K it
copies the reviewer's decision of an earlier history entry about topic K, and otherwise says 3.
Every topic is judged twice (an early evaluation A and a later one B, both corrected by a
reviewer 30 minutes after creation), so with honest as-of history only the B evaluations can
be right; leaking a later or an own correction would make the A evaluations right too.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine
from sqlmodel import select

from lib import alignment, analytics
from lib.alignment import ExperimentError, ExperimentSpec
from lib.auth import Actor, PermissionDenied, system_actor
from lib.config import get_settings, reset_settings
from lib.corrections import select_history
from lib.db import session_scope
from lib.models import (
    AlignmentCall,
    AlignmentExperiment,
    AlignmentItem,
    EvaluationSnapshot,
    Judgment,
    MetricDefinition,
    SessionNote,
)
from lib.notes import relevant_notes
from lib.relevance import apply_score, pinned_as_of, record_audit, relevance_for_notes, set_manual_pin
from lib.scripted_llm import json_reply, server_error
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

PRODUCT = "lab"
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
# The reviewers' final decision per topic; the original judge said 3 every time.
TRUTH = [1, 2, 4, 5, 2, 4, 3]
ITEMS = 2 * len(TRUTH)


def created(kind: str, topic: int) -> datetime:
    return T0 + timedelta(hours=topic if kind == "A" else 10 + topic)


def seed_lab(engine: Engine) -> None:
    with session_scope(engine) as session:
        session.add(
            MetricDefinition(
                product=PRODUCT, slug="accuracy", display_name="Accuracy", description="Is it right?"
            )
        )
        for kind in ("A", "B"):
            for topic, truth in enumerate(TRUTH):
                sid = f"snap-{kind}-{topic}"
                at = created(kind, topic)
                session.add(
                    EvaluationSnapshot(
                        id=sid,
                        created_at=at,
                        question=f"Question {kind}{topic}",
                        model_answer=f"Answer about topic-{topic}.",
                        product=PRODUCT,
                        primary_metric="accuracy",
                        judge_scores_json={"accuracy": {"score": 3, "reason": "x"}},
                        user_scores_json={"accuracy": truth},
                    )
                )
                session.flush()
                session.add(
                    Judgment(
                        change_id=f"{sid}:accuracy",
                        product=PRODUCT,
                        metric="accuracy",
                        snapshot_id=sid,
                        decision="3",
                        user_decision=str(truth),
                        reviewer="rita",
                        timestamp=at,
                        reviewed_at=at + timedelta(minutes=30),
                        description=f"topic-{topic}",
                    )
                )


def scripted_judge(body: dict[str, Any]) -> Any:
    """A judge that knows nothing but what the correction history in its prompt says."""
    prompt = "\n".join(str(m.get("content") or "") for m in body["messages"] if m["role"] == "user")
    topic = re.search(r"<<<ANSWER\n.*?topic-(\d+)", prompt, re.S)
    assert topic is not None
    history = prompt.split("## Correction history for this product", 1)[1].split("## Cross-session notes", 1)[
        0
    ]
    score = 3
    entries = re.split(r"\n(?=\d+\. \[)", history)
    for entry in entries:
        if re.search(rf"\| topic-{topic.group(1)}\b", entry):
            reviewer = re.search(r"Reviewer's decision: (\d+)", entry)
            judge = re.search(r"AI decision: (\d+)", entry)
            score = int((reviewer or judge).group(1))  # type: ignore[union-attr]
            break
    answer = f"Answer about topic-{topic.group(1)}."
    return json_reply(
        {
            "independent_scores": {
                "accuracy": {
                    "score": score,
                    "confidence": 0.8,
                    "rationale": "The answer fits the rubric here.",
                }
            },
            "evidence": {
                "accuracy": [
                    {"quote": answer, "start": 0, "end": len(answer), "why": "the claim", "better": "cite it"}
                ]
            },
        }
    )


@pytest.fixture
def judge_server(llm_server):  # type: ignore[no-untyped-def]
    llm_server.responder = scripted_judge
    return llm_server


# ---------------------------------------------------------------------------------------------
# No leakage


def test_history_as_of_excludes_later_reviews_and_the_item_itself(engine) -> None:
    seed_lab(engine)
    with session_scope(engine, read_only=True) as session:
        as_of = created("A", 3)
        chosen = select_history(session, PRODUCT, as_of=as_of, exclude_snapshot="snap-A-3")
        assert {j.snapshot_id for j in chosen} == {"snap-A-0", "snap-A-1", "snap-A-2"}
        # Created before the moment but reviewed after it: its review was not known then.
        moment = created("A", 2) + timedelta(minutes=10)
        chosen = select_history(session, PRODUCT, as_of=moment)
        assert {j.snapshot_id for j in chosen} == {"snap-A-0", "snap-A-1"}
        # Without the window, everything (the live judge's history) is there.
        assert len(select_history(session, PRODUCT)) == ITEMS


def test_notes_as_of_excludes_notes_written_later(engine) -> None:
    seed_lab(engine)
    with session_scope(engine) as session:
        session.add(SessionNote(timestamp=T0, note_type="TIP", content="early tip", session_id="s1"))
        session.add(
            SessionNote(
                timestamp=T0 + timedelta(days=1),
                note_type="TIP",
                content="late tip",
                session_id="s2",
                pinned=True,
            )
        )
    with session_scope(engine, read_only=True) as session:
        moment = T0 + timedelta(hours=1)
        assert [n.content for n in relevant_notes(session, "en", as_of=moment)] == ["early tip"]
        ranked = relevant_notes(session, "en", tags=["lang:en"], as_of=moment)
        assert [n.content for n in ranked] == ["early tip"]  # the later pinned note too
        assert {n.content for n in relevant_notes(session, "en")} == {"early tip", "late tip"}


@pytest.mark.pg_repeats(
    "statements and lines of test_history_as_of_excludes_later_reviews_and_the_item_itself, test_notes_as_of_excludes_notes_written_later, test_tag_relevance_and_pins_are_those_recorded_by_the_moment"
)
def test_arm_prompts_show_only_the_past(engine) -> None:
    seed_lab(engine)
    with session_scope(engine) as session:
        session.add(
            SessionNote(
                timestamp=T0 + timedelta(days=2), note_type="TIP", content="future lesson", session_id="s"
            )
        )
        session.add(
            SessionNote(
                timestamp=T0 - timedelta(days=1), note_type="TIP", content="old lesson", session_id="s"
            )
        )
    experiment = AlignmentExperiment(product=PRODUCT, arms=["bare", "history", "notes", "full"])
    settings = get_settings()
    with session_scope(engine, read_only=True) as session:
        snapshot = session.get(EvaluationSnapshot, "snap-B-0")
        assert snapshot is not None
        full = alignment.arm_prompt(session, experiment, "full", snapshot, settings)
        assert "snap-A-0:accuracy" in full.history_block and "snap-B-0" not in full.history_block
        assert "old lesson" in full.notes_block and "future lesson" not in full.notes_block
        bare = alignment.arm_prompt(session, experiment, "bare", snapshot, settings)
        assert "snap-A" not in bare.history_block and not bare.notes_block
        notes_arm = alignment.arm_prompt(session, experiment, "notes", snapshot, settings)
        assert "snap-A" not in notes_arm.history_block and "old lesson" in notes_arm.notes_block
        first = session.get(EvaluationSnapshot, "snap-A-0")
        assert first is not None
        history = alignment.arm_prompt(session, experiment, "history", first, settings)
        assert "snap-" not in history.history_block  # nothing was reviewed before the first evaluation


def test_tag_relevance_and_pins_are_those_recorded_by_the_moment(engine) -> None:
    """`full` filters, boosts and pins notes with the relevance known at t, never a later score."""
    moment = T0 + timedelta(days=1)
    with session_scope(engine) as session:
        notes = {
            content: SessionNote(
                timestamp=T0 + timedelta(minutes=minute), note_type="TIP", content=content, session_id="s"
            )
            for minute, content in enumerate(["star later", "bad early", "bad later", "plain"], start=1)
        }
        session.add_all(notes.values())
        session.flush()
        ids = {content: note.id for content, note in notes.items()}

        def scores(content: str, raw: float, start: datetime, times: int) -> None:
            for i in range(times):
                apply_score(
                    session=session,
                    note_id=ids[content],
                    tags=["lang:en"],
                    raw=raw,
                    at=start + timedelta(hours=i),
                )

        scores("bad early", -3.0, T0 + timedelta(hours=1), 3)  # filtered by the moment
        scores("bad later", -3.0, moment + timedelta(hours=1), 3)  # filtered only afterwards
        scores("star later", 3.0, moment + timedelta(hours=1), 5)  # auto-pinned only afterwards
        session.add(
            EvaluationSnapshot(
                id="snap-then",
                created_at=moment,
                question="Q",
                model_answer="Answer about topic-0.",
                product=PRODUCT,
                primary_metric="accuracy",
            )
        )
        session.add(
            MetricDefinition(product=PRODUCT, slug="accuracy", display_name="Accuracy", description="Right?")
        )
    with session_scope(engine, read_only=True) as session:
        assert session.get(SessionNote, ids["star later"]).pinned  # type: ignore[union-attr]
        today = relevant_notes(session, "en", tags=["lang:en"])
        assert [n.content for n in today] == ["star later", "plain"]
        then = relevant_notes(session, "en", tags=["lang:en"], as_of=moment)
        assert [n.content for n in then] == ["plain", "bad later", "star later"]
        assert relevance_for_notes(
            session, [ids["bad later"], ids["star later"]], ["lang:en"], as_of=moment
        ) == {
            ids["bad later"]: ("neutral", 0.0),
            ids["star later"]: ("neutral", 0.0),
        }
        # The experiment's `full` arm is that same selection, as of the judged evaluation's creation.
        snapshot = session.get(EvaluationSnapshot, "snap-then")
        assert snapshot is not None
        experiment = AlignmentExperiment(product=PRODUCT, arms=["full"])
        full = alignment.arm_prompt(session, experiment, "full", snapshot, get_settings())
        shown = re.findall(r"(star later|bad early|bad later|plain)", full.notes_block)
        assert shown == ["plain", "bad later", "star later"]


def test_manual_and_match_pins_count_only_from_when_they_were_made(engine) -> None:
    moment = T0 + timedelta(days=1)
    with session_scope(engine) as session:
        notes = [
            SessionNote(timestamp=T0, note_type="TIP", content=content, session_id="s")
            for content in ("pinned before", "pinned after", "matched after")
        ]
        session.add_all(notes)
        session.flush()
        before, after, matched = (int(n.id or 0) for n in notes)
        set_manual_pin(session=session, note_id=before, pinned=True, reviewer=system_actor("rita"), at=T0)
        set_manual_pin(
            session=session,
            note_id=after,
            pinned=True,
            reviewer=system_actor("rita"),
            at=moment + timedelta(hours=1),
        )
        for i in range(get_settings().match_pin_threshold):
            record_audit(
                session=session,
                session_id=f"run-{i}",
                shown_note_ids=[matched],
                env_tags=["lang:en"],
                at=moment + timedelta(minutes=i + 1),
            )
    with session_scope(engine, read_only=True) as session:
        rows = list(session.exec(select(SessionNote)).all())
        assert all(n.pinned for n in rows)
        assert pinned_as_of(session=session, notes=rows, as_of=moment) == {before}
        assert pinned_as_of(session=session, notes=rows, as_of=moment + timedelta(days=1)) == {
            before,
            after,
            matched,
        }


# ---------------------------------------------------------------------------------------------
# Sampling and set-up


def test_stratified_sample_is_proportional_and_seeded() -> None:
    metrics = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    picked = alignment.stratified_sample(metrics, 20, seed=7)
    assert sorted(metrics[i] for i in picked).count("a") == 12
    assert [metrics[i] for i in picked].count("b") == 6
    assert [metrics[i] for i in picked].count("c") == 2
    assert picked == alignment.stratified_sample(metrics, 20, seed=7)
    assert picked != alignment.stratified_sample(metrics, 20, seed=8)
    assert alignment.stratified_sample(metrics, 500, seed=1) == list(range(100))


def test_bad_specs_change_nothing(engine) -> None:
    seed_lab(engine)
    with pytest.raises(ExperimentError, match="unknown arm"):
        alignment.parse_arms("bare,magic")
    with pytest.raises(ExperimentError, match="not a metric"):
        alignment.create_experiment(engine, ExperimentSpec(product=PRODUCT, metrics=("nope",)))
    with pytest.raises(ExperimentError, match="edited rubric"):
        alignment.create_experiment(engine, ExperimentSpec(product=PRODUCT, arms=("bare", "rubric")))
    with pytest.raises(ExperimentError, match="no reviewed judgments"):
        alignment.create_experiment(
            engine, ExperimentSpec(product=PRODUCT, start=date(2030, 1, 1), end=date(2030, 2, 1))
        )
    with session_scope(engine, read_only=True) as session:
        assert session.exec(select(AlignmentExperiment)).all() == []


# ---------------------------------------------------------------------------------------------
# A whole experiment against the scripted judge


def _kappa_reference(u: np.ndarray, j: np.ndarray) -> float:
    """Quadratic kappa written differently: 1 - mean (u-j)^2 / mean over all (u_a - j_b)^2."""
    observed = np.mean((u - j) ** 2)
    expected = np.mean((u[:, None] - j[None, :]) ** 2)
    return float(1 - observed / expected)


def test_history_makes_the_judge_agree_and_the_figures_are_measured(engine, judge_server) -> None:
    seed_lab(engine)
    spec = ExperimentSpec(product=PRODUCT, sample_size=50, arms=("bare", "history"))
    experiment_id = alignment.create_experiment(engine, spec)
    seen: list[tuple[int, int]] = []
    report = alignment.run_experiment(
        engine, experiment_id, concurrency=2, progress=lambda d, t: seen.append((d, t))
    )
    assert (report.status, report.done, report.failed, report.pending) == ("finished", 2 * ITEMS, 0, 0)
    assert seen[0] == (0, 2 * ITEMS) and seen[-1] == (2 * ITEMS, 2 * ITEMS)
    assert len(judge_server.chat_requests) == 2 * ITEMS

    with session_scope(engine, read_only=True) as session:
        result = alignment.measure(session, experiment_id, resamples=200)
    rows = result.measures.set_index("arm")
    bare, history = rows.loc["bare"], rows.loc["history"]
    assert bare["pairs"] == history["pairs"] == ITEMS
    # bare says 3 everywhere: right only on topic 6 (twice).
    assert bare["exact_agreement"] == pytest.approx(2 / ITEMS)
    assert bare["within_1_agreement"] == pytest.approx(10 / ITEMS)
    assert bare["mean_rescaled_gap"] == pytest.approx(16 / ITEMS)
    assert bare["weighted_kappa"] == pytest.approx(0.0)
    assert np.isnan(bare["spearman"])
    # history: every B evaluation finds its topic's earlier correction; A evaluations cannot.
    assert history["exact_agreement"] == pytest.approx(8 / ITEMS)
    assert history["within_1_agreement"] == pytest.approx(12 / ITEMS)
    assert history["mean_rescaled_gap"] == pytest.approx(8 / ITEMS)
    u = np.array(TRUTH * 2, dtype=float)
    j = np.array([3] * len(TRUTH) + TRUTH, dtype=float)
    assert history["weighted_kappa"] == pytest.approx(_kappa_reference(u, j))
    assert history["spearman"] == pytest.approx(0.6913, abs=1e-4)
    for name in alignment.MEASURES:
        lo, hi, value = history[f"{name}_lo"], history[f"{name}_hi"], history[name]
        assert lo <= value + 1e-9 and value - 1e-9 <= hi
    assert history["exact_agreement_lo"] < history["exact_agreement_hi"]

    paired = result.paired.set_index("arm").loc["history"]
    assert (paired["flipped_to_agree"], paired["flipped_away"], paired["net"]) == (6, 0, 6)
    assert set(result.flips["snapshot_id"]) == {f"snap-B-{t}" for t in range(6)}
    assert set(result.flips["direction"]) == {"to_agree"}

    cost = result.cost.set_index("arm")
    assert cost.loc["bare", "llm_calls"] == cost.loc["history", "llm_calls"] == ITEMS
    # The server counts prompt words as tokens: the history arm's prompts are longer.
    assert cost.loc["history", "prompt_tokens"] > cost.loc["bare", "prompt_tokens"] > 0
    assert cost.loc["bare", "completion_tokens"] > 0


def test_a_failed_call_is_recorded_as_failed_and_a_rerun_retries_only_it(engine, judge_server) -> None:
    seed_lab(engine)
    experiment_id = alignment.create_experiment(engine, ExperimentSpec(product=PRODUCT, arms=("bare",)))
    # OVERRULE_LLM_MAX_RETRIES=1: the client tries twice, then the call is recorded as failed.
    judge_server.script(server_error(), server_error())
    report = alignment.run_experiment(engine, experiment_id)
    assert (report.status, report.failed, report.done) == ("incomplete", 1, ITEMS - 1)
    with session_scope(engine, read_only=True) as session:
        failed = session.exec(select(AlignmentCall).where(AlignmentCall.status == "failed")).one()
        assert failed.scores == {} and failed.error and "stage1" in failed.error
        result = alignment.measure(session, experiment_id, resamples=50)
        assert result.measures.loc[0, "pairs"] == ITEMS - 1
        assert result.cost.loc[0, "failed"] == 1
    before = len(judge_server.chat_requests)
    report = alignment.run_experiment(engine, experiment_id)
    assert (report.status, report.failed, report.done) == ("finished", 0, ITEMS)
    assert len(judge_server.chat_requests) == before + 1  # finished calls were kept
    assert before == ITEMS + 1  # the failed call's two attempts were both sent


def test_cancel_stops_between_calls_and_a_rerun_continues(engine, judge_server) -> None:
    seed_lab(engine)
    experiment_id = alignment.create_experiment(engine, ExperimentSpec(product=PRODUCT, arms=("bare",)))

    def cancelling(body: dict[str, Any]) -> Any:
        if len(judge_server.chat_requests) == 3:
            alignment.request_cancel(engine, experiment_id, by=system_actor("lead"))
        return scripted_judge(body)

    judge_server.responder = cancelling
    report = alignment.run_experiment(engine, experiment_id, concurrency=1)
    assert (report.status, report.done, report.pending) == ("cancelled", 3, ITEMS - 3)
    judge_server.responder = scripted_judge
    report = alignment.run_experiment(engine, experiment_id)
    assert (report.status, report.done) == ("finished", ITEMS)
    assert len(judge_server.chat_requests) == ITEMS


@pytest.mark.pg_repeats("statements and lines of test_cancel_stops_between_calls_and_a_rerun_continues")
def test_only_those_who_may_start_an_experiment_may_cancel_it(engine) -> None:
    seed_lab(engine)
    experiment_id = alignment.create_experiment(engine, ExperimentSpec(product=PRODUCT, sample_size=2))
    with pytest.raises(PermissionDenied):
        alignment.request_cancel(engine, experiment_id, by=Actor("rita", "reviewer"))
    with session_scope(engine, read_only=True) as session:
        assert not session.get(AlignmentExperiment, experiment_id).cancel_requested  # type: ignore[union-attr]
    alignment.request_cancel(engine, experiment_id, by=Actor("lena", "lead"))
    with session_scope(engine, read_only=True) as session:
        assert session.get(AlignmentExperiment, experiment_id).cancel_requested  # type: ignore[union-attr]


@pytest.mark.pg_repeats(
    "statements and lines of test_a_failed_call_is_recorded_as_failed_and_a_rerun_retries_only_it, test_history_as_of_excludes_later_reviews_and_the_item_itself, test_tag_relevance_and_pins_are_those_recorded_by_the_moment"
)
def test_edited_rubric_arm_sends_the_edited_text(engine, judge_server) -> None:
    seed_lab(engine)
    spec = ExperimentSpec(
        product=PRODUCT,
        sample_size=2,
        arms=("full", "rubric"),
        edited_rubric={"accuracy": "EDITED RUBRIC TEXT"},
    )
    experiment_id = alignment.create_experiment(engine, spec)
    alignment.run_experiment(engine, experiment_id)
    with session_scope(engine, read_only=True) as session:
        calls = {c.arm: c for c in session.exec(select(AlignmentCall)).all()}
        assert "EDITED RUBRIC TEXT" in (calls["rubric"].prompt or "")
        assert "EDITED RUBRIC TEXT" not in (calls["full"].prompt or "")
        assert len(session.exec(select(AlignmentItem)).all()) == 2


def test_cli_runs_and_a_rerun_continues(sqlite_engine, sqlite_url, judge_server, monkeypatch, capsys) -> None:
    from lib.__main__ import main

    seed_lab(sqlite_engine)
    monkeypatch.setenv("OVERRULE_DATABASE_URL", sqlite_url)
    reset_settings()
    judge_server.script(server_error(), server_error())
    args = ["align", "--product", PRODUCT, "--sample", "14", "--arms", "bare,history"]
    assert main(args) == 1
    out = capsys.readouterr()
    assert "created experiment 1" in out.err and "1 failed" in out.out
    assert main(args) == 0
    out = capsys.readouterr()
    assert "continuing experiment 1" in out.err and "finished; 28 calls done, 0 failed" in out.out
    assert "28/28" in out.err
    table: dict[str, str] = {}
    for line in out.out.splitlines():  # the comparison table comes first, then pairs and cost
        table.setdefault(line.split()[0] if line.strip() else "", line)
    assert (
        table["bare"].split()[3] == f"{2 / ITEMS:.2f}" and table["history"].split()[3] == f"{8 / ITEMS:.2f}"
    )
    assert len(judge_server.chat_requests) == 2 * ITEMS + 2


def test_analytics_measures_outside_sql() -> None:
    u, j = np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])
    assert analytics.spearman_rho(u, j) == pytest.approx(0.8)  # 1 - 6 * 2 / (4 * 15)
    assert np.isnan(analytics.spearman_rho(u, np.full(4, 3.0)))
    gaps = analytics.rescaled_gaps(np.array([0.0, 0.0]), np.array([0.25, 0.5]), 0.0, 1.0)
    assert gaps.tolist() == [1.0, 2.0]  # a 0-1 scale: a quarter is one step on the 1-5 span
    assert analytics.within_one(gaps).tolist() == [1.0, 0.0]


def test_cli_rubric_file_feeds_the_rubric_arm(
    sqlite_engine, sqlite_url, judge_server, monkeypatch, tmp_path
) -> None:
    from lib.__main__ import main

    seed_lab(sqlite_engine)
    monkeypatch.setenv("OVERRULE_DATABASE_URL", sqlite_url)
    reset_settings()
    edits = tmp_path / "edits.json"
    edits.write_text('["not an object"]', encoding="utf-8")
    args = ["align", "--product", PRODUCT, "--sample", "1", "--arms", "rubric", "--rubric-file", str(edits)]
    assert main(args) == 1
    edits.write_text('{"accuracy": "EDITED FROM A FILE"}', encoding="utf-8")
    assert main(args) == 0
    with session_scope(sqlite_engine, read_only=True) as session:
        call = session.exec(select(AlignmentCall)).one()
        assert call.arm == "rubric" and "EDITED FROM A FILE" in (call.prompt or "")


@pytest.mark.slow
def test_a_killed_run_resumes_keeping_its_finished_calls(
    sqlite_engine, sqlite_url, judge_server, monkeypatch
) -> None:
    """A real `python -m lib align` process is killed mid-call; the same command continues it."""
    import os
    import signal
    import subprocess
    import sys

    from lib.__main__ import main
    from lib.scripted_llm import stall

    seed_lab(sqlite_engine)
    monkeypatch.setenv("OVERRULE_DATABASE_URL", sqlite_url)
    reset_settings()

    def stalls_on_the_fifth(body: dict[str, Any]) -> Any:
        return stall(8.0) if len(judge_server.chat_requests) == 5 else scripted_judge(body)

    judge_server.responder = stalls_on_the_fifth
    args = ["align", "--product", PRODUCT, "--sample", "14", "--arms", "bare"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lib", *args],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: len(judge_server.chat_requests) >= 5, "the stalled fifth request")
        assert len(judge_server.chat_requests) == 5
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with session_scope(sqlite_engine, read_only=True) as session:
        statuses = [c.status for c in session.exec(select(AlignmentCall)).all()]
        assert statuses.count("done") == 4 and statuses.count("pending") == ITEMS - 4
        assert session.exec(select(AlignmentExperiment)).one().status == "running"
    judge_server.responder = scripted_judge
    assert main(args) == 0
    # The four finished calls were kept: only the killed one and the nine never started were sent.
    assert len(judge_server.chat_requests) == 5 + ITEMS - 4
    with session_scope(sqlite_engine, read_only=True) as session:
        assert session.exec(select(AlignmentExperiment)).one().status == "finished"
