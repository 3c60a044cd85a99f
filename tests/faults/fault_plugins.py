"""Test-only components for the fault tests that run ``compass`` subprocesses.

Loaded through a config's ``plugins:`` list. Fake state is per process, so
everything the tests look at is on disk:

- ``rec-env``: a scripted provider whose every ``open``, ``opened``,
  ``close``, ``reap`` and ``sweep`` is one line ``<event> <name> <pid>`` in
  the ``log`` file (config), and whose sandboxes are directories
  ``<root>/<name>``, made at the start of ``open``, before it takes
  ``open_seconds`` more (so a kill lands between the sandbox existing and
  the runtime journalling it). ``close`` and ``reap`` remove the directory;
  ``sweep(tag)`` removes every directory whose name starts with ``tag``.
  A sandbox leaked is a directory left under ``root``.
- ``rec-harness``: appends ``<task> <attempt> <pid>`` to ``runs_log`` when
  an agent run starts and takes ``seconds``; with ``fill`` set, the run of
  task ``fill_task`` first fills the filesystem holding that path (writes
  until ``ENOSPC``); with ``expose`` set, it exposes that host directory in
  the session first (``expose_directory``). With ``journal`` set it also appends ``run <session>
  <pid> <task>`` there (the session's name); ``crash: {task: [action, ...]}``
  makes the task's n-th run (counted in ``runs_log``, so across processes)
  raise: ``fatal`` an ``IssueError`` FATAL ``rec_run_fatal``, ``raise`` an
  unclassified ``RuntimeError``; ``ok`` or past the list it runs.
- ``rec-bench``: ``fake-bench`` (its scripts, values and plan) that appends
  ``prepare <session> <pid> <task>`` and ``evaluate <session or -> <pid>
  <task>`` to ``journal`` when called (before its scripted action), so the
  file tells which session each stage ran in; ``aggregate_fails`` makes
  ``aggregate_metrics`` raise.

``import agentcompass.testing`` registers ``fake-bench`` for the configs.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

import attrs
import trio

import agentcompass.testing  # noqa: F401 - registers fake-bench
from agentcompass import (
    BaseEnvironment,
    BaseHarness,
    EnvironmentSession,
    Evaluation,
    IssueError,
    NetworkPolicy,
    PreparedTask,
    RunBudget,
    RunRequest,
    RunResult,
    TaskSpec,
    register,
)
from agentcompass.testing import FakeBenchmark, MemorySession, append_line


@attrs.frozen
class RecEnvConfig:
    log: str
    root: str
    open_seconds: float = 0.0


class RecSession(MemorySession):
    """An in-memory session that removes its directory and logs its close."""

    def __init__(self, name: str, options: RecEnvConfig):
        super().__init__()
        self.name = name
        self.options = options

    @property
    def handle(self) -> dict[str, Any]:
        return {"name": self.name}

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            shutil.rmtree(Path(self.options.root) / self.name, ignore_errors=True)
            append_line(self.options.log, f"close {self.name} {os.getpid()}")
        await trio.lowlevel.checkpoint()


@register
class RecordingEnvironment(BaseEnvironment):
    id: ClassVar[str] = "rec-env"
    Config: ClassVar[type | None] = RecEnvConfig
    options: RecEnvConfig

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> RecSession:
        assert name is not None, "the runtime names every session"
        append_line(self.options.log, f"open {name} {os.getpid()}")
        os.makedirs(Path(self.options.root) / name)
        try:
            await trio.sleep(self.options.open_seconds)
        except BaseException:
            shutil.rmtree(Path(self.options.root) / name, ignore_errors=True)
            append_line(self.options.log, f"close {name} {os.getpid()}")
            raise
        append_line(self.options.log, f"opened {name} {os.getpid()}")
        return RecSession(name, self.options)

    async def reap(self, handle: dict[str, Any]) -> None:
        name = handle["name"]
        shutil.rmtree(Path(self.options.root) / name, ignore_errors=True)
        append_line(self.options.log, f"reap {name} {os.getpid()}")
        await trio.lowlevel.checkpoint()

    async def sweep(self, tag: str) -> None:
        root = Path(self.options.root)
        swept = sorted(p.name for p in root.iterdir() if p.name.startswith(tag)) if root.exists() else []
        for name in swept:
            shutil.rmtree(root / name, ignore_errors=True)
        append_line(self.options.log, f"sweep {tag} {os.getpid()} {' '.join(swept)}".rstrip())
        await trio.lowlevel.checkpoint()


@attrs.frozen
class RecHarnessConfig:
    runs_log: str
    seconds: float = 0.0
    fill: str = ""
    fill_task: str = ""
    expose: str = ""
    journal: str = ""
    crash: dict[str, list[str]] = attrs.Factory(dict)


def _session_name(env: EnvironmentSession | None) -> str:
    return "-" if env is None else str(env.handle.get("name", "?"))


@register
class RecordingHarness(BaseHarness):
    id: ClassVar[str] = "rec-harness"
    Config: ClassVar[type | None] = RecHarnessConfig
    options: RecHarnessConfig

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: Any, plan: Any
    ) -> tuple[str, int, str]:
        await trio.lowlevel.checkpoint()
        if self.options.expose:
            await env.expose_directory(self.options.expose)
        return prepared.task.task_id, plan.attempt, _session_name(env)

    async def run_task(self, session: tuple[str, int, str], prepared: PreparedTask, budget: RunBudget) -> RunResult:
        task_id, attempt, name = session
        actions, done = self.options.crash.get(task_id, []), 0
        if actions:
            runs_log = Path(self.options.runs_log)
            lines = runs_log.read_text().splitlines() if runs_log.exists() else []
            done = sum(1 for line in lines if line.split()[0] == task_id)
        append_line(self.options.runs_log, f"{task_id} {attempt} {os.getpid()}")
        if self.options.journal:
            append_line(self.options.journal, f"run {name} {os.getpid()} {task_id}")
        action = actions[done] if done < len(actions) else "ok"
        if action == "fatal":
            raise IssueError("fatal", "rec_run_fatal", f"run {done} of {task_id} failed on purpose")
        if action == "raise":
            raise RuntimeError(f"run {done} of {task_id} crashed on purpose")
        if self.options.fill and task_id == self.options.fill_task:
            _fill(self.options.fill)
        await trio.sleep(self.options.seconds)
        return RunResult(output="done")

    async def close_session(self, session: Any) -> None:
        await trio.lowlevel.checkpoint()


@attrs.frozen
class RecBenchConfig(FakeBenchmark.Config):  # type: ignore[misc,name-defined]
    journal: str = ""
    aggregate_fails: bool = False


@register
class RecordingBenchmark(FakeBenchmark):
    id: ClassVar[str] = "rec-bench"
    Config: ClassVar[type | None] = RecBenchConfig
    options: RecBenchConfig  # type: ignore[assignment]

    def _journal(self, event: str, env: EnvironmentSession | None, task_id: str) -> None:
        if self.options.journal:
            append_line(self.options.journal, f"{event} {_session_name(env)} {os.getpid()} {task_id}")

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        self._journal("prepare", env, task.task_id)
        return await super().prepare_task(task, env, request, benchmark_plan)

    async def evaluate(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession | None, request: RunRequest
    ) -> Evaluation:
        self._journal("evaluate", env, prepared.task.task_id)
        return await super().evaluate(prepared, run_result, env, request)

    def aggregate_metrics(self, records: Any) -> dict[str, Any] | None:
        if self.options.aggregate_fails:
            raise RuntimeError("aggregate_metrics failed on purpose")
        return super().aggregate_metrics(records)


def _fill(path: str) -> None:
    """Write ``path`` until its filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    chunk = b"\0" * 4096
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
