"""Start `streamlit run app.py` with the router in charge of every URL from the first request.

Streamlit decides once per process whether a `pages/` folder beside the entry script means its old
file-based multipage mode, and keeps that mode until `app.py` has called `st.navigation` once. On a
freshly started server, a shared deep link such as `/review` would therefore run `pages/review.py`
on its own: no router, no sidebar, no reviewer name. Settling the flag before the server starts
makes every URL go through `app.py`. Usage: `python -m lib.ui.server [streamlit run options]`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app.py"


def main(argv: Sequence[str] | None = None) -> None:
    """Run the Overrule app with Streamlit's CLI in this process; options pass through."""
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    PagesManager.uses_pages_directory = False
    sys.argv = ["streamlit", "run", str(APP), *(sys.argv[1:] if argv is None else argv)]
    cli.main()


if __name__ == "__main__":
    main()
