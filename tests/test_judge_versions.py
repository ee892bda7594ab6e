"""Judge versions (issue 28): content addressing, names, diffs, the built-in judge's stamp, imports.

The property tests run the real `ensure_version` on a database: the same configuration twice is one
version, and changing any one field makes another.
"""

from __future__ import annotations

import itertools
from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from lib import importer, judge, judge_versions
from lib.config import get_settings, reset_settings
from lib.db import session_scope
from lib.judge_versions import JudgeConfig, VersionError, content_hash, ensure_version, parse_version_ref
from lib.metrics import DEFAULT_METRICS, upsert_metric_definitions
from lib.models import EvaluationSnapshot, JudgeVersion, Judgment
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


def test_every_listed_field_is_part_of_a_configuration() -> None:
    # The list: model, rubric, prompt templates, history entries and ratio, notes limit,
    # relevance on/off, temperature and the two reply caps.
    assert {f.name for f in fields(JudgeConfig)} == set(_VALUES) == set(judge_versions.FIELD_LABELS)


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
