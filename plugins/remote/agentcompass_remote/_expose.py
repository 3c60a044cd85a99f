"""What ``expose_directory`` sends and what the server makes of it (protocol 5).

A remote session shares no filesystem with the driver's host, so a host
directory reaches it in one of two ways:

- **A copy** (``expose``), for a small directory of regular files and unix
  sockets (the model gateway's: ``forward.py`` and its socket): the client
  lists it without following a link (:func:`list_small_directory`: a link, a
  device, a FIFO or more than :data:`COPY_MAX_BYTES` is refused), the server
  writes the files into a fresh directory of its own
  (:func:`write_copy`), listens on a socket of the same name for each socket
  (a relay, ``_relay``), and has its provider's session expose that
  directory.
- **The server's own agent cache entry** (``expose_cached``), for an entry of
  the driver's agent cache (``agentcompass.agents.cache_root()``): hundreds
  of MB are not copied per attempt; the server exposes the entry of the same
  name under its own cache root when its ``installed.json`` says the same
  install (:func:`server_entry`), and nothing else: the client names an
  entry, never a path.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from agentcompass import IssueError

from . import _protocol as p

__all__ = [
    "COPY_MAX_BYTES",
    "COPY_MAX_FILES",
    "SCRATCH_PREFIX",
    "cache_entry_name",
    "check_listing",
    "list_small_directory",
    "make_scratch",
    "remove_scratch",
    "server_entry",
    "write_copy",
]

#: Most bytes and entries a copied directory may hold.
COPY_MAX_BYTES = 4 * 1024 * 1024
COPY_MAX_FILES = 64
#: The name prefix of a server's per-session directories (what a reap may remove).
SCRATCH_PREFIX = "agentcompass-relay-"
_ENTRY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
#: ``installed.json`` keys that differ between two builds of the same install.
_BUILD_KEYS = ("install_seconds", "created")
_INFO_MAX_BYTES = 64 * 1024


# -- client side -------------------------------------------------------------


def cache_entry_name(path: str) -> tuple[str, dict[str, Any]] | None:
    """``(entry name, installed.json)`` when ``path`` is a complete entry of
    this host's agent cache, else None. Blocking."""
    from agentcompass.agents import cache_root

    entry = Path(path)
    try:
        if os.path.realpath(entry.parent) != os.path.realpath(cache_root()) or entry.is_symlink():
            return None
        info = _read_info(entry / "installed.json")
    except (OSError, ValueError):
        return None
    return (entry.name, info) if _ENTRY_RE.fullmatch(entry.name) else None


def list_small_directory(root: str) -> tuple[list[tuple[str, bytes, bool]], list[str]]:
    """The regular files (relative path, content, executable) and unix
    sockets (relative path) under ``root``, read without following a link.
    Raises :exc:`NotImplementedError` naming what is refused: a link, a
    device or FIFO, more than :data:`COPY_MAX_FILES` entries or
    :data:`COPY_MAX_BYTES` bytes. Blocking."""
    files: list[tuple[str, bytes, bool]] = []
    sockets: list[str] = []
    total = 0
    refuse = "a remote session copies only small directories of regular files and sockets"
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(root):
            raise NotImplementedError(f"{refuse}: {root} is a symbolic link") from None
        raise
    try:
        pending: list[tuple[str, int]] = [("", top)]
        while pending:
            relative, fd = pending.pop()
            try:
                names = sorted(os.listdir(fd))
                for name in names:
                    if len(files) + len(sockets) + len(pending) >= COPY_MAX_FILES:
                        raise NotImplementedError(f"{refuse}: {root} has more than {COPY_MAX_FILES} entries")
                    path = posixpath.join(relative, name)
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                        pending.append((path, os.open(name, flags, dir_fd=fd)))
                    elif stat.S_ISSOCK(info.st_mode):
                        sockets.append(path)
                    elif stat.S_ISREG(info.st_mode):
                        total += info.st_size
                        if total > COPY_MAX_BYTES:
                            raise NotImplementedError(f"{refuse}: {root} holds more than {COPY_MAX_BYTES} bytes")
                        files.append((path, _read_regular(fd, name, info), bool(info.st_mode & 0o111)))
                    else:
                        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "a device or FIFO"
                        raise NotImplementedError(f"{refuse}: {os.path.join(root, path)} is {what}")
            finally:
                os.close(fd)
    except BaseException:
        for _, fd in pending:
            os.close(fd)
        raise
    return files, sockets


def _read_regular(dir_fd: int, name: str, seen: os.stat_result) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or now.st_ino != seen.st_ino:
            raise NotImplementedError(f"{name} changed while it was read")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(seen.st_size + 1)
        if len(data) != seen.st_size:
            raise NotImplementedError(f"{name} changed while it was read")
        return data
    finally:
        os.close(fd)


# -- server side -------------------------------------------------------------


def check_listing(files: Any, sockets: Any, max_bytes: int) -> tuple[list[tuple[str, int, bool]], list[str]]:
    """An ``expose`` request's ``files`` (``[[path, size, executable], ...]``)
    and ``sockets`` (``[path, ...]``), checked: relative paths without ``..``,
    each named once, within the limits. :class:`~._protocol.ProtocolError`
    otherwise."""
    if not isinstance(files, list) or not isinstance(sockets, list):
        raise p.ProtocolError("expose files and sockets must be lists")
    if len(files) + len(sockets) > COPY_MAX_FILES:
        raise p.ProtocolError(f"expose names more than {COPY_MAX_FILES} entries")
    seen: set[str] = set()
    checked: list[tuple[str, int, bool]] = []
    total = 0
    for entry in files:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], bool)):
            raise p.ProtocolError("expose files must be [path, size, executable]")
        path, size, executable = entry
        _check_relative(path, seen)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise p.ProtocolError(f"expose file {path!r} size {size!r} is not a byte count")
        total += size
        checked.append((path, size, executable))
    if total > max_bytes:
        raise p.ProtocolError(f"expose sends more than {max_bytes} bytes")
    for path in sockets:
        _check_relative(path, seen)
    return checked, list(sockets)


def _check_relative(path: Any, seen: set[str]) -> None:
    if not isinstance(path, str) or not path or "\0" in path or len(path) > 200:
        raise p.ProtocolError(f"expose path {path!r} is not a short relative path")
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts) or path in seen:
        raise p.ProtocolError(f"expose path {path!r} is not relative, leaves its directory, or is named twice")
    for depth in range(1, len(parts)):
        if "/".join(parts[:depth]) in seen:
            raise p.ProtocolError(f"expose path {path!r} is beneath a file")
    seen.add(path)


def make_scratch() -> str:
    """A fresh per-session directory on the server (traversable by the
    session's user, listable by no one else). Blocking."""
    directory = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    os.chmod(directory, 0o711)
    return directory


def write_copy(directory: str, files: list[tuple[str, bytes, bool]]) -> None:
    """Write ``files`` under the fresh ``directory`` (made here), never
    following a link (only the server writes there). Blocking."""
    os.mkdir(directory, 0o755)
    for path, data, executable in files:
        target = os.path.join(directory, path)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(target, flags, 0o755 if executable else 0o644)
        try:
            os.fchmod(fd, 0o755 if executable else 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def remove_scratch(directory: str) -> None:
    """Remove a per-session directory (only one this server made: its name
    says so); rmtree never follows a link out of it. Blocking."""
    if not os.path.isabs(directory) or not os.path.basename(directory).startswith(SCRATCH_PREFIX):
        return
    if os.path.islink(directory):
        return
    shutil.rmtree(directory, ignore_errors=True)


def server_entry(name: Any, installed: Any) -> str:
    """The path of this server's agent cache entry ``name`` when its
    ``installed.json`` records the same install as the client's
    ``installed`` (build timings aside). Otherwise FATAL
    ``environment_unsupported`` naming the command that installs it here.
    Blocking."""
    from agentcompass.agents import cache_root

    if not isinstance(name, str) or not _ENTRY_RE.fullmatch(name) or not isinstance(installed, dict):
        raise p.ProtocolError(f"expose_cached entry {str(name)[:80]!r} is not an agent cache entry name")
    root = cache_root()
    entry = root / name
    agent = name.rsplit("-", 1)[0]
    hint = f"install it there with: python -m agentcompass.agents install {agent}"
    try:
        if entry.is_symlink():
            raise OSError("a symbolic link")
        mine = _read_info(entry / "installed.json")
    except (OSError, ValueError):
        raise IssueError(
            "fatal",
            "environment_unsupported",
            f"the sandbox server has no agent cache entry {name} (under {root}); {hint}",
        ) from None
    if _identity(mine) != _identity(installed):
        raise IssueError(
            "fatal",
            "environment_unsupported",
            f"the sandbox server's agent cache entry {name} is another install than the driver's "
            f"({json.dumps(_identity(mine), sort_keys=True)[:200]}); {hint}",
        )
    return str(entry)


def _identity(info: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in info.items() if key not in _BUILD_KEYS}


def _read_info(path: Path) -> dict[str, Any]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(_INFO_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _INFO_MAX_BYTES:
        raise ValueError(f"{path} is too large")
    info = json.loads(data)
    if not isinstance(info, dict):
        raise ValueError(f"{path} is not a JSON object")
    return info
