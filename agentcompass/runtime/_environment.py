"""The Environment contract (SPEC section 4): :class:`BaseEnvironment`, the
provider that opens sandboxes, and :class:`EnvironmentSession`, one open
sandbox. The runtime calls both from the scope that owns the sandbox and
turns any ``Exception`` they raise into an :class:`Issue`."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence  # at run time: get_type_hints resolves the session's open_* hints
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from ._component_base import Component
from ._results import ExecResult, Issue
from ._values import ExecutionPlan, NetworkPolicy

if TYPE_CHECKING:
    from ._output import OutputCallback

__all__ = ["BaseEnvironment", "EnvironmentSession"]


class EnvironmentSession:
    """One open sandbox, returned by :meth:`BaseEnvironment.open`.

    Paths are relative to the sandbox unless the provider documents
    otherwise. The runtime may call the methods of one session from several
    tasks (a harness's tools, a benchmark's collection) but never after
    ``close`` started. Every method is cancellable: on ``trio.Cancelled`` it
    stops what it started (kills the process tree, drops the transfer) and
    lets the cancellation propagate. Such cleanup (killing the tree,
    cancelling a remote operation) runs shielded: bound it with
    ``trio.move_on_at(agentcompass.runtime.cleanup_deadline(), shield=True)``,
    the run's one grace deadline, never a fixed number of seconds of your
    own. ``agentcompass.testing`` has a conformance kit that checks a
    provider against this contract.

    Everything a session runs is untrusted. Its processes (the init, every
    ``exec``, whatever they leave running) start from an empty environment
    plus what the plan and the component give: no variable, file,
    descriptor or credential of the runtime's own. The runtime addresses a
    session by something its processes cannot make refer to another
    session (a pidfd, a cgroup, a container id), never a pid number.
    """

    #: What opening the session produced that belongs to the attempt's
    #: record, set by the provider in ``open`` (default: nothing): issues
    #: (a WARNING such as ``image_built_instead``), log files (relative path
    #: -> bytes, kept in the attempt's ``logs/``, e.g. ``build.log``) and
    #: timings (name -> seconds, e.g. ``image_build``).
    open_issues: Sequence[Issue] = ()
    open_logs: Mapping[str, bytes] = MappingProxyType({})
    open_timings: Mapping[str, float] = MappingProxyType({})

    @property
    def handle(self) -> dict[str, Any]:
        """A small JSON dict identifying the sandbox for ``reap``."""
        raise NotImplementedError

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` in the sandbox and return its :class:`ExecResult`.

        ``cmd`` is a string run by ``bash -c`` or an argv list. ``cwd``
        defaults to the provider's working directory; ``env`` adds variables
        to the provider's environment.

        A non-zero exit is a normal result, not an error. When ``timeout``
        seconds pass (``None``: no limit), kill the whole process tree and
        return ``timed_out=True`` with the output so far. On cancellation,
        kill the tree and re-raise. Output beyond the provider's limit is
        truncated with a marker, never an error. Raise only when the command
        could not be run at all (the sandbox is gone).
        """
        raise NotImplementedError

    async def exec_stream(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        on_output: OutputCallback,
    ) -> ExecResult:
        """Run ``cmd`` as :meth:`exec` does, handing its output to ``on_output``
        as it arrives instead of keeping it.

        ``await on_output(stream, chunk)`` is called with ``stream``
        ``"stdout"`` or ``"stderr"`` and the next bytes of that stream, in
        order, none dropped: the caller decides what to keep
        (:class:`OutputTail` keeps what ``exec`` would). While a call is
        awaited, the provider reads no more of that stream, so a slow
        consumer slows the command down (its pipe fills) instead of making
        output pile up in memory. The result has ``exit_code`` and
        ``timed_out`` as ``exec`` would; its ``stdout`` and ``stderr`` are
        empty. Timeout and cancellation work as in ``exec`` (the timeout
        still fires while ``on_output`` blocks); an exception raised by
        ``on_output`` kills the command's tree and propagates (in an
        exception group where the provider runs tasks: catch it with
        ``except*``).

        Optional: this default runs :meth:`exec` and then hands over its
        result's text (already cut to the provider's limit, UTF-8 encoded),
        so every provider has it. A provider that reads output in chunks
        should override it and build ``exec`` on it.
        """
        result = await self.exec(cmd, timeout, cwd, env)
        if result.stdout:
            await on_output("stdout", result.stdout.encode("utf-8", errors="surrogateescape"))
        if result.stderr:
            await on_output("stderr", result.stderr.encode("utf-8", errors="surrogateescape"))
        return attrs.evolve(result, stdout="", stderr="")

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Return the bytes of the regular file at ``path``, at most ``max_bytes``
        (``None``: :data:`~agentcompass.runtime.DEFAULT_MAX_READ_BYTES`).

        What a session holds is hostile: its processes may swap any path
        component for a link while this runs. Never follow a symbolic link
        out of the session, never block on what the session made, never read
        more than the limit. Raise :exc:`FileNotFoundError` when the file
        does not exist (other file errors as the usual :exc:`OSError`
        subclasses) and :class:`~agentcompass.FileRefusedError` for a link
        on the way, a file that is not regular (a FIFO, a device, a socket)
        or one longer than ``max_bytes``. Refuse a path that names a place
        outside the sandbox (``..``, another root) by raising (``local``
        raises a FATAL :class:`IssueError`), never by reading the host's
        file. Like ``exec``, it is cancellable. Host-side providers get all
        of this from :func:`~agentcompass.runtime.read_beneath`.
        """
        raise NotImplementedError

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write ``data`` (a ``str`` is UTF-8 encoded) to ``path``, replacing the file.

        Create missing parent directories. Never write through a link or
        into a file the session planted at ``path``: replace it
        (:func:`~agentcompass.runtime.write_beneath`). Paths outside the
        sandbox are refused as in :meth:`read_file`.
        """
        raise NotImplementedError

    async def exec_private(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        directory: str,
        max_bytes: int,
        inputs: Mapping[str, bytes] | None = None,
    ) -> tuple[ExecResult, dict[str, bytes]]:
        """Run ``cmd`` as :meth:`exec` does, with ``directory`` replaced, for
        this command's process tree only, by a new empty directory that
        nothing else running in the session can see, read or write; return
        its result and the regular files the command left there (path
        relative to ``directory`` -> bytes, at most ``max_bytes`` in all;
        links, special files and what is past the limit are left out).

        ``inputs`` (absolute path -> bytes, e.g. ``/tests/test.sh``) are files
        the command reads from private directories too: each directory they
        name at the top (``/tests``) is, for the command, a new one holding
        only them, written by the runtime where nothing else can reach it. The
        command's ``HOME`` is a new empty private directory, so no dotfile
        planted in the session's own ``HOME`` runs in it.

        It is how a verifier reads its tests and writes its reward where
        processes an agent left running can touch neither, while they keep
        running for the verifier to test. It protects against processes, not
        against what the command itself chooses to run: a verifier that
        executes the agent's code gives that code its powers. Optional: the
        default raises :exc:`NotImplementedError` and callers then fall back
        to :meth:`exec` and :meth:`read_file`, which a process of the
        session can race.
        """
        raise NotImplementedError

    async def expose_directory(self, host_path: str) -> str:
        """Make the host directory ``host_path`` visible read-only inside the
        open session, and return the absolute path where the session sees it.

        The provider chooses that path (a running sandbox's root may be
        read-only or an image's, so "mount at P" cannot be promised
        everywhere); callers pass it on to what they run (an agent's
        installation from the host-side cache, say). Nothing in the session
        may write through it, change it, or reach anything of the host
        outside ``host_path`` through it; it disappears with the session.
        Calling it twice for one directory may give two paths. A provider
        whose sessions run on the host's filesystem (``local``) may return
        ``host_path`` itself.

        Optional: the default raises :exc:`NotImplementedError`, and a
        harness that needs it reports FATAL ``environment_unsupported``.
        ``sandbox`` binds the directory into the session's mount namespace
        while it runs; a container provider does the same through a
        per-session directory mounted with slave propagation at creation.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot expose a host directory")

    async def expose_socket(self, host_path: str) -> str:
        """Make the host unix socket ``host_path`` connectable from inside the
        session, and return its path there.

        This is how a session under network policy ``none`` reaches one
        service of the runtime's (the model gateway) and nothing else: a unix
        socket needs no network interface. The socket should sit alone in a
        directory of its own: the default exposes that directory with
        :meth:`expose_directory` (read-only; connecting to a socket needs no
        write access to its directory) and returns the socket's path in it.
        A provider that cannot share a filesystem with the host (a remote
        one) overrides it to relay connections instead.
        """
        if not posixpath.isabs(host_path):
            raise ValueError(f"expose_socket needs an absolute path, got {host_path!r}")
        directory, name = posixpath.split(posixpath.normpath(host_path))
        inside = await self.expose_directory(directory)
        return posixpath.join(inside, name)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        """Switch the live policy; raise if it cannot be enforced."""
        raise NotImplementedError

    async def close(self) -> None:
        """Destroy the sandbox and everything running in it.

        Idempotent, and safe after a partial open, a failed operation or a
        cancellation. The runtime calls it inside a shielded scope bounded by
        the cleanup grace (:func:`~agentcompass.runtime.cleanup_deadline`
        says until when), so it must finish or give up within bounded time;
        whatever it cannot destroy, raise about (WARNING ``cleanup_failed``)
        so ``compass reap`` can retry from :attr:`handle`.
        """
        raise NotImplementedError


class BaseEnvironment(Component):
    """A sandbox provider: opens :class:`EnvironmentSession` objects and destroys leftovers.

    Subclass it, set ``id`` (what capacity and open-rate limits key on) and
    implement :meth:`open`, :meth:`reap` and :meth:`sweep`. The runtime
    holds a capacity permit and an open-rate token for each ``open`` and
    journals every session's :attr:`EnvironmentSession.handle` so that a
    killed run's sandboxes can be reaped.
    """

    kind: ClassVar[str] = "environment"

    #: What this provider can honour of a plan's :class:`SandboxSpec` (SPEC 4):
    #: ``"images"`` (it builds ``build_context`` or pulls ``image`` and the
    #: session runs in that image's filesystem, user and working directory),
    #: ``"literal_paths"`` (``/app``, ``/tests``, ``/logs``, ``/solution``
    #: exist as such), ``"root"`` (commands may run as root) and ``"limits"``
    #: (``cpus``, ``memory_mb``, ``storage_mb`` enforced). A provider whose
    #: features depend on its config (``remote``) makes this a property.
    features: ClassVar[frozenset[str]] = frozenset()

    def missing_features(self, plan: ExecutionPlan) -> frozenset[str]:
        """What ``plan`` needs that this provider lacks: its ``sandbox``'s
        needs plus the benchmark plan's ``required_features`` list. The
        runtime checks it before :meth:`build_config` and records FATAL
        ``image_required`` (an image is missing) or ``environment_unsupported``."""
        needed = set(plan.sandbox.features())
        needed.update(plan.benchmark_plan.get("required_features") or ())
        return frozenset(needed) - frozenset(self.features)

    def preflight(self) -> None:
        """Check that this host can run this provider's sandboxes (sync, quick,
        opens nothing). Called before anything runs, by ``launch`` and
        ``compass validate``; raise :class:`ComponentError` with one line
        saying what is missing (the CLI exits 2). Default: nothing to check."""

    def build_config(self, plan: ExecutionPlan) -> Any:
        """Turn a plan into an ``open`` config (sync). Reject (raise
        :class:`ComponentError`) a plan whose phase policies this provider
        cannot enforce or switch: never run a phase with broader access."""
        return None

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> EnvironmentSession:
        """Create a sandbox under network ``policy`` and return its session.

        ``config`` is what :meth:`build_config` returned. ``name`` is chosen
        by the runtime (unique, ``[a-z0-9-]``, at most 40 characters,
        starting with the run's tag): label everything the sandbox is made
        of with it, so :meth:`sweep` finds it even when the process was
        killed before the handle was journalled. A provider written before
        the runtime passed ``name`` invents one when it is ``None``.

        If opening fails or is cancelled part-way, destroy whatever was
        made before raising (or re-raising ``trio.Cancelled``): the runtime
        only closes sessions it received. Unclassified exceptions are an
        open failure of the attempt (retried as the plan allows).
        """
        raise NotImplementedError

    async def reap(self, handle: dict[str, Any]) -> None:
        """Destroy the sandbox ``handle`` names, left behind by a killed process.

        Idempotent: a sandbox that no longer exists is fine. Raise when it
        exists and cannot be destroyed (``compass reap`` reports it).
        """

    async def sweep(self, tag: str) -> None:
        """Destroy every sandbox whose name starts with ``tag`` (a run's tag).

        Idempotent: nothing found is fine. It covers the sandboxes no journal
        names (killed between ``open`` starting and its handle being written).
        The default does nothing, for providers whose sandboxes cannot outlive
        the process.
        """
