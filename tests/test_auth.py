"""Roles and permissions (issue 12): every write path in lib refuses a role below its permission's
minimum and accepts the minimum, on SQLite and PostgreSQL; open and sign-in identity; the audit trail.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, SQLModel, select

from lib import (
    auth,
    coach,
    corrections,
    importer,
    inspector,
    judge,
    notes,
    precedent_view,
    relevance,
    second_opinion,
)
from lib.auth import ROLES, Actor, Permission, PermissionDenied
from lib.config import reset_settings
from lib.db import session_scope
from lib.models import (
    AuditEvent,
    EvaluationSnapshot,
    Interaction,
    Judgment,
    SessionAudit,
    SessionNote,
    UserRole,
    utcnow,
)
from tests.conftest import sqlite_only

# The issue's table, written out independently of lib.auth so a change to either is caught.
EXPECTED_MINIMUM = {
    "read": "viewer",
    "export": "viewer",
    "export_access": "admin",  # issue 24.7: roles and the audit trail
    "review": "reviewer",
    "note": "reviewer",
    "feedback": "reviewer",
    "coach": "reviewer",
    "archive": "lead",
    "manage_queues": "lead",  # issue 26: a lead creates, assigns and adjudicates
    "adjudicate": "lead",
    "import": "lead",
    "second_opinion": "lead",
    "judge": "lead",
    "remove_session_notes": "lead",
    "clear_cache": "admin",
    "remove_notes": "admin",
    "manage_roles": "admin",
    "manage_tokens": "admin",
    "manage_webhooks": "lead",  # issue 29: a lead registers webhooks
    "see_otlp_waiting": "lead",  # review11 F7: the Admin page's section and the API's, one rule
}


@pytest.mark.parametrize("permission", list(Permission))
@pytest.mark.parametrize("role", ROLES)
def test_permission_table_is_the_issues(permission: Permission, role: str) -> None:
    allowed = ROLES.index(role) >= ROLES.index(EXPECTED_MINIMUM[permission.value])
    actor = Actor(identity="x@example.com", role=role)
    assert actor.can(permission) is allowed
    if allowed:
        assert auth.require(actor, permission) is actor
    else:
        with pytest.raises(PermissionDenied, match=f"'{EXPECTED_MINIMUM[permission.value]}' or higher"):
            auth.require(actor, permission)


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        Actor(identity="x", role="superuser")


# --------------------------------------------------------------------------------------------
# Every write path


@pytest.fixture
def seeded(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """One evaluation with a judgment, an archived evaluation, a note a judge run showed; an LLM
    address that refuses connections (a permitted LLM path fails after the check, never hangs)."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("OVERRULE_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("OVERRULE_LLM_TIMEOUT", "2")
    reset_settings()
    with session_scope(engine) as s:
        s.add(EvaluationSnapshot(id="s1", question="q", model_answer="a", product="acme"))
        s.add(
            EvaluationSnapshot(id="s2", question="q2", model_answer="a2", product="acme", status="archived")
        )
        s.flush()
        s.get(EvaluationSnapshot, "s2").deleted_at = utcnow()  # type: ignore[union-attr]
        s.add(Judgment(change_id="c1", product="acme", snapshot_id="s1", decision="INCLUDE"))
        note = SessionNote(language="en", note_type="TIP", content="check the units", session_id="run-1")
        s.add(note)
        s.flush()
        s.add(
            SessionAudit(
                session_id="run-1", shown_lesson_ids=[note.id], env_tags=["p:acme"], snapshot_id="s1"
            )
        )
        s.add(
            Interaction(
                id="i1", product="acme", question="Capital of France?", answer="Paris is the capital."
            )
        )
        judgment_id = s.exec(select(Judgment.id)).one()
        note_id = note.id
    return {"engine": engine, "judgment_id": judgment_id, "note_id": note_id}


def _in_session(engine: Engine, fn: Callable[[Session], Any]) -> Any:
    with session_scope(engine) as s:
        return fn(s)


def _cache_file(tmp: Path) -> Path:
    path = tmp / "cache.json"
    path.write_text(json.dumps({"cache_version": "1.0", "judgments": {}}))
    return path


EVALUATION = judge.EvaluationInput(question="q?", model_answer="an answer", product="acme", user_scores={})

# name -> (permission, write(seeded, actor, tmp_path)); each is one public write function of lib.
# fmt: off
WRITE_PATHS: dict[str, tuple[Permission, Callable[[dict[str, Any], Actor, Path], Any]]] = {
    "corrections.record_review": (Permission.REVIEW, lambda d, a, _t: _in_session(d["engine"], lambda s: corrections.record_review(session=s, judgment_id=d["judgment_id"], expected_version=1, action="confirm", reviewer=a))),
    "corrections.update_with_user_decision": (Permission.REVIEW, lambda d, a, _t: _in_session(d["engine"], lambda s: corrections.update_with_user_decision(session=s, change_id="c1", user_decision="EXCLUDE", reviewer=a))),
    "corrections.add_judgment": (Permission.IMPORT, lambda d, a, _t: _in_session(d["engine"], lambda s: corrections.add_judgment(session=s, judgment=Judgment(change_id="c2", product="acme", decision="INCLUDE"), reviewer=a))),
    "importer.import_cache_bytes": (Permission.IMPORT, lambda d, a, _t: _in_session(d["engine"], lambda s: importer.import_cache_bytes(session=s, raw=b'{"cache_version": "1.0", "judgments": {}}', source="up.json", reviewer=a))),
    "corrections.clear_product": (Permission.CLEAR_CACHE, lambda d, a, _t: _in_session(d["engine"], lambda s: corrections.clear_product(session=s, product="acme", reviewer=a))),
    "importer.import_evaluations": (Permission.IMPORT, lambda d, a, _t: _in_session(d["engine"], lambda s: importer.import_evaluations(session=s, records=[], reviewer=a))),
    "importer.import_notes": (Permission.IMPORT, lambda d, a, _t: _in_session(d["engine"], lambda s: importer.import_notes(session=s, records=[], reviewer=a))),
    "importer.import_judgments_cache": (Permission.IMPORT, lambda d, a, _t: _in_session(d["engine"], lambda s: importer.import_judgments_cache(session=s, data={"cache_version": "1.0", "judgments": {}}, reviewer=a))),
    "importer.import_metrics": (Permission.IMPORT, lambda d, a, _t: _in_session(d["engine"], lambda s: importer.import_metrics(session=s, data=[], reviewer=a))),
    "importer.import_path": (Permission.IMPORT, lambda d, a, t: importer.import_path(engine=d["engine"], path=_cache_file(t), kind=None, reviewer=a)),
    "notes.add_note": (Permission.NOTE, lambda d, a, _t: _in_session(d["engine"], lambda s: notes.add_note(s, "en", "TIP", "a tip", created_by=a))),
    "notes.remove_notes (one session)": (Permission.REMOVE_SESSION_NOTES, lambda d, a, _t: _in_session(d["engine"], lambda s: notes.remove_notes(s, session_id="run-1", removed_by=a))),
    "notes.remove_notes (bulk)": (Permission.REMOVE_NOTES, lambda d, a, _t: _in_session(d["engine"], lambda s: notes.remove_notes(s, all_notes=True, removed_by=a))),
    "relevance.set_manual_pin": (Permission.NOTE, lambda d, a, _t: _in_session(d["engine"], lambda s: relevance.set_manual_pin(session=s, note_id=d["note_id"], pinned=True, reviewer=a))),
    "relevance.reset_retries": (Permission.JUDGE, lambda d, a, _t: _in_session(d["engine"], lambda s: relevance.reset_retries(session=s, audit_session_id="run-1", reviewer=a))),
    "precedent_view.add_expert_review": (Permission.FEEDBACK, lambda d, a, _t: _in_session(d["engine"], lambda s: precedent_view.add_expert_review(session=s, interaction_id="i1", sentence_scores=[90], citation_score=20, citation_url=None, reviewer=a))),
    "relevance.record_feedback": (Permission.FEEDBACK, lambda d, a, _t: _in_session(d["engine"], lambda s: relevance.record_feedback(session=s, audit_session_id="run-1", note_id=d["note_id"], useful=True, reviewer=a))),
    "inspector.archive_evaluation": (Permission.ARCHIVE, lambda d, a, _t: _in_session(d["engine"], lambda s: inspector.archive_evaluation(session=s, snapshot_id="s1", reviewer=a))),
    "inspector.restore_evaluation": (Permission.ARCHIVE, lambda d, a, _t: _in_session(d["engine"], lambda s: inspector.restore_evaluation(session=s, snapshot_id="s2", reviewer=a))),
    "second_opinion.store_second_opinion": (Permission.SECOND_OPINION, lambda d, a, _t: _in_session(d["engine"], lambda s: second_opinion.store_second_opinion(session=s, opinion=second_opinion.SecondOpinion(d["judgment_id"], "c1", action="validated", valid=True, decision="INCLUDE", model="m"), reviewer=a))),
    "second_opinion.request_second_opinion": (Permission.SECOND_OPINION, lambda d, a, _t: second_opinion.request_second_opinion(engine=d["engine"], judgment_id=d["judgment_id"], reviewer=a)),
    "second_opinion.second_opinion_batch": (Permission.SECOND_OPINION, lambda d, a, _t: second_opinion.second_opinion_batch(engine=d["engine"], product="none", reviewer=a)),
    "judge.judge_evaluation": (Permission.JUDGE, lambda d, a, _t: judge.judge_evaluation(engine=d["engine"], evaluation=EVALUATION, reviewer=a)),
    "judge.judge_file": (Permission.JUDGE, lambda d, a, t: judge.judge_file(_empty_jsonl(t), engine=d["engine"], reviewer=a)),
    "coach.start_chat": (Permission.COACH, lambda d, a, _t: coach.start_chat(d["engine"], "s1", ["accuracy"], reviewer=a)),
    "coach.send_message": (Permission.COACH, lambda d, a, _t: coach.send_message(d["engine"], "s1", "why?", "m-1", reviewer=a)),
    "auth.set_role": (Permission.MANAGE_ROLES, lambda d, a, _t: _in_session(d["engine"], lambda s: auth.set_role(session=s, actor=a, identity="b@example.com", role="lead"))),
    "auth.remove_role": (Permission.MANAGE_ROLES, lambda d, a, _t: _in_session(d["engine"], lambda s: auth.remove_role(session=s, actor=a, identity="b@example.com"))),
}
# fmt: on


def _empty_jsonl(tmp: Path) -> Path:
    path = tmp / "batch.jsonl"
    path.write_text("")
    return path


def _row_counts(engine: Engine) -> dict[str, int]:
    with Session(engine) as s:
        return {
            t.name: int(s.execute(select(func.count()).select_from(t)).scalar_one())
            for t in SQLModel.metadata.sorted_tables
        }


@sqlite_only
@pytest.mark.parametrize("path", list(WRITE_PATHS))
def test_a_role_below_the_minimum_is_refused_and_nothing_is_written(
    seeded: dict[str, Any], path: str, tmp_path: Path
) -> None:
    permission, write = WRITE_PATHS[path]
    minimum = auth.PERMISSIONS[permission]
    below = ROLES[ROLES.index(minimum) - 1]
    before = _row_counts(seeded["engine"])
    with pytest.raises(PermissionDenied, match=f"role '{below}'") as caught:
        write(seeded, Actor(identity="low@example.com", role=below), tmp_path)
    assert caught.value.permission == permission
    assert _row_counts(seeded["engine"]) == before


@sqlite_only
@pytest.mark.parametrize("path", list(WRITE_PATHS))
def test_the_minimum_role_passes_the_check(seeded: dict[str, Any], path: str, tmp_path: Path) -> None:
    permission, write = WRITE_PATHS[path]
    actor = Actor(identity="ok@example.com", role=auth.PERMISSIONS[permission])
    try:
        write(seeded, actor, tmp_path)
    except PermissionDenied:  # pragma: no cover - the failure this test exists for
        raise
    except Exception:  # noqa: S110 - an LLM path may fail after the check (no server): that is fine here
        pass


def test_a_permitted_review_records_the_actors_identity(seeded: dict[str, Any]) -> None:
    actor = Actor(identity="rev@example.com", role="reviewer")
    WRITE_PATHS["corrections.record_review"][1](seeded, actor, Path("."))
    with Session(seeded["engine"]) as s:
        assert s.get(Judgment, seeded["judgment_id"]).reviewer == "rev@example.com"  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# Identity: open mode, sign-in mode, system and agent actors


def _signin(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "signin")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reset_settings()


def test_open_mode_trusts_a_typed_name_as_admin(session: Session) -> None:
    actor = auth.resolve(session, "  ayse ")
    assert (actor.identity, actor.role, actor.kind) == ("ayse", "admin", "open")


def test_signin_mode_resolves_a_name_through_the_role_table(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    _signin(monkeypatch, OVERRULE_ADMINS="Boss@Example.com, other@example.com")
    session.add(UserRole(identity="rev@example.com", role="reviewer"))
    session.commit()
    assert auth.resolve(session, "rev@example.com").role == "reviewer"
    assert auth.resolve(session, "boss@example.com").role == "admin"
    assert auth.resolve(session, "nobody@example.com").role == "viewer"
    with pytest.raises(PermissionDenied):
        corrections.clear_product(session=session, product="acme", reviewer="rev@example.com")
    with pytest.raises(auth.MissingIdentity):
        auth.authorize(session, None, Permission.NOTE)


ISSUER = "https://id.example.com"


@pytest.mark.parametrize(
    ("claims", "identity"),
    [
        # Verified (a JSON true, or the string some providers send): the e-mail, lower-cased.
        (
            {"iss": ISSUER, "sub": "u1", "email": "Root@Example.COM", "email_verified": True},
            "root@example.com",
        ),
        (
            {"iss": ISSUER, "sub": "u1", "email": "root@example.com", "email_verified": "True"},
            "root@example.com",
        ),
        # Unverified, or not said: the issuer-qualified sub, its case kept (subjects are case-sensitive).
        (
            {"iss": ISSUER, "sub": "AbC", "email": "ROOT@example.com", "email_verified": False},
            f"sub:{ISSUER}#AbC",
        ),
        (
            {"iss": ISSUER, "sub": "AbC", "email": "root@example.com", "email_verified": "false"},
            f"sub:{ISSUER}#AbC",
        ),
        ({"iss": ISSUER, "sub": "AbC", "email": "root@example.com"}, f"sub:{ISSUER}#AbC"),
        ({"iss": ISSUER, "sub": "AbC"}, f"sub:{ISSUER}#AbC"),
        # A "verified" e-mail that is not an address, or poses as a sub identity, is not used either.
        ({"iss": ISSUER, "sub": "x", "email": "sub:evil#1", "email_verified": True}, f"sub:{ISSUER}#x"),
        ({"iss": ISSUER, "sub": "x", "email": "SUB:a@b#c", "email_verified": True}, f"sub:{ISSUER}#x"),
        ({"is_logged_in": True}, None),
    ],
)
def test_identity_is_a_verified_email_else_the_issuer_qualified_sub(
    claims: dict[str, object], identity: str | None
) -> None:
    assert auth.identity_from_claims(claims) == identity


def test_an_unverified_email_never_gets_a_configured_admins_role(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24.1: `email: ROOT@example.com, email_verified: false` became root's admin role."""
    _signin(monkeypatch, OVERRULE_ADMINS="root@example.com")
    auth.bootstrap_admins(session=session)
    forged = auth.identity_from_claims(
        {"iss": ISSUER, "sub": "mallory", "email": "ROOT@example.com", "email_verified": False}
    )
    real = auth.identity_from_claims(
        {"iss": ISSUER, "sub": "root-1", "email": "ROOT@example.com", "email_verified": True}
    )
    assert forged is not None and real == "root@example.com"
    assert auth.role_of(session, forged) == "viewer"
    assert auth.role_of(session, real) == "admin"
    assert not auth.resolve(session, forged).can(Permission.MANAGE_ROLES)


def test_a_trusted_issuer_vouches_for_emails_it_does_not_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    claims = {"iss": ISSUER + "/", "sub": "u1", "email": "Ann@Example.com"}
    monkeypatch.setenv("OVERRULE_TRUSTED_EMAIL_ISSUERS", f"https://other.example, {ISSUER}/")
    reset_settings()
    assert auth.identity_from_claims(claims) == "ann@example.com"
    # An explicit "not verified" is never overridden, and other issuers are not trusted.
    assert auth.identity_from_claims({**claims, "email_verified": False}) == f"sub:{ISSUER}/#u1"
    assert (
        auth.identity_from_claims({**claims, "iss": "https://third.example"})
        == "sub:https://third.example#u1"
    )


def test_sub_identities_keep_their_case_and_long_subjects_are_hashed(session: Session) -> None:
    assert auth.normalize_identity("  SUB:https://Id.example.com#AbC ") == "sub:https://Id.example.com#AbC"
    assert auth.normalize_identity(" Ann@Example.COM ") == "ann@example.com"
    admin = Actor(identity="root", role="admin")
    auth.set_role(session=session, actor=admin, identity=f"sub:{ISSUER}#AbC", role="lead")
    assert auth.role_of(session, f"sub:{ISSUER}#AbC") == "lead"
    assert auth.role_of(session, f"sub:{ISSUER}#abc") == "viewer"  # another account
    long_a = auth.identity_from_claims({"iss": ISSUER, "sub": "a" * 400 + "1"})
    long_b = auth.identity_from_claims({"iss": ISSUER, "sub": "a" * 400 + "2"})
    assert long_a and long_b and long_a != long_b
    assert len(long_a) <= auth.MAX_IDENTITY_CHARS and long_a.startswith(f"sub:{ISSUER}#sha256:")


def test_default_role_comes_from_the_setting(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    _signin(monkeypatch, OVERRULE_DEFAULT_ROLE="reviewer")
    assert auth.resolve(session, "new@example.com").role == "reviewer"


def test_an_invalid_mode_or_default_role_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from lib.config import ConfigError, get_settings

    monkeypatch.setenv("OVERRULE_DEFAULT_ROLE", "owner")
    reset_settings()
    with pytest.raises(ConfigError, match="OVERRULE_DEFAULT_ROLE"):
        get_settings()
    monkeypatch.setenv("OVERRULE_DEFAULT_ROLE", "viewer")
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "oidc")
    reset_settings()
    with pytest.raises(ConfigError, match="OVERRULE_AUTH_MODE"):
        get_settings()


def test_system_and_agent_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    _signin(monkeypatch, OVERRULE_SYSTEM_IDENTITY="batch-bot")
    assert auth.system_actor() == Actor(identity="batch-bot", role="admin", kind="system")
    assert auth.system_actor("ops").identity == "ops"
    assert auth.agent_actor("judge:gpt").can(Permission.REMOVE_SESSION_NOTES)
    assert not auth.agent_actor("judge:gpt").can(Permission.REMOVE_NOTES)
    assert auth.agent_actor("judge:gpt", role="admin").can(Permission.REMOVE_NOTES)
    # A judge run's CLEAR_NOTES across sessions is a bulk removal like any other (issue 25): the
    # run's agent gets no wider removal than the Notes page gives the person who started the run.
    assert auth.removal_permission(one_session=False) == Permission.REMOVE_NOTES
    assert auth.removal_permission(one_session=True) == Permission.REMOVE_SESSION_NOTES


def test_bootstrap_admins_adds_rows_once_and_a_demotion_sticks(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    _signin(monkeypatch, OVERRULE_ADMINS="a@example.com,b@example.com")
    assert auth.bootstrap_admins(session=session) == 2
    assert auth.bootstrap_admins(session=session) == 0
    auth.set_role(session=session, actor="a@example.com", identity="b@example.com", role="viewer")
    session.commit()
    assert auth.bootstrap_admins(session=session) == 0
    assert auth.role_of(session, "B@example.com") == "viewer"
    details = [e.detail for e in auth.list_events(session=session, action="role_change")]
    assert "b@example.com: admin -> viewer" in details


def test_role_changes_validate_their_input(session: Session) -> None:
    admin = Actor(identity="root", role="admin")
    with pytest.raises(ValueError, match="unknown role"):
        auth.set_role(session=session, actor=admin, identity="x", role="owner")
    with pytest.raises(ValueError, match="identity"):
        auth.set_role(session=session, actor=admin, identity="  ", role="lead")


# --------------------------------------------------------------------------------------------
# Audit


def test_a_denied_attempt_is_audited_after_the_rollback(engine: Engine) -> None:
    viewer = Actor(identity="v@example.com", role="viewer")
    with pytest.raises(PermissionDenied) as caught, session_scope(engine) as s:
        notes.add_note(s, "en", "TIP", "not allowed", created_by=viewer)
    with session_scope(engine) as s:
        auth.record_denied(session=s, exc=caught.value)
    with Session(engine) as s:
        events = auth.list_events(session=s)
        assert s.exec(select(func.count()).select_from(SessionNote)).one() == 0
    assert [(e.identity, e.action) for e in events] == [("v@example.com", "denied")]
    assert events[0].detail.startswith("note: ")
    frame = auth.events_frame(events)
    assert list(frame.columns) == ["at", "identity", "action", "detail"]


def test_a_sign_in_is_audited_once_per_token(engine: Engine) -> None:
    with session_scope(engine) as s:
        assert auth.record_sign_in(session=s, identity="u@example.com", issued_at="1700000000")
    with session_scope(engine) as s:
        assert not auth.record_sign_in(session=s, identity="u@example.com", issued_at="1700000000")
        assert auth.record_sign_in(session=s, identity="u@example.com", issued_at="1700009999")
    with Session(engine) as s:
        assert s.exec(select(func.count()).select_from(AuditEvent)).one() == 2


@pytest.mark.parametrize(
    ("mode", "address", "warns"),
    [
        ("open", "0.0.0.0", True),  # noqa: S104
        ("open", "", True),
        ("open", "192.168.1.5", True),
        ("open", "127.0.0.1", False),
        ("open", "localhost", False),
        ("open", "::1", False),
        ("signin", "0.0.0.0", False),  # noqa: S104
    ],
)
def test_open_mode_warns_on_a_reachable_address(
    monkeypatch: pytest.MonkeyPatch, mode: str, address: str, warns: bool
) -> None:
    monkeypatch.setenv("OVERRULE_AUTH_MODE", mode)
    reset_settings()
    warning = auth.open_mode_warning(address)
    assert (warning is not None) is warns
    if warning:
        assert "OVERRULE_AUTH_MODE=signin" in warning


# --------------------------------------------------------------------------------------------
# Browser sessions (issue 24.3): ended by sign-out, an admin or a role removal, and by age


def _claims(sub: str = "u1", *, iat: int = 1_700_000_000, nonce: str = "n1", **extra: Any) -> dict[str, Any]:
    return {"iss": ISSUER, "sub": sub, "iat": iat, "nonce": nonce, **extra}


def _at(claims: dict[str, Any], hours: float) -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.fromtimestamp(claims["iat"], UTC) + timedelta(hours=hours)


def _check(engine: Engine, claims: dict[str, Any], hours: float = 0.1) -> auth.SessionCheck:
    identity = auth.identity_from_claims(claims)
    assert identity is not None
    with session_scope(engine) as s:
        return auth.check_session(session=s, claims=claims, identity=identity, now=_at(claims, hours))


def test_sign_out_ends_the_session_for_every_copy_of_the_cookie(engine: Engine) -> None:
    """Issue 24.3: after "Sign out", copied cookies (the same claims) stayed signed in."""
    claims = _claims()
    first = _check(engine, claims)
    assert first.live and first.key == auth.session_key(claims)
    assert _check(engine, claims, hours=0.2).live  # the next page run, or another tab
    with session_scope(engine) as s:
        assert auth.end_session(session=s, key=first.key, by="sub:x", reason="sign_out")
        assert not auth.end_session(session=s, key=first.key, by="sub:x", reason="sign_out")
    again = _check(engine, claims, hours=0.3)
    assert not again.live and again.ended == "you signed out"
    with Session(engine) as s:
        assert auth.signed_in_actor(session=s, claims=claims, now=_at(claims, 0.3)) is None
        events = [(e.action, e.identity) for e in auth.list_events(session=s)]
    assert events.count(("sign_in", f"sub:{ISSUER}#u1")) == 1  # audited once, at the first sight
    assert ("session_end", "sub:x") in events
    # Signing in again is a new token (its own iat and nonce): a new, live session.
    assert _check(engine, _claims(iat=1_700_000_100, nonce="n2")).live


def test_a_session_ends_at_the_maximum_age(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24.3: a session stayed signed in for the cookie's 30 days."""
    claims = _claims()
    assert _check(engine, claims, hours=11.9).live
    ended = _check(engine, claims, hours=12.0)
    assert ended.ended == "it reached the maximum age of 12 hours (OVERRULE_SESSION_HOURS)"
    monkeypatch.setenv("OVERRULE_SESSION_HOURS", "24")
    reset_settings()
    assert _check(engine, claims, hours=23.9).live  # the setting as it is now
    monkeypatch.setenv("OVERRULE_SESSION_HOURS", "0.5")
    reset_settings()
    assert not _check(engine, claims, hours=0.6).live
    # A token first seen long after it was issued started at its issue time, not at first sight.
    late = _claims(iat=1_700_000_500, nonce="late")
    assert not _check(engine, late, hours=1).live


def test_removing_a_role_ends_its_sessions_and_an_admin_ends_one_or_all(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _signin(monkeypatch)
    bob = {"email": "Bob@example.com", "email_verified": True}
    laptop, phone = _claims("bob", nonce="a", **bob), _claims("bob", nonce="b", **bob)
    ann = _claims("ann", email="ann@example.com", email_verified=True)
    for claims in (laptop, phone, ann):
        assert _check(engine, claims).live
    admin = Actor(identity="root@example.com", role="admin")
    with session_scope(engine) as s:
        assert {r.identity for r in auth.list_sessions(session=s, now=_at(ann, 0.1))} == {
            "bob@example.com",
            "ann@example.com",
        }
        with pytest.raises(PermissionDenied):
            auth.admin_end_sessions(
                session=s, actor=Actor("lead@example.com", "lead"), identity="ann@example.com"
            )
    with session_scope(engine) as s:
        assert auth.admin_end_sessions(session=s, actor=admin, key=auth.session_key(laptop)) == 1
    assert _check(engine, laptop).ended == "an admin ended it" and _check(engine, phone).live
    with session_scope(engine) as s:
        auth.set_role(session=s, actor=admin, identity="bob@example.com", role="reviewer")
    with session_scope(engine) as s:
        assert auth.remove_role(session=s, actor=admin, identity="BOB@example.com")
    assert _check(engine, phone).ended == "an admin removed your role"
    assert _check(engine, ann).live
    with session_scope(engine) as s:
        assert auth.admin_end_sessions(session=s, actor=admin, identity="ann@example.com") == 1
        assert auth.list_sessions(session=s, now=_at(ann, 0.1)) == []


def test_a_token_without_an_issue_time_gets_no_session(engine: Engine) -> None:
    claims = {"iss": ISSUER, "sub": "u1"}
    with session_scope(engine) as s:
        check = auth.check_session(session=s, claims=claims, identity="sub:x#u1")
        assert not check.live and "issue time" in (check.ended or "")
        assert auth.signed_in_actor(session=s, claims=claims) is None


def test_last_seen_is_written_at_most_once_a_minute_and_old_rows_are_pruned(engine: Engine) -> None:
    from lib.models import BrowserSession

    claims = _claims()
    key = _check(engine, claims, hours=0).key
    _check(engine, claims, hours=0.5 / 60)  # 30 s later: not written
    with Session(engine) as s:
        assert s.get(BrowserSession, key).last_seen_at == _at(claims, 0)  # type: ignore[union-attr]
    _check(engine, claims, hours=1.5 / 60)
    with Session(engine) as s:
        assert s.get(BrowserSession, key).last_seen_at == _at(claims, 1.5 / 60)  # type: ignore[union-attr]
    # A sign-in recorded after the retention period removes rows that old.
    days = auth.SESSION_RETENTION.days + 1
    _check(engine, _claims("later", iat=claims["iat"] + days * 86_400))
    with Session(engine) as s:
        assert s.get(BrowserSession, key) is None


def test_the_retention_outlasts_every_identity_cookie_streamlit_accepts() -> None:
    """A pruned row would let a still-valid copied cookie start afresh: rows must outlive cookies."""
    from datetime import timedelta

    from streamlit.web.server.starlette import starlette_app_utils
    from streamlit.web.server.starlette.starlette_server_config import AUTH_COOKIE_MAX_AGE_SECONDS

    accepted = timedelta(days=starlette_app_utils._DEFAULT_SIGNED_VALUE_MAX_AGE_DAYS)
    assert accepted >= timedelta(seconds=AUTH_COOKIE_MAX_AGE_SECONDS)
    assert accepted < auth.SESSION_RETENTION
