"""Judge versions (issue 28): content addressing, names, diffs, the built-in judge's stamp, imports.

The property tests run the real `ensure_version` on a database: the same configuration twice is one
version, and changing any one field makes another.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from lib import config as server_settings
from lib import corrections, importer, inspector, judge, judge_changes, judge_versions, version_agreement
from lib.auth import Actor, PermissionDenied
from lib.config import get_settings, reset_settings
from lib.corrections import record_review
from lib.db import session_scope
from lib.judge_versions import JudgeConfig, VersionError, content_hash, ensure_version, parse_version_ref
from lib.metrics import DEFAULT_METRICS, upsert_metric_definitions
from lib.models import (
    AlignmentExperiment,
    AuditEvent,
    EvaluationSnapshot,
    JudgeVerdict,
    JudgeVersion,
    Judgment,
    MetricDefinition,
)
from tests.cli import run_cli
from tests.llm_server import LLMServer, json_reply
from tests.test_judge import RUBRIC, STAGE2_PAYLOAD, evaluation, stage1_payload

pytestmark = pytest.mark.timeout(120)

_RUBRIC_ENTRY = st.fixed_dictionaries(
    {
        "slug": st.sampled_from(["clarity", "safety", "groundedness", "tone"]),
        "display_name": st.text(min_size=1, max_size=12),
        "min": st.sampled_from([0.0, 1.0]),
        "max": st.sampled_from([3.0, 5.0, 10.0]),
        "integer_scale": st.booleans(),
        "description": st.text(max_size=40),
    }
)
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "judge_model": st.sampled_from(["gpt-4o", "gpt-4o-mini", "mistral-nemo", "llama3.1:8b"]),
    "rubric": st.lists(_RUBRIC_ENTRY, min_size=1, max_size=3, unique_by=lambda e: e["slug"]).map(tuple),
    "prompt_hash": st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    "history_entries": st.integers(0, 100),
    "history_ratio": st.floats(0, 1, allow_nan=False),
    "notes_limit": st.integers(0, 50),
    "relevance": st.booleans(),
    "temperature": st.floats(0, 2, allow_nan=False),
    "max_tokens_judge": st.integers(16, 8192),
    "max_tokens_mentor": st.integers(16, 8192),
}
CONFIGS = st.builds(JudgeConfig, **_VALUES)
_products = itertools.count()
# The dialects do not differ for what these tests check (agreement's week arithmetic is tested on both
# in tests/test_version_agreement.py), so the database tests run on SQLite only.
SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_every_listed_field_is_part_of_a_configuration() -> None:
    # The list: model, rubric, prompt templates, history entries and ratio, notes limit,
    # relevance on/off, temperature and the two reply caps.
    assert {f.name for f in fields(JudgeConfig)} == set(_VALUES)


@SQLITE
@given(config=CONFIGS)
@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_version_row_stores_every_field_of_its_configuration(engine: Engine, config: JudgeConfig) -> None:
    with session_scope(engine) as session:
        made = ensure_version(
            session=session, product=f"p{next(_products)}", config=config, created_by="ayse"
        )
        session.expire_all()
        stored = session.get(JudgeVersion, made.id)
        assert stored is not None and JudgeConfig.of(stored) == config
        assert stored.content_hash == content_hash(config)


@given(config=CONFIGS, data=st.data())
@settings(max_examples=200)
def test_the_hash_changes_with_every_field_and_only_with_them(
    config: JudgeConfig, data: st.DataObject
) -> None:
    assert content_hash(config) == content_hash(replace(config))
    name = data.draw(st.sampled_from(sorted(_VALUES)))
    other = data.draw(_VALUES[name])
    changed = replace(config, **{name: other})
    assert (content_hash(changed) != content_hash(config)) == (changed.canonical() != config.canonical())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@given(config=CONFIGS, data=st.data())
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_same_configuration_is_one_version_and_any_changed_field_another(
    engine: Engine, config: JudgeConfig, data: st.DataObject
) -> None:
    product = f"p{next(_products)}"
    with session_scope(engine) as session:
        first = ensure_version(session=session, product=product, config=config, created_by="ayse")
        again = ensure_version(
            session=session, product=product, config=replace(config), created_by="ben", name="x"
        )
        assert first.created and not again.created and first.id == again.id
        name = data.draw(st.sampled_from(sorted(_VALUES)))
        value = data.draw(_VALUES[name].filter(lambda v: _differs(name, v, config)))
        changed = ensure_version(
            session=session, product=product, config=replace(config, **{name: value}), created_by="ayse"
        )
        assert changed.created and changed.id != first.id
        assert changed.version.previous_id == first.id
        count = session.exec(select(func.count()).where(col(JudgeVersion.product) == product)).one()
        assert count == 2


def _differs(name: str, value: Any, config: JudgeConfig) -> bool:
    return (
        JudgeConfig(**{name: value}).canonical() != JudgeConfig(**{name: getattr(config, name)}).canonical()
    )


def _builtin(**overrides: Any) -> JudgeConfig:
    return replace(judge.builtin_config(get_settings(), DEFAULT_METRICS), **overrides)


@SQLITE
def test_auto_names_count_up_and_say_what_changed(session: Session) -> None:
    first = ensure_version(session=session, product="acme", config=_builtin(), created_by="ayse").version
    second = ensure_version(
        session=session, product="acme", config=_builtin(judge_model="gpt-4o-mini"), created_by="ayse"
    ).version
    third = ensure_version(
        session=session, product="acme", config=_builtin(judge_model="gpt-4o-mini", history_entries=5),
        created_by="ayse",
    ).version  # fmt: skip
    assert [first.name, second.name, third.name] == [
        "v1", "v2: judge model gpt-4o-mini", "v3: history entries 5"]  # fmt: skip
    assert (first.origin, first.complete, first.created_by) == ("judge", True, "ayse")


@SQLITE
def test_a_name_taken_by_another_configuration_is_refused(session: Session) -> None:
    ensure_version(session=session, product="acme", config=_builtin(), created_by="a", name="v1: launch")
    with pytest.raises(VersionError, match="already has a judge version named 'v1: launch'"):
        ensure_version(
            session=session,
            product="acme",
            config=_builtin(temperature=0.7),
            created_by="a",
            name="v1: launch",
        )
    with pytest.raises(VersionError, match="'unversioned' names the rows without a version"):
        ensure_version(session=session, product="acme", config=_builtin(), created_by="a", name="Unversioned")


def test_the_diff_names_each_changed_field_and_rubric_text_line() -> None:
    before = _builtin()
    rubric = [dict(e) for e in before.rubric or ()]
    rubric[4] = {**rubric[4], "description": "Is it clear?\nAre steps numbered?", "max": 3.0}
    rubric.pop(0)
    after = replace(before, rubric=tuple(rubric), temperature=0.3)
    changes = {(c.field, c.label): c for c in judge_versions.config_changes(before, after)}
    assert changes[("rubric: clarity", "Scale")].after == "1–3"
    text = changes[("rubric: clarity", "Rubric text")]
    assert "+Are steps numbered?" in text.detail and text.before.startswith("Is the answer easy")
    assert changes[("rubric: truthfulness", "Metric removed")].after == "—"
    assert changes[("temperature", "Temperature")].after == "0.3"
    assert ("prompt_hash", "Prompt templates") not in changes


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (3, "must be a version name or an object"),
        ({"judge_model": "x"}, "'name' is required"),
        ({"name": "v1", "temperature": 3}, "'temperature' must be a number from 0 to 2"),
        ({"name": "v1", "history_entries": -1}, "'history_entries' must be a whole number"),
        ({"name": "v1", "colour": "red"}, "unknown field"),
        (
            {"name": "v1", "rubric": [{"slug": "Bad Slug", "display_name": "x", "min": 1, "max": 5}]},
            "rubric item 1",
        ),
        ("  ", "needs a name"),
    ],
)
def test_a_bad_judge_version_field_says_what_is_wrong(raw: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_version_ref(raw)


_NUMERIC_OPTIONS = ("history_entries", "history_ratio", "notes_limit", "temperature", "max_tokens_judge",
                    "max_tokens_mentor")  # fmt: skip


@pytest.mark.parametrize("option", _NUMERIC_OPTIONS)
def test_a_versions_option_keeps_the_bounds_of_the_setting_it_stands_for(
    option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bounds were written twice, here and in lib.config; a setting's new bounds now hold for
    versions too (a version may still use no notes, which the server's setting refuses)."""
    setting = judge_versions.OPTION_SETTINGS[option]
    low, high = server_settings.setting_range(setting)
    assert judge_versions.option_range(option) == ((0, high) if option == "notes_limit" else (low, high))
    narrower = (low, high / 2)
    monkeypatch.setitem(server_settings._RANGES, setting, narrower)
    whole = isinstance(getattr(get_settings(), setting), int)
    within, beyond = (int(high / 2), int(high / 2) + 1) if whole else (high / 2, high / 2 + 0.01)
    ref = parse_version_ref({"name": "v", option: within})
    assert ref is not None and getattr(ref.config, option) == within
    with pytest.raises(ValueError, match=f"'{option}' must be a"):
        parse_version_ref({"name": "v", option: beyond})


@given(config=CONFIGS)
@settings(max_examples=50)
def test_the_settings_a_version_runs_with_give_that_version_back(config: JudgeConfig) -> None:
    """`settings_for` and `builtin_config` read one list of option ↔ setting pairs (OPTION_SETTINGS)."""
    server = get_settings()
    back = judge.builtin_config(judge.settings_for(config, server), DEFAULT_METRICS)
    options = [*judge_versions.OPTION_SETTINGS]
    assert {o: getattr(back, o) for o in options} == {o: getattr(config, o) for o in options}
    assert set(options) | {"rubric", "prompt_hash", "relevance"} == {f.name for f in fields(JudgeConfig)}


# -- the built-in judge stamps its version ------------------------------------------------------------


@pytest.fixture
def rubric(engine: Engine) -> Engine:
    with session_scope(engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    return engine


def _stamps(engine: Engine) -> tuple[list[int | None], list[int | None]]:
    with Session(engine) as session:
        snaps = session.exec(
            select(EvaluationSnapshot.judge_version_id).order_by(EvaluationSnapshot.created_at)
        ).all()
        judgments = session.exec(select(Judgment.judge_version_id).order_by(Judgment.id)).all()
    return list(snaps), list(judgments)


@SQLITE
def test_the_built_in_judge_stamps_every_snapshot_and_judgment_with_its_version(
    rubric: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm_server.responder = lambda body: json_reply(
        stage1_payload() if "Stage 1" in body["messages"][0]["content"] else STAGE2_PAYLOAD
    )
    judge.judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    judge.judge_evaluation(
        engine=rubric, evaluation=evaluation(model_answer="Paris is big."), reviewer="ayse"
    )
    snaps, judgments = _stamps(rubric)
    assert len(set(snaps)) == 1 and None not in snaps and set(judgments) == set(snaps) and len(judgments) == 6
    with Session(rubric) as session:
        v1 = session.get(JudgeVersion, snaps[0])
        assert v1 is not None
        assert (v1.name, v1.product, v1.judge_model, v1.complete, v1.created_by) == (
            "v1", "acme", get_settings().judge_model, True, "ayse")  # fmt: skip
        assert [e["slug"] for e in v1.rubric or []] == ["coherence", "groundedness", "fluency"]
        assert v1.prompt_hash == judge.prompt_template_hash()
        assert (v1.history_entries, v1.history_ratio, v1.notes_limit, v1.relevance) == (20, 0.75, 20, True)

    monkeypatch.setenv("OVERRULE_JUDGE_MODEL", "judge-x")
    reset_settings()
    judge.judge_evaluation(
        engine=rubric, evaluation=evaluation(model_answer="Paris is old."), reviewer="ayse"
    )
    snaps, _ = _stamps(rubric)
    with Session(rubric) as session:
        v2 = session.get(JudgeVersion, snaps[-1])
        assert v2 is not None and (v2.name, v2.previous_id) == ("v2: judge model judge-x", snaps[0])

    # Judging with a named version runs that version's configuration (its model), not today's.
    requests_before = len(llm_server.requests)
    judge.judge_evaluation(
        engine=rubric, evaluation=evaluation(model_answer="Paris!"), reviewer="ayse", version="v1"
    )
    assert llm_server.requests[requests_before]["model"] == "gpt-4o"
    assert _stamps(rubric)[0][-1] == snaps[0]


@SQLITE
def test_a_version_this_build_cannot_run_is_refused_before_any_call(
    rubric: Engine, llm_server: LLMServer
) -> None:
    with session_scope(rubric) as session:
        ensure_version(
            session=session,
            product="acme",
            config=_builtin(prompt_hash="0" * 64),
            created_by="a",
            name="old prompt",
        )
        ensure_version(
            session=session,
            product="acme",
            config=JudgeConfig(judge_model="x"),
            created_by="a",
            name="elsewhere",
        )
    for name, message in (("old prompt", "other prompt templates"), ("elsewhere", "does not name every field"),
                          ("nope", "no judge version named 'nope'")):  # fmt: skip
        with pytest.raises(judge.JudgeFailed, match=message):
            judge.judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse", version=name)
    assert llm_server.requests == []


# -- imports --------------------------------------------------------------------------------------


def _record(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "question": f"q{n}",
        "model_answer": f"answer {n}",
        "product": "acme",
        "judge_scores": {"coherence": 2, "fluency": 4},
        "user_scores": {"coherence": 2},
        **extra,
    }


@SQLITE
def test_imports_carry_a_judge_version_and_rows_without_one_are_unversioned(rubric: Engine) -> None:
    full = {"name": "pipeline v7", "judge_model": "claude", "temperature": 0.2}
    with session_scope(rubric) as session:
        importer.import_evaluations(
            session=session,
            records=[_record(1, judge_version="pipeline v6"), _record(2, judge_version=full), _record(3)],
            reviewer="rita",
        )
        importer.import_judgments_cache(
            session=session,
            data={"cache_version": "1.0", "judgments": {
                "c1": {"product": "acme", "decision": "INCLUDE", "timestamp": "2026-01-01T00:00:00Z",
                       "judge_version": "pipeline v6"}}},
            reviewer="rita",
        )  # fmt: skip
    with Session(rubric) as session:
        versions = {v.name: v for v in session.exec(select(JudgeVersion)).all()}
        assert set(versions) == {"pipeline v6", "pipeline v7"}
        assert (versions["pipeline v7"].judge_model, versions["pipeline v7"].complete) == ("claude", False)
        assert versions["pipeline v6"].origin == "import" and versions["pipeline v6"].created_by == "rita"
        by_question = {s.question: s.judge_version_id for s in session.exec(select(EvaluationSnapshot)).all()}
        assert by_question == {"q1": versions["pipeline v6"].id, "q2": versions["pipeline v7"].id, "q3": None}
        stamped = {j.change_id: j.judge_version_id for j in session.exec(select(Judgment)).all()}
        assert stamped["c1"] == versions["pipeline v6"].id
        assert {v for k, v in stamped.items() if k != "c1"} == {
            versions["pipeline v6"].id,
            versions["pipeline v7"].id,
            None,
        }
        # The wide CSV names the version whose scores each evaluation's judge columns are.
        wide = inspector.export_evaluations(
            session=session, filters=inspector.EvaluationFilters(), form="wide"
        )
        question, version = wide.columns.index("question"), wide.columns.index("judge_version")
        assert {r[question]: r[version] for r in wide.rows} == {
            "q1": "pipeline v6", "q2": "pipeline v7", "q3": "unversioned",
        }  # fmt: skip


@SQLITE
def test_an_import_naming_a_version_with_other_fields_is_refused_whole(rubric: Engine) -> None:
    with session_scope(rubric) as session:
        importer.import_evaluations(
            session=session,
            records=[_record(1, judge_version={"name": "v7", "judge_model": "a"})],
            reviewer="rita",
        )
    with (
        pytest.raises(
            importer.ImportFailed, match=r"record 2, field 'judge_version'.*stored with other fields"
        ),
        session_scope(rubric) as session,
    ):
        importer.import_evaluations(
            session=session,
            records=[_record(2), _record(3, judge_version={"name": "v7", "judge_model": "b"})],
            reviewer="rita",
        )
    with Session(rubric) as session:
        assert session.exec(select(func.count()).select_from(EvaluationSnapshot)).one() == 1


# -- rubric edits, promotions, re-judging (lib.judge_changes), the CLI ----------------------------


def _edited(text: str, **coherence: Any) -> list[dict[str, Any]]:
    rows = [{k: v for k, v in m.items() if k != "product"} for m in RUBRIC]
    rows[0] = {**rows[0], "description": text, **coherence}
    return rows


@SQLITE
def test_a_rubric_save_is_a_version_with_its_diff_and_saving_it_again_makes_none(rubric: Engine) -> None:
    with session_scope(rubric) as session:
        made = judge_changes.save_rubric(
            session=session, product="acme", metrics=_edited("Strict.\nOne unsupported step fails."),
            actor="ayse", name="v2: strict", description="why",
        )  # fmt: skip
        assert made.created and made.version.origin == "rubric"
        changes = judge_versions.changes_since_previous(session, made.version)
        assert [(c.field, c.label) for c in changes] == [("rubric: coherence", "Rubric text")]
        assert "+One unsupported step fails." in changes[0].detail
        previous = judge_versions.previous_of(session, made.version)
        assert (
            previous is not None
            and previous.name == "v1"
            and previous.rubric[0]["description"] == RUBRIC[0]["description"]
        )
        again = judge_changes.save_rubric(
            session=session,
            product="acme",
            metrics=_edited("Strict.\nOne unsupported step fails."),
            actor="ayse",
        )
        assert not again.created and again.id == made.id
        rescaled = judge_changes.save_rubric(
            session=session, product="acme", metrics=_edited("Strict.", max=5), actor="ayse"
        )
        assert [c.label for c in judge_versions.changes_since_previous(session, rescaled.version)] == [
            "Scale", "Rubric text"]  # fmt: skip
        assert next(m.max_value for m in judge.metrics_for_product(session=session, product="acme")) == 5
        for bad, message in ((_edited("x", max=0), "'max' must be greater"), ([], "at least one metric")):
            with pytest.raises(ValueError, match=message):
                judge_changes.save_rubric(session=session, product="acme", metrics=bad, actor="ayse")
        with pytest.raises(PermissionDenied):
            judge_changes.save_rubric(
                session=session, product="acme", metrics=_edited("y"), actor=Actor("val", "viewer")
            )


def _rubric_as_saved(session: Session, product: str) -> list[dict[str, object]]:
    """The product's rubric as the editor sends it to `judge_changes.save_rubric`."""
    return [
        {"slug": m.slug, "display_name": m.display_name, "min": m.min_value, "max": m.max_value,
         "integer_scale": m.integer_scale, "description": m.description}
        for m in judge.metrics_for_product(session=session, product=product)
    ]  # fmt: skip


@SQLITE
def test_a_rubric_save_keeps_an_inferred_scale_growing_until_the_lead_changes_it(rubric: Engine) -> None:
    """A metric an import defined from its scores keeps growing with later imports after a rubric
    save that leaves its scale as it was (only its text edited); once the lead sets its scale on
    the editor, that scale is theirs and a later score outside it is refused."""
    from lib.source_records import SourceEvaluation, SourceVerdict

    def send(question: str, score: float) -> None:
        verdict = SourceVerdict("tone", score, field="score")
        ev = SourceEvaluation(
            where=question, product="acme", question=question, answer="a", verdicts=[verdict]
        )
        with session_scope(rubric) as session:
            importer.import_source_evaluations(session=session, evaluations=[ev], source="t", reviewer="rita")

    def tone() -> tuple[float, float, bool]:
        with Session(rubric) as session:
            row = session.exec(select(MetricDefinition).where(MetricDefinition.slug == "tone")).one()
            return row.min_value, row.max_value, row.scale_inferred

    send("q1", 3)
    assert tone() == (0.0, 3.0, True)
    with session_scope(rubric) as session:
        current = _rubric_as_saved(session, "acme")
        current[-1]["description"] = "Is the tone warm?"
        judge_changes.save_rubric(session=session, product="acme", metrics=current, actor="ayse")
    assert tone() == (0.0, 3.0, True)
    send("q2", 5)
    assert tone() == (0.0, 5.0, True)
    with session_scope(rubric) as session:
        current[-1]["max"] = 6
        judge_changes.save_rubric(session=session, product="acme", metrics=current, actor="ayse")
    assert tone() == (0.0, 6.0, False)
    with pytest.raises(
        importer.ImportFailed, match="q3, field 'score': score 7 for 'tone' is outside its scale 0–6"
    ):
        send("q3", 7)
    with Session(rubric) as session:
        details = session.exec(
            select(AuditEvent.detail).where(AuditEvent.action == judge_versions.AUDIT_ACTION)
        ).all()
    assert "acme: 'tone' widened from 0–3 to 0–5 by an import" in details


@SQLITE
def test_a_rubric_save_adds_and_removes_metrics_and_a_refused_edit_changes_nothing(rubric: Engine) -> None:
    old = [{k: v for k, v in m.items() if k != "product"} for m in RUBRIC]
    judged_with = {"name": "pipeline v1", "rubric": old}
    with session_scope(rubric) as session:  # an evaluation judged under the old rubric, fluency included
        importer.import_evaluations(
            session=session, records=[_record(1, judge_version=judged_with)], reviewer="rita"
        )
    tone = {"slug": "tone", "display_name": "Tone", "min": 0, "max": 10, "description": "Is it polite?"}
    with session_scope(rubric) as session:
        made = judge_changes.save_rubric(
            session=session, product="acme", metrics=[*old[:2], tone], actor="ayse"
        )
    with session_scope(rubric) as session:
        assert made.created
        changes = judge_versions.changes_since_previous(session, made.version)
        assert [(c.field, c.label, c.before, c.after) for c in changes] == [
            ("rubric: tone", "Metric added", "—", "Tone (0–10)"),
            ("rubric: fluency", "Metric removed", "Fluency (1–5)", "—"),
        ]
        assert [m.slug for m in judge.metrics_for_product(session=session, product="acme")] == [
            "coherence", "groundedness", "tone"]  # fmt: skip
        audit = session.exec(select(AuditEvent).where(AuditEvent.action == judge_versions.AUDIT_ACTION)).all()
        assert [a.detail for a in audit] == [
            f"acme: rubric saved as {made.version.name} (added tone; removed fluency)"
        ]
        # The removed metric's scores still show, under the rubric of the version that judged them.
        snapshot_id = session.exec(select(EvaluationSnapshot.id)).one()
        detail = inspector.load_evaluation(session=session, snapshot_id=snapshot_id)
        assert detail is not None
        fluency = next(c for c in detail.cards if c.spec.slug == "fluency")
        assert (fluency.spec.display_name, fluency.spec.scale_label(), fluency.in_rubric) == (
            "Fluency",
            "1–5",
            False,
        )
        assert fluency.judge_score == 4
        # ... and is reviewed on that version's scale, not on any number.
        judgment = session.exec(select(Judgment).where(Judgment.metric == "fluency")).one()
        assert corrections.decision_scale(session=session, judgment=judgment).spec.scale_label() == "1–5"
        with pytest.raises(ValueError, match="outside its scale 1–5"):
            record_review(session=session, judgment_id=judgment.id, expected_version=judgment.version,
                          action="overrule", user_decision="7", reviewer="ayse", reason="too high")  # fmt: skip
        record_review(session=session, judgment_id=judgment.id, expected_version=judgment.version,
                      action="overrule", user_decision="3", reviewer="ayse", reason="clumsy")  # fmt: skip

    def state() -> tuple[Any, ...]:
        with Session(rubric) as session:
            return (
                [(m.slug, m.max_value) for m in judge.metrics_for_product(session=session, product="acme")],
                session.exec(select(func.count()).select_from(JudgeVersion)).one(),
                session.exec(select(func.count()).select_from(AuditEvent)).one(),
            )

    before = state()
    kept = [*old[:2], tone]
    for bad, message in (
        ([*kept, {**tone, "display_name": "Tone again"}], "metric 'tone' is in the rubric already"),
        ([], "a rubric needs at least one metric"),
        (
            [*kept, {**tone, "slug": "warmth", "min": 5, "max": 1}],
            "metric 'warmth': field 'max' must be greater",
        ),
        ([*kept, {**tone, "slug": "Warm Tone"}], "must be lowercase letters, digits"),
        ([*kept, {**tone, "slug": "warmth", "display_name": ""}], "field 'display_name' is required"),
    ):
        with pytest.raises(ValueError, match=message), session_scope(rubric) as session:
            judge_changes.save_rubric(session=session, product="acme", metrics=bad, actor="ayse")
        assert state() == before


@SQLITE
def test_promoting_a_lab_arm_makes_a_current_version_that_records_the_experiment(rubric: Engine) -> None:
    with session_scope(rubric) as session:
        experiment = AlignmentExperiment(
            product="acme", metrics=["coherence"], arms=["bare", "history", "rubric"],
            edited_rubric={"coherence": "Edited in the lab."}, judge_model="lab-model",
        )  # fmt: skip
        session.add(experiment)
        session.flush()
        made = judge_changes.promote_arm(
            session=session, experiment_id=experiment.id, arm="rubric", actor="ayse"
        )
        version = made.version
        assert (version.origin, version.experiment_id, version.experiment_arm) == (
            "lab",
            experiment.id,
            "rubric",
        )
        assert version.judge_model == "lab-model" and version.rubric[0]["description"] == "Edited in the lab."
        assert judge_versions.current_options(session, "acme").id == version.id
        bare = judge_changes.promote_arm(
            session=session, experiment_id=experiment.id, arm="bare", actor="ayse"
        )
        assert (bare.version.history_entries, bare.version.notes_limit) == (0, 0)
        audit = [
            e.detail
            for e in session.exec(select(AuditEvent).where(AuditEvent.action == "judge_changed")).all()
        ]
        assert f"acme: experiment #{experiment.id} arm rubric promoted as {version.name}" in audit
        assert f"acme: {version.name} made current" in audit
        with pytest.raises(VersionError, match="has no arm 'full'"):
            judge_changes.promote_arm(session=session, experiment_id=experiment.id, arm="full", actor="ayse")
    # The product's judge now runs with the promoted options: its next run is that version.
    with session_scope(rubric, read_only=True) as session:
        plan = judge.plan_run(session=session, product="acme", settings=get_settings())
        assert plan.version_id == bare.id and plan.settings.history_max_entries == 0


@SQLITE
def test_rejudging_a_sample_keeps_reviewers_decisions_and_records_both_versions(
    rubric: Engine, llm_server: LLMServer
) -> None:
    llm_server.responder = lambda body: json_reply(
        stage1_payload() if "Stage 1" in body["messages"][0]["content"] else STAGE2_PAYLOAD
    )
    snapshot_ids = [
        judge.judge_evaluation(
            engine=rubric, evaluation=evaluation(model_answer=f"Paris {n}."), reviewer="ayse"
        )
        for n in range(3)
    ]
    with session_scope(rubric) as session:
        first = {
            j.metric: j
            for j in session.exec(select(Judgment).where(Judgment.snapshot_id == snapshot_ids[0])).all()
        }
        record_review(session=session, judgment_id=first["coherence"].id, expected_version=first["coherence"].version,
                      action="overrule", user_decision="2", reviewer="ayse", reason="weak")  # fmt: skip
        record_review(session=session, judgment_id=first["fluency"].id, expected_version=first["fluency"].version,
                      action="confirm", reviewer="ayse")  # fmt: skip
        judge_changes.save_rubric(
            session=session, product="acme", metrics=_edited("Stricter."), actor="ayse", name="v2"
        )
    reply = stage1_payload()
    reply["independent_scores"]["coherence"]["score"] = 1
    reply["independent_scores"]["fluency"]["score"] = 4
    llm_server.responder = lambda body: json_reply(reply)
    report = judge_changes.rejudge_sample(
        engine=rubric, product="acme", reviewer="ayse", version="v2", size=5
    )
    assert report.sampled == 1 and not report.failed  # only the reviewed evaluation
    assert (report.kept, report.conflicts, report.replaced) == (1, 1, 1)  # groundedness: unreviewed
    assert "Stricter." in json.dumps(llm_server.requests[-1]["messages"])
    with Session(rubric) as session:
        v1 = judge_versions.version_by_name(session, "acme", "v1")
        v2 = judge_versions.version_by_name(session, "acme", "v2")
        assert v1 is not None and v2 is not None
        rows = {
            j.metric: j
            for j in session.exec(select(Judgment).where(Judgment.snapshot_id == snapshot_ids[0])).all()
        }
        # Overruled "3" → "2"; v2 says "1": the reviewer's "2" stays and now corrects v2's "1".
        assert (rows["coherence"].decision, rows["coherence"].user_decision) == ("1", "2")
        assert rows["coherence"].judge_version_id == v2.id
        # Confirmed "4"; v2 agrees: the entry is kept as v1's, v2's "4" kept beside it.
        assert (rows["fluency"].decision, rows["fluency"].judge_version_id) == ("4", v1.id)
        # Unreviewed: simply replaced by v2's decision.
        assert rows["groundedness"].judge_version_id == v2.id
        verdicts = {
            (v.judgment_id, v.judge_version_id): v.decision for v in session.exec(select(JudgeVerdict)).all()
        }
        assert verdicts == {(rows["coherence"].id, v1.id): "3", (rows["fluency"].id, v2.id): "4",
                            (rows["groundedness"].id, v1.id): "0.5"}  # fmt: skip
        # The API's judgment state and the Corrections CSV name the version of each judgment.
        state = corrections.judgment_state_json(corrections.JudgmentState.of(rows["coherence"]))
        assert state["judge_version"] == "v2"
        csv_rows = corrections.iter_judgment_rows(session=session, filters=corrections.JudgmentFilter())
        named = {r[0]: r[corrections.JUDGMENT_COLUMNS.index("judge_version")] for r in csv_rows}
        assert named[rows["fluency"].change_id] == "v1" and named[rows["coherence"].change_id] == "v2"
        long = inspector.export_evaluations(
            session=session, filters=inspector.EvaluationFilters(), form="long"
        )
        at = long.columns.index("judge_version")
        by_change = {r[long.columns.index("change_id")]: r[at] for r in long.rows}
        assert by_change[rows["coherence"].change_id] == "v2" and by_change[rows["fluency"].change_id] == "v1"
    # Every version's decisions on the reviewed judgments count in its agreement.
    with Session(rubric) as session:
        table = version_agreement.agreement_by_version(session=session)
        pairs = {(r.version, r.metric): r.pairs for r in table.itertuples()}
        assert pairs == {
            ("v1", "coherence"): 1,
            ("v1", "fluency"): 1,
            ("v2", "coherence"): 1,
            ("v2", "fluency"): 1,
        }


@SQLITE
def test_a_rejudge_of_an_evaluation_archived_while_the_judge_ran_writes_nothing(
    rubric: Engine, llm_server: LLMServer
) -> None:
    """review10 L5: archived was checked before the LLM call only, so an evaluation archived while
    the judge ran still got the new version's judgments."""
    llm_server.responder = lambda body: json_reply(
        stage1_payload() if "Stage 1" in body["messages"][0]["content"] else STAGE2_PAYLOAD
    )
    snapshot_id = judge.judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    with Session(rubric) as session:
        before = sorted((j.metric, j.decision, j.judge_version_id) for j in session.exec(select(Judgment)))

    def archive_then_answer(body: dict[str, Any]) -> Any:
        with session_scope(rubric) as session:
            inspector.archive_evaluation(session=session, snapshot_id=snapshot_id, reviewer="ayse")
        return json_reply(stage1_payload())

    llm_server.responder = archive_then_answer
    report = judge_changes.rejudge_sample(
        engine=rubric, product="acme", reviewer="ayse", size=5, reviewed_only=False
    )
    assert report.failed == [(snapshot_id, "the evaluation was archived or deleted while the judge ran")]
    with Session(rubric) as session:
        after = sorted((j.metric, j.decision, j.judge_version_id) for j in session.exec(select(Judgment)))
        assert not session.exec(select(JudgeVerdict)).all()
    assert after == before


@SQLITE
def test_the_cli_rejudges_with_a_version_and_lists_and_compares_versions(
    rubric: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(rubric.url)
    llm_server.responder = lambda body: json_reply(
        stage1_payload() if "Stage 1" in body["messages"][0]["content"] else STAGE2_PAYLOAD
    )
    snapshot_id = judge.judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    with session_scope(rubric) as session:
        j = session.exec(
            select(Judgment).where(Judgment.snapshot_id == snapshot_id, Judgment.metric == "fluency")
        ).one()
        record_review(
            session=session, judgment_id=j.id, expected_version=j.version, action="confirm", reviewer="ayse"
        )
        judge_changes.save_rubric(
            session=session, product="acme", metrics=_edited("Stricter."), actor="ayse", name="v2"
        )
    env = {"OVERRULE_DATABASE_URL": url}
    missing = run_cli("judge", "--product", "acme", "--sample", "1", "--version", "v9", env=env)
    assert missing.returncode == 1 and "no judge version named 'v9'" in missing.stderr
    done = run_cli("judge", "--product", "acme", "--sample", "1", "--version", "v2", env=env)
    assert done.returncode == 0, done.stderr
    assert "re-judged 1 of 1 evaluations of acme with v2" in done.stdout
    listed = run_cli("versions", "list", "--product", "acme", "--format", "csv", env=env)
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].startswith("product,version_id,name")
    assert [line.split(",")[2] for line in listed.stdout.splitlines()[1:]] == ["v1", "v2"]
    shown = json.loads(run_cli("versions", "show", "v2", "--product", "acme", env=env).stdout)
    assert shown["changes"][0]["change"] == "Rubric text" and shown["rubric"][0]["description"] == "Stricter."
    agreement = run_cli("versions", "agreement", "--format", "csv", "--resamples", "50", env=env)
    assert agreement.returncode == 0 and {"v1", "v2"} <= set(agreement.stdout.replace(",", " ").split())
    compared = run_cli(
        "versions", "compare", "v1", "--other", "v2", "--product", "acme", "--same-items", env=env
    )
    assert compared.returncode == 0, compared.stderr
    assert "Fluency" in compared.stdout


def test_a_scale_changed_on_the_rubric_editor_re_derives_the_stored_gaps(rubric: Engine) -> None:
    """review7 F12 for the editor: a lead widening `tone` 0–1 → 0–4 left the evaluations' gaps on
    the 0–1 span (a judge 1 / person 0 stayed a maximal disagreement of 4). A save that changes a
    scale now re-derives them in its transaction; one that changes only text leaves them, and a
    metric the same save removes still counts (only the changed scale moves the figures)."""
    from lib.source_records import SourceEvaluation, SourceVerdict

    verdicts = [
        SourceVerdict("tone", 1), SourceVerdict("tone", 0, human=True),
        SourceVerdict("fluency", 5), SourceVerdict("fluency", 1, human=True),
    ]  # fmt: skip
    ev = SourceEvaluation(where="r", product="acme", question="q1", answer="a", verdicts=verdicts)
    with session_scope(rubric) as session:
        importer.import_source_evaluations(session=session, evaluations=[ev], source="t", reviewer="rita")

    def gaps() -> tuple[object, ...]:
        with Session(rubric) as session:
            s = session.exec(select(EvaluationSnapshot).where(EvaluationSnapshot.question == "q1")).one()
            return s.weighted_gap, s.max_metric_gap, s.judge_meta_score

    def save(drop: str = "", **tone: object) -> None:
        with session_scope(rubric) as session:
            current = [m for m in _rubric_as_saved(session, "acme") if m["slug"] != drop]
            current[-1].update(tone)
            judge_changes.save_rubric(session=session, product="acme", metrics=current, actor="ayse")

    # Neither is acme's primary metric (coherence): 0.1 × mean(tone 4, fluency 4 on the 1–5 span).
    assert gaps() == (0.4, 4.0, 5)
    save(description="Is the tone warm?")
    assert gaps() == (0.4, 4.0, 5)
    save(drop="fluency", max=4)
    assert gaps() == (0.25, 4.0, 5)  # tone 1 on 0–4 → 1.0; fluency's 4 still counted


def test_a_scale_change_beside_an_open_import_re_derives_the_imports_gaps_too(rubric: Engine) -> None:
    """review9 R9: on PostgreSQL the rubric editor took no importers' lock, so a scale change while
    an import was open re-derived the committed evaluations only; the import's rows kept the old
    span's gaps. The editor now waits for the import (SQLite's writers are one at a time anyway)."""
    import threading

    from lib.source_records import SourceEvaluation, SourceVerdict

    def evaluation(question: str) -> SourceEvaluation:
        verdicts = [SourceVerdict("tone", 1), SourceVerdict("tone", 0, human=True)]
        return SourceEvaluation(where="r", product="acme", question=question, answer="a", verdicts=verdicts)

    def gaps() -> dict[str, tuple[float | None, float | None]]:
        with Session(rubric) as s:
            return {
                e.question: (e.weighted_gap, e.max_metric_gap) for e in s.exec(select(EvaluationSnapshot))
            }

    with session_scope(rubric) as s:
        importer.import_source_evaluations(
            session=s, evaluations=[evaluation("q1")], source="t", reviewer="rita"
        )
    if rubric.dialect.name != "postgresql":
        pytest.skip("SQLite's writers are one at a time: no import is open beside the editor")
    failures: list[BaseException] = []

    def edit() -> None:
        try:
            with session_scope(rubric) as s:
                current = _rubric_as_saved(s, "acme")
                next(m for m in current if m["slug"] == "tone").update(max=4)
                judge_changes.save_rubric(session=s, product="acme", metrics=current, actor="ayse")
        except BaseException as exc:
            failures.append(exc)

    with Session(rubric) as open_import:
        importer.import_source_evaluations(
            session=open_import, evaluations=[evaluation("q2")], source="t", reviewer="rita"
        )
        open_import.flush()
        editor = threading.Thread(target=edit)
        editor.start()
        editor.join(2)  # it waits for the import's lock now; before, it finished here
        open_import.commit()
    editor.join(30)
    assert not failures and not editor.is_alive()
    after = gaps()
    assert after["q1"] == after["q2"], after
