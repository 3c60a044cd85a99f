"""What the host's network looks like, to show a test changed nothing it did
not make (SPEC 12 "Host safety"): its interfaces, ``docker0`` (made here when
the host has none, so there is one to lose), and its firewall rules."""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import subprocess
from collections.abc import Iterator

#: The sandbox's shared host table: there while any sandbox of the machine has
#: egress (a sandbox test on another worker, say); gone with the last one.
_SHARED_TABLES = {"table ip agentcompass_sandbox"}
IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"
_COUNTERS = re.compile(r"\[\d+:\d+\]")


def _out(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        return ""
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def firewall(*, whole: bool = False) -> str:
    """Every iptables, ip6tables and nftables rule of the host, packet counters
    left out. Unless ``whole``, also the sandbox's shared table, which a sandbox
    test running beside may hold; ``whole`` (for a test no other runs beside)
    has it and ``net.ipv4.ip_forward`` too."""
    text = [f"ip_forward={ip_forward()}"] if whole else []
    for save in ("iptables-save", "ip6tables-save"):
        text += [_COUNTERS.sub("", line) for line in _out(save).splitlines() if line and not line.startswith("#")]
    tables = [line for line in _out("nft", "list", "tables").splitlines() if whole or line not in _SHARED_TABLES]
    for table in tables:
        text += _out("nft", "-s", "list", *table.split()).splitlines()
    return "\n".join(text)


def ip_forward() -> str:
    with open(IP_FORWARD) as file:
        return file.read().strip()


@contextlib.contextmanager
def forwarding_off() -> Iterator[None]:
    """The host as one that forwards nothing, for the body; then as it was."""
    was = ip_forward()
    with open(IP_FORWARD, "w") as file:
        file.write("0")
    try:
        yield
    finally:
        with open(IP_FORWARD, "w") as file:
            file.write(was)


def addresses(link: str) -> list[str]:
    """The addresses of ``link`` (``ip -o addr`` fields), none if it is absent."""
    lines = _out("ip", "-o", "addr", "show", "dev", link).splitlines()
    return sorted(line.split()[3] for line in lines if len(line.split()) > 3)


def exists(link: str) -> bool:
    return subprocess.run(["ip", "link", "show", link], capture_output=True, check=False).returncode == 0


def free_prefix() -> str:
    """A ``10.x`` (x in 100-159) that no address or route of this host is in."""
    used = _out("ip", "-o", "route") + _out("ip", "-o", "addr")
    for x in random.sample(range(100, 160), 60):
        if f"10.{x}." not in used:
            return f"10.{x}"
    raise RuntimeError("no free 10.x.0.0/16 for a test's own addresses")


def _free_subnet() -> str:
    used = _out("ip", "-o", "route") + _out("ip", "-o", "addr")
    return "172.17.0.1/16" if "172.17." not in used else f"{free_prefix()}.0.1/24"


@contextlib.contextmanager
def docker0() -> Iterator[list[str]]:
    """A ``docker0`` bridge with an address for the block: the host's if it has
    one (untouched), else one made here and deleted after. Yields its addresses."""
    made = False
    if not exists("docker0"):
        subprocess.run(["ip", "link", "add", "docker0", "type", "bridge"], check=True)
        made = True
        subprocess.run(["ip", "addr", "add", _free_subnet(), "dev", "docker0"], check=True)
    try:
        yield addresses("docker0")
    finally:
        if made:
            subprocess.run(["ip", "link", "del", "docker0"], capture_output=True, check=False)
