"""Private runs: one command with a directory that nothing else in the session can reach.

:func:`exec_private` is how a verifier writes its reward where processes an
agent left running cannot rewrite it, while they keep running for the
verifier to test. Being in a mount namespace of its own is not enough: the
agent's processes have the verifier's uid, so any process of the verifier
they can *see* in their pid namespace is one whose ``/proc/<pid>/root`` (and
``cwd``, ``fd``, ptrace) they may use. The private command is therefore
never in the session's pid namespace, nor in a child of it.

How, step by step (one process chain from the runtime, every step checked
on this host's kernel):

1. The exec's wrapper puts the chain into a leaf of the session's cgroup
   (so a timeout, a cancellation and ``close`` kill it as they kill an exec).
2. ``nsenter`` joins the session's mount, UTS, IPC, network and cgroup
   namespaces by the descriptors the session holds, but neither its user
   namespace (it stays the host's root) nor its pid namespace.
3. ``unshare`` makes a new mount namespace (a private copy: nothing mounted
   in it propagates back) and a new pid namespace, a child of the host's:
   the session's processes can neither see nor name anything in it. Its
   pid 1 is a root shell with ``/proc`` for that pid namespace mounted.
4. That shell mounts a fresh, size-capped tmpfs over the Harbor directory
   holding ``directory`` (``/logs`` for ``/logs/verifier``), makes
   ``directory`` in it, and binds the other entries that directory had back
   in place. Covering the whole Harbor directory matters: a mount on
   ``/logs/verifier`` itself sits on a dentry the agent can rename or
   remove, which moves or detaches the mount in every namespace; ``/logs``
   is a mount point of the session and cannot be.
5. It says ``ready``; the runtime opens the tmpfs through
   ``/proc/<pid>/root`` of its own unreaped child (whose mount namespace
   this is) and keeps that descriptor, so the files outlive the process
   tree (a timeout kills the tree before anything could copy them); then
   it says ``go``.
6. The shell joins the session's user namespace as uid/gid 1000 (no
   capabilities once it execs) and runs the command as :meth:`exec` would.
   When the command ends, so does pid 1, and with it every process the
   command left behind.
7. The runtime walks ``directory`` through its descriptor without following
   a link (:func:`agentcompass.runtime.read_beneath`) and closes it: no host
   directory is ever made, so there is nothing on the host to remove.

Trade-offs (non-goals): the command does not see the session's processes
(``ps``, ``pgrep``, ``kill -0 $(cat pidfile)`` find nothing), while it
reaches their services by the network namespace, ``/tmp`` and the other
directories, which are the session's; ``/proc/self`` is its own, so
programs that read ``/proc/self/exe`` work. Entries of the covered Harbor
directory other than ``directory`` are bound back as they were when the
command started (directories and regular files, at most
:data:`_BIND_BACK_MAX`); what the agent adds there later is not seen.
Processes the command starts in the background end with it. Don't confuse
this with a sandbox for the command: it runs code and reads files the agent
may have written, and whatever the command runs can write its own result.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import posixpath
import stat
import subprocess
from typing import TYPE_CHECKING

import trio

from agentcompass import ExecResult, FileRefusedError
from agentcompass.runtime import OutputTail, cleanup_deadline, read_beneath

from . import _host
from ._session import _DRAIN_SECONDS, _WRAP, BASE_ENV, TIMEOUT_EXIT_CODE, _pump, fail

if TYPE_CHECKING:
    from ._session import SandboxSession

#: The private tmpfs holds at least this much, so a verifier writing more
#: than ``max_bytes`` fails on a full disk only far past what is returned.
_TMPFS_MIN_BYTES = 64 * 1024 * 1024
_TMPFS_INODES = 65536
#: The private tmpfs's source name, then the session's: how the runtime
#: finds it in the mount table (and anyone finds it in a mount listing).
SOURCE_PREFIX = "agentcompass-private-"
#: How many entries of the covered Harbor directory are bound back at most
#: (the agent chooses them: a bound setup cost).
_BIND_BACK_MAX = 64
# ioctl(NS_GET_PID_FROM_PIDNS): the pid, here, of a pid namespace's init; ESRCH once it has died.
_NS_GET_PID_FROM_PIDNS = 0x8004B706
# Namespaces the chain enters by descriptor before unshare; the user
# namespace is joined last, by the shell, and the pid namespace never.
_JOINED = ("mnt", "uts", "ipc", "net", "cgroup")

# pid 1 of the private pid namespace, as the host's root in a private copy of
# the session's mounts. Arguments: the Harbor directory, the path beneath it
# (may be empty), the ready descriptor, descriptors to close, the tmpfs size
# and source name, the user namespace's path, then the command (env -i ...).
_SETUP = r"""
set -e
top=$1 sub=$2 ready=$3 close=$4 size=$5 source=$6 userns=$7
shift 7
for n in $close; do eval "exec $n>&-"; done
first=${sub%%/*}
exec 9<"$top"
mount -t tmpfs -o "size=$size,nr_inodes=__INODES__,mode=0755,uid=__UID__,gid=__UID__,nosuid,nodev" \
    "$source" "$top"
[ -z "$sub" ] || setpriv --reuid __UID__ --regid __UID__ --clear-groups mkdir -p -- "$top/$sub"
set +e
if [ -n "$first" ]; then
    # Best effort: the agent chose these names; whatever is odd is skipped.
    ls -A /proc/self/fd/9 | head -n __MAX__ | while IFS= read -r name; do
        [ "$name" = "$first" ] && continue
        src=/proc/self/fd/9/$name
        if [ -d "$src" ] && [ ! -L "$src" ]; then
            mkdir -- "$top/$name" && mount --no-canonicalize --bind -- "$src" "$top/$name"
        elif [ -f "$src" ] && [ ! -L "$src" ]; then
            : > "$top/$name" && mount --no-canonicalize --bind -- "$src" "$top/$name"
        fi
    done 2>/dev/null
fi
exec 9<&-
echo ready >&"$ready"
eval "exec $ready>&-"
read -r _ || exit 125
exec </dev/null
nsenter "--user=$userns" -S __INSIDE__ -G __INSIDE__ "$@"
exit $?
""".replace("__INODES__", str(_TMPFS_INODES)).replace("__MAX__", str(_BIND_BACK_MAX))
_SETUP = _SETUP.replace("__UID__", str(_host.HOST_UID))
_SETUP = _SETUP.replace("__INSIDE__", str(_host.INSIDE_UID))

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def split_directory(directory: str) -> tuple[str, str]:
    """(Harbor directory, path beneath it) of ``directory``; only a Harbor
    directory or a path under one can be made private."""
    norm = posixpath.normpath(directory)
    parts = norm.split("/")[1:] if posixpath.isabs(norm) else []
    if not parts or parts[0] not in _host.SUBDIRS:
        raise fail(f"private directory {directory!r} is not /app, /tests, /logs or /solution or a path under one")
    return "/" + parts[0], "/".join(parts[1:])


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
    source = SOURCE_PREFIX + session.name
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
    nsenter = session.nsenter_args()  # raises when the session has not started
    fds = session._ns_fds
    _check_init(session.name, fds["pid"])
    joined = [a for a in nsenter if not a.startswith(("--user=", "--pid="))]
    if len(joined) != 1 + len(_JOINED):
        raise fail(f"sandbox {session.name}: unexpected nsenter options {nsenter!r}")
    try:
        leaf = await trio.to_thread.run_sync(_host.exec_cgroup, session._cgroups["track"], f"p{next(session._labels)}")
    except OSError as exc:
        raise fail(f"sandbox {session.name}: {exc}") from None
    root_fd: int | None = None  # the private tmpfs, held by the runtime
    try:
        session._check_open()
        ready_read, ready_write = os.pipe()
        try:
            passed = tuple(fds[ns] for ns in ("user", *_JOINED))
            full = [
                "/bin/sh", "-c", _WRAP, "sh", *session._procs_files(leaf), "--",
                *joined,
                "unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc",
                "bash", "-c", _SETUP, "bash", top, sub, str(ready_write), " ".join(str(fd) for fd in passed[1:]),
                str(max(_TMPFS_MIN_BYTES, 2 * max_bytes)), source, f"/proc/self/fd/{fds['user']}",
                "env", "-i", "-C", workdir, *(f"{k}={v}" for k, v in variables.items()), *argv,
            ]  # fmt: skip
            try:
                proc = await trio.lowlevel.open_process(
                    full,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=BASE_ENV,
                    pass_fds=(*passed, ready_write),
                )
            except BaseException as exc:
                os.close(ready_read)
                if isinstance(exc, OSError):
                    raise fail(f"sandbox {session.name}: could not start nsenter: {exc}") from None
                raise
            ready = trio.lowlevel.FdStream(ready_read)  # closes ready_read from here on
        finally:
            os.close(ready_write)
        out, err = OutputTail(session._max_output), OutputTail(session._max_output)
        timed_out = False
        started = True
        try:
            async with trio.open_nursery() as nursery:
                out_done, err_done = trio.Event(), trio.Event()
                nursery.start_soon(_pump, proc.stdout, out, out_done)
                nursery.start_soon(_pump, proc.stderr, err, err_done)
                with trio.move_on_after(math.inf if timeout is None else max(timeout, 0)) as deadline:
                    said = b""
                    while b"\n" not in said and (chunk := await ready.receive_some(64)):
                        said += chunk
                    if said == b"ready\n":
                        # Our unreaped child: its pid is its own, and the mount
                        # namespace behind its root is the private one. A procfs
                        # walk into a tmpfs: it cannot block.
                        root_fd = _open_private(proc.pid, top, source)
                        assert proc.stdin is not None
                        await proc.stdin.send_all(b"go\n")
                        await proc.stdin.aclose()
                    else:
                        started = False
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
                await ready.aclose()
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        await stream.aclose()
        if not started and not timed_out:
            raise fail(f"sandbox {session.name}: the private run did not start: {' '.join(err.text().split())[:300]}")
        files: dict[str, bytes] = {}
        if root_fd is not None:
            files = await trio.to_thread.run_sync(collect, root_fd, sub, max_bytes, abandon_on_cancel=False)
        code = TIMEOUT_EXIT_CODE if timed_out else proc.returncode
        assert code is not None
        return ExecResult(exit_code=code, stdout=out.text(), stderr=err.text(), timed_out=timed_out), files
    finally:
        # Acquired together, released together: the tree (nothing of it may
        # outlive the call: its pid namespace died with its pid 1), the
        # leaf, and the tmpfs (gone with its last reference, this one).
        with trio.move_on_at(cleanup_deadline(), shield=True):
            if root_fd is not None:
                os.close(root_fd)
            await trio.to_thread.run_sync(_host.kill_cgroup, leaf, True)


def _check_init(name: str, pidns_fd: int) -> None:
    """Refuse to run in a session whose init has died, as :meth:`exec` does
    (it enters the pid namespace; a private run never does)."""
    try:
        fcntl.ioctl(pidns_fd, _NS_GET_PID_FROM_PIDNS, 1)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise fail(f"sandbox {name}: its init has ended") from None
        if exc.errno not in (errno.ENOTTY, errno.EINVAL):  # an older kernel: exec's check catches it
            raise fail(f"sandbox {name}: {exc}") from None


def _open_private(pid: int, top: str, source: str) -> int:
    """A descriptor of the private tmpfs at ``top`` in the mount namespace of
    ``pid``, checked against that namespace's mount table: the top mount
    there must be the setup's tmpfs, and the descriptor on it."""
    try:
        fd = os.open(f"/proc/{pid}/root{top}", _DIR_FLAGS)
    except OSError as exc:
        raise fail(f"the private run's directory is gone: {exc}") from None
    try:
        with open(f"/proc/{pid}/mountinfo", "rb") as f:
            table = f.read().decode(errors="replace")
        device = None  # of the last mount at top: the one on top
        for line in table.splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4] == top:
                after = fields[fields.index("-") + 1 :] if "-" in fields else []
                device = fields[2] if after[:2] == ["tmpfs", source] else None
        info = os.fstat(fd)
        if device != f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}":
            raise fail(f"the private run's {top} is not its own tmpfs")
    except BaseException:
        os.close(fd)
        raise
    return fd


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


__all__ = ["SOURCE_PREFIX", "collect", "exec_private", "split_directory"]
