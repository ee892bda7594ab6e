"""Signed webhooks (issue 29.3): tell a team's pipeline when a reviewer decides a judgment.

- **Registration** (`register_webhook`, a lead): a URL (http or https, no credentials in it, no
  address `refused_address` refuses: link-local, unspecified, multicast, a cloud metadata address,
  also inside an IPv6 form) and the events it wants (`WEBHOOK_EVENTS`). Overrule makes
  the signing secret, shows it once, and stores it encrypted (Fernet) with the key in
  OVERRULE_WEBHOOK_KEY, else in `data/webhook.key` (created on first use, mode 0600): the database
  alone does not give the secret away.
- **Outbox**: `enqueue_review` runs inside the review's own transaction (`lib.corrections`' one write
  of a review state, and `lib.queues.adjudicate`) and only inserts one `WebhookDelivery` row per
  subscribed webhook: a review commits with its deliveries or not at all, and never waits on a
  network call.
- **Delivery**: `deliver_due` (the worker thread `start_worker` runs in the app's server, or
  `python -m lib webhooks deliver`) claims due rows, POSTs the JSON body with
  `Overrule-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` and
  `Overrule-Event` / `Overrule-Delivery` headers, and records every attempt with its response
  code. A 2xx is delivered; anything else is retried after `RETRY_DELAYS` (10 s, 1 min, 5 min,
  30 min, 2 h, 6 h) from the attempt's end, then the delivery is failed. Each attempt is signed and
  logged at its own time, under a claim renewed just before it is sent. `replay_delivery` sends
  one again.
- **Retention**: `prune_log` (the worker, and `deliver --loop`, at most hourly; `webhooks prune`
  when an operator asks, `--dry-run` to count only) removes delivered deliveries older than
  OVERRULE_WEBHOOK_LOG_DAYS (30; 0 keeps all) with their attempts; failed and pending ones stay.
  `log_retention` is what the Admin page says about it.
- Receivers check a delivery with `verify_signature` (docs/webhooks.md shows it).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpcore
import httpx
from sqlalchemy import Engine, delete, func, insert, update
from sqlmodel import Session, col, select

from lib.auth import Actor, Permission, authorize
from lib.models import (
    WEBHOOK_EVENTS,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
    utcnow,
)

if TYPE_CHECKING:
    import pandas as pd  # imported where a frame is made: `python -m lib webhooks deliver` starts without it

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Overrule-Signature"
EVENT_HEADER = "Overrule-Event"
DELIVERY_HEADER = "Overrule-Delivery"
# Seconds after the first attempt's failure, then each later one; after the last, the delivery fails.
RETRY_DELAYS = (10, 60, 300, 1800, 7200, 21600)
MAX_ATTEMPTS = len(RETRY_DELAYS) + 1
REQUEST_TIMEOUT = 10.0  # seconds for each read or write of a POST
CONNECT_TIMEOUT = 3.0  # seconds to connect: a receiver that is down holds the others up this long
# A claimed delivery is someone's for this long (a crashed worker's comes back); each is re-claimed
# just before its POST, so this must exceed one attempt (connect, write, read), not a batch.
CLAIM_SECONDS = 60
SIGNATURE_TOLERANCE = 300  # seconds a receiver should accept between the timestamp and its clock
POLL_SECONDS = 1.0
PRUNE_EVERY_SECONDS = 3600.0  # the delivery log is pruned at most this often per database and process
EVENT_LABELS = {
    "judgment.reviewed": "a judgment is reviewed (confirmed or overruled)",
    "judgment.overruled": "a reviewer overrules the judge",
    "judgment.undone": "a review is undone",
    "judgment.adjudicated": "a lead adjudicates a disputed judgment in a team queue",
}
_KEY_FILE = "webhook.key"


class WebhookError(ValueError):
    """A registration or replay Overrule refuses; the message says why."""


# ---------------------------------------------------------------------------------------------
# Secrets


def _fernet() -> Any:
    from cryptography.fernet import Fernet

    from lib.config import DATA_DIR, get_settings

    key = get_settings().webhook_key
    if not key:
        path = DATA_DIR / _KEY_FILE
        key = _key_file(path)
    try:
        return Fernet(key.encode("ascii") if isinstance(key, str) else key)
    except (ValueError, TypeError):
        raise WebhookError(
            "OVERRULE_WEBHOOK_KEY is not a Fernet key (32 url-safe base64-encoded bytes); make one with "
            "`python -m lib webhooks key`"
        ) from None


def _key_file(path: Path) -> str:
    """The key in `path`, made on first use, readable by this user only."""
    from cryptography.fernet import Fernet

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(Fernet.generate_key())
    return path.read_text("ascii").strip()


def new_key() -> str:
    """A fresh key for OVERRULE_WEBHOOK_KEY."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def secret_of(webhook: Webhook) -> str:
    """The webhook's signing secret, decrypted."""
    from cryptography.fernet import InvalidToken

    try:
        return _fernet().decrypt(webhook.secret_encrypted.encode("ascii")).decode("utf-8")
    except InvalidToken:
        raise WebhookError(
            f"webhook {webhook.id}'s secret cannot be decrypted with this key (OVERRULE_WEBHOOK_KEY or "
            "data/webhook.key changed?); rotate its secret"
        ) from None


# ---------------------------------------------------------------------------------------------
# Signing


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `Overrule-Signature` header value for `body` sent at `timestamp` (unix seconds)."""
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify_signature(
    secret: str,
    header: str | None,
    body: bytes,
    *,
    tolerance: int = SIGNATURE_TOLERANCE,
    now: float | None = None,
) -> bool:
    """Whether `header` signs `body` with `secret` within `tolerance` seconds of now (for receivers)."""
    if not header:
        return False
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


# ---------------------------------------------------------------------------------------------
# Registration


# Cloud metadata services that are not link-local (169.254.0.0/16 and fe80::/10 are refused as such):
# Alibaba Cloud, AWS's IPv6 endpoint (Nitro), Oracle Cloud Classic, Azure's WireServer.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254", "192.0.0.192", "168.63.129.16")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def ipv4_behind(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches, for the forms that carry one: IPv4-mapped
    (`::ffff:a.b.c.d`, which Linux connects to the IPv4 host), 6to4 (`2002::/16`) and NAT64
    (`64:ff9b::/96`). Python 3.11's `is_link_local` looks at the IPv6 form only, so
    `::ffff:169.254.169.254` would pass a check that refuses `169.254.169.254`."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refused_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a webhook must not be sent to `address` (a phrase), else None: link-local (the cloud
    metadata service at 169.254.169.254, fe80::), unspecified, multicast, or a known metadata
    address, in IPv4 or in any IPv6 form that embeds the IPv4 address (`ipv4_behind`). Loopback and
    private addresses are allowed: receivers often live there (docs/security.md)."""
    behind = ipv4_behind(address)
    if behind is not None:
        refused = refused_address(behind)
        return None if refused is None else f"{refused} (IPv4 {behind})"
    if address.is_link_local:
        return "a link-local address (cloud metadata)"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    return None


def check_url(url: str) -> str:
    """The URL stripped, or WebhookError saying what is wrong with it."""
    url = (url or "").strip()
    if len(url) > 2000:
        raise WebhookError("the URL is longer than 2000 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookError(f"the URL must start with https:// or http://, got {url[:60]!r}")
    if not parts.hostname:
        raise WebhookError("the URL has no host")
    if parts.username or parts.password:
        raise WebhookError("put no credentials in the URL; the signature authenticates Overrule")
    if parts.fragment:
        raise WebhookError("the URL must not have a #fragment")
    try:
        address = ipaddress.ip_address(parts.hostname)
    except ValueError:
        address = None
    refused = refused_address(address) if address is not None else None
    if refused is not None:
        raise WebhookError(f"{parts.hostname} is not an address a receiver listens on: {refused}")
    if any(ch.isspace() for ch in url):
        raise WebhookError("the URL must not contain spaces")
    return url


def check_events(events: Iterable[str]) -> list[str]:
    """The events in `WEBHOOK_EVENTS` order, or WebhookError naming an unknown one."""
    chosen = {str(e).strip() for e in events if str(e).strip()}
    unknown = sorted(chosen - set(WEBHOOK_EVENTS))
    if unknown:
        raise WebhookError(f"unknown event {unknown[0]!r}; events are {', '.join(WEBHOOK_EVENTS)}")
    if not chosen:
        raise WebhookError(f"choose at least one event: {', '.join(WEBHOOK_EVENTS)}")
    return [e for e in WEBHOOK_EVENTS if e in chosen]


def register_webhook(
    *, session: Session, actor: Actor | str | None, url: str, events: Iterable[str], description: str = ""
) -> tuple[Webhook, str]:
    """Register a URL for events (a lead); returns the row and its secret, shown to the user once."""
    lead = authorize(session, actor, Permission.MANAGE_WEBHOOKS)
    description = (description or "").strip()
    if len(description) > 200:
        raise WebhookError("the description is longer than 200 characters")
    secret = "whsec_" + secrets.token_urlsafe(32)
    webhook = Webhook(
        url=check_url(url),
        events=check_events(events),
        description=description,
        secret_encrypted=_fernet().encrypt(secret.encode("utf-8")).decode("ascii"),
        created_by=lead.identity,
    )
    session.add(webhook)
    session.flush()
    return webhook, secret


def rotate_secret(*, session: Session, actor: Actor | str | None, webhook_id: int) -> str:
    """A new secret for the webhook (the old one stops signing at once); returned once."""
    authorize(session, actor, Permission.MANAGE_WEBHOOKS)
    webhook = _get(session, webhook_id)
    secret = "whsec_" + secrets.token_urlsafe(32)
    webhook.secret_encrypted = _fernet().encrypt(secret.encode("utf-8")).decode("ascii")
    session.add(webhook)
    return secret


def set_active(*, session: Session, actor: Actor | str | None, webhook_id: int, active: bool) -> Webhook:
    """Pause or resume a webhook: a paused one gets no new deliveries (pending ones are still sent)."""
    authorize(session, actor, Permission.MANAGE_WEBHOOKS)
    webhook = _get(session, webhook_id)
    webhook.active = active
    webhook.disabled_at = None if active else utcnow()
    session.add(webhook)
    return webhook


def _get(session: Session, webhook_id: int) -> Webhook:
    webhook = session.get(Webhook, webhook_id)
    if webhook is None:
        raise LookupError(f"no webhook with id {webhook_id}")
    return webhook


def list_webhooks(*, session: Session) -> list[Webhook]:
    """Every webhook, newest first."""
    return list(session.exec(select(Webhook).order_by(col(Webhook.id).desc())).all())


def webhook_record(webhook: Webhook) -> dict[str, Any]:
    """A webhook as JSON (never its secret)."""
    return {
        "id": webhook.id,
        "url": webhook.url,
        "events": list(webhook.events),
        "description": webhook.description,
        "active": webhook.active,
        "created_by": webhook.created_by,
        "created_at": webhook.created_at.isoformat(),
    }


def webhooks_frame(rows: Sequence[Webhook]) -> pd.DataFrame:
    """The webhooks as the Admin page shows them."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "id": w.id, "url": w.url, "events": ", ".join(w.events), "description": w.description,
                "active": w.active, "created_by": w.created_by, "created_at": w.created_at,
            }
            for w in rows
        ],
        columns=["id", "url", "events", "description", "active", "created_by", "created_at"],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Outbox


def review_events(action: str, *, adjudicated: bool = False) -> list[str]:
    """The webhook events an audit action raises: a confirmation is reviewed, an overrule also overruled."""
    if action == "undone":
        return ["judgment.undone"]
    events = ["judgment.reviewed"] if action in ("confirmed", "overruled") else []
    if action == "overruled":
        events.append("judgment.overruled")
    if adjudicated:
        events = ["judgment.adjudicated"]
    return events


def enqueue(*, session: Session, events: Sequence[str], data: Mapping[str, Any]) -> int:
    """Write one outbox row per active webhook and event it wants, in the caller's transaction.

    Only a read of the (small) webhooks table and one insert: nothing here waits on the network.
    """
    if not events:
        return 0
    hooks = session.execute(select(Webhook.id, Webhook.events).where(col(Webhook.active))).all()
    if not hooks:
        return 0
    now = utcnow()
    rows = []
    for event in events:
        event_id = str(uuid.uuid4())
        payload = {"id": event_id, "event": event, "created_at": now.isoformat(), "data": dict(data)}
        for webhook_id, wanted in hooks:
            if event in (wanted or ()):
                rows.append(
                    {"webhook_id": webhook_id, "event": event, "event_id": event_id, "payload": payload,
                     "status": "pending", "attempts": 0, "next_attempt_at": now, "created_at": now}
                )  # fmt: skip
    if rows:
        session.execute(insert(WebhookDelivery), rows)
    return len(rows)


# ---------------------------------------------------------------------------------------------
# Delivery


@dataclass(frozen=True)
class AttemptResult:
    """What one POST got: a status code (None when no response came) and the error text. `stalled`
    says how it timed out: "connect" (the host did not take the connection) or "answer" (no answer
    in time); the batch then holds back that host's, or that webhook's, other deliveries."""

    status_code: int | None
    error: str | None
    duration_ms: int
    stalled: str | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _unreachable_address(url: str) -> str | None:
    """Why a URL's host must not be called (it resolves to an address `refused_address` refuses,
    e.g. a cloud metadata service behind a DNS name), else None. Checked at each delivery because
    a name registered as harmless may resolve elsewhere later."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return None  # unresolvable: the POST itself fails and says so
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        refused = refused_address(address)
        if refused is not None:
            return f"refused: {host} resolves to {address}, {refused}"
    return None


def _post(url: str, body: bytes, headers: Mapping[str, str], client: httpx.Client) -> AttemptResult:
    started = time.perf_counter()
    refused = _unreachable_address(url)
    if refused is not None:
        return AttemptResult(None, refused, 0)
    stalled = None
    try:
        response = client.post(url, content=body, headers=dict(headers), extensions={"trace": _PeerCheck()})
        error = None if 200 <= response.status_code < 300 else response.text[:500]
        code: int | None = response.status_code
    except httpx.HTTPError as exc:
        code, error = None, f"{type(exc).__name__}: {str(exc)[:400]}"
        if isinstance(exc, httpx.ConnectTimeout):
            stalled = "connect"
        elif isinstance(exc, httpx.TimeoutException):
            stalled = "answer"
    return AttemptResult(code, error, int((time.perf_counter() - started) * 1000), stalled)


# httpx's "trace" request extension (public: docs/advanced/extensions.md) names each step of a
# request; this one comes when a connection is open, before anything is sent on it, with the
# connection's network stream as its return value.
CONNECTED = "connection.connect_tcp.complete"


def _peer(info: Mapping[str, Any]) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address a new connection reached, from the CONNECTED event's information."""
    return ipaddress.ip_address(str(info["return_value"].get_extra_info("server_addr")[0]).split("%", 1)[0])


class _PeerCheck:
    """The "trace" extension of every delivery: refuses a connection whose peer `refused_address`
    refuses, before the request is sent on it.

    `_unreachable_address` resolves the host before the POST, and httpx resolves it again to
    connect: a DNS server answering a harmless address first and the metadata service second
    (rebinding) gets past the first check, not this one, which looks at the socket's peer. Through a
    proxy the connection is the proxy's, and the proxy connects to the receiver."""

    def __init__(self) -> None:
        self.host = ""

    def __call__(self, event: str, info: Mapping[str, Any]) -> None:
        if event == "connection.connect_tcp.started":
            self.host = str(info.get("host", ""))
        elif event == CONNECTED:
            peer = _peer(info)
            refused = refused_address(peer)
            if refused is not None:
                info["return_value"].close()
                raise httpcore.ConnectError(f"refused: {self.host} connected to {peer}, {refused}")


def http_client() -> httpx.Client:
    """The client deliveries use: REQUEST_TIMEOUT per read or write, CONNECT_TIMEOUT to connect (a
    receiver that is down costs little), redirects not followed, the HTTP(S)_PROXY settings of the
    environment kept. Every POST carries `_PeerCheck` (`_post`); DeliveriesStopped when this install
    of httpx would not call it (`_check_connections`)."""
    _check_connections()
    return httpx.Client(
        timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT), follow_redirects=False
    )


class DeliveriesStopped(RuntimeError):
    """The installed httpx does not report new connections to the "trace" extension as `_PeerCheck`
    reads them (an httpx or httpcore release changed it): Overrule then delivers nothing, rather
    than deliver unchecked."""


class _Probed(Exception):
    """Ends `_check_connections`' request once its connection is open: nothing is sent."""


def _loopback_listener() -> socket.socket:
    """A listening socket on IPv4's loopback, else on IPv6's (a host without IPv4)."""
    try:
        return socket.create_server(("127.0.0.1", 0))
    except OSError:
        return socket.create_server(("::1", 0), family=socket.AF_INET6)


def _check_connections() -> None:
    """Open one connection through httpx to a listening socket of our own, read its peer as
    `_PeerCheck` does, and raise DeliveriesStopped unless that worked. Nothing is sent (the probe
    stops the request when the connection is open; the kernel completes the handshake without an
    accept). An explicit check, not an `assert`: under `python -O` an assert is gone, and a renamed
    event would leave the check silently off."""
    seen: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []

    def probe(event: str, info: Mapping[str, Any]) -> None:
        if event == CONNECTED:
            seen.append(_peer(info))
            info["return_value"].close()
        if event == CONNECTED or event.endswith("send_request_headers.started"):
            raise _Probed

    # No proxy, and a TLS context without certificates (loading them costs ~20 ms): plain http to
    # a loopback socket.
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    listener = _loopback_listener()
    address = ipaddress.ip_address(listener.getsockname()[0])
    host = f"[{address}]" if address.version == 6 else str(address)
    # Whatever fails in the request (an event renamed, its information changed), `seen` says it.
    with (
        listener,
        httpx.Client(trust_env=False, verify=tls, timeout=CONNECT_TIMEOUT) as client,
        contextlib.suppress(Exception),
    ):
        client.post(f"http://{host}:{listener.getsockname()[1]}/", extensions={"trace": probe})
    if seen != [address]:
        raise DeliveriesStopped(
            f"webhook deliveries stopped: httpx {httpx.__version__} (with httpcore "
            f"{getattr(httpcore, '__version__', '?')}) no longer reports the connections it opens to the "
            "trace extension that Overrule checks each receiver's address on, so nothing is delivered; "
            "install the httpx and httpcore versions requirements.txt pins and restart"
        )


def _claim(engine: Engine, now: datetime, limit: int) -> dict[int, datetime]:
    """Due deliveries this worker now holds, each with its claim: `next_attempt_at` moved to the
    claim's end, which others skip until then (a crashed worker's rows come back). The value is
    also the claim's token: `_reclaim` and `_record` write only while it is still there."""
    from lib.db import session_scope

    until = now + timedelta(seconds=CLAIM_SECONDS)
    with session_scope(engine) as session:
        due = session.exec(
            select(WebhookDelivery.id)
            .where(col(WebhookDelivery.status) == "pending", col(WebhookDelivery.next_attempt_at) <= now)
            .order_by(col(WebhookDelivery.next_attempt_at), col(WebhookDelivery.id))
            .limit(limit)
        ).all()
        claimed: dict[int, datetime] = {}
        for delivery_id in due:
            result = session.execute(
                update(WebhookDelivery)
                .where(
                    col(WebhookDelivery.id) == delivery_id,
                    col(WebhookDelivery.status) == "pending",
                    col(WebhookDelivery.next_attempt_at) <= now,
                )
                .values(next_attempt_at=until)
            )
            if result.rowcount == 1:  # type: ignore[attr-defined]
                claimed[delivery_id] = until
    return claimed


def _still_ours(delivery_id: int, claimed_until: datetime) -> Any:
    """The UPDATE of a delivery that is still pending and still under this worker's claim. A claim
    that ran out was taken over by another worker if it moved `next_attempt_at` (always later:
    its clock passed our claim's end), so equality is the test of ownership."""
    return update(WebhookDelivery).where(
        col(WebhookDelivery.id) == delivery_id,
        col(WebhookDelivery.status) == "pending",
        col(WebhookDelivery.next_attempt_at) == claimed_until,
    )


@dataclass(frozen=True)
class _Send:
    """A delivery about to be sent, read under a fresh claim (`claimed_until`)."""

    delivery_id: int
    webhook_id: int
    url: str
    body: bytes
    event: str
    secret: str | None
    key_error: str | None
    claimed_until: datetime


def _reclaim(engine: Engine, delivery_id: int, claimed_until: datetime, now: datetime) -> _Send | None:
    """Extend this worker's claim on a delivery from `now`, just before sending it, and read it;
    None when it is no longer pending or another worker took it over (a batch claimed long ago
    may have outlived its claim behind slow receivers: sending it now would send it twice)."""
    from lib.db import session_scope

    until = now + timedelta(seconds=CLAIM_SECONDS)
    with session_scope(engine) as session:
        if (
            session.execute(_still_ours(delivery_id, claimed_until).values(next_attempt_at=until)).rowcount
            != 1
        ):  # type: ignore[attr-defined]
            return None
        delivery = session.get(WebhookDelivery, delivery_id)
        webhook = session.get(Webhook, delivery.webhook_id) if delivery else None
        if delivery is None or webhook is None:
            return None
        try:
            secret, key_error = secret_of(webhook), None
        except WebhookError as exc:
            secret, key_error = None, str(exc)
        return _Send(
            delivery_id,
            webhook.id or 0,
            webhook.url,
            body_of(delivery),
            delivery.event,
            secret,
            key_error,
            until,
        )


def _release(engine: Engine, delivery_id: int, claimed_until: datetime, at: datetime) -> None:
    """Give a claimed delivery back, due at `at`, without an attempt."""
    from lib.db import session_scope

    with session_scope(engine) as session:
        session.execute(_still_ours(delivery_id, claimed_until).values(next_attempt_at=at))


def body_of(delivery: WebhookDelivery) -> bytes:
    """The exact bytes sent (and signed) for a delivery."""
    return json.dumps(delivery.payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode(
        "utf-8"
    )


def deliver_due(
    engine: Engine,
    *,
    clock: Callable[[], datetime] = utcnow,
    limit: int = 100,
    client: httpx.Client | None = None,
) -> int:
    """Attempt due deliveries once each (at most `limit`); returns how many were attempted.

    Every attempt reads `clock` itself (tests pass a fake one): it is signed with the time it is
    sent, logged at that time, and its retry is timed from when it ended, so a receiver late in a
    batch behind slow ones still gets a fresh signature. Each delivery is re-claimed just before it
    is sent and skipped if another worker took it over. After a timeout the batch holds back the
    rest of that host's deliveries (connect timeout) or that webhook's (no answer in time) for
    RETRY_DELAYS[0] seconds without counting an attempt: one dead receiver costs the others one
    timeout per batch, not one per pending delivery.
    """
    claims = _claim(engine, clock(), limit)
    if not claims:
        return 0
    own = client is None
    client = client or http_client()
    stalled_hosts: set[str] = set()
    stalled_webhooks: set[int] = set()
    attempted = 0
    try:
        for delivery_id, claimed_until in claims.items():
            started = clock()
            send = _reclaim(engine, delivery_id, claimed_until, started)
            if send is None:
                continue
            host = urlsplit(send.url).netloc.lower()
            if host in stalled_hosts or send.webhook_id in stalled_webhooks:
                _release(
                    engine, delivery_id, send.claimed_until, started + timedelta(seconds=RETRY_DELAYS[0])
                )
                continue
            if send.secret is None:
                result = AttemptResult(None, send.key_error, 0)
            else:
                headers = {
                    "Content-Type": "application/json",
                    "User-Agent": "Overrule-Webhooks/1",
                    SIGNATURE_HEADER: sign(send.secret, int(started.timestamp()), send.body),
                    EVENT_HEADER: send.event,
                    DELIVERY_HEADER: str(delivery_id),
                }
                result = _post(send.url, send.body, headers, client)
            attempted += 1
            _record(engine, send, result, started=started, ended=clock())
            if result.stalled == "connect":
                stalled_hosts.add(host)
            elif result.stalled == "answer":
                stalled_webhooks.add(send.webhook_id)
    finally:
        if own:
            client.close()
    return attempted


def _record(
    engine: Engine, send: _Send, result: AttemptResult, *, started: datetime, ended: datetime
) -> bool:
    """Write an attempt's outcome, the retry timed from `ended`; nothing when the delivery is no
    longer this worker's (its claim ran out during the POST and another worker took it over: that
    worker's outcome stands). Returns whether it was written."""
    from lib.db import session_scope

    with session_scope(engine) as session:
        delivery = session.get(WebhookDelivery, send.delivery_id)
        if delivery is None:
            return False
        attempts = delivery.attempts + 1
        values: dict[str, Any] = {
            "attempts": attempts, "last_status_code": result.status_code, "last_error": result.error,
        }  # fmt: skip
        if result.ok:
            values.update(status="delivered", delivered_at=ended, next_attempt_at=None)
        elif attempts >= MAX_ATTEMPTS:
            values.update(status="failed", next_attempt_at=None)
        else:
            values.update(next_attempt_at=ended + timedelta(seconds=RETRY_DELAYS[attempts - 1]))
        written = session.execute(
            _still_ours(send.delivery_id, send.claimed_until)
            .where(col(WebhookDelivery.attempts) == delivery.attempts)
            .values(**values)
        )
        if written.rowcount != 1:  # type: ignore[attr-defined]
            log.warning(
                "webhook delivery %s was taken over by another worker during its POST; this attempt "
                "(status %s) is not recorded", send.delivery_id, result.status_code,
            )  # fmt: skip
            return False
        session.add(
            WebhookAttempt(
                delivery_id=send.delivery_id, at=started, status_code=result.status_code, error=result.error,
                duration_ms=result.duration_ms,
            )
        )  # fmt: skip
    return True


def replay_delivery(*, session: Session, actor: Actor | str | None, delivery_id: int) -> WebhookDelivery:
    """Send a delivery again (delivered or failed): it is pending now, with the same body and event id."""
    authorize(session, actor, Permission.MANAGE_WEBHOOKS)
    delivery = session.get(WebhookDelivery, delivery_id)
    if delivery is None:
        raise LookupError(f"no webhook delivery with id {delivery_id}")
    if delivery.status == "pending":
        raise WebhookError(f"delivery {delivery_id} is still pending; it will be sent")
    delivery.status, delivery.attempts, delivery.next_attempt_at = "pending", 0, utcnow()
    session.add(delivery)
    session.flush()
    return delivery


def list_deliveries(
    *, session: Session, webhook_id: int | None = None, status: str | None = None, limit: int = 200
) -> list[WebhookDelivery]:
    """The newest deliveries (of one webhook, in one status), for the delivery log."""
    stmt = select(WebhookDelivery).order_by(col(WebhookDelivery.id).desc()).limit(limit)
    if webhook_id is not None:
        stmt = stmt.where(col(WebhookDelivery.webhook_id) == webhook_id)
    if status:
        stmt = stmt.where(col(WebhookDelivery.status) == status)
    return list(session.exec(stmt).all())


def delivery_record(delivery: WebhookDelivery) -> dict[str, Any]:
    """A delivery as JSON: its state and the body that was (or will be) sent."""
    return {
        "id": delivery.id,
        "webhook_id": delivery.webhook_id,
        "event": delivery.event,
        "event_id": delivery.event_id,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error,
        "created_at": delivery.created_at.isoformat(),
        "delivered_at": delivery.delivered_at.isoformat() if delivery.delivered_at else None,
        "next_attempt_at": delivery.next_attempt_at.isoformat() if delivery.next_attempt_at else None,
        "payload": delivery.payload,
    }


def deliveries_frame(rows: Sequence[WebhookDelivery]) -> pd.DataFrame:
    """The delivery log as the Admin page shows it."""
    import pandas as pd

    columns = ["id", "webhook_id", "event", "status", "attempts", "last_status_code", "last_error",
               "created_at", "delivered_at", "next_attempt_at", "change_id"]  # fmt: skip
    return pd.DataFrame(
        [
            {
                "id": d.id, "webhook_id": d.webhook_id, "event": d.event, "status": d.status,
                "attempts": d.attempts, "last_status_code": d.last_status_code, "last_error": d.last_error,
                "created_at": d.created_at, "delivered_at": d.delivered_at,
                "next_attempt_at": d.next_attempt_at,
                "change_id": ((d.payload or {}).get("data") or {}).get("judgment", {}).get("change_id"),
            }
            for d in rows
        ],
        columns=columns,
    )  # fmt: skip


@dataclass(frozen=True)
class Pruned:
    """What one prune of the delivery log removed (or, on a dry run, would remove)."""

    deliveries: int = 0
    attempts: int = 0
    days: int = 0  # the retention it ran with (0: the log is kept forever, nothing was looked at)
    cutoff: datetime | None = None  # deliveries delivered before this went

    def summary(self, *, dry_run: bool = False) -> str:
        """One line for an operator: how many deliveries and attempts, and which."""
        if self.days <= 0:
            return "the webhook delivery log is kept forever (retention 0 days): nothing to remove"
        verb = "would remove" if dry_run else "removed"
        assert self.cutoff is not None
        return (
            f"{verb} {self.deliveries} delivered deliver{'y' if self.deliveries == 1 else 'ies'} and "
            f"{self.attempts} attempt{'' if self.attempts == 1 else 's'} delivered more than {self.days} "
            f"day{'' if self.days == 1 else 's'} ago (before {self.cutoff:%Y-%m-%d %H:%M} UTC); "
            "failed and pending deliveries are kept"
        )


def prune_deliveries(
    *, session: Session, days: int, now: datetime | None = None, dry_run: bool = False
) -> Pruned:
    """Remove delivered deliveries delivered more than `days` ago, with their attempts (on a dry run,
    only count them). Without it the log grows by a row per event and webhook forever. Failed and
    pending deliveries stay whatever their age (a lead looks at them and replays them); `days` <= 0
    keeps all."""
    if days <= 0:
        return Pruned(days=0)
    cutoff = (now or utcnow()) - timedelta(days=days)
    old = select(WebhookDelivery.id).where(
        WebhookDelivery.status == "delivered", col(WebhookDelivery.delivered_at) < cutoff
    )
    if not dry_run and session.get_bind().dialect.name == "postgresql":  # a replay waits, or we skip its row
        old = old.with_for_update(skip_locked=True)
    ids = list(session.exec(old).all())
    removed_attempts = 0
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        if dry_run:
            removed_attempts += session.exec(
                select(func.count())
                .select_from(WebhookAttempt)
                .where(col(WebhookAttempt.delivery_id).in_(part))
            ).one()
            continue
        removed_attempts += session.execute(
            delete(WebhookAttempt).where(col(WebhookAttempt.delivery_id).in_(part))
        ).rowcount
        session.execute(delete(WebhookDelivery).where(col(WebhookDelivery.id).in_(part)))
    return Pruned(deliveries=len(ids), attempts=removed_attempts, days=days, cutoff=cutoff)


_last_prune: dict[str, float] = {}


def prune_log(
    engine: Engine, *, force: bool = False, days: int | None = None, dry_run: bool = False
) -> Pruned | None:
    """`prune_deliveries` with OVERRULE_WEBHOOK_LOG_DAYS (or `days`), at most once per
    PRUNE_EVERY_SECONDS per database and process unless forced (the worker calls it on every poll;
    `python -m lib webhooks prune` forces it). None when the throttle skipped it: a `Pruned` with
    days 0 would read as "kept forever"."""
    from lib.config import get_settings
    from lib.db import session_scope

    url = str(engine.url)
    now = time.monotonic()
    if not force and now - _last_prune.get(url, -PRUNE_EVERY_SECONDS) < PRUNE_EVERY_SECONDS:
        return None
    if not dry_run:
        _last_prune[url] = now
    with session_scope(engine, read_only=dry_run) as session:
        pruned = prune_deliveries(
            session=session, days=get_settings().webhook_log_days if days is None else days, dry_run=dry_run
        )
    if pruned.deliveries and not dry_run:
        log.info("removed %s delivered webhook deliveries from the log", pruned.deliveries)
    return pruned


@dataclass(frozen=True)
class LogRetention:
    """The delivery log's retention in force and what it holds now (the Admin page says it)."""

    days: int
    delivered_kept: int
    oldest_delivered_at: datetime | None

    def describe(self, now: datetime | None = None) -> str:
        """What the Admin page says: the retention in force, and the oldest delivery the log keeps."""
        if self.days <= 0:
            rule = "Retention: the delivery log is kept forever (OVERRULE_WEBHOOK_LOG_DAYS is 0)."
        else:
            rule = (
                f"Retention: delivered deliveries are kept {self.days} day{'' if self.days == 1 else 's'} "
                "(OVERRULE_WEBHOOK_LOG_DAYS), then removed with their attempts by the server, at most "
                "hourly, or by `python -m lib webhooks prune`; failed and pending deliveries are kept "
                "until replayed."
            )
        if self.oldest_delivered_at is None:
            return f"{rule} No delivered delivery is kept now."
        age = max(0, ((now or utcnow()) - self.oldest_delivered_at).days)
        return (
            f"{rule} {self.delivered_kept} delivered deliver{'y' if self.delivered_kept == 1 else 'ies'} "
            f"kept; the oldest was delivered {self.oldest_delivered_at:%Y-%m-%d %H:%M} UTC "
            f"({age} day{'' if age == 1 else 's'} ago)."
        )


def log_retention(*, session: Session) -> LogRetention:
    """OVERRULE_WEBHOOK_LOG_DAYS and the oldest delivered delivery still kept (the log does not record
    when it was last pruned: each server process prunes on its own, at most hourly)."""
    from lib.config import get_settings

    kept, oldest = session.exec(
        select(func.count(), func.min(WebhookDelivery.delivered_at)).where(
            WebhookDelivery.status == "delivered"
        )
    ).one()
    return LogRetention(
        days=get_settings().webhook_log_days, delivered_kept=int(kept), oldest_delivered_at=oldest
    )


# ---------------------------------------------------------------------------------------------
# The worker thread


CLIENT_RETRY_SECONDS = 60.0  # how often a stopped worker tries to build its client again


@dataclass(frozen=True)
class WorkerStatus:
    """What a delivery worker met last, for the Admin page: why it delivers nothing (`stopped`), or
    the last batch that failed (`failure`, cleared by the next batch that does not)."""

    stopped: str | None = None
    failed_at: datetime | None = None
    failure: str | None = None

    def describe(self) -> str | None:
        """What the Admin page says, or None when the worker is fine."""
        if self.stopped:
            return self.stopped
        if self.failure and self.failed_at is not None:
            return (
                f"The last batch of webhook deliveries failed at {self.failed_at:%Y-%m-%d %H:%M:%S} UTC "
                f"({self.failure}); the worker goes on with the next (the server log has the traceback)."
            )
        return None


def failure_pause(interval: float, failures: int) -> float:
    """The worker's pause after `failures` batches in a row raised: doubled from `interval` up to
    CLIENT_RETRY_SECONDS. The exponent is capped: a float overflows at 2 ** 1024, which a database
    down for a day reached and which ended the thread (review10 F3)."""
    return min(interval * 2.0 ** min(failures - 1, 32), CLIENT_RETRY_SECONDS)


class DeliveryWorker(threading.Thread):
    """Delivers due webhooks in the background, every `interval` seconds, until `stop()`.

    Nothing but `stop()` ends it: a batch that raises is logged with its traceback and the next one
    runs after a pause, doubled after each failure in a row up to CLIENT_RETRY_SECONDS (a database
    hiccup or one bad row must not stop deliveries until a restart),
    and a client that cannot check addresses (`DeliveriesStopped`) is logged, shown in `status`, and
    tried again every CLIENT_RETRY_SECONDS, delivering nothing meanwhile."""

    def __init__(self, engine: Engine, interval: float = POLL_SECONDS) -> None:
        super().__init__(name="overrule-webhooks", daemon=True)
        self.engine, self.interval = engine, interval
        self.status = WorkerStatus()
        self._stop_event = threading.Event()

    def run(self) -> None:
        client: httpx.Client | None = None
        failures = 0  # batches in a row that raised: the pause doubles, so a database that is down
        try:  # is not hammered, nor the log filled, once a second
            while not self._stop_event.is_set():
                pause = self.interval
                try:
                    if client is None:
                        client = http_client()
                    while deliver_due(self.engine, client=client) and not self._stop_event.is_set():
                        pass
                    prune_log(self.engine)
                    self.status, failures = WorkerStatus(), 0
                except DeliveriesStopped as exc:
                    if self.status.stopped != str(exc):  # once, not every minute
                        log.error("%s", exc)
                    self.status = WorkerStatus(stopped=str(exc))
                    pause = CLIENT_RETRY_SECONDS
                except Exception as exc:
                    failures += 1
                    pause = failure_pause(self.interval, failures)
                    log.exception("a batch of webhook deliveries failed; the next runs in %.3g s", pause)
                    self.status = WorkerStatus(
                        failed_at=utcnow(), failure=f"{type(exc).__name__}: {exc}"[:300]
                    )
                self._stop_event.wait(pause)
        finally:
            if client is not None:
                client.close()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)


_worker_lock = threading.Lock()
_worker: DeliveryWorker | None = None


def start_worker(engine: Engine) -> DeliveryWorker:
    """The process's one delivery worker, started on first call (the app's server calls this)."""
    global _worker
    with _worker_lock:
        if _worker is None or not _worker.is_alive():
            _worker = DeliveryWorker(engine)
            _worker.start()
        return _worker


def worker_problem() -> str | None:
    """What is wrong with this process's delivery worker, for the Admin page (which runs in the
    server's process): deliveries stopped, the last batch failed, or the thread is gone; None when
    it is fine or none was started (a CLI-only setup delivers with `webhooks deliver --loop`)."""
    worker = _worker
    if worker is None:
        return None
    if not worker.is_alive():
        return "The webhook delivery worker is not running; restart the server (the server log says why)."
    return worker.status.describe()
