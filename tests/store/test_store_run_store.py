"""RunStore: layout, checkpoints -> details, sessions, progress, batches, the real and the fake disk."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from agentcompass._store import (
    Disk,
    StoreClosedError,
    _run_store,
    latest_run,
    load_run,
    open_run_store,
    task_key,
)
from agentcompass._store._disk import is_temp_name, temp_name
from agentcompass._store._fake_disk import FakeDisk
from agentcompass._store._run_store import RUN_ID_PATTERN, RunStore
from agentcompass._store._trajectories import TRAJECTORY_CHUNK
from agentcompass.runtime import AttemptRecord, Issue, RunResult, TaskRecord


def attempt(n: int, value: object = 1.0, *issues: Issue) -> AttemptRecord:
    return AttemptRecord(
        attempt=n,
        status="completed",
        values={"accuracy": value},  # type: ignore[dict-item]
        issues=list(issues),
        run_result=RunResult(output=f"out {n}", usage={"total_tokens": 10}),
    )


def task(task_id: str, severity: str = "normal", *attempts: AttemptRecord) -> TaskRecord:
    return TaskRecord(task_id, "cat", list(attempts) or [attempt(0)], severity)  # type: ignore[arg-type]


async def save_noting_failure(store: RunStore, record: TaskRecord, failures: list[str]) -> None:
    """``store.save_task(record)``; a write error adds the task id to ``failures``."""
    try:
        await store.save_task(record)
    except OSError:
        failures.append(record.task_id)


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


async def test_layout_and_run_id(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req") as store:
        run_dir = store.run_dir
        assert run_dir.parent == tmp_path / "req"
        assert RUN_ID_PATTERN.fullmatch(run_dir.name)
        for sub in ("details/fatal", "details/error", "details/normal", "tasks"):
            assert (run_dir / sub).is_dir()
        await store.write_run_info({"status": "running"})
        await store.write_json("metrics.json", {"series": {}})
        await store.write_text("summary.md", "# req\n")
        with pytest.raises(ValueError, match="inside the run directory"):
            await store.write_text("../escape.md", "x")
    assert json.loads((run_dir / "run_info.json").read_text()) == {"status": "running", "format": 1}
    assert (run_dir / "summary.md").read_text() == "# req\n"
    assert latest_run(tmp_path, "req") == run_dir
    assert latest_run(tmp_path, "other") is None


async def test_latest_run_is_the_greatest_run_id(tmp_path: Path) -> None:
    for run_id in ("20250101T000000.000Z-aaaa", "20250102T000000.000Z-0000", "hand-picked"):
        async with open_run_store(tmp_path, "req", run_id):
            pass
    newest = tmp_path / "req" / "20250102T000000.000Z-0000"
    assert latest_run(tmp_path, "req") == newest
    assert latest_run(tmp_path, "req", exclude=newest) == tmp_path / "req" / "20250101T000000.000Z-aaaa"


async def test_one_writer_per_run_dir(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req", "run") as store:
        with pytest.raises(RuntimeError, match="another writer"):
            async with open_run_store(tmp_path, "req", "run"):
                pass
        await store.write_text("still.txt", "fine")
    async with open_run_store(tmp_path, "req", "run"):  # released on close
        pass


async def test_save_task_moves_checkpoints_to_details(tmp_path: Path) -> None:
    task_id = "Suite/Task 1"  # needs a hashed key
    key = task_key(task_id)
    async with open_run_store(tmp_path, "req") as store:
        await store.save_checkpoint(task_id, attempt(0, True))
        await store.save_checkpoint(task_id, attempt(1, False))
        await store.save_retry(task_id, 1, 1, {"stage": "run", "delay": 5.0})
        loaded = load_run(store.run_dir)
        assert loaded.details == {}
        assert set(loaded.checkpoints[task_id]) == {0, 1}
        assert loaded.checkpoints[task_id][0] == attempt(0, True)

        record = task(task_id, "normal", attempt(0, True), attempt(1, False))
        await store.save_task(record)
        run_dir = store.run_dir
        # Durable and cleaned up when save_task returns, not only at close.
        assert files_under(run_dir / "tasks") == [f"{key}/attempt-1/retries/1.json"]
    loaded = load_run(run_dir)
    assert loaded.details == {task_id: record}
    assert loaded.checkpoints == {}
    retry = json.loads((run_dir / "tasks" / key / "attempt-1" / "retries" / "1.json").read_text())
    assert retry == {"task_id": task_id, "stage": "run", "delay": 5.0, "format": 1}


async def test_checkpoint_json_keeps_the_task_id(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req") as store:
        await store.save_checkpoint("T/1", attempt(3))
        path = store.run_dir / "tasks" / task_key("T/1") / "attempt-3" / "checkpoint.json"
        assert json.loads(path.read_text())["task_id"] == "T/1"


async def test_records_any_python_text_or_number_can_hold_are_written(tmp_path: Path) -> None:
    # orjson refuses a lone surrogate (text decoded with surrogateescape) and an
    # integer beyond 64 bits: those records go through the standard encoder.
    odd = AttemptRecord(
        attempt=0,
        status="completed",
        values={"accuracy": 0.5},
        run_result=RunResult(output="caf\u00e9 \udce9", usage={"total_tokens": 2**70}),
    )
    async with open_run_store(tmp_path, "req") as store:
        await store.save_task(task("odd", "normal", odd))
        await store.save_task(task("nan", "normal", attempt(0, float("nan"))))
        await store.save_task(task("plain", "normal", attempt(0, 0.25)))
        await store.save_checkpoint("utf8", attempt(0, "café"))
    details = load_run(store.run_dir).details
    assert details["odd"].attempts[0].run_result is not None
    assert details["odd"].attempts[0].run_result.output == "caf\u00e9 \udce9"
    assert details["odd"].attempts[0].run_result.usage == {"total_tokens": 2**70}
    assert details["nan"].attempts[0].values == {"accuracy": None}  # JSON has no NaN
    assert details["plain"].attempts[0].values == {"accuracy": 0.25}
    # Other non-ASCII text is written as UTF-8, not as escapes.
    checkpoint = store.run_dir / "tasks" / task_key("utf8") / "attempt-0" / "checkpoint.json"
    assert '"accuracy":"café"' in checkpoint.read_text(encoding="utf-8")


async def test_save_task_with_changed_severity_removes_stale_record(tmp_path: Path) -> None:
    fatal = Issue("fatal", "setup", "environment_failed", "boom")
    async with open_run_store(tmp_path, "req") as store:
        await store.save_task(task("t1", "fatal", attempt(0, None, fatal)))
        assert (store.run_dir / "details" / "fatal" / "t1.json").exists()
        rerun = task("t1", "normal", attempt(0, 1.0))
        await store.save_task(rerun)
        run_dir = store.run_dir
        assert files_under(run_dir / "details") == ["normal/t1.json"]
        # A task that is saved again after new checkpoints is cleaned up again.
        await store.save_checkpoint("t1", attempt(1))
        await store.save_task(rerun)
    assert files_under(run_dir / "tasks") == []
    assert load_run(run_dir).details == {"t1": rerun}


async def test_writes_share_batches_and_a_failed_write_fails_alone(tmp_path: Path) -> None:
    disk = FakeDisk(latency=0.002)
    disk.fail("write", errno.ENOSPC, "*bad.json*", times=None)
    failures: list[str] = []

    async with open_run_store(tmp_path, "req", disk=disk) as store:
        opened = disk.runs
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(save_noting_failure, store, task(f"t{i:03d}"), failures)
            nursery.start_soon(save_noting_failure, store, task("bad"), failures)
        run_dir = store.run_dir
        batches = disk.runs - opened
    assert failures == ["bad"]
    assert len(load_run(run_dir).details) == 200
    assert batches < 10  # 201 writes, a handful of disk calls
    syncs = [path for op, path in disk.ops if op == "sync"]
    assert len(syncs) < 10 * 201
    assert [n for n in os.listdir(run_dir / "details" / "normal") if n.startswith(".")] == []


async def test_one_batch_is_one_disk_call_with_two_syncs(tmp_path: Path) -> None:
    disk = FakeDisk()
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        await store.save_task(task("t0"))
        disk.ops.clear()
        before = disk.runs
        async with trio.open_nursery() as nursery:
            for i in range(1, 50):
                nursery.start_soon(store.save_task, task(f"t{i}"))
        assert disk.runs - before == 1
        kinds = [op for op, _ in disk.ops]
        # The index lines in one append, temp files, one sync of them all,
        # renames, one sync of the directory.
        assert kinds == ["append"] + ["write"] * 49 + ["sync"] * 50 + ["replace"] * 49 + ["sync"]


async def test_sessions_journal_and_open_sessions(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req") as store:
        await store.journal_session("opened", "s1", "docker", {"container": "c1"})
        await store.journal_session("opened", "s2", "docker", {"container": "c2"})
        await store.journal_session("closed", "s1", "docker", {"container": "c1"})
        # Durable on return: readable before the store closes.
        assert load_run(store.run_dir).open_sessions == [("s2", "docker", {"container": "c2"})]
        with pytest.raises(ValueError, match="opened"):
            await store.journal_session("reaped", "s2", "docker", {})  # type: ignore[arg-type]
        run_dir = store.run_dir
    lines = (run_dir / "sessions.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["opened", "opened", "closed"]
    assert set(json.loads(lines[0])) == {"event", "session", "provider", "handle", "t"}


def cut_short_by_sigkill(journal: Path) -> None:
    with open(journal, "ab") as f:
        f.write(b'{"event":"opened","session":"s2","prov')


async def test_reopened_journal_starts_on_a_fresh_line(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req", "run") as store:
        await store.journal_session("opened", "s1", "docker", {"id": 1})
    cut_short_by_sigkill(store.run_dir / "sessions.jsonl")
    async with open_run_store(tmp_path, "req", "run") as store:
        await store.journal_session("closed", "s1", "docker", {"id": 1})
    loaded = load_run(store.run_dir)
    assert loaded.open_sessions == []
    assert any("sessions.jsonl" in note for note in loaded.notes)


async def test_events_survive_cancellation_of_the_caller(tmp_path: Path) -> None:
    with trio.CancelScope() as scope:
        async with open_run_store(tmp_path, "req") as store:
            store.event("run_started", total=1000)
            for i in range(1000):
                store.event("task_started", task_id=f"t{i}", path=tmp_path)
                store.set_progress({"total": 1000, "completed": i})
            scope.cancel()
            await trio.lowlevel.checkpoint()
            pytest.fail("not cancelled")  # pragma: no cover
    assert scope.cancelled_caught
    lines = (store.run_dir / "progress.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 1001
    assert events[0]["event"] == "run_started" and isinstance(events[0]["t"], float)
    assert [e["task_id"] for e in events[1:]] == [f"t{i}" for i in range(1000)]
    assert events[1]["path"] == str(tmp_path)
    snapshot = json.loads((store.run_dir / "progress.json").read_text())
    assert snapshot == {"total": 1000, "completed": 999}
    with pytest.raises(StoreClosedError):
        store.event("late")


async def test_cancelled_save_task_is_still_written(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req") as store:
        with trio.move_on_after(0):
            await store.save_task(task("t1"))  # queued, then the caller is cancelled
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"t1"}


async def test_progress_snapshot_is_throttled(tmp_path: Path, autojump_clock: object) -> None:
    disk = FakeDisk(latency=0.001)
    written: list[tuple[float, dict]] = []
    snapshot = tmp_path / "req" / "run" / "progress.json"

    class Watching(FakeDisk):
        def replace(self, source: str, target: str) -> None:
            super().replace(source, target)
            if target == str(snapshot):
                written.append((trio.current_time(), json.loads(snapshot.read_text())))

    disk = Watching(latency=0.001)
    async with open_run_store(tmp_path, "req", "run", disk=disk) as store:
        start = trio.current_time()
        store.set_progress({"completed": 1})
        await trio.sleep(0.1)
        for i in range(2, 10):  # only the latest of a burst is written
            store.set_progress({"completed": i})
        await trio.sleep(1)
        store.set_progress({"completed": 10})  # written at close
        closing = trio.current_time()
    # Each write waits for a batch to gather (PROGRESS_BATCH_SECONDS), then
    # at most one per PROGRESS_INTERVAL; the last during close. The disk
    # takes 1 ms (of Trio time) per batch.
    batch = _run_store.PROGRESS_BATCH_SECONDS
    assert [(round(t - start, 3), s) for t, s in written] == [
        (round(batch + 0.001, 3), {"completed": 1}),
        (round(batch + 0.5 + 0.001, 3), {"completed": 9}),
        (round(closing - start + 0.001, 3), {"completed": 10}),
    ]


async def test_progress_that_cannot_be_written_is_the_store_failure(tmp_path: Path, autojump_clock: object) -> None:
    disk = FakeDisk()
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        disk.fail("append", errno.ENOSPC, "*/progress.jsonl")
        store.event("run_started")
        await trio.sleep(1)
        assert store.failure is not None and "No space left" in store.failure
        store.event("run_finished")  # the store goes on
        run_dir = store.run_dir
    assert [json.loads(line)["event"] for line in (run_dir / "progress.jsonl").read_text().splitlines()] == [
        "run_finished"
    ]


async def test_failed_flush_fails_the_whole_batch(tmp_path: Path) -> None:
    disk = FakeDisk()
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        run_dir = store.run_dir
        await store.save_checkpoint("t1", attempt(0))
        disk.fail("sync", errno.EIO)
        with pytest.raises(OSError, match="Input/output error"):
            await store.save_task(task("t1"))
        # Nothing half-done: no record, the checkpoint is still there, no temp file.
        assert files_under(run_dir / "details") == []
        assert files_under(run_dir / "tasks") == ["t1/attempt-0/checkpoint.json"]
        await store.save_task(task("t1"))  # a retry cleans up as usual
        assert files_under(run_dir / "details") == ["normal/t1.json"]
        assert files_under(run_dir / "tasks") == []


async def test_reopened_run_dir_cleans_files_of_the_earlier_writer(tmp_path: Path) -> None:
    fatal = Issue("fatal", "setup", "environment_failed", "boom")
    async with open_run_store(tmp_path, "req", "run") as store:
        await store.save_task(task("t1", "fatal", attempt(0, None, fatal)))
        await store.save_checkpoint("t1", attempt(1))  # then the process died
    async with open_run_store(tmp_path, "req", "run") as store:
        await store.save_task(task("t1", "normal", attempt(0), attempt(1)))
        run_dir = store.run_dir
    assert files_under(run_dir / "details") == ["normal/t1.json"]
    assert files_under(run_dir / "tasks") == []


async def test_failed_cleanup_is_a_note_not_an_error(tmp_path: Path) -> None:
    disk = FakeDisk()
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        await store.save_checkpoint("t1", attempt(0))
        disk.fail("unlink", errno.EACCES, "*/checkpoint.json")
        await store.save_task(task("t1"))  # durable, so no error
        assert len(store.notes) == 1
        assert "after writing" in store.notes[0] and "checkpoint.json" in store.notes[0]
        store.event("task_finished", t="caller's", event="caller's", extra=1)
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"t1"}
    last = json.loads((run_dir / "progress.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "task_finished" and isinstance(last["t"], float) and last["extra"] == 1


# -- the real disk ---------------------------------------------------------------


@pytest.mark.parametrize("syncfs", [True, False], ids=["syncfs", "fsync-per-file"])
async def test_real_disk_writes_the_same_run(tmp_path: Path, syncfs: bool) -> None:
    # Without syncfs (as off Linux) every file and directory is fsynced.
    async with open_run_store(tmp_path, "req", disk=Disk(syncfs=syncfs)) as store:
        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(store.save_checkpoint, f"T{i}", attempt(0))
        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(store.save_task, task(f"T{i}"))
        await store.journal_session("opened", "s", "docker", {})
        run_dir = store.run_dir
    loaded = load_run(run_dir)
    assert len(loaded.details) == 30 and loaded.checkpoints == {}
    assert loaded.open_sessions == [("s", "docker", {})]
    assert [p for p in run_dir.rglob("*") if is_temp_name(p.name)] == []


def test_crash_between_temp_and_rename_leaves_old_file(tmp_path: Path) -> None:
    # A SIGKILL after the temp file is written and before the rename: the old
    # content is intact and readers skip the leftover.
    details = tmp_path / "details" / "normal"
    details.mkdir(parents=True)
    target = details / "task-1.json"
    target.write_bytes(b"old")
    leftover = details / temp_name(target.name)
    Disk().write(str(leftover), b"new")
    assert target.read_bytes() == b"old"
    assert is_temp_name(leftover.name)
    assert load_run(tmp_path).details == {}  # "old" is not a record, the temp is not read


async def test_a_failed_rename_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    disk = FakeDisk()
    async with open_run_store(tmp_path, "req", disk=disk) as store:
        await store.write_text("summary.md", "old")
        disk.fail("replace", errno.EIO, "*/summary.md")
        with pytest.raises(OSError, match="Input/output error"):
            await store.write_text("summary.md", "new")
        run_dir = store.run_dir
    assert (run_dir / "summary.md").read_text() == "old"
    assert [p for p in run_dir.rglob("*") if is_temp_name(p.name)] == []


async def test_a_stalled_disk_is_given_up_at_the_close_deadline(tmp_path: Path, autojump_clock: object) -> None:
    disk = FakeDisk()
    failures: list[str] = []
    deadline = trio.current_time() + 10
    async with open_run_store(tmp_path, "req", disk=disk, close_deadline=lambda: deadline) as store:
        disk.stall()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(save_noting_failure, store, task("t1"), failures)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.deadline = trio.current_time() + 1  # the caller stops waiting
    assert trio.current_time() == deadline  # held until the deadline, not longer
    assert failures == []  # the caller was cancelled, not failed
    with pytest.raises(StoreClosedError):
        store.event("late")


async def test_a_write_queued_on_a_stalled_disk_fails_at_the_deadline(tmp_path: Path, autojump_clock: object) -> None:
    disk = FakeDisk()
    errors: list[int | None] = []

    async def save(store: RunStore) -> None:
        with pytest.raises(OSError) as caught:
            await store.save_task(task("t1"))
        errors.append(caught.value.errno)

    deadline = trio.current_time() + 10
    async with trio.open_nursery() as nursery:
        async with open_run_store(tmp_path, "req", disk=disk, close_deadline=lambda: deadline) as store:
            disk.stall()
            nursery.start_soon(save, store)
            await trio.testing.wait_all_tasks_blocked()
    assert trio.current_time() == deadline  # not before the deadline, not after
    assert errors == [errno.ETIMEDOUT]


async def test_opening_on_a_stalled_disk_ends_with_the_callers_scope(tmp_path: Path, autojump_clock: object) -> None:
    disk = FakeDisk()
    disk.stall()
    opened = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_resume_at, disk, trio.current_time() + 60)  # hang guard
        with trio.move_on_after(5):
            async with open_run_store(tmp_path, "req", "r1", disk=disk):
                opened = True
        stopped = trio.current_time()
        nursery.cancel_scope.cancel()
    assert not opened and stopped == 5  # not shielded until the disk came back


async def _resume_at(disk: FakeDisk, when: float) -> None:
    await trio.sleep_until(when)
    disk.resume()


class _GatedDisk(Disk):
    """The real disk; its first ``makedirs`` waits for :attr:`gate`, and the
    run directory's lock says when it is let go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.gate, self.released = threading.Event(), threading.Event(), threading.Event()

    def makedirs(self, path: str) -> None:
        self.entered.set()
        self.gate.wait(10)  # hang guard
        super().makedirs(path)

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        try:
            with super().lock(path):
                yield
        finally:
            self.released.set()


async def test_an_open_abandoned_in_its_thread_lets_go_of_the_lock(tmp_path: Path) -> None:
    disk = _GatedDisk()
    opened = False

    async def open_one() -> None:
        nonlocal opened
        async with open_run_store(tmp_path, "req", "r1", disk=disk):
            opened = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_one)
        assert await trio.to_thread.run_sync(disk.entered.wait, 10)
        nursery.cancel_scope.cancel()  # the thread is abandoned mid-open
    disk.gate.set()
    assert await trio.to_thread.run_sync(disk.released.wait, 10)
    assert not opened
    assert not _run_store.run_is_live(tmp_path / "req" / "r1")


def _long_attempt(n: int, messages: int) -> AttemptRecord:
    trajectory = [{"role": "tool" if i % 2 else "assistant", "content": f"message {i}",
                   "tool_calls": [] if i % 2 else [{"id": f"c{i}", "name": "bash", "arguments": "{}"}]} for i in range(messages)]
    trajectory[-1]["content"] = "Authorization: Bearer sk-live0123456789abcdefSECRET"
    return AttemptRecord(attempt=n, status="completed", values={"accuracy": 1.0},
                         run_result=RunResult(output="done", trajectory=trajectory))


async def test_a_long_trajectory_is_written_beside_its_record_in_chunks(tmp_path: Path) -> None:
    chunk = TRAJECTORY_CHUNK
    task_id = "Long/Task"
    key = task_key(task_id)
    short, long = attempt(0), _long_attempt(1, 2 * chunk + 7)
    record = task(task_id, "normal", short, long)
    async with open_run_store(tmp_path, "req") as store:
        await store.save_checkpoint(task_id, long)
        in_progress = load_run(store.run_dir)
        assert in_progress.checkpoints[task_id][1].run_result.trajectory[:-1] == long.run_result.trajectory[:-1]  # type: ignore[union-attr]
        await store.save_task(record)
        run_dir = store.run_dir
    written = json.loads((run_dir / "details" / "normal" / f"{key}.json").read_text())
    runs = [a["run_result"] for a in written["attempts"]]
    assert runs[0]["trajectory"] == []  # short ones stay in the record
    assert runs[1]["trajectory"] == {"split": chunk, "messages": 2 * chunk + 7, "tool_calls": chunk + 4}
    chunks = sorted((run_dir / "tasks" / key / "attempt-1" / "trajectory").iterdir(), key=lambda p: int(p.stem))
    assert [p.name for p in chunks] == ["0.json", "1.json", "2.json"]
    messages = [m for p in chunks for m in json.loads(p.read_text())]
    assert [len(json.loads(p.read_text())) for p in chunks] == [chunk, chunk, 7]
    assert messages[:-1] == long.run_result.trajectory[:-1]  # type: ignore[union-attr]
    assert "SECRET" not in chunks[-1].read_text() and "Authorization: Bearer **********" in chunks[-1].read_text()  # each chunk masked
    # Read back whole; not offered for verbatim reuse (its file is not all of it).
    loaded = load_run(run_dir, keep_files=True)
    back = loaded.details[task_id]
    assert back.attempts[1].run_result.trajectory == messages  # type: ignore[union-attr]
    assert back.attempts[0] == short and loaded.checkpoints == {} and task_id not in loaded.files
    # A chunk gone: the record is unreadable, not silently short.
    chunks[1].unlink()
    broken = load_run(run_dir)
    assert task_id not in broken.details and broken.unreadable == [f"details/normal/{key}.json"]
    assert any(f"unreadable details/normal/{key}.json" in n for n in broken.notes)


async def test_every_saved_record_has_an_index_line_of_its_size(tmp_path: Path) -> None:
    from agentcompass._store._index import task_row

    async with open_run_store(tmp_path, "req") as store:
        await store.save_task(task("t0", "error", attempt(0, None, Issue("error", "run", "boom", "x"))))
        await store.save_task(task("t1"))
        await store.save_task(task("t0"))  # saved again, now normal: a second line
    lines = [json.loads(line) for line in (store.run_dir / "index.jsonl").read_text().splitlines()]
    assert [(line["task_id"], line["severity"]) for line in lines] == [("t0", "error"), ("t1", "normal"), ("t0", "normal")]
    assert lines[0]["codes"] == ["error:boom"]
    for line in lines[1:]:
        path = store.run_dir / "details" / "normal" / f"{line['task_id']}.json"
        assert line == {"bytes": path.stat().st_size, **task_row(json.loads(path.read_bytes()))}


async def test_kept_logs_are_written_through_the_one_redaction(tmp_path: Path) -> None:
    from agentcompass._redact import register_secret

    register_secret("kept-log-secret-5e6f7a")
    logs = {
        "agent/out.bin": b"\x00\xff got Bearer kept-log-secret-5e6f7a and sk-abcdefgh12345678\n",
        "verifier/test.log": b"task vulnerable-secret: ok\n",
    }
    async with open_run_store(tmp_path, "req") as store:
        await store.save_logs("t1", 0, logs)
        top = store.run_dir / "tasks" / task_key("t1") / "attempt-0" / "logs"
    assert (top / "agent" / "out.bin").read_bytes() == b"\x00\xff got Bearer ********** and **********\n"
    assert (top / "verifier" / "test.log").read_bytes() == b"task vulnerable-secret: ok\n"
