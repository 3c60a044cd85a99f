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

Task directories are untrusted input, read by the runtime's user. A task
holding a symbolic link that resolves outside its directory (absolute or
relative, dangling or not), or whose ``environment``, ``tests`` or
``solution`` is itself a link, fails to load with one line naming the task
and the link (``compass validate`` exits 2). Links that stay inside are
copied into the session as links, never followed; files are opened without
following links or blocking on a FIFO, so a task directory changed after it
loaded cannot make the runtime read a host file (FATAL ``setup_failed``).

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
  or the mean of all entries when there is no ``"reward"``). Where the
  session offers ``exec_private``, test.sh runs with its own private
  ``/logs/verifier`` and the reward comes from the files it returns, so a
  process the agent left running cannot rewrite it; elsewhere the shared
  directory is read. Either way the reward is read as a regular file of at
  most 1 MiB: a FIFO, a device, a link, a larger file or one that vanished
  is a WARNING ``reward_unparseable`` scored 0, never a FATAL. The exit status of
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
import os
import posixpath
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
    FileRefusedError,
    Issue,
    IssueError,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
    register,
)
from agentcompass.runtime import command_output, read_beneath

__all__ = ["TerminalBenchmark"]

# Files of environment/ that describe a container image rather than its contents.
_IMAGE_FILES = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml"})

# (sandbox virtual root, environment variable naming it under ``local``)
_APP = ("/app", "APP_DIR")
_TESTS = ("/tests", "TESTS_DIR")
_SOLUTION = ("/solution", "SOLUTION_DIR")

_RUN_TESTS = 'bash "${TESTS_DIR:-/tests}/test.sh"'
# Tried in this order (as Harbor does); read as regular files of at most 1 MiB.
_REWARD_FILES = ("reward.txt", "reward.json")
_MAX_REWARD_BYTES = 1024 * 1024
# What ``exec_private`` brings back of the verifier's directory, at most.
_MAX_VERIFIER_BYTES = 16 * 1024 * 1024
_MAX_TASK_TEXT_BYTES = 16 * 1024 * 1024
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
        """Load every task directory (layout, ``task.toml``, links) and check ``task_ids``."""
        tasks = _load_tasks(self.options.path)
        known = {task.task_id for task in tasks}
        for task_id in request.task_ids or ():
            if task_id not in known:
                raise ComponentError(f"task_ids: no task {task_id!r} in {str(Path(self.options.path).absolute())!r}")

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        """Every task directory under ``path``, sorted by id. A directory
        without ``instruction.md`` or ``tests/test.sh``, with an invalid
        ``task.toml`` or with a symbolic link pointing out of it, is a
        :class:`ComponentError` naming it (and the link)."""
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
        await _upload(env, await _read_tree(task_dir, "environment", _IMAGE_FILES), _APP)
        if request.harness.id == "oracle":
            await _upload(env, await _read_tree(task_dir, "solution"), _SOLUTION)
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
        own = env.handle == prepared.metadata.get("prepared_in")
        if not own:
            # A fresh evaluation sandbox: give it the task's starting files.
            await _upload(env, await _read_tree(task_dir, "environment", _IMAGE_FILES), _APP)
        tests = await _read_tree(task_dir, "tests")
        try:
            # Where the provider can, test.sh is read and its reward written where
            # nothing the agent left running can reach; else in the shared directories.
            result, private = await env.exec_private(
                _RUN_TESTS, directory="/logs/verifier", max_bytes=_MAX_VERIFIER_BYTES, inputs=_inputs(tests)
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
            result, private = await env.exec(_RUN_TESTS), None
        # Kept with the attempt (the run result's artifacts are the attempt's), so a zero can be explained.
        run_result.artifacts["verifier"] = command_output(result)
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
            reward = _parse_reward(found, raw)
        except ValueError as exc:
            return _zero("reward_unparseable", f"{found}: {exc}")
        return Evaluation(values={"reward": reward, "passed": reward >= 1})


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
                inside = _link_inside(task_real, os.path.join(dirpath, name), target)
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


def _link_inside(task_real: str, link: str, target: str) -> str | None:
    """The target to give the link ``link`` (whose text is ``target``) in a
    session, or None when it resolves (as the kernel would, through links
    before it) outside the task directory ``task_real``. An absolute target
    inside is made relative, since the task directory's host path means
    nothing in a session."""
    resolved = os.path.realpath(link)
    if os.path.commonpath([task_real, resolved]) != task_real:
        return None
    if os.path.isabs(target):
        return os.path.relpath(resolved, os.path.realpath(os.path.dirname(link)))
    return target


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
    _check_links(directory, where)
    instruction = directory / "instruction.md"
    if not instruction.is_file():
        raise ComponentError(f"{where} has no instruction.md ({directory})")
    if not (directory / "tests" / "test.sh").is_file():
        raise ComponentError(f"{where} has no tests/test.sh ({directory})")
    config: dict[str, Any] = {}
    toml_path = directory / "task.toml"
    if toml_path.is_file():
        try:
            config = tomllib.loads(_read_task_text(directory, "task.toml", where))
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
        data={"instruction": _read_task_text(directory, "instruction.md", where), "dir": str(directory.resolve())},
        category=category,
        metadata=metadata,
    )


def _check_links(directory: Path, where: str) -> None:
    """Refuse a task directory holding a symbolic link that resolves outside it
    (absolute or relative, dangling or not), or whose ``environment``,
    ``tests`` or ``solution`` is a link: a task directory is untrusted input,
    and its files are read by the runtime's user."""
    task_real = os.path.realpath(directory)
    for sub in ("environment", "tests", "solution"):
        if (directory / sub).is_symlink():
            raise ComponentError(f"{where}: {sub} is a symbolic link, not a directory")
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(task_real, follow_symlinks=False):
        for name in sorted([*dirnames, *filenames]):
            if not stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                continue
            target = os.readlink(name, dir_fd=dir_fd)
            if _link_inside(task_real, os.path.join(dirpath, name), target) is None:
                rel = Path(dirpath, name).relative_to(task_real).as_posix()
                raise ComponentError(f"{where}: symbolic link {rel!r} points outside the task directory ({target!r})")


def _read_task_text(directory: Path, name: str, where: str) -> str:
    """A top-level file of a task directory as text, read as a regular file of
    at most 16 MiB, without blocking on a FIFO or leaving the task directory."""
    # A link inside the task directory is followed by hand: the path it
    # resolves to is read by a walk that refuses any link still on the way.
    task_real = os.path.realpath(directory)
    resolved = os.path.realpath(directory / name)
    try:
        return read_beneath(task_real, os.path.relpath(resolved, task_real), _MAX_TASK_TEXT_BYTES).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ComponentError(f"{where}: cannot read {name}: {exc}") from None


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
