"""A ``sandbox`` session's file operations (a mixin of
:class:`._session.SandboxSession`): reads and writes from the host side,
walking from the session's directories without following any link, and
host directories exposed read-only."""

from __future__ import annotations

import itertools
import os
import posixpath
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import trio

from agentcompass.runtime import read_beneath, write_beneath

from . import _host
from ._exec import fail
from ._images import UID_BASE, ImageRoot


class SessionFiles:
    """The file half of a session; the session's constructor sets the state."""

    name: str
    _root: str | None
    _workdir: str
    _files: Path
    _image: ImageRoot | None
    _labels: itertools.count[int]

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...

        def inside_ids(self) -> tuple[int, int]: ...

    def _locate(self, path: str | os.PathLike[str]) -> tuple[Path, str]:
        """(host directory, path beneath it) of a sandbox path, refused when it
        names a place outside the Harbor directories (over an image: any
        path of its root, relative ones under its working directory). Only
        lexical: the session's links are dealt with by opening, never by resolving."""
        if self._root is not None:
            raw = posixpath.normpath(str(PurePosixPath(self._workdir) / os.fspath(path)))
            return Path(self._root), raw.lstrip("/") or "."
        raw = posixpath.normpath(str(PurePosixPath("/app") / os.fspath(path)))
        parts = raw.split("/")[1:]
        if not parts or parts[0] not in _host.SUBDIRS:
            raise fail(f"path {os.fspath(path)!r} is outside the sandbox's /app, /tests, /logs and /solution")
        return self._files / parts[0], "/".join(parts[1:]) or "."

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a regular file of at most ``max_bytes`` (path rules in the
        class docstring); a link on the way, a FIFO, a device or a longer
        file raises :class:`~agentcompass.FileRefusedError` without blocking."""
        self._check_open()
        root, relpath = self._locate(path)
        return await trio.to_thread.run_sync(read_beneath, root, relpath, max_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Replace a file, creating parent directories; what it makes belongs
        to the sandbox user. A link on the way is refused, never followed."""
        self._check_open()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        root, relpath = self._locate(path)
        owner = (_host.HOST_UID, _host.HOST_UID)
        if self._image is not None:
            uid, gid = self.inside_ids()
            owner = (UID_BASE + uid, UID_BASE + gid)
        await trio.to_thread.run_sync(write_beneath, root, relpath, payload, owner)

    async def expose_directory(self, host_path: str) -> str:
        """Bind ``host_path`` read-only (and ``nosuid``, ``nodev``) into the
        running sandbox at ``/run/agentcompass/<n>`` and return that path;
        how the bind reaches a running sandbox is :func:`._mounts.expose`.
        The bind goes with the session (``close``, ``reap`` and ``sweep``
        detach it; the host directory is never deleted)."""
        self._check_open()
        label = f"d{next(self._labels)}"
        try:
            return await trio.to_thread.run_sync(_host.expose, self.name, os.fspath(host_path), label)
        except (OSError, _host.HostError) as exc:
            raise fail(f"sandbox {self.name}: could not expose {host_path}: {exc}") from None
