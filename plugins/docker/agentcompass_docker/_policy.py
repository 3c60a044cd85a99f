"""Network policies as nftables rulesets in a container's network namespace.

The rules are those of the ``sandbox`` provider (``agentcompass_sandbox``
keeps them private, so the few functions are repeated here): ``none`` and
``allowlist`` reject everything but loopback and, for ``allowlist``, the
listed addresses (and ports) plus replies; a forbidden connection is refused
at once (TCP reset, ICMP prohibited). Docker's embedded DNS server listens on
the container's loopback at 127.0.0.11 and forwards from the daemon, outside
the rules: both rulesets reject it, so names are not resolved inside (an
allowlisted name is allowed at the addresses it had on the host when the
policy was applied). ``full`` removes the table.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

import attrs

TABLE = "agentcompass"
#: Where Docker's embedded DNS answers inside a container on a user-defined network.
EMBEDDED_DNS = "127.0.0.11"


@attrs.frozen
class AllowEntry:
    host: str
    port: int | None


def parse_allow(entry: str) -> AllowEntry:
    """Parse ``host``, ``host:port``, ``[v6]:port`` or an address; raise ``ValueError``."""
    if not isinstance(entry, str) or not entry or any(c.isspace() for c in entry):
        raise ValueError(f"allowlist entry {entry!r} must be host or host:port")
    host, port = entry, None
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"allowlist entry {entry!r}: unclosed '['")
        host, rest = entry[1:close], entry[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"allowlist entry {entry!r} must be [address]:port")
            port = _port(rest[1:], entry)
    elif entry.count(":") == 1:
        host, raw = entry.split(":")
        port = _port(raw, entry)
    elif entry.count(":") > 1:
        ipaddress.IPv6Address(entry)  # a bare IPv6 address
    if not host:
        raise ValueError(f"allowlist entry {entry!r} has no host")
    return AllowEntry(host, port)


def _port(raw: str, entry: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"allowlist entry {entry!r}: port must be 1-65535")
    return int(raw)


def lookup(host: str) -> list[str]:
    """Blocking: the addresses ``host`` resolves to on the host, now."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise ValueError(f"allowlist host {host!r} does not resolve: {exc}") from None
    return sorted({str(info[4][0]) for info in infos})


@attrs.frozen
class Resolved:
    address: str
    port: int | None
    name: str | None  # the host name it came from (None for an address literal)


def resolve(entries: tuple[str, ...], lookup: Callable[[str], list[str]] = lookup) -> list[Resolved]:
    """Blocking: every entry's addresses, names looked up now."""
    resolved: list[Resolved] = []
    for raw in entries:
        entry = parse_allow(raw)
        try:
            resolved.append(Resolved(str(ipaddress.ip_address(entry.host)), entry.port, None))
        except ValueError:
            addresses = lookup(entry.host)
            if not addresses:
                raise ValueError(f"allowlist host {entry.host!r} does not resolve") from None
            resolved.extend(Resolved(a, entry.port, entry.host) for a in addresses)
    return resolved


def _header() -> str:
    # Declaring then deleting makes the replacement atomic and idempotent.
    return f"table inet {TABLE}\ndelete table inet {TABLE}\n"


def ruleset(mode: str, resolved: list[Resolved] | None = None) -> str:
    """The ``nft -f`` script that installs ``mode`` (replacing the previous one)."""
    if mode == "full":
        return _header()
    rules = []
    if mode == "allowlist":
        for r in resolved or []:
            family = "ip6" if ":" in r.address else "ip"
            if r.port is None:
                rules.append(f"{family} daddr {r.address} accept")
            else:
                rules.append(f"{family} daddr {r.address} meta l4proto {{ tcp, udp }} th dport {r.port} accept")
    # Reject rather than drop: a forbidden connection fails at once instead of hanging.
    reject = ["meta l4proto tcp reject with tcp reset", "reject with icmpx admin-prohibited"]
    dns = f"ip daddr {EMBEDDED_DNS} meta l4proto {{ tcp, udp }} reject"
    out_rules = "\n    ".join([dns, 'oif "lo" accept', *rules, *reject])
    in_rules = 'iif "lo" accept'
    if mode == "allowlist":
        in_rules += "\n    ct state established,related accept"
    return (
        _header()
        + f"table inet {TABLE} {{\n"
        + "  chain output {\n    type filter hook output priority 0; policy drop;\n"
        + f"    {out_rules}\n  }}\n"
        + "  chain input {\n    type filter hook input priority 0; policy drop;\n"
        + f"    {in_rules}\n  }}\n"
        + "}\n"
    )
