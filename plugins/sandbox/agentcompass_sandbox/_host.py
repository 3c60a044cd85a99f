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

Everything here blocks and runs in a worker thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from . import _forward, _netlink

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

_libc = ctypes.CDLL(None, use_errno=True)
_MS_BIND, _MS_REC, _MS_SHARED, _MNT_DETACH = 0x1000, 0x4000, 1 << 20, 2
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_CLONE_NEWNET = 0x40000000

_KILL_ROUNDS = 2000
_KILL_PAUSE = 0.001


class HostError(RuntimeError):
    """A host command or file operation failed; the message is one line."""


class SessionExists(HostError):
    """A session of that name exists already: nothing was made, nothing is ours to remove."""


# ------------------------------------------------------------------ names


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


# ------------------------------------------------------------------ state directory


_state_root_ready = False


def ensure_state_root() -> None:
    """Make ``STATE_ROOT``; where it is not on a tmpfs already (``/run`` is
    one on most hosts), mount one there while it is still empty, so that a
    session's directories cost no disk writes and their pages are charged to
    the memory cgroup of the sandbox that writes them. The mount stays (it
    carries no session). Once per process, under a lock shared by runtimes."""
    global _state_root_ready
    if _state_root_ready:
        return
    STATE_ROOT.mkdir(mode=0o711, parents=True, exist_ok=True)
    with open(STATE_ROOT.parent / (STATE_ROOT.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = os.listdir(STATE_ROOT)
        if entries == [LEASE_DIR.name] and not os.listdir(LEASE_DIR):
            LEASE_DIR.rmdir()  # left empty by earlier runs
            entries = []
        if not entries and not _on_tmpfs(STATE_ROOT):
            with contextlib.suppress(HostError):
                run(["mount", "-t", "tmpfs", "-o", "mode=0711", "agentcompass-sandbox", str(STATE_ROOT)])
        # Each session's files are a tmpfs mounted below: shared, so the
        # spawner's mount namespace (a slave of this one) sees them.
        if not os.path.ismount(STATE_ROOT):
            _mount(str(STATE_ROOT), str(STATE_ROOT), None, _MS_BIND, None)
        _mount(None, str(STATE_ROOT), None, _MS_SHARED, None)
    _state_root_ready = True


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise HostError(f"mount {target}: {os.strerror(err)}")


def _unmount(target: str) -> None:
    """Detach the mount at ``target``; nothing mounted there is fine."""
    if _libc.umount2(target.encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise HostError(f"umount {target}: {os.strerror(err)}")


def _on_tmpfs(path: Path) -> bool:
    """Whether the longest mount point containing ``path`` is a tmpfs."""
    best, fstype = "", ""
    target = str(path.resolve())
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            mount = parts[1].replace("\\040", " ")
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fstype = mount, parts[2]
    return fstype == "tmpfs"


def make_session_dir(name: str, files_bytes: int) -> Path:
    """Create the state directory (marker first, so a kill right after leaves
    something ``sweep`` recognises), the session's files tmpfs of
    ``files_bytes`` and the Harbor subdirectories in it, owned by the sandbox user."""
    ensure_state_root()
    path = session_dir(name)
    try:
        path.mkdir(mode=0o711)
    except FileExistsError:
        raise SessionExists(f"sandbox session {name!r} already exists ({path})") from None
    write_marker(name, {"name": name, "created": time.time(), "runtime_pid": os.getpid()})
    files = f"{path}/{FILES}"
    os.mkdir(files, 0o755)
    _mount("agentcompass-files", files, "tmpfs", 0, f"size={files_bytes},mode=0755")
    for sub in SUBDIRS:
        sub_path = f"{files}/{sub}"
        os.mkdir(sub_path, 0o755)
        os.chown(sub_path, HOST_UID, HOST_UID)
    os.mkdir(f"{files}/{EXPOSED}", 0o755)
    os.mkdir(f"{path}/{STAGE}", 0o700)
    if os.path.isfile("/etc/hosts") and not os.path.islink("/etc/hosts"):
        # The sandbox's own /etc/hosts, where allowlisted names are added.
        with open(f"{path}/hosts", "w") as f:
            f.write(host_hosts())
    return path


def expose(name: str, host_path: str, label: str) -> str:
    """Bind ``host_path`` read-only into the running session ``name``; return
    its path inside.

    The session's ``FILES`` tmpfs is a shared mount and the sandbox's bind of
    its ``EXPOSED`` directory a slave of it, so a mount made there on the
    host appears in the sandbox. A bind copies its source's flags, so the
    directory is first bound at a stage of the session's (not visible in the
    sandbox) and made read-only there; the bind of that stage into
    ``EXPOSED`` then arrives read-only, and inside the sandbox's user
    namespace the flag is locked: nothing there can remount it writable."""
    if not os.path.isdir(host_path):
        raise HostError(f"cannot expose {host_path!r}: not a directory")
    path = session_dir(name)
    stage = f"{path}/{STAGE}/{label}"
    target = f"{path}/{FILES}/{EXPOSED}/{label}"
    os.mkdir(stage, 0o700)
    _mount(host_path, stage, None, _MS_BIND, None)
    _mount(None, stage, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    os.mkdir(target, 0o755)
    _mount(stage, target, None, _MS_BIND, None)
    return f"{EXPOSED_INSIDE}/{label}"


def make_image_root(name: str, lower: str, storage_bytes: int, owner: int) -> str:
    """Mount the session's root: an overlay of the image root ``lower``
    (never written) and an upper layer on a tmpfs of ``storage_bytes`` of
    its own, so the session's writes, wherever they go, stop at that size.
    Return the overlay's path. The directory holding it is ``owner``'s
    (the image's root on the host) and closed to everyone else, so no host
    user reaches the image's set-id programs through it; ``nodev``: no device
    node of the upper layer opens a host device."""
    if any(c in lower for c in ",:\\"):
        raise HostError(f"the image root {lower!r} has a comma, colon or backslash (overlay options cannot name it)")
    path = f"{session_dir(name)}/{IMAGE}"
    os.mkdir(path, 0o700)
    os.chown(path, owner, owner)
    upper = f"{path}/{UPPER}"
    os.mkdir(upper, 0o700)
    _mount("agentcompass-upper", upper, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={storage_bytes},mode=0700")
    lower_root = os.stat(lower)
    os.mkdir(f"{upper}/u", 0o755)
    os.chown(f"{upper}/u", lower_root.st_uid, lower_root.st_gid)
    os.chmod(f"{upper}/u", lower_root.st_mode & 0o7777)
    os.mkdir(f"{upper}/w", 0o700)
    root = f"{path}/{ROOT}"
    os.mkdir(root, 0o755)
    options = f"lowerdir={lower},upperdir={upper}/u,workdir={upper}/w"
    _mount("agentcompass-overlay", root, "overlay", _MS_NODEV, options)
    return root


def make_harbor_dirs(root: str, uid: int, gid: int) -> None:
    """``/app``, ``/tests``, ``/logs`` and ``/solution`` in a fresh image
    root, where the image has none (a name it has, of whatever kind, stays)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for sub in SUBDIRS:
            try:
                os.mkdir(sub, 0o755, dir_fd=fd)
            except FileExistsError:
                continue
            os.chown(sub, uid, gid, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def mount_sysfs(name: str, netns_fd: int) -> str:
    """Mount a read-only sysfs of the network namespace ``netns_fd`` (its
    ``/sys/class/net`` lists the session's interfaces) for an image
    session's ``/sys``, and return its path: made on the host side, as no
    process of the session owns that namespace. Mounted from a thread of its
    own that enters the namespace and ends, so no thread is left in it."""
    target = f"{session_dir(name)}/{IMAGE}/{SYS}"
    os.mkdir(target, 0o755)
    failures: list[BaseException] = []

    def inside() -> None:
        try:
            if _libc.setns(netns_fd, _CLONE_NEWNET) != 0:
                raise HostError(f"setns: {os.strerror(ctypes.get_errno())}")
            _mount("sysfs", target, "sysfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=inside, name="agentcompass-sysfs")
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
    return target


def _remove_image_root(path: str) -> None:
    """Detach the overlay, then its upper tmpfs (nothing mounted is fine)."""
    if os.path.isdir(f"{path}/{IMAGE}"):
        _unmount(f"{path}/{IMAGE}/{SYS}")
        _unmount(f"{path}/{IMAGE}/{ROOT}")
        _unmount(f"{path}/{IMAGE}/{UPPER}")


def _remove_stages(path: str) -> None:
    """Detach every stage of :func:`expose` and remove its (then empty) mount
    point. Never a recursive delete: a stage still mounted is the host's
    directory, so what cannot be detached stays and raises."""
    try:
        labels = os.listdir(f"{path}/{STAGE}")
    except FileNotFoundError:
        return
    for label in labels:
        stage = f"{path}/{STAGE}/{label}"
        _unmount(stage)
        os.rmdir(stage)
    os.rmdir(f"{path}/{STAGE}")


def host_hosts() -> str:
    try:
        with open("/etc/hosts") as f:
            return f.read()
    except OSError:
        return ""


def write_marker(name: str, data: dict[str, Any]) -> None:
    path = f"{STATE_ROOT}/{name}/{MARKER}"
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, json.dumps(data).encode())
    finally:
        os.close(fd)
    os.replace(path + ".tmp", path)


def read_marker(name: str) -> dict[str, Any]:
    try:
        with open(f"{STATE_ROOT}/{name}/{MARKER}", "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------------ cgroups


def _mounts() -> list[tuple[str, str, str]]:
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                found.append((parts[1], parts[2], parts[3]))
    return found


def _self_cgroup(hierarchy: str) -> str:
    """This process's cgroup path in the v1 hierarchy naming ``hierarchy`` ('' = v2)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers.split(",") == [hierarchy] or (hierarchy == "" and controllers == ""):
                return path.lstrip("/")
    return ""


_cgroup_bases: dict[str, Path] | None = None


def cgroup_bases() -> dict[str, Path]:
    """:func:`find_cgroup_bases`, read once per process (every open and close needs it)."""
    global _cgroup_bases
    if _cgroup_bases is None:
        _cgroup_bases = find_cgroup_bases()
    return dict(_cgroup_bases)


def find_cgroup_bases() -> dict[str, Path]:
    """The parent directories of session cgroups: ``track`` (cgroup v2, where
    ``cgroup.kill`` ends a process tree), and ``memory`` / ``pids`` / ``cpu``
    where a controller for that limit exists. Nested under this process's own cgroup,
    so a sandbox never escapes the limits of whoever runs the runtime."""
    bases: dict[str, Path] = {}
    for mount, fstype, options in _mounts():
        if fstype == "cgroup2":
            own = Path(mount) / _self_cgroup("")
            bases["track"] = own / CGROUP_GROUP
            # A v2 controller is usable only where it is delegated to our own cgroup.
            try:
                delegated = (own / "cgroup.subtree_control").read_text().split()
            except OSError:
                delegated = []
            for ctl in ("memory", "pids", "cpu"):
                if ctl in delegated and ctl not in bases:
                    bases[ctl] = bases["track"]
        else:
            opts = options.split(",")
            for ctl in ("memory", "pids", "cpu"):
                if ctl in opts:
                    bases[ctl] = Path(mount) / _self_cgroup(ctl) / CGROUP_GROUP
    return bases


def make_cgroups(name: str, memory_mb: int | None, pids_max: int | None, cpus: float | None = None) -> dict[str, str]:
    """Create the session's cgroups and set its limits; return ``procs``
    files an exec writes its pid into, keyed by role."""
    bases = cgroup_bases()
    if "track" not in bases:
        raise HostError("no cgroup v2 hierarchy is mounted (needed to kill process trees)")
    made: dict[str, str] = {}
    wanted = {"track": bases["track"]}
    if memory_mb is not None:
        if "memory" not in bases:
            raise HostError("memory_mb is set but this host has no memory cgroup controller")
        wanted["memory"] = bases["memory"]
    if pids_max is not None:
        if "pids" not in bases:
            raise HostError("pids_max is set but this host has no pids cgroup controller")
        wanted["pids"] = bases["pids"]
    if cpus is not None:
        if "cpu" not in bases:
            raise HostError("cpus is set but this host has no cpu cgroup controller")
        wanted["cpu"] = bases["cpu"]
    for role, base in wanted.items():
        path = base / name
        path.mkdir(parents=True, exist_ok=True)
        made[role] = str(path)
        if role != "track" and base == bases["track"]:
            # cgroup v2: the limit files of <name> exist once its parent enables the controller.
            (base / "cgroup.subtree_control").write_text(f"+{role}")
    if memory_mb is not None:
        limit = str(memory_mb * 1024 * 1024)
        mem = Path(made["memory"])
        target = mem / "memory.max" if (mem / "memory.max").exists() else mem / "memory.limit_in_bytes"
        target.write_text(limit)
        swap = mem / "memory.memsw.limit_in_bytes"
        with contextlib.suppress(OSError):
            if swap.exists():
                swap.write_text(limit)
    if pids_max is not None:
        (Path(made["pids"]) / "pids.max").write_text(str(pids_max))
    if cpus is not None:
        cpu, period = Path(made["cpu"]), 100_000
        quota = max(1000, round(cpus * period))
        if (cpu / "cpu.max").exists():
            (cpu / "cpu.max").write_text(f"{quota} {period}")
        else:
            (cpu / "cpu.cfs_period_us").write_text(str(period))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota))
    return made


def exec_cgroup(track: str, label: str) -> str:
    """A leaf of the session's tracking cgroup for one process tree."""
    path = Path(track) / label
    path.mkdir(exist_ok=True)
    return str(path)


def _procs(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _all_procs(path: Path) -> list[int]:
    pids: list[int] = []
    if not path.is_dir():
        return pids
    for parent, _dirs, _files in os.walk(path):
        pids.extend(_procs(Path(parent)))
    return pids


def kill_cgroup(path_str: str, remove: bool) -> None:
    """SIGKILL every process in a cgroup subtree, wait until it is empty
    (bounded), and with ``remove`` delete its directories."""
    if not os.path.isdir(path_str):
        return
    kill_file = f"{path_str}/cgroup.kill"
    if os.path.exists(kill_file) and _kill_v2(path_str, kill_file):
        if remove:
            remove_cgroup(path_str)
        return
    path = Path(path_str)
    for _ in range(_KILL_ROUNDS):
        pids = _all_procs(path)
        if not pids:
            break
        if os.path.exists(kill_file):
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        else:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(_KILL_PAUSE)
    if remove:
        remove_cgroup(path_str)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _populated(path: str) -> bool:
    try:
        with open(f"{path}/cgroup.events", "rb") as f:
            return b"populated 1" in f.read()
    except FileNotFoundError:
        return False


def _kill_v2(path: str, kill_file: str) -> bool:
    """cgroup v2: ``cgroup.kill`` the subtree, then watch the one ``populated``
    flag of ``cgroup.events`` (cheaper than walking every ``cgroup.procs`` per
    round); the kill is repeated now and then for a process caught mid-fork.
    False if the subtree is still populated at the end of the bounded wait."""
    for round_ in range(_KILL_ROUNDS):
        if not _populated(path):
            return True
        if round_ % 50 == 0:
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        time.sleep(_KILL_PAUSE)
    return not _populated(path)


def remove_cgroup(path: str | Path) -> None:
    """rmdir a cgroup directory tree, leaves first; a busy one is retried briefly."""
    try:
        entries = [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return
    for entry in entries:
        remove_cgroup(entry)
    _rmdir_cgroup(str(path))


def _rmdir_cgroup(path: str) -> None:
    for _ in range(_KILL_ROUNDS):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(_KILL_PAUSE)
    raise HostError(f"cgroup {path} is still busy")


def try_remove_cgroup(path: str) -> None:
    """rmdir an exec's leaf cgroup if nothing is left in it (background processes keep it)."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


# ------------------------------------------------------------------ network


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


# ------------------------------------------------------------------ teardown


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


def remove_session_dir(name: str) -> None:
    path = f"{STATE_ROOT}/{name}"
    _remove_image_root(path)
    _unmount(f"{path}/{FILES}")
    _remove_stages(path)
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name == MARKER:
            continue
        if entry.is_dir(follow_symlinks=False):
            try:
                os.rmdir(entry.path)  # usually empty
            except OSError:
                _rmtree(Path(entry.path))
        else:
            os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}/{MARKER}")
    os.rmdir(path)


def _rmtree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError:
        # An agent may have left unreadable directories; root owns the host side.
        for parent, dirs, _ in os.walk(path):
            for d in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(parent, d), 0o700)
        shutil.rmtree(path)


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
