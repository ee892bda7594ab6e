"""Page-test helpers: a migrated SQLite database that the app's cached engine will use."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from lib.config import reset_settings
from lib.db import init_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def app_engine(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> Iterator[Engine]:
    """The database the pages will open (same URL as OVERRULE_DATABASE_URL), already migrated."""
    monkeypatch.setenv("OVERRULE_DATABASE_URL", sqlite_url)
    reset_settings()
    engine = init_db(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture
def open_page() -> Callable[..., AppTest]:
    """Run a page file under AppTest, optionally with query parameters and a reviewer name."""

    def _open(
        path: str, *, query: dict[str, str] | None = None, reviewer: str | None = None, timeout: float = 30
    ) -> AppTest:
        at = AppTest.from_file(str(ROOT / path), default_timeout=timeout)
        if reviewer:
            at.session_state["sidebar_reviewer"] = reviewer
        for key, value in (query or {}).items():
            at.query_params[key] = value
        return at.run()

    return _open
