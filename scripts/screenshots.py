"""Screenshots of the main pages over the demo data, for the README (run it as `scripts/screenshots`).

A fresh demo database in a temporary directory, the app started exactly as the browser tests start
it (`tests/browser/conftest.StreamlitServer`), and Debian's headless Chromium at 1400×900. Each
shot waits for content rather than for time: the app settled as the browser tests wait for it
(`tests/browser/conftest.settle`: every run finished, nothing stale), every plotly chart drawn and
every image loaded, so a slow machine only makes it slower.
PNGs are reduced to a 256-colour palette, which keeps each one small enough to commit.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402
from sqlalchemy import case, func  # noqa: E402
from sqlmodel import col, select  # noqa: E402

from lib.db import init_db, session_scope  # noqa: E402
from lib.demo import load_demo  # noqa: E402
from lib.models import EvaluationSnapshot, Judgment  # noqa: E402
from lib.ui import REVIEWER_COOKIE  # noqa: E402
from tests.browser.conftest import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    StreamlitServer,
    new_app_context,
    settle,
)

OUT = ROOT / "docs" / "screenshots"
VIEWPORT = {"width": 1400, "height": 900}
TIMEOUT_MS = 120_000  # per wait: generous, the 2-core CI machine may be busy
REVIEWER = "demo-reviewer"
NAME_LABEL = "Your name (recorded with every change)"
CHARTS_DRAWN = """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
    .filter(c => c.offsetParent !== null)
    .every(c => c.querySelector('.main-svg'))"""
IMAGES_LOADED = "() => [...document.images].every(i => i.complete)"
MAIN_DRAWN = """() => document.querySelectorAll(
    '[data-testid="stMain"] [data-testid="stElementContainer"]').length >= 3"""
NEXT_FRAMES = """async () => {
    await document.fonts.ready;
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
}"""


@dataclass(frozen=True)
class Shot:
    """One screenshot: the file name, the page (path and query), and what to show on it."""

    name: str
    path: str
    tab: str | None = None  # a tab to open first
    heading: str | None = None  # scroll this heading to the top
    reviewer: str | None = None  # taken as this reviewer (a team queue assigned to them), not REVIEWER


def shots(snapshot_id: str) -> list[Shot]:
    """The README's screenshots, in README order."""
    return [
        Shot("review-queue", "review"),
        Shot("team-queues", "queues"),
        Shot("team-adjudication", "queues?tab=adjudication"),
        Shot("team-blind-first", f"review?queue={quote('Docsearch blind-first')}", reviewer="deniz"),
        Shot("evaluation-detail", f"evaluations?snapshot={quote(snapshot_id, safe='')}"),
        Shot("analytics", "analytics"),
        Shot("analytics-gaps", "analytics", heading="Gap distributions"),
        Shot("notes-timeline", "notes", tab="Timeline"),
    ]


def showcase_snapshot(url: str) -> str:
    """The demo evaluation with the most judgments reviewers corrected: a detail worth showing."""
    engine = init_db(url)
    try:
        with session_scope(engine) as session:
            corrected = func.sum(case((col(Judgment.was_corrected), 1), else_=0))
            row = session.exec(
                select(EvaluationSnapshot.id)
                .join(Judgment, col(Judgment.snapshot_id) == col(EvaluationSnapshot.id))
                .group_by(col(EvaluationSnapshot.id))
                .order_by(corrected.desc(), func.count().desc(), col(EvaluationSnapshot.id))
                .limit(1)
            ).first()
    finally:
        engine.dispose()
    if row is None:
        raise SystemExit("the demo data has no evaluation with judgments")
    return str(row)


def wait_until_drawn(page: Page) -> None:
    """Wait for content: the app settled, charts drawn, images loaded, web fonts ready."""
    settle(page, timeout=TIMEOUT_MS)
    page.wait_for_function(CHARTS_DRAWN, timeout=TIMEOUT_MS)
    page.wait_for_function(IMAGES_LOADED, timeout=TIMEOUT_MS)
    page.evaluate(NEXT_FRAMES)  # fonts ready and two frames painted: no half-drawn transition
    settle(page, timeout=TIMEOUT_MS)


def save_small_png(png: bytes, path: Path) -> int:
    """Write a screenshot as a 256-colour PNG (a third of the size, no visible loss on UI); its size."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    small = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    path.parent.mkdir(parents=True, exist_ok=True)
    small.save(path, format="PNG", optimize=True)
    return path.stat().st_size


def take(page: Page, base_url: str, shot: Shot, out: Path) -> Path:
    """Open one page, bring the part to show into view, wait until it is drawn, save the PNG."""
    as_reviewer(page, base_url, shot.reviewer or REVIEWER)
    page.goto(f"{base_url}/{shot.path}")
    # Any drawn element, not a title: the pages' headings change with their design.
    page.wait_for_function(MAIN_DRAWN, timeout=TIMEOUT_MS)
    wait_until_drawn(page)
    if shot.tab:
        page.get_by_role("tab", name=shot.tab).click()
        wait_until_drawn(page)
        page.get_by_role("tab", name=shot.tab).evaluate("e => e.scrollIntoView({block: 'start'})")
    if shot.heading:
        target = page.get_by_role("heading", name=shot.heading).first
        target.wait_for(timeout=TIMEOUT_MS)
        target.evaluate("e => e.scrollIntoView({block: 'start'})")
    wait_until_drawn(page)
    path = out / f"{shot.name}.png"
    size = save_small_png(page.screenshot(), path)
    print(f"{path}: {size // 1024} KB", flush=True)
    return path


def as_reviewer(page: Page, base_url: str, name: str) -> None:
    """The name the next page load reads from its cookie (as after an earlier visit by them)."""
    page.context.add_cookies([{"name": REVIEWER_COOKIE, "value": name, "url": base_url}])


def sign_in(page: Page, base_url: str, path: str) -> None:
    """Give the sidebar a name, on the first page to photograph (any page has the sidebar; the
    launcher keeps deep links on the router from a fresh server's first request)."""
    page.goto(f"{base_url}/{path}")
    name = page.get_by_label(NAME_LABEL)
    name.wait_for(timeout=TIMEOUT_MS)
    name.fill(REVIEWER)
    name.press("Enter")
    page.wait_for_function(f"document.cookie.includes('{REVIEWER_COOKIE}={REVIEWER}')", timeout=TIMEOUT_MS)
    wait_until_drawn(page)


def run(out: Path, only: Sequence[str] = (), database: str | None = None) -> list[Path]:
    """Load the demo into a temporary database (or serve `database`, the demo already loaded into
    it), serve it, and write the screenshots into `out`."""
    with tempfile.TemporaryDirectory(prefix="overrule-screenshots-") as tmp:
        url = database or f"sqlite:///{Path(tmp) / 'demo.db'}"
        if database is None:
            engine = init_db(url)
            try:
                load_demo(engine=engine)
            finally:
                engine.dispose()
        wanted = [s for s in shots(showcase_snapshot(url)) if not only or s.name in only]
        if not wanted:
            raise SystemExit(f"no screenshot is named {', '.join(only)}")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_"))}
        env.update({"OVERRULE_DATABASE_URL": url, "OVERRULE_LOAD_DEMO": "false"})
        server = StreamlitServer(env, Path(tmp) / "streamlit.log")
        written: list[Path] = []
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                context = new_app_context(browser, viewport=VIEWPORT)
                page = context.new_page()
                sign_in(page, server.base_url, wanted[0].path)
                written = [take(page, server.base_url, shot, out) for shot in wanted]
                browser.close()
        except Exception:
            print("streamlit log (tail):\n" + server.log_path.read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            server.stop()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"directory for the PNGs (default {OUT})")
    parser.add_argument("--only", nargs="*", default=[], help="names of the shots to take (default: all)")
    parser.add_argument(
        "--database",
        metavar="URL",
        help="photograph this database, the demo already loaded into it (default: a fresh demo load "
        "in a temporary file); the pages may record the reviewer's visits in it",
    )
    args = parser.parse_args(argv)
    run(args.out.resolve(), args.only, args.database)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
