"""Corrections page under AppTest: stats, filters, the judge's history block, import, clearing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from lib import corrections
from lib.db import session_scope
from lib.models import EvaluationSnapshot, Judgment
from tests.pages.figures import figures, values

PAGE = "pages/corrections.py"
T0 = datetime(2024, 6, 3, tzinfo=UTC)


def cache(
    engine: Engine, product: str = "acme", *, corrected: int = 2, confirmed: int = 1, unreviewed: int = 3
) -> None:
    """Judgments of one product: some overruled (with a reason), some confirmed, some waiting."""
    with session_scope(engine) as s:
        n = 0
        for kind, count in (("corrected", corrected), ("confirmed", confirmed), ("unreviewed", unreviewed)):
            for _ in range(count):
                reviewed = kind != "unreviewed"
                s.add(
                    Judgment(
                        change_id=f"{product}#{n}",
                        product=product,
                        decision="INCLUDE",
                        user_decision="EXCLUDE" if kind == "corrected" else ("INCLUDE" if reviewed else None),
                        user_reasoning=f"reason {n}" if kind == "corrected" else None,
                        was_corrected=kind == "corrected",
                        reviewer="ayse" if reviewed else None,
                        reviewed_at=T0 if reviewed else None,
                        timestamp=T0 + timedelta(days=n),
                    )
                )
                n += 1


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def count(engine: Engine, product: str | None = None) -> int:
    with session_scope(engine, read_only=True) as s:
        stmt = select(func.count()).select_from(Judgment)
        if product is not None:
            stmt = stmt.where(Judgment.product == product)
        return s.exec(stmt).one()


def test_stats_show_the_seed_004_counts(app_engine, open_page) -> None:
    cache(app_engine, "acme", corrected=2, confirmed=1, unreviewed=1)
    at = open_page(PAGE)
    assert [
        metric(at, x) for x in ("Judgments", "Corrected", "Correct (or unreviewed)", "Corrected of reviewed")
    ] == [
        "4",
        "2",
        "2",
        "67%",  # corrected ÷ reviewed, labelled as such: 2 of the 3 reviewed
    ]
    rate = next(m for m in at.metric if m.label == "Corrected of reviewed")
    assert "corrected ÷ reviewed" in rate.help and "2 of 3 reviewed" in rate.help
    # stats()'s own correction_rate (seed 004: of every judgment) is named as what it is
    assert "2 of 4 (50%) are corrected" in rate.help
    assert not at.exception


def test_stats_honour_the_reviewer_filter(app_engine, open_page) -> None:
    cache(app_engine, "acme", corrected=2, confirmed=1, unreviewed=1)  # reviewed by ayse
    with session_scope(app_engine) as s:
        s.add(Judgment(change_id="bora#1", product="acme", decision="INCLUDE", user_decision="INCLUDE",
                       reviewer="bora", reviewed_at=T0, timestamp=T0))  # fmt: skip
        s.add(Judgment(change_id="bora#2", product="acme", decision="INCLUDE", user_decision="INCLUDE",
                       reviewer="bora", reviewed_at=T0, timestamp=T0))  # fmt: skip
    with session_scope(app_engine) as s:  # bora's name in the audit trail, where the filter lists reviewers
        for change_id in ("bora#1", "bora#2"):
            j = corrections.get_judgment(session=s, change_id=change_id)
            corrections.record_review(session=s, judgment_id=j.id, expected_version=j.version,
                                      action="overrule", user_decision="EXCLUDE", reason="no", reviewer="bora")  # fmt: skip
    at = open_page(PAGE)
    assert metric(at, "Judgments") == "6"
    at.selectbox(key="corrections_reviewer").set_value("bora").run()
    assert [metric(at, x) for x in ("Judgments", "Corrected", "Corrected of reviewed")] == ["2", "2", "100%"]
    assert any("reviewer bora" in h.value for h in at.subheader)
    assert sorted(at.dataframe[0].value["change_id"]) == ["bora#1", "bora#2"]
    at.selectbox(key="corrections_reviewer").set_value("Any").run()
    assert [metric(at, x) for x in ("Judgments", "Corrected", "Corrected of reviewed")] == ["6", "4", "80%"]
    assert not at.exception


def test_the_table_lists_matching_judgments_with_reviewer_and_reason(app_engine, open_page) -> None:
    cache(app_engine, "acme")
    cache(app_engine, "beta", corrected=1, confirmed=0, unreviewed=0)
    at = open_page(PAGE)
    at.selectbox(key="corrections_state").set_value("corrected").run()
    table = at.dataframe[0].value
    assert sorted(table["change_id"]) == ["acme#0", "acme#1", "beta#0"]
    assert set(table["reviewed_by"]) == {"ayse"} and "reason 1" in set(table["reviewer_reason"])
    at.selectbox(key="corrections_product").set_value("beta").run()
    assert list(at.dataframe[0].value["change_id"]) == ["beta#0"]
    assert metric(at, "Judgments") == "1"
    assert not at.exception


def test_no_match_says_so(app_engine, open_page) -> None:
    cache(app_engine, "acme", corrected=0)
    at = open_page(PAGE)
    at.selectbox(key="corrections_state").set_value("corrected").run()
    assert any("No judgments match" in i.value for i in at.info)
    assert not at.exception


def test_the_judges_view_is_exactly_the_history_block(app_engine, open_page) -> None:
    cache(app_engine, "acme", corrected=5, confirmed=5, unreviewed=5)
    at = open_page(PAGE)
    at.number_input(key="corrections_history_size").set_value(6)
    at.slider(key="corrections_history_ratio").set_value(0.5).run()
    with session_scope(app_engine, read_only=True) as s:
        expected = corrections.history_block(session=s, product="acme", max_entries=6, correction_ratio=0.5)
    assert [c.value for c in at.code] == [expected]
    assert expected.count("[CORRECTED]") == 3
    assert not at.exception


def test_the_history_controls_keep_the_settings_bounds(app_engine, open_page, monkeypatch) -> None:
    """The page's bounds are the settings' (lib.config), not a copy: narrower settings narrow the widgets."""
    from lib import config

    monkeypatch.setitem(config._RANGES, "history_max_entries", (0, 50))
    monkeypatch.setitem(config._RANGES, "history_correction_ratio", (0.0, 0.9))
    cache(app_engine, "acme")
    at = open_page(PAGE)
    size = at.number_input(key="corrections_history_size")
    ratio = at.slider(key="corrections_history_ratio")
    assert (size.min, size.max) == (0, 50)
    assert (ratio.min, ratio.max) == (0.0, 0.9)
    assert not at.exception


def test_the_judges_view_on_an_empty_cache_is_the_cold_start_note(app_engine, open_page) -> None:
    at = open_page(PAGE)
    assert [c.value for c in at.code] == ["No previous judgments available"]
    assert not at.exception


def test_without_reviews_there_is_no_trend_chart(app_engine, open_page) -> None:
    cache(app_engine, "acme", corrected=0, confirmed=0, unreviewed=3)
    at = open_page(PAGE)
    assert not at.get("plotly_chart")
    assert any("No reviewed judgments yet" in c.value for c in at.caption)
    assert not at.exception


def test_reviewed_judgments_draw_the_trend_chart_with_its_sample_size(app_engine, open_page) -> None:
    cache(app_engine, "acme")
    at = open_page(PAGE)
    (trend,) = figures(at)
    (line,) = [t for t in trend["data"] if t["type"] == "scatter"]
    (bar,) = [t for t in trend["data"] if t["type"] == "bar"]
    assert values(bar["y"]) == [row[0] for row in values(line["customdata"])]  # n reviewed, under every rate
    assert "of n = %{customdata[0]} reviewed" in line["hovertemplate"]
    assert not at.exception


def test_clearing_a_product_needs_its_name_typed(app_engine, open_page) -> None:
    cache(app_engine, "acme")
    cache(app_engine, "beta")
    at = open_page(PAGE, reviewer="admin")
    at.selectbox(key="corrections_clear_product").set_value("acme")
    at.text_input(key="corrections_clear_confirm").input("acm").run()
    assert at.button(key="corrections_clear").disabled
    at.text_input(key="corrections_clear_confirm").input("acme").run()
    at.button(key="corrections_clear").click().run()
    assert (count(app_engine, "acme"), count(app_engine, "beta")) == (0, 6)
    assert any("Deleted 6 judgments of acme" in s.value.replace("\\", "") for s in at.success)
    assert not at.exception


def test_clearing_a_product_with_an_alignment_experiment_says_so_and_deletes_it(
    app_engine, open_page
) -> None:
    """Issue 24.9: "Delete all its judgments" showed the generic error and deleted nothing."""
    from lib.models import AlignmentExperiment
    from tests.test_corrections import experiment_on

    cache(app_engine, "acme")
    experiment_on(app_engine, "acme")
    at = open_page(PAGE, reviewer="admin")
    at.selectbox(key="corrections_clear_product").set_value("acme").run()
    assert any("also deletes 1 alignment experiment of acme" in w.value.replace("\\", "") for w in at.warning)
    at.text_input(key="corrections_clear_confirm").input("acme").run()
    at.button(key="corrections_clear").click().run()
    assert count(app_engine, "acme") == 0
    with session_scope(app_engine, read_only=True) as s:
        assert s.exec(select(AlignmentExperiment)).all() == []
    assert any(
        "Deleted 6 judgments of acme and 1 alignment experiment." in s.value.replace("\\", "")
        for s in at.success
    )
    assert not at.exception


def _upload(at: AppTest, name: str, raw: bytes) -> AppTest:
    at.file_uploader(key="corrections_upload").set_value((name, raw, "application/json")).run()
    return at.button(key="corrections_import").click().run()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"cache_version": "2.0", "judgments": {}}', "unsupported version"),
        (b'{"cache_version": "1.0", "judgments": {"x": {"decision": "MAYBE"}}}', "MAYBE"),
        (b"{broken", "invalid JSON"),
    ],
)
def test_a_bad_cache_file_is_refused_with_a_warning_and_changes_nothing(
    app_engine, open_page, raw, says
) -> None:
    cache(app_engine, "acme")
    at = _upload(open_page(PAGE, reviewer="ayse"), "cache.json", raw)
    warning = " ".join(w.value for w in at.warning).replace("\\", "")
    assert says in warning and "nothing was imported" in warning
    assert count(app_engine) == 6
    assert not at.exception


def test_a_valid_cache_file_is_imported(app_engine, open_page) -> None:
    raw = json.dumps(
        {
            "cache_version": "1.0",
            "judgments": {
                "pr#1": {
                    "change_id": "pr#1",
                    "decision": "INCLUDE",
                    "reasoning": "core",
                    "user_decision": "EXCLUDE",
                    "user_reasoning": "tooling",
                    "product": "Acme Fungear",
                    "timestamp": "2024-11-15T10:30:00Z",
                }
            },
        }
    ).encode()
    at = _upload(open_page(PAGE, reviewer="ayse"), "cache.json", raw)
    assert any("1 inserted" in s.value for s in at.success)
    assert metric(at, "Corrected") == "1"
    assert not at.exception


def test_importing_without_a_reviewer_name_writes_nothing(app_engine, open_page) -> None:
    raw = b'{"cache_version": "1.0", "judgments": {}}'
    at = _upload(open_page(PAGE), "cache.json", raw)
    assert any("Enter your name" in w.value for w in at.warning)
    assert not at.success
    assert not at.exception


def test_one_judgment_can_be_re_reviewed_and_shows_its_history(app_engine, open_page) -> None:
    cache(app_engine, "acme", corrected=0, confirmed=1, unreviewed=0)
    with session_scope(app_engine, read_only=True) as s:
        judgment = corrections.get_judgment(session=s, change_id="acme#0")
        assert judgment is not None
        key = f"corrections_review_{judgment.id}"
    at = open_page(PAGE, reviewer="bob")
    at.text_input(key="corrections_change_id").input("acme#0").run()
    at.selectbox(key=f"{key}_value").set_value("EXCLUDE")
    at.text_area(key=f"{key}_reason").input("Internal tooling only")
    at.button(key=f"{key}_overrule").click().run()
    with session_scope(app_engine, read_only=True) as s:
        stored = corrections.get_judgment(session=s, change_id="acme#0")
        assert stored is not None and (stored.user_decision, stored.reviewer, stored.version) == (
            "EXCLUDE",
            "bob",
            2,
        )
    history = next(d.value for d in at.dataframe if "action" in d.value.columns)
    assert history[["reviewer", "action", "from", "to"]].values.tolist() == [
        ["bob", "overruled", "INCLUDE", "EXCLUDE"]
    ]
    assert not at.exception


def test_an_unknown_change_id_says_so(app_engine, open_page) -> None:
    at = open_page(PAGE)
    at.text_input(key="corrections_change_id").input("nope").run()
    assert any("No judgment has this change id" in i.value for i in at.info)
    assert not at.exception


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"state": "corrected"}, ["beta#0", "acme#1", "acme#0"]),
        ({"state": "unreviewed", "product": "acme"}, ["acme#5", "acme#4", "acme#3"]),
        ({"state": "confirmed", "reviewer": "ayse"}, ["acme#2"]),
        ({"state": "bogus"}, None),  # an unknown state is ignored: every judgment is listed
    ],
)
def test_a_deep_link_selects_the_filters_and_the_rows(app_engine, open_page, query, expected) -> None:
    cache(app_engine, "acme")
    cache(app_engine, "beta", corrected=1, confirmed=0, unreviewed=0)
    at = open_page(PAGE, query=query)
    if expected is None:
        assert at.selectbox(key="corrections_state").value == "Any"
        assert len(at.dataframe[0].value) == 7
    else:
        assert list(at.dataframe[0].value["change_id"]) == expected
        assert at.selectbox(key="corrections_state").value == query["state"]
    assert not at.exception


def test_a_linked_change_id_opens_that_judgment(app_engine, open_page) -> None:
    cache(app_engine, "acme")
    at = open_page(PAGE, query={"change_id": "acme#1"})
    assert at.text_input(key="corrections_change_id").value == "acme#1"
    assert not any("No judgment has this change id" in i.value for i in at.info)
    assert not at.exception


def test_the_table_links_each_row_and_types_its_columns(app_engine, open_page) -> None:
    cache(app_engine, "acme", corrected=1, confirmed=0, unreviewed=1)
    with session_scope(app_engine) as s:
        s.add(EvaluationSnapshot(id="snap_x", question="q", model_answer="a", product="acme"))
        s.flush()
        s.exec(select(Judgment).where(Judgment.change_id == "acme#0")).one().snapshot_id = "snap_x"
    at = open_page(PAGE)
    table = at.dataframe[0]
    assert list(table.value["open"]) == ["corrections?change_id=acme%231", "evaluations?snapshot=snap_x"]
    config = json.loads(table.proto.columns)
    assert config["open"]["type_config"]["type"] == "link"
    assert config["confidence"]["type_config"]["type"] == "progress"
    assert config["reviewed_at"]["type_config"]["type"] == "datetime"
    # Whose decision each column holds, named as in every CSV and the API (issue 25).
    labels = {name: config[name]["label"] for name in ("judge_decision", "reviewer_decision", "reviewed_by")}
    assert labels == {
        "judge_decision": "Judge's decision",
        "reviewer_decision": "Reviewer's decision",
        "reviewed_by": "Reviewed by",
    }
    assert list(table.proto.column_order)[:6] == [
        "open",
        "change_id",
        "metric",
        "judge_decision",
        "reviewer_decision",
        "state",
    ]
    assert table.proto.placeholder == "—"  # the unreviewed row's reviewer and reason: never "None"
    assert not at.exception
