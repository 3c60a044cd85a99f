"""FakeDisk: the store's disk seam for tests (Trio-time latency, injected errors)."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from agentcompass._store import Disk, load_run, open_run_store
from agentcompass._store._fake_disk import FakeDisk
from agentcompass._store._run_store import PROGRESS_BATCH_SECONDS
from agentcompass.runtime import AttemptRecord, TaskRecord


def task(task_id: str) -> TaskRecord:
    return TaskRecord(task_id, None, [AttemptRecord(attempt=0, status="completed")], "normal")


async def test_a_write_takes_the_disk_latency_in_trio_time(tmp_path: Path, autojump_clock: object) -> None:
    disk = FakeDisk(latency=0.25)
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        start = trio.current_time()
        await store.save_task(task("t1"))
        # One batch, one disk call: exactly the latency, with no thread for
        # the autojump clock to race past.
        assert trio.current_time() - start == 0.25
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"t1"}


async def test_a_fault_fires_the_times_asked_then_heals(tmp_path: Path) -> None:
    disk = FakeDisk()
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        disk.fail("write", errno.ENOSPC, "*details*", times=2)
        for task_id in ("t1", "t2"):
            with pytest.raises(OSError) as caught:
                await store.save_task(task(task_id))
            assert caught.value.errno == errno.ENOSPC
        await store.save_task(task("t3"))
        assert disk.faults == []
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"t3"}


async def test_a_write_that_fails_leaves_the_others_of_its_batch(tmp_path: Path) -> None:
    disk = FakeDisk()
    outcomes: dict[str, Exception | None] = {}

    async def save(task_id: str) -> None:
        try:
            await store.save_task(task(task_id))
        except OSError as exc:
            outcomes[task_id] = exc
        else:
            outcomes[task_id] = None

    async with open_run_store(tmp_path, "req", disk=disk) as store:
        disk.fail("replace", errno.EIO, "*/t2.json")
        async with trio.open_nursery() as nursery:
            for task_id in ("t1", "t2", "t3"):  # queued together: one batch
                nursery.start_soon(save, task_id)
        run_dir = store.run_dir
    assert outcomes["t1"] is None and outcomes["t3"] is None
    assert isinstance(outcomes["t2"], OSError) and outcomes["t2"].errno == errno.EIO
    assert set(load_run(run_dir).details) == {"t1", "t3"}


def test_an_unknown_operation_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown disk operation 'fsync'"):
        FakeDisk().fail("fsync")


async def test_write_journals_now_writes_lines_a_stalled_batch_holds(tmp_path: Path, autojump_clock: object) -> None:
    # A second Ctrl-C exits without unwinding: the session lines still queued
    # (or in a batch stuck on the disk) are written there and then.
    from agentcompass._store._run_store import write_journals_now

    disk = FakeDisk()
    deadline = trio.current_time() + 5
    async with open_run_store(tmp_path, "req", disk=disk, close_deadline=lambda: deadline) as store:
        disk.stall()
        await store.journal_session("opened", "s1", "docker", {"id": 1}, durable=False)
        await trio.testing.wait_all_tasks_blocked()  # its batch is stuck on the disk
        assert load_run(store.run_dir).open_sessions == []
        write_journals_now()
        assert load_run(store.run_dir).open_sessions == [("s1", "docker", {"id": 1})]


async def test_the_disk_clock_stamps_lines_and_the_append_log_has_their_trio_time(
    tmp_path: Path, autojump_clock: object
) -> None:
    # The store stamps each line when it is queued and writes the lines in a
    # batch later: the clock gives the first, the append log the second.
    stamps = iter([100.0, 200.0])
    disk = FakeDisk(clock=lambda: next(stamps))
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        start = trio.current_time()
        store.event("task_started", task="t1")
        await trio.sleep(1)
        store.event("task_finished", task="t1")
        run_dir = store.run_dir
    lines = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [(line["event"], line["t"]) for line in lines] == [("task_started", 100.0), ("task_finished", 200.0)]
    progress = [(at - start, line) for at, path, line in disk.appended if path.endswith("progress.jsonl")]
    assert [json.loads(line)["event"] for _, line in progress] == ["task_started", "task_finished"]
    # The first line reached the file after its batch delay, the last at close.
    assert progress[0][0] == PROGRESS_BATCH_SECONDS
    assert progress[1][0] >= 1


def test_the_real_disk_stamps_unix_time() -> None:
    before = time.time()
    assert before <= Disk().now() <= time.time()
