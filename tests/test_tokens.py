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
