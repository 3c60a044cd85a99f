"""How a command runs in a ``sandbox`` session: its command line, the
wrapper that puts it into its cgroups, ``nsenter`` into the session's
namespaces, and the supervision that keeps its output's tails and kills its
whole tree at a timeout or a cancellation. Shared by :mod:`._session` and
:mod:`._private`."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import PurePosixPath

import trio

from agentcompass import ExecResult, IssueError
from agentcompass.runtime import supervise_process

from . import _host

#: ``exit_code`` of a command killed at its timeout, as coreutils ``timeout`` reports it.
TIMEOUT_EXIT_CODE = 124
#: ``exit_code`` of an exec after the session's init has exited (nothing ran).
INIT_GONE_EXIT_CODE = 255
# Puts the process into the cgroups named before "--", then becomes the command.
WRAP = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# The sandbox's init: says it is up, then holds until the runtime closes its
# stdin (close(), or the runtime's exit).
INIT = "echo ready; read _"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The whole environment of every process the runtime starts for a session
#: (bwrap and its init, nsenter and its wrapper): the runtime's own
#: environment, which may hold API keys, never reaches a sandbox.
BASE_ENV = {"PATH": _PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
#: The namespaces an exec enters, as nsenter names them.
_NAMESPACES = (("user", "user"), ("mnt", "mount"), ("pid", "pid"), ("uts", "uts"), ("ipc", "ipc"),
               ("net", "net"), ("cgroup", "cgroup"))  # fmt: skip
NAMESPACE_NAMES = tuple(ns for ns, _ in _NAMESPACES)


def image_bwrap_argv(root: str, sysfs: str | None, hosts: str | None, exposed: str, share: list[str]) -> list[str]:
    """bwrap over an image's overlay ``root``: root inside with every capability
    of its own user namespace, whose 65536 ids the spawner maps to the
    images' unprivileged host range (bwrap waits for that on fd 4)."""
    mounts = ["--bind", root, "/", "--proc", "/proc", "--dev", "/dev"]
    if sysfs is not None:
        mounts += ["--ro-bind", sysfs, "/sys"]
    if hosts is not None:
        mounts += ["--ro-bind", hosts, "/etc/hosts"]
    if os.path.isfile("/etc/resolv.conf") and not os.path.islink("/etc/resolv.conf"):
        mounts += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    mounts += ["--ro-bind", exposed, _host.EXPOSED_INSIDE]
    return [
        "bwrap", "--die-with-parent", "--unshare-all", "--unshare-user", *share, "--userns-block-fd", "4",
        "--cap-add", "ALL", "--uid", "0", "--gid", "0", "--hostname", "sandbox", *mounts,
        # One wait on fd 4 (bwrap closes it after): for the maps, which the
        # spawner writes once bwrap and its child are in their cgroups.
        "--chdir", "/", "--info-fd", "3", "--", "sh", "-c", INIT,
    ]  # fmt: skip


def fail(message: str) -> IssueError:
    return IssueError("fatal", "environment_failed", message)


_root_binds_cache: list[str] | None = None


def root_binds() -> list[str]:
    """bwrap arguments mounting the host's userland read-only (blocking: reads /
    once per process; the layout of / does not change under a running runtime)."""
    global _root_binds_cache
    if _root_binds_cache is not None:
        return list(_root_binds_cache)
    args: list[str] = []
    for entry in _host.USERLAND:
        path = "/" + entry
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    _root_binds_cache = args
    return list(args)


async def supervise(
    proc: trio.Process,
    leaf: str,
    max_output: int,
    timeout: float | None,
    first: Callable[[], Awaitable[None]] | None = None,
) -> ExecResult:
    """:func:`agentcompass.runtime.supervise_process`, ending the whole tree
    by killing the cgroup ``leaf``."""

    async def kill() -> None:
        await trio.to_thread.run_sync(_host.kill_cgroup, leaf, False)

    return await supervise_process(proc, max_output, timeout, kill, first)


def command_line(cmd: str | list[str], cwd: str | None, env: Mapping[str, str] | None, home: str = "/tmp") -> list[str]:
    """``env -i -C WORKDIR VAR=... COMMAND``: ``cmd`` (``bash -c`` for a string)
    in ``cwd`` under ``/app``, with the session's fresh environment, then ``env``."""
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else [os.fspath(a) for a in cmd]
    variables = {
        **BASE_ENV,
        "HOME": home,
        "APP_DIR": "/app",
        "TESTS_DIR": "/tests",
        "LOGS_DIR": "/logs",
        "SOLUTION_DIR": "/solution",
        **(env or {}),
    }
    workdir = str(PurePosixPath("/app") / (cwd or "."))
    return ["env", "-i", "-C", workdir, *(f"{k}={v}" for k, v in variables.items()), *argv]


class InitGone(Exception):
    """The session's init has exited: its namespaces can no longer be entered."""


def nsenter_args(fds: dict[str, int]) -> list[str]:
    """``nsenter`` and its namespace options, by the descriptors of
    :meth:`SandboxSession.namespace_fds` (pass them with ``pass_fds``), never by pid."""
    return ["nsenter", *(f"--{option}=/proc/self/fd/{fds[ns]}" for ns, option in _NAMESPACES if ns in fds)]
