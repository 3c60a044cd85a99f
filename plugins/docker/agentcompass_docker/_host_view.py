"""The container as this host sees it: its init (entered by a private run),
the confinement a private run copies from it when the session starts, the
cgroups it is in and its user; :class:`NotLocal` says why not, elsewhere."""

from __future__ import annotations

import ctypes
import os
import posixpath
import select
from collections.abc import Mapping
from typing import Any

import attrs

_NAMESPACES = ("mnt", "uts", "ipc", "net", "cgroup")


@attrs.frozen
class Target:
    """The container's init as this host sees it: what a private run enters."""

    pid: int
    pidfd: int
    fds: dict[str, int]
    cgroup_procs: list[str]
    status: dict[str, str]

    def close(self) -> None:
        for fd in (self.pidfd, *self.fds.values()):
            os.close(fd)


@attrs.frozen
class Snapshot:
    """The container's confinement as it started: what every private run of the session gets."""

    filters: tuple[bytes, ...]
    bounding: int
    no_new_privs: bool


class NotLocal(Exception):
    """Why no private run can be made for this container (one line)."""


def target(container_id: str, info: Mapping[str, Any]) -> Target:
    """Blocking: the container's init from the daemon's ``info``
    (``GET /containers/<id>/json``), its descriptors opened while its pidfd
    shows it alive and its cgroup names the container; :class:`NotLocal`
    when this host cannot make the run (the caller closes the result)."""
    if os.geteuid() != 0:
        raise NotLocal("the runtime is not root")
    pid = (info.get("State") or {}).get("Pid") or 0
    if not isinstance(pid, int) or pid <= 0:
        raise NotLocal("the daemon reports no process for the container")
    if info.get("AppArmorProfile") and _apparmor_enabled():
        raise NotLocal(f"the container runs under the AppArmor profile {info['AppArmorProfile']!r}")
    if info.get("ProcessLabel"):
        raise NotLocal("the container runs under an SELinux label")
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        raise NotLocal("the container's process is not one of this host's") from None
    fds: dict[str, int] = {}
    try:
        cgroup = _read(f"/proc/{pid}/cgroup")
        if container_id not in cgroup:
            raise NotLocal("the container's process is not one of this host's (its cgroup does not name it)")
        if os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino:
            raise NotLocal("the container has a user namespace of its own (the daemon remaps users)")
        for ns in _NAMESPACES:
            fds[ns] = os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
        status = _status(_read(f"/proc/{pid}/status"))
        procs = cgroup_procs(cgroup, _read("/proc/self/mountinfo"))
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if poller.poll(0):  # readable: it has exited, the numbers may be anyone's
            raise NotLocal("the container's process has exited")
    except BaseException as exc:
        for fd in (pidfd, *fds.values()):
            os.close(fd)
        if isinstance(exc, OSError):
            raise NotLocal(f"the container's process cannot be entered: {exc}") from None
        raise
    return Target(pid=pid, pidfd=pidfd, fds=fds, cgroup_procs=procs, status=status)


def snapshot(container_id: str, info: Mapping[str, Any]) -> Snapshot:
    """Blocking: the started container's confinement (see the module
    docstring, step 0); :class:`NotLocal` when this host cannot make its
    private runs."""
    found = target(container_id, info)
    try:
        filters: tuple[bytes, ...] = ()
        if found.status.get("Seccomp", "0") != "0":
            filters = seccomp_filters(found.pid, found.pidfd)
        return Snapshot(
            filters=filters,
            bounding=int(found.status.get("CapBnd", "0"), 16),
            no_new_privs=found.status.get("NoNewPrivs", "0") == "1",
        )
    except OSError as exc:
        raise NotLocal(f"the container's seccomp filters cannot be read: {exc}") from None
    finally:
        found.close()


def snapshot_or_reason(container_id: str, info: Mapping[str, Any]) -> Snapshot | str:
    """Blocking: :func:`snapshot`, or the reason there is none."""
    try:
        return snapshot(container_id, info)
    except NotLocal as exc:
        return str(exc)


#: Before a session has started: nothing to run in.
NO_SNAPSHOT = Snapshot(filters=(), bounding=0, no_new_privs=True)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long
_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_PTRACE_SECCOMP_GET_FILTER = 0x420C
_WALL = 0x40000000
# One classic BPF instruction (struct sock_filter).
_INSTRUCTION_BYTES = 8


def seccomp_filters(pid: int, pidfd: int) -> tuple[bytes, ...]:
    """Blocking, in one thread (the tracer is a thread): the seccomp filters
    of ``pid``, oldest first, each its ``sock_filter`` array, read while it
    is stopped by ``ptrace``; its pidfd must show it alive afterwards, so
    they are its and no later holder's of its number."""

    def check(result: int, what: str) -> int:
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
        return result

    check(_libc.ptrace(_PTRACE_SEIZE, pid, None, None), "ptrace")
    filters: list[bytes] = []
    try:
        check(_libc.ptrace(_PTRACE_INTERRUPT, pid, None, None), "ptrace interrupt")
        os.waitpid(pid, _WALL)
        while True:
            count = _libc.ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, len(filters), None)
            if count < 0 and ctypes.get_errno() == 2:  # ENOENT: no older filter
                break
            buffer = ctypes.create_string_buffer(check(count, "seccomp filter") * _INSTRUCTION_BYTES)
            check(_libc.ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, len(filters), buffer), "seccomp filter")
            filters.append(buffer.raw)
    finally:
        _libc.ptrace(_PTRACE_DETACH, pid, None, None)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if poller.poll(0):
        raise OSError(3, "the container's process has exited")  # ESRCH
    return tuple(reversed(filters))  # index 0 is the newest


def cgroup_procs(cgroup: str, mountinfo: str) -> list[str]:
    """The host paths of the ``cgroup.procs`` files a process whose
    ``/proc/<pid>/cgroup`` is ``cgroup`` is in, by the hierarchies mounted
    here (``mountinfo``: ``/proc/self/mountinfo``); one per hierarchy, those
    not mounted left out."""
    v1: dict[frozenset[str], str] = {}
    v2: str | None = None
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, extra = before.split(), after.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        if fields[3] != "/":
            continue  # a bind of a part of the hierarchy: its paths are not the process's
        point = fields[4].replace("\\040", " ")
        if extra[0] == "cgroup2":
            v2 = v2 or point
        elif extra[0] == "cgroup":
            options = set(extra[2].split(","))
            v1.setdefault(frozenset(o.removeprefix("name=") for o in options), point)
    paths: list[str] = []
    for line in cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/") or ".." in path.split("/"):
            continue
        where: str | None
        if hierarchy == "0" and not controllers:
            where = v2
        else:
            names = {c.removeprefix("name=") for c in controllers.split(",")}
            where = next((p for options, p in v1.items() if names <= options), None)
        if where is not None:
            paths.append(posixpath.join(where, path.lstrip("/"), "cgroup.procs"))
    return paths


def _status(text: str) -> dict[str, str]:
    return {key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as file:
        return file.read(1 << 20)


def _apparmor_enabled() -> bool:
    try:
        return _read("/sys/module/apparmor/parameters/enabled").strip() == "Y"
    except OSError:
        return False


def account(user: str, passwd: str, group: str) -> tuple[int, int, list[int], str]:
    """``(uid, gid, groups, home)`` of the container's ``User`` (``""``,
    ``name``, ``uid``, ``name:group`` or ``uid:gid``) by its ``/etc/passwd``
    and ``/etc/group``, as Docker resolves an exec's user; :class:`NotLocal`
    for a name it lacks."""
    name, _, grp = (user or "0").partition(":")
    entries = [line.split(":") for line in passwd.splitlines() if line.count(":") >= 6]
    found = next((e for e in entries if e[0] == name or (name.isdigit() and e[2] == name)), None)
    if found is None and not name.isdigit():
        raise NotLocal(f"the container's user {name!r} is not in its /etc/passwd")
    uid = int(name) if name.isdigit() else int(found[2]) if found else 0
    gid = int(found[3]) if found and found[3].isdigit() else 0 if found is None and uid == 0 else uid
    home = found[5] if found else ("/root" if uid == 0 else "/")
    groups_list = [line.split(":") for line in group.splitlines() if line.count(":") >= 3]
    if grp:
        chosen = next((g for g in groups_list if g[0] == grp or (grp.isdigit() and g[2] == grp)), None)
        if chosen is None and not grp.isdigit():
            raise NotLocal(f"the container's group {grp!r} is not in its /etc/group")
        gid = int(grp) if grp.isdigit() else int(chosen[2]) if chosen else gid
    login = found[0] if found else None
    extra = [int(g[2]) for g in groups_list if g[2].isdigit() and login and login in g[3].split(",")]
    return uid, gid, sorted({gid, *extra}), home
