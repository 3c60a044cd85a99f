"""Test-only components and the kill-point disk for ``test_sigkill_resume.py``.

``kill_compass.py`` runs ``compass`` with every run store on
:class:`KillPointDisk` and imports this module; the config names it in
``plugins:`` by module name, so the components below are that same module's.
Fake state is per process, so everything the test needs to know is written
to files:

- ``reuse-kill-harness`` appends ``"<task id> <attempt> <pid>"`` to the file
  named by its ``runs_log`` config key (opened in append mode for each line)
  when a run starts, then works for ``seconds`` of real time. The test counts
  the runs of every attempt across all the processes from that file.
- ``reuse-kill-local`` is the built-in ``local`` Environment (a sandbox
  directory per session under ``root``, reaped by path) with a kill point
  at the start of ``close``.

Kill points. ``REUSE_KILL_AT=<point>:<n>`` in the environment picks one:

=====================  ===================================================
``attempt_finished``   the n-th ``attempt_finished`` progress line reaches
                       the disk (the attempt is durable; that line and the
                       ones after it are never written)
``task_finished``      the same for ``task_finished`` (the record is
                       durable, the line is not)
``checkpoint_saved``   the n-th attempt checkpoint of a running task is
                       durable (in the store's commit thread)
``run_attempt1``       the n-th harness run of an attempt with index 1
                       (mid-task: attempt 0 checkpointed)
``details_saved``      the n-th task record is durable and its checkpoints
                       are not removed yet (in the store's commit thread,
                       at their removal; they are never removed), or a
                       reused record's link is (in the linking thread)
``close``              the n-th Environment session close starts (the
                       sandbox exists, journalled opened and not closed)
``copy``               a ``--reuse`` run copying what it reuses, at its n-th
                       file (before any task started; hard-linking a record
                       it reuses unchanged counts as a file): the thread
                       stops before writing or linking it
=====================  ===================================================

At the point, the process writes ``stopped <point>:<n>`` to the FIFO named
by ``REUSE_KILL_FIFO`` and stops itself with ``SIGSTOP``, frozen at that
instant for the test to ``SIGKILL``. A point reached in a store thread
stops the Trio thread (and with it the process) as soon as it gets there.

Two deliberate exceptions to "any instant", both known leaks (see the test
module): the stop is delayed while an Environment session is being opened
and its handle is not yet journalled (between ``open`` starting and
``sessions.jsonl`` holding the line): a kill there leaks a sandbox no
journal names. And it never lands while a ``local`` session is closed,
reaped or swept: a kill between a sandbox marker's removal and its
directory's leaves an empty directory that ``reap`` refuses
(``test_a_sandbox_whose_close_was_cut_short_is_reaped``).

Every hook is a method of :class:`KillPointDisk` (the store's own disk
seam) or of the components; nothing of the runtime is patched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, ClassVar, TypeVar

import attrs
import trio

import agentcompass.testing  # noqa: F401 - registers fake-bench
from agentcompass import register
from agentcompass._store import Disk
from agentcompass.environments.local import LocalEnvironment
from agentcompass.runtime._components import BaseHarness, EnvironmentSession
from agentcompass.runtime._results import ExecResult, RunBudget, RunResult
from agentcompass.runtime._values import ExecutionPlan, ModelSpec, NetworkPolicy, PreparedTask
from agentcompass.testing import append_line

T = TypeVar("T")

_point, _, _nth = os.environ.get("REUSE_KILL_AT", "").partition(":")
KILL_POINT = _point or None
KILL_NTH = int(_nth) if _nth else 1
FIFO = os.environ.get("REUSE_KILL_FIFO", "")

_counts: dict[str, int] = {}
_counting = threading.Lock()  # points are counted in the Trio thread and in store threads
# Trio-thread state: sessions between open and their journal line, closes
# (or reaps, sweeps) under way, the stop once armed, whether a task started.
_state: dict[str, Any] = {"opening": 0, "removing": 0, "armed": None, "tasks_started": False}


def _notify(line: str) -> None:
    if not FIFO:
        return
    fd = os.open(FIFO, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _reached(point: str) -> bool:
    """Count one occurrence of ``point``; True when it is the chosen one."""
    if point != KILL_POINT:
        return False
    with _counting:
        _counts[point] = _counts.get(point, 0) + 1
        return _counts[point] == KILL_NTH


def _fire_if_quiet() -> None:
    """In the Trio thread: stop the process now if a kill is armed and no
    session is between ``open`` and its journal line, nor being removed."""
    if _state["armed"] is None or _state["opening"] or _state["removing"]:
        return
    _notify(f"stopped {_state['armed']}")
    os.kill(os.getpid(), signal.SIGSTOP)
    # Only reached if someone sent SIGCONT: stay frozen.
    threading.Event().wait()


def _arm() -> None:
    if _state["armed"] is None:
        _state["armed"] = f"{KILL_POINT}:{KILL_NTH}"
    _fire_if_quiet()


async def _stop_here() -> None:
    _arm()
    await trio.sleep_forever()  # the stop comes once no session is mid-open


def _journalled(opened: int) -> None:
    _state["opening"] -= opened
    _fire_if_quiet()


def _in_dir(path: str, name: str) -> bool:
    return f"{os.sep}{name}{os.sep}" in path


class KillPointDisk(Disk):
    """The real disk, with the kill points that fall in a store thread.

    Its primitives run in store threads; they reach the Trio thread through
    the token :meth:`run` notes. A thread stops for good only before any task
    started (no session can be mid-open then); later it finishes its batch
    and leaves the stop to the Trio thread.
    """

    def __init__(self) -> None:
        super().__init__()
        self._token: trio.lowlevel.TrioToken | None = None
        self._renamed_checkpoints = 0
        self._linked: list[str] = []
        self._records: dict[str, bool] = {}  # task directory -> its checkpoints may go
        self._progress_lost = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        self._token = trio.lowlevel.current_trio_token()
        return await super().run(fn, *args)

    def _soon(self, fn: Callable[..., object], *args: Any) -> None:
        assert self._token is not None
        self._token.run_sync_soon(fn, *args)

    def _stop_in_thread(self) -> None:
        self._soon(_arm)
        threading.Event().wait()  # nothing more from this thread

    def append(self, path: str, data: bytes) -> None:
        name = os.path.basename(path)
        if name == "progress.jsonl":
            data = self._progress_until_lost(data)
        if data:
            super().append(path, data)
        if name == "sessions.jsonl" and (opened := data.count(b'"event":"opened"')):
            self._soon(_journalled, opened)

    def _progress_until_lost(self, data: bytes) -> bytes:
        """The progress lines before the chosen ``attempt_finished`` or
        ``task_finished`` one; none once it was met."""
        if self._progress_lost:
            return b""
        lines = data.splitlines(keepends=True)
        for index, line in enumerate(lines):
            for kind in ("attempt_finished", "task_finished"):
                if f'"event":"{kind}"'.encode() in line and _reached(kind):
                    self._progress_lost = True
                    self._soon(_arm)
                    return b"".join(lines[:index])
        return data

    def write(self, path: str, data: bytes) -> None:
        # Before any task started, what goes to details/ or tasks/ is a copy.
        if not _state["tasks_started"] and (_in_dir(path, "details") or _in_dir(path, "tasks")):
            if _reached("copy"):
                self._stop_in_thread()
        super().write(path, data)

    def replace(self, source: str, target: str) -> None:
        super().replace(source, target)
        if _state["tasks_started"] and os.path.basename(target) == "checkpoint.json":
            self._renamed_checkpoints += 1

    def sync(self, paths: Iterable[str]) -> None:
        super().sync(paths)
        # The sync after a batch's renames: its checkpoints are durable.
        renamed, self._renamed_checkpoints = self._renamed_checkpoints, 0
        if any(_reached("checkpoint_saved") for _ in range(renamed)):
            self._soon(_arm)

    def _superseded(self, task_dir: str) -> bool:
        """A durable record's batch removes the checkpoints in ``task_dir``:
        False to keep them, at the chosen record (the kill lands first)."""
        if task_dir not in self._records:
            self._records[task_dir] = not _reached("details_saved")
            if not self._records[task_dir]:
                self._soon(_arm)
        return self._records[task_dir]

    def unlink(self, path: str) -> bool:
        if os.path.basename(path) == "checkpoint.json" and _state["tasks_started"]:
            if not self._superseded(os.path.dirname(os.path.dirname(path))):
                return False
        return super().unlink(path)

    def listdir(self, path: str) -> list[str]:
        # Only a batch of a reopened run lists a directory: to find the
        # checkpoints of the task whose record it made durable.
        return super().listdir(path) if self._superseded(path) else []

    def link(self, source: str, target: str) -> None:
        # Reuse hard-links each record it takes unchanged (a copy), then
        # syncs their directories.
        if _reached("copy"):
            self._stop_in_thread()
        super().link(source, target)
        self._linked.append(os.path.dirname(target))
        if _reached("details_saved"):
            super().sync(self._linked)
            self._stop_in_thread()


# -- components -------------------------------------------------------------------


class _Session(EnvironmentSession):
    """A ``local`` session with a kill point at the start of ``close``."""

    def __init__(self, inner: EnvironmentSession):
        self._inner = inner

    @property
    def handle(self) -> dict[str, Any]:
        return self._inner.handle

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        return await self._inner.exec(cmd, timeout, cwd, env)

    async def read_file(self, path: str) -> bytes:
        return await self._inner.read_file(path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._inner.write_file(path, data)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await self._inner.set_network_policy(policy)

    async def close(self) -> None:
        if _reached("close"):
            await _stop_here()
        async with _removing():
            await self._inner.close()


@contextlib.asynccontextmanager
async def _removing() -> AsyncIterator[None]:
    """No stop while a sandbox is being removed."""
    _state["removing"] += 1
    try:
        yield
    finally:
        _state["removing"] -= 1
        _fire_if_quiet()


@register
class KillPointLocalEnvironment(LocalEnvironment):
    """``local`` with the ``close`` kill point and the bookkeeping of
    sessions mid-open and sandboxes being removed."""

    id: ClassVar[str] = "reuse-kill-local"

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> _Session:
        _state["tasks_started"] = True  # a run opens sessions only for its tasks
        _state["opening"] += 1  # until the runtime journalled the handle
        try:
            return _Session(await super().open(config, policy, name))
        except BaseException:
            _state["opening"] -= 1
            raise

    async def reap(self, handle: dict[str, Any]) -> None:
        async with _removing():
            await super().reap(handle)

    async def sweep(self, tag: str) -> None:
        async with _removing():
            await super().sweep(tag)


@attrs.frozen
class KillHarnessConfig:
    runs_log: str
    seconds: float = 0.05


@attrs.frozen
class _HarnessSession:
    task_id: str
    attempt: int
    env: EnvironmentSession


@register
class KillPointHarness(BaseHarness):
    """Logs every run to ``runs_log``, writes to its sandbox, takes ``seconds``."""

    id: ClassVar[str] = "reuse-kill-harness"
    Config: ClassVar[type | None] = KillHarnessConfig
    options: KillHarnessConfig

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> _HarnessSession:
        await trio.lowlevel.checkpoint()
        return _HarnessSession(prepared.task.task_id, plan.attempt, env)

    async def run_task(self, session: _HarnessSession, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        append_line(self.options.runs_log, f"{session.task_id} {session.attempt} {os.getpid()}")
        if session.attempt == 1 and _reached("run_attempt1"):
            await _stop_here()
        await session.env.write_file("/app/answer.txt", f"{session.task_id} {session.attempt}\n")
        await trio.sleep(self.options.seconds)
        return RunResult(output="done")

    async def close_session(self, session: _HarnessSession) -> None:
        await trio.lowlevel.checkpoint()
