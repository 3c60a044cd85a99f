"""The ``local`` Environment: a fresh directory per session, commands run on the host.

Each session is a new directory (``tempfile.mkdtemp`` under ``root``, the
system temp dir by default) holding ``app``, ``tests``, ``logs`` and
``solution``. Commands run as the current user with ``bash -c`` in a new
session and process group, starting in ``app``, with the absolute paths of
those four directories in ``APP_DIR``, ``TESTS_DIR``, ``LOGS_DIR`` and
``SOLUTION_DIR``. File paths are relative to the sandbox directory, or
absolute under one of the virtual roots ``/app``, ``/tests``, ``/logs``,
``/solution``, so code written for the Harbor layout works unchanged as long
as its shell scripts say ``${APP_DIR:-/app}`` instead of ``/app``.

Every process starts from an empty environment plus a fixed minimal set
(:data:`BASE_ENV`: ``PATH``, ``HOME``, ``LANG``), the four directory variables,
the two tag variables below and what the caller's ``env`` adds: none of the
runtime's own variables (an API key, a token) is passed on. ``PATH`` is a
fixed default, not the runtime's, which can name a virtualenv or a user's
private tool directories; ``HOME`` is the sandbox directory, so tools that
write under ``~`` write into the session and go with it.

``read_file`` and ``write_file`` never follow a symbolic link and never open
what the session made for reading unless it is a regular file within the
caller's ``max_bytes`` (:func:`agentcompass.runtime.read_beneath`); a write
replaces the file by a rename. A link on the way, a FIFO, a device or a file
too large raises :class:`agentcompass.FileRefusedError`.

Non-goals: this is not a security boundary. It enforces only the ``full``
network policy (:meth:`LocalEnvironment.build_config` rejects any other).
Its file operations confine the runtime's own reads and writes, not the
session, whose commands run as your user and can read and write whatever you
can. In particular, what :class:`~agentcompass.runtime.EnvironmentSession`
asks of every provider, that a session never sees the runtime's variables,
files or credentials, ``local`` cannot meet: the runtime's pid is not hidden
(a command can find it as its parent's parent), and a process of the same
user reads ``/proc/<runtime pid>/environ``, the runtime's environment as it
was when it started, and its files. Keep secrets out of the runtime's
environment when running untrusted agents on ``local``, or use the
``sandbox`` plugin for isolation.

Every process a session starts carries ``AGENTCOMPASS_SANDBOX=<sandbox dir>``
and ``AGENTCOMPASS_SANDBOX_NAME=<session name>`` in its environment, and the
sandbox directory is ``agentcompass-local-<session name>-XXXXXXXX``, so that
``sweep(tag)`` finds both even for a session whose handle was never
journalled. On Linux, ``close`` and ``reap`` use the first to find and kill
what the sandbox left running, including daemons that left their process
group, and to never signal a process-group id that an unrelated process
reused after the sandbox's group died (``_procs.py``: one ``/proc`` scan,
one kill loop). Sessions closing at the same time share their passes over ``/proc``.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import secrets
from collections.abc import Callable, Collection
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import attrs
import trio

from agentcompass import register
from agentcompass.runtime import (
    BaseEnvironment,
    ComponentError,
    EnvironmentSession,
    ExecResult,
    ExecutionPlan,
    IssueError,
    NetworkPolicy,
    OutputCallback,
    cleanup_deadline,
    exec_keeping_tails,
    read_beneath,
    write_beneath,
)

from ._child import Child, spawn
from ._pipe import Pipe
from ._procs import SANDBOX_ENV, SANDBOX_NAME_ENV, Marked, kill_marked
from ._sandbox_dirs import DIR_PREFIX as DIR_PREFIX
from ._sandbox_dirs import MARKER_FILE as MARKER_FILE
from ._sandbox_dirs import SUBDIRS as SUBDIRS
from ._sandbox_dirs import is_leftover_sandbox, make_sandbox, remove_sandbox, tagged_sandboxes

__all__ = ["LocalEnvironment", "LocalSession"]

_NAME = re.compile(r"[a-z0-9-]{1,40}")
#: What every process of a session starts from besides the sandbox's own
#: variables (``HOME`` is set to the sandbox directory at open).
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
#: ``exit_code`` of a command killed at its timeout, as coreutils ``timeout`` reports it.
TIMEOUT_EXIT_CODE = 124


def _fail(message: str) -> IssueError:
    return IssueError("fatal", "environment_failed", message)


@register
class LocalEnvironment(BaseEnvironment):
    """A fresh directory per session on this host, commands run as your user: no isolation, open network.

    Only the ``full`` network policy. Each session holds ``app``, ``tests``,
    ``logs`` and ``solution``, named by ``APP_DIR``, ``TESTS_DIR``,
    ``LOGS_DIR`` and ``SOLUTION_DIR``; commands start in ``app`` (see the
    module docstring). Not a security boundary: use ``sandbox`` (or
    ``docker``) for agents you do not trust. Config: ``root`` (where sandbox
    directories are made; the system temp dir when ``None``),
    ``max_output_bytes`` (per stream of one ``exec``; default 1 MiB)."""

    id: ClassVar[str] = "local"

    @attrs.frozen
    class Config:
        root: Path | None = attrs.field(default=None, metadata={"doc": "where sandbox directories go (system temp)"})
        max_output_bytes: int = attrs.field(
            default=1048576, validator=attrs.validators.gt(0), metadata={"doc": "exec output kept per stream"}
        )
        env: dict[str, str] = attrs.field(factory=dict, metadata={"doc": "variables every command of a session gets"})

    def build_config(self, plan: ExecutionPlan) -> Any:
        """Return the ``open`` config; reject a plan with any non-``full`` phase
        policy, since ``local`` cannot restrict the network."""
        for phase, policy in (
            ("baseline", plan.baseline_network_policy),
            ("run", plan.run_network_policy),
            ("evaluation", plan.evaluation_network_policy),
        ):
            if policy.mode != "full":
                raise ComponentError(
                    f"environment 'local' cannot enforce network policy {policy.mode!r} "
                    f"for the {phase} phase (task {plan.task_id!r}); it only runs 'full' "
                    "- use an isolating provider such as 'sandbox'"
                )
        if plan.sandbox.workdir is not None:
            raise ComponentError(
                f"environment 'local' starts commands in APP_DIR, not {plan.sandbox.workdir!r} (task {plan.task_id!r})"
            )
        if plan.sandbox.user is not None:
            raise ComponentError(f"environment 'local' runs commands as the runtime's user (task {plan.task_id!r})")
        if plan.sandbox.env:
            return attrs.evolve(self.options, env={**self.options.env, **plan.sandbox.env})
        return self.options

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> LocalSession:
        """Make the sandbox directory and return its session. ``config`` is what
        :meth:`build_config` returned, a config dict, or ``None`` (this
        instance's config). ``name`` (invented when ``None``) labels the
        directory (``agentcompass-local-<name>-XXXX``), its marker and every
        process the session starts. A failure removes whatever was made
        before raising."""
        if policy.mode != "full":
            raise _fail(f"environment 'local' cannot enforce network policy {policy.mode!r}")
        options = self.options if config is None else config
        if isinstance(options, dict):
            options = LocalEnvironment(options).options  # checked as the component's own config
        if name is None:
            name = f"local-{secrets.token_hex(4)}"
        elif not _NAME.fullmatch(name):
            raise _fail(f"session name {name!r} is not 1-40 characters of [a-z0-9-]")
        root = await trio.to_thread.run_sync(make_sandbox, options.root, name)
        # No checkpoint between making the directory and handing over the session
        # that owns it, so a cancellation cannot leak it.
        return LocalSession(root, options.max_output_bytes, name, options.env)

    async def reap(self, handle: dict[str, Any]) -> None:
        """Kill what the sandbox named by ``handle`` left running and remove its
        directory. Idempotent: a missing directory is fine. A directory without
        the marker file is refused (WARNING ``cleanup_failed``), never removed."""
        path = handle.get("path") if isinstance(handle, dict) else None
        if not isinstance(path, str) or not os.path.isabs(path):
            raise IssueError("warning", "cleanup_failed", f"not a local sandbox handle: {handle!r}")
        if await trio.to_thread.run_sync(is_leftover_sandbox, path):
            await kill_marked(_in_sandboxes({path}))
            await trio.to_thread.run_sync(remove_sandbox, path)

    async def sweep(self, tag: str) -> None:
        """Kill every process and remove every sandbox directory under ``root``
        whose session name starts with ``tag`` (idempotent). Finds what a
        process killed inside :meth:`open` left: the directory is named before
        anything is put in it, and a directory of ours holding nothing but
        its empty subdirectories and marker is removed even without a marker."""
        if not tag or not _NAME.fullmatch(tag):
            raise ValueError(f"sweep tag {tag!r} is not 1-40 characters of [a-z0-9-]")
        paths = await trio.to_thread.run_sync(tagged_sandboxes, self.options.root, tag)
        # Also the processes of a sandbox whose directory is already gone.
        in_paths = _in_sandboxes(paths)
        await kill_marked(lambda p: in_paths(p) or (p.name is not None and p.name.startswith(tag)))
        for path in paths:
            await trio.to_thread.run_sync(remove_sandbox, path)


class LocalSession(EnvironmentSession):
    """One open ``local`` sandbox (see the module docstring for the layout).

    Every operation after :meth:`close` raises FATAL ``environment_failed``,
    as does a path that names a place outside the sandbox (``..`` climbing
    out, an absolute path outside the virtual roots). A symbolic link
    anywhere on a file's path (even one pointing inside), a file that is not
    regular or one longer than ``max_bytes`` raises
    :class:`~agentcompass.FileRefusedError`. Other file errors are the usual
    ``OSError`` subclasses (``FileNotFoundError`` ...).
    """

    def __init__(self, root: str, max_output_bytes: int, name: str = "", env: dict[str, str] | None = None):
        self._root = Path(root)
        self.name = name
        self._max_output = max_output_bytes
        self._dirs = {sub: str(self._root / sub) for sub in SUBDIRS}
        # Nothing of the runtime's own environment: the fixed base, the plan's,
        # the sandbox's variables and (per exec) the caller's.
        self._env = {**BASE_ENV, "HOME": str(self._root), **(env or {})}
        self._env.update({f"{sub.upper()}_DIR": path for sub, path in self._dirs.items()})
        self._env[SANDBOX_ENV] = str(self._root)
        self._env[SANDBOX_NAME_ENV] = name
        # What a spawn passes when the call adds no variables: encoded once, not per exec.
        self._spawn_env = {os.fsencode(key): os.fsencode(value) for key, value in self._env.items()}
        # Process groups started here; close kills whatever is still in them.
        self._pgids: set[int] = set()
        self._closed = False
        self._removed = False

    @property
    def handle(self) -> dict[str, Any]:
        return {"path": str(self._root)}

    def _check_open(self) -> None:
        if self._closed:
            raise _fail(f"local sandbox {self._root} is closed")

    def _resolve(self, path: str | os.PathLike[str]) -> Path:
        """Map a sandbox path to a host path inside the sandbox (blocking: it reads symlinks)."""
        resolved = (self._root / self._relative(path)).resolve()
        if not resolved.is_relative_to(self._root):
            raise _fail(f"path {os.fspath(path)!r} resolves outside the sandbox")
        return resolved

    def _resolve_dir(self, path: str | None) -> str:
        directory = self._resolve(path) if path is not None else Path(self._dirs["app"])
        if not directory.is_dir():
            raise _fail(f"working directory {path!r} does not exist in the sandbox")
        return str(directory)

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (``bash -c cmd``, or an argv list) in a new process group.

        ``cwd`` defaults to ``app``; a relative ``cwd`` is relative to the
        sandbox directory, like file paths. The environment is
        :data:`BASE_ENV` and ``HOME`` (the sandbox directory), then
        ``APP_DIR``, ``TESTS_DIR``, ``LOGS_DIR``, ``SOLUTION_DIR``, then ``env``
        (which may override all of them), then ``AGENTCOMPASS_SANDBOX`` and
        ``AGENTCOMPASS_SANDBOX_NAME``; nothing of the runtime's own.

        Output: each stream keeps its **tail**, at most ``max_output_bytes``
        bytes (the end of a log is where the verdict and the traceback are); a
        truncated stream starts with a ``[... N earlier bytes dropped ...]``
        line within that bound. Bytes are decoded as UTF-8 with
        ``errors="replace"``. The call returns when the command exits, plus
        up to half a second to read output still buffered: it does not wait for
        background processes that inherited its pipes (they keep running until
        :meth:`close`).

        At ``timeout`` seconds the whole process group is killed and the result
        has ``timed_out=True``, ``exit_code=124`` and the output so far. If the
        caller cancels, the group is killed too before ``Cancelled`` propagates.
        A command killed by a signal has ``exit_code=-signum``. Failing to start
        the process at all raises FATAL ``environment_failed``.
        """
        return await exec_keeping_tails(self.exec_stream, self._max_output, cmd, timeout, cwd, env)

    async def exec_stream(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        on_output: OutputCallback,
    ) -> ExecResult:
        """Run ``cmd`` as :meth:`exec` does, handing every chunk of output (as
        read from the pipe: 64 KiB at most, 1 MiB once the pipe is busy) to
        ``on_output`` as it arrives; the result's ``stdout`` and ``stderr``
        are empty. While ``on_output`` is awaited that stream's pipe is not
        read, so the command blocks once the pipe is full. After the command
        exits, the half second spent waiting for output still buffered does
        not count time spent in ``on_output``."""
        self._check_open()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else [os.fspath(a) for a in cmd]
        if cwd is None:
            workdir = self._dirs["app"]  # checked below only if the spawn fails: no thread hop per exec
        else:
            workdir = await trio.to_thread.run_sync(self._resolve_dir, cwd)
            self._check_open()
        full_env: dict[str, str] | dict[bytes, bytes]
        if env:
            full_env = {**self._env, **env}
            full_env[SANDBOX_ENV] = self._env[SANDBOX_ENV]
            full_env[SANDBOX_NAME_ENV] = self._env[SANDBOX_NAME_ENV]
        else:
            full_env = self._spawn_env
        try:
            child = await spawn(argv, workdir, full_env)
        except OSError as exc:
            if cwd is None and not await trio.to_thread.run_sync(os.path.isdir, workdir):
                raise _fail("working directory '/app' does not exist in the sandbox") from None
            raise _fail(f"could not start {argv[0]!r}: {exc}") from None
        # start_new_session makes the child a group leader: its pid is the pgid.
        self._pgids.add(child.pid)
        pipes = (Pipe("stdout", child.stdout), Pipe("stderr", child.stderr))
        timed_out = False
        try:
            self._check_open()  # close() may have run while the process was starting
            async with trio.open_nursery() as nursery:
                for pipe in pipes:
                    nursery.start_soon(pipe.pump, on_output)
                with trio.move_on_after(math.inf if timeout is None else max(timeout, 0)) as deadline:
                    await child.wait()
                if deadline.cancelled_caught:
                    timed_out = True
                    child.kill_group()  # the leader is not reaped yet, so the pgid is still ours
                    await child.wait()
                for pipe in pipes:
                    pipe.command_exited()
        except BaseException:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await self._kill_exec(child)
            raise
        finally:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await child.aclose()
        code = TIMEOUT_EXIT_CODE if timed_out else child.returncode
        assert code is not None  # the process was waited for
        return ExecResult(exit_code=code, timed_out=timed_out)

    async def _kill_exec(self, child: Child) -> None:
        """Kill the group of an exec that failed or was cancelled, and reap it."""
        if child.returncode is None:
            child.kill_group()
            await child.wait()
        else:
            # The leader is reaped, so its pgid may be free: only signal it while
            # a process of this sandbox is still in it.
            await kill_marked(_in_sandboxes({str(self._root)}), {child.pid}, sweep=False)

    def _relative(self, path: str | os.PathLike[str]) -> str:
        """The sandbox-relative form of a file path, checked lexically only:
        what is on the disk is checked by each step of the walk beneath."""
        raw = PurePosixPath(os.fspath(path))
        if raw.is_absolute():
            parts = raw.parts[1:]
            if not parts or parts[0] not in SUBDIRS:
                raise _fail(
                    f"path {str(raw)!r} is outside the sandbox "
                    "(absolute paths must start with /app, /tests, /logs or /solution)"
                )
            relative = "/".join(parts)
        else:
            relative = str(raw)
        norm = posixpath.normpath(relative)
        if norm == ".." or norm.startswith("../"):
            raise _fail(f"path {str(raw)!r} resolves outside the sandbox")
        return norm

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes of the regular file at ``path``, at most ``max_bytes``
        (path rules and refusals in the class docstring). Never blocks on
        what it opens; a cancellation abandons the read (nothing is left half-done)."""
        self._check_open()
        relative = self._relative(path)
        return await trio.to_thread.run_sync(read_beneath, self._root, relative, max_bytes, abandon_on_cancel=True)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Replace the file at ``path`` (a rename over it: a link or FIFO there is
        replaced, not written through), making its parent directories; ``str``
        is written as UTF-8. A link on the way is refused. A cancellation takes
        effect once the write is done (it never waits on the session), so a
        file is never left half-written."""
        self._check_open()
        relative = self._relative(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await trio.to_thread.run_sync(write_beneath, self._root, relative, payload)

    async def expose_directory(self, host_path: str) -> str:
        """``host_path`` itself: a ``local`` session runs on the host's
        filesystem and isolates nothing, so nothing is mounted (and nothing
        makes the directory read-only for it)."""
        self._check_open()
        path = trio.Path(host_path)
        if not path.is_absolute() or not await path.is_dir():
            raise _fail(f"cannot expose {host_path!r}: not an absolute path of a directory")
        return host_path

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        """Accept ``full`` (the only policy ``local`` has); anything else is FATAL."""
        self._check_open()
        if policy.mode != "full":
            raise _fail(f"environment 'local' cannot enforce network policy {policy.mode!r}")

    async def close(self) -> None:
        """Kill every process the session left running and remove the directory.

        Idempotent; if a close is interrupted (cancelled, or removal failed),
        calling it again finishes the job.
        """
        self._closed = True
        if self._removed:
            return
        root = str(self._root)
        # Abandoned if the caller's grace runs out (a stalled disk, a process
        # that will not die): killing and removing are safe to leave running,
        # and an interrupted close is finished by another close or by reap.
        await kill_marked(_in_sandboxes({root}), set(self._pgids))
        await trio.to_thread.run_sync(remove_sandbox, root, abandon_on_cancel=True)
        self._removed = True


def _in_sandboxes(roots: Collection[str]) -> Callable[[Marked], bool]:
    """Picks the processes marked with one of ``roots``."""
    return lambda process: process.sandbox in roots
