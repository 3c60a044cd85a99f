"""The action vocabulary of the fakes' scripts, and how scripts are indexed."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentcompass.runtime import (
    ComponentError,
    IssueError,
    NetworkPolicy,
    RunBudget,
    RunResult,
)
from agentcompass.testing import (
    FakeBenchmark,
    FakeEnvironment,
    FakeHarness,
    FakeHarnessFreeBenchmark,
    FakeSession,
    call_log,
    fake_plan,
    fake_request,
)


async def open_session(task_id: str = "t000", **config: Any) -> FakeSession:
    env = FakeEnvironment(config)
    return await env.open(env.build_config(fake_plan(task_id)), NetworkPolicy())


def exec_script(*actions: str) -> dict[str, Any]:
    return {"script": {"*": {"exec": list(actions)}}}


async def test_ok_is_the_default() -> None:
    session = await open_session()
    result = await session.exec("true")
    assert (result.exit_code, result.stdout) == (0, "ok")
    assert call_log().select("exec")[0].detail["action"] == "ok"


@pytest.mark.parametrize(
    ("action", "severity", "code", "message"),
    [
        ("fatal", "fatal", "fake_exec_fatal", None),
        ("error", "error", "fake_exec_error", None),
        ("fatal:disk_full", "fatal", "disk_full", "disk_full happened"),
        ("error:model_said_no", "error", "model_said_no", "model_said_no happened"),
    ],
)
async def test_classified_failures(action: str, severity: str, code: str, message: str | None) -> None:
    session = await open_session(**exec_script(action))
    with pytest.raises(IssueError) as info:
        await session.exec("true")
    assert (info.value.severity, info.value.code) == (severity, code)
    if message is not None:
        assert info.value.message == message
    assert info.value.phase is None  # the runtime fills in the phase it was in


async def test_raise_is_unclassified() -> None:
    session = await open_session(**exec_script("raise"))
    with pytest.raises(RuntimeError, match="fake exec crashed") as info:
        await session.exec("true")
    assert not isinstance(info.value, IssueError)


async def test_warning_outside_results_behaves_as_ok_but_is_logged() -> None:
    session = await open_session(**exec_script("warning"))
    assert (await session.exec("true")).exit_code == 0
    assert call_log().select("exec")[0].detail["action"] == "warning"


async def test_hang_hangs_until_cancelled(autojump_clock: trio.abc.Clock) -> None:
    session = await open_session(**exec_script("hang"))
    with trio.move_on_after(3600) as scope:
        await session.exec("true")
    assert scope.cancelled_caught
    assert trio.current_time() == pytest.approx(3600)


async def test_sleep_then_ok(autojump_clock: trio.abc.Clock) -> None:
    session = await open_session(**exec_script("sleep:7.5"))
    start = trio.current_time()
    assert (await session.exec("true")).exit_code == 0
    assert trio.current_time() - start == pytest.approx(7.5)


async def test_every_action_checkpoints_first() -> None:
    env = FakeEnvironment({})
    with trio.CancelScope() as scope:
        scope.cancel()
        await env.open(env.build_config(fake_plan()), NetworkPolicy())
    assert scope.cancelled_caught
    # Logged, but no session was made.
    assert call_log().phases() == ["build_config", "open"]
    assert not call_log().live_sessions()


async def test_warning_adds_an_issue_to_results() -> None:
    request = fake_request()
    script = {"*": {"collect": ["warning"], "evaluate": ["warning"]}}
    bench = FakeBenchmark({"script": script})
    task = (await bench.load_tasks(request))[0]
    prepared = await bench.prepare_task(task, await open_session(), request, {})
    collected = await bench.collect_artifacts(prepared, RunResult(), None)  # type: ignore[arg-type]
    assert [(i.severity, i.phase, i.code) for i in collected.issues] == [
        ("warning", "collect", "fake_collect_warning")
    ]
    evaluation = await bench.evaluate(prepared, collected, None, request)
    assert [(i.severity, i.phase, i.code) for i in evaluation.issues] == [
        ("warning", "evaluate", "fake_evaluate_warning")
    ]
    assert evaluation.values == {"score": 1.0}

    harness = FakeHarness({"script": {"*": {"run": ["warning"]}}})
    session = await harness.start_session(prepared, None, None, fake_plan())  # type: ignore[arg-type]
    result = await harness.run_task(session, prepared, RunBudget())
    assert [(i.severity, i.phase, i.code) for i in result.issues] == [("warning", "run", "fake_run_warning")]
    assert result.output == "answer"


@pytest.mark.parametrize("free", [False, True])
async def test_harness_timeout_is_returned_not_raised(free: bool) -> None:
    request = fake_request(harness_free=free)
    script = {"*": {"run": ["harness_timeout"]}}
    bench = (FakeHarnessFreeBenchmark if free else FakeBenchmark)({"script": script} if free else {})
    task = (await bench.load_tasks(request))[0]
    env = await open_session()
    prepared = await bench.prepare_task(task, env, request, {})
    if free:
        assert isinstance(bench, FakeHarnessFreeBenchmark)
        result = await bench.run_task(prepared, env, None, RunBudget(60))
    else:
        harness = FakeHarness({"script": script})
        session = await harness.start_session(prepared, env, None, fake_plan())
        result = await harness.run_task(session, prepared, RunBudget(60))
    assert [(i.severity, i.phase, i.code) for i in result.issues] == [("error", "run", "harness_timeout")]


async def test_nth_call_takes_nth_action_then_ok() -> None:
    session = await open_session(**exec_script("error", "ok", "fatal"))
    outcomes = []
    for _ in range(5):
        try:
            await session.exec("true")
            outcomes.append("ok")
        except IssueError as exc:
            outcomes.append(exc.severity)
    assert outcomes == ["error", "ok", "fatal", "ok", "ok"]


async def test_counters_continue_across_instances() -> None:
    # A retry builds new component instances; the script must continue, not restart.
    script = {"script": {"*": {"open": ["fatal", "error"]}}}
    plan = fake_plan()
    seen = []
    for _ in range(3):
        env = FakeEnvironment(script)
        try:
            await env.open(env.build_config(plan), NetworkPolicy())
            seen.append("ok")
        except IssueError as exc:
            seen.append(exc.severity)
    assert seen == ["fatal", "error", "ok"]


async def test_counters_are_per_task_component_and_log() -> None:
    script = {"script": {"*": {"open": ["fatal"]}}}
    for task_id in ("t000", "t001"):
        with pytest.raises(IssueError):
            await open_session(task_id, **script)
    # Another log has its own counters.
    with pytest.raises(IssueError):
        await open_session("t000", log="other", **script)
    # The same task's second open is past the end of its list.
    await open_session("t000", **script)


async def test_task_entry_replaces_star_for_its_phases_only() -> None:
    script = {
        "*": {"exec": ["fatal"], "write_file": ["error"]},
        "t001": {"exec": ["ok"]},
    }
    star = await open_session("t000", script=script)
    own = await open_session("t001", script=script)
    with pytest.raises(IssueError):
        await star.exec("true")
    assert (await own.exec("true")).exit_code == 0
    # t001 has no write_file entry, so "*" applies to it.
    with pytest.raises(IssueError, match="fake write_file failed"):
        await own.write_file("f", b"")


async def test_load_tasks_uses_star() -> None:
    bench = FakeBenchmark({"script": {"*": {"load_tasks": ["fatal:no_data"]}}})
    with pytest.raises(IssueError, match="no_data happened"):
        await bench.load_tasks(fake_request())
    assert len(await bench.load_tasks(fake_request())) == 3


@pytest.mark.parametrize(
    ("script", "match"),
    [
        ({"*": {"opne": ["ok"]}}, "unknown phase 'opne'"),
        ({"*": {"open": ["fatl"]}}, "unknown action 'fatl'"),
        ({"*": {"open": ["harness_timeout"]}}, "only applies to the 'run' phase"),
        ({"*": {"open": ["sleep:soon"]}}, "not a number of seconds"),
        ({"*": {"open": ["error:"]}}, "needs a code"),
        ({"*": {"open": [3]}}, "expected a string"),
    ],
)
def test_bad_scripts_are_config_errors(script: dict[str, Any], match: str) -> None:
    with pytest.raises(ComponentError, match=match) as info:
        FakeEnvironment({"script": script})
    assert "fake-env" in str(info.value)


def test_run_is_scriptable_only_where_there_is_a_run() -> None:
    FakeHarnessFreeBenchmark({"script": {"*": {"run": ["harness_timeout"]}}})
    with pytest.raises(ComponentError, match="fake-bench.*unknown phase 'run'"):
        FakeBenchmark({"script": {"*": {"run": ["ok"]}}})
