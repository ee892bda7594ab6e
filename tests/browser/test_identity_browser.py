"""Identity in a real browser (issue 12): open mode keeps the typed name across reloads, deep links
and new tabs; sign-in mode with a real OpenID Connect provider shows nothing before sign-in and
enforces roles.

The sign-in tests share one server and database (`signin`): each signs in with accounts no other
test uses, and counts only what it wrote itself, so none depends on another or on their order.
Within a test, pages are opened by their sidebar links (`open_in_app`) unless the test is about
a fresh load."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from playwright.sync_api import expect
from sqlmodel import func, select

from lib.db import init_db, session_scope
from lib.models import AuditEvent, EvaluationSnapshot, Judgment, UserRole
from tests.browser.conftest import new_app_context, open_in_app, settle

pytestmark = pytest.mark.browser
# The ✓ (confirm the judge) button of every metric row in the review queue.
CONFIRM = "[class*='st-key-review_row_'][class*='_confirm'] button"

NAME_LABEL = "Your name (recorded with every change)"


def seed(url: str, metrics: tuple[str, ...] = ("clarity",)) -> int:
    """One evaluation with a judgment per metric to confirm; returns the first judgment's id."""
    engine = init_db(url)
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id="snap_who",
                question="Which river flows through Vienna?",
                model_answer="The Danube flows through Vienna.",
                product="acme",
                user_scores_json={"clarity": {"score": 4}},
            )
        )
        s.flush()
        ids = []
        for metric in metrics:
            judgment = Judgment(
                change_id=f"snap_who:{metric}",
                product="acme",
                metric=metric,
                snapshot_id="snap_who",
                decision="4",
            )
            s.add(judgment)
            s.flush()
            assert judgment.id is not None
            ids.append(judgment.id)
        judgment_id = ids[0]
    engine.dispose()
    return judgment_id


def stored_review(url: str, judgment_id: int) -> tuple[str | None, str | None]:
    engine = init_db(url)
    with session_scope(engine, read_only=True) as s:
        j = s.get(Judgment, judgment_id)
        assert j is not None
        result = (j.user_decision, j.reviewer)
    engine.dispose()
    return result


def test_open_mode_name_survives_reload_deep_link_and_new_tab(streamlit_app, page, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'open.db'}"
    judgment_id = seed(url)
    server = streamlit_app(url)
    try:
        page.goto(server.base_url)
        settle(page)
        expect(
            page.get_by_text("Open mode: anyone who can reach this server can act as anyone")
        ).to_be_visible()
        name = page.get_by_label(NAME_LABEL)
        name.fill("ayse")
        name.press("Enter")
        settle(page)
        expect(page.get_by_text("Enter your name to review")).to_have_count(0)
        # The cookie is written by the page's script after the run: wait for it, not for a time.
        page.wait_for_function("document.cookie.includes('overrule_reviewer=ayse')")

        page.reload()
        settle(page)
        expect(page.get_by_label(NAME_LABEL)).to_have_value("ayse")

        tab = page.context.new_page()
        tab.goto(f"{server.base_url}/review")
        settle(tab)
        expect(tab.get_by_text("Evaluation snap_who").first).to_be_visible()
        expect(tab.get_by_label(NAME_LABEL)).to_have_value("ayse")
        tab.locator(CONFIRM).first.click()
        settle(tab)
        expect(tab.get_by_text("Nothing left to review with these filters")).to_be_visible()
    except Exception:
        for i, p in enumerate(page.context.pages):
            p.screenshot(path=str(tmp_path / f"open_mode_failure_{i}.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise
    assert stored_review(url, judgment_id) == ("4", "ayse")


# --------------------------------------------------------------------------------------------
# Sign-in mode with a real OpenID Connect provider (oidc-provider-mock on 127.0.0.1)

SECRET_TEXT = "Danube"  # in the evaluation: must never reach a browser that has not signed in


@pytest.fixture(scope="module")
def oidc_provider():
    """One provider for the module: each test first gives the accounts it signs in with the claims
    it needs (`provider_user`), and signs in from browser contexts of its own."""
    from oidc_provider_mock import run_server_in_thread

    with run_server_in_thread(port=0) as server:
        yield f"http://127.0.0.1:{server.server_port}"


def signin_server(streamlit_app, tmp_path, provider: str, url: str):
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(
        "[auth]\n"
        'redirect_uri = "http://127.0.0.1:{port}/oauth2callback"\n'
        'cookie_secret = "a-test-cookie-secret-of-enough-length-0123456789"\n'
        'client_id = "overrule"\n'
        'client_secret = "overrule-secret"\n'
        f'server_metadata_url = "{provider}/.well-known/openid-configuration"\n'
    )
    return streamlit_app(
        url,
        args=["--secrets.files", str(secrets)],
        OVERRULE_AUTH_MODE="signin",
        OVERRULE_ADMINS="root@example.com",
    )


def provider_user(provider: str, sub: str, **claims: object) -> None:
    """Give the provider's account `sub` these claims (its default is an unverified `email: sub`)."""
    request = urllib.request.Request(  # noqa: S310 - the local provider's http URL
        f"{provider}/users/{sub}",
        data=json.dumps(claims).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        assert response.status == 204


def sign_in(
    page, base_url: str, identity: str, *, shown: str | None = None, provider: str | None = None
) -> None:
    """Through the provider's own form, as the account `identity` (its `sub`). With `provider`, the
    account's e-mail is first set to `identity`, verified; the sidebar must then show `shown`."""
    if provider is not None:
        provider_user(provider, identity, email=identity, email_verified=True)
    page.goto(base_url)
    settle(page)
    page.get_by_role("button", name=re.compile("Sign in")).click()
    page.locator("input[name=sub]").fill(identity)  # the provider's own page
    page.get_by_role("button", name="Authorize").click()
    page.wait_for_url(f"{base_url}/**")  # back from the provider
    settle(page)
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    assert f"Signed in as {shown or identity}" in page_text(page)


def page_text(page) -> str:
    """The page's text (folded expanders too) without escape_markdown's invisible word joiners."""
    return page.evaluate("() => document.body.textContent.replaceAll('\\u2060', '')")


@pytest.fixture(scope="module")
def signin(module_app, tmp_path_factory, oidc_provider):
    """The module's sign-in server over one evaluation with two judgments to confirm, and its
    database URL. A server start costs ~3.5 CPU s; what the tests keep apart instead: each test's
    accounts are its own (a session, a role, a sign-in is never another test's), and what a test
    counts in the audit trail or the sessions table is what its own accounts did."""
    folder = tmp_path_factory.mktemp("signin")
    url = f"sqlite:///{folder / 'signin.db'}"
    seed(url, metrics=("clarity", "accuracy"))
    return signin_server(module_app, folder, oidc_provider, url), url


def test_signed_out_browser_sees_the_sign_in_screen_only(signin, page) -> None:
    server, _ = signin
    for path in ("", "/evaluations?snapshot=snap_who", "/review", "/corrections", "/admin"):
        page.goto(f"{server.base_url}{path}")
        settle(page)  # every run the page makes has drawn whatever it would draw
        expect(page.get_by_role("button", name=re.compile("Sign in"))).to_be_visible()
        body = page.locator("body").inner_text()
        assert SECRET_TEXT not in body and "snap_who" not in body, path
        assert "Download" not in body and "reviewed" not in body, path
        assert page.get_by_test_id("stSidebarNav").count() == 0, path


def test_two_users_sign_in_and_roles_are_enforced(signin, browser, tmp_path, oidc_provider) -> None:
    server, url = signin
    engine = init_db(url)
    with session_scope(engine) as s:
        s.add(UserRole(identity="bob@example.com", role="reviewer", updated_by="test"))
        first, second = s.exec(select(Judgment.id).order_by(Judgment.id)).all()
    # Each closed at the end: a page left open retries its server's connection for the rest of the run.
    contexts = [new_app_context(browser, viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    viewer, reviewer = (context.new_page() for context in contexts)
    try:
        # A viewer (no role row: OVERRULE_DEFAULT_ROLE) reads, and is told why it cannot confirm.
        sign_in(viewer, server.base_url, "alice@example.com", provider=oidc_provider)
        expect(viewer.get_by_text("role viewer").first).to_be_visible()
        open_in_app(viewer, "review")
        expect(viewer.get_by_text("Evaluation snap_who").first).to_be_visible()
        expect(viewer.get_by_text("which cannot confirm or overrule judgments").first).to_be_visible()
        buttons = viewer.locator(CONFIRM)
        assert buttons.count() >= 1 and all(b.is_disabled() for b in buttons.all())

        # A reviewer confirms one judgment: the row records the provider's identity.
        sign_in(reviewer, server.base_url, "bob@example.com", provider=oidc_provider)
        expect(reviewer.get_by_text("role reviewer").first).to_be_visible()
        open_in_app(reviewer, "review")
        expect(reviewer.get_by_text("0 of 2 reviewed").first).to_be_visible()
        reviewer.locator(CONFIRM).first.click()
        settle(reviewer)
        expect(reviewer.get_by_text("1 of 2 reviewed").first).to_be_visible()
        assert stored_review(url, first) == ("4", "bob@example.com")

        # An admin demotes bob while his page is open: lib refuses the next write, says so, audits it.
        with session_scope(engine) as s:
            s.get(UserRole, "bob@example.com").role = "viewer"  # type: ignore[union-attr]
        reviewer.locator(CONFIRM).first.click()
        settle(reviewer)
        expect(reviewer.get_by_text("Not allowed, nothing was changed").first).to_be_visible()
        assert stored_review(url, second) == (None, None)

        # The row bob wrote shows his identity on the evaluation's page.
        reviewer.goto(f"{server.base_url}/evaluations?snapshot=snap_who")
        settle(reviewer)
        assert "confirmed by bob@example.com" in page_text(reviewer)
    except Exception:
        for name, p in (("viewer", viewer), ("reviewer", reviewer)):
            p.screenshot(path=str(tmp_path / f"signin_{name}.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise
    finally:
        for context in contexts:
            context.close()  # the context lent (given back to the pool), not page.context
    with session_scope(engine, read_only=True) as s:
        events = {(e.identity, e.action) for e in s.exec(select(AuditEvent)).all()}
    engine.dispose()
    assert {
        ("alice@example.com", "sign_in"),
        ("bob@example.com", "sign_in"),
        ("bob@example.com", "denied"),
    } <= events


def test_an_unverified_email_never_becomes_the_identity(signin, browser, tmp_path, oidc_provider) -> None:
    """Issue 24.1: a provider account may carry any e-mail; unverified, it is not who the user is.

    mallory's account says `email: ROOT@example.com, email_verified: false` (OVERRULE_ADMINS names
    root@example.com): she is her issuer-qualified `sub`, with the default role, and the Admin page
    stays closed. root's own account, verified and in another case, is the admin. Only the
    sign-ins after the test began count: others' may come before."""
    server, url = signin
    engine = init_db(url)
    with session_scope(engine, read_only=True) as s:  # the sign-ins before this test are others'
        before = s.exec(select(func.max(AuditEvent.id))).one() or 0
    provider_user(oidc_provider, "mallory", email="ROOT@example.com", email_verified=False)
    provider_user(oidc_provider, "root", email="Root@Example.COM", email_verified=True)
    contexts = [new_app_context(browser, viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    mallory, root = (context.new_page() for context in contexts)
    try:
        sign_in(mallory, server.base_url, "mallory", shown=f"sub:{oidc_provider}#mallory")
        expect(mallory.get_by_text("role viewer").first).to_be_visible()
        open_in_app(mallory, "admin")
        expect(mallory.get_by_text("Only admins can see this page")).to_be_visible()
        assert mallory.get_by_text("Set role").count() == 0

        sign_in(root, server.base_url, "root", shown="root@example.com")
        expect(root.get_by_text("role admin").first).to_be_visible()
        open_in_app(root, "admin")
        expect(root.get_by_role("button", name="Set role")).to_be_visible()
    except Exception:
        for name, p in (("mallory", mallory), ("root", root)):
            p.screenshot(path=str(tmp_path / f"unverified_{name}.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise
    finally:
        for context in contexts:
            context.close()
    with session_scope(engine, read_only=True) as s:
        signed_in = {
            e.identity
            for e in s.exec(select(AuditEvent).where(AuditEvent.action == "sign_in", AuditEvent.id > before))
        }
    engine.dispose()
    assert signed_in == {f"sub:{oidc_provider}#mallory", "root@example.com"}


def test_sessions_and_their_download_links_end_on_sign_out_by_an_admin_and_at_the_maximum_age(
    signin, browser, tmp_path, oidc_provider
) -> None:
    """Issue 24.3 with the real provider: after "Sign out" a copy of the cookies is not signed in
    (reloaded, or on its already open page's next click); an admin ends another user's session from
    the Admin page; a session older than OVERRULE_SESSION_HOURS (12) is over. Issue 24.8: a download
    link streams only to the session that made it, and not after that session has ended.

    carol and dave sign in nowhere else in this module: their sessions and their ends are this
    test's. root, the admin, may have signed in before (another test): every session of root's is
    made 12 hours old."""
    from datetime import timedelta

    from lib.models import BrowserSession

    server, url = signin
    base = server.base_url
    engine = init_db(url)
    with session_scope(engine, read_only=True) as s:
        before = s.exec(select(func.max(AuditEvent.id))).one() or 0
    contexts = {
        name: new_app_context(browser, viewport={"width": 1400, "height": 1000})
        for name in ("c", "t", "r", "d")
    }
    carol, thief, root, dave = (contexts[n].new_page() for n in ("c", "t", "r", "d"))
    try:
        sign_in(carol, base, "carol@example.com", provider=oidc_provider)
        contexts["t"].add_cookies(contexts["c"].cookies())  # what a stolen cookie jar holds
        thief.goto(base)
        settle(thief)
        assert "Signed in as carol@example.com" in page_text(thief)  # the copy works while carol is signed in

        open_in_app(carol, "evaluations")
        link = carol.get_by_role("link", name=re.compile("Download CSV"))
        link.wait_for(timeout=60_000)
        download = f"{base}{link.get_attribute('href')}"
        assert download.startswith(f"{base}/downloads/")
        assert carol.request.get(download).status == 200  # carol's own session
        anonymous = browser.new_context()
        try:
            refused = anonymous.request.get(download)
            assert refused.status == 403 and "snap_who" not in refused.text()
        finally:
            anonymous.close()

        carol.get_by_role("button", name="Sign out").click()
        carol.get_by_role("button", name="End session").click()  # the provider's own sign-out page
        carol.wait_for_url(f"{base}/**")  # back from the provider
        settle(carol)
        expect(carol.get_by_role("button", name=re.compile("Sign in"))).to_be_visible()

        thief.get_by_test_id("stSidebarNav").get_by_text("Evaluations").click()  # its open page
        settle(thief)
        assert "Your session has ended: you signed out" in page_text(thief)
        thief.goto(f"{base}/evaluations")  # and a fresh load
        settle(thief)
        assert "Your session has ended: you signed out" in page_text(thief)
        for after in (carol, thief):  # the link is dead for the signed-out browser and for the copy
            response = after.request.get(download)
            assert response.status == 403 and "snap_who" not in response.text()
        assert "snap_who" not in thief.locator("body").inner_text()
        assert thief.get_by_test_id("stSidebarNav").count() == 0

        provider_user(oidc_provider, "root", email="root@example.com", email_verified=True)
        sign_in(root, base, "root", shown="root@example.com")
        sign_in(dave, base, "dave@example.com", provider=oidc_provider)
        assert dave.request.get(download).status == 403  # another signed-in user
        open_in_app(root, "admin")
        expect(root.get_by_text("End a session")).to_be_visible()
        root.locator(".st-key-admin_session_end").click()
        # Typed to filter: the list shows the module's other live sessions too, and only a few at once.
        root.keyboard.type("dave@example.com")
        root.get_by_role("option", name=re.compile("dave@example.com")).click()
        settle(root)
        root.get_by_role("button", name="End session", exact=True).click()
        settle(root)
        assert "1 session(s) of dave@example.com ended." in page_text(root)
        dave.get_by_test_id("stSidebarNav").get_by_text("Review queue").click()
        settle(dave)
        assert "Your session has ended: an admin ended it" in page_text(dave)

        with session_scope(engine) as s:
            for row in s.exec(select(BrowserSession).where(BrowserSession.identity == "root@example.com")):
                row.started_at -= timedelta(hours=12)  # as if root signed in 12 hours ago
        root.reload()
        settle(root)
        assert "Your session has ended: it reached the maximum age of 12 hours" in page_text(root)
    except Exception:
        for name, p in (("carol", carol), ("thief", thief), ("root", root), ("dave", dave)):
            p.screenshot(path=str(tmp_path / f"sessions_{name}.png"), full_page=True)
        print("streamlit log:", server.log_path.read_text()[-3000:])
        raise
    finally:
        for context in contexts.values():
            context.close()
    with session_scope(engine, read_only=True) as s:
        ends = sorted(
            (e.identity, e.detail.split(": ")[0])
            for e in s.exec(
                select(AuditEvent).where(AuditEvent.action == "session_end", AuditEvent.id > before)
            )
        )
    engine.dispose()
    assert ends == [("carol@example.com", "carol@example.com"), ("root@example.com", "dave@example.com")]
