"""The ``terminal`` benchmark: Harbor / Terminal-Bench task directories.

Config: ``path`` (a directory of task directories; written in a config
file, a relative path resolves against the file's directory; or
``git+URL@REF#SUBDIR``, a directory of a git repository at a commit, tag or
branch) or ``dataset`` (``NAME@VERSION`` of the registry ``registry``: see
``docs/datasets.md`` and :mod:`agentcompass.datasets`), ``eval_mode``
(``reuse``, ``none`` or ``fresh``; default ``reuse``) and ``host_userland``
(false). Each task is one directory, whose name is the task id::

    instruction.md        what the agent is asked to do
    task.toml             optional (below)
    tests/test.sh         the verifier, plus anything else it needs under tests/
    solution/solve.sh     optional reference solution (what ``oracle`` runs)
    environment/          the image's build context when it holds a Dockerfile
                          (or a compose file); else files copied into /app

The older Terminal-Bench layout loads too: ``task.yaml`` (``instruction``,
``max_agent_timeout_sec``, ``max_test_timeout_sec``, ``category``),
``Dockerfile`` at the top (the build context is the task directory),
``run-tests.sh`` with ``tests/`` (the verifier: it passes, reward 1, when it
exits 0; it runs with ``TEST_DIR=/tests``) and ``solution.sh``.

``task.toml`` (SPEC 10 "Terminal tasks"): ``[agent] timeout_sec`` and
``[verifier] timeout_sec`` are the run and evaluation timeouts;
``[environment]`` ``docker_image``, ``build_timeout_sec``, ``cpus``,
``memory`` / ``memory_mb``, ``storage`` / ``storage_mb`` (``"2G"`` or MiB) and
``workdir`` go into the plan's ``SandboxSpec``, ``allow_internet = false``
makes the run policy ``none``; ``[environment.env]``, ``[solution.env]`` and
``[verifier.env]`` are the environment of the session, of ``solve.sh`` and of
``test.sh``; ``[metadata]`` gives the category and metadata. Other keys are
kept in the task's metadata (``unknown_keys``) and listed once per request
in a WARNING log line.

Images. A task with ``docker_image`` or a ``Dockerfile`` needs its image:
the plan asks for it (``SandboxSpec.image`` or ``build_context``), and under
a provider without the ``images`` feature (``local``, ``sandbox``) its
attempts are FATAL ``image_required``, so a run that cannot measure the agent
has no official score. ``host_userland: true`` runs such tasks on the
provider's userland instead, with ``environment/``'s other files copied into
``/app`` and a WARNING ``image_not_built``. A session built from the image
never gets a raw copy of ``environment/``: what the Dockerfile deletes stays
deleted.

Sandbox paths. Under ``docker`` and ``sandbox`` (and ``remote`` serving
them) ``/app``, ``/tests``, ``/logs`` and ``/solution`` exist as such. Under
``local`` they are directories of the sandbox named by ``APP_DIR``,
``TESTS_DIR``, ``LOGS_DIR`` and ``SOLUTION_DIR``, and commands start in
``APP_DIR``; a task whose scripts name them literally (not as
``${APP_DIR:-/app}``) needs the ``literal_paths`` feature and is FATAL
``environment_unsupported`` under ``local`` before anything runs, so nothing
is written into the host's root. File operations of the Environment API
accept ``/app/...`` style paths under every provider.

Task directories are untrusted input, read by the runtime's user. A task
holding a symbolic link that resolves outside its directory (absolute or
relative, dangling or not), or whose ``environment``, ``tests`` or
``solution`` is itself a link, fails to load with one line naming the task
and the link (``compass validate`` exits 2). Links that stay inside are
copied into the session as links, never followed; files are opened without
following links or blocking on a FIFO, so a task directory changed after it
loaded cannot make the runtime read a host file (FATAL ``setup_failed``).

What each phase does:

- ``prepare_task`` copies ``environment/`` into ``/app`` (not when the
  session runs the task's image). ``solution/`` is copied into
  ``/solution`` only when the request's harness is ``oracle`` (which runs
  ``solve.sh`` with ``[solution.env]``), and ``tests/`` only at evaluation:
  an agent never sees the reference solution or the verifier, as under Harbor.
- ``collect_artifacts`` keeps what the agent left in ``/logs/agent``.
- ``evaluate`` runs ``test.sh`` with ``[verifier.env]`` in the session's
  working directory and reads the reward: ``/logs/verifier/reward.txt`` (one
  number) if present, else ``/logs/verifier/reward.json`` (an object of
  numbers: each becomes a value of its own, and ``reward`` is its
  ``"reward"`` entry or else the mean of all entries). Where the session
  offers ``exec_private``, test.sh reads its tests from and writes its reward
  to private directories, so a process the agent left running can neither
  change the verifier nor rewrite the reward; elsewhere ``/tests`` and
  ``/logs/verifier`` are emptied, the tests copied in, and the shared
  directory read. Either way the reward is read as a regular file of at most
  1 MiB: a FIFO, a device, a link, a larger file or one that vanished is a
  WARNING ``reward_unparseable`` scored 0, never a FATAL. The exit status of
  ``test.sh`` does not matter; only the reward does. Its exit code and the
  last 16 KiB of its stdout and stderr are kept in the attempt's run result,
  ``artifacts["verifier"] = {"exit_code", "stdout", "stderr"}``, so a zero
  can be explained from the run directory. ``passed`` is ``reward >= 1``. A
  missing or unparseable reward scores 0 with a WARNING (``reward_missing`` /
  ``reward_unparseable``). What the verifier and the agent left in
  ``/logs/verifier`` and ``/logs/agent`` (16 MiB per attempt in all) is kept
  in the run directory, ``tasks/<task key>/attempt-<n>/logs/``.
- ``eval_mode: fresh`` evaluates in a new sandbox that holds only the
  task's starting files and the tests, none of the agent's work: use it only
  for tasks whose verifier checks something outside the sandbox.
  ``eval_mode: none`` cannot score this benchmark (there is nowhere to run
  ``test.sh``) and every evaluation is an ERROR ``scoring_failed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
import structlog
import trio

from agentcompass import (
    BaseBenchmark,
    ComponentError,
    EnvironmentSession,
    Evaluation,
    Issue,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
    datasets,
    register,
)

from ._terminal_files import APP, SOLUTION, solution_files, starting_files, upload
from ._terminal_tasks import load_task_dirs, load_tasks
from ._terminal_verifier import MAX_LOG_BYTES, read_logs, run_verifier

__all__ = ["TerminalBenchmark"]


log = structlog.get_logger("agentcompass.benchmarks.terminal")


@register
class TerminalBenchmark(BaseBenchmark):
    """Harbor / Terminal-Bench task directories, scored by each task's tests/test.sh.

    See the module docstring for the layout and what each phase does.
    """

    id: ClassVar[str] = "terminal"
    metrics: ClassVar[tuple[str, ...]] = ("reward", "passed")
    evaluation_timeout_values: ClassVar[dict[str, Any]] = {"reward": 0.0, "passed": False}

    @attrs.frozen
    class Config:
        path: str | None = attrs.field(
            default=None,
            metadata={
                "path": True,
                "doc": "directory of task directories (task id = directory name), or git+URL@REF#SUBDIR",
            },
        )
        dataset: str | None = attrs.field(
            default=None, metadata={"doc": "NAME@VERSION of a dataset in the registry (instead of path)"}
        )
        registry: str | None = attrs.field(
            default=None,
            metadata={
                "path": True,
                "doc": "registry.json file or URL (default: $AGENTCOMPASS_REGISTRY, else Harbor's public one)",
            },
        )
        eval_mode: Literal["reuse", "none", "fresh"] = attrs.field(
            default="reuse", metadata={"doc": "where test.sh runs: the task sandbox, a new one, or nowhere"}
        )
        host_userland: bool = attrs.field(
            default=False,
            metadata={
                "doc": "run tasks that need an image on the provider's userland instead "
                "(WARNING image_not_built) rather than FATAL image_required"
            },
        )

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        options = self.options
        if (options.path is None) == (options.dataset is None):
            raise ComponentError("benchmark 'terminal': set exactly one of path and dataset")
        self._source: dict[str, Any] | None = None
        if options.dataset is not None:
            # Known here, where every process builds the benchmark (series and timeout values).
            series, values = datasets.declared(options.dataset, options.registry)
            if series:
                self.metrics = series  # type: ignore[misc]
            if values is not None:
                self.evaluation_timeout_values = values  # type: ignore[misc]

    def preflight(self, request: RunRequest) -> None:
        """Resolve and fetch the dataset or git path, load every task
        directory (layout, ``task.toml``, links) and check ``task_ids``."""
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            tasks = trio.run(self._tasks)  # git runs as Trio children (see agentcompass.datasets)
        else:
            raise ComponentError("benchmark 'terminal': preflight blocks; call it outside the Trio run's thread")
        known = {task.task_id for task in tasks}
        where = self.options.dataset or self.options.path
        for task_id in request.task_ids or ():
            if task_id not in known:
                raise ComponentError(f"task_ids: no task {task_id!r} in {where!r}")

    def task_source(self) -> dict[str, Any] | None:
        """The registry, ``name@version`` and each task's commit, or the git path and its commit."""
        return self._source

    async def _tasks(self) -> list[TaskSpec]:
        """The tasks of ``dataset`` or ``path`` (fetched with git where they name it)."""
        options = self.options
        if options.dataset is not None:
            pulled = await datasets.pull_dataset(options.dataset, options.registry)
            self._source = pulled.record()
            return await trio.to_thread.run_sync(load_task_dirs, pulled.directories)
        assert options.path is not None
        if options.path.startswith("git+"):
            directory, record = await datasets.pull_git_path(options.path)
            self._source = {"path": options.path, **record}
            return await trio.to_thread.run_sync(load_tasks, directory)
        return await trio.to_thread.run_sync(load_tasks, options.path)

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        """Every task directory under ``path``, sorted by id. A directory
        without ``instruction.md`` or ``tests/test.sh`` (nor the older
        layout), with an invalid ``task.toml`` or with a symbolic link
        pointing out of it, is a :class:`ComponentError` naming it (and the
        link). ``task.toml`` keys the benchmark does not use are listed once,
        in one WARNING log line."""
        try:
            tasks = await self._tasks()
        except ComponentError as exc:
            raise ComponentError(f"benchmark 'terminal': {exc}") from None
        unknown: dict[str, list[str]] = {}
        for task in tasks:
            for key in task.metadata.get("unknown_keys", ()):
                unknown.setdefault(key, []).append(task.task_id)
        if unknown:
            listed = "; ".join(f"{key} ({_some(ids)})" for key, ids in sorted(unknown.items()))
            log.warning(
                "task_keys_unused",
                request=request.name,
                message=f"task keys the terminal benchmark does not use, kept in the tasks' metadata: {listed}",
            )
        return tasks

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        """Evaluation mode from the config; run and evaluation timeouts from
        ``task.toml``; the task's ``SandboxSpec`` (its image unless
        ``host_userland``); run policy ``none`` for ``allow_internet =
        false``; the ``literal_paths`` feature where its scripts need it."""
        data = task.data
        plan: dict[str, Any] = {"evaluation_environment_mode": self.options.eval_mode}
        run_timeout = task.metadata.get("agent_timeout_sec")
        eval_timeout = task.metadata.get("verifier_timeout_sec")
        if run_timeout is not None:
            plan["run_timeout_seconds"] = run_timeout
        if eval_timeout is not None:
            plan["evaluation_timeout_seconds"] = eval_timeout
        sandbox = dict(data.get("sandbox") or {})
        if not self.options.host_userland:
            # Both when the task has both: the provider's image_source chooses (SPEC 12 "Image source").
            if data.get("image"):
                sandbox["image"] = data["image"]
            if data.get("build_context"):
                sandbox["build_context"] = data["build_context"]
        if sandbox:
            plan["sandbox"] = sandbox
        if data.get("allow_internet") is False:
            plan["run_network_policy"] = "none"
        if data.get("literal_paths"):
            plan["required_features"] = ["literal_paths"]
        return plan

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        """Copy ``environment/`` into ``/app`` unless the session runs the
        task's image (and ``solution/`` into ``/solution`` for the ``oracle``
        harness); the agent's input is the instruction."""
        task_dir = Path(task.data["dir"])
        in_image = _in_image(benchmark_plan)
        if not in_image:
            await upload(env, await starting_files(task), APP)
        if request.harness.id == "oracle":
            await upload(env, await solution_files(task), SOLUTION)
        return PreparedTask(
            task=task,
            input={"instruction": task.data["instruction"]},
            metadata={
                "prepared_in": env.handle,
                "in_image": in_image,
                "solution_env": dict(task.data.get("solution_env") or {}),
                "task_dir": str(task_dir),
            },
        )

    async def collect_artifacts(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession
    ) -> RunResult:
        """Keep what the agent left in ``/logs/agent``; add a WARNING
        ``image_not_built`` when the task needs an image and ran on the
        provider's userland (``host_userland``)."""
        artifacts = dict(run_result.artifacts)
        agent_logs = await read_logs(env, "agent", MAX_LOG_BYTES)
        if agent_logs:
            artifacts["logs"] = {**artifacts.get("logs", {}), **agent_logs}
        issues = list(run_result.issues)
        data = prepared.task.data
        if not prepared.metadata.get("in_image") and (data.get("image") or data.get("build_context")):
            what = f"image {data['image']!r}" if data.get("image") else "its Dockerfile"
            issues.append(
                Issue(
                    "warning",
                    "setup",
                    "image_not_built",
                    f"the task needs {what}, which was not built (host_userland): it ran on the "
                    "provider's userland with the other environment/ files in /app",
                )
            )
        return attrs.evolve(run_result, artifacts=artifacts, issues=issues)

    async def evaluate(
        self,
        prepared: PreparedTask,
        run_result: RunResult,
        env: EnvironmentSession | None,
        request: RunRequest,
    ) -> Evaluation:
        """Run the verifier and read its reward (see the module docstring);
        a dataset's own series (``correct``, ``score``, ``correctness``) are
        derived from the reward."""
        evaluation = await run_verifier(prepared, run_result, env)
        reward = evaluation.values.get("reward")
        if not isinstance(reward, float):
            return evaluation
        derived = {"correct": reward >= 1, "passed": reward >= 1, "score": reward, "correctness": reward}
        extra = {k: v for k, v in derived.items() if k in self.metrics and k not in evaluation.values}
        return attrs.evolve(evaluation, values={**evaluation.values, **extra}) if extra else evaluation


def _some(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def _in_image(benchmark_plan: dict[str, Any]) -> bool:
    sandbox = benchmark_plan.get("sandbox") or {}
    return bool(sandbox.get("image") or sandbox.get("build_context"))
