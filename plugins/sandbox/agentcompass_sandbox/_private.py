"""Private runs: one command with directories that nothing else in the session can reach.

:func:`exec_private` is how a verifier reads its tests and writes its reward
where processes an agent left running can touch neither, while they keep
running for the verifier to test. Being in a mount namespace of its own is
not enough: the agent's processes have the verifier's uid, so any process
of the verifier they can *see* in their pid namespace is one whose
``/proc/<pid>/root`` (and ``cwd``, ``fd``, ptrace) they may use. So the
private command is never in the session's pid namespace, nor in a child of it.

How (the root side is :data:`agentcompass.runtime.PRIVATE_INIT_SCRIPT`, a script of its own):

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
   remove, which moves or detaches the mount in every namespace. Each
   other Harbor directory the ``inputs`` name (``/tests``) is a fresh tmpfs
   too, holding nothing of the session's; and :data:`HOME` is a fresh
   tmpfs the size of the session's ``/tmp``, the command's ``HOME``.
4. It hands the runtime descriptors of the ``directory`` and inputs tmpfses
   over a socket and waits for ``go``. Meanwhile the runtime writes the
   inputs through their descriptors (:func:`agentcompass.runtime.write_beneath`,
   no link followed, though nothing else can reach them yet: the new root is
   attached nowhere). It holds the ``directory`` one from then on, so the
   files outlive a tree a timeout kills, and no host directory is ever made.
5. It starts the command in the session's user namespace as uid/gid 1000,
   with no capabilities, and reaps until it ends; when pid 1 ends, every
   process the command left behind ends with it.
6. The runtime walks ``directory`` through its descriptor without following
   a link (:func:`agentcompass.runtime.read_beneath`), then closes it.

Over an image root the same, but for what the image differs in: no host
userland is rebuilt (every top-level entry is the session's, as the agent
left it: the image's programs are the session's to change, as in a
container); the command runs as the session's user (root, mostly) keeping
that user's capabilities in the session's user namespace, which reach
neither the private pid nor mount namespace (the host's root owns them);
and ``HOME`` is the image's own (``/root``), not a fresh one.

Trade-offs (non-goals): the command does not see the session's processes
(``ps``, ``pgrep``, ``kill -0 $(cat pidfile)`` find nothing), while it
reaches their services by the network namespace, ``/tmp`` and the other
directories, which are the session's; ``/proc/self`` is its own, so
programs that read ``/proc/self/exe`` work. A Harbor directory the inputs
name holds only them, every file mode 0o755 (bytes carry no mode, and a
test script must stay runnable: executable data files are harmless),
owned by the sandbox user, who may write there as in the session's; none
of the session's entries of it is seen. ``HOME`` starts empty each run, so
no dotfile or user site-packages of the session's ``HOME`` (``/tmp``) is
read, and no cache survives from one run to the next. Top-level entries
the agent made, and entries of the covered Harbor directory other than
``directory``, are bound back as they were when the command started (at
most :data:`agentcompass.runtime.PRIVATE_MAX_ENTRIES` each); what the agent adds there later is not
seen. Processes the command starts in the background end with it; a
command killed by a signal exits with 128 + the signal's number. Don't
confuse this with a sandbox for the command: it runs code and reads files
the agent may have written, and whatever it runs can write its result.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Protocol

import trio

from agentcompass import ExecResult
from agentcompass.runtime import (
    PRIVATE_INIT_SCRIPT,
    PRIVATE_MAX_ENTRIES,
    PRIVATE_TMPFS_MIN_BYTES,
    PrivateHandover,
    cleanup_deadline,
    collect_private_files,
    private_directory_parts,
    private_input_bytes,
    private_input_groups,
)

from . import _host
from ._exec import (
    BASE_ENV,
    INIT_GONE_EXIT_CODE,
    WRAP,
    InitGone,
    command_line,
    fail,
    root_binds,
    supervise,
)
from ._images import UID_BASE, ImageRoot


class SandboxSession(Protocol):
    """What a private run uses of :class:`._session.SandboxSession` (which imports this module)."""

    name: str
    _cgroups: dict[str, str]
    _env: dict[str, str]
    _labels: itertools.count[int]
    _max_output: int
    _tmpfs_bytes: int

    @property
    def image(self) -> ImageRoot | None: ...

    def _check_open(self) -> None: ...

    def _procs_files(self, track_leaf: str) -> list[str]: ...

    def command_line(self, cmd: str | list[str], cwd: str | None, env: Mapping[str, str] | None) -> list[str]: ...

    def inside_ids(self) -> tuple[int, int]: ...

    def namespace_fds(self, which: tuple[str, ...] = ...) -> dict[str, int]: ...


#: The private tmpfs's source name, then the session's (``-root`` after it:
#: the new root's): how anyone finds them in a mount listing.
SOURCE_PREFIX = "agentcompass-private-"
_NAMESPACES = ("user", "mnt", "uts", "ipc", "net", "cgroup")
# What bwrap makes at the top of a session besides the userland and the Harbor directories.
_SESSION_MOUNTS = ("tmp", "dev", "run")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The private run's ``HOME``: a top-level name no session entry can take
#: there (the session has none of it: its ``/`` is read-only), as in Harbor's
#: images, where the verifier runs as root.
HOME = "/root"


def split_directory(directory: str) -> tuple[str, list[str]]:
    """(Harbor directory's name, components beneath it) of ``directory``;
    only a Harbor directory or a path under one can be made private."""
    try:
        return private_directory_parts(directory)
    except ValueError as exc:
        raise fail(str(exc)) from None


def userland_layout() -> list[tuple[str, str, str]]:
    """Blocking: the top-level userland entries as bwrap made them,
    ``(name, "symlink", target)`` or ``(name, "dir", "")``."""
    layout = []
    args = root_binds()
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
    inputs: Mapping[str, bytes] | None = None,
) -> tuple[ExecResult, dict[str, bytes]]:
    """:meth:`SandboxSession.exec_private` (the mechanism in the module docstring)."""
    session._check_open()
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    top, sub = split_directory(directory)
    groups = private_input_groups(inputs, top)
    label = f"p{next(session._labels)}"
    try:
        fds, leaf, layout, program = await trio.to_thread.run_sync(_prepare, session, label)
        image = session.image is not None
    except OSError as exc:
        raise fail(f"sandbox {session.name}: {exc}") from None
    except InitGone as exc:
        # As exec: the agent killed its own init, and nothing runs any more.
        return ExecResult(exit_code=INIT_GONE_EXIT_CODE, stderr=f"sandbox {session.name}: {exc}; nothing ran\n"), {}
    # The private tmpfs and the inputs' ones, held by the runtime, closed with the run.
    handover = PrivateHandover(groups, (_host.HOST_UID, _host.HOST_UID))
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
            argv = _argv(session, cmd, cwd, env)
            if image:
                program = argv[0]  # the image's own: /usr/bin/env or /bin/sh
            config = {
                "fds": fds,
                "top": top,
                "sub": sub,
                "size": max(PRIVATE_TMPFS_MIN_BYTES, 2 * max_bytes),
                "source": SOURCE_PREFIX + session.name,
                "userland": [] if image else layout,
                "reserved": [] if image else list(_host.USERLAND),
                "session_entries": [*_host.SUBDIRS, *_SESSION_MOUNTS],
                "host_uid": _host.HOST_UID if not image else UID_BASE + session.inside_ids()[0],
                "inside_uid": session.inside_ids()[0],
                "inside_gid": session.inside_ids()[1],
                "keep_capabilities": image,
                "max_entries": PRIVATE_MAX_ENTRIES,
                "inputs": [[name, private_input_bytes(group)] for name, group in groups.items()],
                "home": "" if image else HOME.lstrip("/"),
                "home_size": session._tmpfs_bytes,
                "program": program,
                "argv": argv,
                "env": BASE_ENV,
            }
            full = [
                "/bin/sh", "-c", WRAP, "sh", *session._procs_files(leaf), "--",
                sys.executable, "-I", "-S", str(PRIVATE_INIT_SCRIPT), str(theirs.fileno()),
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

        async def hand_over() -> None:
            # The configuration, then ``ready`` with the tmpfs descriptors, the
            # inputs written through them, then ``go``: all within the timeout.
            try:
                await handover.run(channel, config)
            except OSError as exc:
                raise fail(f"sandbox {session.name}: could not write the inputs: {exc}") from None

        try:
            result = await supervise(proc, leaf, session._max_output, timeout, hand_over)
        finally:
            channel.close()
        if not handover.started and not result.timed_out:
            session._check_open()
            raise fail(
                f"sandbox {session.name}: the private run did not start: {' '.join(result.stderr.split())[:300]}"
            )
        files: dict[str, bytes] = {}
        if handover.held is not None:
            files = await trio.to_thread.run_sync(
                collect_private_files, handover.held, "/".join(sub), max_bytes, abandon_on_cancel=False
            )
        return result, files
    finally:
        # Acquired together, released together: the tree (nothing of it
        # outlives the call: its pid namespace ends with its pid 1), the
        # leaf, and the tmpfses (gone with their last reference, these).
        handover.close()
        with trio.move_on_at(cleanup_deadline(), shield=True):
            await trio.to_thread.run_sync(_host.kill_cgroup, leaf, True)


def _argv(session: SandboxSession, cmd: str | list[str], cwd: str | None, env: Mapping[str, str] | None) -> list[str]:
    """The command's argv: ``env`` of the host's userland, or over an image
    the session's own command line (its ``sh``, then ``env -i``), with ``HOME``."""
    if session.image is None:
        return command_line(cmd, cwd, {**session._env, **(env or {})}, HOME)
    home = HOME if session.inside_ids()[0] == 0 else "/"
    return session.command_line(cmd, cwd, {"HOME": home, **(env or {})})


def _prepare(session: SandboxSession, label: str) -> tuple[dict[str, int], str, list[tuple[str, str, str]], str]:
    """Blocking, one thread hop: the session's namespaces but its pid one
    (descriptors the caller closes), the cgroup leaf, the userland layout,
    and where ``env`` is (the host's userland is the session's)."""
    program = "/bin/sh" if session.image is not None else shutil.which("env", path=BASE_ENV["PATH"])
    if program is None:
        raise OSError(errno.ENOENT, "env is not on the sandbox's PATH")
    fds = session.namespace_fds(_NAMESPACES)
    try:
        return fds, _host.exec_cgroup(session._cgroups["track"], label), userland_layout(), program
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise


__all__ = [
    "HOME",
    "SOURCE_PREFIX",
    "exec_private",
    "split_directory",
    "userland_layout",
]
