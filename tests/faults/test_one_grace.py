"""One grace deadline bounds every way out (SPEC 7): providers, the model
clients and the store's threads all end by it, and it is fixed when the
shutdown starts, not guessed from a cleanup's own cancel status."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import httpx
import trio
import trio.testing

from agentcompass import Orchestration, OrchestrationResult, register
from agentcompass._orchestration._launch import orchestrate
from agentcompass._store import load_run, open_run_store
from agentcompass._store._fake_disk import FakeDisk
from agentcompass.models import chat_client, open_model_clients
from agentcompass.runtime import (
    DEFAULT_CLEANUP_GRACE_SECONDS,
    AttemptRecord,
    ModelSpec,
    TaskRecord,
    cleanup_deadline,
)
from agentcompass.testing import FakeEnvironment, fake_request, hang_guard, reset_logs
from agentcompass.testing._harness import FakeHarness


async def launch(orchestration: Orchestration) -> OrchestrationResult:
    # Under the autojump clock a real thread lets the clock race ahead of the
    # disk: launch tests write through a fake disk (no thread, no flush).
    return await orchestrate(orchestration, disk=FakeDisk())


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
    autojump_clock: Any, tmp_path: Any
) -> None:
    # The harness's own inner timeout cancels a cleanup at 1 s. That is no
    # shutdown: the sandbox closed at 100 s still gets a whole grace.
    SEEN.clear()
    request = _request(tmp_path, PhaseTimeoutHarness.id)
    start = trio.current_time()
    result = await launch(Orchestration([request], cleanup_grace_seconds=7))
    assert result.status == "succeeded"
    assert [(what, t - start, d - start) for what, t, d in SEEN] == [("inner", 1, 8), ("close", 100, 107)]


async def test_the_callers_cancellation_fixes_one_deadline_for_every_cleanup(
    autojump_clock: Any, tmp_path: Any
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
        await launch(Orchestration([request], task_concurrency=3, cleanup_grace_seconds=7))
    assert sorted((what, t - start, d - start) for what, t, d in SEEN) == [("close", 10, 17)] * 3, SEEN


class _HangingTransport(httpx.AsyncBaseTransport):
    """Carries no request; its close never ends (a connection that will not close)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request is sent")

    async def aclose(self) -> None:
        await trio.sleep_forever()


#: Never called: the tests only create the endpoint's client.
MODEL = ModelSpec("m", base_url="http://127.0.0.1:9/v1")


async def test_model_clients_close_by_the_runs_grace_deadline(autojump_clock: Any, tmp_path: Any) -> None:
    # A model client pool whose close hangs, opened by a harness that first
    # cleans up for 4 s: launch, cancelled at 10 s with a 7 s grace, returns
    # at 17 s - the clients' close (from 14 s) shares the run's one grace
    # window instead of starting a window of its own (to 21 s).

    @register
    class ClientHarness(FakeHarness):
        id: ClassVar[str] = "faults-hanging-client-harness"

        async def run_task(self, session: Any, prepared: Any, budget: Any) -> Any:
            async with open_model_clients(1, transport=_HangingTransport()):
                chat_client(MODEL)
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(4)

    request = _request(tmp_path, ClientHarness.id)
    start = trio.current_time()
    with hang_guard(100), trio.move_on_after(10):
        await launch(Orchestration([request], cleanup_grace_seconds=7))
    assert trio.current_time() - start == 17


async def test_open_model_clients_closes_by_the_given_deadline(autojump_clock: Any) -> None:
    start = trio.current_time()
    with hang_guard(100):
        async with open_model_clients(1, close_deadline=lambda: start + 3, transport=_HangingTransport()):
            chat_client(MODEL)  # the endpoint's client, on the hanging transport
    assert trio.current_time() - start == 3


def _record(task_id: str) -> TaskRecord:
    return TaskRecord(task_id, None, [AttemptRecord(attempt=0, status="completed")], "normal")


async def _save(store: Any, record: TaskRecord, outcomes: list[Any]) -> None:
    """Await ``record``'s write and keep its outcome: None once durable, or the error."""
    try:
        await store.save_task(record)
    except OSError as exc:
        outcomes.append(exc)
    else:
        outcomes.append(None)


async def test_a_store_disk_is_never_given_up_before_the_deadline(autojump_clock: Any, tmp_path: Any) -> None:
    # The store closing with no deadline: the batch finishes whatever the
    # clock says, and its write is durable.
    disk = FakeDisk()
    outcomes: list[Any] = []

    async def resume_later() -> None:
        await trio.sleep(1000)
        disk.resume()

    async with trio.open_nursery() as nursery:
        async with open_run_store(tmp_path, "req", disk=disk, close_deadline=lambda: math.inf) as store:
            disk.stall()
            nursery.start_soon(_save, store, _record("t1"), outcomes)
            nursery.start_soon(resume_later)
    assert outcomes == [None]
    assert set(load_run(store.run_dir).details) == {"t1"}


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
