"""Metric names from data render as text on every page (issue 24 point 6).

A metric set whose display names and rubric texts hold Markdown images, links and HTML (the demo
data with its rubric renamed) is opened on every page in Chromium. Widget labels, help tooltips,
radio options, captions and the like render Markdown, so one unescaped name made the reviewer's
browser fetch `evil.example` images and showed links to it. The test counts what leaves the page:
requests to any host but the app's own, and links or images pointing at `evil.example`; all zero.
The demo is a private copy of the run's one demo load (`sqlite_demo`), renamed in that copy.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from sqlalchemy import text

from lib import evaluation_form
from lib.db import init_db, session_scope
from lib.metrics import DEFAULT_METRICS, products_with_rubrics, upsert_metric_definitions
from lib.ui import REVIEWER_COOKIE
from tests.browser.conftest import new_app_context, settle
from tests.conftest import DemoTemplate

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

EVIL = "evil.example"
NAME = f"![t](http://{EVIL}/x.png) Img [l](http://{EVIL}/l) <img src='http://{EVIL}/h.png'> **{{slug}}**"
RUBRIC = f"Rubric ![d](http://{EVIL}/d.png) see [docs](http://{EVIL}/docs) www.{EVIL} me@{EVIL}"
WAIT_MS = 240_000  # the Alignment page alone took 105 s to draw at load 35 on this 2-core machine
DRAWN = """() => document.querySelectorAll('[data-testid="stMain"] [data-testid="stElementContainer"]').length >= 2"""
LEAKS = f"""() => ({{
    links: [...document.querySelectorAll('a[href*="{EVIL}"]')].map(a => a.outerHTML.slice(0, 120)),
    images: [...document.querySelectorAll('img[src*="{EVIL}"]')].map(i => i.outerHTML.slice(0, 120)),
}})"""


def _hostile_demo(url: str) -> str:
    """The demo data set at `url` with every metric's display name and rubric text made hostile; an
    evaluation id."""
    engine = init_db(url)
    with session_scope(engine) as session:
        # Products on the default set get it as their own rubric first, so every metric is renamed.
        for product in evaluation_form.known_products(session=session):
            if product not in products_with_rubrics(session):
                upsert_metric_definitions(
                    session=session,
                    definitions=[
                        {"product": product, "slug": m.slug, "display_name": m.display_name,
                         "min": m.min_value, "max": m.max_value, "description": m.description}
                        for m in DEFAULT_METRICS
                    ],
                )  # fmt: skip
        session.execute(
            text(
                "UPDATE metric_definitions SET display_name = replace(:name, '{slug}', slug), description = :rubric"
            ),
            {"name": NAME, "rubric": RUBRIC},
        )
        session.execute(
            text("UPDATE alignment_experiments SET name = :name"), {"name": NAME.replace("{slug}", "lab")}
        )
        snapshot_id = session.execute(
            text("SELECT id FROM evaluation_snapshots ORDER BY id LIMIT 1")
        ).scalar_one()
    engine.dispose()
    return str(snapshot_id)


def test_every_page_renders_hostile_metric_names_as_text(
    streamlit_app, browser, tmp_path, sqlite_demo: DemoTemplate
) -> None:
    url = sqlite_demo.copy_to(tmp_path / "hostile.db")
    snapshot = quote(_hostile_demo(url), safe="")
    server = streamlit_app(url)
    context = new_app_context(browser, viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": REVIEWER_COOKIE, "value": "ayse", "url": server.base_url}])
    outside: list[tuple[str, str]] = []
    opened = [""]  # the path being walked: a failure names the page a request left from
    # Every request for another host is recorded and aborted: nothing leaves the machine.
    context.route(
        re.compile(rf"^(?!{re.escape(server.base_url)}/)[a-z]+://.*"),
        lambda route: (outside.append((opened[0], route.request.url)), route.abort()),
    )
    page = context.new_page()
    found: dict[str, dict[str, list[str]]] = {}
    # Every page of the app, by the sidebar's own link: one page load, then each page as a reviewer
    # opens it (a full load of Streamlit's scripts per page cost Chromium ~3 CPU s each). What a
    # page opens in place is opened there too: Team queues' "Awaiting a lead" tab, the Coach page's
    # pick of an evaluation (its chat page). An evaluation's own page is loaded by its address.
    pages = [
        "", "import", "evaluations", "review", "queues", "corrections", "new", "coach", "notes", "tag-scores",
        "analytics", "alignment", "judge-versions", "precedents", "admin",
    ]  # fmt: skip
    addresses = [f"evaluations?snapshot={snapshot}"]

    def check(path: str) -> None:
        page.wait_for_function(DRAWN, timeout=WAIT_MS)
        settle(page, timeout=WAIT_MS)
        page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=WAIT_MS)
        leaks = page.evaluate(LEAKS)
        if leaks["links"] or leaks["images"]:
            found[path] = leaks
        assert "Traceback" not in page.inner_text('[data-testid="stMain"]'), path

    try:
        page.goto(server.base_url)
        check("")
        nav = page.get_by_test_id("stSidebarNav")
        nav.get_by_role("button", name=re.compile(r"View \d+ more")).click()  # the nav shows ten
        settle(page, timeout=WAIT_MS)
        links = nav.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
        assert sorted(links) == sorted(f"{server.base_url}/{path}" for path in pages)  # a new page: add it
        for path in pages[1:]:
            opened[0] = path
            nav.locator(f'a[href="{server.base_url}/{path}"]').click()
            # The path, with whatever query the page writes on its first run (Team queues adds
            # `?queue=N`): an exact address missed the page when that run beat this wait (CI, 2026-11-26).
            page.wait_for_url(re.compile(rf"^{re.escape(server.base_url)}/{path}(\?.*)?$"))
            check(path)
            if path == "queues":
                opened[0] = "queues, Awaiting a lead"
                page.get_by_role("tab", name="Awaiting a lead").click()
                check(opened[0])
            elif path == "coach":
                opened[0] = "coach, an evaluation picked"
                page.locator(".st-key-coach_pick").click()
                page.get_by_role("option").first.click()
                page.wait_for_url(re.compile(rf"^{re.escape(server.base_url)}/coach\?snapshot=.+$"))
                check(opened[0])
        for path in addresses:
            opened[0] = path
            page.goto(f"{server.base_url}/{path}")
            check(path)
        opened[0] = "api/v1/docs"
        page.goto(f"{server.base_url}/api/v1/docs")  # issue 24.11: its scripts come from the app too
        page.wait_for_selector(".swagger-ui .info", timeout=WAIT_MS)
    finally:
        context.close()
    assert found == {}
    assert outside == []
