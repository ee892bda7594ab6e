"""Evaluations page under AppTest: filters (widgets and URL), pages, detail states, archive/restore."""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session
from streamlit.testing.v1 import AppTest

from lib.config import reset_settings
from lib.highlight import strip_app_markup
from lib.importer import import_evaluations
from lib.models import EvaluationSnapshot
from lib.safe_markdown import escape_markdown
from tests.test_inspector import RECORDS, record

PAGE = "pages/evaluations.py"
UNLOCATED_LABEL = "Position could not be located, highlight off"
UNVERIFIED_LABEL = "Evidence could not be verified"


@pytest.fixture
def seeded(app_engine: Engine) -> Engine:
    with Session(app_engine) as session:
        import_evaluations(session=session, records=RECORDS, reviewer="tester")
        session.commit()
    return app_engine


def listed_ids(at: AppTest) -> list[str]:
    return list(at.dataframe[0].value["id"]) if at.dataframe else []


def count_line(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("**"))


def test_list_shows_every_live_evaluation_newest_first(seeded, open_page) -> None:
    at = open_page(PAGE)
    assert count_line(at) == "**4** evaluations match"
    assert listed_ids(at) == ["s_d", "s_c", "s_b", "s_a"]
    assert dict(at.query_params) == {}
    assert not at.exception


def test_empty_database_says_nothing_matches(app_engine, open_page) -> None:
    at = open_page(PAGE)
    assert count_line(at) == "**0** evaluations match"
    assert [i.value for i in at.info] == ["No evaluations match these filters."]
    assert not at.exception


@pytest.mark.parametrize(
    ("widget", "key", "value", "expected", "param"),
    [
        ("selectbox", "evaluations_product", "beta", ["s_d", "s_c"], {"product": "beta"}),
        ("selectbox", "evaluations_language", "tr", ["s_b"], {"language": "tr"}),
        ("selectbox", "evaluations_model", "m2", ["s_b"], {"model": "m2"}),
        ("selectbox", "evaluations_category", "history", ["s_b"], {"category": "history"}),
        ("selectbox", "evaluations_metric", "safety", ["s_c", "s_b", "s_a"], {"metric": "safety"}),
        ("selectbox", "evaluations_evidence", "none", ["s_d"], {"evidence": "none"}),
        ("selectbox", "evaluations_evidence", "unverified", ["s_c"], {"evidence": "unverified"}),
        ("selectbox", "evaluations_review", "reviewed", [], {"review": "reviewed"}),
        ("selectbox", "evaluations_sort", "max_gap", ["s_c", "s_a", "s_b", "s_d"], {"sort": "max_gap"}),
        ("number_input", "evaluations_min_gap", 2.0, ["s_c", "s_a"], {"min_gap": "2"}),
        ("date_input", "evaluations_from", date(2025, 1, 14), ["s_d", "s_c"], {"from": "2025-01-14"}),
        ("date_input", "evaluations_to", date(2025, 1, 12), ["s_b", "s_a"], {"to": "2025-01-12"}),
        ("text_input", "evaluations_q", "100%", ["s_d"], {"q": "100%"}),
    ],
)
def test_filter_widget_narrows_the_list_and_is_written_to_the_url(
    seeded, open_page, widget, key, value, expected, param
) -> None:
    at = open_page(PAGE)
    getattr(at, widget)(key=key).set_value(value).run()
    assert listed_ids(at) == expected
    assert dict(at.query_params) == param
    assert not at.exception


@pytest.mark.parametrize(
    ("query", "expected", "widget", "key", "shown"),
    [
        ({"product": "beta", "evidence": "unverified"}, ["s_c"], "selectbox", "evaluations_product", "beta"),
        ({"language": "tr"}, ["s_b"], "selectbox", "evaluations_language", "tr"),
        ({"min_gap": "3"}, ["s_c"], "number_input", "evaluations_min_gap", 3.0),
        ({"q": "Question s_a"}, ["s_a"], "text_input", "evaluations_q", "Question s_a"),
        ({"from": "2025-01-15"}, ["s_d"], "date_input", "evaluations_from", date(2025, 1, 15)),
        (
            {"sort": "weighted_gap"},
            ["s_c", "s_a", "s_b", "s_d"],
            "selectbox",
            "evaluations_sort",
            "weighted_gap",
        ),
    ],
)
def test_shared_url_opens_the_same_filtered_view(
    seeded, open_page, query, expected, widget, key, shown
) -> None:
    at = open_page(PAGE, query=query)
    assert listed_ids(at) == expected
    assert getattr(at, widget)(key=key).value == shown
    assert not at.exception


def test_url_value_that_no_row_has_yet_is_kept_and_matches_nothing(seeded, open_page) -> None:
    at = open_page(PAGE, query={"product": "gamma"})
    assert at.selectbox(key="evaluations_product").value == "gamma"
    assert count_line(at) == "**0** evaluations match"
    assert not at.exception


@pytest.mark.parametrize("typed", ["istanbul", "ISTANBUL", "ıstanbul"])
def test_text_filter_finds_turkish_capitals_by_any_case(app_engine, open_page, typed: str) -> None:
    records = [
        record("s_ist", question="İstanbul'da hangi müzeler açık?"),
        record("s_odul", question="Nobel Ödülü kimlere verildi?", created_at="2025-01-11T12:00:00Z"),
    ]
    with Session(app_engine) as session:
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
    at = open_page(PAGE)
    at.text_input(key="evaluations_q").set_value(typed).run()
    assert listed_ids(at) == ["s_ist"]
    assert count_line(at) == "**1** evaluation matches"
    at.text_input(key="evaluations_q").set_value("ödülü").run()
    assert listed_ids(at) == ["s_odul"]
    assert not at.exception


@pytest.fixture
def thirty(app_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "10")
    reset_settings()
    records = [
        record(f"p{i:02d}", product="even" if i % 2 == 0 else "odd", created_at=f"2025-02-01T00:{i:02d}:00Z")
        for i in range(30)
    ]
    with Session(app_engine) as session:
        import_evaluations(session=session, records=records)
        session.commit()
    return app_engine


def test_list_fetches_one_page_and_counts_all(thirty, open_page) -> None:
    at = open_page(PAGE)
    assert count_line(at) == "**30** evaluations match"
    assert listed_ids(at) == [f"p{i:02d}" for i in range(29, 19, -1)]
    assert not at.exception


def test_pager_moves_to_a_later_page_and_writes_it_to_the_url(thirty, open_page) -> None:
    at = open_page(PAGE)
    at.number_input(key="evaluations_page").set_value(3).run()
    assert listed_ids(at) == [f"p{i:02d}" for i in range(9, -1, -1)]
    assert dict(at.query_params) == {"page": "3"}
    assert not at.exception


def test_page_number_in_the_url_opens_that_page(thirty, open_page) -> None:
    at = open_page(PAGE, query={"page": "2"})
    assert listed_ids(at) == [f"p{i:02d}" for i in range(19, 9, -1)]
    assert not at.exception


def test_changing_a_filter_returns_to_the_first_page(thirty, open_page) -> None:
    at = open_page(PAGE, query={"page": "3"})
    at.selectbox(key="evaluations_product").set_value("odd").run()
    assert listed_ids(at) == [f"p{i:02d}" for i in range(29, 9, -2)]
    assert dict(at.query_params) == {"product": "odd"}
    assert not at.exception


def test_a_capped_count_keeps_paging_past_the_cap(thirty, open_page, monkeypatch) -> None:
    """A count the counters cannot answer (dates) stops at the cap ("12+"): the pager still moves on
    while rows remain. A review state is counted exactly, whatever the cap."""
    from lib import counters

    monkeypatch.setattr(counters, "COUNT_CAP", 12)
    assert count_line(open_page(PAGE, query={"review": "pending"})) == "**30** evaluations match"
    at = open_page(PAGE, query={"review": "pending", "from": "2025-02-01"})
    assert count_line(at) == "**12+** evaluations match"
    at.button(key="evaluations_page_next").click().run()
    assert not at.button(key="evaluations_page_next").disabled
    at.button(key="evaluations_page_next").click().run()
    assert listed_ids(at) == [f"p{i:02d}" for i in range(9, -1, -1)]
    assert any("of 3+ pages" in c.value for c in at.caption)
    assert not at.exception


@pytest.mark.parametrize("rare_matches", [0, 1_000])  # SQLite: the walk plan, then the sort of matches
def test_a_text_count_stops_at_the_text_cap_and_paging_reaches_every_row(
    thirty, open_page, monkeypatch, rare_matches: int
) -> None:
    """A text filter counts to its own, lower cap ("12+" here, "1,000+" in use; the unfiltered cap
    is untouched), and Next still pages on past it to the last matching row."""
    from lib import counters, search

    monkeypatch.setattr(counters, "TEXT_COUNT_CAP", 12)
    monkeypatch.setattr(search, "RARE_MATCHES", rare_matches)
    at = open_page(PAGE, query={"q": "QUESTION P"})  # all 30: "Question p00?" … "Question p29?"
    assert count_line(at) == "**12+** evaluations match"
    seen = listed_ids(at)
    for _ in range(2):
        assert not at.button(key="evaluations_page_next").disabled
        at.button(key="evaluations_page_next").click().run()
        seen += listed_ids(at)
    assert seen == [f"p{i:02d}" for i in range(29, -1, -1)]
    assert count_line(open_page(PAGE, query={"q": "question p2"})) == "**10** evaluations match"
    assert count_line(open_page(PAGE)) == "**30** evaluations match"
    assert not at.exception


def test_download_offers_every_match_not_just_the_page(thirty, open_page) -> None:
    at = open_page(PAGE)
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download CSV (all 30 matches)"]
    assert not at.exception


def test_download_is_a_streamed_link_when_served_by_serve_py(seeded, open_page, download_client) -> None:
    from lib import downloads

    at = open_page(PAGE)
    links = at.get("link_button")
    assert [b.proto.label for b in links] == ["Download CSV (all 4 matches)"]
    assert links[0].proto.url.startswith(f"{downloads.DOWNLOAD_PREFIX}/")
    assert not at.get("download_button")
    at.selectbox(key="evaluations_csv_form").set_value("long").run()
    url = at.get("link_button")[0].proto.url
    response = download_client.get(url)
    assert response.headers["content-disposition"] == 'attachment; filename="evaluations_long.csv"'
    assert response.text.splitlines()[0].startswith(
        "id,created_at,product,language,model,category,question,answer,metric"
    )
    download_client.cookies.clear()  # another client: the link is not a bearer link (issue 24.8)
    assert download_client.get(url).status_code == 403
    assert not at.exception


# --- detail ------------------------------------------------------------------------------------


def detail(open_page, sid: str, **kwargs: Any) -> AppTest:
    return open_page(PAGE, query={"snapshot": sid}, **kwargs)


def answer_html(at: AppTest) -> str:
    # The question and the answer both render through lib.highlight (render_long_text); the answer is second.
    return [m.value for m in at.markdown if m.value.startswith('<div class="ov-highlight">')][1]


def test_detail_highlights_exact_evidence_in_the_answer(seeded, open_page) -> None:
    at = detail(open_page, "s_a")
    html = answer_html(at)
    assert html.count("<mark ") == 1
    assert '<mark class="ov-ev" data-metrics="clarity"' in html
    assert ">Paris is the capital of France.</mark>" in html
    assert any(m.value.startswith('<div class="ov-legend">') for m in at.markdown)
    assert not at.warning and not at.info
    assert not at.exception


def test_detail_paints_overlapping_evidence_of_two_metrics(app_engine, open_page) -> None:
    evidence = {
        "clarity": [{"quote": "Paris is the capital", "start": 0, "end": 20, "why": "w1"}],
        "safety": [{"quote": "capital of France", "start": 13, "end": 30, "why": "w2"}],
    }
    with Session(app_engine) as session:
        import_evaluations(session=session, records=[record("s_o", evidence=evidence)])
        session.commit()
    html = answer_html(detail(open_page, "s_o"))
    marks = re.findall(r'<mark class="ov-ev" data-metrics="([^"]+)"[^>]*>([^<]*)</mark>', html)
    assert marks == [("clarity", "Paris is the "), ("clarity safety", "capital"), ("safety", " of France")]


def test_detail_shows_unlocated_evidence_with_its_label_and_no_highlight(seeded, open_page) -> None:
    at = detail(open_page, "s_b")
    assert "<mark" not in answer_html(at)
    assert [i.value for i in at.info] == [UNLOCATED_LABEL]
    assert "> known for the Eiffel Tower" in [m.value for m in at.markdown]
    assert not at.exception


def test_detail_warns_about_unverified_evidence_and_still_highlights_the_rest(seeded, open_page) -> None:
    at = detail(open_page, "s_c")
    assert [w.value for w in at.warning] == [UNVERIFIED_LABEL]
    assert "> Berlin is the capital" in [m.value for m in at.markdown]
    assert answer_html(at).count("<mark ") == 1
    assert not at.exception


def test_detail_without_evidence_says_so_and_still_shows_scores(seeded, open_page) -> None:
    at = detail(open_page, "s_d")
    assert [i.value for i in at.info] == ["No evidence was recorded for this evaluation."]
    assert "<mark" not in answer_html(at)
    assert next(m.value for m in at.metric if m.label == "Judge's score") == "4"
    assert not at.exception


def test_detail_cards_are_ordered_by_gap_and_mark_the_primary_metric(seeded, open_page) -> None:
    at = detail(open_page, "s_c")
    titles = [
        m.value for m in at.markdown if m.value.startswith("**") and not m.value.startswith("**Product")
    ]
    cards = [t for t in titles if not t.startswith(("**Why", "**Better", "**User", "**Judge"))]
    assert cards[:2] == ["**Safety** :blue-badge[Primary]", "**Clarity**"]
    assert len(cards) == 8
    user, judge, gap = (
        next(m.value for m in at.metric if m.label == label)
        for label in ("User's score", "Judge's score", "Gap")
    )
    assert (user, judge, gap) == ("1", "5", "4")
    assert not at.exception


def test_detail_of_an_unknown_id_says_so(seeded, open_page) -> None:
    at = detail(open_page, "snap_<b>nope</b>")
    assert [e.value for e in at.error] == [
        "No evaluation has the id “snap\\_\\<b\\>nope\\<\\/b\\>”. It may have been mistyped."
    ]
    assert not at.exception


def test_detail_escapes_untrusted_text_outside_the_highlight(app_engine, open_page) -> None:
    hostile = "<img src=x onerror=alert(1)> [click](javascript:alert(1))"
    with Session(app_engine) as session:
        import_evaluations(
            session=session,
            records=[
                record(
                    "s_h",
                    question=hostile,
                    overall_feedback=hostile,
                    category=hostile,
                    user_scores={"clarity": {"score": 2, "reason": hostile}},
                    judge_scores={"clarity": {"score": 4, "reason": hostile}},
                    evidence={"clarity": [{"quote": "Paris", "why": hostile, "better": hostile}]},
                )
            ],
        )
        session.commit()
    at = detail(open_page, "s_h")
    carrying = [m.value for m in at.markdown if "img" in m.value]
    html = [v for v in carrying if v.startswith('<div class="ov-')]
    text = [v for v in carrying if not v.startswith('<div class="ov-')]
    # Fields, feedback, user and judge reason, why, better as Markdown; the question and the answer's
    # evidence list as lib.highlight HTML.
    assert len(html) == 2 and len(text) == 6
    assert strip_app_markup(html[0]) == hostile
    for value in html:
        assert "<img" not in value and "&lt;img src=x onerror=alert(1)&gt;" in value
    for value in text:
        # Every `<`, `[` and `(` is backslash-escaped: no HTML, no link can form.
        assert re.search(r"(?<!\\)[<\[(]", value.replace(":blue-badge[", "")) is None, value
    assert not at.exception


def test_start_chat_links_to_the_coach_for_this_evaluation(seeded, open_page, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # configured; never called here
    reset_settings()
    at = detail(open_page, "s_a")
    assert "[💬 Start chat](coach?snapshot=s_a)" in [m.value for m in at.markdown]
    assert not any("none is configured" in c.value for c in at.caption)
    assert not at.exception


def test_without_an_llm_start_chat_is_not_a_link_and_says_which_variable_to_set(seeded, open_page) -> None:
    at = detail(open_page, "s_a")
    markdown = [m.value for m in at.markdown]
    assert "💬 Start chat" in markdown
    assert not any("](coach?" in m for m in markdown)
    captions = [c.value for c in at.caption]
    hints = [c for c in captions if "OPENAI\\_API\\_KEY" in c]
    assert len(hints) == 1 and hints[0].startswith("🔌 The coach and second opinions need an LLM")
    assert not at.exception


def test_without_an_llm_second_opinions_say_why_once_instead_of_a_greyed_button_per_metric(
    seeded, open_page
) -> None:
    at = detail(open_page, "s_a", reviewer="ayse")
    assert not [b for b in at.button if "second_opinion" in str(b.key)]
    assert [c.value for c in at.caption if c.value.startswith("🧐")] == [
        "🧐 " + escape_markdown("No second-opinion buttons: no LLM is configured.")
    ]
    assert not at.exception


def test_detail_is_titled_by_the_question_with_the_id_below(seeded, open_page) -> None:
    at = detail(open_page, "s_d")
    assert [h.value for h in at.header] == [escape_markdown("What does 100% mean?")]
    assert "Evaluation `s_d`" in [c.value for c in at.caption]
    assert not at.exception


# --- the table: links, titles, column types --------------------------------------------------------


def column_config(at: AppTest) -> dict[str, Any]:
    return json.loads(at.dataframe[0].proto.columns)


def test_list_rows_link_to_their_detail_and_read_as_their_question(seeded, open_page) -> None:
    at = open_page(PAGE)
    frame = at.dataframe[0].value
    assert list(frame["open"]) == [f"evaluations?snapshot={sid}" for sid in ["s_d", "s_c", "s_b", "s_a"]]
    assert list(frame["title"])[:2] == ["What does 100% mean?", "Question s_c?"]
    config = column_config(at)
    assert config["open"]["type_config"] == {"type": "link", "display_text": "Open"}
    assert config["reviewed_share"]["type_config"]["type"] == "progress"
    assert config["max_gap"]["type_config"] == {"type": "number", "format": "%.2f"}
    assert config["created_at"]["type_config"]["type"] == "datetime"
    assert "Scale 1–5" in config["judge_meta_score"]["help"]
    assert not at.exception


def test_list_shows_gap_and_review_state_first_and_missing_values_as_a_dash(seeded, open_page) -> None:
    at = open_page(PAGE)
    proto = at.dataframe[0].proto
    assert list(proto.column_order)[:6] == [
        "open",
        "title",
        "max_gap",
        "weighted_gap",
        "review",
        "reviewed_share",
    ]
    assert proto.placeholder == "—"
    frame = at.dataframe[0].value.set_index("id")
    assert frame.loc["s_d", "review"] == "1 of 1 pending"
    assert frame.loc["s_c", "evidence"] == "2 (1 unverified)"
    assert "None" not in frame.astype(str).to_string().replace("nan", "")
    assert not at.exception


def test_pager_arrows_step_one_page(thirty, open_page) -> None:
    at = open_page(PAGE)
    assert at.button(key="evaluations_page_prev").disabled
    at.button(key="evaluations_page_next").click().run()
    assert listed_ids(at) == [f"p{i:02d}" for i in range(19, 9, -1)]
    assert dict(at.query_params) == {"page": "2"}
    at.button(key="evaluations_page_next").click().run()
    assert at.button(key="evaluations_page_next").disabled
    at.button(key="evaluations_page_prev").click().run()
    assert dict(at.query_params) == {"page": "2"}
    assert not at.exception


def test_back_button_returns_to_the_filtered_list(seeded, open_page) -> None:
    at = open_page(PAGE, query={"snapshot": "s_c", "product": "beta"})
    at.button(key="evaluations_back").click().run()
    assert "snapshot" not in at.query_params
    assert listed_ids(at) == ["s_d", "s_c"]
    assert not at.exception


# --- archive / restore ----------------------------------------------------------------------------


def stored(engine: Engine, sid: str) -> EvaluationSnapshot:
    with Session(engine) as session:
        return session.get(EvaluationSnapshot, sid)


def test_archive_hides_the_evaluation_and_records_the_reviewer(seeded, open_page) -> None:
    at = detail(open_page, "s_c", reviewer="lead")
    at.button(key="evaluations_archive").click().run()
    snap = stored(seeded, "s_c")
    assert (snap.status, snap.status_changed_by) == ("archived", "lead") and snap.deleted_at is not None
    assert [s.value.replace("\\", "") for s in at.success] == ["Evaluation archived."]
    assert at.button(key="evaluations_restore")
    assert listed_ids(open_page(PAGE)) == ["s_d", "s_b", "s_a"]
    assert not at.exception


def test_restore_brings_an_archived_evaluation_back(seeded, open_page) -> None:
    detail(open_page, "s_c", reviewer="lead").button(key="evaluations_archive").click().run()
    at = detail(open_page, "s_c", reviewer="ayse")
    assert at.warning[0].value.startswith("This evaluation is archived")
    at.button(key="evaluations_restore").click().run()
    snap = stored(seeded, "s_c")
    assert (snap.deleted_at, snap.status, snap.status_changed_by) == (None, "active", "ayse")
    assert "s_c" in listed_ids(open_page(PAGE))
    assert not at.exception


def test_show_archived_lists_only_archived_evaluations(seeded, open_page) -> None:
    detail(open_page, "s_b", reviewer="lead").button(key="evaluations_archive").click().run()
    at = open_page(PAGE)
    at.toggle(key="evaluations_archived").set_value(True).run()
    assert listed_ids(at) == ["s_b"]
    assert count_line(at) == "**1** archived evaluation matches"
    assert dict(at.query_params) == {"archived": "1"}
    assert not at.exception


def test_archive_without_a_reviewer_name_changes_nothing(seeded, open_page) -> None:
    at = detail(open_page, "s_c")
    at.button(key="evaluations_archive").click().run()
    assert stored(seeded, "s_c").deleted_at is None
    assert [w.value for w in at.warning] == [
        UNVERIFIED_LABEL,
        "Enter your name in the sidebar to archive or restore evaluations.",
    ]
    assert not at.exception


def test_detail_survives_a_lone_surrogate_already_stored(seeded, open_page) -> None:
    """Issue #17: imports now refuse them, but one stored earlier must not crash the page."""
    with Session(seeded) as session:
        snapshot = session.get(EvaluationSnapshot, "s_a")
        assert snapshot is not None and snapshot.evidence_json
        evidence = dict(snapshot.evidence_json)
        metric = next(iter(evidence))
        items = [
            dict(item, why="why \ud800", better="\udc00 better") for item in evidence[metric]["evidence"]
        ]
        evidence[metric] = {**evidence[metric], "evidence": items, "judge_reason": "reason \ud800"}
        snapshot.evidence_json = evidence
        snapshot.user_scores_json = {
            slug: {**entry, "reason": "user \udfff"} for slug, entry in snapshot.user_scores_json.items()
        }
        session.add(snapshot)
        session.commit()
    at = detail(open_page, "s_a")
    assert not at.exception
    shown = " ".join(m.value for m in at.markdown)
    assert "user \ufffd" in shown and "reason \ufffd" in shown  # replaced, not dropped
