"""API tokens: `python -m lib token create|list|revoke`, hashes only, admin only, on both backends."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from lib.__main__ import main as cli_main
from lib.auth import Actor, PermissionDenied
from lib.config import reset_settings
from lib.models import ApiToken
from lib.tokens import TokenError, actor_for_secret, create_token, hash_secret


@pytest.fixture
def cli_db(engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("OVERRULE_DATABASE_URL", db_url)
    reset_settings()
    return engine


def test_cli_create_prints_the_secret_once_list_hides_it_revoke_stops_it(
    cli_db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["token", "create", "--name", "ci", "--role", "lead"]) == 0
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    assert secret.startswith("ovr_")
    with Session(cli_db) as session:
        row = session.exec(select(ApiToken)).one()
        assert row.secret_hash == hash_secret(secret)
        assert row.created_by == "overrule-cli"
        assert actor_for_secret(session=session, secret=secret) == Actor("ci", "lead", "token")
    assert cli_main(["token", "list"]) == 0
    listed = capsys.readouterr().out
    assert "ci\tlead\tlive" in listed
    assert secret not in listed and row.secret_hash not in listed
    assert cli_main(["token", "create", "--name", "ci", "--role", "viewer"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["token", "revoke", "--name", "ci"]) == 0
    with Session(cli_db) as session:
        assert actor_for_secret(session=session, secret=secret) is None
    assert cli_main(["token", "revoke", "--name", "nobody"]) == 1
    assert "no token named" in capsys.readouterr().err


def test_only_an_admin_creates_tokens_and_names_and_roles_are_checked(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(PermissionDenied):
            create_token(session=session, actor=Actor("rev", "lead", "token"), name="x", role="admin")
        admin = Actor("root", "admin", "user")
        with pytest.raises(TokenError):
            create_token(session=session, actor=admin, name="bad name!", role="lead")
        with pytest.raises(TokenError):
            create_token(session=session, actor=admin, name="ok", role="superuser")
        session.rollback()
        assert session.exec(select(ApiToken)).all() == []


def test_a_token_can_expire_and_the_list_says_so(cli_db: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24.11: `token create --expires-in`, and `token list` shows expiry and last use."""
    from datetime import timedelta

    from lib.models import utcnow
    from lib.tokens import refusal, token_state

    assert cli_main(["token", "create", "--name", "ci", "--role", "lead", "--expires-in", "90d"]) == 0
    out = capsys.readouterr().out
    secret = out.strip().splitlines()[-1]
    assert "expires" in out.splitlines()[0]
    with Session(cli_db) as session:
        row = session.exec(select(ApiToken)).one()
        assert row.expires_at is not None
        assert timedelta(days=89, hours=23) < row.expires_at - row.created_at <= timedelta(days=90)
        assert actor_for_secret(session=session, secret=secret) == Actor("ci", "lead", "token")
        later = row.expires_at + timedelta(seconds=1)
        assert actor_for_secret(session=session, secret=secret, now=later) is None
        assert token_state(row, later) == "expired" and "expired at" in (refusal(row, later) or "")
    assert cli_main(["token", "list"]) == 0
    listed = capsys.readouterr().out
    assert "ci\tlead\tlive (expires " in listed and "never used" in listed
    assert cli_main(["token", "create", "--name", "x", "--role", "lead", "--expires-in", "soon"]) == 1
    assert "not a lifetime" in capsys.readouterr().err
    with Session(cli_db) as session:
        assert session.exec(select(ApiToken).where(ApiToken.name == "x")).first() is None
        assert utcnow() < row.expires_at


@pytest.mark.parametrize(
    ("text", "hours"), [("30m", 0.5), ("12h", 12), ("90d", 2160), ("2w", 336), ("1y", 8760), (" 3 D ", 72)]
)
def test_lifetimes_are_a_number_and_a_unit(text: str, hours: float) -> None:
    from datetime import timedelta

    from lib.tokens import parse_lifetime

    assert parse_lifetime(text) == timedelta(hours=hours)


@pytest.mark.parametrize("text", ["", "90", "d", "-1d", "1.5h", "1 month"])
def test_a_lifetime_without_a_unit_or_number_is_refused(text: str) -> None:
    from lib.tokens import parse_lifetime

    with pytest.raises(TokenError, match="not a lifetime"):
        parse_lifetime(text)


def test_last_use_is_written_at_most_once_a_minute(engine: Engine) -> None:
    from lib.tokens import record_use

    with Session(engine, expire_on_commit=False) as session:
        token, _ = create_token(session=session, actor=Actor("root", "admin"), name="ci", role="lead")
        session.commit()
    assert record_use(engine=engine, token=token)
    assert not record_use(engine=engine, token=token)  # seconds later: not written again
    with Session(engine) as session:
        assert session.get(ApiToken, token.id).last_used_at is not None  # type: ignore[union-attr]
