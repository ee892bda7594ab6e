"""Which host names the server answers to (issue 24 point 4: DNS rebinding): the list in lib.hosts."""

from __future__ import annotations

import pytest

from lib.config import ConfigError, load_settings
from lib.hosts import LOOPBACK_HOSTS, allowed_hosts, machine_addresses, parse_host_list


def fixed() -> list[str]:
    return ["box", "192.0.2.7"]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", [*LOOPBACK_HOSTS]),
        ("localhost", [*LOOPBACK_HOSTS]),
        ("192.168.1.5", [*LOOPBACK_HOSTS, "192.168.1.5"]),
        ("[FD00::5]", [*LOOPBACK_HOSTS, "fd00::5"]),
        ("0.0.0.0", [*LOOPBACK_HOSTS, "box", "192.0.2.7"]),  # noqa: S104
        ("::", [*LOOPBACK_HOSTS, "box", "192.0.2.7"]),
        (None, [*LOOPBACK_HOSTS, "box", "192.0.2.7"]),
    ],
)
def test_the_bound_address_decides_the_names_besides_loopback(
    address: str | None, expected: list[str]
) -> None:
    assert allowed_hosts(address, [], addresses=fixed) == expected


def test_configured_names_and_streamlits_own_list_are_added_once_lower_cased() -> None:
    names = allowed_hosts("127.0.0.1", ["App.Example.com", "*.example.org", ""], ["localhost", "proxy"])
    assert names == [*LOOPBACK_HOSTS, "app.example.com", "*.example.org", "proxy"]


def test_machine_addresses_need_no_network() -> None:
    found = machine_addresses()
    assert found[0]  # the host name, then whatever addresses a route exists for
    assert all(isinstance(a, str) and a for a in found)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", []),
        ("app.example.com", ["app.example.com"]),
        (" A.example.com , *.b.example , * ", ["a.example.com", "*.b.example", "*"]),
        ("fd00::1,[fd00::2]", ["fd00::1", "[fd00::2]"]),
    ],
)
def test_parse_host_list(text: str, names: list[str]) -> None:
    assert parse_host_list(text) == names


@pytest.mark.parametrize(
    "bad", ["https://app.example.com", "app.example.com:8501", "app example.com", "a.com/x"]
)
def test_a_url_port_or_path_is_not_a_host_name(bad: str) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        parse_host_list(bad)
    with pytest.raises(ConfigError, match="OVERRULE_ALLOWED_HOSTS"):
        load_settings({"OVERRULE_ALLOWED_HOSTS": bad})


def test_the_setting_is_read_normalised() -> None:
    assert load_settings({"OVERRULE_ALLOWED_HOSTS": " App.example.com,*.x.org "}).allowed_hosts == (
        "app.example.com,*.x.org"
    )
