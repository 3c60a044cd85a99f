"""The runtime's side of a private run, shared by the providers that offer one.

:meth:`EnvironmentSession.exec_private` is run by a standalone script,
:data:`PRIVATE_INIT_SCRIPT`, started as the host's root with one end of a
socket pair; these are the steps on the other end (sending it the
configuration, taking the descriptors of its fresh tmpfses, writing the
inputs through them, reading the private directory back), so a provider
writes only how it starts the script and what its configuration says. The
script's docstring gives the configuration's keys and the mechanism.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import socket
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from ._errors import FileRefusedError
from ._files import read_beneath, write_beneath

if TYPE_CHECKING:  # the runtime's contracts load no engine (the CLI's help stays fast)
    import trio

#: The root side of a private run: run it as ``python -I -S PRIVATE_INIT_SCRIPT FD``
#: (standard library only), as the host's root, ``FD`` a Unix stream socket.
PRIVATE_INIT_SCRIPT = Path(__file__).with_name("_private_init.py")
#: The directories a private directory or an input may lie under (Harbor's layout).
PRIVATE_TOPS = ("app", "tests", "logs", "solution")
#: Each private tmpfs holds at least this much, so a verifier writing more
#: than ``max_bytes`` fails on a full disk only far past what is returned.
PRIVATE_TMPFS_MIN_BYTES = 64 * 1024 * 1024
#: How many entries the session made are bound back at most, at the top level
#: and in the covered directory (the agent chooses them: a bounded setup cost).
PRIVATE_MAX_ENTRIES = 256
#: The mode of every input file (bytes carry no mode; a test script must stay runnable).
PRIVATE_INPUT_MODE = 0o755
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def private_directory_parts(directory: str) -> tuple[str, list[str]]:
    """``(top, components beneath it)`` of ``directory``; :exc:`ValueError`
    unless it is one of :data:`PRIVATE_TOPS` or a path under one."""
    norm = posixpath.normpath(directory)
    parts = norm.split("/")[1:] if posixpath.isabs(norm) else []
    if not parts or parts[0] not in PRIVATE_TOPS:
        raise ValueError(f"private directory {directory!r} is not /app, /tests, /logs or /solution or a path under one")
    return parts[0], parts[1:]


def private_input_groups(inputs: Mapping[str, bytes] | None, top: str) -> dict[str, dict[str, bytes]]:
    """``inputs`` by the top directory they go to (name -> path beneath it
    -> bytes), in name order; :exc:`ValueError` for a path that is not a
    file under one of :data:`PRIVATE_TOPS` other than ``top`` (that of the
    private directory), one named twice, or one beneath another."""
    groups: dict[str, dict[str, bytes]] = {}
    for path, data in (inputs or {}).items():
        if not isinstance(path, str) or not posixpath.isabs(path) or "\0" in path:
            raise ValueError(f"input {path!r} is not an absolute path")
        parts = posixpath.normpath(path).split("/")[1:]
        if len(parts) < 2 or parts[0] not in PRIVATE_TOPS:
            raise ValueError(f"input {path!r} is not a file under /app, /tests, /logs or /solution")
        if parts[0] == top:
            raise ValueError(f"input {path!r} is in /{top}, the Harbor directory of the private directory")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"input {path!r} is not bytes but {type(data).__name__}")
        group = groups.setdefault(parts[0], {})
        rel = "/".join(parts[1:])
        if rel in group:
            raise ValueError(f"input {path!r} is named twice")
        group[rel] = bytes(data)
    for name, group in groups.items():
        for rel in group:
            for index in range(1, rel.count("/") + 1):
                if rel.rsplit("/", index)[0] in group:
                    raise ValueError(f"input /{name}/{rel} is beneath another input, a file")
    return {name: groups[name] for name in sorted(groups)}


def private_input_bytes(group: Mapping[str, bytes]) -> int:
    """The size of an inputs tmpfs: room for the inputs twice over (the
    command may write beside them: caches, ``__pycache__``)."""
    return max(PRIVATE_TMPFS_MIN_BYTES, 2 * sum(len(data) + 4096 for data in group.values()))


async def send_private_config(channel: trio.socket.SocketType, config: Mapping[str, object]) -> None:
    """The configuration, its length first (8 bytes, big-endian); a script
    that ended before reading it is seen by what comes next (no ``ready``)."""
    body = json.dumps(config).encode()
    view = memoryview(len(body).to_bytes(8, "big") + body)
    try:
        while view:
            view = view[await channel.send(view) :]
    except OSError:
        pass


async def receive_private_ready(channel: trio.socket.SocketType) -> tuple[bytes, list[int]]:
    """What the script says up to its first newline (``b"ready\\n"``) and
    the descriptors it sent with it, the caller's to close (``b""`` and
    none if it ended first)."""
    said = b""
    received: list[int] = []
    space = socket.CMSG_SPACE(4 * (1 + len(PRIVATE_TOPS)))
    try:
        while b"\n" not in said:
            data, ancillary, _flags, _addr = await channel.recvmsg(64, space, socket.MSG_CMSG_CLOEXEC)
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    received += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)]
            if not data:
                break
            said += data
    except BaseException:
        for fd in received:
            os.close(fd)
        raise
    return said, received


@attrs.define(eq=False)
class PrivateHandover:
    """The runtime's whole side of starting a private run, once its script
    is running: the configuration sent, ``ready`` and the tmpfs descriptors
    taken (adopted at once, so :meth:`close` releases them however the run
    ends), the inputs written through them as ``owner``, then ``go``.

    ``groups`` are :func:`private_input_groups`'s. After :meth:`run`,
    :attr:`started` says whether the command was let go (otherwise the
    script ended first, or said something else, and is left to end) and
    :attr:`held` is the private directory's tmpfs for
    :func:`collect_private_files`. :exc:`OSError` when an input cannot be
    written (the provider reports it as its own failure)."""

    groups: dict[str, dict[str, bytes]]
    owner: tuple[int, int]
    held: int | None = None
    inputs: list[int] = attrs.Factory(list)
    started: bool = False

    async def run(self, channel: trio.socket.SocketType, config: Mapping[str, object]) -> None:
        import trio  # here, not at the top: importing the contracts loads no engine

        await send_private_config(channel, config)
        said, received = await receive_private_ready(channel)
        self.held, self.inputs = (received[0], received[1:]) if received else (None, [])
        if said != b"ready\n" or self.held is None or len(self.inputs) != len(self.groups):
            channel.close()  # no go: a pid 1 still waiting for one ends
            return
        groups = list(self.groups.values())
        await trio.to_thread.run_sync(write_private_inputs, self.inputs, groups, self.owner, abandon_on_cancel=False)
        self.started = True
        try:
            await channel.send(b"go\n")
        except OSError:
            pass  # it died meanwhile: its status says how

    def close(self) -> None:
        """Close the descriptors taken (the tmpfses go with their last reference)."""
        for fd in [self.held, *self.inputs]:
            if fd is not None:
                os.close(fd)
        self.held, self.inputs = None, []


def write_private_inputs(fds: list[int], groups: list[dict[str, bytes]], owner: tuple[int, int]) -> None:
    """Blocking: each group's files beneath its tmpfs (``fds``, the
    caller's to close), owned by ``owner``, mode :data:`PRIVATE_INPUT_MODE`,
    no link followed."""
    for fd, group in zip(fds, groups, strict=True):
        for rel, data in group.items():
            write_beneath(fd, rel, data, owner, mode=PRIVATE_INPUT_MODE)


def collect_private_files(root_fd: int, sub: str, max_bytes: int) -> dict[str, bytes]:
    """Blocking: the regular files under ``sub`` of the directory ``root_fd``
    (relative path -> bytes), in path order, each while it fits in what is
    left of ``max_bytes``; links and special files are skipped and nothing
    is followed."""
    files: dict[str, bytes] = {}
    left = max_bytes
    base = sub.split("/") if sub else []
    try:
        start = _open_beneath(root_fd, base)
    except OSError:
        return files  # the command removed it, or made it a link
    pending: list[tuple[int, str]] = [(start, "")]
    try:
        while pending:
            dir_fd, rel = pending.pop()
            try:
                with os.scandir(dir_fd) as entries:
                    names = sorted(
                        (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in entries
                    )
                subdirs = []
                for name, is_dir, is_file in names:
                    path = f"{rel}{name}"
                    if is_dir:
                        subdirs.append(name)
                    elif is_file:
                        try:
                            data = read_beneath(root_fd, posixpath.join(sub, path) if sub else path, left)
                        except (FileRefusedError, OSError):
                            continue  # larger than what is left, or changed meanwhile
                        files[path] = data
                        left -= len(data)
                for name in reversed(subdirs):
                    try:
                        pending.append((os.open(name, _DIR_FLAGS, dir_fd=dir_fd), f"{rel}{name}/"))
                    except OSError:
                        continue
            finally:
                os.close(dir_fd)
    finally:
        for dir_fd, _ in pending:
            os.close(dir_fd)
    return files


def _open_beneath(root_fd: int, parts: list[str]) -> int:
    fd = os.dup(root_fd)
    try:
        for name in parts:
            next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd
