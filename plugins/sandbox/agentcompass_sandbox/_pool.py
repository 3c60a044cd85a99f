"""Network namespaces made ahead and reused, with a veth or with loopback only.

Making a veth is quick, but deleting one waits in the kernel (an RCU
barrier under the host-wide rtnetlink lock), and so does tearing down a
namespace that holds one: every session would pay for it at ``close``, and
the next ``open`` would wait behind it. Instead a session borrows a
namespace from its runtime's pool (the spawner starts bwrap inside it,
rather than bwrap making one) and gives it back at ``close``, once every
process of the session is dead. A namespace is made the first time none is
free, and is reused from then on: open and close make and delete no link.
Sessions opened under ``full`` or ``allowlist`` borrow one with a veth
(addresses, default route, host NAT, and accept rules in Docker's
``DOCKER-USER`` chain where it exists, see :mod:`._forward`), under
``none`` one with loopback only.

Each pooled namespace is held by a descriptor of the runtime process (opened
close-on-exec), not by a bind mount: when the runtime exits, however it
exits, the kernel removes the namespace once the sandboxes in it are dead
(the spawner's exit kills them), and its veth with it. Its subnet lease is
owned by ``@pool-<pid>-<start time>-<n>`` (no session name starts with
``@``), which :func:`reclaim_stale_leases` releases once that process is gone.

Isolation: a pooled namespace belongs to the host's initial user namespace,
so no process of a sandbox (uid 1000 of the sandbox's own user namespace)
has ``CAP_NET_ADMIN`` over it: it cannot change its interfaces, addresses,
routes, sysctls or nftables rules. What a session can leave behind is
sockets (closed once its processes are dead, but for TCP connections still
closing; ``TIME_WAIT`` is off in pooled namespaces) and the rules and
connection-tracking entries the runtime installed for its policies.
Recycling (:meth:`Pool.give_back`) removes every nftables table and every
conntrack entry where a policy installed rules, then checks that the
namespace has the interfaces it was made with, no nftables table and no
socket; if anything is left, or anything fails, the namespace is destroyed
instead of reused.

The pool lives as long as the Trio run that first used it: a system task
empties it (:meth:`Pool.drain`) when the run's main task ends, within the
cleanup grace.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import subprocess
import threading
import time

import attrs
import trio

from agentcompass.runtime import cleanup_deadline

from . import _forward, _host, _netlink

#: Free namespaces kept for reuse at most; more are destroyed when given back.
IDLE_MAX = 64
_DRAIN_PAUSE = 0.005
#: Lease owners of pooled namespaces start with this (session names cannot).
LEASE_OWNER_PREFIX = "@pool-"


# Numbers pooled namespaces across every pool of the process: a destroyed
# one's veth may outlive its pool for a moment, and names must not clash.
_numbers = itertools.count()


class RecycleError(_host.HostError):
    """A pooled namespace is not as a new one would be: it is destroyed, not reused."""


@attrs.define(eq=False)
class Netns:
    """One pooled namespace: the descriptor that holds it, its lease and veth."""

    fd: int
    probe: _netlink.Probe
    owner: str
    lease: int | None  # None: loopback only, no veth
    links: int = 0  # interfaces it was made with (loopback, and eth0 with a veth)
    admitted: bool = False  # whether its veth has rules in DOCKER-USER

    def close(self) -> None:
        """Let the namespace go (the kernel removes it once nothing else holds it)."""
        self.probe.close()
        os.close(self.fd)

    @property
    def veth(self) -> str | None:
        return None if self.lease is None else _host.veth_name(self.owner)


def _start_time(pid: int) -> str:
    """The start time of process ``pid`` (clock ticks since boot), '' if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()


def _stale(owner: str) -> bool:
    """Whether ``owner`` names a pool of a process that is gone."""
    if not owner.startswith(LEASE_OWNER_PREFIX):
        return False
    pid, start, _n = owner[len(LEASE_OWNER_PREFIX) :].split("-")
    return _start_time(int(pid)) != start


def reclaim_stale_leases() -> None:
    """Release the leases, and remove the forwarding rules, of pooled
    namespaces whose process is gone (blocking)."""
    for owner, veths in _forward.owners().items():
        with contextlib.suppress(ValueError):
            if _stale(owner):
                for veth in veths:
                    _forward.remove(veth, owner)
    if not _host.LEASE_DIR.is_dir():
        return
    for entry in os.scandir(_host.LEASE_DIR):
        with contextlib.suppress(OSError, ValueError):
            with open(entry.path) as f:
                owner = f.read()
            if _stale(owner):
                os.unlink(entry.path)


class Pool:
    """The namespaces of one runtime, free or lent; every method blocks."""

    def __init__(self, veth: bool, idle_max: int = IDLE_MAX) -> None:
        self.veth = veth
        self.idle_max = idle_max
        self._lock = threading.Lock()
        self._idle: list[Netns] = []
        self._lent: set[Netns] = set()
        self._owner = f"{LEASE_OWNER_PREFIX}{os.getpid()}-{_start_time(os.getpid())}-"
        self._closed = False
        self._reclaimed = False
        #: Namespaces made, lent again after a close, and destroyed so far.
        self.made = 0
        self.recycled = 0
        self.destroyed = 0

    def take(self) -> Netns:
        """A free namespace, made now if none is."""
        with self._lock:
            if self._closed:
                raise _host.HostError("the sandbox network pool is closed (the run is ending)")
            if self._idle:
                entry = self._idle.pop()
                self._lent.add(entry)
                return entry
            if self.veth and not self._reclaimed:
                reclaim_stale_leases()
                self._reclaimed = True
            owner = f"{self._owner}{next(_numbers)}"
        entry = _make(owner) if self.veth else _make_bare(owner)
        with self._lock:
            self.made += 1
            closed = self._closed
            if not closed:
                self._lent.add(entry)
        if closed:
            self._destroy(entry)
            raise _host.HostError("the sandbox network pool is closed (the run is ending)")
        return entry

    def give_back(self, entry: Netns, ruleset_applied: bool) -> bool:
        """Return ``entry`` once its session's processes are all dead. Reset
        and checked, it is free again (True); if it is not as new, or the
        reset fails, it is destroyed instead (False). An entry :meth:`drain`
        took already is left alone."""
        with self._lock:
            if entry not in self._lent:
                return False
        try:
            _reset(entry, ruleset_applied)
        except (OSError, _host.HostError):
            self.discard(entry)
            return False
        except BaseException:
            self.discard(entry)
            raise
        with self._lock:
            if entry not in self._lent:
                return False
            if not self._closed and len(self._idle) < self.idle_max:
                self._lent.discard(entry)
                self._idle.append(entry)
                self.recycled += 1
                return True
        self.discard(entry)
        return False

    def discard(self, entry: Netns) -> None:
        """Destroy a lent ``entry`` (unless :meth:`drain` took it already)."""
        with self._lock:
            if entry not in self._lent:
                return
            self._lent.discard(entry)
            self.destroyed += 1
        self._destroy(entry)

    @staticmethod
    def _destroy(entry: Netns) -> None:
        """Close the entry's descriptors (the kernel removes the namespace and
        the veth in the background; its subnet is not leased again while the
        host still routes it) and release its lease."""
        entry.close()
        _unadmit(entry)
        if entry.lease is not None:
            _host.release_lease(entry.owner, entry.lease)

    def drain(self, seconds: float = 10.0) -> None:
        """Destroy every namespace, free or lent, and wait (at most
        ``seconds``) until the kernel has removed their veths; later calls of
        :meth:`take` fail. Free namespaces are let go all at once, so the
        kernel tears them down together, paying for one RCU barrier rather
        than one per veth; the veth of a lent one (its session was never
        closed, so processes may hold the namespace) is deleted here."""
        with self._lock:
            self._closed = True
            idle, lent = list(self._idle), list(self._lent)
            self._idle.clear()
            self._lent.clear()
        going = set()
        for entry in [*idle, *lent]:
            if entry.veth is not None:
                if entry in lent:
                    with contextlib.suppress(OSError):
                        _netlink.delete_link(entry.veth)
                else:
                    going.add(entry.veth)
            entry.close()
        with self._lock:
            self.destroyed += len(idle) + len(lent)
        deadline = time.monotonic() + seconds
        while going and time.monotonic() < deadline:
            going = {veth for veth in going if os.path.exists(f"/sys/class/net/{veth}")}
            if going:
                time.sleep(_DRAIN_PAUSE)
        for entry in [*idle, *lent]:
            _unadmit(entry)
            if entry.lease is not None:
                _host.release_lease(entry.owner, entry.lease)
        if going:
            raise _host.HostError(f"{len(going)} veth(s) of the sandbox network pool are still there after {seconds} s")


def _make(owner: str) -> Netns:
    """A new namespace with its veth, addresses, default route and host NAT."""
    _host.ensure_nat()
    lease = _host.acquire_lease(owner)
    veth = _host.veth_name(owner)
    try:
        admitted = _forward.admit(veth, owner)
        host_ip, sandbox_ip = _host.lease_addresses(lease)
        fd, probe = _netlink.make_namespace(veth, host_ip, sandbox_ip)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            _netlink.delete_link(veth)
        _forward.remove(veth, owner)
        _host.release_lease(owner, lease)
        if isinstance(exc, OSError):
            raise _host.HostError(f"could not make a pooled network namespace: {exc}") from None
        raise
    return Netns(fd, probe, owner, lease, links=2, admitted=admitted)


def _unadmit(entry: Netns) -> None:
    """Remove the entry's forwarding rules, if it has any (blocking)."""
    if entry.admitted and entry.veth is not None:
        _forward.remove(entry.veth, entry.owner)
        entry.admitted = False


def _make_bare(owner: str) -> Netns:
    """A new namespace with loopback only."""
    try:
        fd, probe = _netlink.make_namespace()
    except OSError as exc:
        raise _host.HostError(f"could not make a pooled network namespace: {exc}") from None
    return Netns(fd, probe, owner, None, links=1)


def _reset(entry: Netns, ruleset_applied: bool) -> None:
    """Back to the state the namespace was made in, or :class:`RecycleError`."""
    probe = entry.probe
    if ruleset_applied:
        _netlink.in_namespace_fd(entry.fd, _flush_ruleset)
        probe.flush_conntrack()
    links = probe.links()
    if links != entry.links:
        raise RecycleError(f"{links} network interfaces, made with {entry.links}")
    tables = probe.nft_tables()
    if tables:
        raise RecycleError(f"{tables} nftables table(s) left")
    # inet sockets by their per-namespace counters (the /proc/net/tcp
    # listings walk the host-wide hash tables: milliseconds each), the
    # others by their listings, which are per namespace.
    for table in ("sockstat", "sockstat6"):
        for line in probe.read(table).decode().splitlines():
            proto, _, fields = line.partition(":")
            words = fields.split()
            counts = dict(zip(words[::2], words[1::2], strict=False))
            for key in ("inuse", "tw"):
                if counts.get(key, "0") != "0" and not proto.startswith("FRAG"):
                    raise RecycleError(f"{proto} {key} {counts[key]}: sockets left")
    for table in ("unix", "packet"):
        lines = probe.read(table).count(b"\n")
        if lines > 1:
            raise RecycleError(f"{lines - 1} {table} socket(s) left")


def _flush_ruleset() -> None:
    """In a thread inside the namespace: ``nft flush ruleset`` (a child is
    born in its parent thread's network namespace)."""
    proc = subprocess.run(["nft", "flush ruleset"], capture_output=True, check=False)
    if proc.returncode != 0:
        raise RecycleError(f"nft flush ruleset failed: {proc.stderr.decode(errors='replace').strip()}")


_pools: trio.lowlevel.RunVar[dict[bool, Pool]] = trio.lowlevel.RunVar("agentcompass_sandbox_netns_pools")


def current(veth: bool) -> Pool:
    """This Trio run's pool of namespaces with a veth (or with loopback
    only), made at the first call with the task that drains it when the
    run ends."""
    try:
        pools = _pools.get()
    except LookupError:
        pools = {}
        _pools.set(pools)
    if veth not in pools:
        pools[veth] = Pool(veth)
        trio.lowlevel.spawn_system_task(_drain_at_exit, pools[veth], name="sandbox network pool")
    return pools[veth]


async def _drain_at_exit(pool: Pool) -> None:
    try:
        await trio.sleep_forever()
    finally:
        deadline = cleanup_deadline()
        with trio.move_on_at(deadline, shield=True):
            try:
                await trio.to_thread.run_sync(pool.drain, max(0.0, deadline - trio.current_time()))
            except (OSError, _host.HostError) as exc:
                # A system task must not raise; what is left goes with the process.
                logging.getLogger("agentcompass_sandbox").warning("sandbox network pool: %s", exc)
