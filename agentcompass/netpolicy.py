"""Network policies as nftables rulesets: for environment providers whose
sessions have a network namespace of their own (the ``sandbox`` and
``docker`` plugins use it; SPEC 3 ``NetworkPolicy``).

``none`` rejects everything but loopback; ``allowlist`` accepts only the
listed addresses (and ports) plus replies to connections the session opened;
a forbidden connection is refused at once (TCP reset, ICMP prohibited), so
an agent sees an error rather than a hang; ``full`` removes the table.

A provider checks each ``allowlist`` entry at config time with
:func:`parse_allow`, resolves the entries when the policy is applied with
:func:`resolve` (blocking: call it in a worker thread; names are looked up
once, on the host, and not followed later: switch the policy again to
re-resolve), and installs :func:`ruleset`'s output with ``nft -f -`` inside
the session's namespace. :func:`hosts_file` gives a session's
``/etc/hosts`` the allowlisted names, so they resolve inside where DNS is
not reachable.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

import attrs

from .runtime import ComponentError, NetworkPolicy

#: The nftables table (family ``inet``) the rulesets install.
TABLE = "agentcompass"


__all__ = ["TABLE", "AllowEntry", "Resolved", "check", "hosts_file", "lookup", "parse_allow", "resolve", "ruleset"]


@attrs.frozen
class AllowEntry:
    """An ``allowlist`` entry: a host name or address, and a port or None (any)."""

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
    elif entry.count(":") > 1:  # a bare IPv6 address
        try:
            ipaddress.IPv6Address(entry)
        except ValueError as exc:
            raise ValueError(f"allowlist entry {entry!r}: {exc}") from None
    if not host:
        raise ValueError(f"allowlist entry {entry!r} has no host")
    return AllowEntry(host, port)


def check(policy: NetworkPolicy, provider: str, where: str) -> None:
    """Config-time check of ``policy`` for environment ``provider``: a mode
    this module enforces and allowlist entries that parse; else
    ``ComponentError`` naming ``where`` (``"network policy"``, say)."""
    if policy.mode not in ("none", "allowlist", "full"):
        raise ComponentError(f"environment {provider!r} cannot enforce {where} {policy.mode!r}")
    if policy.mode == "allowlist":
        for entry in policy.allow:
            try:
                parse_allow(entry)
            except ValueError as exc:
                raise ComponentError(f"environment {provider!r}: {where}: {exc}") from None


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
    """An allowed address (and port, None for any)."""

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


def hosts_file(base: str, resolved: list[Resolved]) -> str:
    """``/etc/hosts`` for a session: ``base`` (the host's, say), plus each allowlisted name
    with the addresses it was allowed at, so names resolve inside without DNS."""
    lines = sorted({f"{r.address} {r.name}" for r in resolved if r.name is not None})
    if not lines:
        return base
    return base.rstrip("\n") + "\n# allowlist of the network policy in force\n" + "\n".join(lines) + "\n"


def _header() -> str:
    # Declaring then deleting makes the replacement atomic and idempotent.
    return f"table inet {TABLE}\ndelete table inet {TABLE}\n"


def ruleset(mode: str, resolved: list[Resolved] | None = None, *, refuse: tuple[str, ...] = ()) -> str:
    """The ``nft -f`` script that installs ``mode`` (``none``, ``allowlist``
    with ``resolved``, or ``full``), replacing the previous one.

    ``refuse``: addresses rejected under ``none`` and ``allowlist`` before
    loopback is accepted, for a loopback address that forwards outside the
    namespace (Docker's embedded DNS server at 127.0.0.11)."""
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
    refused = [f"{'ip6' if ':' in a else 'ip'} daddr {a} meta l4proto {{ tcp, udp }} reject" for a in refuse]
    out_rules = "\n    ".join([*refused, 'oif "lo" accept', *rules, *reject])
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
