"""``agentcompass.netpolicy``: allowlist entries, their resolution, and the
rulesets, installed by the real ``nft`` in a network namespace of the test's
own and tried with real connections."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from agentcompass import ComponentError, NetworkPolicy, netpolicy


@pytest.mark.parametrize(
    ("entry", "host", "port"),
    [("example.org", "example.org", None), ("example.org:443", "example.org", 443), ("10.0.0.1", "10.0.0.1", None),
     ("[::1]:22", "::1", 22), ("[::1]", "::1", None), ("fe80::1", "fe80::1", None)],
)  # fmt: skip
def test_allowlist_entries_parse(entry: str, host: str, port: int | None) -> None:
    assert netpolicy.parse_allow(entry) == netpolicy.AllowEntry(host, port)


@pytest.mark.parametrize("entry", ["", "a b", "host:0", "host:65536", "host:x", "[::1", "[::1]22", ":80", "1:2:3:zz"])
def test_bad_allowlist_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(f"allowlist entry {entry!r}")):
        netpolicy.parse_allow(entry)


def test_check_names_the_provider_the_place_and_the_entry() -> None:
    netpolicy.check(NetworkPolicy("allowlist", ("example.org:443", "10.0.0.1")), "sandbox", "network policy")
    with pytest.raises(ComponentError, match=r"^environment 'docker': run network policy: allowlist entry 'a b' must be"):
        netpolicy.check(NetworkPolicy("allowlist", ("ok.example", "a b")), "docker", "run network policy")
    with pytest.raises(ComponentError, match=r"^environment 'sandbox' cannot enforce network policy 'proxy'$"):
        netpolicy.check(NetworkPolicy("proxy"), "sandbox", "network policy")


def test_resolve_keeps_literals_and_looks_names_up_once() -> None:
    asked: list[str] = []

    def lookup(host: str) -> list[str]:
        asked.append(host)
        return {"api.example": ["192.0.2.7", "2001:db8::7"], "gone.example": []}[host]

    resolved = netpolicy.resolve(("10.1.2.3:80", "api.example:443"), lookup)
    assert resolved == [netpolicy.Resolved("10.1.2.3", 80, None), netpolicy.Resolved("192.0.2.7", 443, "api.example"),
                        netpolicy.Resolved("2001:db8::7", 443, "api.example")]  # fmt: skip
    assert asked == ["api.example"]
    with pytest.raises(ValueError, match="'gone.example' does not resolve"):
        netpolicy.resolve(("gone.example",), lookup)
    hosts = netpolicy.hosts_file("127.0.0.1 localhost\n", resolved)
    assert hosts.splitlines()[1:] == ["# allowlist of the network policy in force", "192.0.2.7 api.example", "2001:db8::7 api.example"]
    assert netpolicy.hosts_file("127.0.0.1 localhost\n", resolved[:1]) == "127.0.0.1 localhost\n"


# In a fresh network namespace: loopback up, a TCP listener on 127.0.0.1 and
# one on 127.0.0.11 (both loopback), the ruleset from stdin installed, then
# which of the two accept a connection.
_PROBE = textwrap.dedent("""
    import socket, subprocess, sys
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    listeners = {address: socket.create_server((address, 0)) for address in ("127.0.0.1", "127.0.0.11")}
    servers = {address: s.getsockname()[1] for address, s in listeners.items()}
    subprocess.run(["nft", "-f", "-"], input=sys.stdin.buffer.read(), check=True)
    for address, port in servers.items():
        try:
            socket.create_connection((address, port), timeout=5).close(); print(address, "open")
        except ConnectionRefusedError:
            print(address, "refused")
""")


def _probe(ruleset: str) -> dict[str, str]:
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", _PROBE], input=ruleset.encode(),
                          capture_output=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    return dict(line.split() for line in done.stdout.decode().splitlines())


needs_nft = pytest.mark.skipif(
    shutil.which("nft") is None or shutil.which("unshare") is None, reason="needs nft and unshare (make system-deps)"
)


@needs_nft
def test_none_accepts_loopback_but_what_it_is_told_to_refuse() -> None:
    assert _probe(netpolicy.ruleset("none")) == {"127.0.0.1": "open", "127.0.0.11": "open"}
    assert _probe(netpolicy.ruleset("none", refuse=("127.0.0.11",))) == {"127.0.0.1": "open", "127.0.0.11": "refused"}


@needs_nft
def test_every_mode_installs_and_replaces_the_table() -> None:
    resolved = netpolicy.resolve(("192.0.2.1", "[2001:db8::1]:443", "198.51.100.2:53"))
    for mode in ("none", "allowlist", "full"):
        ruleset = netpolicy.ruleset(mode, resolved, refuse=("127.0.0.11", "fd00::53"))
        # Twice: the second replaces the first (the header deletes the table it declares).
        done = subprocess.run(["unshare", "--net", "sh", "-c", 'nft -f - <"$0" && nft -f - <"$0" && nft list ruleset', "/dev/stdin"],
                              input=ruleset.encode(), capture_output=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, (mode, done.stderr.decode())
        listed = done.stdout.decode()
        assert (f"table inet {netpolicy.TABLE}" in listed) == (mode != "full")
        assert ("192.0.2.1" in listed) == (mode == "allowlist") and ("th dport 443" in listed) == (mode == "allowlist")
