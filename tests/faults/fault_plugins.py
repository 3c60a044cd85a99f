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
  the session first (``expose_directory``).

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
    NetworkPolicy,
    PreparedTask,
    RunBudget,
    RunResult,
    register,
)
from agentcompass.testing import MemorySession


def append_line(path: str, line: str) -> None:
    """One ``O_APPEND`` write: lines of concurrent processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


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


@register
class RecordingHarness(BaseHarness):
    id: ClassVar[str] = "rec-harness"
    Config: ClassVar[type | None] = RecHarnessConfig
    options: RecHarnessConfig

    async def start_session(self, prepared: PreparedTask, env: Any, model: Any, plan: Any) -> tuple[str, int]:
        await trio.lowlevel.checkpoint()
        if self.options.expose:
            await env.expose_directory(self.options.expose)
        return prepared.task.task_id, plan.attempt

    async def run_task(self, session: tuple[str, int], prepared: PreparedTask, budget: RunBudget) -> RunResult:
        task_id, attempt = session
        append_line(self.options.runs_log, f"{task_id} {attempt} {os.getpid()}")
        if self.options.fill and task_id == self.options.fill_task:
            _fill(self.options.fill)
        await trio.sleep(self.options.seconds)
        return RunResult(output="done")

    async def close_session(self, session: Any) -> None:
        await trio.lowlevel.checkpoint()


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
