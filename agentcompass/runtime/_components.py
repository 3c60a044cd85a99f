"""Base classes of the plugin contracts (SPEC section 4).

Every component class has a ``id`` class variable and is built as
``cls(config)`` from its ``ComponentRef.config``; one instance serves one
request. A component that declares a ``Config`` attrs class gets its config
checked and structured into ``self.options`` when it is built: an unknown
key or a bad value is a :class:`ComponentError` naming the component, raised
before any task runs.

The runtime calls the async methods from inside the scope that owns the
resource involved (SPEC section 2) and turns any ``Exception`` they raise
into an :class:`Issue` (SPEC section 6). To report a classified failure,
raise :class:`IssueError` or return issues in the result. Never swallow
``trio.Cancelled``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence  # at run time: get_type_hints resolves the session's open_* hints
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from ._convert import structure_config
from ._errors import ComponentError
from ._results import Evaluation, ExecResult, Issue, RunBudget, RunResult, TaskRecord
from ._values import (
    ExecutionPlan,
    ModelSpec,
    NetworkPolicy,
    PreparedTask,
    RunRequest,
    TaskSpec,
)

if TYPE_CHECKING:
    from ._output import OutputCallback

__all__ = [
    "BaseAnalyzer",
    "BaseBenchmark",
    "BaseEnvironment",
    "BaseHarness",
    "BaseRecipe",
    "Component",
    "EnvironmentSession",
    "HarnessFreeBenchmark",
]


class Component:
    """Common base: ``id``, ``kind`` and config checking."""

    id: ClassVar[str]
    kind: ClassVar[str] = "component"
    #: Optional attrs class describing the accepted config keys and defaults.
    Config: ClassVar[type | None] = None

    def __init__(self, config: dict[str, Any] | None = None):
        self.config: dict[str, Any] = dict(config or {})
        self.options: Any = self.config
        if self.Config is not None:
            self.options = structure_config(
                self.config, self.Config, where=f"{self.kind} {getattr(self, 'id', type(self).__name__)!r}"
            )


class BaseBenchmark(Component):
    """A set of tasks, how to prepare them and how to score an attempt.

    Subclass it, set ``id``, implement :meth:`load_tasks` and
    :meth:`evaluate`, and override the other hooks where the defaults do not
    fit. One instance serves one request; per-task state belongs in the
    returned values (``PreparedTask``, ``RunResult``), not on ``self``, since
    many tasks run at once.

    For every attempt the runtime calls, in order: :meth:`plan` (sync),
    :meth:`prepare_task` in the open task Environment, the harness (or
    ``run_task`` of a :class:`HarnessFreeBenchmark`), :meth:`collect_artifacts`
    while that Environment is still open, then :meth:`evaluate`. Each async
    hook runs inside a cancel scope with the phase's deadline (SPEC 5): when
    it expires or the run is cancelled, the hook receives ``trio.Cancelled``
    at its next checkpoint and must let it propagate (clean up in
    ``finally``). An ``Exception`` a hook raises becomes an :class:`Issue`
    with the severity and code each hook names; raise :class:`IssueError`
    to choose them yourself.

    ``metrics`` names the metric series ``evaluate`` fills; the first is the
    primary metric (the one ``pass`` looks at). ``evaluation_timeout_values``
    are recorded when evaluation times out (empty: leave the values missing).
    """

    kind: ClassVar[str] = "benchmark"
    metrics: ClassVar[tuple[str, ...]] = ("score",)
    evaluation_timeout_values: ClassVar[dict[str, Any]] = {}

    def preflight(self, request: RunRequest) -> None:
        """Check the benchmark's data before anything runs (sync; may block).

        Called by ``compass validate`` and at the start of ``launch`` (in a
        worker thread), after the config was structured and before any run
        directory is written or any sandbox opened. Check what ``load_tasks``
        and ``select_tasks`` would trip over, so that a config that validates
        does not fail at startup: the data exists and loads, every task has
        what it needs, every id in ``request.task_ids`` exists. Raise
        :class:`ComponentError` with one line that starts with the config
        key at fault (``path: task directory '/data/x' does not exist``,
        ``task_ids: no task 'nope'``); the runtime prefixes the request and
        the benchmark. Anything else raised is reported the same way, as a
        config error. The default checks nothing.
        """

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        """Return every task of the benchmark. Called once per request, before
        any task runs. An exception here fails the request, not a task."""
        raise NotImplementedError

    def task_source(self) -> dict[str, Any] | None:
        """Where the tasks :meth:`load_tasks` returned came from, for the
        record (sync): ``run_info.json`` keeps it under ``task_source``
        (the ``terminal`` benchmark: the registry, ``name@version`` and each
        task's resolved commit). Called after ``load_tasks``; JSON data; the
        default is None (nothing recorded)."""
        return None

    def select_tasks(self, tasks: list[TaskSpec], request: RunRequest) -> list[TaskSpec]:
        """Pick the tasks to run (sync). Default: ``request.task_ids`` (in the
        order given; unknown ids are a :class:`ComponentError`), then ``request.limit``."""
        if request.task_ids is not None:
            by_id = {t.task_id: t for t in tasks}
            missing = [t for t in request.task_ids if t not in by_id]
            if missing:
                raise ComponentError(f"benchmark {self.id!r} has no task {missing[0]!r}")
            tasks = [by_id[t] for t in request.task_ids]
        if request.limit is not None:
            tasks = tasks[: request.limit]
        return tasks

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        """Return the benchmark's part of the plan (sync, deterministic).

        Keys the runtime reads: ``evaluation_environment_mode``,
        ``baseline_network_policy``, ``run_network_policy``,
        ``evaluation_network_policy`` (``NetworkPolicy`` values),
        ``run_timeout_seconds``, ``evaluation_timeout_seconds``. Anything else
        is kept for the benchmark and comes back as ``benchmark_plan``.
        """
        return {}

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        """Put what the task needs into the open task Environment and return the agent's input.

        ``env`` is already open under the baseline network policy;
        ``benchmark_plan`` is what :meth:`plan` returned beyond the keys the
        runtime reads. Return a :class:`PreparedTask` (the default passes
        ``task.data`` as the input). Unclassified exceptions are FATAL
        ``setup_failed``: the attempt is not run.
        """
        return PreparedTask(task=task, input=dict(task.data))

    async def collect_artifacts(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession
    ) -> RunResult:
        """Gather deliverables while the task Environment is still open.

        Return ``run_result``, usually with files read from ``env`` added to
        its ``artifacts`` (``attrs.evolve``); it is what :meth:`evaluate` and
        the saved record see. Called after the run ended, also when it failed
        or timed out. Unclassified exceptions are FATAL ``collect_failed``.
        """
        return run_result

    async def evaluate(
        self,
        prepared: PreparedTask,
        run_result: RunResult,
        env: EnvironmentSession | None,
        request: RunRequest,
    ) -> Evaluation:
        """Score the attempt and return an :class:`Evaluation`.

        ``env`` follows the plan's ``evaluation_environment_mode``: the task
        Environment (``reuse``), a fresh one opened under the evaluation
        network policy (``fresh``) or ``None`` (``none``). Fill every series of
        ``metrics`` you can. The plan's ``evaluation_timeout_seconds`` bounds
        the call: when it expires, the values of ``evaluation_timeout_values``
        are recorded instead. Unclassified exceptions are ERROR
        ``scoring_failed``.
        """
        raise NotImplementedError

    def aggregate_metrics(self, records: Sequence[TaskRecord]) -> dict[str, Any] | None:
        """Override to replace the standard metrics (sync). ``None`` keeps them."""
        return None


class HarnessFreeBenchmark(BaseBenchmark):
    """A benchmark that runs its own inference loop; its request uses harness ``none``."""

    #: Whether ``run_task`` calls the request's model. When False, a
    #: ``${VAR}`` model API key need not be set (nothing will send it).
    uses_model: ClassVar[bool] = True

    async def run_task(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, budget: RunBudget
    ) -> RunResult:
        """Run the task in ``env`` with ``model`` (``None`` if the request has none).

        Enforce ``budget.timeout_seconds`` yourself and return a
        :class:`RunResult` whose issues say what went wrong; the runtime only
        cancels a run that overruns the budget by its compensation margin.
        Unclassified exceptions are ERROR ``benchmark_run_failed``.
        """
        raise NotImplementedError


class BaseHarness(Component):
    """An agent that works on a prepared task inside an Environment session.

    Subclass it, set ``id``, implement :meth:`run_task` and, if the agent
    needs setting up, :meth:`start_session` / :meth:`close_session`. For
    each attempt the runtime calls ``start_session``, then ``run_task``,
    then always ``close_session`` (shielded, bounded by the cleanup grace),
    all with the task Environment open under the run network policy.

    Timeouts: the harness enforces ``budget.timeout_seconds`` itself (stop
    the agent, return what it has) and reports ERROR ``harness_timeout``,
    and its step limit as ERROR ``harness_max_iterations``. The runtime
    cancels ``run_task`` only when it overruns the budget by the
    compensation margin, or when the run is cancelled; ``trio.Cancelled``
    must then propagate, with cleanup in ``finally``.
    """

    kind: ClassVar[str] = "harness"
    #: Whether the harness calls the request's model. When False (``oracle``),
    #: a ``${VAR}`` model API key need not be set: nothing will send it.
    uses_model: ClassVar[bool] = True

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> Any:
        """Set the agent up for one attempt; return any object (passed back to
        ``run_task`` and ``close_session``). ``model`` is ``None`` when the
        request has none. Unclassified exceptions are FATAL ``setup_failed``."""
        return None

    async def run_task(self, session: Any, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        """Run the agent on ``prepared.input`` and return its :class:`RunResult`.

        Put the conversation in ``trajectory`` and token counts in ``usage``;
        report a classified failure as an issue in the result (or raise
        :class:`IssueError`). Unclassified exceptions are FATAL ``harness_crashed``.
        """
        raise NotImplementedError

    async def close_session(self, session: Any) -> None:
        """Release what ``start_session`` acquired.

        Always called once ``start_session`` returned, even after a failure or
        a cancellation, inside a shielded scope bounded by the cleanup grace:
        it must not wait for anything unbounded. Exceptions are recorded as
        WARNING ``cleanup_failed``.
        """


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


class BaseRecipe(Component):
    """Fills missing plan settings; never overrides explicit user values."""

    kind: ClassVar[str] = "recipe"

    def apply(self, plan: ExecutionPlan, task: TaskSpec, request: RunRequest) -> ExecutionPlan:
        """Return the plan with this recipe's settings filled in (sync, pure)."""
        return plan


class BaseAnalyzer(Component):
    """Looks at evaluated attempts; its result goes in the attempt's ``analysis``.
    Its failure is recorded there and changes nothing else."""

    kind: ClassVar[str] = "analyzer"

    def applies_to(self, request: RunRequest, task: TaskSpec) -> bool:
        return True

    async def analyze(self, task: TaskSpec, attempt_record: Any) -> dict[str, Any]:
        raise NotImplementedError
