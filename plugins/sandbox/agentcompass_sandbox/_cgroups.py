"""The session's cgroups: a tracking cgroup (v2) whose ``cgroup.kill`` ends
every process of the session, and where asked the memory, pids and cpu
limits, nested under the runtime's own cgroup. Blocking; runs in a worker thread."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from ._paths import CGROUP_GROUP, HostError

_KILL_ROUNDS = 2000
_KILL_PAUSE = 0.001


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
