"""Admin page and the sign-in gate under AppTest (issue 12): roles managed and audited, the page
closed to other roles, and nothing of the app drawn before sign-in."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select
from streamlit.testing.v1 import AppTest

from lib.config import reset_settings
from lib.models import AuditEvent, EvaluationSnapshot, UserRole
from lib.safe_markdown import escape_markdown
from tests.pages.conftest import APPTEST_TIMEOUT, signed_in

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/admin.py"
AUTH = {
    "redirect_uri": "http://localhost:8501/oauth2callback",
    "cookie_secret": "test-cookie-secret",
    "client_id": "overrule",
    "client_secret": "s",
    "server_metadata_url": "http://127.0.0.1:9/.well-known/openid-configuration",
}


def signin_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "signin")
    monkeypatch.setenv("OVERRULE_ADMINS", "root@example.com")
    reset_settings()


def as_user(path: str, email: str | None, engine: Engine | None = None) -> AppTest:
    """Run `path` signed in as `email`; a page run alone (no app.py gate) needs the session in `engine`."""
    at = AppTest.from_file(str(ROOT / path), default_timeout=APPTEST_TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = signed_in(engine, email) if email else {"is_logged_in": False}
    return at.run()


def as_lead(monkeypatch: pytest.MonkeyPatch, engine: Engine) -> AppTest:
    """The Admin page in sign-in mode, signed in as a lead (webhooks and what OTLP keeps waiting)."""
    signin_mode(monkeypatch)
    with Session(engine) as s:
        s.add(UserRole(identity="lead@example.com", role="lead"))
        s.commit()
    return as_user(PAGE, "lead@example.com", engine)


def test_open_mode_admin_sets_a_role_and_the_change_is_audited(app_engine: Engine, open_page) -> None:
    at = open_page(PAGE, reviewer="ayse")
    assert any("Open mode" in w.value for w in at.warning)
    at.text_input(key="admin_role_identity").set_value("Bob@Example.com")
    at.selectbox(key="admin_role_role").set_value("lead")
    at.button(key="admin_role_set").click().run()
    with Session(app_engine) as s:
        row = s.get(UserRole, "bob@example.com")
        event = s.exec(select(AuditEvent)).one()
    assert row is not None and (row.role, row.updated_by) == ("lead", "ayse")
    assert (event.identity, event.action, event.detail) == (
        "ayse",
        "role_change",
        "bob@example.com: viewer (no row) -> lead",
    )
    assert at.dataframe[-1].value["action"].tolist() == ["role_change"]  # the audit trail, last on the page
    assert at.get("download_button")
    assert not at.exception


def test_the_admin_page_is_closed_to_other_roles(app_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    signin_mode(monkeypatch)
    at = as_user(PAGE, "viewer@example.com", app_engine)
    assert any("Only admins" in i.value and "'viewer'" in i.value for i in at.info)
    assert not at.dataframe
    assert not at.exception


def test_a_configured_admin_manages_roles_in_signin_mode(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    signin_mode(monkeypatch)
    at = as_user(PAGE, "root@example.com", app_engine)
    at.text_input(key="admin_role_identity").set_value("rev@example.com")
    at.selectbox(key="admin_role_role").set_value("reviewer")
    at.button(key="admin_role_set").click().run()
    with Session(app_engine) as s:
        assert s.get(UserRole, "rev@example.com").role == "reviewer"  # type: ignore[union-attr]
    assert not at.exception


def test_signed_out_the_app_draws_only_the_sign_in_screen(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    signin_mode(monkeypatch)
    with Session(app_engine) as s:
        s.add(EvaluationSnapshot(id="snap_x", question="Secret question", model_answer="Secret", product="p"))
        s.commit()
    at = as_user("app.py", None)
    assert at.button(key="auth_sign_in")
    drawn = " ".join(str(e.value) for e in (*at.markdown, *at.title, *at.caption, *at.metric))
    assert "Secret" not in drawn and "snap_x" not in drawn
    assert not at.sidebar.text_input and not at.dataframe
    assert not at.exception


def test_signed_in_the_sidebar_shows_the_identity_and_the_sign_in_is_audited(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    signin_mode(monkeypatch)
    at = as_user("app.py", "Root@Example.com")
    shown = f"Signed in as **{escape_markdown('root@example.com')}** · role `admin`"
    assert any(shown in m.value for m in at.sidebar.markdown)
    assert at.sidebar.button(key="auth_sign_out")
    with Session(app_engine) as s:
        events = s.exec(select(AuditEvent)).all()
    assert [(e.identity, e.action) for e in events if e.action == "sign_in"] == [
        ("root@example.com", "sign_in")
    ]
    assert not at.exception


def test_admin_creates_shows_the_secret_once_and_revokes_a_token(app_engine: Engine, open_page) -> None:
    from lib.models import ApiToken
    from lib.tokens import actor_for_secret, hash_secret

    at = open_page(PAGE, reviewer="ayse")
    at.text_input(key="admin_token_name").set_value("ci")
    at.selectbox(key="admin_token_role").set_value("lead")
    at.button(key="admin_token_create").click().run()
    assert not at.exception
    secret = at.code[0].value
    with Session(app_engine) as s:
        row = s.exec(select(ApiToken)).one()
        assert (row.name, row.role, row.created_by, row.secret_hash) == (
            "ci",
            "lead",
            "ayse",
            hash_secret(secret),
        )
    table = next(d.value for d in at.dataframe if "revoked_at" in d.value.columns)
    assert table["name"].tolist() == ["ci"]
    assert secret not in table.to_string() and row.secret_hash not in table.to_string()
    at.run()
    assert not at.code  # shown once only
    at.selectbox(key="admin_token_revoke").set_value("ci").run()
    at.button(key="admin_token_revoke_button").click().run()
    with Session(app_engine) as s:
        assert actor_for_secret(session=s, secret=secret) is None


def test_a_lead_cannot_manage_tokens(app_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from lib.models import ApiToken

    at = as_lead(monkeypatch, app_engine)
    assert not at.exception
    assert not [w for w in at.text_input if w.key == "admin_token_name"]
    with Session(app_engine) as s:
        assert s.exec(select(ApiToken)).all() == []


def test_an_unverified_email_signs_in_as_the_sub_and_the_audit_names_the_email(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    signin_mode(monkeypatch)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=APPTEST_TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = signed_in(None, "root@example.com", sub="mallory", email_verified=False)
    at.run()
    identity = "sub:https://id.example.com#mallory"
    assert any(f"{escape_markdown(identity)}** · role `viewer`" in m.value for m in at.sidebar.markdown)
    assert any("did not confirm an e-mail address" in c.value for c in at.sidebar.caption)
    with Session(app_engine) as s:
        event = s.exec(select(AuditEvent).where(AuditEvent.action == "sign_in")).one()
    assert event.identity == identity
    assert "e-mail root@example.com not verified by the provider" in event.detail
    assert not at.exception


def test_a_signed_out_or_ended_session_shows_the_sign_in_screen_again(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24.3 under AppTest: "Sign out" ends the session on the server, so the same claims (a
    copied cookie) draw only the sign-in screen, saying why."""
    from lib.models import BrowserSession

    signin_mode(monkeypatch)
    with Session(app_engine) as s:
        s.add(EvaluationSnapshot(id="snap_x", question="Secret question", model_answer="Secret", product="p"))
        s.commit()
    user = signed_in(None, "ann@example.com")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=APPTEST_TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = user
    at.run()
    assert at.sidebar.button(key="auth_sign_out")
    at.sidebar.button(key="auth_sign_out").click().run()
    with Session(app_engine) as s:
        row = s.exec(select(BrowserSession)).one()
    assert (row.identity, row.end_reason, row.ended_by) == ("ann@example.com", "sign_out", "ann@example.com")

    copy = AppTest.from_file(str(ROOT / "app.py"), default_timeout=APPTEST_TIMEOUT)
    copy.secrets["auth"] = AUTH
    copy.user = user
    copy.run()
    assert copy.button(key="auth_sign_in")
    assert any("Your session has ended: you signed out" in i.value for i in copy.info)
    drawn = " ".join(str(e.value) for e in (*copy.markdown, *copy.title, *copy.caption, *copy.metric))
    assert "Secret" not in drawn and not copy.sidebar.button and not copy.dataframe
    assert not copy.exception


def test_an_admin_sees_live_sessions_and_ends_one(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lib import auth
    from lib.models import BrowserSession

    signin_mode(monkeypatch)
    bob = signed_in(app_engine, "bob@example.com")
    at = as_user(PAGE, "root@example.com", app_engine)
    table = next(d.value for d in at.dataframe if "expires_at" in d.value.columns)
    assert sorted(table["identity"]) == ["bob@example.com", "root@example.com"]
    key = auth.session_key(bob)
    at.selectbox(key="admin_session_end").set_value(key).run()
    at.button(key="admin_session_end_button").click().run()
    assert any("1 session(s) of bob@example.com ended" in s.value for s in at.success)
    with Session(app_engine) as s:
        row = s.get(BrowserSession, key)
        assert row is not None and (row.end_reason, row.ended_by) == ("admin", "root@example.com")
        assert s.exec(select(AuditEvent).where(AuditEvent.action == "session_end")).one().identity == (
            "root@example.com"
        )
    table = next(d.value for d in at.dataframe if "expires_at" in d.value.columns)
    assert table["identity"].tolist() == ["root@example.com"]
    # bob's browser: the page itself no longer knows him (no gate needed).
    page = AppTest.from_file(str(ROOT / PAGE), default_timeout=APPTEST_TIMEOUT)
    page.secrets["auth"] = AUTH
    page.user = bob
    page.run()
    assert any("Only admins" in i.value and "Sign in first" in i.value for i in page.info)
    assert not at.exception and not page.exception


def test_admin_creates_a_token_that_expires_and_sees_its_last_use(app_engine: Engine, open_page) -> None:
    from datetime import timedelta

    from lib.models import ApiToken
    from lib.tokens import record_use

    at = open_page(PAGE, reviewer="ayse")
    at.text_input(key="admin_token_name").set_value("nightly")
    at.selectbox(key="admin_token_lifetime").set_value("30 days")
    at.button(key="admin_token_create").click().run()
    assert not at.exception
    with Session(app_engine) as s:
        row = s.exec(select(ApiToken)).one()
    assert row.expires_at is not None and row.expires_at - row.created_at == timedelta(days=30)
    record_use(engine=app_engine, token=row)
    at.run()
    table = next(d.value for d in at.dataframe if "last_used_at" in d.value.columns)
    assert table.loc[0, "state"] == "live"
    assert table.loc[0, "expires_at"] is not None and table.loc[0, "last_used_at"] is not None


def test_a_lead_registers_a_webhook_reads_the_delivery_log_and_replays(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29.3: the Webhooks section is a lead's; the secret shows once; a failed delivery replays;
    the log says the retention in force and the oldest delivered delivery it keeps."""
    from datetime import timedelta

    from lib import webhooks
    from lib.models import Webhook, WebhookDelivery, utcnow

    monkeypatch.setenv("OVERRULE_WEBHOOK_KEY", webhooks.new_key())
    monkeypatch.setenv("OVERRULE_WEBHOOK_LOG_DAYS", "14")
    reset_settings()
    at = as_lead(monkeypatch, app_engine)
    assert not [w for w in at.text_input if w.key == "admin_role_identity"]  # the rest is for admins
    at.text_input(key="admin_webhook_url").set_value("javascript:alert(1)")
    at.button(key="admin_webhook_add").click().run()
    assert [e.value for e in at.error] == [
        escape_markdown("the URL must start with https:// or http://, got 'javascript:alert(1)'")
    ]
    at.text_input(key="admin_webhook_url").set_value("https://ci.example/hooks/overrule")
    at.multiselect(key="admin_webhook_events").set_value(["judgment.overruled", "judgment.undone"])
    at.button(key="admin_webhook_add").click().run()
    [secret] = [c.value for c in at.code]
    with Session(app_engine) as s:
        hook = s.exec(select(Webhook)).one()
        assert (hook.url, hook.events, hook.created_by) == (
            "https://ci.example/hooks/overrule", ["judgment.overruled", "judgment.undone"], "lead@example.com",
        )  # fmt: skip
        assert webhooks.secret_of(hook) == secret
        hook_id = hook.id or 0
        s.add(
            WebhookDelivery(
                webhook_id=hook.id or 0, event="judgment.overruled", event_id="e1", status="failed", attempts=7,
                last_status_code=500, last_error="<b>down</b>",
                payload={"data": {"judgment": {"change_id": "p:x"}}},
            )
        )  # fmt: skip
        s.commit()
    at.run()
    assert not at.code  # shown once
    retention = [c.value for c in at.caption if c.value.startswith("Retention:")]
    assert retention == [
        "Retention: delivered deliveries are kept 14 days (OVERRULE_WEBHOOK_LOG_DAYS), then removed with "
        "their attempts by the server, at most hourly, or by `python -m lib webhooks prune`; failed and "
        "pending deliveries are kept until replayed. No delivered delivery is kept now."
    ]
    log = at.dataframe[-1].value
    assert (log["status"].tolist(), log["last_status_code"].tolist(), log["change_id"].tolist()) == (
        ["failed"], [500], ["p:x"],
    )  # fmt: skip
    at.selectbox(key="admin_webhook_replay_choice").set_value(log["id"].tolist()[0]).run()
    at.button(key="admin_webhook_replay").click().run()
    with Session(app_engine) as s:
        assert s.exec(select(WebhookDelivery.status)).one() == "pending"
    assert any("will be sent again" in m.value for m in at.success)
    delivered = utcnow() - timedelta(days=12)
    with Session(app_engine) as s:
        s.add(WebhookDelivery(webhook_id=hook_id, event="judgment.overruled", event_id="e0",
                              status="delivered", attempts=1, delivered_at=delivered))  # fmt: skip
        s.commit()
    at.run()
    assert any(
        c.value.endswith(
            f"1 delivered delivery kept; the oldest was delivered {delivered:%Y-%m-%d %H:%M} UTC (12 days ago)."
        )
        for c in at.caption
    )
    assert not at.exception


def test_the_delivery_log_says_when_the_worker_delivers_nothing(
    app_engine: Engine, open_page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review9: an httpx or httpcore upgrade that leaves the address check unproven stops deliveries;
    the server log alone is not where a lead looks, so the Delivery log says it (and a dead thread)."""
    from lib import webhooks
    from tests.test_webhooks import rename_connection_event
    from tests.waiting import wait_until

    restore = rename_connection_event(monkeypatch)
    monkeypatch.setattr(webhooks, "_worker", None)
    worker = webhooks.start_worker(app_engine)
    try:
        wait_until(lambda: worker.status.stopped, "the worker to stop delivering")
        restore()  # the worker tries again in a minute; the page's own clients stay untouched
        at = open_page(PAGE, reviewer="ayse")
        [error] = [e.value for e in at.error]
        assert error.startswith(escape_markdown("webhook deliveries stopped: httpx "))
    finally:
        worker.stop()
    at.run()
    assert [e.value for e in at.error] == [
        escape_markdown(
            "The webhook delivery worker is not running; restart the server (the server log says why)."
        )
    ]
    assert not at.exception


def _otlp_rows(engine: Engine, *rows: tuple[str, str | None, dict | None, list, int]) -> None:
    """`otlp_spans` rows as the receiver writes them (no span: SQL NULL), received `hours` ago."""
    from datetime import timedelta

    from lib.models import utcnow
    from lib.otlp_table import SPANS

    with engine.begin() as connection:
        for key, response_id, span, pending, hours in rows:
            connection.execute(
                SPANS.insert().values(
                    key=key, response_id=response_id, snapshot_id=None, span_json=span, pending_json=pending,
                    received_at=utcnow() - timedelta(hours=hours),
                )
            )  # fmt: skip


def _open_waiting(at: AppTest) -> AppTest:
    """Turn on the Admin page's "Show what waits"."""
    at.toggle(key="admin_otlp_open").set_value(True)
    return at.run()


def test_the_otlp_waiting_section_says_when_nothing_waits(app_engine: Engine, open_page) -> None:
    from lib import otlp_waiting

    at = open_page(PAGE, reviewer="ayse")
    for opened in (False, True):
        captions = [c.value for c in at.caption]
        assert "Nothing waits: every span and verdict received has met its other half." in captions
        assert "Nothing forgotten yet (what waits longer than 7 days is)." in captions
        assert not [d for d in at.dataframe if "advice" in d.value.columns]
        # opened, the refusals' empty state says so (closed, the section reads no refusal)
        assert (otlp_waiting.NOTHING_REFUSED in captions) == opened
        assert not at.exception
        if not opened:
            at = _open_waiting(at)


def test_closed_the_waiting_section_reads_no_waiting_row_and_says_that_some_wait(
    app_engine: Engine, open_page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """waits3: the section is closed until an admin opens it, so a click in the roles or tokens
    forms does not pay for reading a week of waiting rows (~0.3 CPU s per 100k); closed, it still
    says whether anything waits. Opened, it reads them."""
    from lib import otlp_waiting

    _otlp_rows(app_engine, ("b" * 32 + ":" + "2" * 16, None, None, [{"metric": "clarity"}], 10))
    reads: list[int | None] = []
    real = otlp_waiting.read
    monkeypatch.setattr(
        otlp_waiting, "read", lambda session, **kw: reads.append(kw.get("limit")) or real(session, **kw)
    )
    at = open_page(PAGE, reviewer="ayse")
    assert not at.exception
    assert reads == []
    assert not at.toggle(key="admin_otlp_open").value
    captions = [c.value for c in at.caption]
    assert "Rows wait: show them for how many, why, and what the sender should change." in captions
    assert "Nothing forgotten yet (what waits longer than 7 days is)." in captions
    assert not [d for d in at.dataframe if "verdicts" in d.value.columns]
    at = _open_waiting(at)
    assert reads == [50]
    [counts] = [d.value for d in at.dataframe if "verdicts" in d.value.columns]
    assert counts["rows"].tolist() == [1]
    assert "Download CSV (all 1 row)" in [b.proto.label for b in at.get("download_button")]  # review14 F7
    at.text_input(key="admin_role_identity").set_value("x@example.com").run()  # another form's rerun
    assert reads == [50, 50]  # open, it stays open (and reads) until closed
    at.toggle(key="admin_otlp_open").set_value(False).run()
    assert reads == [50, 50]


def test_opened_on_many_waiting_verdicts_the_counts_class_the_oldest_and_the_download_all(
    any_app_engine: Engine, open_page, monkeypatch: pytest.MonkeyPatch, download_client
) -> None:
    """waits3: past CLASSED rows of verdicts, the page counts by why among the oldest only and says
    how many more wait; the total and the CSV hold them all. SQLite and PostgreSQL."""
    import csv
    import io

    import lib.ui.otlp_waiting
    from lib import otlp_waiting
    from lib.db import session_scope

    monkeypatch.setattr(lib.ui.otlp_waiting, "CLASSED", 2)
    _otlp_rows(
        any_app_engine,
        ("a" * 32 + ":" + "1" * 16, "chatcmpl-1", {"name": "chat", "product": "p", "missing": []}, [], 40),
        ("response:chatcmpl-404", "chatcmpl-404", None, [{"metric": "m"}], 30),
        ("b" * 32 + ":" + "2" * 16, None, None, [{"metric": "clarity"}, {"metric": "tone"}], 20),
        ("c" * 32 + ":" + "3" * 16, None, None, [{"metric": "new"}], 10),
        ("d" * 32 + ":" + "4" * 16, None, None, [{"metric": "newer"}], 5),
    )
    at = _open_waiting(open_page(PAGE, reviewer="ayse"))
    assert not at.exception
    [counts] = [d.value for d in at.dataframe if "verdicts" in d.value.columns]
    assert dict(zip(counts["why"], counts["rows"], strict=True)) == {
        "calls no verdict has come for": 1,
        "verdicts whose span has not arrived (no call in its trace)": 1,  # the 20-hour row, not 10 or 5
        "verdicts naming a response id no call records": 1,
    }
    assert counts["verdicts"].tolist() == [0, 2, 1]
    [rows] = [d for d in at.dataframe if "advice" in d.value.columns]
    # review18 M5: what to change right after what waits, not off screen at the table's end
    assert list(rows.proto.column_order)[:3] == ["waiting_since", "what", "advice"]
    captions = [c.value for c in at.caption]
    assert any(
        c.startswith("Rows of verdicts are counted by why among the oldest 2 only: 2 newer") for c in captions
    )
    assert "The oldest 5 of 5 rows; the download holds them all." not in captions  # SHOWN is 50
    [link] = [b for b in at.get("link_button") if "rows" in b.proto.label]
    assert link.proto.label == "Download CSV (all 5 rows)"
    listed = list(csv.DictReader(io.StringIO(download_client.get(link.proto.url).text)))
    assert [row["evaluations"] for row in listed] == ["", "m", "clarity, tone", "new", "newer"]
    assert [row["why"] for row in listed][3:] == ["span_not_received"] * 2  # classed in the CSV
    with session_scope(any_app_engine, read_only=True) as session:
        whole = otlp_waiting.read(session)
    assert [c.rows for c in whole.counts] == [1, 3, 1] and whole.unclassed == 0  # the CLI and API class all


def test_a_lead_sees_what_waits_why_and_downloads_the_whole_list(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch, download_client
) -> None:
    """Issue 29: the cases that waited the week in silence, shown to a lead with what to change; the
    oldest rows in the table, every row in the CSV (formulas neutralised); what was forgotten."""
    import csv
    import io

    import lib.ui.otlp_waiting
    from lib import otlp

    monkeypatch.setattr(lib.ui.otlp_waiting, "SHOWN", 2)
    hostile = "**bold** <script>alert(1)</script>"
    span = {"name": hostile, "product": "travel-bot", "missing": []}
    _otlp_rows(
        app_engine,
        ("a" * 32 + ":" + "1" * 16, "chatcmpl-1", span, [], 30),
        ("response:chatcmpl-404", "chatcmpl-404", None, [{"metric": '=HYPERLINK("x")'}], 20),
        ("b" * 32 + ":" + "2" * 16, None, None, [{"metric": "clarity"}, {"metric": "tone"}], 10),
        ("c" * 32 + ":" + "3" * 16, None, None, [{"metric": "old"}], 24 * 8),  # swept below
    )
    with Session(app_engine) as s:
        assert otlp._sweep(s, force=True) == 1
        s.commit()
    at = _open_waiting(as_lead(monkeypatch, app_engine))
    assert not at.exception
    [counts] = [d.value for d in at.dataframe if "verdicts" in d.value.columns]
    assert counts.to_dict("list") == {
        "why": [
            "calls no verdict has come for",
            "verdicts whose span has not arrived (no call in its trace)",
            "verdicts naming a response id no call records",
        ],
        "rows": [1, 1, 1],
        "verdicts": [0, 2, 1],
        "oldest": counts["oldest"].tolist(),
    }
    [rows] = [d.value for d in at.dataframe if "advice" in d.value.columns]
    assert rows["what"].tolist() == ["call", "verdicts"]  # the oldest 2, oldest first
    assert rows["span_name"].tolist() == [hostile, ""]  # a table cell: never Markdown
    assert rows["response_id"].tolist() == ["chatcmpl-1", "chatcmpl-404"]
    assert "which no call received in the last 7 days records" in rows["advice"].tolist()[1]
    captions = [c.value for c in at.caption]
    assert "The oldest 2 of 3 rows; the download holds them all." in captions
    assert any(
        c.startswith("Forgotten after 7 days so far: 0 call(s) no verdict came for and 1 verdict(s)")
        for c in captions
    )
    drawn = [
        e.value for kind in ("markdown", "caption", "info", "warning", "error") for e in getattr(at, kind)
    ]
    assert not any("<script>" in text for text in drawn)
    [link] = [b for b in at.get("link_button") if "otlp" in b.proto.url or "3 rows" in b.proto.label]
    assert link.proto.label == "Download CSV (all 3 rows)"
    response = download_client.get(link.proto.url)
    assert response.status_code == 200
    listed = list(csv.DictReader(io.StringIO(response.text)))
    assert [row["why"] for row in listed] == ["no_verdict", "id_unrecorded", "span_not_received"]
    assert listed[1]["evaluations"] == '\'=HYPERLINK("x")'  # neutralised for spreadsheets
    assert listed[2]["evaluations"] == "clarity, tone" and listed[2]["span_id"] == "2" * 16


def test_a_lead_sees_the_latest_refused_or_warned_requests_as_plain_cells(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch, open_page
) -> None:
    """review18 L6: what an OTLP answer rejected or warned of (the SDK's exporters never read it) is
    shown in the opened section, newest first, the latest REFUSED_SHOWN; a hostile span name in a
    message is a table cell, never Markdown. The audit trail lists them under their action."""
    from lib import otlp_waiting

    monkeypatch.setattr(otlp_waiting, "REFUSED_SHOWN", 2)
    hostile = "**bold** <script>alert(1)</script>"
    with Session(app_engine) as session:
        otlp_waiting.record_refused(
            session, signal="traces", identity="old-app", rejected=3, messages="the oldest: not shown"
        )
        session.commit()
        otlp_waiting.record_refused(
            session, signal="traces", identity="shop-app", rejected=1,
            messages=f"span '{hostile}' (trace a, span b) has evaluations (truthfulness) but no answer",
        )  # fmt: skip
        session.commit()
        otlp_waiting.record_refused(
            session,
            signal="logs",
            identity="judge-app",
            rejected=0,
            messages="'truthfulness' 2 was not taken",
        )
        session.commit()
    admin = open_page(PAGE, reviewer="ayse")  # the audit trail: an admin's, every row kept
    admin.selectbox(key="admin_audit_action").set_value(otlp_waiting.REFUSED_ACTION).run()
    [trail] = [d.value for d in admin.dataframe if "detail" in d.value.columns]
    assert len(trail) == 3
    assert trail["detail"].tolist()[0] == "logs: a warning, 0 rejected: 'truthfulness' 2 was not taken"
    at = as_lead(monkeypatch, app_engine)
    assert not [d for d in at.dataframe if "messages" in d.value.columns]  # closed: not read
    at = _open_waiting(at)
    assert not at.exception
    [refused] = [d.value for d in at.dataframe if "messages" in d.value.columns]
    assert refused["token"].tolist() == ["judge-app", "shop-app"]  # newest first, the latest 2
    assert refused["signal"].tolist() == ["logs", "traces"]
    assert refused["rejected"].tolist() == [0, 1] and refused["warning"].tolist() == [True, False]
    assert refused["messages"].tolist()[1].startswith(f"span '{hostile}'")  # a table cell: never Markdown
    assert "**Refused or warned of lately**" in [m.value for m in at.markdown]
    assert otlp_waiting.NOTHING_REFUSED not in [c.value for c in at.caption]
    drawn = [
        e.value for kind in ("markdown", "caption", "info", "warning", "error") for e in getattr(at, kind)
    ]
    assert not any("<script>" in text for text in drawn)


def test_the_waiting_section_and_the_api_answer_to_one_permission(
    app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review11 F7: the page's section and GET /api/v1/otlp/waiting check one rule of lib.auth
    (SEE_OTLP_WAITING); raised to admin, a lead sees the webhooks but not the section."""
    from lib import auth

    monkeypatch.setitem(auth.PERMISSIONS, auth.Permission.SEE_OTLP_WAITING, "admin")
    at = as_lead(monkeypatch, app_engine)
    assert not at.exception
    assert "OpenTelemetry: waiting" not in [h.value for h in at.subheader]
    assert "Webhooks" in [h.value for h in at.subheader]
    monkeypatch.setitem(auth.PERMISSIONS, auth.Permission.SEE_OTLP_WAITING, "lead")
    monkeypatch.setitem(auth.PERMISSIONS, auth.Permission.MANAGE_WEBHOOKS, "admin")
    at = as_user(PAGE, "lead@example.com", app_engine)
    assert "OpenTelemetry: waiting" in [h.value for h in at.subheader]
    assert "Webhooks" not in [h.value for h in at.subheader]
