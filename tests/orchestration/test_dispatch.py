"""Ordered dispatch, pipelined preparation and the finalize rule (SPEC section 7).

Every fake task sleeps a chosen number of mock seconds in its harness run, so
the schedule is exact; the :class:`Timeline` records task starts and
finalizes (progress events) and fake calls (``load_tasks``) in one order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from _orch_support import (  # noqa: F401  (fixtures)
    Timeline,
    _instrumented,
    only_run_dir,
    read_json,
    read_jsonl,
    sleepy_request,
    timeline,
)
from _orch_support import launch as orch_launch

import agentcompass
from agentcompass import Orchestration


def check_ordered_dispatch(timeline: Timeline, totals: dict[str, int]) -> None:
    """No task of a request starts while an earlier request still has a pending task."""
    names = list(totals)
    started = dict.fromkeys(names, 0)
    for mark in timeline.marks:
        if mark.kind != "task_started":
            continue
        request = mark.source.removeprefix("store:")
        for earlier in names[: names.index(request)]:
            assert started[earlier] == totals[earlier], (
                f"{mark.task_id} of {request!r} started while {earlier!r} had "
                f"{totals[earlier] - started[earlier]} pending task(s)"
            )
        started[request] += 1
    assert started == totals


def active_counts(timeline: Timeline) -> list[tuple[float, int]]:
    """Tasks held by a worker after each change: from ``task_started`` to the
    task's last component call (its record is then written while the worker
    takes its next task, so ``task_finished`` may come later)."""
    last: dict[str, int] = {}
    for i, mark in enumerate(timeline.marks):
        if mark.task_id is not None and not mark.source.startswith("store:"):
            last[mark.task_id] = i
    ends = set(last.values())
    counts, active = [], 0
    for i, mark in enumerate(timeline.marks):
        if mark.kind == "task_started":
            active += 1
            counts.append((mark.t, active))
        if i in ends:
            active -= 1
            counts.append((mark.t, active))
    return counts


async def launch(requests, concurrency: int) -> tuple[float, agentcompass.OrchestrationResult]:
    start = trio.current_time()
    result = await orch_launch(Orchestration(requests, task_concurrency=concurrency))
    return start, result


# -- ordered dispatch ---------------------------------------------------------------


@pytest.mark.parametrize(
    "durations,concurrency",
    [
        ({"a": [7, 3, 5, 2, 9], "b": [1, 4, 2, 6]}, 3),
        ({"a": [4, 1, 6], "b": [3, 3, 1, 5, 2], "c": [2, 7, 1]}, 2),
        ({"a": [1, 9], "b": [2, 2, 2], "c": [5, 1, 1, 1]}, 4),
    ],
)
async def test_workers_pull_from_the_earliest_request_with_pending_tasks(
    autojump_clock, tmp_path: Path, timeline: Timeline, durations, concurrency
):
    requests = [sleepy_request(name, d, tmp_path) for name, d in durations.items()]
    _, result = await launch(requests, concurrency)
    assert result.status == "succeeded"
    check_ordered_dispatch(timeline, {name: len(d) for name, d in durations.items()})
    # The pool is shared and full: never more than `concurrency` tasks, and all of them used.
    assert max(n for _, n in active_counts(timeline)) == concurrency


async def test_an_earlier_request_active_task_overlaps_a_later_request(
    autojump_clock, tmp_path: Path, timeline: Timeline
):
    # a04 (9 s) starts at t=5 as a's last task; the freed workers go on to b
    # while it still runs: a priority, not a barrier.
    requests = [sleepy_request("a", [7, 3, 5, 2, 9], tmp_path), sleepy_request("b", [1, 4, 2, 6], tmp_path)]
    start, result = await launch(requests, 3)
    assert result.status == "succeeded"
    a_last_finish = max(m.t for m in timeline.events("a", "task_finished"))
    b_first_start = min(m.t for m in timeline.events("b", "task_started"))
    assert b_first_start - start == 5
    assert a_last_finish - start == 14
    assert b_first_start < a_last_finish
    finished_a = {m.task_id: m.t - start for m in timeline.events("a", "task_finished")}
    assert finished_a["a04"] == 14
    check_ordered_dispatch(timeline, {"a": 5, "b": 4})
    # progress.jsonl on disk holds the same task_started events, in the same order.
    for name in ("a", "b"):
        on_disk = [
            e["task"]
            for e in read_jsonl(only_run_dir(tmp_path, name) / "progress.jsonl")
            if e["event"] == "task_started"
        ]
        assert on_disk == [m.task_id for m in timeline.events(name, "task_started")]


# -- finalize rule --------------------------------------------------------------------


async def test_a_later_request_finalizes_while_an_earlier_one_still_runs(
    autojump_clock, tmp_path: Path, timeline: Timeline
):
    # a: a00 runs 100 s; a01, a02 run 5 s each. b: two tasks of 5 s. Two workers.
    #   t=0  a00, a01 start (a has 1 pending < 2 workers: b is prepared)
    #   t=5  a02 starts (a's pending queue is now empty)
    #   t=10 b00 starts; t=15 b01 starts; t=20 b drained -> b finalizes
    #   t=100 a00 ends -> a finalizes
    requests = [sleepy_request("a", [100, 5, 5], tmp_path), sleepy_request("b", [5, 5], tmp_path)]
    snapshot: dict[str, object] = {}

    async def look_at_disk_at(t: float) -> None:
        await trio.sleep(t)
        a_dir, b_dir = only_run_dir(tmp_path, "a"), only_run_dir(tmp_path, "b")
        snapshot["a"] = read_json(a_dir / "run_info.json")["status"]
        snapshot["a_metrics"] = (a_dir / "metrics.json").exists()
        snapshot["b"] = read_json(b_dir / "run_info.json")["status"]
        snapshot["b_metrics"] = read_json(b_dir / "metrics.json")["series"]["score"]["total"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(look_at_disk_at, 50)
        start, result = await launch(requests, 2)

    finished = {name: timeline.events(name, "run_finished")[0].t - start for name in ("a", "b")}
    assert finished == {"a": 100, "b": 20}
    # Halfway through a's long task, b is final on disk and a is not.
    assert snapshot == {"a": "running", "a_metrics": False, "b": "succeeded", "b_metrics": 2}
    assert [r.status for r in result.requests] == ["succeeded", "succeeded"]


@pytest.mark.parametrize(
    "b_config",
    [{"tasks": []}, {"tasks": 2, "script": {"*": {"load_tasks": ["fatal"]}}}],
    ids=["no-tasks", "load-failed"],
)
async def test_a_drained_request_waits_for_the_earlier_pending_queue_to_empty(
    autojump_clock, tmp_path: Path, timeline: Timeline, b_config
):
    # b has nothing to run (no tasks, or its loading failed) and is prepared at
    # t=0, when a's pending queue drops below the three workers. It must not
    # finalize before a's pending queue is empty (t=15, when a04 is taken),
    # and need not wait for a's active tasks (done at t=30).
    a = sleepy_request("a", [10, 20, 30, 5, 5], tmp_path)
    b = agentcompass.testing.fake_request("b", log="b", benchmark=b_config, output_root=tmp_path)
    start, result = await launch([a, b], 3)

    b_prepared = timeline.events("b", "run_started")[0]
    b_final = timeline.events("b", "run_finished")[0]
    a_last_start = timeline.events("a", "task_started")[-1]
    assert b_prepared.t - start == 0
    assert a_last_start.task_id == "a04" and a_last_start.t - start == 15
    assert b_final.t - start == 15
    assert timeline.index(b_final) > timeline.index(a_last_start)
    assert timeline.events("a", "run_finished")[0].t - start == 30
    expected_b = "failed" if "script" in b_config else "succeeded"
    assert [r.status for r in result.requests] == ["succeeded", expected_b]


# -- pipelined preparation ---------------------------------------------------------------


def check_pipelined_preparation(timeline: Timeline, totals: dict[str, int], concurrency: int) -> list[float]:
    """Request j loads its tasks only once 0..j-1 are prepared and their pending
    tasks number fewer than the workers, and as soon as that holds.
    Returns the times of the later requests' ``load_tasks`` calls."""
    names = list(totals)
    started = dict.fromkeys(names, 0)
    loaded: list[str] = []
    below_since: float | None = None  # when the prepared requests' pending work fell below the workers
    times = []
    for mark in timeline.marks:
        if mark.kind == "task_started":
            started[mark.source.removeprefix("store:")] += 1
        elif mark.kind == "load_tasks":
            name = mark.source
            assert loaded == names[: len(loaded)] and name == names[len(loaded)], "declaration order"
            if loaded:
                pending = sum(totals[n] - started[n] for n in loaded)
                assert pending < concurrency, f"{name!r} prepared while {pending} tasks were pending"
                assert below_since == mark.t, f"{name!r} was not prepared as soon as it could be"
                times.append(mark.t)
            loaded.append(name)
        else:
            continue
        pending = sum(totals[n] - started[n] for n in loaded)
        if pending >= concurrency:
            below_since = None
        elif below_since is None:
            below_since = mark.t
    assert loaded == names
    return times


async def test_the_next_request_is_prepared_once_pending_work_is_below_the_workers(
    autojump_clock, tmp_path: Path, timeline: Timeline
):
    # Two workers; a's tasks start at t=0, 0, 3, 5, 9, 10. a's pending queue
    # drops to 1 (< 2) at t=9: b loads its tasks then, while a still runs.
    # b's first two tasks start at t=12 and t=15, leaving 1 pending: c loads then.
    durations = {"a": [3, 5, 7, 4, 6, 2], "b": [4, 8, 1], "c": [2, 2]}
    requests = [sleepy_request(name, d, tmp_path) for name, d in durations.items()]
    start, result = await launch(requests, 2)
    assert result.status == "succeeded"
    totals = {name: len(d) for name, d in durations.items()}
    times = check_pipelined_preparation(timeline, totals, 2)
    assert [t - start for t in times] == [9, 15]
    # Not a barrier: a is still running when b is prepared.
    assert timeline.events("a", "run_finished")[0].t - start == 15
    check_ordered_dispatch(timeline, totals)


async def test_preparation_waits_while_pending_work_fills_the_workers(
    autojump_clock, tmp_path: Path, timeline: Timeline
):
    # One worker, a with 3 tasks of 10 s: a's pending queue is >= 1 until the
    # last task is taken at t=20, so b loads its tasks at t=20, not before.
    requests = [sleepy_request("a", [10, 10, 10], tmp_path), sleepy_request("b", [1], tmp_path)]
    start, _ = await launch(requests, 1)
    load_b = timeline.first("load_tasks", "b")
    assert load_b.t - start == 20
    assert [m.t - start for m in timeline.events("a", "task_started")] == [0, 10, 20]
    assert timeline.index(load_b) > timeline.index(timeline.events("a", "task_started")[-1])


# -- records on their way to disk ----------------------------------------------------


async def test_the_backlog_of_records_on_their_way_to_a_slow_disk_stays_bounded(
    autojump_clock, tmp_path: Path, timeline: Timeline
):
    """A task gives its slot back before its record is durable, but a
    request's backlog is bounded: with a slow disk (every commit takes 1 s)
    a task opens its environment only once its plan is durable (SPEC 5), so
    the tasks on their way are those of the last two commits, far below the
    dispatcher's own cap (MIN_IN_FLIGHT)."""
    from agentcompass._orchestration._scheduler import MIN_IN_FLIGHT

    total = 60
    request = sleepy_request("a", [0] * total, tmp_path)
    result = await orch_launch(Orchestration([request], task_concurrency=2), disk=timeline.disk(latency=1))
    assert result.status == "succeeded"
    in_flight, most = 0, 0
    for mark in timeline.events("a"):
        if mark.kind == "task_started":
            in_flight += 1
            most = max(most, in_flight)
        elif mark.kind == "task_finished":
            in_flight -= 1
    assert 2 < most <= 3 * 2 < MIN_IN_FLIGHT
    assert len(timeline.events("a", "task_finished")) == total
