"""A session's own network, where it has a veth: the lease of its /30
subnet (a file holding the session's name), the veth, and the host's NAT
table shared by every sandbox. Blocking; runs in a worker thread.

The host's side lives exactly as long as some lease does (SPEC 12 "Host
safety"): under one lock, the first lease installs the table and turns on
``net.ipv4.ip_forward`` if it was off (recording that it was), and the
release of the last one deletes the table and puts forwarding back as it
was, whichever process or runtime holds the leases."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from pathlib import Path

from agentcompass.host import FileLock

from . import _forward, _netlink
from ._paths import (
    LEASE_DIR,
    LEASES,
    NFT_HOST_TABLE,
    STATE_ROOT,
    SUBNET_PREFIX,
    HostError,
    lease_addresses,
    run,
    veth_name,
)

#: Held while a lease is taken or released and the host's side follows.
NAT_LOCK = STATE_ROOT / ".nat.lock"
#: The host's ``ip_forward`` before the first lease turned it on (absent: it was on).
FORWARDING_WAS = STATE_ROOT / ".forwarding-was"
_IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def acquire_lease(name: str) -> int:
    """Claim a free /30 for the session (first free slot from a hash of the
    name); the lease file holds the name so ``sweep`` can release it. The
    host's NAT table and forwarding are there once it returns."""
    LEASE_DIR.mkdir(parents=True, exist_ok=True)
    with FileLock.acquire(NAT_LOCK, 0o600):
        first = not _leased()
        index = _claim(name)
        try:
            if first or not _nat_installed:
                ensure_nat()
        except BaseException:
            release_lease(name, index, locked=True)
            raise
        return index


def _claim(name: str) -> int:
    start = int(hashlib.sha1(name.encode()).hexdigest(), 16) % LEASES
    routed = _routed_subnets()
    for step in range(LEASES):
        index = (start + step) % LEASES
        if lease_addresses(index)[0] in routed:
            continue  # a closed session's veth the kernel has not removed yet
        try:
            fd = os.open(LEASE_DIR / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            f.write(name)
        return index
    raise HostError("no free sandbox subnet left in 10.213.0.0/16")


def _routed_subnets() -> set[str]:
    """Host addresses (.1 of each /30) of the sandbox subnets the host still routes."""
    routed = set()
    with contextlib.suppress(OSError), open("/proc/net/route") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if len(fields) > 7 and fields[7] == "FCFFFFFF":  # a /30, little-endian
                octets = bytes.fromhex(fields[1])[::-1]
                if tuple(octets[:2]) == SUBNET_PREFIX:
                    routed.add(f"{octets[0]}.{octets[1]}.{octets[2]}.{octets[3] + 1}")
    return routed


def release_lease(name: str, index: int, *, locked: bool = False) -> None:
    """Release lease ``index`` if ``name`` holds it; the last one takes the host's side with it."""
    with contextlib.nullcontext() if locked else FileLock.acquire(NAT_LOCK, 0o600):
        path = f"{LEASE_DIR}/{index}"
        with contextlib.suppress(OSError):
            with open(path) as f:
                owner = f.read()
            if owner == name:
                os.unlink(path)
        _after_release()


def release_leases(name: str) -> None:
    """Release every lease ``name`` holds (``sweep``, a close that lost its number)."""
    if not LEASE_DIR.is_dir():
        return
    with FileLock.acquire(NAT_LOCK, 0o600):
        for entry in os.scandir(LEASE_DIR):
            with contextlib.suppress(OSError):
                with open(entry.path) as f:
                    owner = f.read()
                if owner == name:
                    os.unlink(entry.path)
        _after_release()


def _leased() -> bool:
    if not LEASE_DIR.is_dir():
        return False
    with os.scandir(LEASE_DIR) as entries:
        return any(True for _ in entries)


def _after_release() -> None:
    """Under the lock: with no lease left, the table goes and forwarding is put back."""
    global _nat_installed
    if _leased():
        return
    with contextlib.suppress(HostError):
        run(["nft", "-f", "-"], input=f"table ip {NFT_HOST_TABLE}\ndelete table ip {NFT_HOST_TABLE}\n".encode())
    _nat_installed = False
    with contextlib.suppress(FileNotFoundError):
        was = FORWARDING_WAS.read_text().strip()
        if was in ("0", "1"):
            with contextlib.suppress(OSError):
                _IP_FORWARD.write_text(was)
        FORWARDING_WAS.unlink()


def leases_with_prefix(tag: str) -> set[str]:
    names: set[str] = set()
    if LEASE_DIR.is_dir():
        for entry in os.scandir(LEASE_DIR):
            with contextlib.suppress(OSError), open(entry.path) as f:
                owner = f.read()
            if owner.startswith(tag):
                names.add(owner)
    return names


def make_veth(name: str, netns_fd: int, index: int) -> None:
    """A veth pair: host end ``veth_name(name)``, ``eth0`` in the sandbox's
    namespace, addresses and default route (the lease brought NAT for it on
    the host), and forwarding beside Docker's firewall (:mod:`._forward`)."""
    host_ip, sandbox_ip = lease_addresses(index)
    try:
        _forward.admit(veth_name(name), name)
        _netlink.make_veth(veth_name(name), netns_fd, host_ip, sandbox_ip)
    except OSError as exc:
        raise HostError(f"could not make the sandbox's veth: {exc}") from None


_nat_installed = False


def ensure_nat() -> None:
    """Under the lock: install the shared host table (replacing it is atomic
    and idempotent) and turn on forwarding."""
    global _nat_installed
    a, b = SUBNET_PREFIX
    run(
        ["nft", "-f", "-"],
        input=(
            f"table ip {NFT_HOST_TABLE}\ndelete table ip {NFT_HOST_TABLE}\n"
            f"table ip {NFT_HOST_TABLE} {{\n"
            "  chain post { type nat hook postrouting priority srcnat; "
            f'ip saddr {a}.{b}.0.0/16 oifname != "ac*" masquerade; }}\n'
            "  chain forwarding { type filter hook forward priority filter; "
            'iifname "ac*" accept; oifname "ac*" ct state established,related accept; }\n'
            "}\n"
        ).encode(),
    )
    enable_forwarding()
    _nat_installed = True


def enable_forwarding() -> None:
    """NAT egress needs IPv4 forwarding on the host: turned on if it was
    off, and that recorded (once) so the last lease's release turns it off."""
    with contextlib.suppress(OSError):
        if _IP_FORWARD.read_text().strip() != "1":
            if not FORWARDING_WAS.exists():
                FORWARDING_WAS.write_text("0")
            _IP_FORWARD.write_text("1")


def apply_ruleset_in(netns_fd: int, ruleset: str) -> None:
    """``nft -f`` in the network namespace ``netns_fd`` holds (run from a
    thread inside it: a child is born in its parent thread's namespace)."""
    _netlink.in_namespace_fd(netns_fd, lambda: run(["nft", "-f", "-"], input=ruleset.encode()))


def remove_network(name: str, lease: int | None) -> None:
    """Delete the veth (both ends go; the kernel would remove it with the
    namespace, but later and in the background, so close would have to
    watch for it) and its forwarding rules, then release the lease."""
    try:
        _netlink.delete_link(veth_name(name))
    except OSError as exc:
        if exc.errno != errno.ENODEV:  # gone with its namespace already
            raise HostError(f"could not delete the veth of sandbox {name}: {exc}") from None
    _forward.remove(veth_name(name), name)
    if lease is not None:
        release_lease(name, lease)
    else:
        release_leases(name)
