"""Bearer tokens for the pipeline API (issue 13): created and revoked by an admin, stored as hashes.

A token is a name, a role and a random secret. Only the sha256 of the secret is stored, so a stolen
database does not hand out working tokens; the secret is shown once, when the token is created.
A request carrying a live token acts as `Actor(name, role, kind="token")` and goes through the same
`lib.auth` permission table as a signed-in user: there is no second table of what a token may do.
A token may expire (`expires_in`, issue 24.11); its last use is kept to the minute, so an admin
sees which tokens are still in use before revoking one.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

import pandas as pd
from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from lib.auth import ROLES, Actor, Permission, authorize, record_event
from lib.db import session_scope
from lib.models import ApiToken, utcnow

SECRET_PREFIX = "ovr_"  # noqa: S105 - a public marker that says "this is an Overrule token"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+)\s*([mhdwy])\s*$", re.IGNORECASE)
_UNITS = {
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
    "y": timedelta(days=365),
}
MAX_LIFETIME = timedelta(days=10 * 365)
USE_WRITE_SECONDS = 60  # a token's last_used_at is written at most once a minute


class TokenError(ValueError):
    """A token request that cannot be honoured (bad name, unknown role, duplicate, unknown token)."""


def hash_secret(secret: str) -> str:
    """The stored form of a secret: its sha256 in hex (secrets are 256 random bits, so no salt needed)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def parse_lifetime(text: str) -> timedelta:
    """A token lifetime as the CLI takes it: a whole number and a unit, `30m`, `12h`, `90d`, `2w`, `1y`."""
    match = _DURATION.match(text or "")
    if not match:
        raise TokenError(
            f"{text!r} is not a lifetime: write a number and a unit, e.g. 30m, 12h, 90d, 2w or 1y"
        )
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def create_token(
    *,
    session: Session,
    actor: Actor | str | None,
    name: str,
    role: str,
    expires_in: timedelta | None = None,
) -> tuple[ApiToken, str]:
    """Create a token (admin only), valid until revoked or, with `expires_in`, until then; returns
    the row and the secret, which is never stored or shown again."""
    admin = authorize(session, actor, Permission.MANAGE_TOKENS)
    if expires_in is not None and not timedelta(0) < expires_in <= MAX_LIFETIME:
        raise TokenError("a token's lifetime must be more than nothing and at most 10 years")
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
    now = utcnow()
    expires = now + expires_in if expires_in is not None else None
    token = ApiToken(
        name=name,
        role=role,
        secret_hash=hash_secret(secret),
        created_by=admin.identity,
        created_at=now,
        expires_at=expires,
    )
    session.add(token)
    until = f", expires {expires:%Y-%m-%d %H:%M} UTC" if expires else ""
    record_event(
        session=session, identity=admin.identity, action="token_create", detail=f"{name}: {role}{until}"
    )
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
                "state": token_state(t),
                "created_by": t.created_by,
                "created_at": t.created_at,
                "expires_at": t.expires_at,
                "last_used_at": t.last_used_at,
                "revoked_at": t.revoked_at,
            }
            for t in rows
        ],
        columns=[
            "name",
            "role",
            "state",
            "created_by",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ],
    )


def token_state(token: ApiToken, now: datetime | None = None) -> str:
    """ "live", "expired" or "revoked", as a list shows it."""
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= (now or utcnow()):
        return "expired"
    return "live"


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


def find_token(*, session: Session, secret: str) -> ApiToken | None:
    """The token whose secret this is, live or not (None for an unknown secret)."""
    if not secret:
        return None
    return session.exec(select(ApiToken).where(col(ApiToken.secret_hash) == hash_secret(secret))).first()


def refusal(token: ApiToken | None, now: datetime | None = None) -> str | None:
    """Why a request carrying this token is refused (401), or None when the token is live."""
    if token is None:
        return "unknown or revoked API token"
    state = token_state(token, now)
    if state == "revoked":
        return "unknown or revoked API token"
    if state == "expired":
        return f"this API token expired at {token.expires_at:%Y-%m-%d %H:%M} UTC: ask an admin for a new one"
    return None


def actor_for_secret(*, session: Session, secret: str, now: datetime | None = None) -> Actor | None:
    """The actor a bearer secret stands for, or None when it is unknown, revoked or expired."""
    token = find_token(session=session, secret=secret)
    if token is None or refusal(token, now) is not None:
        return None
    return Actor(identity=token.name, role=token.role, kind="token")


# Process-wide on purpose: it only spares the database a write per request (the row holds the
# truth). Keyed by the secret's hash, which no other token (in any database) shares.
_last_written: dict[str, float] = {}
_use_lock = threading.Lock()


def record_use(*, engine: Engine, token: ApiToken, now: datetime | None = None) -> bool:
    """Note that `token` was just used; writes at most once a minute per token (True when it wrote)."""
    clock = time.monotonic()
    with _use_lock:
        if clock - _last_written.get(token.secret_hash, -float(USE_WRITE_SECONDS)) < USE_WRITE_SECONDS:
            return False
        if len(_last_written) > 10_000:  # tokens revoked long ago: forget them
            _last_written.clear()
        _last_written[token.secret_hash] = clock
    with session_scope(engine) as session:
        session.exec(  # type: ignore[call-overload]
            update(ApiToken).where(col(ApiToken.id) == token.id).values(last_used_at=now or utcnow())
        )
    return True
