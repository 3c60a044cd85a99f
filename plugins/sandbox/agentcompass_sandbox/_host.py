"""Blocking host-side helpers: the state directory, cgroups, veths, leases, teardown.

Every resource of a session carries its name: the state directory
``<STATE_ROOT>/<name>``, the cgroup ``.../agentcompass-sandbox/<name>`` of each
hierarchy used, and, where the session made a veth of its own (opened
offline, then given egress), the lease file of its subnet (which holds the
name) and the host end of the veth, ``ac`` + 12 hex digits of the name's
SHA-1 (IFNAMSIZ allows 15 characters). Network namespaces, and the veths
made with them, belong to the runtime's pool (:mod:`._pool`). :func:`destroy` removes all of them given only the
name, which is what ``close``, ``reap`` and ``sweep`` share. The one shared
resource is the host nftables table ``agentcompass_sandbox`` (NAT and
forwarding for every ``ac*`` veth), installed when a sandbox first needs
egress and left in place: it carries no session and matches nothing once
the sandboxes are gone. Where Docker's firewall drops forwarded packets,
each veth that needs egress also has accept rules of its own in Docker's
``DOCKER-USER`` chain (:mod:`._forward`), removed with the veth.

The parts, one concept each: :mod:`._paths` (names, constants, host
commands), :mod:`._statedir` (the state directory and its marker),
:mod:`._mounts` (image roots, sysfs, exposures), :mod:`._cgroups` and
:mod:`._leases` (the subnet leases, veths and the host table); this module
re-exports them for the session and the provider and keeps what needs them
all: :func:`destroy` and :func:`names_with_prefix`. Everything here blocks
and runs in a worker thread.
"""

from __future__ import annotations

import os

from . import _forward
from ._cgroups import (
    cgroup_bases,
    exec_cgroup,
    find_cgroup_bases,
    kill_cgroup,
    make_cgroups,
    remove_cgroup,
    try_remove_cgroup,
)
from ._leases import (
    acquire_lease,
    apply_ruleset_in,
    enable_forwarding,
    ensure_nat,
    leases_with_prefix,
    make_veth,
    release_lease,
    release_leases,
    remove_network,
)
from ._mounts import expose, make_harbor_dirs, make_image_root, mount_sysfs
from ._paths import (
    CGROUP_GROUP,
    EXPOSED,
    EXPOSED_INSIDE,
    FILES,
    HOST_UID,
    IMAGE,
    INSIDE_UID,
    LEASE_DIR,
    LEASES,
    MARKER,
    NAME_RE,
    NFT_HOST_TABLE,
    ROOT,
    STAGE,
    STATE_ROOT,
    SUBDIRS,
    SUBNET_PREFIX,
    SYS,
    UPPER,
    USERLAND,
    HostError,
    SessionExists,
    files_dir,
    lease_addresses,
    run,
    session_dir,
    veth_name,
)
from ._statedir import ensure_state_root, host_hosts, make_session_dir, read_marker, remove_session_dir, write_marker

__all__ = [
    "CGROUP_GROUP", "EXPOSED", "EXPOSED_INSIDE", "FILES", "HOST_UID", "IMAGE", "INSIDE_UID", "LEASES", "LEASE_DIR",
    "MARKER", "NAME_RE", "NFT_HOST_TABLE", "ROOT", "STAGE", "STATE_ROOT", "SUBDIRS", "SUBNET_PREFIX", "SYS", "UPPER",
    "USERLAND", "HostError", "SessionExists", "acquire_lease", "apply_ruleset_in", "cgroup_bases", "destroy",
    "enable_forwarding", "ensure_nat", "ensure_state_root", "exec_cgroup", "expose", "files_dir",
    "find_cgroup_bases", "host_hosts", "kill_cgroup", "lease_addresses", "leases_with_prefix", "make_cgroups",
    "make_harbor_dirs", "make_image_root", "make_session_dir", "make_veth", "mount_sysfs", "names_with_prefix",
    "read_marker", "release_lease", "release_leases", "remove_cgroup", "remove_network", "remove_session_dir", "run",
    "session_dir", "try_remove_cgroup", "veth_name", "write_marker",
]  # fmt: skip


def destroy(name: str) -> None:
    """Remove every resource of session ``name``: its processes, cgroups,
    veth, host NAT table, lease and state directory. Idempotent; the marker
    is removed last so an interrupted teardown can be finished later."""
    marker = read_marker(name)
    bases = cgroup_bases()
    # Every process of the session, bwrap included, is in its cgroups:
    # all are killed before any is removed.
    paths = sorted({f"{base}/{name}" for base in bases.values()})
    if len(paths) > 1:
        for path in paths:
            kill_cgroup(path, remove=False)
    for path in paths:
        kill_cgroup(path, remove=True)
    # Without a marker (a half-made session) look for a lease by name.
    if marker.get("network", not marker):
        lease = marker.get("lease")
        remove_network(name, lease if isinstance(lease, int) else None)
    remove_session_dir(name)


def names_with_prefix(tag: str) -> set[str]:
    """Every session name starting with ``tag`` that any resource still carries."""
    names: set[str] = set()
    if STATE_ROOT.is_dir():
        names.update(e for e in os.listdir(STATE_ROOT) if e.startswith(tag) and NAME_RE.fullmatch(e))
    for base in cgroup_bases().values():
        if base.is_dir():
            names.update(e for e in os.listdir(base) if e.startswith(tag) and NAME_RE.fullmatch(e))
    names.update(leases_with_prefix(tag))
    names.update(n for n in _forward.owners() if n.startswith(tag) and NAME_RE.fullmatch(n))
    return names
