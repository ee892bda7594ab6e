"""Every table over the demo data: typed columns, "—" for missing values, titles, row links.

One copy of the run's demo database (`sqlite_demo`) per module, which every page reads; the pages only read.
"""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, select
from streamlit.testing.v1 import AppTest

from lib.config import reset_settings
from lib.db import init_db
from lib.models import EvaluationSnapshot
from lib.ui.tables import MAX_CONTENT_ROWS, table_height
from tests.conftest import DemoTemplate
from tests.pages.conftest import APPTEST_TIMEOUT, ROOT

PAGES = [
    "pages/overview.py",
    "pages/evaluations.py",
    "pages/corrections.py",
    "pages/notes.py",
    "pages/tag_scores.py",
    "pages/precedents.py",
    "pages/admin.py",
    "pages/analytics.py",
]


@pytest.fixture(scope="module")
def demo_url(tmp_path_factory: pytest.TempPathFactory, sqlite_demo: DemoTemplate) -> str:
    return sqlite_demo.copy_to(tmp_path_factory.mktemp("demo") / "demo.db")


@pytest.fixture
def demo(demo_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OVERRULE_DATABASE_URL", demo_url)
    monkeypatch.setenv("OVERRULE_LOAD_DEMO", "false")
    reset_settings()
    return demo_url


def run(page: str, query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=APPTEST_TIMEOUT)
    at.session_state["sidebar_reviewer"] = "ayse"
    for key, value in (query or {}).items():
        at.query_params[key] = value
    return at.run()


@pytest.mark.parametrize("page", PAGES)
def test_every_table_types_its_columns_and_never_shows_none(demo, page) -> None:
    at = run(page)
    assert not at.exception
    assert at.dataframe, f"{page} shows no table over the demo data"
    for table in at.dataframe:
        assert table.proto.placeholder == "—", page  # Streamlit's default draws a grey "None"
        config = json.loads(table.proto.columns)
        assert config.get("_index") == {"hidden": True}, page
        typed = [c for c, v in config.items() if c != "_index" and "type_config" in v]
        assert typed, f"{page}: a table without column types ({list(table.value.columns)})"
        cells = table.value.astype(object)
        assert not cells.isin(["None", "nan", "NaN"]).any().any(), page


def test_the_evaluations_list_reads_as_questions_and_links_every_row_to_its_detail(demo) -> None:
    at = run("pages/evaluations.py")
    frame = at.dataframe[0].value
    assert len(frame) == 25  # a whole page, shown whole (height fits it: see the height test)
    with Session(init_db(demo)) as session:
        questions = {s.id: s.question for s in session.exec(select(EvaluationSnapshot)).all()}
    for sid, title, link in zip(frame["id"], frame["title"], frame["open"], strict=True):
        assert link == f"evaluations?snapshot={sid}"
        assert not title.startswith("Evaluation ") and questions[sid].lstrip().startswith(title.rstrip("…"))
    assert not at.exception


def test_a_page_of_rows_is_shown_whole_up_to_sixty_rows() -> None:
    assert table_height(25) == "content"
    assert table_height(MAX_CONTENT_ROWS) == "content"
    assert isinstance(table_height(MAX_CONTENT_ROWS + 1), int)


def test_precedent_rows_link_to_their_trace_which_the_page_opens(demo) -> None:
    at = run("pages/precedents.py")
    frame = at.dataframe[0].value
    first = frame["id"].iloc[0]
    assert frame["open"].iloc[0] == f"precedents?interaction={first}"
    assert not any(str(t).startswith("Interaction ") for t in frame["title"])
    linked = frame["id"].iloc[-1]
    at = run("pages/precedents.py", {"interaction": str(linked)})
    assert at.selectbox(key="prec_pick").value == linked
    assert not at.exception


def test_the_pager_is_one_compact_row(demo) -> None:
    at = run("pages/evaluations.py")
    number = at.number_input(key="evaluations_page")
    assert number.label == "Page"
    assert number.proto.label_visibility.value == number.proto.label_visibility.COLLAPSED
    assert [b.key for b in at.button if b.key and b.key.startswith("evaluations_page_")] == [
        "evaluations_page_prev",
        "evaluations_page_next",
    ]
    assert not at.exception


def test_analytics_links_each_products_latest_alignment_experiment(demo) -> None:
    # Run on its own, the page cannot reach st.navigation's pages: the link falls back to Markdown.
    at = run("pages/analytics.py")
    links = [m.value for m in at.markdown if "](alignment?experiment=" in m.value]
    assert links and all(v.startswith("[🧪 Latest alignment experiment for ") for v in links)
    assert not at.exception
