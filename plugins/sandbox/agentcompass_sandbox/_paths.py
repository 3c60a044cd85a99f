"""Names of the sandbox's host resources, and host commands.

Every resource of a session carries its name (see :mod:`._host`): the
constants and the name-derived paths here are what :mod:`._statedir`,
:mod:`._mounts`, :mod:`._cgroups` and :mod:`._leases` share.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from agentcompass.host import HostError, SessionExists

__all__ = ["HostError", "SessionExists"]

#: A session over an image root: its directory (``IMAGE/ROOT`` the overlay,
#: ``IMAGE/UPPER`` the tmpfs of its own writes).
IMAGE, ROOT, UPPER, SYS = "image", "root", "upper", "sys"
#: Where session directories live (one per session, named after it).
STATE_ROOT = Path("/run/agentcompass-sandbox")
#: Lease files of the /30 subnets handed to sessions with a veth.
LEASE_DIR = STATE_ROOT / ".leases"
#: The host uid/gid sandbox processes run as (``nobody``); uid 1000 inside.
HOST_UID = 65534
INSIDE_UID = 1000
#: The host's userland, mounted read-only into every sandbox where it exists
#: (top-level symlinks such as /bin -> usr/bin are recreated). Nothing else
#: of the host is visible: not /root, /home (the host users' files), /srv,
#: /mnt, /media, /boot, nor any project directory. Each bind costs a mount
#: and a read-only remount at every open.
USERLAND = ("usr", "etc", "opt", "var", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Harbor paths bound into every sandbox, each a directory of the session's files.
SUBDIRS = ("app", "tests", "logs", "solution")
#: The session's own tmpfs (of a fixed size) holding ``SUBDIRS``, in its state dir.
FILES = "files"
#: In ``FILES``: where exposed host directories are mounted (see :func:`expose`),
#: bound read-only at :data:`EXPOSED_INSIDE` in the sandbox.
EXPOSED = ".exposed"
EXPOSED_INSIDE = "/run/agentcompass"
#: In the state dir: the read-only binds :func:`expose` propagates from.
STAGE = "stage"
MARKER = "session.json"
CGROUP_GROUP = "agentcompass-sandbox"
#: The host table that NATs and forwards every sandbox's egress.
NFT_HOST_TABLE = "agentcompass_sandbox"
#: 10.213.0.0/16 split into /30s: host end .1, sandbox end .2 of each.
SUBNET_PREFIX = (10, 213)
LEASES = 16384

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


def veth_name(name: str) -> str:
    return "ac" + hashlib.sha1(name.encode()).hexdigest()[:12]


def session_dir(name: str) -> Path:
    return STATE_ROOT / name


def files_dir(name: str) -> Path:
    """Where the session's ``/app``, ``/tests``, ``/logs`` and ``/solution`` are."""
    return STATE_ROOT / name / FILES


def lease_addresses(index: int) -> tuple[str, str]:
    """(host address, sandbox address) of lease ``index``."""
    base = index * 4
    a, b = SUBNET_PREFIX
    third, fourth = divmod(base, 256)
    return f"{a}.{b}.{third}.{fourth + 1}", f"{a}.{b}.{third}.{fourth + 2}"


# ------------------------------------------------------------------ commands


def run(argv: list[str], input: bytes | None = None) -> str:
    """Run a host command; raise :class:`HostError` with its stderr on failure."""
    proc = subprocess.run(argv, input=input, capture_output=True, check=False)
    if proc.returncode != 0:
        detail = " ".join(proc.stderr.decode(errors="replace").split())[:300]
        raise HostError(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} failed (exit {proc.returncode}): {detail}")
    return proc.stdout.decode(errors="replace")
