"""Who may do what: actors, roles, the permission table, and the audit of access.

Every write path in `lib` calls `authorize` (or `require`) first, so a role is enforced whether the
write comes from a page, the CLI, an importer or (later) an API token; pages only disable buttons
the same table says the role lacks. An `Actor` is whoever acts: a signed-in user, the name typed in
open mode, the CLI/demo system actor, a judge run's agent, or an API token carrying a role.

The one rule: an action needs a permission, a permission needs a minimum role, roles are ordered
viewer < reviewer < lead < admin. `PERMISSIONS` below is the only copy of that table.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Engine, delete
from sqlmodel import Session, col, select

from lib.bulk import dialect_insert
from lib.config import get_settings
from lib.db import session_scope
from lib.models import AuditEvent, BrowserSession, UserRole, utcnow

if TYPE_CHECKING:
    import pandas as pd  # imported where a frame is made: `python -m lib` starts without it

ROLES: tuple[str, ...] = ("viewer", "reviewer", "lead", "admin")
ActorKind = Literal["user", "open", "system", "agent", "token"]
MAX_IDENTITY_CHARS = 320  # an e-mail address can be this long
# A signed-in user whose e-mail the provider has not verified is "sub:<issuer>#<sub>": no e-mail
# address starts with "sub:" (a ':' needs quoting in one), so it never matches a configured e-mail.
SUB_PREFIX = "sub:"
MAX_DETAIL_CHARS = 2000


class Permission(StrEnum):
    """An action the permission table knows; the value is what the audit trail records."""

    READ = "read"
    EXPORT = "export"
    EXPORT_ACCESS = "export_access"  # the access records: who holds which role, the audit trail
    REVIEW = "review"  # confirm or overrule a judgment; label items of a team review queue
    NOTE = "note"  # add, pin or unpin a note
    FEEDBACK = "feedback"  # expert feedback: "this note was (not) useful here"
    COACH = "coach"
    ARCHIVE = "archive"  # archive or restore an evaluation
    MANAGE_QUEUES = "manage_queues"  # create, assign and close team review queues
    ADJUDICATE = "adjudicate"  # decide a queue judgment whose reviewers disagreed
    IMPORT = "import"
    SECOND_OPINION = "second_opinion"
    JUDGE = "judge"  # judge runs, and the notes a run removes from its own session
    REMOVE_SESSION_NOTES = "remove_session_notes"
    CLEAR_CACHE = "clear_cache"
    REMOVE_NOTES = "remove_notes"  # in bulk, across sessions
    MANAGE_ROLES = "manage_roles"
    MANAGE_TOKENS = "manage_tokens"
    MANAGE_WEBHOOKS = "manage_webhooks"  # register webhooks, read their delivery log, replay
    SEE_OTLP_WAITING = "see_otlp_waiting"  # what the OTLP receiver keeps waiting (Admin page, API)


# The permission table: the least role that may do each thing (higher roles inherit it).
PERMISSIONS: dict[Permission, str] = {
    Permission.READ: "viewer",
    Permission.EXPORT: "viewer",
    Permission.EXPORT_ACCESS: "admin",
    Permission.REVIEW: "reviewer",
    Permission.NOTE: "reviewer",
    Permission.FEEDBACK: "reviewer",
    Permission.COACH: "reviewer",
    Permission.ARCHIVE: "lead",
    Permission.MANAGE_QUEUES: "lead",
    Permission.ADJUDICATE: "lead",
    Permission.IMPORT: "lead",
    Permission.SECOND_OPINION: "lead",
    Permission.JUDGE: "lead",
    Permission.REMOVE_SESSION_NOTES: "lead",
    Permission.CLEAR_CACHE: "admin",
    Permission.REMOVE_NOTES: "admin",
    Permission.MANAGE_ROLES: "admin",
    Permission.MANAGE_TOKENS: "admin",
    Permission.MANAGE_WEBHOOKS: "lead",
    Permission.SEE_OTLP_WAITING: "lead",  # leads own the pipelines (OTLP takes a lead's token)
}

# What the page says an action is, for "your role cannot …" messages.
DESCRIPTIONS: dict[Permission, str] = {
    Permission.READ: "read evaluations",
    Permission.EXPORT: "export data",
    Permission.EXPORT_ACCESS: "export roles and the access audit trail",
    Permission.REVIEW: "confirm or overrule judgments",
    Permission.NOTE: "add or pin notes",
    Permission.FEEDBACK: "give feedback on notes",
    Permission.COACH: "chat with the coach",
    Permission.ARCHIVE: "archive or restore evaluations",
    Permission.MANAGE_QUEUES: "create, assign or close review queues",
    Permission.ADJUDICATE: "adjudicate disagreements in a review queue",
    Permission.IMPORT: "import data",
    Permission.SECOND_OPINION: "ask for second opinions",
    Permission.JUDGE: "run the judge",
    Permission.REMOVE_SESSION_NOTES: "remove a session's notes",
    Permission.CLEAR_CACHE: "clear a product's judgments",
    Permission.REMOVE_NOTES: "remove notes in bulk",
    Permission.MANAGE_ROLES: "manage roles and sessions",
    Permission.MANAGE_TOKENS: "manage API tokens",
    Permission.MANAGE_WEBHOOKS: "manage webhooks",
    Permission.SEE_OTLP_WAITING: "see what the OpenTelemetry receiver keeps waiting",
}


class PermissionDenied(PermissionError):
    """The acting user's role does not allow the action; the message says which role would."""

    def __init__(self, message: str, *, actor: Actor | None = None, permission: Permission | None = None):
        super().__init__(message)
        self.actor = actor
        self.permission = permission


class MissingIdentity(PermissionDenied, ValueError):
    """No one is named as the actor: every change records who made it."""


@dataclass(frozen=True)
class Actor:
    """Whoever acts: an identity (email, sub, typed name, token name), its role and where it came from."""

    identity: str
    role: str
    kind: ActorKind = "user"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; roles are {', '.join(ROLES)}")

    def __str__(self) -> str:
        return self.identity  # what a message or a row shows for whoever acted

    def can(self, permission: Permission) -> bool:
        """True when this actor's role allows `permission`."""
        return role_allows(self.role, permission)


def role_allows(role: str, permission: Permission) -> bool:
    """True when `role` is at least the role the permission table asks for."""
    return role in ROLES and ROLES.index(role) >= ROLES.index(PERMISSIONS[Permission(permission)])


def denial_message(actor: Actor, permission: Permission) -> str:
    """Why `actor` may not do `permission`, naming the role that may."""
    needed = PERMISSIONS[permission]
    return (
        f"{actor.identity} has the role '{actor.role}', which cannot {DESCRIPTIONS[permission]}: "
        f"that needs the role '{needed}' or higher. Ask an admin to change your role."
    )


def require(actor: Actor, permission: Permission) -> Actor:
    """The single check: return `actor` when its role allows `permission`, else raise PermissionDenied."""
    if not actor.can(permission):
        raise PermissionDenied(denial_message(actor, permission), actor=actor, permission=permission)
    return actor


def open_mode() -> bool:
    """True when no sign-in is configured: the typed name is trusted and acts as admin."""
    return get_settings().auth_mode == "open"


def configured_admins() -> frozenset[str]:
    """Identities named in OVERRULE_ADMINS (comma-separated), lower-cased like stored identities."""
    return frozenset(normalize_identity(x) for x in get_settings().admins.split(",") if x.strip())


def normalize_identity(identity: str) -> str:
    """The one form identities are stored and compared in: e-mail addresses case-insensitively
    (lower-cased), without surrounding blanks; a `sub:` identity keeps its case after the prefix,
    because OpenID Connect subjects are case-sensitive ("AbC" and "abc" are two accounts)."""
    text = identity.strip()
    if text[: len(SUB_PREFIX)].lower() == SUB_PREFIX:
        return (SUB_PREFIX + text[len(SUB_PREFIX) :])[:MAX_IDENTITY_CHARS]
    return text.lower()[:MAX_IDENTITY_CHARS]


def trusted_email_issuers() -> frozenset[str]:
    """Issuers named in OVERRULE_TRUSTED_EMAIL_ISSUERS (comma-separated), without a trailing '/'."""
    return frozenset(
        x.strip().rstrip("/") for x in get_settings().trusted_email_issuers.split(",") if x.strip()
    )


def email_is_verified(claims: Mapping[str, Any]) -> bool:
    """Whether the provider vouches for the `email` claim: `email_verified` is true (a JSON true, or
    the string "true" some providers send). A provider that omits the claim is trusted only when its
    issuer is listed in OVERRULE_TRUSTED_EMAIL_ISSUERS; an explicit false is never trusted."""
    verified = claims.get("email_verified")
    if verified is True or (isinstance(verified, str) and verified.strip().lower() == "true"):
        return True
    if verified is None:
        return str(claims.get("iss") or "").strip().rstrip("/") in trusted_email_issuers()
    return False


def subject_identity(issuer: str, subject: str) -> str:
    """The identity of a provider account without a verified e-mail: `sub:<issuer>#<sub>`. A subject
    too long to fit is replaced by its sha256, so two long subjects never share a cut-off prefix."""
    identity = f"{SUB_PREFIX}{issuer}#{subject}"
    if len(identity) > MAX_IDENTITY_CHARS:
        identity = f"{SUB_PREFIX}{issuer[:200]}#sha256:{hashlib.sha256(subject.encode()).hexdigest()}"
    return normalize_identity(identity)


def identity_from_claims(claims: Mapping[str, Any]) -> str | None:
    """Who a signed-in user is, from the provider's ID-token claims (issue 24): the e-mail address
    when the provider verified it, else the issuer-qualified `sub`; None without a `sub` either.

    This is the only place a claim becomes an identity, so an e-mail the user could type into their
    provider profile (`email_verified: false`) can never take a configured admin's role."""
    email = claims.get("email")
    if isinstance(email, str) and "@" in email and email_is_verified(claims):
        address = normalize_identity(email)
        if not address.startswith(SUB_PREFIX):
            return address
    subject = claims.get("sub")
    if subject is None or not str(subject).strip():
        return None
    return subject_identity(str(claims.get("iss") or "").strip(), str(subject).strip())


def identity_of(who: Actor | str | None) -> str:
    """The name a write records for `who` ('' when nobody is named)."""
    if isinstance(who, Actor):
        return who.identity
    return (who or "").strip()


def role_of(session: Session, identity: str) -> str:
    """A signed-in identity's role: its row, else admin when listed in OVERRULE_ADMINS, else the default."""
    key = normalize_identity(identity)
    row = session.get(UserRole, key)
    if row is not None:
        return row.role
    if key in configured_admins():
        return "admin"
    return get_settings().default_role


def removal_permission(*, one_session: bool) -> Permission:
    """Removing one session's notes needs `lead`; any removal across sessions is the admin's bulk one,
    whoever asks: a judge run's CLEAR_NOTES too (its agent acts with the role of the run's starter)."""
    return Permission.REMOVE_SESSION_NOTES if one_session else Permission.REMOVE_NOTES


def system_actor(identity: str | None = None) -> Actor:
    """The CLI and the demo loader: whoever can run them already holds the database, so admin."""
    return Actor(
        identity=(identity or "").strip() or get_settings().system_identity, role="admin", kind="system"
    )


def agent_actor(identity: str, *, role: str = "lead") -> Actor:
    """A judge run's own writes (its notes): runs need `lead`, so their agent acts as lead, or with
    the role of the person who started the run where that decides (a CLEAR_NOTES across sessions)."""
    return Actor(identity=identity, role=role, kind="agent")


def resolve(bind: Session | Engine | None, who: Actor | str | None) -> Actor:
    """The actor for `who`: an Actor as given; a name is admin in open mode, else its role row."""
    if isinstance(who, Actor):
        return who
    name = identity_of(who)
    if open_mode():
        # Open mode trusts whatever name is given, even none (the seed APIs allow anonymous notes).
        return Actor(identity=name, role="admin", kind="open")
    if not name:
        raise MissingIdentity("a reviewer must be named: every change records who made it")
    if bind is None:
        raise MissingIdentity(f"cannot look up the role of {name!r} without a database")
    if isinstance(bind, Session):
        return Actor(identity=name, role=role_of(bind, name), kind="user")
    with Session(bind) as session:
        return Actor(identity=name, role=role_of(session, name), kind="user")


def authorize(bind: Session | Engine | None, who: Actor | str | None, permission: Permission) -> Actor:
    """Resolve `who` and require `permission`: the first line of every write path in lib."""
    return require(resolve(bind, who), permission)


# --------------------------------------------------------------------------------------------
# Roles


def set_role(*, session: Session, actor: Actor | str, identity: str, role: str) -> UserRole:
    """Give `identity` a role (admin only); the change is audited with the previous role."""
    admin = authorize(session, actor, Permission.MANAGE_ROLES)
    key = normalize_identity(identity)
    if not key:
        raise ValueError("name the identity (e-mail or sub) whose role to set")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    row = session.get(UserRole, key)
    before = row.role if row is not None else f"{role_of(session, key)} (no row)"
    if row is None:
        row = UserRole(identity=key, role=role, updated_by=admin.identity)
    else:
        row.role, row.updated_by, row.updated_at = role, admin.identity, utcnow()
    session.add(row)
    record_event(
        session=session, identity=admin.identity, action="role_change", detail=f"{key}: {before} -> {role}"
    )
    session.flush()
    return row


def remove_role(*, session: Session, actor: Actor | str, identity: str) -> bool:
    """Delete a role row (admin only) so the identity falls back to the default role."""
    admin = authorize(session, actor, Permission.MANAGE_ROLES)
    key = normalize_identity(identity)
    row = session.get(UserRole, key)
    if row is None:
        return False
    session.delete(row)
    record_event(
        session=session,
        identity=admin.identity,
        action="role_change",
        detail=f"{key}: {row.role} -> {role_of_default(key)} (row removed)",
    )
    # Whoever held the role signs in again: a user removed at the provider then cannot.
    end_sessions_of(session=session, identity=key, by=admin.identity, reason="role_removed")
    session.flush()
    return True


def role_of_default(identity: str) -> str:
    """The role an identity has without a row: admin when listed in OVERRULE_ADMINS, else the default."""
    return "admin" if normalize_identity(identity) in configured_admins() else get_settings().default_role


def bootstrap_admins(*, session: Session) -> int:
    """Give every OVERRULE_ADMINS identity without a row an admin row; returns how many were added."""
    added = 0
    for key in sorted(configured_admins()):
        if session.get(UserRole, key) is None:
            session.add(UserRole(identity=key, role="admin", updated_by="OVERRULE_ADMINS"))
            record_event(
                session=session, identity=key, action="role_change", detail=f"{key}: admin (OVERRULE_ADMINS)"
            )
            added += 1
    session.flush()
    return added


def list_roles(*, session: Session) -> list[UserRole]:
    """Every role row, by identity."""
    return list(session.exec(select(UserRole).order_by(col(UserRole.identity))).all())


def roles_frame(rows: Sequence[UserRole]) -> pd.DataFrame:
    """Role rows as a table for the admin page."""
    import pandas as pd

    return pd.DataFrame(
        [
            {"identity": r.identity, "role": r.role, "updated_by": r.updated_by, "updated_at": r.updated_at}
            for r in rows
        ],
        columns=["identity", "role", "updated_by", "updated_at"],
    )


# --------------------------------------------------------------------------------------------
# Browser sessions (issue 24.3)
#
# Streamlit's st.login keeps the provider's ID-token claims in a signed cookie for 30 days and keeps
# no server-side state: "Sign out" only asks the browser to drop the cookie, so a copy of it stays
# signed in. Overrule keeps one row per sign-in, keyed by a hash of what makes that ID token unique
# (issuer, subject, issue time, nonce). A page run, or a download link, acts for the browser only
# while that row is live: not ended (sign-out, an admin, the identity's role row removed) and
# younger than OVERRULE_SESSION_HOURS.

END_REASONS: dict[str, str] = {
    "sign_out": "you signed out",
    "admin": "an admin ended it",
    "role_removed": "an admin removed your role",
}
TOUCH_SECONDS = 60  # a session's last_seen_at is written at most once a minute
# Rows older than this are deleted when a new sign-in is recorded: Streamlit refuses an identity
# cookie signed more than 31 days ago (AUTH_COOKIE_MAX_AGE_SECONDS + 1 day), and a row starts no
# later than its cookie was signed, so no cookie that could still be presented loses its row.
SESSION_RETENTION = timedelta(days=60)


@dataclass(frozen=True)
class SessionCheck:
    """A browser's sign-in as the gate sees it: its key, and why it may no longer act (None: live)."""

    key: str | None
    ended: str | None = None

    @property
    def live(self) -> bool:
        return self.key is not None and self.ended is None


def session_key(claims: Mapping[str, Any]) -> str | None:
    """The key of the sign-in these ID-token claims come from: sha256 of issuer, subject, issue time
    and nonce. None without `iat` or `sub` (every ID token has both): two sign-ins must never share one."""
    issued, subject = claims.get("iat"), claims.get("sub")
    if issued is None or subject is None:
        return None
    parts = (claims.get("iss") or "", subject, issued, claims.get("nonce") or "")
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def session_max_age_text() -> str:
    """OVERRULE_SESSION_HOURS as a page says it ("12 hours")."""
    hours = get_settings().session_hours
    return f"{hours:g} hour{'' if hours == 1 else 's'}"


def session_expires_at(row: BrowserSession) -> datetime:
    """When a session reaches OVERRULE_SESSION_HOURS (the setting as it is now, not when it began)."""
    return row.started_at + timedelta(hours=get_settings().session_hours)


def session_ended(row: BrowserSession | None, now: datetime | None = None) -> str | None:
    """Why a session may no longer act ("you signed out", "it reached the maximum age ..."), or None."""
    if row is None:
        return "it is not known to this server"
    if row.ended_at is not None:
        return END_REASONS.get(row.end_reason or "", "it was ended")
    if (now or utcnow()) >= session_expires_at(row):
        return f"it reached the maximum age of {session_max_age_text()} (OVERRULE_SESSION_HOURS)"
    return None


def _issued_at(claims: Mapping[str, Any]) -> datetime | None:
    issued = claims.get("iat")
    if isinstance(issued, bool) or not isinstance(issued, int | float | str):
        return None
    try:
        return datetime.fromtimestamp(float(issued), UTC)
    except (ValueError, OverflowError, OSError):
        return None


def check_session(
    *, session: Session, claims: Mapping[str, Any], identity: str, now: datetime | None = None
) -> SessionCheck:
    """The sign-in gate's check on every page run. The first sight of a sign-in records its row
    (started at the token's issue time, or now if that is later) and audits the sign-in; later runs
    find the row and refresh its last-seen time at most once a minute."""
    key = session_key(claims)
    if key is None:
        return SessionCheck(None, "the provider's ID token has no subject or issue time")
    moment = now or utcnow()
    row = session.get(BrowserSession, key)
    if row is None:
        issued = _issued_at(claims)
        started = min(moment, issued) if issued is not None else moment
        inserted = session.exec(  # type: ignore[call-overload]
            dialect_insert(session, BrowserSession)
            .values(id=key, identity=identity, started_at=started, last_seen_at=moment)
            .on_conflict_do_nothing(index_elements=["id"])
        )
        if inserted.rowcount:  # another tab may have recorded it a moment earlier
            email = claims.get("email")
            record_sign_in(
                session=session,
                identity=identity,
                issued_at=str(claims["iat"]),
                unverified_email=str(email) if email and identity.startswith(SUB_PREFIX) else None,
            )
            session.exec(  # type: ignore[call-overload]
                delete(BrowserSession).where(col(BrowserSession.started_at) < moment - SESSION_RETENTION)
            )
        row = session.get(BrowserSession, key, populate_existing=True)
    ended = session_ended(row, moment)
    if ended is None and row is not None:
        # The same account may now be known by another identity (its e-mail verified since, or
        # OVERRULE_TRUSTED_EMAIL_ISSUERS changed): the row follows, so "end all of X" finds it.
        renamed = row.identity != identity
        if renamed or (moment - row.last_seen_at).total_seconds() >= TOUCH_SECONDS:
            row.identity, row.last_seen_at = identity, moment
            session.add(row)
            session.flush()
    return SessionCheck(key, ended)


def session_is_live(*, session: Session, key: str | None, now: datetime | None = None) -> bool:
    """Whether the sign-in `key` may still act (a download link checks this before it streams)."""
    return key is not None and session_ended(session.get(BrowserSession, key), now) is None


def signed_in_actor(
    *, session: Session, claims: Mapping[str, Any], now: datetime | None = None
) -> Actor | None:
    """The actor of a browser's sign-in, with its role, while its session is live; else None.
    Read-only: the gate (`check_session`) records sessions, this only trusts recorded live ones."""
    identity = identity_from_claims(claims)
    if identity is None or not session_is_live(session=session, key=session_key(claims), now=now):
        return None
    return Actor(identity=identity, role=role_of(session, identity), kind="user")


def end_session(*, session: Session, key: str, by: str, reason: str) -> bool:
    """End one sign-in (`reason`: sign_out, admin, role_removed); False when it had already ended."""
    row = session.get(BrowserSession, key)
    if row is None or row.ended_at is not None:
        return False
    row.ended_at, row.ended_by, row.end_reason = utcnow(), by[:MAX_IDENTITY_CHARS], reason
    session.add(row)
    record_event(
        session=session,
        identity=by,
        action="session_end",
        detail=f"{row.identity}: session of {row.started_at:%Y-%m-%d %H:%M} UTC ended ({reason})",
    )
    session.flush()
    return True


def end_sessions_of(*, session: Session, identity: str, by: str, reason: str) -> int:
    """End every live sign-in of `identity`; returns how many."""
    keys = session.exec(
        select(BrowserSession.id).where(
            col(BrowserSession.identity) == normalize_identity(identity),
            col(BrowserSession.ended_at).is_(None),
        )
    ).all()
    return sum(end_session(session=session, key=key, by=by, reason=reason) for key in keys)


def admin_end_sessions(
    *, session: Session, actor: Actor | str | None, key: str | None = None, identity: str | None = None
) -> int:
    """An admin ends one session (`key`) or every session of `identity`; returns how many ended."""
    admin = authorize(session, actor, Permission.MANAGE_ROLES)
    if key is not None:
        return int(end_session(session=session, key=key, by=admin.identity, reason="admin"))
    if identity:
        return end_sessions_of(session=session, identity=identity, by=admin.identity, reason="admin")
    raise ValueError("name the session or the identity whose sessions to end")


def list_sessions(
    *, session: Session, now: datetime | None = None, limit: int = 1000
) -> list[BrowserSession]:
    """Live sessions (not ended, not past the maximum age), the most recently seen first."""
    moment = now or utcnow()
    oldest = moment - timedelta(hours=get_settings().session_hours)
    stmt = (
        select(BrowserSession)
        .where(col(BrowserSession.ended_at).is_(None), col(BrowserSession.started_at) > oldest)
        .order_by(col(BrowserSession.last_seen_at).desc(), col(BrowserSession.id))
        .limit(limit)
    )
    return list(session.exec(stmt).all())


def sessions_frame(rows: Sequence[BrowserSession]) -> pd.DataFrame:
    """Sessions as the admin page lists them (never the key, which names the sign-in)."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "identity": r.identity,
                "started_at": r.started_at,
                "last_seen_at": r.last_seen_at,
                "expires_at": session_expires_at(r),
            }
            for r in rows
        ],
        columns=["identity", "started_at", "last_seen_at", "expires_at"],
    )


# --------------------------------------------------------------------------------------------
# Audit


def record_event(*, session: Session, identity: str, action: str, detail: str = "") -> AuditEvent:
    """Append one access event (sign-in, role change, denied attempt) to the audit trail."""
    event = AuditEvent(
        identity=(identity or "unknown")[:MAX_IDENTITY_CHARS],
        action=action[:32],
        detail=detail[:MAX_DETAIL_CHARS],
    )
    session.add(event)
    return event


def record_sign_in(
    *, session: Session, identity: str, issued_at: str | None = None, unverified_email: str | None = None
) -> bool:
    """Audit a sign-in once per token (the same token seen by another tab is not a new sign-in).
    An e-mail the provider did not verify is named, so an admin can tell whose `sub:` identity it is."""
    detail = f"token issued at {issued_at}" if issued_at else "signed in"
    if unverified_email:
        detail += f"; e-mail {unverified_email[:MAX_IDENTITY_CHARS]} not verified by the provider"
    if issued_at:
        seen = session.exec(
            select(AuditEvent.id).where(
                col(AuditEvent.action) == "sign_in",
                col(AuditEvent.identity) == identity[:MAX_IDENTITY_CHARS],
                col(AuditEvent.detail) == detail,
            )
        ).first()
        if seen is not None:
            return False
    record_event(session=session, identity=identity, action="sign_in", detail=detail)
    return True


def record_denied(*, session: Session, exc: PermissionDenied) -> AuditEvent:
    """Audit a refused attempt; call it after the refused transaction rolled back (it commits apart)."""
    identity = exc.actor.identity if exc.actor is not None else "anonymous"
    permission = f"{exc.permission.value}: " if exc.permission is not None else ""
    return record_event(session=session, identity=identity, action="denied", detail=f"{permission}{exc}")


# Refused API requests (401/403) are audited, but a flood must not fill the database: at most
# REFUSALS_PER_MINUTE rows a minute, process-wide; past that, one `refusals_dropped` row per minute
# counts the rest (its count refreshed at most every REFUSAL_COUNT_SECONDS). `AuditRate` is that
# rule; lib.otlp's refused answers use it too, per token and hour.
REFUSALS_PER_MINUTE = 30
REFUSAL_COUNT_SECONDS = 5.0


@dataclass
class _RefusalWindow:
    start: float = -1e18
    written: int = 0
    dropped: int = 0
    summary_id: int | None = None
    summary_written_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Dropped:
    """What `AuditRate.admit` says of a row it did not admit and whose summary is due: how many
    were dropped in the window, and the summary row to update (None: write one)."""

    window: _RefusalWindow
    summary_id: int | None
    count: int


class AuditRate:
    """At most `limit` audit rows every `period` seconds for each key (one key: process-wide); past
    that, one summary row a key and period counts the rest, its count refreshed at most every
    REFUSAL_COUNT_SECONDS, so that a flood of the same thing cannot fill the audit trail."""

    def __init__(self, limit: int, period: float) -> None:
        self.limit, self.period = limit, period
        self._windows: dict[str, _RefusalWindow] = {}
        self._lock = threading.Lock()

    def admit(self, key: str, now: float) -> tuple[bool, Dropped | None]:
        """(True, None) when the row may be written; else (False, what the summary says or None
        when it is not due)."""
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window.start >= self.period:
                if len(self._windows) > 1_000:  # keys whose window ended: forgotten
                    self._windows = {k: w for k, w in self._windows.items() if now - w.start < self.period}
                window = self._windows[key] = _RefusalWindow(start=now)
            if window.written < self.limit:
                window.written += 1
                return True, None
            window.dropped += 1
            due = window.summary_id is None or now - window.summary_written_at >= REFUSAL_COUNT_SECONDS
            if not due:
                return False, None
            window.summary_written_at = now
            return False, Dropped(window, window.summary_id, window.dropped)

    def summarise(
        self, session: Session, dropped: Dropped, *, identity: str, action: str, detail: str
    ) -> None:
        """Write or update the window's summary row (`action`, `detail`) in `session`. A summary row
        gone (its transaction rolled back) or another row under its id is not touched: a new one."""
        row = session.get(AuditEvent, dropped.summary_id) if dropped.summary_id is not None else None
        if row is None or row.action != action or row.identity != identity:
            row = record_event(session=session, identity=identity, action=action, detail=detail)
        else:
            row.detail = detail[:MAX_DETAIL_CHARS]
            session.add(row)
        session.flush()
        with self._lock:
            dropped.window.summary_id = row.id


_refusals = AuditRate(REFUSALS_PER_MINUTE, 60)


def record_refusal(*, engine: Engine, identity: str, detail: str, clock: float | None = None) -> bool:
    """Audit one refused API request (`action` "api_refused"), within the rate limit; True when it
    got its own row, False when it was only counted in the minute's `refusals_dropped` row."""
    own_row, dropped = _refusals.admit("", time.monotonic() if clock is None else clock)
    if own_row:
        with session_scope(engine) as session:
            record_event(session=session, identity=identity, action="api_refused", detail=detail)
        return True
    if dropped is not None:
        text = (
            f"{dropped.count} more refused API request(s) in this minute were counted, not recorded one by "
            f"one (more than {REFUSALS_PER_MINUTE} a minute); the last: {detail}"
        )
        with session_scope(engine) as session:
            _refusals.summarise(
                session, dropped, identity="rate limit", action="refusals_dropped", detail=text
            )
    return False


def list_events(*, session: Session, limit: int = 1000, action: str | None = None) -> list[AuditEvent]:
    """The newest audit events first."""
    stmt = select(AuditEvent).order_by(col(AuditEvent.at).desc(), col(AuditEvent.id).desc()).limit(limit)
    if action:
        stmt = stmt.where(col(AuditEvent.action) == action)
    return list(session.exec(stmt).all())


def events_frame(events: Sequence[AuditEvent]) -> pd.DataFrame:
    """Audit events as a table (and CSV) for the admin page."""
    import pandas as pd

    return pd.DataFrame(
        [{"at": e.at, "identity": e.identity, "action": e.action, "detail": e.detail} for e in events],
        columns=["at", "identity", "action", "detail"],
    )


def permissions_frame() -> pd.DataFrame:
    """The permission table as the admin page shows it: one row per action, one column per role."""
    import pandas as pd

    return pd.DataFrame(
        [{"action": DESCRIPTIONS[p], **{r: role_allows(r, p) for r in ROLES}} for p in Permission],
        columns=["action", *ROLES],
    )


def is_loopback(address: str | None) -> bool:
    """True for addresses only this machine can reach (an empty address means every interface)."""
    host = (address or "").strip().strip("[]").lower()
    return host in {"localhost", "::1"} or host.startswith("127.")


def open_mode_warning(address: str | None) -> str | None:
    """The start-up warning for open mode on a reachable address, naming the setting that fixes it."""
    if not open_mode() or is_loopback(address):
        return None
    where = address or "every network interface"
    return (
        f"Overrule is in open mode on {where}: anyone who can reach this server can act as anyone, "
        "including as admin. Set OVERRULE_AUTH_MODE=signin (with an [auth] section in "
        ".streamlit/secrets.toml) to require sign-in, or bind 127.0.0.1."
    )
