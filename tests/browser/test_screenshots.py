"""`scripts/screenshots`, the README's screenshots: one command writes small 1400×900 PNGs.

Two of the shots only (the whole set takes a minute or two on the CI machine); which pages they
show is the README's business, that the command works end to end is this test's. The two are the
cheapest that still cover each way a shot is taken: a plain page (the review queue) and a tab
opened first with a chart to wait for (the notes timeline). Analytics and the timeline (with the
name entered on the Overview) took the command 25.3 CPU s; these two take 18.7. The command
photographs a copy of the run's one demo load (`sqlite_demo`, `--database`) instead of loading the
demo itself (about 5 CPU s).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from tests.browser.conftest import CHROMIUM, ROOT
from tests.conftest import DemoTemplate

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = ("review-queue", "notes-timeline")


def test_the_screenshots_command_writes_small_pngs_of_the_pages(
    tmp_path: Path, sqlite_demo: DemoTemplate
) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERRULE_")}
    database = sqlite_demo.copy_to(tmp_path / "demo.db")
    shots = tmp_path / "shots"
    command = [str(ROOT / "scripts" / "screenshots"), "--out", str(shots), "--only", *SHOTS]
    result = subprocess.run(
        [*command, "--database", database],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in shots.iterdir()) == sorted(f"{name}.png" for name in SHOTS)
    for name in SHOTS:
        path = shots / f"{name}.png"
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (1400, 900)
            # A page, not a blank: many colours used, and small enough to commit.
            assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 20
        assert 10_000 < path.stat().st_size < 400_000
