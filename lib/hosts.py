"""Which host names the server answers to: the defence against DNS rebinding (issue 24 point 4).

A page on `evil.example` whose name an attacker then points at 127.0.0.1 (or at the machine's LAN
address) is same-origin with the app as far as the browser knows: its requests and its WebSocket
carry `Host: evil.example:PORT` and `Origin: http://evil.example:PORT`, and in open mode they act as
anyone. Only the Host header gives it away, so every request (pages, WebSocket, `/api/v1`,
`/downloads`) whose Host is not a name this server was given is refused.

The names: the loopback names; the address the server is bound to, or, bound to every interface,
this machine's host name and its primary addresses (an IP literal cannot be rebound: the attack
needs a name the attacker controls); and `OVERRULE_ALLOWED_HOSTS` (`app.example.com`,
`*.example.com` for every subdomain, `*` for any, e.g. behind a proxy that checks Host itself).

The launcher (`lib.ui.server`) gives the list to Streamlit as `server.allowedHosts`, which its
WebSocket handshake checks, and serve.py puts `lib.ui.server.HostCheck` in front of every route,
matching with Streamlit's own rule for that option (ports ignored, case-insensitive, `*.` for
subdomains, `*` for any): one list, one matcher, whichever layer applies them.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Sequence

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
EVERY_INTERFACE = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - the addresses that mean "all"
# Where a UDP socket would route to, to learn the primary address (connect() sends no packet).
_ROUTE_PROBES = ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1"))


def parse_host_list(text: str) -> list[str]:
    """`OVERRULE_ALLOWED_HOSTS`: comma-separated names, lower-cased; a URL or a path is refused."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    for name in names:
        if "/" in name or " " in name or (name.count(":") == 1 and not name.startswith("[")):
            raise ValueError(
                f"{name!r} is not a host name: list names only, e.g. app.example.com or *.example.com "
                "(no scheme, path or port)"
            )
    return names


def machine_addresses() -> list[str]:
    """This machine's host name and primary IPv4/IPv6 addresses, found without any network traffic."""
    found = [socket.gethostname().lower()]
    for family, target in _ROUTE_PROBES:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))
                found.append(str(probe.getsockname()[0]))
        except OSError:  # no route of that family (a loopback-only network, no IPv6)
            continue
    return found


def allowed_hosts(
    address: str | None,
    configured: Iterable[str],
    also: Iterable[str] = (),
    *,
    addresses: Callable[[], Sequence[str]] = machine_addresses,
) -> list[str]:
    """The host names a server bound to `address` answers to: loopback, the bound address (or the
    machine's own name and addresses when bound to every interface), `configured`, `also`."""
    bound = (address or "").strip().strip("[]").lower()
    names = list(LOOPBACK_HOSTS)
    names += addresses() if bound in EVERY_INTERFACE else [bound]
    names += [str(n).strip().lower() for n in (*configured, *also) if str(n).strip()]
    return list(dict.fromkeys(names))


def refusal(host: str | None) -> str:
    """What a refused request is told: whose name it used and the setting that admits it."""
    return (
        f"This Overrule server does not answer to the host name {host or '(none)'!r}, so that another "
        "web site cannot reach it by pointing its own name at this machine (DNS rebinding). If this "
        "is your server's name, add it to OVERRULE_ALLOWED_HOSTS and restart."
    )
