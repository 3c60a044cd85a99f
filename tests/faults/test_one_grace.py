"""One grace deadline bounds every way out (SPEC 7): providers, the model
clients and the store's threads all end by it, and it is fixed when the
shutdown starts, not guessed from a cleanup's own cancel status."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import trio
import trio.testing

import agentcompass
from agentcompass import Orchestration, register
from agentcompass._models import _pool
from agentcompass._store import _group_commit, _run_store, _writer
from agentcompass._store._atomic import StoreThreads
from agentcompass._store._group_commit import GroupCommitter
from agentcompass.runtime import DEFAULT_CLEANUP_GRACE_SECONDS, cleanup_deadline, open_model_clients
from agentcompass.testing import FakeEnvironment, fake_request, reset_logs
from agentcompass.testing._harness import FakeHarness


async def _inline(_threads: Any, fn: Any, *args: Any) -> Any:
    with trio.CancelScope(shield=True):
        await trio.lowlevel.checkpoint()
        return fn(*args)


async def _inline_io(fn: Any, *args: Any) -> Any:
    await trio.lowlevel.checkpoint()
    return fn(*args)


@pytest.fixture
def inline_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Under the autojump clock a real thread lets the clock race ahead of the
    # disk: the store's I/O runs inline (and without fsync) for launch tests.
    monkeypatch.setattr(StoreThreads, "run", _inline)
    monkeypatch.setattr(_run_store, "to_store_thread", _inline_io)
    monkeypatch.setattr(_group_commit, "WRITER_PROCESS", False)
    monkeypatch.setattr(_writer.Disk, "_syncfs", lambda self: None)
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    yield


#: What each cleanup saw: (trio time, cleanup_deadline()).
SEEN: list[tuple[str, float, float]] = []


@register
class DeadlineRecordingEnvironment(FakeEnvironment):
    """``fake-env`` whose sessions record :func:`cleanup_deadline` as they close."""

    id: ClassVar[str] = "faults-deadline-recording-env"

    async def open(self, config: Any, policy: Any, name: str | None = None) -> Any:
        session = await super().open(config, policy, name)
        close = session.close

        async def recording_close() -> None:
            SEEN.append(("close", trio.current_time(), cleanup_deadline()))
            await close()

        session.close = recording_close
        return session


@register
class PhaseTimeoutHarness(FakeHarness):
    """A harness whose run times out its own inner step at 1 s (a cleanup
    runs then, cancelled by that step's scope), then works until 100 s."""

    id: ClassVar[str] = "faults-phase-timeout-harness"

    async def run_task(self, session: Any, prepared: Any, budget: Any) -> Any:
        with trio.move_on_after(1):
            try:
                await trio.sleep_forever()
            finally:
                SEEN.append(("inner", trio.current_time(), cleanup_deadline()))
        await trio.sleep(99)
        return await super().run_task(session, prepared, budget)


def _request(tmp_path: Any, harness: str = "fake-harness", tasks: int = 1) -> Any:
    reset_logs()
    SEEN.clear()
    request = fake_request("a", benchmark={"tasks": tasks}, output_root=tmp_path)
    return attrs_evolve(request, harness, DeadlineRecordingEnvironment.id)


def attrs_evolve(request: Any, harness: str, environment: str) -> Any:
    import attrs

    return attrs.evolve(
        request,
        harness=attrs.evolve(request.harness, id=harness),
        environment=attrs.evolve(request.environment, id=environment),
    )


async def test_cleanup_deadline_outside_launch_is_now_plus_the_default(autojump_clock: Any) -> None:
    await trio.sleep(5)
    assert cleanup_deadline() == trio.current_time() + DEFAULT_CLEANUP_GRACE_SECONDS


async def test_a_phase_timeout_in_a_component_does_not_start_the_shutdown(
    autojump_clock: Any, tmp_path: Any, inline_store: None
) -> None:
    # The harness's own inner timeout cancels a cleanup at 1 s. That is no
    # shutdown: the sandbox closed at 100 s still gets a whole grace.
    SEEN.clear()
    request = _request(tmp_path, PhaseTimeoutHarness.id)
    start = trio.current_time()
    result = await agentcompass.launch(Orchestration([request], cleanup_grace_seconds=7))
    assert result.status == "succeeded"
    assert [(what, t - start, d - start) for what, t, d in SEEN] == [("inner", 1, 8), ("close", 100, 107)]


async def test_the_callers_cancellation_fixes_one_deadline_for_every_cleanup(
    autojump_clock: Any, tmp_path: Any, inline_store: None
) -> None:
    # Three sandboxes open when the caller cancels at 10 s: each close sees
    # the same deadline, fixed when the shutdown started (10 + 7).
    SEEN.clear()
    request = _request(tmp_path, tasks=3)
    request = attrs_evolve(request, "fake-harness", DeadlineRecordingEnvironment.id)
    import attrs

    request = attrs.evolve(request, harness=attrs.evolve(request.harness, config={"script": {"*": {"run": ["hang"]}}}))
    start = trio.current_time()
    with trio.move_on_after(10):
        await agentcompass.launch(Orchestration([request], task_concurrency=3, cleanup_grace_seconds=7))
    assert sorted((what, t - start, d - start) for what, t, d in SEEN) == [("close", 10, 17)] * 3, SEEN


class _HangingClient:
    async def aclose(self) -> None:
        await trio.sleep_forever()


async def test_model_clients_close_by_the_runs_grace_deadline(autojump_clock: Any, tmp_path: Any, inline_store: None) -> None:
    # A model endpoint whose close hangs: launch, cancelled at 10 s with a
    # 7 s grace, returns at 17 s - the clients' close shares the run's one
    # grace window instead of starting a window of its own after it.

    @register
    class ClientHarness(FakeHarness):
        id: ClassVar[str] = "faults-hanging-client-harness"

        async def run_task(self, session: Any, prepared: Any, budget: Any) -> Any:
            pool = _pool._current.get()
            assert pool is not None
            pool._http[("hanging",)] = _HangingClient()
            await trio.sleep_forever()

    request = _request(tmp_path, ClientHarness.id)
    start = trio.current_time()
    with trio.move_on_after(10):
        await agentcompass.launch(Orchestration([request], cleanup_grace_seconds=7))
    assert trio.current_time() - start == 17


async def test_open_model_clients_closes_by_the_given_deadline(autojump_clock: Any) -> None:
    start = trio.current_time()
    async with open_model_clients(1, close_deadline=lambda: start + 3) as pool:
        pool._http[("hanging",)] = _HangingClient()  # type: ignore[assignment]
    assert trio.current_time() - start == 3


class _StalledDisk:
    """A :class:`Disk` whose rounds block until released (a stalled disk)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.journal_fd = -1

    def commit(self, batch: Any) -> list[str]:
        self.started.set()
        self.release.wait()
        for job in batch:
            job.error = None
        return []


async def _committer_with_stalled_round(
    nursery: trio.Nursery,
) -> tuple[GroupCommitter, _StalledDisk, list[Any], trio.CancelScope]:
    """A committer in store threads (no writer process) whose one round is
    stalled in its thread; the scope stops its actor (as the store's close does)."""
    disk = _StalledDisk()
    committer = GroupCommitter(disk)  # type: ignore[arg-type]
    actor = trio.CancelScope()

    async def run_actor(task_status: Any) -> None:
        with actor:
            await committer.run(task_status=task_status)

    await nursery.start(run_actor)
    outcomes: list[Any] = []
    committer.write_soon("/nowhere", b"data", None, outcomes.append)
    await trio.to_thread.run_sync(disk.started.wait)
    return committer, disk, outcomes, actor


async def test_a_stalled_store_thread_is_given_up_at_the_grace_deadline(mock_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        committer, disk, outcomes, _ = await _committer_with_stalled_round(nursery)
        try:
            committer.set_deadline(trio.current_time() + 5)
            mock_clock.jump(4.9)
            await trio.testing.wait_all_tasks_blocked()
            assert outcomes == []  # not before the deadline
            mock_clock.jump(0.2)
            await trio.testing.wait_all_tasks_blocked()
            assert len(outcomes) == 1 and isinstance(outcomes[0], OSError)
            assert outcomes[0].errno == errno.ETIMEDOUT
        finally:
            disk.release.set()
            nursery.cancel_scope.cancel()


async def test_a_store_thread_is_never_given_up_before_the_deadline(mock_clock: trio.testing.MockClock) -> None:
    # The store closing (its actor cancelled) with no deadline yet: the round
    # finishes whatever the clock says, and its write is durable.
    async with trio.open_nursery() as nursery:
        committer, disk, outcomes, actor = await _committer_with_stalled_round(nursery)
        try:
            actor.cancel()
            mock_clock.jump(1000)
            await trio.testing.wait_all_tasks_blocked()
            assert outcomes == []
        finally:
            disk.release.set()
    assert outcomes == [None]


async def test_the_stores_files_close_only_after_a_given_up_thread() -> None:
    threads = StoreThreads()
    entered, leave = threading.Event(), threading.Event()
    closed: list[str] = []

    def work() -> None:
        entered.set()
        leave.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(threads.run, work)
        await trio.to_thread.run_sync(entered.wait)
        threads.release(lambda: closed.append("fds"))
        assert closed == []  # the thread may still use them
        leave.set()
    assert closed == ["fds"]
    with pytest.raises(OSError):  # nothing starts after the release
        await threads.run(work)


async def test_a_shield_opened_before_shutdown_ends_by_its_deadline(autojump_clock: Any) -> None:
    # A request's store is held under a shield opened long before shutdown:
    # it outlives the cancellation, but not the one grace deadline.
    from agentcompass._orchestration._context import GraceClock

    grace = GraceClock(7.0)
    ended_at: list[float] = []

    async def holder(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with grace.bounded_shield():
            task_status.started()
            await trio.sleep_forever()
        ended_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await nursery.start(holder)
        await trio.sleep(100)
        shutdown = trio.current_time()
        grace.begin()
        nursery.cancel_scope.cancel()  # the shield keeps the holder alive...
    assert ended_at == [shutdown + 7.0]  # ...until the fixed deadline, not forever


class _UnkillableWriter:
    """A writer process stuck in uninterruptible I/O (a stalled disk): SIGKILL
    is delivered but it does not die until the I/O returns, which it never does."""

    returncode = None
    pid = 0

    def __init__(self) -> None:
        self.stdin = self.stdout = self
        self.killed = False

    def kill(self) -> None:
        self.killed = True

    async def wait(self) -> None:
        await trio.sleep_forever()

    async def aclose(self) -> None:
        pass


async def test_a_writer_stuck_on_a_stalled_disk_does_not_hold_its_stop(autojump_clock: Any) -> None:
    stuck = _UnkillableWriter()
    writer = _group_commit._WriterProcess(stuck)  # type: ignore[arg-type]
    start = trio.current_time()
    with trio.fail_after(60):  # unbounded before: the wait after the kill never returned
        await writer.stop(2.0)
    assert stuck.killed
    assert trio.current_time() - start < 3.0
