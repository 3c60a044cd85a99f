"""A request's state pieces: the phase's allowed steps, waiting for a phase,
tasks settling, late records counted."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from agentcompass import TaskSpec
from agentcompass._orchestration._request_state import Life, Phase, Tally, Tasks
from agentcompass.runtime._results import TaskRecord

#: The step :class:`Life.advance` allows from each phase.
ALLOWED = {
    (Phase.WAITING, Phase.PREPARING),
    (Phase.WAITING, Phase.DISPATCHED),
    (Phase.PREPARING, Phase.RUNNING),
    (Phase.PREPARING, Phase.DISPATCHED),
    (Phase.RUNNING, Phase.DISPATCHED),
    (Phase.DISPATCHED, Phase.TALLIED),
    (Phase.TALLIED, Phase.FINALIZED),
}


@pytest.mark.parametrize("start", list(Phase))
@pytest.mark.parametrize("to", list(Phase))
def test_a_phase_moves_only_by_an_allowed_step(start: Phase, to: Phase) -> None:
    life = Life(start)
    if (start, to) in ALLOWED:
        life.advance(to)
        assert life.phase is to
    else:
        with pytest.raises(RuntimeError, match=f"from {start.name} to {to.name}"):
            life.advance(to)
        assert life.phase is start


async def test_reached_waits_for_the_phase_and_checkpoints_when_there() -> None:
    life = Life()
    seen: list[Phase] = []

    async def waiter() -> None:
        await life.reached(Phase.DISPATCHED)
        seen.append(life.phase)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        for phase in (Phase.PREPARING, Phase.RUNNING):
            life.advance(phase)
            await trio.testing.wait_all_tasks_blocked()
            assert seen == []
        life.advance(Phase.DISPATCHED)
    assert seen == [Phase.DISPATCHED]
    life.advance(Phase.TALLIED)
    with trio.testing.assert_checkpoints():
        await life.reached(Phase.DISPATCHED)


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
    assert not tally.count_late()
    tally.late.append(TaskRecord("a", None, [], "fatal"))
    assert tally.count_late()
    assert list(tally.unfinished) == ["b"] and [r.task_id for r in tally.records] == ["a"]
    assert tally.counts["fatal"] == 1 and tally.late == []


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
