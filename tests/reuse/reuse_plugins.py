"""Test-only components and kill points for ``test_sigkill_resume.py``.

Loaded through a config's ``plugins:`` list into ``compass launch``
subprocesses. Fake state is per process, so everything the test needs to
know is written to files:

- ``reuse-kill-harness`` appends ``"<task id> <attempt> <pid>"`` to the file
  named by its ``runs_log`` config key (opened in append mode for each line)
  when a run starts, then works for ``seconds`` of real time. The test counts
  the runs of every attempt across all the processes from that file.
- ``reuse-kill-local`` is the built-in ``local`` Environment (a sandbox
  directory per session under ``root``, reaped by path) with a kill point
  at the start of ``close``.

Kill points. ``REUSE_KILL_AT=<point>:<n>`` in the environment picks one:

=====================  ===================================================
``attempt_finished``   the n-th ``attempt_finished`` progress event (the
                       attempt is durable, the line only queued)
``checkpoint_saved``   the n-th attempt checkpoint of a running task is
                       durable
``task_finished``      the n-th ``task_finished`` event (every attempt
                       checkpointed, the record not written yet)
``run_attempt1``       the n-th harness run of an attempt with index 1
                       (mid-task: attempt 0 checkpointed)
``details_saved``      the n-th task record is durable and its checkpoints
                       are not removed yet (in the store's commit thread),
                       or a reused record's link is (in the linking thread)
``close``              the n-th Environment session close starts (the
                       sandbox exists, journalled opened and not closed)
``copy``               a ``--reuse`` run copying what it reuses, when it
                       asks for its n-th write (before any task started;
                       hard-linking a record it reuses unchanged is a write)
=====================  ===================================================

At the point, the process writes ``stopped <point>:<n>`` to the FIFO named
by ``REUSE_KILL_FIFO`` and stops itself with ``SIGSTOP``, frozen at that
instant for the test to ``SIGKILL``.

Two deliberate exceptions to "any instant", both known leaks (see the test
module): the stop is delayed while an Environment session is being opened
and its handle is not yet journalled (between ``open`` starting and
``sessions.jsonl`` holding the line): a kill there leaks a sandbox no
journal names. And it never lands inside the removal of a ``local`` sandbox
directory (``_remove_sandbox`` runs under a lock the stop takes): a kill
between its marker's removal and the directory's leaves an empty directory
that ``reap`` refuses (``test_a_sandbox_whose_close_was_cut_short_is_reaped``).

The hooks wrap methods of ``agentcompass._store._run_store.RunStore``
(``event``, ``journal_session``, ``save_task``, ``save_checkpoint``) and
the functions ``remove_superseded`` and ``link`` of
``agentcompass._store._commit`` (reuse links the records it takes
unchanged); a missing one fails at import, loudly.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, ClassVar

import attrs
import trio

import agentcompass.testing  # noqa: F401 - registers fake-bench
from agentcompass import register
from agentcompass._store import _commit
from agentcompass._store._run_store import RunStore
from agentcompass.environments import local
from agentcompass.environments.local import LocalEnvironment
from agentcompass.runtime._components import BaseHarness, EnvironmentSession
from agentcompass.runtime._results import ExecResult, RunBudget, RunResult
from agentcompass.runtime._values import ExecutionPlan, ModelSpec, NetworkPolicy, PreparedTask

_point, _, _nth = os.environ.get("REUSE_KILL_AT", "").partition(":")
KILL_POINT = _point or None
KILL_NTH = int(_nth) if _nth else 1
FIFO = os.environ.get("REUSE_KILL_FIFO", "")

_counts: dict[str, int] = {}
_state: dict[str, Any] = {"opening": 0, "armed": None, "token": None, "tasks_started": False}


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
    _counts[point] = _counts.get(point, 0) + 1
    return _counts[point] == KILL_NTH


def _fire_if_quiet() -> None:
    """In the Trio thread: stop the process now if a kill is armed and no
    session is between ``open`` and its journal line."""
    if _state["armed"] is None or _state["opening"]:
        return
    _removal_lock.acquire()  # no sandbox directory half removed; held until killed
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


# -- store hooks ----------------------------------------------------------------

for _name in ("event", "journal_session", "save_task", "save_checkpoint"):
    assert hasattr(RunStore, _name), f"RunStore.{_name} is gone: update reuse_plugins.py"

_event = RunStore.event
_journal_session = RunStore.journal_session
_save_task = RunStore.save_task
_save_checkpoint = RunStore.save_checkpoint
for _name in ("remove_superseded", "link"):
    assert hasattr(_commit, _name), f"_commit.{_name} is gone: update reuse_plugins.py"
_remove_superseded = _commit.remove_superseded
_link = _commit.link


def _hooked_event(self: RunStore, kind: str, **fields: Any) -> None:
    _state["token"] = _state["token"] or trio.lowlevel.current_trio_token()
    _event(self, kind, **fields)
    if kind == "task_started":
        _state["tasks_started"] = True
    if kind in ("attempt_finished", "task_finished") and _reached(kind):
        _arm()


async def _hooked_journal_session(self: RunStore, event: Any, *args: Any, **kwargs: Any) -> None:
    if event != "opened":
        await _journal_session(self, event, *args, **kwargs)
        return
    try:  # waited for here: the stop waits until the line is in sessions.jsonl
        await _journal_session(self, event, *args, **{**kwargs, "durable": True})
    finally:
        _state["opening"] -= 1
        _fire_if_quiet()


async def _copy_hook(save: Any, self: RunStore, *args: Any) -> None:
    if not _state["tasks_started"] and _reached("copy"):
        await _stop_here()
    await save(self, *args)


async def _hooked_save_task(self: RunStore, *args: Any) -> None:
    await _copy_hook(_save_task, self, *args)


async def _hooked_save_checkpoint(self: RunStore, *args: Any) -> None:
    if not _state["tasks_started"]:
        # The checkpoints a --reuse run copies.
        await _copy_hook(_save_checkpoint, self, *args)
        return
    # The checkpoints of running tasks.
    await _save_checkpoint(self, *args)
    if _reached("checkpoint_saved"):
        _arm()


def _hooked_remove_superseded(disk: Any, renamed: list[Any]) -> list[str]:
    # In the commit thread, once the batch's records are durable: the kill
    # can land between a durable record and its removals.
    kept = []
    for write in renamed:
        if f"{os.sep}details{os.sep}" in write.path and _reached("details_saved"):
            # Never remove this task's checkpoints: the kill lands first. The
            # batch itself finishes (blocking it would also hold back the
            # session lines it carries, and the stop waits for those).
            _state["token"].run_sync_soon(_arm)
            continue
        kept.append(write)
    return _remove_superseded(disk, kept)


def _hooked_link(disk: Any, targets: list[tuple[str, str]]) -> set[int]:
    # In a store thread, before any task started. Each link is a write of the
    # copy ("copy": stop before it is made) and, once synced, a durable
    # record ("details_saved": stop right after).
    for index in range(len(targets)):
        if _reached("copy"):
            _stop_in_thread(disk, targets[:index])
        if _reached("details_saved"):
            _stop_in_thread(disk, targets[: index + 1])
    return _link(disk, targets)


def _stop_in_thread(disk: Any, linked: list[tuple[str, str]]) -> None:
    _link(disk, linked)
    _state["token"].run_sync_soon(_arm)
    threading.Event().wait()  # never link the others


_commit.link = _hooked_link
RunStore.event = _hooked_event  # type: ignore[method-assign]
RunStore.journal_session = _hooked_journal_session  # type: ignore[method-assign]
RunStore.save_task = _hooked_save_task  # type: ignore[method-assign]
RunStore.save_checkpoint = _hooked_save_checkpoint  # type: ignore[method-assign]
_commit.remove_superseded = _hooked_remove_superseded


# -- local sandbox removal: never cut in the middle -------------------------------

_removal_lock = threading.Lock()
assert hasattr(local, "_remove_sandbox"), "local._remove_sandbox is gone: update reuse_plugins.py"
_remove_sandbox = local._remove_sandbox


def _locked_remove_sandbox(root: str) -> None:
    with _removal_lock:
        _remove_sandbox(root)


local._remove_sandbox = _locked_remove_sandbox


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
        await self._inner.close()


@register
class KillPointLocalEnvironment(LocalEnvironment):
    """``local`` with the ``close`` kill point and the mid-open bookkeeping."""

    id: ClassVar[str] = "reuse-kill-local"

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> _Session:
        _state["opening"] += 1  # until the runtime journalled the handle
        try:
            return _Session(await super().open(config, policy, name))
        except BaseException:
            _state["opening"] -= 1
            raise


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
        fd = os.open(self.options.runs_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{session.task_id} {session.attempt} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        if session.attempt == 1 and _reached("run_attempt1"):
            await _stop_here()
        await session.env.write_file("/app/answer.txt", f"{session.task_id} {session.attempt}\n")
        await trio.sleep(self.options.seconds)
        return RunResult(output="done")

    async def close_session(self, session: _HarnessSession) -> None:
        await trio.lowlevel.checkpoint()
