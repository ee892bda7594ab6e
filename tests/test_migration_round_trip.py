"""Migrations: downgrading a populated database to 0005 and upgrading again keeps what the rows say
(the later revisions' columns and tables are rebuilt from the rows, on SQLite and PostgreSQL)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text
from sqlmodel import Session, col, select

from lib import counters, importer
from lib.corrections import record_review
from lib.db import alembic_config, session_scope
from lib.models import Judgment
from tests.test_counters import (
    _decisions_of_rows,
    _operate,
    _record,
    _snapshot_of_counters,
    _stored_decisions,
    _version_totals,
)
from tests.test_scores import table_state

pytestmark = pytest.mark.slow


def _migrate(engine: Engine, target: str) -> None:
    """Up to `target` ("head") or down to it, in one connection as `lib.db.migrate` runs them."""
    with engine.connect() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        (command.upgrade if target == "head" else command.downgrade)(cfg, target)
        conn.commit()


def _state(engine: Engine) -> dict[str, Any]:
    with Session(engine) as s:
        found = _snapshot_of_counters(s)
        found["search_text"] = sorted(
            s.connection().execute(text("SELECT id, search_text FROM evaluation_snapshots")).all()
        )
    found["scores"] = table_state(engine)
    return found


def test_downgrade_to_0005_and_back_keeps_counters_scores_and_search_text(engine: Engine) -> None:
    rng = random.Random(5)
    records = [_record(rng, n) for n in range(6)]
    records[0]["question"] = "Straße in İstanbul: ÇAĞRI?"
    with session_scope(engine) as s:
        importer.import_evaluations(session=s, records=records)
    with session_scope(engine) as s:
        judgment = s.exec(select(Judgment).order_by(col(Judgment.id))).first()
        assert judgment is not None and judgment.id is not None
        record_review(
            session=s,
            judgment_id=judgment.id,
            expected_version=judgment.version,
            action="confirm",
            reviewer="ayse",
        )
    before = _state(engine)
    assert before["evaluation_snapshots"] and before["scores"][0] and before["search_text"]

    _migrate(engine, "0005")
    _migrate(engine, "head")

    assert _state(engine) == before


def test_0029_backfills_each_evaluations_reviewer_decisions_and_its_downgrade_drops_them(
    engine: Engine,
) -> None:
    """At 0028 there is no `reviewer_decisions`; upgrading fills it with what the judgments say (the
    reviewed evaluations' decisions, latest review first; NULL elsewhere), downgrading drops it."""
    rng = random.Random(29)
    with session_scope(engine) as s:
        importer.import_evaluations(session=s, records=[_record(rng, n) for n in range(6)])
    with session_scope(engine) as s:
        judgments = s.exec(select(Judgment).order_by(col(Judgment.id))).all()
        for judgment in judgments[::2]:
            assert judgment.id is not None
            record_review(session=s, judgment_id=judgment.id, expected_version=judgment.version,
                          action="confirm", reviewer="ayse")  # fmt: skip
    _migrate(engine, "0028")
    with engine.connect() as conn:
        columns = [c["name"] for c in inspect(conn).get_columns("evaluation_snapshots")]
    assert "reviewer_decisions" not in columns and "judged_metrics" in columns
    _migrate(engine, "head")
    with Session(engine) as s:
        stored = _stored_decisions(s)
        assert stored == _decisions_of_rows(s)
        assert any(stored.values()) and not all(stored.values())  # some reviewed, some not


def test_0030_backfills_the_judge_version_totals_as_a_recount_does(engine: Engine) -> None:
    """At 0029 there is no `judge_version_totals`; upgrading sums the weekly counts into it, which
    must equal what a recount writes (from the judgments) on a database with reviewed judgments
    of several versions, in several weeks."""
    rng = random.Random(30)
    for n in range(30):
        with session_scope(engine) as s:
            _operate(rng, s, n, pairs=True)
    with session_scope(engine) as s:
        counters.recount(session=s)
    with Session(engine) as s:
        recounted = _version_totals(s)
        weeks = s.connection().execute(text("SELECT COUNT(DISTINCT week) FROM judge_version_counts")).scalar()
    assert len(recounted) > 5 and weeks and weeks > 1  # rows a sum over weeks merges
    _migrate(engine, "0029")
    with engine.connect() as conn:
        assert "judge_version_totals" not in inspect(conn).get_table_names()
    _migrate(engine, "head")
    with Session(engine) as s:
        assert _version_totals(s) == recounted


def test_0031_marks_the_scales_an_import_inferred_and_no_others(engine: Engine) -> None:
    """At 0030 no column says which scale an import inferred; upgrading marks the rows an import
    wrote ("Imported evaluation 'NAME'.", a scale from 0 or below to a whole number) and leaves a
    user's (other text) and a lead's rescale of an imported one (1–5) as user-defined."""
    _migrate(engine, "0030")
    rows = [
        ("tone", "tone", "Imported evaluation 'tone'.", 0, 3),
        ("Faith", "faith", "Imported evaluation 'Faith'.", 0, 1),
        ("it's", "it_s", 'Imported evaluation "it\'s".', -2, 4),
        ("rescaled", "rescaled", "Imported evaluation 'rescaled'.", 1, 5),
        ("named", "named", "Imported evaluation 'other name'.", 0, 3),
        ("style", "style", "Is the style plain?", 0, 3),
    ]
    with engine.begin() as conn:
        for position, (name, slug, description, low, high) in enumerate(rows):
            conn.execute(
                text(
                    "INSERT INTO metric_definitions (product, slug, display_name, min_value, max_value,"
                    " integer_scale, description, position) VALUES ('p', :s, :n, :lo, :hi, :w, :d, :pos)"
                ),
                {"s": slug, "n": name, "lo": low, "hi": high, "w": True, "d": description, "pos": position},
            )
    _migrate(engine, "head")
    with engine.connect() as conn:
        marked = dict(conn.execute(text("SELECT slug, scale_inferred FROM metric_definitions")).all())
    assert {slug: bool(flag) for slug, flag in marked.items()} == {
        "tone": True, "faith": True, "it_s": True, "rescaled": False, "named": False, "style": False,
    }  # fmt: skip
    _migrate(engine, "0030")
    with engine.connect() as conn:
        assert "scale_inferred" not in [c["name"] for c in inspect(conn).get_columns("metric_definitions")]
    _migrate(engine, "head")


def test_0032_labels_the_judgments_of_imported_metrics_whose_reasoning_starts_with_one_word(
    engine: Engine,
) -> None:
    """At 0031 a judgment's label is only the start of its reasoning; upgrading labels it where that
    is unambiguous: a metric an import of another tool's results defined, and a reasoning that is
    one word, alone or before ": " (`verdict_reason`). Free text, several words, and a rubric's own
    metric stay unlabelled; the lookup then reads the labels (index), and downgrading drops them."""
    _migrate(engine, "0031")
    reasonings = {
        "factual": ("hallucination", "factual"),
        "Factual: it keeps to the source.": ("hallucination", "factual"),
        "non-toxic": ("toxicity", "non-toxic"),
        "bug_free: no:colon trap": ("toxicity", "bug_free"),
        "The answer keeps to the source.": ("hallucination", None),
        "very good: several words": ("hallucination", None),
        "factual:no space": ("hallucination", None),
        "factual: a rubric metric's free text": ("style", None),
        None: ("hallucination", None),
    }
    with engine.begin() as conn:
        for position, (name, slug, description) in enumerate(
            [
                ("Hallucination", "hallucination", "Imported evaluation 'Hallucination'."),
                ("Toxicity", "toxicity", "Imported evaluation 'Toxicity'."),
                ("Style", "style", "Is the style plain?"),
            ]
        ):
            conn.execute(
                text(
                    "INSERT INTO metric_definitions (product, slug, display_name, min_value, max_value,"
                    " integer_scale, description, position, scale_inferred)"
                    " VALUES ('p', :s, :n, 0, 1, :w, :d, :pos, :w)"
                ),
                {"s": slug, "n": name, "w": True, "d": description, "pos": position},
            )
        for n, (reasoning, (metric, _label)) in enumerate(reasonings.items()):
            conn.execute(
                text(
                    "INSERT INTO judgments (change_id, product, metric, decision, reasoning, timestamp,"
                    " version, was_corrected) VALUES (:c, 'p', :m, '1', :r, :t, 1, :f)"
                ),
                {"c": f"j{n}", "m": metric, "r": reasoning, "t": "2026-11-20 10:00:00", "f": False},
            )
    _migrate(engine, "head")
    with engine.connect() as conn:
        labels = dict(conn.execute(text("SELECT change_id, label FROM judgments")).all())
    assert labels == {f"j{n}": label for n, (_metric, label) in enumerate(reasonings.values())}
    with Session(engine) as s:
        stored = importer._stored_label_scores(s)
        assert (stored("p", "hallucination", "factual"), stored("p", "style", "factual")) == ({1.0}, set())
    _migrate(engine, "0031")
    with engine.connect() as conn:
        assert "label" not in [c["name"] for c in inspect(conn).get_columns("judgments")]
    _migrate(engine, "head")
