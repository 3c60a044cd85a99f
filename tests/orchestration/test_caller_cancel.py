"""The SDK entry points under the caller's own cancel scope (SPEC sections 7, 9).

``launch`` and ``run_evaluation`` are cancellable like any Trio function:
``Cancelled`` reaches the caller's scope (no result is returned), every
session is closed within the cleanup grace, and every request that had
started records ``cancelled`` on disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from _orch_support import (  # noqa: F401  (fixtures)
    _instrumented,
    detail_files,
    journaled_sessions,
    launch,
    only_run_dir,
    read_json,
    run_evaluation,
    sleepy_request,
    unclosed_sessions,
)

from agentcompass import Orchestration
from agentcompass.testing import call_log, fake_request

NOT_RETURNED = object()


def hanging_request(name: str, tasks: int, output_root: Path, *, hung_close: tuple[str, ...] = ()):
    return fake_request(
        name,
        log=name,
        benchmark={"tasks": [f"{name}{i:02d}" for i in range(tasks)]},
        harness={"script": {"*": {"run": ["hang"]}}},
        environment={"script": {task: {"close": ["hang"]} for task in hung_close}},
        output_root=output_root,
    )


@pytest.mark.parametrize("entry", ["launch", "run_evaluation"])
async def test_the_callers_cancel_scope_cancels_and_cleans_up(autojump_clock, tmp_path: Path, entry: str):
    request = hanging_request("a", 3, tmp_path)
    result = NOT_RETURNED
    start = trio.current_time()
    with trio.move_on_after(10) as scope:
        if entry == "launch":
            result = await launch(Orchestration([request], task_concurrency=2))
        else:
            result = await run_evaluation(request, task_concurrency=2)
    assert scope.cancelled_caught, "Cancelled did not reach the caller's scope"
    assert result is NOT_RETURNED
    # Nothing hangs in cleanup, so no grace is spent.
    assert trio.current_time() - start == 10

    log = call_log("a")
    assert len(log.opened_sessions()) == 2
    assert not log.live_sessions()
    assert all(n == 1 for n in log.closed_sessions().values())
    run_dir = only_run_dir(tmp_path, "a")
    assert not unclosed_sessions(run_dir)
    assert all(events == ["opened", "closed"] for events in journaled_sessions(run_dir).values())
    info = read_json(run_dir / "run_info.json")
    assert info["status"] == "cancelled" and "ended_at" in info
    assert (run_dir / "metrics.json").exists() and (run_dir / "summary.md").exists()
    assert detail_files(run_dir) == {"normal": set(), "error": set(), "fatal": set()}


async def test_every_started_request_records_cancelled(autojump_clock, tmp_path: Path):
    # Two workers: a00 (5 s) and a01 start at t=0, a's pending queue is empty,
    # b is prepared at once; b00 starts at t=5 and hangs with a01.
    a = fake_request(
        "a",
        log="a",
        benchmark={"tasks": ["a00", "a01"]},
        harness={"script": {"a00": {"run": ["sleep:5"]}, "a01": {"run": ["hang"]}}},
        output_root=tmp_path,
    )
    b = hanging_request("b", 2, tmp_path)
    with trio.move_on_after(10) as scope:
        await launch(Orchestration([a, b], task_concurrency=2))
    assert scope.cancelled_caught
    a_dir, b_dir = only_run_dir(tmp_path, "a"), only_run_dir(tmp_path, "b")
    assert read_json(a_dir / "run_info.json")["status"] == "cancelled"
    assert read_json(b_dir / "run_info.json")["status"] == "cancelled"
    assert detail_files(a_dir)["normal"] == {"a00"}
    assert read_json(a_dir / "metrics.json")["series"]["score"]["evaluated"] == 1
    assert not call_log("a").live_sessions() and not call_log("b").live_sessions()
    assert not unclosed_sessions(a_dir) and not unclosed_sessions(b_dir)


@pytest.mark.parametrize("entry", ["launch", "run_evaluation"])
async def test_a_hanging_close_under_caller_cancellation_is_bounded_by_the_grace(
    autojump_clock, tmp_path: Path, entry: str
):
    # Cancelled at t=10 with a00's close hanging: everything else is closed at
    # once, a00's close is given up at t=10 + grace and a00 stays "opened" in
    # the journal for reap; Cancelled still reaches the caller.
    request = hanging_request("a", 2, tmp_path, hung_close=("a00",))
    result = NOT_RETURNED
    start = trio.current_time()
    with trio.move_on_after(10) as scope:
        if entry == "launch":
            orchestration = Orchestration([request], task_concurrency=2, cleanup_grace_seconds=4)
            result = await launch(orchestration)
        else:
            # run_evaluation passes its keyword arguments on to launch, not
            # to the Orchestration, so its grace is the default (30 s).
            result = await run_evaluation(request, task_concurrency=2)
    grace = 4 if entry == "launch" else 30
    assert scope.cancelled_caught and result is NOT_RETURNED
    assert trio.current_time() - start == 10 + grace

    log = call_log("a")
    hung = next(s for s in log.opened_sessions() if log.session_task(s) == "a00")
    assert log.live_sessions() == {hung}
    run_dir = only_run_dir(tmp_path, "a")
    assert sorted(journaled_sessions(run_dir).values()) == [["opened"], ["opened", "closed"]]
    assert read_json(run_dir / "run_info.json")["status"] == "cancelled"


async def test_cancelled_while_preparing(autojump_clock, tmp_path: Path):
    request = fake_request("a", log="a", benchmark={"script": {"*": {"load_tasks": ["hang"]}}}, output_root=tmp_path)
    with trio.move_on_after(3) as scope:
        await launch(Orchestration([request], task_concurrency=2))
    assert scope.cancelled_caught
    assert read_json(only_run_dir(tmp_path, "a") / "run_info.json")["status"] == "cancelled"
    assert call_log("a").count("plan") == 0


async def test_an_outer_cancel_before_the_deadline_is_a_cancellation(autojump_clock, tmp_path: Path):
    # The orchestration has its own 100 s deadline; the caller cancels first.
    request = sleepy_request("a", [50, 50, 50], tmp_path)
    with trio.move_on_after(20) as scope:
        await launch(Orchestration([request], task_concurrency=1, timeout_seconds=100))
    assert scope.cancelled_caught
    assert read_json(only_run_dir(tmp_path, "a") / "run_info.json")["status"] == "cancelled"
