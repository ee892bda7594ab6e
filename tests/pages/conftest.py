"""Page-test helpers: a migrated SQLite database that the app's cached engine will use."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from lib import auth
from lib.config import reset_settings
from lib.db import session_scope

ROOT = Path(__file__).resolve().parents[2]
# How long AppTest lets one script run take before it gives up: a bound on a hung page, not a
# measure of speed (a page runs in about a second; a 2-core machine shared with other jobs can be
# many times slower). Every AppTest of these tests uses it.
APPTEST_TIMEOUT = 180.0


@pytest.fixture(scope="session", autouse=True)
def _scan_installed_components_once() -> Iterator[None]:
    """Each new AppTest scans the metadata of every installed package for Streamlit components
    (about 0.5 s, most of a page test); the installed packages cannot change during a run, so the
    first scan's result serves every AppTest."""
    from streamlit.components.v2 import manifest_scanner

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            manifest_scanner, "scan_component_manifests", cache(manifest_scanner.scan_component_manifests)
        )
        yield


@pytest.fixture
def app_engine(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, sqlite_engine: Engine) -> Engine:
    """The database the pages will open (same URL as OVERRULE_DATABASE_URL), already migrated."""
    monkeypatch.setenv("OVERRULE_DATABASE_URL", sqlite_url)
    reset_settings()
    return sqlite_engine


@pytest.fixture
def any_app_engine(monkeypatch: pytest.MonkeyPatch, db_url: str, engine: Engine) -> Engine:
    """The pages on SQLite and on PostgreSQL (the same database the `engine` fixture opened)."""
    monkeypatch.setenv("OVERRULE_DATABASE_URL", db_url)
    reset_settings()
    return engine


@pytest.fixture
def download_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Pages hand out `/downloads/...` links as under serve.py, to a browser carrying the XSRF cookie
    of tests/test_downloads.py (AppTest sends no cookies); the client is that browser."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    import lib.ui
    from lib import downloads
    from tests.test_downloads import XSRF

    monkeypatch.setattr(downloads, "_enabled", True)
    monkeypatch.setattr(lib.ui, "_cookies", lambda: {downloads.XSRF_COOKIE: XSRF})
    with TestClient(Starlette(routes=downloads.routes())) as client:
        client.cookies.set(downloads.XSRF_COOKIE, XSRF)
        yield client


@pytest.fixture
def open_page() -> Callable[..., AppTest]:
    """Run a page file under AppTest, optionally with query parameters and a reviewer name."""

    def _open(
        path: str,
        *,
        query: dict[str, str] | None = None,
        reviewer: str | None = None,
        timeout: float = APPTEST_TIMEOUT,
    ) -> AppTest:
        at = AppTest.from_file(str(ROOT / path), default_timeout=timeout)
        if reviewer:
            at.session_state["sidebar_reviewer"] = reviewer
        for key, value in (query or {}).items():
            at.query_params[key] = value
        return at.run()

    return _open


ISSUER = "https://id.example.com"
_sign_ins = itertools.count(1)


def signed_in(engine: Engine | None, email: str, **claims: Any) -> dict[str, Any]:
    """`at.user` for a browser signed in as `email` (verified) through a fresh sign-in (its own
    `iat` and `nonce`), whose session the sign-in gate has recorded in `engine` (None: not yet,
    as when app.py's gate runs in the test itself)."""
    user = {
        "is_logged_in": True,
        "iss": ISSUER,
        "sub": f"sub-{email}",
        "email": email,
        "email_verified": True,
        "iat": int(time.time()),
        "nonce": f"nonce-{next(_sign_ins)}",
        **claims,
    }
    if engine is not None:
        identity = auth.identity_from_claims(user)
        assert identity is not None
        with session_scope(engine) as session:
            assert auth.check_session(session=session, claims=user, identity=identity).live
    return user
