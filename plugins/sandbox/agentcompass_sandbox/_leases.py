"""A session's own network, where it has a veth: the lease of its /30
subnet (a file holding the session's name), the veth, and the host's NAT
table shared by every sandbox. Blocking; runs in a worker thread."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from pathlib import Path

from . import _forward, _netlink
from ._paths import LEASE_DIR, LEASES, NFT_HOST_TABLE, SUBNET_PREFIX, HostError, lease_addresses, run, veth_name


def acquire_lease(name: str) -> int:
    """Claim a free /30 for the session (first free slot from a hash of the
    name); the lease file holds the name so ``sweep`` can release it."""
    LEASE_DIR.mkdir(parents=True, exist_ok=True)
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


def release_lease(name: str, index: int) -> None:
    path = f"{LEASE_DIR}/{index}"
    with contextlib.suppress(OSError):
        with open(path) as f:
            owner = f.read()
        if owner == name:
            os.unlink(path)


def release_leases(name: str) -> None:
    if not LEASE_DIR.is_dir():
        return
    for entry in os.scandir(LEASE_DIR):
        with contextlib.suppress(OSError):
            with open(entry.path) as f:
                owner = f.read()
            if owner == name:
                os.unlink(entry.path)


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
    namespace, addresses and default route; NAT for it on the host (and
    forwarding beside Docker's firewall, see :mod:`._forward`)."""
    host_ip, sandbox_ip = lease_addresses(index)
    ensure_nat()
    try:
        _forward.admit(veth_name(name), name)
        _netlink.make_veth(veth_name(name), netns_fd, host_ip, sandbox_ip)
    except OSError as exc:
        raise HostError(f"could not make the sandbox's veth: {exc}") from None


_nat_installed = False


def ensure_nat() -> None:
    """Install the shared host table (once per process; replacing it is atomic
    and idempotent, so concurrent runtimes agree)."""
    global _nat_installed
    if _nat_installed:
        return
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
    """NAT egress needs IPv4 forwarding on the host (left on: other users may rely on it)."""
    path = Path("/proc/sys/net/ipv4/ip_forward")
    with contextlib.suppress(OSError):
        if path.read_text().strip() != "1":
            path.write_text("1")


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
