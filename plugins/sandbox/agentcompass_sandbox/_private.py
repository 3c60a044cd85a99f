"""Private runs: one command with a directory that nothing else in the session can reach.

:func:`exec_private` is how a verifier writes its reward where processes an
agent left running cannot rewrite it, while they keep running for the
verifier to test. Being in a mount namespace of its own is not enough: the
agent's processes have the verifier's uid, so any process of the verifier
they can *see* in their pid namespace is one whose ``/proc/<pid>/root`` (and
``cwd``, ``fd``, ptrace) they may use. So the private command is never in
the session's pid namespace, nor in a child of it.

How (the root side is :mod:`._private_init`, a script of its own):

1. The exec's wrapper puts the script into a leaf of the session's cgroup
   (so a timeout, a cancellation and ``close`` kill the run as they kill an exec).
2. The script, the host's root, joins the session's mount, UTS, IPC, network
   and cgroup namespaces by the descriptors the session holds, but neither
   its user namespace nor its pid namespace; then makes a private copy of
   the mounts (nothing mounted in it propagates back) and a new pid
   namespace, a child of the host's: no process of the session can see or
   name anything in it. Its pid 1 mounts a ``/proc`` of its own.
3. Pid 1 builds a new root: the host's userland layout as bwrap made it
   (the session's ``/`` belongs to the sandbox user, who can replace
   ``/lib64`` and with it the ELF interpreter of every later program), the
   session's other top-level entries, and on the Harbor directory holding
   ``directory`` (``/logs`` for ``/logs/verifier``) a fresh, size-capped
   tmpfs with ``directory`` in it and the Harbor directory's other entries
   bound back. Covering the whole Harbor directory matters: a mount on
   ``/logs/verifier`` itself sits on a dentry the agent can rename or
   remove, which moves or detaches the mount in every namespace.
4. It hands the runtime a descriptor of that tmpfs over a socket and waits
   for ``go``: the runtime holds the files from then on, so they outlive a
   tree a timeout kills, and no host directory is ever made.
5. It starts the command in the session's user namespace as uid/gid 1000,
   with no capabilities, and reaps until it ends; when pid 1 ends, every
   process the command left behind ends with it.
6. The runtime walks ``directory`` through its descriptor without following
   a link (:func:`agentcompass.runtime.read_beneath`), then closes it.

Trade-offs (non-goals): the command does not see the session's processes
(``ps``, ``pgrep``, ``kill -0 $(cat pidfile)`` find nothing), while it
reaches their services by the network namespace, ``/tmp`` and the other
directories, which are the session's; ``/proc/self`` is its own, so
programs that read ``/proc/self/exe`` work. Top-level entries the agent
made, and entries of the covered Harbor directory other than
``directory``, are bound back as they were when the command started (at
most :data:`MAX_ENTRIES` each); what the agent adds there later is not
seen. Processes the command starts in the background end with it; a
command killed by a signal exits with 128 + the signal's number. Don't
confuse this with a sandbox for the command: it runs code and reads files
the agent may have written, and whatever it runs can write its result.
"""

from __future__ import annotations

import errno
import json
import math
import os
import posixpath
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from agentcompass import ExecResult, FileRefusedError
from agentcompass.runtime import OutputTail, cleanup_deadline, read_beneath

from . import _host
from ._session import (
    _DRAIN_SECONDS,
    _WRAP,
    BASE_ENV,
    INIT_GONE_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    InitGone,
    _pump,
    _root_binds,
    fail,
)

if TYPE_CHECKING:
    from ._session import SandboxSession

#: The private tmpfs holds at least this much, so a verifier writing more
#: than ``max_bytes`` fails on a full disk only far past what is returned.
_TMPFS_MIN_BYTES = 64 * 1024 * 1024
#: The private tmpfs's source name, then the session's (``-root`` after it:
#: the new root's): how anyone finds them in a mount listing.
SOURCE_PREFIX = "agentcompass-private-"
#: How many entries the agent made are bound back at most, at the top level
#: and in the covered Harbor directory (it chooses them: a bounded setup cost).
MAX_ENTRIES = 256
_NAMESPACES = ("user", "mnt", "uts", "ipc", "net", "cgroup")
# What bwrap makes at the top of a session besides the userland and the Harbor directories.
_SESSION_MOUNTS = ("tmp", "dev", "run")
_SCRIPT = Path(__file__).with_name("_private_init.py")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def split_directory(directory: str) -> tuple[str, list[str]]:
    """(Harbor directory's name, components beneath it) of ``directory``;
    only a Harbor directory or a path under one can be made private."""
    norm = posixpath.normpath(directory)
    parts = norm.split("/")[1:] if posixpath.isabs(norm) else []
    if not parts or parts[0] not in _host.SUBDIRS:
        raise fail(f"private directory {directory!r} is not /app, /tests, /logs or /solution or a path under one")
    return parts[0], parts[1:]


def userland_layout() -> list[tuple[str, str, str]]:
    """Blocking: the top-level userland entries as bwrap made them,
    ``(name, "symlink", target)`` or ``(name, "dir", "")``."""
    layout = []
    args = _root_binds()
    for index in range(0, len(args), 3):
        option, first, path = args[index : index + 3]
        name = path.lstrip("/")
        layout.append((name, "symlink", first) if option == "--symlink" else (name, "dir", ""))
    return layout


async def exec_private(
    session: SandboxSession,
    cmd: str | list[str],
    timeout: float | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    *,
    directory: str,
    max_bytes: int,
) -> tuple[ExecResult, dict[str, bytes]]:
    """:meth:`SandboxSession.exec_private` (the mechanism in the module docstring)."""
    session._check_open()
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    top, sub = split_directory(directory)
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else [os.fspath(a) for a in cmd]
    workdir = posixpath.join("/app", cwd or ".")
    variables = {
        **BASE_ENV,
        "APP_DIR": "/app",
        "TESTS_DIR": "/tests",
        "LOGS_DIR": "/logs",
        "SOLUTION_DIR": "/solution",
        **(env or {}),
    }
    label = f"p{next(session._labels)}"
    try:
        fds, leaf, layout, program = await trio.to_thread.run_sync(_prepare, session, label)
    except OSError as exc:
        raise fail(f"sandbox {session.name}: {exc}") from None
    except InitGone as exc:
        # As exec: the agent killed its own init, and nothing runs any more.
        return ExecResult(exit_code=INIT_GONE_EXIT_CODE, stderr=f"sandbox {session.name}: {exc}; nothing ran\n"), {}
    held: int | None = None  # the private tmpfs, held by the runtime
    try:
        try:
            session._check_open()
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        channel = trio.socket.from_stdlib_socket(ours)
        try:
            config = {
                "fds": fds,
                "top": top,
                "sub": sub,
                "size": max(_TMPFS_MIN_BYTES, 2 * max_bytes),
                "source": SOURCE_PREFIX + session.name,
                "userland": layout,
                "reserved": list(_host.USERLAND),
                "session_entries": [*_host.SUBDIRS, *_SESSION_MOUNTS],
                "host_uid": _host.HOST_UID,
                "inside_uid": _host.INSIDE_UID,
                "max_entries": MAX_ENTRIES,
                "program": program,
                "argv": ["env", "-i", "-C", workdir, *(f"{k}={v}" for k, v in variables.items()), *argv],
                "env": BASE_ENV,
            }
            full = [
                "/bin/sh", "-c", _WRAP, "sh", *session._procs_files(leaf), "--",
                sys.executable, "-I", "-S", str(_SCRIPT), str(theirs.fileno()),
            ]  # fmt: skip
            try:
                proc = await trio.lowlevel.open_process(
                    full,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=BASE_ENV,
                    pass_fds=(*fds.values(), theirs.fileno()),
                )
            except BaseException as exc:
                channel.close()
                if isinstance(exc, OSError):
                    raise fail(f"sandbox {session.name}: could not start the private run: {exc}") from None
                raise
        finally:
            theirs.close()
            for fd in fds.values():
                os.close(fd)
        out, err = OutputTail(session._max_output), OutputTail(session._max_output)
        timed_out = False
        started = False
        try:
            async with trio.open_nursery() as nursery:
                out_done, err_done = trio.Event(), trio.Event()
                nursery.start_soon(_pump, proc.stdout, out, out_done)
                nursery.start_soon(_pump, proc.stderr, err, err_done)
                with trio.move_on_after(math.inf if timeout is None else max(timeout, 0)) as deadline:
                    await _send_config(channel, config)
                    said, received = await _receive_ready(channel)
                    # Adopted before the next checkpoint: the finally below closes it.
                    held, extra = (received[0], received[1:]) if received else (None, [])
                    for fd in extra:
                        os.close(fd)
                    if said == b"ready\n" and held is not None:
                        started = True
                        try:
                            await channel.send(b"go\n")
                        except OSError:
                            pass  # it died meanwhile: its status says how
                    await proc.wait()
                if deadline.cancelled_caught:
                    timed_out = True
                    await trio.to_thread.run_sync(_host.kill_cgroup, leaf, False)
                    await proc.wait()
                with trio.move_on_after(_DRAIN_SECONDS):
                    await out_done.wait()
                    await err_done.wait()
                nursery.cancel_scope.cancel()
        except BaseException:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await trio.to_thread.run_sync(_host.kill_cgroup, leaf, False)
                await proc.wait()
            raise
        finally:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                channel.close()
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        await stream.aclose()
        if not started and not timed_out:
            session._check_open()
            raise fail(f"sandbox {session.name}: the private run did not start: {' '.join(err.text().split())[:300]}")
        files: dict[str, bytes] = {}
        if held is not None:
            files = await trio.to_thread.run_sync(collect, held, "/".join(sub), max_bytes, abandon_on_cancel=False)
        code = TIMEOUT_EXIT_CODE if timed_out else proc.returncode
        assert code is not None
        return ExecResult(exit_code=code, stdout=out.text(), stderr=err.text(), timed_out=timed_out), files
    finally:
        # Acquired together, released together: the tree (nothing of it
        # outlives the call: its pid namespace ends with its pid 1), the
        # leaf, and the tmpfs (gone with its last reference, this one).
        with trio.move_on_at(cleanup_deadline(), shield=True):
            if held is not None:
                os.close(held)
            await trio.to_thread.run_sync(_host.kill_cgroup, leaf, True)


async def _send_config(channel: trio.socket.SocketType, config: dict[str, object]) -> None:
    """The configuration, length first; a run that ended before reading it
    is seen by what comes next (no ``ready``)."""
    body = json.dumps(config).encode()
    view = memoryview(len(body).to_bytes(8, "big") + body)
    try:
        while view:
            view = view[await channel.send(view) :]
    except OSError:
        pass


async def _receive_ready(channel: trio.socket.SocketType) -> tuple[bytes, list[int]]:
    """What the private run's pid 1 says up to its first newline, and the
    descriptors it sent with it (``b""`` and none if it ended first)."""
    said = b""
    received: list[int] = []
    space = socket.CMSG_SPACE(4 * 4)
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


def _prepare(session: SandboxSession, label: str) -> tuple[dict[str, int], str, list[tuple[str, str, str]], str]:
    """Blocking, one thread hop: the session's namespaces but its pid one
    (descriptors the caller closes), the cgroup leaf, the userland layout,
    and where ``env`` is (the host's userland is the session's)."""
    program = shutil.which("env", path=BASE_ENV["PATH"])
    if program is None:
        raise OSError(errno.ENOENT, "env is not on the sandbox's PATH")
    fds = session.namespace_fds(_NAMESPACES)
    try:
        return fds, _host.exec_cgroup(session._cgroups["track"], label), userland_layout(), program
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise


def collect(root_fd: int, sub: str, max_bytes: int) -> dict[str, bytes]:
    """Blocking: the regular files under ``sub`` of the directory ``root_fd``
    (relative path -> bytes), in path order, each while it fits in what is
    left of ``max_bytes``; links and special files are skipped and nothing
    is followed."""
    root = f"/proc/self/fd/{root_fd}/."
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
                            data = read_beneath(root, posixpath.join(sub, path) if sub else path, left)
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


__all__ = ["MAX_ENTRIES", "SOURCE_PREFIX", "collect", "exec_private", "split_directory", "userland_layout"]
