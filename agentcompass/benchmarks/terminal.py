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

import json
import math
import os
import posixpath
import shlex
import stat
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
    FileRefusedError,
    Issue,
    IssueError,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
    datasets,
    register,
)
from agentcompass.runtime import command_output

from ._terminal_tasks import IMAGE_FILES, link_inside, load_task_dirs, load_tasks

__all__ = ["TerminalBenchmark"]

# (sandbox virtual root, environment variable naming it under ``local``)
_APP = ("/app", "APP_DIR")
_TESTS = ("/tests", "TESTS_DIR")
_SOLUTION = ("/solution", "SOLUTION_DIR")

_RUN_TESTS = 'bash "${TESTS_DIR:-/tests}/test.sh"'
_RUN_TB_TESTS = 'bash "${TESTS_DIR:-/tests}/run-tests.sh"'
# Tried in this order (as Harbor does); read as regular files of at most 1 MiB.
_REWARD_FILES = ("reward.txt", "reward.json")
_MAX_REWARD_BYTES = 1024 * 1024
# What is kept of /logs/verifier and /logs/agent per attempt, at most (SPEC 10).
_MAX_LOG_BYTES = 16 * 1024 * 1024
# What a session made that makes a reward file unreadable: scored, not FATAL.
_SESSION_MADE = (FileRefusedError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
_RESET_VERIFIER = """set -e
t="${TESTS_DIR:-/tests}"; v="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$t" "$v"
find "$t" "$v" -mindepth 1 -delete
"""
# Prints the name of the reward file test.sh left, reward.txt first, whatever
# it is (a FIFO or a link is found, then refused by read_file).
_FIND_REWARD = """v="${LOGS_DIR:-/logs}/verifier"
for f in reward.txt reward.json; do { [ -e "$v/$f" ] || [ -L "$v/$f" ]; } && { echo "$f"; exit 0; }; done
exit 0
"""
# Lists the regular files under a /logs directory, "SIZE PATH" NUL-separated,
# bounded (what a session made there is hostile: read_file checks each again).
_LIST_LOGS = """d="${LOGS_DIR:-/logs}/%s"
[ -d "$d" ] && cd "$d" && find . -type f -printf '%%s %%P\\0' 2>/dev/null | head -c 262144
exit 0
"""

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
            await _upload(env, await _starting_files(task), _APP)
        if request.harness.id == "oracle":
            await _upload(env, await _solution(task), _SOLUTION)
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
        agent_logs = await _read_logs(env, "agent", _MAX_LOG_BYTES)
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
        evaluation = await self._evaluate(prepared, run_result, env, request)
        reward = evaluation.values.get("reward")
        if not isinstance(reward, float):
            return evaluation
        derived = {"correct": reward >= 1, "passed": reward >= 1, "score": reward, "correctness": reward}
        extra = {k: v for k, v in derived.items() if k in self.metrics and k not in evaluation.values}
        return attrs.evolve(evaluation, values={**evaluation.values, **extra}) if extra else evaluation

    async def _evaluate(
        self,
        prepared: PreparedTask,
        run_result: RunResult,
        env: EnvironmentSession | None,
        request: RunRequest,
    ) -> Evaluation:
        if env is None:
            raise IssueError(
                "error",
                "scoring_failed",
                "benchmark 'terminal' runs tests/test.sh in an Environment; "
                "eval_mode 'none' cannot score it (use 'reuse')",
            )
        task = prepared.task
        own = env.handle == prepared.metadata.get("prepared_in")
        if not own and not prepared.metadata.get("in_image"):
            # A fresh evaluation sandbox on the host's userland: give it the task's starting files.
            await _upload(env, await _starting_files(task), _APP)
        tests = await _tests(task)
        older = task.data.get("layout") == "terminal-bench"
        command = _RUN_TB_TESTS if older else _RUN_TESTS
        verifier_env = dict(task.data.get("verifier_env") or {})
        if older:
            verifier_env.setdefault("TEST_DIR", "/tests")
        used = sum(len(content) for content in _log_bytes(run_result).values())
        try:
            # Where the provider can, test.sh is read and its reward written where
            # nothing the agent left running can reach; else in the shared directories.
            result, private = await env.exec_private(
                command,
                env=verifier_env or None,
                directory="/logs/verifier",
                max_bytes=_MAX_LOG_BYTES,
                inputs=_inputs(tests),
            )
        except NotImplementedError:
            try:
                await _check(env, _RESET_VERIFIER, "reset the verifier directories")
                await _upload(env, tests, _TESTS)
            except IssueError as exc:
                if not own or exc.code != "environment_failed":
                    raise
                # In the session the agent ran in, a setup command that fails is its doing.
                return _zero("verifier_setup_failed", exc.message, "error")
            result, private = await env.exec(command, env=verifier_env or None), None
        # Kept with the attempt (the run result's artifacts are the attempt's), so a zero can be explained.
        run_result.artifacts["verifier"] = command_output(result)
        kept = private if private is not None else await _read_logs(env, "verifier", _MAX_LOG_BYTES - used, prefix="")
        _keep_logs(run_result, {f"verifier/{rel}": content for rel, content in kept.items()}, _MAX_LOG_BYTES - used)
        if older:
            reward = 1.0 if result.exit_code == 0 and not result.timed_out else 0.0
            return Evaluation(values={"reward": reward, "passed": reward >= 1})
        if private is not None:
            found = next((name for name in _REWARD_FILES if name in private), None)
            if found is None:
                return _zero("reward_missing", f"tests/test.sh wrote no reward file (exit code {result.exit_code})")
            raw = private[found]
            if len(raw) > _MAX_REWARD_BYTES:
                return _zero("reward_unparseable", f"{found}: larger than {_MAX_REWARD_BYTES} bytes")
        else:
            found = (await env.exec(_FIND_REWARD)).stdout.strip()
            if found not in _REWARD_FILES:
                return _zero("reward_missing", f"tests/test.sh wrote no reward file (exit code {result.exit_code})")
            try:
                raw = await env.read_file(f"/logs/verifier/{found}", max_bytes=_MAX_REWARD_BYTES)
            except Exception as exc:
                made = _made_by_session(exc)
                if made is None:
                    raise
                if isinstance(made, FileNotFoundError):
                    return _zero("reward_unparseable", f"{found} vanished before it was read")
                return _zero("reward_unparseable", f"{found}: {made}")
        try:
            values = _parse_reward(found, raw)
        except ValueError as exc:
            return _zero("reward_unparseable", f"{found}: {exc}")
        return Evaluation(values={**values, "passed": values["reward"] >= 1})


def _some(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def _in_image(benchmark_plan: dict[str, Any]) -> bool:
    sandbox = benchmark_plan.get("sandbox") or {}
    return bool(sandbox.get("image") or sandbox.get("build_context"))


async def _starting_files(task: TaskSpec) -> _Tree:
    """What a session on the host's userland starts with: ``environment/``
    without the image's own files (none in the older layout)."""
    if task.data.get("layout") == "terminal-bench":
        return _Tree([], [])
    return await _read_tree(Path(task.data["dir"]), "environment", IMAGE_FILES)


async def _solution(task: TaskSpec) -> _Tree:
    task_dir = Path(task.data["dir"])
    if task.data.get("layout") == "terminal-bench":
        return await _read_top_files(task_dir, {"solution.sh": "solve.sh"})
    return await _read_tree(task_dir, "solution")


async def _tests(task: TaskSpec) -> _Tree:
    task_dir = Path(task.data["dir"])
    tree = await _read_tree(task_dir, "tests")
    if task.data.get("layout") == "terminal-bench":
        top = await _read_top_files(task_dir, {"run-tests.sh": "run-tests.sh"})
        tree = _Tree(sorted([*tree.files, *top.files]), tree.links)
    return tree


def _log_bytes(run_result: RunResult) -> dict[str, bytes]:
    logs = run_result.artifacts.get("logs")
    return logs if isinstance(logs, dict) else {}


def _keep_logs(run_result: RunResult, files: dict[str, bytes], budget: int) -> None:
    """Add ``files`` to the run result's kept logs, within ``budget`` bytes
    (the runtime writes them to the attempt's ``logs/`` directory)."""
    logs = dict(_log_bytes(run_result))
    for rel, content in sorted(files.items()):
        if len(content) > budget:
            continue
        logs[rel] = content
        budget -= len(content)
    if logs:
        run_result.artifacts["logs"] = logs


async def _read_logs(env: EnvironmentSession, sub: str, budget: int, prefix: str | None = None) -> dict[str, bytes]:
    """The regular files under ``/logs/<sub>``, at most ``budget`` bytes in
    all (``<sub>/path`` -> bytes, or ``path`` with ``prefix=""``). A file
    the session swapped for a link or a FIFO is left out, never followed."""
    prefix = f"{sub}/" if prefix is None else prefix
    listing = (await env.exec(_LIST_LOGS % sub)).stdout
    files: dict[str, bytes] = {}
    for entry in listing.split("\0"):
        size_text, _, rel = entry.partition(" ")
        if not rel or not size_text.isdigit() or ".." in rel.split("/"):
            continue
        size = int(size_text)
        if size > budget:
            continue
        try:
            content = await env.read_file(f"/logs/{sub}/{rel}", max_bytes=budget)
        except Exception as exc:
            if _made_by_session(exc) is None:
                raise
            continue
        files[prefix + rel] = content
        budget -= len(content)
    return files


def _made_by_session(exc: BaseException) -> OSError | None:
    """The file error in ``exc`` that what the session holds explains (a link,
    a FIFO, a file too large or gone), else None. The runtime passes
    :class:`FileRefusedError` through and tags the provider's other errors as
    Environment failures, keeping the provider's error as the cause."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, _SESSION_MADE):
            return candidate
    return None


def _zero(code: str, message: str, severity: Literal["warning", "error"] = "warning") -> Evaluation:
    return Evaluation(
        values={"reward": 0.0, "passed": False},
        issues=[Issue(severity, "evaluate", code, message)],
    )


def _inputs(tree: _Tree) -> dict[str, bytes]:
    """The verifier's files for ``exec_private``: those of ``tests/``, links
    inside it taken as the files they name."""
    files = {rel: content for rel, content, _ in tree.files}
    for rel, target in tree.links:
        named = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if named in files:
            files[rel] = files[named]
    return {f"{_TESTS[0]}/{rel}": content for rel, content in files.items()}


def _parse_reward(name: str, raw: bytes) -> dict[str, float]:
    """The values in ``reward.txt`` (one number: ``reward``) or
    ``reward.json`` (each numeric entry a value of its own; ``reward`` its
    ``"reward"`` entry, else the mean of the entries); ValueError if malformed."""
    text = raw.decode("utf-8", errors="replace").strip()
    if name == "reward.txt":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"not a number: {text[:60]!r}") from None
        values = {"reward": value}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("not valid JSON") from None
        if not isinstance(data, dict) or not data:
            raise ValueError("expected a non-empty JSON object of numbers")
        values = {str(k): v for k, v in data.items() if k != "passed"}
        if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()):
            raise ValueError("expected numbers as values")
        values = {k: float(v) for k, v in values.items()}
        if "reward" not in values:
            values["reward"] = sum(values.values()) / len(values)
    for key, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"{key} is not a finite number: {value}")
    return values


async def _check(env: EnvironmentSession, cmd: str, what: str) -> None:
    result = await env.exec(cmd)
    if result.exit_code != 0:
        detail = (result.stderr.strip().splitlines() or [""])[-1][:200]
        raise IssueError("fatal", "environment_failed", f"could not {what} (exit {result.exit_code}): {detail}")


@attrs.frozen
class _Tree:
    """What one upload copies: regular files (relative posix path, content,
    executable) and symbolic links (relative path, target) that stay inside
    the task directory, copied as links."""

    files: list[tuple[str, bytes, bool]]
    links: list[tuple[str, str]]


async def _read_tree(task_dir: Path, sub: str, exclude: frozenset[str] = frozenset()) -> _Tree:
    return await trio.to_thread.run_sync(_read_tree_sync, task_dir, sub, exclude)


def _read_tree_sync(task_dir: Path, sub: str, exclude: frozenset[str]) -> _Tree:
    """Blocking: the tree ``task_dir/sub``, read without following a link.

    A task directory may change after it loaded: every directory is opened
    relative to its parent's descriptor without following links
    (``os.fwalk``) and every file with ``O_NOFOLLOW``, so nothing outside
    the task directory is read. A link that now points outside, or an entry
    swapped for a link while being read, is a FATAL ``setup_failed``; FIFOs,
    devices and sockets are left out.
    """
    top = task_dir / sub
    if top.is_symlink() or not top.is_dir():  # a link here failed the load: the task changed since
        return _Tree([], [])
    task_real = os.path.realpath(task_dir)
    files: list[tuple[str, bytes, bool]] = []
    links: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in sorted([*dirnames, *filenames]):
            rel = Path(dirpath, name).relative_to(top).as_posix()
            if rel in exclude:
                continue
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(name, dir_fd=dir_fd)
                inside = link_inside(task_real, os.path.join(dirpath, name), target)
                if inside is None:
                    raise IssueError(
                        "fatal",
                        "setup_failed",
                        f"task {task_dir.name!r}: {sub}/{rel} is a symbolic link pointing outside the "
                        f"task directory ({target!r}); not copied",
                    )
                links.append((rel, inside))
            elif stat.S_ISREG(info.st_mode):
                content = _read_regular(name, dir_fd, f"task {task_dir.name!r}: {sub}/{rel}")
                executable = bool(info.st_mode & stat.S_IXUSR) or name.endswith(".sh")
                files.append((rel, content, executable))
    files.sort()
    links.sort()
    return _Tree(files, links)


async def _read_top_files(task_dir: Path, names: dict[str, str]) -> _Tree:
    """Top-level files of a task directory (name -> name in the session),
    read as :func:`_read_tree` reads, without following a link."""
    return await trio.to_thread.run_sync(_read_top_files_sync, task_dir, names)


def _read_top_files_sync(task_dir: Path, names: dict[str, str]) -> _Tree:
    files = []
    fd = os.open(task_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name, rel in sorted(names.items()):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                files.append((rel, _read_regular(name, fd, f"task {task_dir.name!r}: {name}"), True))
    finally:
        os.close(fd)
    return _Tree(files, [])


def _read_regular(name: str, dir_fd: int, where: str) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd``, opened without
    following a link or blocking on a FIFO put there since it was listed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise IssueError("fatal", "setup_failed", f"{where} changed while being read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IssueError("fatal", "setup_failed", f"{where} changed while being read: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


async def _upload(env: EnvironmentSession, tree: _Tree, root: tuple[str, str]) -> None:
    """Write the files of ``tree`` under a sandbox root, then make its links and
    mark the executable files."""
    virtual, variable = root

    def place(rel: str) -> str:
        # Quote only the relative part: the variable must still expand (local layout).
        return f'"${{{variable}:-{virtual}}}"/{shlex.quote(rel)}'

    for rel, content, _ in tree.files:
        await env.write_file(f"{virtual}/{rel}", content)
    script = [
        f"mkdir -p -- {place(posixpath.dirname(rel) or '.')} && ln -sfn -- {shlex.quote(target)} {place(rel)}"
        for rel, target in tree.links
    ]
    executables = [rel for rel, _, executable in tree.files if executable]
    if executables:
        script.append(f"chmod +x -- {' '.join(place(rel) for rel in executables)}")
    if script:
        await _check(env, "set -e\n" + "\n".join(script), f"copy files under {virtual}")
