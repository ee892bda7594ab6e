"""Signed webhooks (issue 29.3), against a real HTTP receiver on 127.0.0.1 that checks signatures.

Deliveries are written with the review (an outbox row in its transaction) and sent by
`deliver_due`, which the tests call with an explicit clock (fixed, or advanced by a fake receiver
while it "answers") so retries and backoff need no sleeping; one test runs the real worker thread.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpcore
import httpx
import pytest
from sqlalchemy import Engine
from sqlmodel import select

from lib import corrections, queues, webhooks
from lib.auth import Actor, PermissionDenied, system_actor
from lib.config import reset_settings
from lib.db import session_scope
from lib.models import Judgment, Webhook, WebhookAttempt, WebhookDelivery, utcnow
from tests.cli import ROOT, run_cli
from tests.test_api import Server, server  # noqa: F401 - the API served by uvicorn, as a fixture
from tests.test_queues import LEAD, create, items, judgment, label_all, take
from tests.waiting import wait_until

REVIEWER = Actor(identity="rita", role="reviewer")


def at(moment: datetime) -> Callable[[], datetime]:
    """A clock stopped at `moment`."""
    return lambda: moment


@pytest.fixture(autouse=True)
def _webhook_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERRULE_WEBHOOK_KEY", webhooks.new_key())
    reset_settings()


@dataclass
class Receiver:
    """A pipeline's webhook endpoint: answers the scripted statuses (then 200) and keeps what came."""

    secret: str = ""
    statuses: deque[int] = field(default_factory=deque)
    received: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/overrule"

    def bodies(self) -> list[dict[str, Any]]:
        return [r["json"] for r in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            signed = webhooks.verify_signature(
                state.secret, self.headers.get(webhooks.SIGNATURE_HEADER), body
            )
            status = state.statuses.popleft() if state.statuses else 200
            state.received.append(
                {"json": json.loads(body), "signed": signed, "status": status, "headers": dict(self.headers)}
            )
            self.send_response(status if signed else 401)
            self.end_headers()
            self.wfile.write(b"ok" if status < 300 else b"try again")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def register(
    engine: Engine, url: str, events: tuple[str, ...] = webhooks.WEBHOOK_EVENTS[:3]
) -> tuple[int, str]:
    with session_scope(engine) as s:
        hook, secret = webhooks.register_webhook(session=s, actor=LEAD, url=url, events=events)
        assert hook.id is not None
        return hook.id, secret


def overrule(engine: Engine, change_id: str = "acme-000:clarity", decision: str = "1") -> Judgment:
    current = judgment(engine, change_id)
    with session_scope(engine) as s:
        return corrections.record_review(
            session=s, judgment_id=current.id or 0, expected_version=current.version, action="overrule",
            user_decision=decision, reviewer=REVIEWER, reason="misses the point",
        )  # fmt: skip


def deliveries(engine: Engine) -> list[WebhookDelivery]:
    with session_scope(engine, read_only=True) as s:
        return list(s.exec(select(WebhookDelivery).order_by(WebhookDelivery.id)).all())


def attempts(engine: Engine) -> list[int | None]:
    with session_scope(engine, read_only=True) as s:
        return [a.status_code for a in s.exec(select(WebhookAttempt).order_by(WebhookAttempt.id)).all()]


def test_an_overrule_is_delivered_signed_with_the_judgment_and_the_review(
    sqlite_engine: Engine, receiver: Receiver
) -> None:
    items(sqlite_engine, 1)
    _, receiver.secret = register(sqlite_engine, receiver.url)
    overrule(sqlite_engine)
    assert receiver.received == []  # the review itself sent nothing
    assert [d.event for d in deliveries(sqlite_engine)] == ["judgment.reviewed", "judgment.overruled"]
    assert webhooks.deliver_due(sqlite_engine) == 2
    assert [r["signed"] for r in receiver.received] == [True, True]
    body = receiver.bodies()[1]
    assert body["event"] == "judgment.overruled"
    assert body["data"]["judgment"]["change_id"] == "acme-000:clarity"
    assert body["data"]["judgment"]["judge_decision"] == judgment(sqlite_engine, "acme-000:clarity").decision
    assert body["data"]["review"] | {"at": None} == {
        "action": "overruled", "reviewer": "rita", "at": None, "from_decision": body["data"]["review"]["from_decision"],
        "to_decision": "1", "reason": "misses the point", "queue_id": None,
    }  # fmt: skip
    headers = receiver.received[1]["headers"]
    assert headers[webhooks.EVENT_HEADER] == "judgment.overruled"
    assert headers[webhooks.DELIVERY_HEADER] == str(deliveries(sqlite_engine)[1].id)
    assert [(d.status, d.attempts, d.last_status_code) for d in deliveries(sqlite_engine)] == [
        ("delivered", 1, 200),
        ("delivered", 1, 200),
    ]
    # A forged or stale signature does not verify.
    raw = json.dumps(body).encode()
    assert not webhooks.verify_signature(receiver.secret, webhooks.sign("wrong", 1, raw), raw)
    old = webhooks.sign(receiver.secret, 1_000, raw)
    assert not webhooks.verify_signature(receiver.secret, old, raw)
    assert webhooks.verify_signature(receiver.secret, old, raw, now=1_100)


def test_a_500_is_retried_with_backoff_and_the_same_event_id(
    sqlite_engine: Engine, receiver: Receiver
) -> None:
    items(sqlite_engine, 1)
    _, receiver.secret = register(sqlite_engine, receiver.url, events=("judgment.overruled",))
    overrule(sqlite_engine)
    receiver.statuses.extend([500, 503])
    now = utcnow()
    assert webhooks.deliver_due(sqlite_engine, clock=at(now)) == 1
    [row] = deliveries(sqlite_engine)
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == (
        "pending",
        1,
        500,
        "try again",
    )
    assert row.next_attempt_at == now + timedelta(seconds=webhooks.RETRY_DELAYS[0])
    assert webhooks.deliver_due(sqlite_engine, clock=at(now + timedelta(seconds=5))) == 0  # not due yet
    assert webhooks.deliver_due(sqlite_engine, clock=at(now + timedelta(seconds=11))) == 1
    assert deliveries(sqlite_engine)[0].next_attempt_at == now + timedelta(
        seconds=11 + webhooks.RETRY_DELAYS[1]
    )
    assert webhooks.deliver_due(sqlite_engine, clock=at(now + timedelta(seconds=11 + 61))) == 1
    assert attempts(sqlite_engine) == [500, 503, 200]
    assert len({b["id"] for b in receiver.bodies()}) == 1  # one event, delivered at least once
    [row] = deliveries(sqlite_engine)
    assert (row.status, row.attempts) == ("delivered", 3)


def test_a_review_succeeds_while_the_receiver_is_down_and_the_delivery_fails_then_replays(
    sqlite_engine: Engine, receiver: Receiver
) -> None:
    items(sqlite_engine, 1)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    hook_id, _ = register(sqlite_engine, dead, events=("judgment.reviewed",))
    saved = overrule(sqlite_engine)
    assert saved.user_decision == "1"
    now = utcnow()
    for i in range(webhooks.MAX_ATTEMPTS):
        now += timedelta(seconds=webhooks.RETRY_DELAYS[i - 1] if i else 0)
        assert webhooks.deliver_due(sqlite_engine, clock=at(now)) == 1
    [row] = deliveries(sqlite_engine)
    assert (row.status, row.attempts, row.last_status_code) == ("failed", webhooks.MAX_ATTEMPTS, None)
    assert "ConnectError" in (row.last_error or "")
    assert webhooks.deliver_due(sqlite_engine, clock=at(now + timedelta(days=1))) == 0
    # The pipeline is back (a new URL would be registered anew; here the receiver takes the old port).
    with session_scope(sqlite_engine) as s:
        hook = s.get(Webhook, hook_id)
        assert hook is not None
        hook.url = receiver.url
        receiver.secret = webhooks.secret_of(hook)
        webhooks.replay_delivery(session=s, actor=LEAD, delivery_id=row.id or 0)
    assert webhooks.deliver_due(sqlite_engine) == 1
    assert receiver.received[0]["signed"] and receiver.bodies()[0]["id"] == row.event_id
    with session_scope(sqlite_engine) as s, pytest.raises(PermissionDenied):
        webhooks.replay_delivery(session=s, actor=REVIEWER, delivery_id=row.id or 0)


def test_undo_and_adjudication_are_events_too(sqlite_engine: Engine, receiver: Receiver) -> None:
    items(sqlite_engine, 2, metrics=("clarity",))
    _, receiver.secret = register(
        sqlite_engine, receiver.url, events=("judgment.undone", "judgment.adjudicated")
    )
    saved = overrule(sqlite_engine, "acme-001:clarity")
    with session_scope(sqlite_engine) as s:
        corrections.undo_review(
            session=s, judgment_id=saved.id or 0, expected_version=saved.version, reviewer=REVIEWER
        )
    queue_id = create(sqlite_engine, overlap=2)
    a, b = take(sqlite_engine, queue_id, "ana"), take(sqlite_engine, queue_id, "ben")
    assert a and b
    label_all(sqlite_engine, queue_id, a.item_id, "ana", "3", None)
    label_all(sqlite_engine, queue_id, b.item_id, "ben", "5", "clear enough")
    disputed = judgment(sqlite_engine, "acme-000:clarity")
    with session_scope(sqlite_engine) as s:
        queues.adjudicate(
            session=s,
            queue_id=queue_id,
            judgment_id=disputed.id or 0,
            actor=LEAD,
            decision="4",
            reason="split it",
        )
    webhooks.deliver_due(sqlite_engine)
    assert [(b["event"], b["data"]["review"]["action"]) for b in receiver.bodies()] == [
        ("judgment.undone", "undone"),
        ("judgment.adjudicated", "adjudicated"),
    ]
    assert receiver.bodies()[1]["data"]["review"]["queue_id"] == queue_id


def test_the_worker_thread_delivers_in_the_background(sqlite_engine: Engine, receiver: Receiver) -> None:
    items(sqlite_engine, 1)
    _, receiver.secret = register(sqlite_engine, receiver.url, events=("judgment.overruled",))
    worker = webhooks.DeliveryWorker(sqlite_engine, interval=0.05)
    worker.start()
    try:
        overrule(sqlite_engine)
        wait_until(lambda: len(receiver.received) == 1, "the worker to deliver")
    finally:
        worker.stop()
    assert receiver.received[0]["signed"]
    assert not worker.is_alive()


def test_paused_webhooks_and_unsubscribed_events_get_nothing(
    sqlite_engine: Engine, receiver: Receiver
) -> None:
    items(sqlite_engine, 1, metrics=("clarity", "truthfulness"))
    hook_id, _ = register(sqlite_engine, receiver.url, events=("judgment.undone",))
    overrule(sqlite_engine)  # reviewed + overruled: not wanted
    with session_scope(sqlite_engine) as s:
        webhooks.set_active(session=s, actor=LEAD, webhook_id=hook_id, active=False)
    assert deliveries(sqlite_engine) == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "must start with https:// or http://"),
        ("https://user:pw@example.com/x", "no credentials"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[::ffff:169.254.169.254]/latest/meta-data/", r"link-local .*\(IPv4 169\.254\.169\.254\)"),
        ("http://[::ffff:a9fe:a9fe]/x", "link-local"),
        ("http://[64:ff9b::a9fe:a9fe]/x", "link-local"),  # NAT64
        ("http://[2002:a9fe:a9fe::1]/x", "link-local"),  # 6to4
        ("http://[::ffff:0.0.0.0]:8080/x", "unspecified"),
        ("http://100.100.100.200/latest/meta-data/", "cloud metadata address"),  # Alibaba Cloud
        ("http://[fd00:ec2::254]/latest/meta-data/", "cloud metadata address"),  # AWS IPv6
        ("http://[::ffff:100.100.100.200]/x", "cloud metadata address"),
        ("https:///nohost", "no host"),
        ("https://example.com/x#frag", "fragment"),
    ],
)
def test_a_bad_url_is_refused(sqlite_engine: Engine, url: str, message: str) -> None:
    with session_scope(sqlite_engine) as s, pytest.raises(webhooks.WebhookError, match=message):
        webhooks.register_webhook(session=s, actor=LEAD, url=url, events=["judgment.reviewed"])


def test_registration_needs_a_lead_known_events_and_keeps_the_secret_encrypted(sqlite_engine: Engine) -> None:
    with session_scope(sqlite_engine) as s, pytest.raises(PermissionDenied):
        webhooks.register_webhook(
            session=s, actor=REVIEWER, url="https://x.example/h", events=["judgment.reviewed"]
        )
    with (
        session_scope(sqlite_engine) as s,
        pytest.raises(webhooks.WebhookError, match=r"unknown event .judgment\.deleted."),
    ):
        webhooks.register_webhook(
            session=s, actor=LEAD, url="https://x.example/h", events=["judgment.deleted"]
        )
    with session_scope(sqlite_engine) as s:
        hook, secret = webhooks.register_webhook(
            session=s,
            actor=LEAD,
            url=" https://x.example/h ",
            events=["judgment.overruled", "judgment.reviewed"],
        )
        assert (hook.url, hook.events) == ("https://x.example/h", ["judgment.reviewed", "judgment.overruled"])
        assert secret not in hook.secret_encrypted and secret.startswith("whsec_")
        assert webhooks.secret_of(hook) == secret
    reset_settings()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OVERRULE_WEBHOOK_KEY", webhooks.new_key())
        reset_settings()
        with session_scope(sqlite_engine) as s:
            stored = s.exec(select(Webhook)).one()
            with pytest.raises(webhooks.WebhookError, match="cannot be decrypted"):
                webhooks.secret_of(stored)
    reset_settings()


def test_the_command_line_registers_lists_and_replays(sqlite_url: str, sqlite_engine: Engine) -> None:
    env = {"OVERRULE_DATABASE_URL": sqlite_url}
    done = run_cli("webhooks", "add", "https://ci.example/hook", "--events", "judgment.overruled", env=env)
    assert done.returncode == 0 and "whsec_" in done.stdout
    assert "https://ci.example/hook" in run_cli("webhooks", "list", env=env).stdout
    done = run_cli("webhooks", "add", "ftp://x", "--events", "judgment.overruled", env=env)
    assert done.returncode == 1 and "https://" in done.stderr
    assert (
        run_cli("webhooks", "replay", "99", env=env).stderr.strip()
        == "error: webhooks: no webhook delivery with id 99"
    )
    assert run_cli("webhooks", "key", env=env).stdout.strip()
    with session_scope(sqlite_engine, read_only=True) as s:
        assert [h.created_by for h in s.exec(select(Webhook)).all()] == [system_actor().identity]


def test_the_api_registers_lists_shows_the_log_and_replays(server: Server, receiver: Receiver) -> None:  # noqa: F811
    """A lead's token manages webhooks; a review through the API is delivered, logged and replayed."""
    items(server.engine, 1)
    lead, reviewer = server.headers("lead"), server.headers("reviewer")
    body = {"url": receiver.url, "events": ["judgment.overruled"], "description": "CI"}
    assert httpx.post(f"{server.base}/webhooks", json=body, headers=reviewer).status_code == 403
    bad = httpx.post(f"{server.base}/webhooks", json={**body, "url": "ftp://x"}, headers=lead)
    assert bad.status_code == 422 and "https://" in bad.json()["detail"]
    created = httpx.post(f"{server.base}/webhooks", json=body, headers=lead)
    assert created.status_code == 201
    receiver.secret = created.json()["secret"]
    hook_id = created.json()["id"]
    assert [h["url"] for h in httpx.get(f"{server.base}/webhooks", headers=lead).json()] == [receiver.url]
    assert "secret" not in httpx.get(f"{server.base}/webhooks", headers=lead).json()[0]
    reviewed = httpx.patch(
        f"{server.base}/judgments/acme-000:clarity",
        json={"action": "overrule", "decision": "1", "reason": "vague"},
        headers={**reviewer, "If-Match": str(judgment(server.engine, "acme-000:clarity").version)},
    )
    assert reviewed.status_code == 200, reviewed.text
    assert webhooks.deliver_due(server.engine) == 1
    log = httpx.get(f"{server.base}/webhooks/{hook_id}/deliveries", headers=lead).json()
    assert [(d["event"], d["status"], d["last_status_code"]) for d in log] == [
        ("judgment.overruled", "delivered", 200)
    ]
    replay = httpx.post(f"{server.base}/webhooks/deliveries/{log[0]['id']}/replay", headers=lead)
    assert replay.status_code == 200 and replay.json()["status"] == "pending"
    assert webhooks.deliver_due(server.engine) == 1
    assert [r["signed"] for r in receiver.received] == [True, True]
    assert httpx.post(f"{server.base}/webhooks/deliveries/999/replay", headers=lead).status_code == 404


def test_a_name_that_resolves_to_a_link_local_address_is_not_called(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DNS name pointing at the metadata service passes registration but is refused at delivery."""
    items(sqlite_engine, 1)
    register(sqlite_engine, "http://metadata.example/hook", events=("judgment.overruled",))
    real = socket.getaddrinfo

    def fake(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "metadata.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    overrule(sqlite_engine)
    sent: list[httpx.Request] = []  # a transport that never touches the network, whatever happens
    client = httpx.Client(
        transport=httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200))
    )
    assert webhooks.deliver_due(sqlite_engine, client=client) == 1
    assert sent == []
    [row] = deliveries(sqlite_engine)
    assert (row.status, row.last_status_code) == ("pending", None)
    assert (
        row.last_error
        == "refused: metadata.example resolves to 169.254.169.254, a link-local address (cloud metadata)"
    )


def test_the_delivery_log_forgets_old_delivered_rows_at_most_hourly(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delivered deliveries older than OVERRULE_WEBHOOK_LOG_DAYS go with their attempts; failed and
    pending ones, and recent deliveries, stay; a second prune within the hour does not run;
    `webhooks prune` (the same prune, forced) counts on a dry run and says what it removed. On both
    databases: PostgreSQL locks the rows it removes (a replay of one waits or is skipped)."""
    monkeypatch.setenv("OVERRULE_WEBHOOK_LOG_DAYS", "30")
    reset_settings()
    env = {"OVERRULE_DATABASE_URL": db_url, "OVERRULE_WEBHOOK_LOG_DAYS": "30"}
    hook_id, _ = register(engine, "http://127.0.0.1:9/hooks")
    now = utcnow()
    rows = {  # event_id: (status, created / delivered days ago)
        "old-delivered": ("delivered", 31),
        "new-delivered": ("delivered", 29),
        "old-failed": ("failed", 31),
        "old-pending": ("pending", 31),
    }
    with session_scope(engine) as s:
        for event_id, (status, days) in rows.items():
            at = now - timedelta(days=days)
            delivery = WebhookDelivery(
                webhook_id=hook_id, event="judgment.reviewed", event_id=event_id, status=status,
                created_at=at, delivered_at=at if status == "delivered" else None, attempts=1,
            )  # fmt: skip
            s.add(delivery)
            s.flush()
            s.add(WebhookAttempt(delivery_id=delivery.id or 0, at=at, status_code=200))
    done = run_cli("webhooks", "prune", "--dry-run", env=env)
    assert done.returncode == 0 and done.stdout.startswith(
        "would remove 1 delivered delivery and 1 attempt delivered more than 30 days ago (before "
    ), done.stderr
    assert run_cli("webhooks", "prune", "--dry-run", "--days", "28", env=env).stdout.startswith(
        "would remove 2 delivered deliveries and 2 attempts delivered more than 28 days ago"
    )
    assert len(deliveries(engine)) == 4 and len(attempts(engine)) == 4  # a dry run removes nothing
    monkeypatch.setattr(webhooks, "_last_prune", {})
    pruned = webhooks.prune_log(engine)
    assert pruned is not None and (pruned.deliveries, pruned.attempts, pruned.days) == (1, 1, 30)
    assert sorted(d.event_id for d in deliveries(engine)) == [
        "new-delivered",
        "old-failed",
        "old-pending",
    ]
    assert len(attempts(engine)) == 3
    with session_scope(engine, read_only=True) as s:
        kept = webhooks.log_retention(session=s)
    assert (kept.days, kept.delivered_kept) == (30, 1)
    assert "kept 30 days (OVERRULE_WEBHOOK_LOG_DAYS)" in kept.describe()
    assert kept.describe().endswith("1 delivered delivery kept; the oldest was delivered "
                                    f"{now - timedelta(days=29):%Y-%m-%d %H:%M} UTC (29 days ago).")  # fmt: skip
    with session_scope(engine) as s:  # delivered 40 days ago, after the first prune
        s.add(WebhookDelivery(
            webhook_id=hook_id, event="judgment.reviewed", event_id="late", status="delivered",
            delivered_at=now - timedelta(days=40),
        ))  # fmt: skip
    assert webhooks.prune_log(engine) is None  # within the hour: not run
    done = run_cli("webhooks", "prune", env=env)  # an operator's prune is not held back by the hour
    assert done.stdout.startswith("removed 1 delivered delivery and 0 attempts delivered more than 30 days")
    assert len(deliveries(engine)) == 3
    assert "must be 0 or more" in run_cli("webhooks", "prune", "--days", "-1", env=env).stderr
    with session_scope(engine) as s:
        s.add(WebhookDelivery(
            webhook_id=hook_id, event="judgment.reviewed", event_id="kept", status="delivered",
            delivered_at=now - timedelta(days=400),
        ))  # fmt: skip
    monkeypatch.setenv("OVERRULE_WEBHOOK_LOG_DAYS", "0")
    reset_settings()
    assert webhooks.prune_log(engine, force=True).deliveries == 0  # 0 keeps everything
    done = run_cli("webhooks", "prune", env={**env, "OVERRULE_WEBHOOK_LOG_DAYS": "0"})
    assert "kept forever" in done.stdout
    assert len(deliveries(engine)) == 4


@pytest.mark.parametrize(
    "host",
    ["::ffff:169.254.169.254", "::ffff:a9fe:a9fe", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::", "fd00:ec2::254",
     "100.100.100.200"],
)  # fmt: skip
def test_a_name_that_resolves_to_a_metadata_address_in_another_form_is_not_called(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery-time check sees the address the name resolves to the way the socket would reach
    it: an IPv4-mapped, NAT64 or 6to4 address is the IPv4 address it carries (Linux connects
    `::ffff:169.254.169.254` to the IPv4 metadata service)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda *a, **k: [(family, socket.SOCK_STREAM, 6, "", (host, 0))]
    )
    refused = webhooks._unreachable_address("http://rebound.example/hook")
    assert refused is not None and refused.startswith(
        f"refused: rebound.example resolves to {ipaddress.ip_address(host)}, "
    )


@pytest.mark.parametrize("host", ["::ffff:127.0.0.1", "::1", "10.1.2.3", "64:ff9b::a00:1", "fd00::1"])
def test_loopback_and_private_addresses_stay_allowed_in_every_form(host: str) -> None:
    """Receivers often live on the same machine or network (docs/security.md)."""
    url = f"http://[{host}]/hook" if ":" in host else f"http://{host}/hook"
    assert webhooks.check_url(url) == url
    assert webhooks.refused_address(ipaddress.ip_address(host)) is None


class FakeClock:
    """A clock the fake receivers advance while they "take time" to answer."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def enqueue_for(engine: Engine, webhook_id: int, n: int, event: str = "judgment.overruled") -> None:
    """`n` pending deliveries of `event` for one webhook (only that webhook wants the event)."""
    with session_scope(engine) as s:
        for i in range(n):
            assert webhooks.enqueue(session=s, events=[event], data={"n": i, "webhook": webhook_id}) == 1


def signed_at(request: httpx.Request) -> int:
    return int(request.headers[webhooks.SIGNATURE_HEADER].split(",")[0].removeprefix("t="))


def test_a_slow_receiver_neither_stales_the_others_signatures_nor_holds_them_up(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty deliveries to a receiver that never answers in time, then one to a healthy receiver,
    in one batch (review7 F5): each attempt is signed and logged at its own time and retried from
    when it ended; after the first timeout the slow webhook's other deliveries wait for the next
    batch without an attempt, so the healthy one is sent one timeout after the batch began, with a
    signature its receiver accepts. On SQLite and PostgreSQL."""
    slow_id, _ = register(engine, "http://slow.example/hook", events=("judgment.overruled",))
    enqueue_for(engine, slow_id, 30)
    good_id, good_secret = register(engine, "http://good.example/hook", events=("judgment.reviewed",))
    enqueue_for(engine, good_id, 1, "judgment.reviewed")
    clock = FakeClock(utcnow() + timedelta(seconds=1))
    start = clock()
    seen: list[tuple[str, int, datetime]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, signed_at(request), clock()))
        if request.url.host == "slow.example":
            clock.advance(webhooks.REQUEST_TIMEOUT)
            raise httpx.ReadTimeout("timed out", request=request)
        clock.advance(0.2)
        ok = webhooks.verify_signature(good_secret, request.headers[webhooks.SIGNATURE_HEADER], request.content,
                                       now=clock().timestamp())  # fmt: skip
        return httpx.Response(200 if ok else 401)

    monkeypatch.setattr(webhooks, "_unreachable_address", lambda url: None)  # no DNS for example names
    client = httpx.Client(transport=httpx.MockTransport(answer))
    assert webhooks.deliver_due(engine, clock=clock, client=client) == 2
    assert [(host, stamp - int(start.timestamp())) for host, stamp, _ in seen] == [
        ("slow.example", 0),
        ("good.example", int(webhooks.REQUEST_TIMEOUT)),
    ]
    rows = {d.id: d for d in deliveries(engine)}
    good = next(d for d in rows.values() if d.webhook_id == good_id)
    assert (good.status, good.last_status_code, good.delivered_at) == ("delivered", 200, clock())
    slow = sorted((d for d in rows.values() if d.webhook_id == slow_id), key=lambda d: d.id or 0)
    first_end = start + timedelta(seconds=webhooks.REQUEST_TIMEOUT)
    assert (slow[0].attempts, slow[0].next_attempt_at) == (
        1,
        first_end + timedelta(seconds=webhooks.RETRY_DELAYS[0]),
    )
    assert {(d.attempts, d.next_attempt_at) for d in slow[1:]} == {
        (0, first_end + timedelta(seconds=webhooks.RETRY_DELAYS[0]))
    }
    with session_scope(engine, read_only=True) as s:
        logged = {a.delivery_id: a.at for a in s.exec(select(WebhookAttempt)).all()}
    assert logged == {slow[0].id: start, good.id: first_end}


def test_a_receiver_that_does_not_take_the_connection_holds_back_its_host_not_the_others(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connect timeout stands for the host: its other webhooks' deliveries wait too."""
    a_id, _ = register(sqlite_engine, "http://down.example/a", events=("judgment.overruled",))
    b_id, _ = register(sqlite_engine, "http://DOWN.example/b", events=("judgment.reviewed",))
    c_id, _ = register(sqlite_engine, "http://up.example/c", events=("judgment.undone",))
    enqueue_for(sqlite_engine, a_id, 2)
    enqueue_for(sqlite_engine, b_id, 2, "judgment.reviewed")
    enqueue_for(sqlite_engine, c_id, 1, "judgment.undone")
    clock = FakeClock(utcnow() + timedelta(seconds=1))
    hosts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        if request.url.host == "down.example":
            clock.advance(webhooks.CONNECT_TIMEOUT)
            raise httpx.ConnectTimeout("timed out", request=request)
        return httpx.Response(204)

    monkeypatch.setattr(webhooks, "_unreachable_address", lambda url: None)
    client = httpx.Client(transport=httpx.MockTransport(answer))
    attempted = webhooks.deliver_due(sqlite_engine, clock=clock, client=client)
    assert (attempted, hosts) == (2, ["down.example", "up.example"])
    assert sorted((d.webhook_id, d.status, d.attempts) for d in deliveries(sqlite_engine)) == [
        (a_id, "pending", 0), (a_id, "pending", 1), (b_id, "pending", 0), (b_id, "pending", 0),
        (c_id, "delivered", 1),
    ]  # fmt: skip


def test_a_second_worker_never_sends_what_the_first_is_sending_or_still_holds(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A claims a batch; its receiver takes 35 s per answer, so by A's second POST the
    batch's claim (CLAIM_SECONDS) has run out for the rest. Worker B (another thread, on the same
    database) then takes over those rows but not the one A is sending (re-claimed when A began
    it); A skips what B took. Every delivery is sent once and recorded once (review7 F5: A used to
    send its whole batch again). On SQLite and PostgreSQL."""
    hook_id, _ = register(engine, "http://pipeline.example/hook", events=("judgment.overruled",))
    enqueue_for(engine, hook_id, 5)
    clock = FakeClock(utcnow() + timedelta(seconds=1))
    sent: list[tuple[str, str]] = []  # (worker, delivery id)
    b_attempted: list[int] = []

    def worker_b() -> None:
        client = httpx.Client(transport=httpx.MockTransport(lambda request: (
            sent.append(("B", request.headers[webhooks.DELIVERY_HEADER])) or httpx.Response(200))))  # fmt: skip
        b_attempted.append(webhooks.deliver_due(engine, clock=clock, client=client))

    def answer_a(request: httpx.Request) -> httpx.Response:
        sent.append(("A", request.headers[webhooks.DELIVERY_HEADER]))
        clock.advance(35)
        if len(sent) == 2:  # during A's second POST, 70 s after the batch's claim
            thread = threading.Thread(target=worker_b)
            thread.start()
            thread.join()
        return httpx.Response(200)

    monkeypatch.setattr(webhooks, "_unreachable_address", lambda url: None)  # no DNS for example.com names
    assert (
        webhooks.deliver_due(
            engine, clock=clock, client=httpx.Client(transport=httpx.MockTransport(answer_a))
        )
        == 2
    )
    ids = [str(d.id) for d in deliveries(engine)]
    assert b_attempted == [3]
    assert sent == [("A", ids[0]), ("A", ids[1]), ("B", ids[2]), ("B", ids[3]), ("B", ids[4])]
    assert [(d.status, d.attempts) for d in deliveries(engine)] == [("delivered", 1)] * 5
    with session_scope(engine, read_only=True) as s:
        assert sorted(a.delivery_id for a in s.exec(select(WebhookAttempt)).all()) == [int(i) for i in ids]


def test_an_attempt_whose_claim_was_taken_over_meanwhile_is_not_recorded(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A POST that outlives its own claim (the receiver kept it longer than CLAIM_SECONDS): another
    worker sends it again (at least once) and its outcome stands; the first worker's late answer
    neither overwrites it nor counts an attempt. On SQLite and PostgreSQL."""
    hook_id, _ = register(engine, "http://pipeline.example/hook", events=("judgment.overruled",))
    enqueue_for(engine, hook_id, 1)
    clock = FakeClock(utcnow() + timedelta(seconds=1))
    monkeypatch.setattr(webhooks, "_unreachable_address", lambda url: None)
    codes: list[int] = []

    def answer_a(request: httpx.Request) -> httpx.Response:
        clock.advance(webhooks.CLAIM_SECONDS + 1)
        b = httpx.Client(transport=httpx.MockTransport(lambda r: codes.append(202) or httpx.Response(202)))
        assert webhooks.deliver_due(engine, clock=clock, client=b) == 1
        codes.append(500)
        return httpx.Response(500)

    assert (
        webhooks.deliver_due(
            engine, clock=clock, client=httpx.Client(transport=httpx.MockTransport(answer_a))
        )
        == 1
    )
    assert codes == [202, 500]
    [row] = deliveries(engine)
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 1, 202)
    assert attempts(engine) == [202]


def test_the_connection_itself_is_checked_so_a_name_rebound_after_the_check_is_not_called(
    sqlite_engine: Engine, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answered a harmless address to the delivery-time lookup and the
    metadata service to httpx's own. Here the lookup is told nothing is wrong and 127.0.0.1 (the
    receiver) stands in for the metadata service: the socket's peer is checked, so nothing is sent."""
    items(sqlite_engine, 1)
    _, receiver.secret = register(sqlite_engine, receiver.url, events=("judgment.overruled",))
    overrule(sqlite_engine)
    monkeypatch.setattr(webhooks, "_unreachable_address", lambda url: None)
    monkeypatch.setattr(
        webhooks, "METADATA_ADDRESSES", webhooks.METADATA_ADDRESSES | {ipaddress.ip_address("127.0.0.1")}
    )
    assert webhooks.deliver_due(sqlite_engine) == 1
    assert receiver.received == []
    [row] = deliveries(sqlite_engine)
    assert (row.status, row.last_status_code, row.last_error) == (
        "pending", None, "ConnectError: refused: 127.0.0.1 connected to 127.0.0.1, a cloud metadata address",
    )  # fmt: skip
    # Allowed again, the same path connects and delivers.
    monkeypatch.setattr(webhooks, "METADATA_ADDRESSES", frozenset())
    assert webhooks.deliver_due(sqlite_engine, clock=at(utcnow() + timedelta(seconds=60))) == 1
    assert [r["signed"] for r in receiver.received] == [True]


def test_a_proxy_from_the_environment_is_used_and_its_own_address_checked(
    sqlite_engine: Engine, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY is kept (the client is httpx's default one, and the check rides on each request):
    the receiver stands in for the proxy, so a POST to a name only the proxy knows arrives. The
    check of each connection sees the proxy's address, which is refused like a receiver's."""
    items(sqlite_engine, 1)
    _, receiver.secret = register(
        sqlite_engine, "http://behind.proxy.example/hook", events=("judgment.overruled",)
    )
    real = socket.getaddrinfo

    def lookup(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "behind.proxy.example":  # the lookup before the POST: a private address, allowed
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{receiver.port}")
    overrule(sqlite_engine)
    monkeypatch.setattr(
        webhooks, "METADATA_ADDRESSES", webhooks.METADATA_ADDRESSES | {ipaddress.ip_address("127.0.0.1")}
    )
    assert webhooks.deliver_due(sqlite_engine) == 1
    assert receiver.received == []
    [row] = deliveries(sqlite_engine)
    assert (
        row.last_error == "ConnectError: refused: 127.0.0.1 connected to 127.0.0.1, a cloud metadata address"
    )
    monkeypatch.setattr(webhooks, "METADATA_ADDRESSES", frozenset())
    assert webhooks.deliver_due(sqlite_engine, clock=at(utcnow() + timedelta(seconds=60))) == 1
    [sent] = receiver.received
    assert (sent["signed"], sent["headers"]["Host"]) == (True, "behind.proxy.example")


def rename_connection_event(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make httpcore report a new connection to the "trace" extension under another event name, as
    a release might; returns the undo."""
    real = httpcore._trace.Trace.trace

    def renamed(self: httpcore._trace.Trace, name: str, info: dict[str, Any]) -> None:
        real(self, name.replace("connect_tcp", "open_tcp"), info)

    monkeypatch.setattr(httpcore._trace.Trace, "trace", renamed)
    return lambda: monkeypatch.setattr(httpcore._trace.Trace, "trace", real)


def test_a_client_that_cannot_check_addresses_delivers_nothing_says_why_and_recovers(
    engine: Engine, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An httpx or httpcore upgrade that renames the event `_PeerCheck` reads: no client is built (fail closed),
    the worker thread stays alive delivering nothing, logs why at ERROR once, the Admin page says it,
    and it delivers once a client can be built again, without a restart. SQLite and PostgreSQL."""
    hook_id, receiver.secret = register(engine, receiver.url, events=("judgment.overruled",))
    enqueue_for(engine, hook_id, 1)
    restore = rename_connection_event(monkeypatch)
    with pytest.raises(
        webhooks.DeliveriesStopped, match=r"webhook deliveries stopped: httpx .* requirements\.txt"
    ):
        webhooks.http_client()
    monkeypatch.setattr(webhooks, "CLIENT_RETRY_SECONDS", 0.05)
    monkeypatch.setattr(webhooks, "_worker", None)
    worker = webhooks.start_worker(engine)
    try:
        wait_until(lambda: worker.status.stopped, "the worker to say it stopped")
        # Logged before the status is set, so it is there now.
        assert [r.levelno for r in caplog.records if "deliveries stopped" in r.getMessage()] == [
            logging.ERROR
        ]
        problem = webhooks.worker_problem()
        assert problem is not None and problem.startswith("webhook deliveries stopped: httpx")
        assert worker.is_alive() and receiver.received == []
        [row] = deliveries(engine)
        assert (row.status, row.attempts) == ("pending", 0)
        restore()
        wait_until(lambda: len(receiver.received) == 1, "the worker to deliver once a client can be built")
        wait_until(lambda: webhooks.worker_problem() is None, "the Admin page's warning to go")
    finally:
        worker.stop()
        monkeypatch.setattr(webhooks, "_worker", None)
    assert receiver.received[0]["signed"]
    # Retried 20 times a second, logged once.
    assert len([r for r in caplog.records if "deliveries stopped" in r.getMessage()]) == 1


def test_the_probe_of_the_address_check_uses_ipv6_loopback_where_ipv4_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host without IPv4 (no 127.0.0.1 to listen on) still proves the check, on ::1."""
    real = socket.create_server
    families: list[int] = []

    def no_ipv4(address: tuple[str, int], **kwargs: Any) -> socket.socket:
        if address[0] == "127.0.0.1":
            raise OSError(99, "Cannot assign requested address")
        families.append(kwargs.get("family", socket.AF_INET))
        return real(address, **kwargs)

    monkeypatch.setattr(socket, "create_server", no_ipv4)
    webhooks.http_client().close()
    assert families == [socket.AF_INET6]


def test_under_python_O_the_address_check_is_installed_or_nothing_is_delivered() -> None:
    """`python -O` strips asserts: neither the check of each connection nor the probe that proves
    it runs may be one."""
    script = """
import ipaddress, socket
import pytest
from lib import webhooks
from tests.test_webhooks import rename_connection_event
webhooks._unreachable_address = lambda url: None  # the lookup before the POST says nothing is wrong
webhooks.METADATA_ADDRESSES |= {ipaddress.ip_address("127.0.0.1")}
with socket.create_server(("127.0.0.1", 0)) as receiver, webhooks.http_client() as client:
    sent = webhooks._post(f"http://127.0.0.1:{receiver.getsockname()[1]}/", b"{}", {}, client)
print(__debug__, sent.error)
rename_connection_event(pytest.MonkeyPatch())
try:
    webhooks.http_client()
except webhooks.DeliveriesStopped as exc:
    print("refused:", str(exc).split(":")[0])
else:
    print("built a client without the check")
"""
    done = subprocess.run(
        [sys.executable, "-O", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "False ConnectError: refused: 127.0.0.1 connected to 127.0.0.1, a cloud metadata address",
        "refused: webhook deliveries stopped",
    ]


def test_the_worker_survives_a_batch_that_raises(
    sqlite_engine: Engine,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unexpected exception in a batch is logged at ERROR with its traceback, shown on the Admin
    page, and the next batch runs after a pause (doubled while batches keep failing): one bad batch
    does not end deliveries."""
    hook_id, receiver.secret = register(sqlite_engine, receiver.url, events=("judgment.overruled",))
    enqueue_for(sqlite_engine, hook_id, 1)
    real = webhooks.deliver_due
    calls: list[int] = []
    shown: list[str | None] = []

    def thrice_broken(engine: Engine, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) <= 3:
            raise KeyError("a row nobody expected")
        shown.append(worker.status.describe())  # what the Admin page says meanwhile
        return real(engine, **kwargs)

    monkeypatch.setattr(webhooks, "deliver_due", thrice_broken)
    worker = webhooks.DeliveryWorker(sqlite_engine, interval=0.05)
    pauses: list[float | None] = []
    wait = worker._stop_event.wait
    worker._stop_event.wait = lambda timeout=None: pauses.append(timeout) or wait(timeout)  # type: ignore[method-assign]
    worker.start()
    try:
        wait_until(lambda: len(receiver.received) == 1, "the delivery")
    finally:
        worker.stop()
    records = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.exc_info[0] if r.exc_info else None for r in records] == [KeyError] * 3
    assert [r.getMessage() for r in records] == [
        f"a batch of webhook deliveries failed; the next runs in {p} s" for p in ("0.05", "0.1", "0.2")
    ]
    assert shown[0] is not None and shown[0].endswith(
        "(KeyError: 'a row nobody expected'); the worker goes on with the next (the server log has the traceback)."
    )
    assert pauses[:4] == [0.05, 0.1, 0.2, 0.05]  # doubled while failing, back to the interval after
    assert worker.status == webhooks.WorkerStatus()  # the next batch went through: nothing to show
    assert not worker.is_alive()


def test_the_pause_after_failures_stays_a_minute_however_long_they_last() -> None:
    """review10 F3: 2 ** failures overflowed a float after 1,025 failed batches in a row and the
    OverflowError ended the delivery thread."""
    assert webhooks.failure_pause(1.0, 1) == 1.0 and webhooks.failure_pause(1.0, 3) == 4.0
    assert webhooks.failure_pause(1.0, 5_000) == webhooks.CLIENT_RETRY_SECONDS


def test_deliver_loop_on_the_command_line_survives_a_batch_that_raises(
    sqlite_url: str, sqlite_engine: Engine, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review10 L4: `webhooks deliver --loop` (the CLI-only deployment's delivery) ended on the first
    batch that raised; it now runs the server's worker in the foreground."""
    hook_id, receiver.secret = register(sqlite_engine, receiver.url, events=("judgment.overruled",))
    enqueue_for(sqlite_engine, hook_id, 1)
    real, calls, workers = webhooks.deliver_due, [], []

    def once_broken(engine: Engine, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a row nobody expected")
        return real(engine, **kwargs)

    class Recorded(webhooks.DeliveryWorker):
        def run(self) -> None:
            workers.append(self)
            super().run()

    monkeypatch.setattr(webhooks, "deliver_due", once_broken)
    monkeypatch.setattr(webhooks, "DeliveryWorker", Recorded)
    monkeypatch.setattr(webhooks, "POLL_SECONDS", 0.05)
    done: list[Any] = []
    loop = threading.Thread(
        target=lambda: done.append(
            run_cli("webhooks", "deliver", "--loop", env={"OVERRULE_DATABASE_URL": sqlite_url})
        )
    )
    loop.start()
    try:
        wait_until(lambda: len(receiver.received) == 1, "the delivery after the failed batch")
    finally:
        wait_until(lambda: workers, "the worker")
        workers[0]._stop_event.set()  # run() in the foreground: no thread to join
        loop.join(30)
    assert len(calls) >= 2 and done and done[0].returncode == 0, done


def test_the_command_line_refuses_to_deliver_without_the_address_check(
    sqlite_url: str, sqlite_engine: Engine, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook_id, _ = register(sqlite_engine, receiver.url, events=("judgment.overruled",))
    enqueue_for(sqlite_engine, hook_id, 1)
    rename_connection_event(monkeypatch)
    done = run_cli("webhooks", "deliver", env={"OVERRULE_DATABASE_URL": sqlite_url})
    assert done.returncode == 1 and "error: webhook deliveries stopped: httpx" in done.stderr
    assert receiver.received == []
    [row] = deliveries(sqlite_engine)
    assert (row.status, row.attempts, row.next_attempt_at <= utcnow()) == ("pending", 0, True)  # not claimed
