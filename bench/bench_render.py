"""Browser render time of huge answers on the detail page and the review queue (issue #17).

For each answer (1 MB of markup-like text, a 300k-character unbroken word, and a short answer as the
yardstick) builds a SQLite database holding only that evaluation, starts the app, opens
`/evaluations?snapshot=…` and `/review` in headless Chromium, and prints the seconds until the page
is interactive (the element after the answer is visible and the main thread answers), with the ratio
to the short answer. A page still frozen after `--timeout` seconds prints as `>timeout`.

    .venv/bin/python bench/bench_render.py [--timeout 180] [--only word|markup|short]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlmodel import Session  # noqa: E402

from lib.db import init_db  # noqa: E402
from lib.importer import import_evaluations  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, StreamlitServer  # noqa: E402
from tests.long_text import long_record, markup_answer, time_until_interactive, word_answer  # noqa: E402

PAGES = {
    "detail": ("/evaluations?snapshot={id}", ".st-key-evaluations_card_0"),
    "queue": ("/review", ".st-key-review_skip"),
}


def _database(folder: Path, record: dict) -> str:
    url = f"sqlite:///{folder / (record['id'] + '.db')}"
    engine = init_db(url)
    with Session(engine) as session:
        import_evaluations(session=session, records=[record], reviewer="bench")
        session.commit()
    engine.dispose()
    return url


def main() -> None:
    """Print the render times and their ratio to a short answer."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--only", choices=["word", "markup", "short"], action="append")
    args = parser.parse_args()
    answers = {"short": "A short answer.", "markup": markup_answer(), "word": word_answer()}
    chosen = [
        "short",
        *[name for name in answers if name != "short" and (not args.only or name in args.only)],
    ]
    import os

    from playwright.sync_api import sync_playwright

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_"))}
    env["OVERRULE_LOAD_DEMO"] = "false"
    results: dict[tuple[str, str], float | None] = {}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        for name in chosen:
            url = _database(Path(tmp), long_record(f"bench_{name}", answers[name]))
            server = StreamlitServer({**env, "OVERRULE_DATABASE_URL": url}, Path(tmp) / f"{name}.log")
            try:
                for label, (path, ready) in PAGES.items():
                    context = browser.new_context(viewport={"width": 1400, "height": 1000})
                    page = context.new_page()
                    page.set_default_timeout(args.timeout * 1000)
                    try:
                        seconds: float | None = time_until_interactive(
                            page,
                            server.base_url + path.format(id=f"bench_{name}"),
                            ready,
                            timeout_ms=int(args.timeout * 1000),
                        )
                    except Exception as exc:  # a timeout is a result here
                        print(f"  {name}/{label}: {type(exc).__name__}", file=sys.stderr)
                        seconds = None
                    context.close()
                    results[(name, label)] = seconds
                    shown = f">{args.timeout:.0f}" if seconds is None else f"{seconds:.2f}"
                    print(f"{name:7} {label:7} {shown} s", flush=True)
            finally:
                server.stop()
        browser.close()
    print("\nanswer   page     seconds  x short")
    for (name, label), seconds in results.items():
        base = results.get(("short", label))
        ratio = f"{seconds / base:.1f}x" if seconds and base else "—"
        shown = f">{args.timeout:.0f}" if seconds is None else f"{seconds:.2f}"
        print(f"{name:8} {label:7} {shown:>8} {ratio:>8}")


if __name__ == "__main__":
    main()
