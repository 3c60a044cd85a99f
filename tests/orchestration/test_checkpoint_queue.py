"""Checkpoints are queued: an attempt does not wait for the disk.

The next attempt starts while the previous attempt's checkpoint is on its
way; the attempt is reported finished once that checkpoint is durable; the
task's record is written only after its checkpoints landed (the record's
write removes them). The disk is a :class:`FakeDisk` whose every commit
takes a fixed time in Trio's (mock) clock.
"""

from __future__ import annotations

import errno
from pathlib import Path

import trio
from _orch_support import (  # noqa: F401  (fixtures)
    _instrumented,
    launch,
    only_run_dir,
    read_json,
    read_jsonl,
    sleepy_request,
    timeline,
)

from agentcompass import AttemptsSpec, ExecutionSpec, Orchestration
from agentcompass._store._fake_disk import FakeDisk


def _k(k: int) -> ExecutionSpec:
    return ExecutionSpec(attempts=AttemptsSpec(k=k))


async def test_attempts_go_on_while_checkpoints_are_on_their_way(autojump_clock, tmp_path: Path, timeline):
    # Each commit takes 5 s; each attempt runs for 1 s.
    request = sleepy_request("a", [1], tmp_path, execution=_k(3))
    result = await launch(Orchestration([request]), disk=timeline.disk(latency=5))
    assert result.status == "succeeded"
    runs = timeline.select("run", "a")
    finished = timeline.events("a", "attempt_finished")
    # An attempt opens its environment once its plan is durable (SPEC 5),
    # never later for the previous attempt's checkpoint: each ran no later
    # than the checkpoint before it was durable (they share a commit) ...
    assert len(runs) == 3 and all(runs[i + 1].t <= finished[i].t for i in range(2))
    # ... and is reported finished once durable: the checkpointed ones
    # first (in either order: their writes share a commit), then the last
    # one with the task's record.
    assert sorted(e.detail["attempt"] for e in finished[:2]) == [0, 1]
    assert [e.detail["attempt"] for e in finished[2:]] == [2]
    [task_finished] = timeline.events("a", "task_finished")
    assert task_finished.t == finished[2].t > finished[1].t
    run_dir = only_run_dir(tmp_path, "a")
    events = [e for e in read_jsonl(run_dir / "progress.jsonl") if e["event"] in ("attempt_finished", "task_finished")]
    assert [e["event"] for e in events] == ["attempt_finished"] * 3 + ["task_finished"]
    record = read_json(run_dir / "details" / "normal" / "a00.json")
    assert [a["attempt"] for a in record["attempts"]] == [0, 1, 2]
    # The record superseded the checkpoints, which landed before it.
    assert list((run_dir / "tasks").glob("*/attempt-*/checkpoint.json")) == []


async def test_a_checkpoint_that_cannot_be_written_is_reported_with_the_record(autojump_clock, tmp_path: Path):
    disk = FakeDisk()
    disk.fail("write", errno.ENOSPC, "*checkpoint.json*", times=None)
    request = sleepy_request("a", [1], tmp_path, execution=_k(2))
    result = await launch(Orchestration([request]), disk=disk)
    # Only crash safety was lost: the record holds both attempts.
    assert result.status == "succeeded"
    run_dir = only_run_dir(tmp_path, "a")
    record = read_json(run_dir / "details" / "normal" / "a00.json")
    assert [a["attempt"] for a in record["attempts"]] == [0, 1]
    assert list((run_dir / "tasks").glob("*/attempt-*/checkpoint.json")) == []
    events = [e for e in read_jsonl(run_dir / "progress.jsonl") if e["event"] in ("attempt_finished", "task_finished")]
    # Both attempts are reported once, with the durable record.
    assert sorted(e.get("attempt", -1) for e in events) == [-1, 0, 1]


async def test_a_record_the_disk_held_back_is_written_at_the_deadline(autojump_clock, tmp_path: Path):
    # The disk stalls while a00's last attempt runs (a disk that hangs; the
    # attempt's plan was durable before it opened), so a00's record never
    # lands before the deadline; it is still asked for and written once the
    # disk comes back - all within the grace, which bounds the whole way out.
    disk = FakeDisk()
    request = sleepy_request("a", [1, 100], tmp_path, execution=_k(2))
    orchestration = Orchestration([request], task_concurrency=2, timeout_seconds=10, cleanup_grace_seconds=2)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: launch(orchestration, disk=disk))
        await trio.sleep(1.5)
        disk.stall()
        await trio.sleep(9.5)  # the deadline passed; the grace runs
        disk.resume()
    assert trio.current_time() - start <= 10 + 2
    run_dir = only_run_dir(tmp_path, "a")
    assert read_json(run_dir / "run_info.json")["status"] == "timed_out"
    record = read_json(run_dir / "details" / "normal" / "a00.json")
    assert [a["attempt"] for a in record["attempts"]] == [0, 1]
