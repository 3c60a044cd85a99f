"""The ``terminal`` benchmark: Harbor / Terminal-Bench task directories.

Config: ``path`` (a directory of task directories; written in a config
file, a relative path resolves against the file's directory) and ``eval_mode`` (``reuse``,
``none`` or ``fresh``; default ``reuse``). Each task is one directory, whose
name is the task id::

    instruction.md        what the agent is asked to do
    task.toml             optional: [agent] timeout_sec, [verifier] timeout_sec,
                          [metadata] category (and any other metadata)
    tests/test.sh         the verifier, plus anything else it needs under tests/
    solution/solve.sh     optional reference solution (what ``oracle`` runs)
    environment/          optional files copied into the sandbox's app directory
                          (except ``Dockerfile`` / ``docker-compose.yaml``: no
                          image is built, so tasks needing extra packages must
                          run on a host that has them; such a task's attempts
                          carry a WARNING ``image_not_built``)

Sandbox paths. Under the ``sandbox`` provider (and ``remote`` serving it)
``/app`` (the working directory), ``/tests``, ``/logs`` and ``/solution``
exist as such. Under ``local`` they are directories of the sandbox named by
the environment variables ``APP_DIR``, ``TESTS_DIR``, ``LOGS_DIR`` and
``SOLUTION_DIR``, and commands start in ``APP_DIR``. Task scripts should
therefore refer to them as ``${APP_DIR:-/app}``, ``${TESTS_DIR:-/tests}``
and so on, which works under both. File operations of the Environment API
accept ``/app/...`` style paths under every provider.

What each phase does:

- ``prepare_task`` copies ``environment/`` into ``/app``. ``solution/`` is
  copied into ``/solution`` only when the request's harness is ``oracle``,
  and ``tests/`` is copied only at evaluation: an agent never sees the
  reference solution or the verifier, as under Harbor.
- ``evaluate`` empties ``/tests`` and ``/logs/verifier``, copies ``tests/``
  in (so an agent cannot have planted a reward or changed the verifier), runs
  ``bash "${TESTS_DIR:-/tests}/test.sh"`` from ``/app`` and reads the reward:
  ``/logs/verifier/reward.txt`` (one number) if present, else
  ``/logs/verifier/reward.json`` (an object of numbers: its ``"reward"`` entry,
  or the mean of all entries when there is no ``"reward"``). The exit status of
  ``test.sh`` does not matter; only the reward does. Its exit code and the
  last 16 KiB of its stdout and stderr are kept in the attempt's run result,
  ``artifacts["verifier"] = {"exit_code", "stdout", "stderr"}``, so a zero
  can be explained from the run directory. ``passed`` is
  ``reward >= 1``. A missing or unparseable reward scores 0 with a WARNING
  (``reward_missing`` / ``reward_unparseable``).
- ``eval_mode: fresh`` evaluates in a new sandbox that holds only the
  ``environment/`` files and the tests, none of the agent's work: use it only
  for tasks whose verifier checks something outside the sandbox.
  ``eval_mode: none`` cannot score this benchmark (there is nowhere to run
  ``test.sh``) and every evaluation is an ERROR ``scoring_failed``.
"""

from __future__ import annotations

import json
import math
import shlex
import stat
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
import trio

from agentcompass import (
    BaseBenchmark,
    ComponentError,
    EnvironmentSession,
    Evaluation,
    ExecResult,
    Issue,
    IssueError,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
    register,
)

__all__ = ["TAIL_BYTES", "TerminalBenchmark", "command_output", "output_tail"]

# Files of environment/ that describe a container image rather than its contents.
_IMAGE_FILES = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml"})

# (sandbox virtual root, environment variable naming it under ``local``)
_APP = ("/app", "APP_DIR")
_TESTS = ("/tests", "TESTS_DIR")
_SOLUTION = ("/solution", "SOLUTION_DIR")

_RUN_TESTS = 'bash "${TESTS_DIR:-/tests}/test.sh"'
_RESET_VERIFIER = """set -e
t="${TESTS_DIR:-/tests}"; v="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$t" "$v"
find "$t" "$v" -mindepth 1 -delete
"""
# Prints the name of the reward file test.sh wrote, reward.txt first (as Harbor does).
_FIND_REWARD = """v="${LOGS_DIR:-/logs}/verifier"
for f in reward.txt reward.json; do [ -f "$v/$f" ] && { echo "$f"; exit 0; }; done
exit 0
"""

_FileList = list[tuple[str, bytes, bool]]


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
        path: Path = attrs.field(metadata={"doc": "directory of task directories (task id = directory name)"})
        eval_mode: Literal["reuse", "none", "fresh"] = attrs.field(
            default="reuse", metadata={"doc": "where test.sh runs: the task sandbox, a new one, or nowhere"}
        )

    def preflight(self, request: RunRequest) -> None:
        """Load every task directory (layout, ``task.toml``) and check ``task_ids``."""
        tasks = _load_tasks(self.options.path)
        known = {task.task_id for task in tasks}
        for task_id in request.task_ids or ():
            if task_id not in known:
                raise ComponentError(f"task_ids: no task {task_id!r} in {str(Path(self.options.path).absolute())!r}")

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        """Every task directory under ``path``, sorted by id. A directory
        without ``instruction.md`` or ``tests/test.sh``, or with an invalid
        ``task.toml``, is a :class:`ComponentError` naming it."""
        try:
            return await trio.to_thread.run_sync(_load_tasks, self.options.path)
        except ComponentError as exc:
            raise ComponentError(f"benchmark 'terminal': {exc}") from None

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        """Evaluation mode from the config; run and evaluation timeouts from
        ``task.toml`` (``[agent]`` / ``[verifier]`` ``timeout_sec``) when set."""
        plan: dict[str, Any] = {"evaluation_environment_mode": self.options.eval_mode}
        run_timeout = task.metadata.get("agent_timeout_sec")
        eval_timeout = task.metadata.get("verifier_timeout_sec")
        if run_timeout is not None:
            plan["run_timeout_seconds"] = run_timeout
        if eval_timeout is not None:
            plan["evaluation_timeout_seconds"] = eval_timeout
        return plan

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        """Copy ``environment/`` into ``/app`` (and ``solution/`` into ``/solution``
        for the ``oracle`` harness); the agent's input is the instruction."""
        task_dir = Path(task.data["dir"])
        await _upload(env, await _read_tree(task_dir / "environment", _IMAGE_FILES), _APP)
        if request.harness.id == "oracle":
            await _upload(env, await _read_tree(task_dir / "solution"), _SOLUTION)
        return PreparedTask(
            task=task,
            input={"instruction": task.data["instruction"]},
            metadata={"prepared_in": env.handle},
        )

    async def collect_artifacts(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession
    ) -> RunResult:
        """Add a WARNING ``image_not_built`` when the task's ``environment/``
        describes an image (``Dockerfile``, compose file): its other files were
        copied into ``/app``, but no image was built, so the agent ran on the
        provider's userland instead."""
        environment = trio.Path(prepared.task.data["dir"]) / "environment"
        images = [name for name in sorted(_IMAGE_FILES) if await (environment / name).is_file()]
        if not images:
            return run_result
        issue = Issue(
            "warning",
            "setup",
            "image_not_built",
            f"environment/{images[0]} was not built: the task ran on the provider's userland "
            "with only the other environment/ files in /app",
        )
        return attrs.evolve(run_result, issues=[*run_result.issues, issue])

    async def evaluate(
        self,
        prepared: PreparedTask,
        run_result: RunResult,
        env: EnvironmentSession | None,
        request: RunRequest,
    ) -> Evaluation:
        """Run the verifier and read its reward (see the module docstring)."""
        if env is None:
            raise IssueError(
                "error",
                "scoring_failed",
                "benchmark 'terminal' runs tests/test.sh in an Environment; "
                "eval_mode 'none' cannot score it (use 'reuse')",
            )
        task_dir = Path(prepared.task.data["dir"])
        if env.handle != prepared.metadata.get("prepared_in"):
            # A fresh evaluation sandbox: give it the task's starting files.
            await _upload(env, await _read_tree(task_dir / "environment", _IMAGE_FILES), _APP)
        await _check(env, _RESET_VERIFIER, "reset the verifier directories")
        await _upload(env, await _read_tree(task_dir / "tests"), _TESTS)
        result = await env.exec(_RUN_TESTS)
        # Kept with the attempt (the run result's artifacts are the attempt's), so a zero can be explained.
        run_result.artifacts["verifier"] = command_output(result)
        found = (await env.exec(_FIND_REWARD)).stdout.strip()
        if found not in ("reward.txt", "reward.json"):
            return _zero("reward_missing", f"tests/test.sh wrote no reward file (exit code {result.exit_code})")
        raw = await env.read_file(f"/logs/verifier/{found}")
        try:
            reward = _parse_reward(found, raw)
        except ValueError as exc:
            return _zero("reward_unparseable", f"{found}: {exc}")
        return Evaluation(values={"reward": reward, "passed": reward >= 1})


#: How much of a command's stdout and stderr an attempt keeps (bytes, from the end).
TAIL_BYTES = 16 * 1024


def output_tail(text: str, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``text`` (UTF-8), cut at a character boundary."""
    data = text.encode("utf-8", errors="replace")
    return text if len(data) <= limit else data[-limit:].decode("utf-8", errors="ignore")


def command_output(result: ExecResult) -> dict[str, Any]:
    """``{"exit_code", "stdout", "stderr"}`` of a command, each stream's last 16 KiB;
    ``exit_code`` is None when the command timed out."""
    return {
        "exit_code": None if result.timed_out else result.exit_code,
        "stdout": output_tail(result.stdout),
        "stderr": output_tail(result.stderr),
    }


def _zero(code: str, message: str) -> Evaluation:
    return Evaluation(
        values={"reward": 0.0, "passed": False},
        issues=[Issue("warning", "evaluate", code, message)],
    )


def _parse_reward(name: str, raw: bytes) -> float:
    """The reward in ``reward.txt`` (one number) or ``reward.json`` (its
    ``"reward"`` entry, else the mean of its entries); ValueError if malformed."""
    text = raw.decode("utf-8", errors="replace").strip()
    if name == "reward.txt":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"not a number: {text[:60]!r}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("not valid JSON") from None
        if not isinstance(data, dict) or not data:
            raise ValueError("expected a non-empty JSON object of numbers")
        values = [data["reward"]] if "reward" in data else list(data.values())
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError("expected numbers as values")
        value = sum(values) / len(values)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value}")
    return float(value)


async def _check(env: EnvironmentSession, cmd: str, what: str) -> None:
    result = await env.exec(cmd)
    if result.exit_code != 0:
        detail = (result.stderr.strip().splitlines() or [""])[-1][:200]
        raise IssueError("fatal", "environment_failed", f"could not {what} (exit {result.exit_code}): {detail}")


async def _read_tree(directory: Path, exclude: frozenset[str] = frozenset()) -> _FileList:
    return await trio.to_thread.run_sync(_read_tree_sync, directory, exclude)


def _read_tree_sync(directory: Path, exclude: frozenset[str]) -> _FileList:
    """(relative posix path, content, executable) of every file under ``directory``."""
    if not directory.is_dir():
        return []
    files = []
    for path in sorted(directory.rglob("*")):
        if not path.is_file() or path.relative_to(directory).as_posix() in exclude:
            continue
        executable = bool(path.stat().st_mode & stat.S_IXUSR) or path.suffix == ".sh"
        files.append((path.relative_to(directory).as_posix(), path.read_bytes(), executable))
    return files


async def _upload(env: EnvironmentSession, files: _FileList, root: tuple[str, str]) -> None:
    """Write ``files`` under a sandbox root, then mark the executable ones."""
    virtual, variable = root
    for rel, content, _ in files:
        await env.write_file(f"{virtual}/{rel}", content)
    executables = [rel for rel, _, executable in files if executable]
    if executables:
        # Quote only the relative part: the variable must still expand (local layout).
        targets = " ".join(f'"${{{variable}:-{virtual}}}"/{shlex.quote(rel)}' for rel in executables)
        await _check(env, f"chmod +x -- {targets}", f"make files under {virtual} executable")


def _load_tasks(path: str | Path) -> list[TaskSpec]:
    root = Path(path).absolute()
    if not root.is_dir():
        raise ComponentError(f"path: task directory {str(root)!r} does not exist")
    dirs = sorted((d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")), key=lambda d: d.name)
    tasks = [_load_task(d) for d in dirs]
    if not tasks:
        raise ComponentError(f"path: no task directories in {str(root)!r}")
    return tasks


def _load_task(directory: Path) -> TaskSpec:
    where = f"path: task {directory.name!r}"
    instruction = directory / "instruction.md"
    if not instruction.is_file():
        raise ComponentError(f"{where} has no instruction.md ({directory})")
    if not (directory / "tests" / "test.sh").is_file():
        raise ComponentError(f"{where} has no tests/test.sh ({directory})")
    config: dict[str, Any] = {}
    toml_path = directory / "task.toml"
    if toml_path.is_file():
        try:
            config = tomllib.loads(toml_path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ComponentError(f"{where}: invalid task.toml: {exc}") from None
    metadata_table = config.get("metadata", {})
    if not isinstance(metadata_table, dict):
        raise ComponentError(f"{where}: [metadata] in task.toml must be a table")
    category = metadata_table.get("category")
    if category is not None and not isinstance(category, str):
        raise ComponentError(f"{where}: [metadata] category must be a string")
    metadata: dict[str, Any] = {}
    for section in ("agent", "verifier"):
        timeout = _timeout(config.get(section, {}), f"{where}: [{section}] timeout_sec")
        if timeout is not None:
            metadata[f"{section}_timeout_sec"] = timeout
    if metadata_table:
        metadata["metadata"] = _jsonable(metadata_table)
    return TaskSpec(
        task_id=directory.name,
        data={"instruction": instruction.read_text(), "dir": str(directory.resolve())},
        category=category,
        metadata=metadata,
    )


def _timeout(section: Any, where: str) -> float | None:
    value = section.get("timeout_sec") if isinstance(section, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ComponentError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def _jsonable(value: Any) -> Any:
    """TOML values as JSON-ready data (dates and times become ISO strings)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
