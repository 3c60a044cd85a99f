"""Read-only binds of host directories, and unmounting (see :func:`bind_read_only`)."""

from __future__ import annotations

import ctypes
import errno
import os

from ._errors import HostError

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 32, 0x1000
_MNT_DETACH = 2


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(None if source is None else source.encode(), target.encode(), None, flags, None) != 0:
        raise HostError(f"mount {target}: {os.strerror(ctypes.get_errno())}")


def bind_read_only(source: str, stage: str, target: str, target_mode: int = 0o755) -> None:
    """Bind the host directory ``source`` at ``target``, read-only,
    ``nosuid`` and ``nodev``, through ``stage``.

    A bind copies its source's flags while a remount never propagates, so
    ``source`` is first bound at ``stage`` (a directory this makes with mode
    0700, which no session sees) and remounted read-only there; the bind of
    the stage at ``target`` (made with ``target_mode``) then arrives
    read-only wherever ``target`` propagates to, and a session without
    ``CAP_SYS_ADMIN`` over the host's mounts (a container, a sandbox's user
    namespace, where the flag is locked) cannot make it writable. Undo with
    :func:`unmount` of ``target`` and then ``stage``, each followed by
    ``os.rmdir``: never a recursive delete, a stage still mounted is the
    host's directory. Raises :class:`HostError` (not a directory, a failed
    mount) and ``OSError`` (``stage`` or ``target`` exists already)."""
    if not os.path.isdir(source):
        raise HostError(f"cannot expose {source!r}: not a directory")
    os.mkdir(stage, 0o700)
    _mount(source, stage, _MS_BIND)
    _mount(None, stage, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.mkdir(target, target_mode)
    os.chmod(target, target_mode)  # exactly: the umask does not narrow it
    _mount(stage, target, _MS_BIND)


def unmount(target: str) -> None:
    """Detach the mount at ``target`` (lazily, as ``umount -l``); nothing
    mounted there, or no ``target``, is fine. Raises :class:`HostError` otherwise."""
    if _libc.umount2(target.encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise HostError(f"umount {target}: {os.strerror(err)}")
