"""A session's state directory ``<STATE_ROOT>/<name>``: made with its
marker first, its files tmpfs and Harbor subdirectories, and removed last
(the marker after everything else). Blocking; runs in a worker thread."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from agentcompass.host import FileLock, HostError, claim_state_dir, unmount
from agentcompass.host import read_marker as _read_marker
from agentcompass.host import write_marker as _write_marker

from ._mounts import mount, on_tmpfs, remove_image_root, remove_stages
from ._paths import EXPOSED, FILES, HOST_UID, LEASE_DIR, MARKER, STAGE, STATE_ROOT, SUBDIRS, run, session_dir

_MS_BIND, _MS_SHARED = 0x1000, 1 << 20


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
    with FileLock.acquire(STATE_ROOT.parent / (STATE_ROOT.name + ".lock")):
        entries = os.listdir(STATE_ROOT)
        if entries == [LEASE_DIR.name] and not os.listdir(LEASE_DIR):
            LEASE_DIR.rmdir()  # left empty by earlier runs
            entries = []
        if not entries and not on_tmpfs(STATE_ROOT):
            with contextlib.suppress(HostError):
                run(["mount", "-t", "tmpfs", "-o", "mode=0711", "agentcompass-sandbox", str(STATE_ROOT)])
        # Each session's files are a tmpfs mounted below: shared, so the
        # spawner's mount namespace (a slave of this one) sees them.
        if not os.path.ismount(STATE_ROOT):
            mount(str(STATE_ROOT), str(STATE_ROOT), None, _MS_BIND, None)
        mount(None, str(STATE_ROOT), None, _MS_SHARED, None)
    _state_root_ready = True


def make_session_dir(name: str, files_bytes: int) -> Path:
    """Create the state directory (marker first, so a kill right after leaves
    something ``sweep`` recognises), the session's files tmpfs of
    ``files_bytes`` and the Harbor subdirectories in it, owned by the sandbox user."""
    ensure_state_root()
    path = claim_state_dir(STATE_ROOT, name, mode=0o711, what="sandbox session")
    write_marker(name, {"name": name, "created": time.time(), "runtime_pid": os.getpid()})
    files = f"{path}/{FILES}"
    os.mkdir(files, 0o755)
    mount("agentcompass-files", files, "tmpfs", 0, f"size={files_bytes},mode=0755")
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


def host_hosts() -> str:
    try:
        with open("/etc/hosts") as f:
            return f.read()
    except OSError:
        return ""


def write_marker(name: str, data: dict[str, Any]) -> None:
    """Session ``name``'s marker: what teardown must find (its network, its lease)."""
    _write_marker(session_dir(name) / MARKER, data)


def read_marker(name: str) -> dict[str, Any]:
    return _read_marker(session_dir(name) / MARKER)


def remove_session_dir(name: str) -> None:
    path = f"{STATE_ROOT}/{name}"
    remove_image_root(path)
    unmount(f"{path}/{FILES}")
    remove_stages(path)
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
