"""A request's state pieces: the stage's allowed steps, waiting for a stage,
tasks settling, late records counted."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from agentcompass import TaskSpec
from agentcompass._orchestration._request_state import Landing, Life, Stage, Tally, Tasks
from agentcompass.runtime._results import TaskRecord

#: The step :class:`Life.advance` allows from each stage.
ALLOWED = {
    (Stage.WAITING, Stage.PREPARING),
    (Stage.WAITING, Stage.DISPATCHED),
    (Stage.PREPARING, Stage.RUNNING),
    (Stage.PREPARING, Stage.DISPATCHED),
    (Stage.RUNNING, Stage.DISPATCHED),
    (Stage.DISPATCHED, Stage.TALLIED),
    (Stage.TALLIED, Stage.FINALIZED),
}


@pytest.mark.parametrize("start", list(Stage))
@pytest.mark.parametrize("to", list(Stage))
def test_a_stage_moves_only_by_an_allowed_step(start: Stage, to: Stage) -> None:
    life = Life(start)
    if (start, to) in ALLOWED:
        life.advance(to)
        assert life.stage is to
    else:
        with pytest.raises(RuntimeError, match=f"from {start.name} to {to.name}"):
            life.advance(to)
        assert life.stage is start


async def test_reached_waits_for_the_stage_and_checkpoints_when_there() -> None:
    life = Life()
    seen: list[Stage] = []

    async def waiter() -> None:
        await life.reached(Stage.DISPATCHED)
        seen.append(life.stage)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        for stage in (Stage.PREPARING, Stage.RUNNING):
            life.advance(stage)
            await trio.testing.wait_all_tasks_blocked()
            assert seen == []
        life.advance(Stage.DISPATCHED)
    assert seen == [Stage.DISPATCHED]
    life.advance(Stage.TALLIED)
    with trio.testing.assert_checkpoints():
        await life.reached(Stage.DISPATCHED)


async def test_until_settled_and_until_saved_wake_when_none_is_left() -> None:
    tasks = Tasks()
    woke: list[str] = []
    record = TaskRecord("b", None, [], "normal")

    async def wait(name: str, fn) -> None:  # type: ignore[no-untyped-def]
        await fn()
        woke.append(name)

    tasks.start("a")
    tasks.start("b")
    tasks.save(record)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "settled", tasks.until_settled)
        nursery.start_soon(wait, "saved", tasks.until_saved)
        tasks.settle("a")
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [] and tasks.unsettled == 1
        tasks.saved("b")
        await trio.testing.wait_all_tasks_blocked()
        assert woke == ["saved"]
        tasks.settle("b")
    assert woke == ["saved", "settled"] and tasks.landing == {}


def test_late_records_are_counted_and_no_longer_unfinished() -> None:
    tally = Tally()
    tally.unfinished = {"a": TaskSpec("a"), "b": TaskSpec("b")}
    assert not tally.recount_late(finalized=True)
    tally.late.append(TaskRecord("a", None, [], "fatal"))
    assert tally.recount_late(finalized=True)
    assert list(tally.unfinished) == ["b"] and [r.task_id for r in tally.records] == ["a"]
    assert tally.counts["fatal"] == 1 and tally.late == []


def test_late_records_before_the_terminal_results_are_left_to_finalize() -> None:
    tally = Tally()
    tally.unfinished = {"a": TaskSpec("a")}
    tally.late.append(TaskRecord("a", None, [], "normal"))
    assert not tally.recount_late(finalized=False)
    assert tally.late == [] and tally.records == [] and list(tally.unfinished) == ["a"]


async def test_a_landing_wakes_its_record_once_every_checkpoint_sent_landed() -> None:
    landing = Landing()
    woke = trio.Event()

    async def record() -> None:
        await landing.wait()
        woke.set()

    landing.send()
    landing.send()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(record)
        await trio.testing.wait_all_tasks_blocked()
        landing.landed(0, durable=True)
        await trio.testing.wait_all_tasks_blocked()
        assert not woke.is_set()
        landing.landed(1, durable=False)  # given up: the record holds the attempt
    assert woke.is_set() and landing.durable == {0} and landing.count == 0


def test_only_the_first_failures_are_noted() -> None:
    tally = Tally()
    firsts = [tally.fail(f"failure {i}", note=True) for i in range(8)]
    assert firsts == [True] + [False] * 7
    assert tally.status == "failed" and tally.error == "failure 0" and tally.failures == 8
    assert tally.notes == [f"failure {i}" for i in range(5)] + ["more failures followed (see log.jsonl)"]


def test_finish_marks_every_selected_task_without_a_record_unfinished() -> None:
    tally = Tally()
    tally.count(TaskRecord("a", None, [], "normal"))
    tally.unsaved.append(TaskRecord("b", None, [], "normal"))
    tally.finish("timed_out", [TaskSpec("a"), TaskSpec("b"), TaskSpec("c"), TaskSpec("d")])
    assert tally.status == "timed_out" and list(tally.unfinished) == ["c", "d"]
    tally.landed_late(TaskRecord("a", None, [], "normal"))  # counted already
    tally.landed_late(TaskRecord("c", None, [], "normal"))
    assert [r.task_id for r in tally.late] == ["c"]
