"""Private runs under ``docker``: the verifier beside the agent's processes, out of their reach.

A Docker exec cannot have a mount or pid namespace of its own, and any
process the agent left running (root in the container, as the verifier)
that can *see* the verifier's processes can reach their files through
``/proc/<pid>/root``. So where the daemon runs on this host (the runtime is
root and the container's init is one of this host's processes: its cgroup
names the container), the run is made from the host, as under ``sandbox``,
by :data:`agentcompass.runtime.PRIVATE_INIT_SCRIPT`:

0. When the session starts, before anything of the agent's runs,
   :func:`snapshot` copies the init's seccomp filters (by ``ptrace``, while
   its pidfd shows it alive), capability bounding set and no_new_privs: what
   a later run installs cannot have been changed by the agent, nor can the
   agent make the copy fail (a process tracing the init).
1. The script joins the container's cgroups, then its mount, UTS, IPC,
   network and cgroup namespaces by descriptors opened while the daemon
   reported that init; never its pid namespace.
2. A private copy of the mounts and a new pid namespace, a child of the
   host's: no process of the container can see or name anything in it.
3. A new root the runtime's alone: each of the container's top-level
   entries bound into it, a fresh ``/proc``, and on the directory holding
   ``directory`` (``/logs``) and on each directory of the inputs (``/tests``)
   fresh tmpfses whose descriptors come back to the runtime, which writes
   the inputs and later reads the private directory through them.
4. The command runs as an exec in the container would: the container's
   user, environment and working directory, its capability bounding set,
   no_new_privs and seccomp filters; everything it leaves ends with it.

Elsewhere (a remote daemon, a user namespace remapped, an AppArmor or
SELinux label the runtime cannot apply, not root) :func:`target` says why
not, and the session raises :exc:`NotImplementedError`: the caller falls
back to ``exec`` and ``read_file``, after the provider says once in the
run's log that the agent's processes can race that verifier.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Protocol

import trio

from agentcompass import ExecResult, FileRefusedError, IssueError
from agentcompass.runtime import (
    PRIVATE_INIT_SCRIPT,
    PRIVATE_MAX_ENTRIES,
    PRIVATE_TMPFS_MIN_BYTES,
    PrivateHandover,
    collect_private_files,
    private_directory_parts,
    private_input_bytes,
    private_input_groups,
    supervise_process,
)

from ._api import Engine
from ._host_view import NO_SNAPSHOT as NO_SNAPSHOT
from ._host_view import NotLocal as NotLocal
from ._host_view import Snapshot as Snapshot
from ._host_view import account as account
from ._host_view import cgroup_procs as cgroup_procs
from ._host_view import snapshot as snapshot
from ._host_view import snapshot_or_reason as snapshot_or_reason
from ._host_view import target as target


class Session(Protocol):
    """What a private run needs of its docker session."""

    name: str
    engine: Engine
    max_output: int

    def _check_open(self) -> str: ...

    def _path(self, path: str) -> str: ...

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes: ...


#: The private tmpfs's source name prefix (then the session's name): how anyone finds it in a mount listing.
SOURCE_PREFIX = "agentcompass-private-"
# How much of /etc/passwd and /etc/group of the container is read to find its user.
_ACCOUNTS_BYTES = 1 << 20
# Userland directories bound first, so no number of names the agent made pushes them out.
_FIRST_ENTRIES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "sys", "tmp", "run", "var")


async def exec_private(
    session: Session,
    snap: Snapshot,
    cmd: str | list[str],
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    *,
    directory: str,
    max_bytes: int,
    inputs: Mapping[str, bytes] | None,
) -> tuple[ExecResult, dict[str, bytes]]:
    """``DockerSession.exec_private`` (the mechanism in the module
    docstring); :class:`NotLocal` when this host cannot make it."""
    container = session._check_open()
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    top, sub = private_directory_parts(directory)
    groups = private_input_groups(inputs, top)
    info = await session.engine.request("GET", f"/containers/{container}/json")
    config = info.get("Config") or {}
    passwd, group = await _accounts(session)
    uid, gid, supplementary, home = account(str(config.get("User") or ""), passwd, group)
    found = await trio.to_thread.run_sync(target, str(info.get("Id") or container), info)
    handover = PrivateHandover(groups, (uid, gid))
    try:
        again = await session.engine.request("GET", f"/containers/{container}/json")
        if (again.get("State") or {}).get("Pid") != found.pid:
            raise IssueError("fatal", "environment_failed", f"docker session {session.name}: the container restarted")
        variables = dict(v.split("=", 1) for v in config.get("Env") or [] if "=" in v)
        variables.setdefault("HOME", home)
        variables.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        variables.update(env or {})
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        channel = trio.socket.from_stdlib_socket(ours)
        try:
            fds = {**found.fds}
            run_config = {
                "fds": fds,
                "top": top,
                "sub": sub,
                "size": max(PRIVATE_TMPFS_MIN_BYTES, 2 * max_bytes),
                "source": SOURCE_PREFIX + session.name,
                "userland": [],
                "reserved": [],
                "session_entries": list(_FIRST_ENTRIES),
                "host_uid": uid,
                "inside_uid": uid,
                "max_entries": PRIVATE_MAX_ENTRIES,
                "inputs": [[name, private_input_bytes(g)] for name, g in groups.items()],
                "home": "",
                "home_size": 0,
                "program": None,
                "argv": ["bash", "-c", cmd] if isinstance(cmd, str) else [os.fspath(a) for a in cmd],
                "env": variables,
                "confine": {
                    "parent": os.getpid(),
                    "cgroup_procs": found.cgroup_procs,
                    "filters": [base64.b64encode(f).decode() for f in snap.filters],
                    "no_new_privs": snap.no_new_privs,
                    "bounding": snap.bounding,
                    "uid": uid,
                    "gid": gid,
                    "groups": supplementary,
                    "cwd": session._path(cwd or "."),
                },
            }
            argv = [sys.executable, "-I", "-S", str(PRIVATE_INIT_SCRIPT), str(theirs.fileno())]
            try:
                proc = await trio.lowlevel.open_process(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                    pass_fds=(*fds.values(), theirs.fileno()),
                )
            except BaseException as exc:
                channel.close()
                if isinstance(exc, OSError):
                    raise IssueError(
                        "fatal", "environment_failed", f"docker session {session.name}: no private run: {exc}"
                    ) from None
                raise
        finally:
            theirs.close()
            found.close()

        async def kill() -> None:
            proc.kill()

        async def hand_over() -> None:
            try:
                await handover.run(channel, run_config)
            except OSError as exc:
                raise IssueError(
                    "fatal", "environment_failed", f"docker session {session.name}: could not write the inputs: {exc}"
                ) from None

        try:
            # Killing the script kills its pid 1 (PDEATHSIG), and with it the private pid namespace.
            result = await supervise_process(proc, session.max_output, timeout, kill, hand_over)
        finally:
            channel.close()
        if not handover.started and not result.timed_out:
            session._check_open()
            raise IssueError(
                "fatal",
                "environment_failed",
                f"docker session {session.name}: the private run did not start: {' '.join(result.stderr.split())[:300]}",
            )
        files: dict[str, bytes] = {}
        if handover.held is not None:
            files = await trio.to_thread.run_sync(
                collect_private_files, handover.held, "/".join(sub), max_bytes, abandon_on_cancel=False
            )
        return result, files
    finally:
        handover.close()


async def _accounts(session: Session) -> tuple[str, str]:
    texts = []
    for path in ("/etc/passwd", "/etc/group"):
        try:
            data = await session.read_file(path, _ACCOUNTS_BYTES)
        except (FileRefusedError, IssueError, OSError):
            data = b""
        texts.append(data.decode("utf-8", errors="replace"))
    return texts[0], texts[1]
