"""A ``sandbox`` session's network policy (a mixin of
:class:`._session.SandboxSession`): rules in its namespace, its own
/etc/hosts for allowlisted names, a veth with a leased subnet once a policy
needs egress, and, over an image under ``none``, ``eth0`` parked away."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from agentcompass import NetworkPolicy, netpolicy

from . import _host, _netlink, _pool
from ._exec import fail
from ._images import ImageRoot


class SessionNetwork:
    """The network half of a session; the session's constructor sets the state."""

    name: str
    _dir: Path
    _image: ImageRoot | None
    _lookup: Callable[[str], list[str]]
    _netns: _pool.Netns | None
    _own_netns: int | None
    _lease: int | None
    _ruleset: bool
    _ruleset_applied: bool
    _hosts_extended: bool
    _policy: NetworkPolicy | None
    _parking: int | None
    _parked: bool

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        """Switch the policy live; processes keep running and the new rules
        apply to their next packet (a connection the new policy forbids stops
        working). ``allowlist`` names are resolved now, on the host."""
        self._check_open()
        try:
            if policy.mode not in ("none", "allowlist", "full"):
                raise ValueError(f"unknown network policy {policy.mode!r}")
            resolved: list[netpolicy.Resolved] = []
            if policy.mode == "allowlist":
                resolved = await trio.to_thread.run_sync(netpolicy.resolve, tuple(policy.allow), self._lookup)
            if resolved or self._hosts_extended:
                await trio.to_thread.run_sync(self._write_hosts, resolved)
                self._hosts_extended = any(r.name is not None for r in resolved)
            # Restrict before connecting: rules go in before a veth is made, so a
            # failure part-way never leaves the sandbox with more access than asked.
            if policy.mode != "full" and (policy.mode == "allowlist" or self._lease is not None or self._ruleset):
                self._ruleset_applied = True
                await trio.to_thread.run_sync(self._apply_ruleset, netpolicy.ruleset(policy.mode, resolved))
                self._ruleset = True
            if policy.mode != "none" and self._lease is None:
                # A pooled namespace without a veth is lent under none only.
                await trio.to_thread.run_sync(self._make_network, self._net_fd())
            if policy.mode == "full" and self._ruleset:
                await trio.to_thread.run_sync(self._apply_ruleset, netpolicy.ruleset("full"))
                self._ruleset = False
            if self._image is not None and self._lease is not None and (policy.mode == "none") != self._parked:
                await trio.to_thread.run_sync(self._park if policy.mode == "none" else self._unpark)
        except (OSError, ValueError, _host.HostError) as exc:
            raise fail(f"sandbox {self.name}: could not apply network policy {policy.mode!r}: {exc}") from None
        self._policy = policy

    def _park(self) -> None:
        """Blocking: under ``none``, an image session sees loopback only, as in
        a container without a network: its ``eth0`` waits in a namespace of
        its own (made once) until a policy with egress brings it back. The
        rules of ``none`` are in place first, so nothing leaves meanwhile."""
        if self._parking is None:
            self._parking, probe = _netlink.make_namespace()
            probe.close()
        _netlink.move_link(self._net_fd(), "eth0", self._parking)
        self._parked = True

    def _unpark(self) -> None:
        """Blocking: ``eth0`` back in the session's namespace, configured as it was made."""
        assert self._parking is not None and self._lease is not None
        _netlink.move_link(self._parking, "eth0", self._net_fd())
        self._parked = False
        host_ip, sandbox_ip = _host.lease_addresses(self._lease)
        _netlink.configure_inside(self._net_fd(), sandbox_ip, host_ip)

    def _apply_ruleset(self, ruleset: str) -> None:
        """Blocking: ``nft -f`` in the session's network namespace (a pooled
        one through its descriptor, so even before the sandbox starts)."""
        _host.apply_ruleset_in(self._net_fd(), ruleset)

    def _net_fd(self) -> int:
        """The session's network namespace: the pool's, or its init's own."""
        fd = self._own_netns if self._netns is None else self._netns.fd
        if fd is None:
            raise _host.HostError("the sandbox has no network namespace (it has not started)")
        return fd

    def _write_hosts(self, resolved: list[netpolicy.Resolved]) -> None:
        """Blocking: rewrite the sandbox's /etc/hosts in place (it is bind-mounted by inode)."""
        path = self._dir / "hosts"
        if not path.exists():
            return
        text = netpolicy.hosts_file(_host.host_hosts(), resolved)
        with open(path, "r+") as f:
            if f.read() != text:
                f.seek(0)
                f.write(text)
                f.truncate()

    def _make_network(self, netns_fd: int) -> None:
        """Blocking: lease a subnet (recorded in the marker first, so teardown
        finds it) and make the veth."""
        marker = {**_host.read_marker(self.name), "network": True}
        _host.write_marker(self.name, marker)  # before the lease: teardown then looks for it by name
        lease = _host.acquire_lease(self.name)
        self._lease = lease
        _host.write_marker(self.name, {**marker, "lease": lease})
        _host.make_veth(self.name, netns_fd, lease)

    @property
    def addresses(self) -> tuple[str, str] | None:
        """(host end, sandbox end) IPv4 addresses of the veth, once one exists."""
        return None if self._lease is None else _host.lease_addresses(self._lease)
