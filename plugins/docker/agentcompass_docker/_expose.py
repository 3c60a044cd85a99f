"""Host directories made visible read-only in a running container (blocking helpers).

A container cannot be given a new mount once it runs, so every session
whose daemon shares this host's filesystem gets one at creation: its
state directory's ``exposed/``, bound onto itself and made a shared mount,
is bind-mounted read-only at :data:`INSIDE` with propagation ``rslave``.
A mount the runtime later makes under ``exposed/`` on the host then appears
in the container (and only in that one: propagation stays within the
subtree each container bound), and an unmount disappears from it.

Layout, per session (``<STATE_ROOT>/<name>``, root's, 0700)::

    exposed/          the shared mount the container binds (empty at first)
    exposed/<label>   an exposed directory, as the container sees it
    stage/<label>     the host directory bound and made read-only first

The stage is there because a bind copies its source's flags while a
remount never propagates (``agentcompass.host.bind_read_only``): the
directory is bound at the stage (which no container sees) and remounted
``ro,nosuid,nodev`` there, and only then the stage is bound under
``exposed/``, so the copy that propagates arrives read-only. Nothing in
the container can remount or unmount it (no ``CAP_SYS_ADMIN``), root
included.

Teardown (:func:`destroy`, shared by ``close``, ``reap`` and ``sweep``)
detaches every mount and removes the then-empty directories; it never
deletes recursively, so a mount that could not be detached leaves the host's
directory untouched and raises.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from agentcompass.host import HostError, SessionExists, bind_read_only, claim_state_dir, unmount

__all__ = ["HostError", "SessionExists"]  # re-exported: the session and the provider catch them here

#: Where session state directories live (one per session, named after it).
STATE_ROOT = Path("/run/agentcompass-docker")
#: Where a container sees its session's ``exposed/``.
INSIDE = "/run/agentcompass"

_libc = ctypes.CDLL(None, use_errno=True)
_MS_BIND, _MS_SHARED = 0x1000, 1 << 20


def session_dir(name: str) -> Path:
    return STATE_ROOT / name


def prepare(name: str) -> str:
    """Make the state directory of session ``name`` and its shared
    ``exposed/``; return the host path the container must bind at :data:`INSIDE`."""
    path = claim_state_dir(STATE_ROOT, name, what="docker session")
    exposed = f"{path}/exposed"
    os.mkdir(exposed, 0o755)
    os.mkdir(f"{path}/stage", 0o700)
    _mount(exposed, exposed, _MS_BIND)
    _mount(None, exposed, _MS_SHARED)
    return exposed


def expose(name: str, host_path: str, label: str) -> str:
    """Bind ``host_path`` read-only under session ``name``'s ``exposed/`` as
    ``label`` (see the module docstring); return its path in the container.

    The mount point is made with mode 0 so that whoever looks can tell it
    from the bound directory (see :func:`reached`)."""
    path = session_dir(name)
    bind_read_only(host_path, f"{path}/stage/{label}", f"{path}/exposed/{label}", target_mode=0)
    return f"{INSIDE}/{label}"


def reached(host_path: str, seen_mode: int) -> bool:
    """Whether the permission bits the daemon reports for an exposed path are
    the host directory's rather than its bare mount point's (mode 0): the
    mount propagated to where the container's bind comes from."""
    mode = os.stat(host_path).st_mode & 0o7777
    return mode == 0 or seen_mode & 0o7777 == mode


def unexpose(name: str, label: str) -> None:
    """Undo one :func:`expose` (an exposure the container did not get)."""
    path = session_dir(name)
    for point in (f"{path}/exposed/{label}", f"{path}/stage/{label}"):
        unmount(point)
        _rmdir(point)


def destroy(name: str) -> None:
    """Detach everything of session ``name`` and remove its state directory. Idempotent."""
    path = session_dir(name)
    if not path.is_dir():
        return
    exposed, stage = f"{path}/exposed", f"{path}/stage"
    for label in _listdir(exposed):
        unmount(f"{exposed}/{label}")
    unmount(exposed)
    for label in _listdir(exposed):
        _rmdir(f"{exposed}/{label}")
    for label in _listdir(stage):
        unmount(f"{stage}/{label}")
        _rmdir(f"{stage}/{label}")
    for point in (exposed, stage, str(path)):
        _rmdir(point)


def sweep(tag: str) -> None:
    """:func:`destroy` every session whose name starts with ``tag``."""
    for name in _listdir(str(STATE_ROOT)):
        if name.startswith(tag):
            destroy(name)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise HostError(f"cannot remove {path}: {exc.strerror}") from None


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(None if source is None else source.encode(), target.encode(), None, flags, None) != 0:
        raise HostError(f"mount {target}: {os.strerror(ctypes.get_errno())}")
