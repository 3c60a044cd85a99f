"""Mounts of a session: its image root (an overlay), its sysfs, and the
host directories exposed to it read-only. Blocking; runs in a worker thread."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from agentcompass.host import HostError, bind_read_only, unmount

from ._paths import EXPOSED, EXPOSED_INSIDE, FILES, IMAGE, ROOT, STAGE, SUBDIRS, SYS, UPPER, session_dir

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_CLONE_NEWNET = 0x40000000


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise HostError(f"mount {target}: {os.strerror(err)}")


def on_tmpfs(path: Path) -> bool:
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


def expose(name: str, host_path: str, label: str) -> str:
    """Bind ``host_path`` read-only into the running session ``name``; return
    its path inside.

    The session's ``FILES`` tmpfs is a shared mount and the sandbox's bind of
    its ``EXPOSED`` directory a slave of it, so a mount made there on the
    host appears in the sandbox. A bind copies its source's flags, so the
    directory is first bound at a stage of the session's (not visible in the
    sandbox) and made read-only there (``agentcompass.host.bind_read_only``);
    the bind of that stage into ``EXPOSED`` then arrives read-only, and inside
    the sandbox's user namespace the flag is locked: nothing there can
    remount it writable."""
    path = session_dir(name)
    bind_read_only(host_path, f"{path}/{STAGE}/{label}", f"{path}/{FILES}/{EXPOSED}/{label}")
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
    mount("agentcompass-upper", upper, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={storage_bytes},mode=0700")
    lower_root = os.stat(lower)
    os.mkdir(f"{upper}/u", 0o755)
    os.chown(f"{upper}/u", lower_root.st_uid, lower_root.st_gid)
    os.chmod(f"{upper}/u", lower_root.st_mode & 0o7777)
    os.mkdir(f"{upper}/w", 0o700)
    root = f"{path}/{ROOT}"
    os.mkdir(root, 0o755)
    options = f"lowerdir={lower},upperdir={upper}/u,workdir={upper}/w"
    mount("agentcompass-overlay", root, "overlay", _MS_NODEV, options)
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
            mount("sysfs", target, "sysfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=inside, name="agentcompass-sysfs")
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
    return target


def remove_image_root(path: str) -> None:
    """Detach the overlay, then its upper tmpfs (nothing mounted is fine)."""
    if os.path.isdir(f"{path}/{IMAGE}"):
        unmount(f"{path}/{IMAGE}/{SYS}")
        unmount(f"{path}/{IMAGE}/{ROOT}")
        unmount(f"{path}/{IMAGE}/{UPPER}")


def remove_stages(path: str) -> None:
    """Detach every stage of :func:`expose` and remove its (then empty) mount
    point. Never a recursive delete: a stage still mounted is the host's
    directory, so what cannot be detached stays and raises."""
    try:
        labels = os.listdir(f"{path}/{STAGE}")
    except FileNotFoundError:
        return
    for label in labels:
        stage = f"{path}/{STAGE}/{label}"
        unmount(stage)
        os.rmdir(stage)
    os.rmdir(f"{path}/{STAGE}")
