"""Checkpoints are queued: an attempt does not wait for the disk.

The next attempt starts while the previous attempt's checkpoint is on its
way; the attempt is reported finished once that checkpoint is durable; the
task's record is queued only after its checkpoints landed (commit rounds
may finish out of order, and the record's round removes them).
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _orch_support import (  # noqa: F401  (fixtures)
    _instrumented,
    only_run_dir,
    read_json,
    read_jsonl,
    sleepy_request,
    timeline,
)

import agentcompass
from agentcompass import AttemptsSpec, ExecutionSpec, Orchestration
from agentcompass._store._run_store import RunStore


class HeldCheckpoints:
    """Holds checkpoint writes back from the real store until released, one
    at a time, in the order they were asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held: list[tuple[str, Any, trio.Event]] = []
        self.released = False
        save = RunStore.save_checkpoint

        async def hold(store: RunStore, task_id: str, record: Any) -> None:
            if not self.released:
                gate = trio.Event()
                self.held.append((task_id, record, gate))
                await gate.wait()
            await save(store, task_id, record)

        monkeypatch.setattr(RunStore, "save_checkpoint", hold)

    async def release(self) -> None:
        self.released = True
        for _, _, gate in self.held:
            gate.set()
            await trio.testing.wait_all_tasks_blocked()


def _k(k: int) -> ExecutionSpec:
    return ExecutionSpec(attempts=AttemptsSpec(k=k))


async def test_attempts_go_on_while_checkpoints_are_on_their_way(autojump_clock, tmp_path: Path, timeline, monkeypatch):
    checkpoints = HeldCheckpoints(monkeypatch)
    request = sleepy_request("a", [1], tmp_path, execution=_k(3))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agentcompass.launch, Orchestration([request]))
        await trio.sleep(10)  # mock time: each attempt runs for 1 s
        await trio.testing.wait_all_tasks_blocked()
        # Every attempt ran while no checkpoint was durable...
        assert len(timeline.select("run", "a")) == 3
        assert [record.attempt for _, record, _ in checkpoints.held] == [0, 1]
        # ... nothing is reported finished, and the record waits for them.
        assert timeline.events("a", "attempt_finished") == []
        run_dir = only_run_dir(tmp_path, "a")
        assert not (run_dir / "details" / "normal" / "a00.json").exists()
        await checkpoints.release()
    events = [e for e in read_jsonl(run_dir / "progress.jsonl") if e["event"] in ("attempt_finished", "task_finished")]
    assert [(e["event"], e.get("attempt")) for e in events] == [
        ("attempt_finished", 0),
        ("attempt_finished", 1),
        ("attempt_finished", 2),
        ("task_finished", None),
    ]
    record = read_json(run_dir / "details" / "normal" / "a00.json")
    assert [a["attempt"] for a in record["attempts"]] == [0, 1, 2]
    # The record superseded the checkpoints, which landed before it.
    assert list((run_dir / "tasks").glob("*/attempt-*/checkpoint.json")) == []


async def test_a_checkpoint_that_cannot_be_written_is_reported_with_the_record(autojump_clock, tmp_path: Path, monkeypatch):
    async def failing(store: RunStore, task_id: str, record: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunStore, "save_checkpoint", failing)
    request = sleepy_request("a", [1], tmp_path, execution=_k(2))
    result = await agentcompass.launch(Orchestration([request]))
    # Only crash safety was lost: the record holds both attempts.
    assert result.status == "succeeded"
    run_dir = only_run_dir(tmp_path, "a")
    record = read_json(run_dir / "details" / "normal" / "a00.json")
    assert [a["attempt"] for a in record["attempts"]] == [0, 1]
    events = [e for e in read_jsonl(run_dir / "progress.jsonl") if e["event"] in ("attempt_finished", "task_finished")]
    # Both attempts are reported once, with the durable record.
    assert sorted(e.get("attempt", -1) for e in events) == [-1, 0, 1]


async def test_a_record_still_waiting_for_its_checkpoints_is_written_at_the_deadline(
    autojump_clock, tmp_path: Path, monkeypatch
):
    # The checkpoint never lands (a disk that hangs): the deadline stops the
    # wait for it, the task's record is written and finalize writes the
    # terminal status - all within the grace, which bounds the whole way out.
    HeldCheckpoints(monkeypatch)
    request = sleepy_request("a", [1, 100], tmp_path, execution=_k(2))
    orchestration = Orchestration([request], task_concurrency=2, timeout_seconds=10, cleanup_grace_seconds=2)
    start = trio.current_time()
    result = await agentcompass.launch(orchestration)
    assert trio.current_time() - start <= 10 + 2
    assert result.status == "timed_out"
    run_dir = only_run_dir(tmp_path, "a")
    assert read_json(run_dir / "run_info.json")["status"] == "timed_out"
    record = read_json(run_dir / "details" / "normal" / "a00.json")
    assert [a["attempt"] for a in record["attempts"]] == [0, 1]
