"""Bearer tokens for the pipeline API (issue 13): created and revoked by an admin, stored as hashes.

A token is a name, a role and a random secret. Only the sha256 of the secret is stored, so a stolen
database does not hand out working tokens; the secret is shown once, when the token is created.
A request carrying a live token acts as `Actor(name, role, kind="token")` and goes through the same
`lib.auth` permission table as a signed-in user: there is no second table of what a token may do.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence

import pandas as pd
from sqlmodel import Session, col, select

from lib.auth import ROLES, Actor, Permission, authorize, record_event
from lib.models import ApiToken, utcnow

SECRET_PREFIX = "ovr_"  # noqa: S105 - a public marker that says "this is an Overrule token"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class TokenError(ValueError):
    """A token request that cannot be honoured (bad name, unknown role, duplicate, unknown token)."""


def hash_secret(secret: str) -> str:
    """The stored form of a secret: its sha256 in hex (secrets are 256 random bits, so no salt needed)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def create_token(
    *, session: Session, actor: Actor | str | None, name: str, role: str
) -> tuple[ApiToken, str]:
    """Create a token (admin only); returns the row and the secret, which is never stored or shown again."""
    admin = authorize(session, actor, Permission.MANAGE_TOKENS)
    name = (name or "").strip()
    if not _NAME.match(name):
        raise TokenError(
            "a token name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    if role not in ROLES:
        raise TokenError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    if session.exec(select(ApiToken.id).where(col(ApiToken.name) == name)).first() is not None:
        raise TokenError(f"a token named {name!r} already exists (revoke it or choose another name)")
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(name=name, role=role, secret_hash=hash_secret(secret), created_by=admin.identity)
    session.add(token)
    record_event(session=session, identity=admin.identity, action="token_create", detail=f"{name}: {role}")
    session.flush()
    return token, secret


def list_tokens(*, session: Session) -> list[ApiToken]:
    """Every token, live and revoked, by name (the hashes stay in the database)."""
    return list(session.exec(select(ApiToken).order_by(col(ApiToken.name))).all())


def tokens_frame(rows: Sequence[ApiToken]) -> pd.DataFrame:
    """Tokens as the admin page lists them: never the secret, never its hash."""
    return pd.DataFrame(
        [
            {
                "name": t.name,
                "role": t.role,
                "created_by": t.created_by,
                "created_at": t.created_at,
                "revoked_at": t.revoked_at,
            }
            for t in rows
        ],
        columns=["name", "role", "created_by", "created_at", "revoked_at"],
    )


def revoke_token(*, session: Session, actor: Actor | str | None, name: str) -> ApiToken:
    """Revoke a token by name (admin only); it stops working at once. Revoking twice is harmless."""
    admin = authorize(session, actor, Permission.MANAGE_TOKENS)
    token = session.exec(select(ApiToken).where(col(ApiToken.name) == name)).first()
    if token is None:
        raise TokenError(f"no token named {name!r}")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        session.add(token)
        record_event(session=session, identity=admin.identity, action="token_revoke", detail=name)
        session.flush()
    return token


def actor_for_secret(*, session: Session, secret: str) -> Actor | None:
    """The actor a bearer secret stands for, or None when it is unknown or revoked."""
    if not secret:
        return None
    token = session.exec(select(ApiToken).where(col(ApiToken.secret_hash) == hash_secret(secret))).first()
    if token is None or token.revoked_at is not None:
        return None
    return Actor(identity=token.name, role=token.role, kind="token")
