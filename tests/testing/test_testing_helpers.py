"""hang_guard, fake_request, fake_plan, and the package's public surface."""

from __future__ import annotations

import types

import pytest
import trio

import agentcompass.testing
from agentcompass.runtime import NO_HARNESS, ExecutionSpec, FileRefusedError, NetworkPolicy
from agentcompass.testing import fake_plan, fake_request, hang_guard


async def test_hang_guard_lets_a_quick_body_through(autojump_clock: trio.abc.Clock) -> None:
    async with hang_guard(10) as scope:
        await trio.sleep(9)
    assert not scope.cancelled_caught
    with hang_guard(10):
        await trio.sleep(1)


async def test_hang_guard_fails_a_hung_body(autojump_clock: trio.abc.Clock) -> None:
    with pytest.raises(AssertionError, match="did not finish within 5s"):
        async with hang_guard(5):
            await trio.sleep_forever()
    assert trio.current_time() == pytest.approx(5)
    with pytest.raises(AssertionError, match="did not finish"), hang_guard(1):
        await trio.sleep(2)


async def test_hang_guard_does_not_claim_the_bodys_own_timeouts(autojump_clock: trio.abc.Clock) -> None:
    with pytest.raises(trio.TooSlowError):
        async with hang_guard(100):
            with trio.fail_after(1):
                await trio.sleep_forever()
    with pytest.raises(KeyError):
        async with hang_guard(100):
            raise KeyError("body")


def test_fake_request() -> None:
    request = fake_request(
        "r1",
        log="mine",
        benchmark={"tasks": 5},
        environment={"switchable": False},
        execution=ExecutionSpec(max_retries=2),
    )
    assert request.name == "r1"
    assert (request.benchmark.id, request.benchmark.config) == ("fake-bench", {"log": "mine", "tasks": 5})
    assert request.environment.config == {"log": "mine", "switchable": False}
    assert (request.harness.id, request.harness.config) == ("fake-harness", {"log": "mine"})
    assert request.execution.max_retries == 2
    free = fake_request(harness_free=True)
    assert (free.benchmark.id, free.harness) == ("fake-free-bench", NO_HARNESS)


def test_fake_plan() -> None:
    plan = fake_plan("t003", 1, log="x", run_network_policy="none", run_timeout_seconds=5)
    assert (plan.task_id, plan.attempt, plan.environment.id, plan.environment.config) == (
        "t003",
        1,
        "fake-env",
        {"log": "x"},
    )
    assert plan.run_network_policy == NetworkPolicy("none")
    assert plan.run_timeout_seconds == 5


def test_public_surface() -> None:
    # Submodules (``model_server``) appear once imported; the surface is the names.
    public = {
        name
        for name in dir(agentcompass.testing)
        if not name.startswith("_") and not isinstance(getattr(agentcompass.testing, name), types.ModuleType)
    }
    assert public == {
        "Call",
        "CallLog",
        "DEFAULT_POLICIES",
        "EnvironmentConformance",
        "FakeAnalyzer",
        "FakeBenchmark",
        "FakeEnvironment",
        "FakeHarness",
        "FakeHarnessFreeBenchmark",
        "FakeHarnessSession",
        "FakeRecipe",
        "FakeSession",
        "HangGuard",
        "MemorySession",
        "all_calls",
        "append_line",
        "call_log",
        "check_environment",
        "check_exposed_directory",
        "check_exposed_socket",
        "check_sweep_detaches_exposures",
        "environment_conformance_tests",
        "fake_plan",
        "fake_request",
        "hang_guard",
        "live_sandboxes",
        "reset_logs",
    }


async def test_memory_session_keeps_files_and_closes_idempotently() -> None:
    from agentcompass import NetworkPolicy
    from agentcompass.testing import MemorySession

    session = MemorySession(7)
    await session.write_file("a/b.txt", "héllo")
    assert await session.read_file("a/b.txt") == "héllo".encode()
    with pytest.raises(FileNotFoundError):
        await session.read_file("missing")
    assert await session.read_file("a/b.txt", max_bytes=6) == "héllo".encode()
    with pytest.raises(FileRefusedError):
        await session.read_file("a/b.txt", max_bytes=5)
    result = await session.exec(["false"])
    assert (result.exit_code, result.timed_out) == (0, False)
    await session.set_network_policy(NetworkPolicy("none"))
    assert session.policy == NetworkPolicy("none")
    assert session.handle == {"number": 7}
    await session.close()
    await session.close()
    assert session.closed


async def test_calls_carry_their_trio_time_and_their_place_across_logs(autojump_clock: trio.abc.Clock) -> None:
    a, b = agentcompass.testing.call_log("a"), agentcompass.testing.call_log("b")
    start = trio.current_time()
    first = a.record("harness", "run", "t1")
    await trio.sleep(2.5)
    second = b.record("environment", "open", "t2")
    third = a.record("harness", "collect", "t1")
    assert [c.at - start for c in (first, second, third)] == [0, 2.5, 2.5]
    assert [(c.seq, c.order) for c in (first, second, third)] == [(0, 0), (0, 1), (1, 2)]
    assert agentcompass.testing.all_calls() == [("a", first), ("b", second), ("a", third)]
    agentcompass.testing.reset_logs()
    assert agentcompass.testing.all_calls() == []
    assert agentcompass.testing.call_log("a").record("harness", "run", "t1").order == 0


def test_a_call_recorded_outside_trio_has_no_time() -> None:
    assert agentcompass.testing.call_log("a").record("benchmark", "load_tasks", None).at is None
