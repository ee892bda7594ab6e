"""What only a browser shows at 1400 px (issue 25): every column of the tag-score heatmap has its
label, side by side without overlapping, and nothing on the Overview is cut off: figures, the
per-product table (no sideways scrolling) and the evidence chart's labels.

One database and one server serve the module; the pages only read.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import expect

from lib.corrections import add_judgment
from lib.db import init_db, session_scope
from lib.importer import import_evaluations
from lib.models import Judgment, LessonTagRelevance
from lib.notes import add_note
from tests.browser.conftest import StreamlitServer, settle
from tests.test_inspector import EXACT, UNVERIFIED, record

pytestmark = pytest.mark.browser

# 40 context tags as judge runs write them: families of language, product, metric, model, category.
METRICS = ("truthfulness", "helpfulness", "safety", "bias", "clarity", "consistency", "efficiency",
           "robustness", "coherence", "fluency", "groundedness", "relevance")  # fmt: skip
CATEGORIES = ("access", "biyoloji", "development", "fizik", "ingilizce", "matematik", "privacy", "product",
              "tarih", "billing", "security", "onboarding", "integrations", "reporting", "mobile", "api")  # fmt: skip
TAGS = sorted(
    [f"lang:{code}" for code in ("en", "tr", "de", "fr")]
    + [f"product:{name}" for name in ("acme-support", "docsearch-rag", "mentor-tr", "acme-fungear")]
    + [f"metric:{slug}" for slug in METRICS]
    + [f"model:{name}" for name in ("qwen-2.5-7b-instruct", "llama-3.1-8b", "mistral-nemo", "gpt-4o-mini")]
    + [f"category:{name}" for name in CATEGORIES]
)
LATEST_NOTE = datetime(2026, 11, 7, 13, 3, tzinfo=UTC)


def _database(folder: Path) -> str:
    url = f"sqlite:///{folder / 'layout.db'}"
    engine = init_db(url)
    with session_scope(engine) as session:
        records = [
            record(f"snap_{product}_{n}", product=product, evidence={"clarity": [EXACT, UNVERIFIED]})
            for product in ("acme-support", "docsearch-rag", "mentor-tr")
            for n in range(2)
        ]
        import_evaluations(session=session, records=records, reviewer="tester")
        for n in range(11):  # a product of judgments alone: an imported judgment cache
            judgment = Judgment(change_id=f"fungear:{n}", product="Acme Fungear", decision="INCLUDE")
            add_judgment(session=session, judgment=judgment, reviewer="tester")
        for n in range(8):
            note = add_note(
                session, "en", ("TIP", "PATTERN", "FAILURE", "SUCCESS")[n % 4],
                f"Note {n}: judges over-score clarity when answers are long and well formatted",
                session_id=f"run_{n}", timestamp=LATEST_NOTE.replace(day=1 + n % 7),
            )  # fmt: skip
            for k, tag in enumerate(TAGS):
                if (k + n) % 3 != 2:
                    session.add(LessonTagRelevance(lesson_id=note.id, tag=tag, score=((k * 7 + n) % 11 - 5) / 4,
                                                   positive_evals=1 + k % 3, negative_evals=n % 2))  # fmt: skip
        add_note(session, "en", "TIP", "the latest note", session_id="run_last", timestamp=LATEST_NOTE)
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamlitServer]:
    folder = tmp_path_factory.mktemp("layout")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_"))}
    env.update(OVERRULE_DATABASE_URL=_database(folder), OVERRULE_LOAD_DEMO="false")
    running = StreamlitServer(env, folder / "streamlit.log")
    yield running
    running.stop()


def _open(page, server: StreamlitServer, path: str, ready: str) -> None:
    page.goto(f"{server.base_url}/{path}")
    page.get_by_text(ready, exact=True).first.wait_for(timeout=120_000)
    settle(page)


def _crowded(boxes: list[dict[str, float]], font_px: float) -> list[int]:
    """Indexes of upright labels whose next neighbour's centre is closer than a line of text (the
    font size): such labels print over each other. Boxes include the line's leading, so they may
    touch while the glyphs stay apart."""
    centres = sorted(box["x"] + box["width"] / 2 for box in boxes)
    return [i for i, (a, b) in enumerate(itertools.pairwise(centres)) if b - a < font_px]


def test_every_tag_column_of_the_heatmap_is_labelled_without_overlap(server, page, tmp_path) -> None:
    try:
        _open(page, server, "tag-scores", "Scores by note and tag")
        chart = page.get_by_test_id("stPlotlyChart").filter(has_text="Relevance score per note and tag")
        labels = chart.locator(".xaxislayer-above .xtick text")
        labels.first.wait_for(timeout=120_000)
        texts = [t.strip() for t in labels.all_text_contents()]
        assert texts == TAGS  # all 40, in column order (plotly labelled 20 of them on its own)
        boxes = [labels.nth(i).bounding_box() for i in range(labels.count())]
        assert all(box and box["width"] > 0 for box in boxes)
        font_px = float(labels.first.evaluate("t => parseFloat(getComputedStyle(t).fontSize)"))
        assert font_px >= 8
        assert _crowded(boxes, font_px) == []  # type: ignore[arg-type]
        plot = chart.locator(".main-svg").first.bounding_box()
        assert plot and all(b["y"] >= plot["y"] for b in boxes)  # type: ignore[index]  # none cut at the top
        assert page.dialogs == []  # type: ignore[attr-defined]
    except Exception:
        page.screenshot(path=str(tmp_path / "heatmap_failure.png"), full_page=True)
        raise


# Any element inside a figure, a table or a label whose text is wider than its box is cut off.
_CUT = """(selector) => [...document.querySelectorAll(selector)]
  .filter(el => [el, ...el.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1))
  .map(el => el.innerText)"""


def test_nothing_on_the_overview_is_cut_off_at_1400_px(server, page, tmp_path) -> None:
    try:
        _open(page, server, "", "Per product")
        page.get_by_test_id("stPlotlyChart").first.wait_for(timeout=120_000)
        page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=120_000)
        figures = page.locator('[data-testid="stMetric"]')
        assert figures.count() == 9
        assert page.evaluate(_CUT, '[data-testid="stMetricValue"], [data-testid="stMetricLabel"]') == []
        assert "2026-11-07" in figures.filter(has_text="Latest note").inner_text()
        products = figures.filter(has_text="Products").locator('[data-testid="stMetricValue"]').inner_text()
        # The per-product table: as many rows as the figure says, every column without scrolling.
        table = page.locator('[data-testid="stDataFrame"]').first
        rows = table.locator('[role="row"]')
        assert int(products) == 4
        expect(rows).to_have_count(int(products) + 1)  # the grid draws its rows after the frame appears
        scroll = table.locator(".dvn-scroller").evaluate("s => [s.scrollWidth, s.clientWidth]")
        assert scroll[0] <= scroll[1], scroll
        # The evidence chart's labels are whole and inside the chart.
        chart = page.get_by_test_id("stPlotlyChart").first
        ticks = chart.locator(".yaxislayer-above .ytick text")
        assert sorted(t.strip() for t in ticks.all_text_contents()) == [
            "Could not be verified",
            "Verified, highlighted (exact, substring, anchor)",
            "Verified, position not located (whitespace)",
        ]
        frame = chart.bounding_box()
        for i in range(ticks.count()):
            box = ticks.nth(i).bounding_box()
            assert frame and box and box["x"] >= frame["x"]  # type: ignore[index]
        assert page.dialogs == []  # type: ignore[attr-defined]
    except Exception:
        page.screenshot(path=str(tmp_path / "overview_failure.png"), full_page=True)
        raise
