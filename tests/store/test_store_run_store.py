"""RunStore: layout, checkpoints -> details, sessions, progress, group commit."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from agentcompass._store import (
    StoreClosedError,
    _group_commit,
    _run_store,
    latest_run,
    load_run,
    open_run_store,
    task_key,
)
from agentcompass._store._atomic import StoreThreads
from agentcompass._store._run_store import RUN_ID_PATTERN, RunStore
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


@pytest.fixture
def in_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit rounds in store threads, where a test can reach into them."""
    monkeypatch.setattr(_group_commit, "WRITER_PROCESS", False)


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
    assert json.loads((run_dir / "run_info.json").read_text()) == {"status": "running"}
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
    assert retry == {"task_id": task_id, "stage": "run", "delay": 5.0}


async def test_checkpoint_json_keeps_the_task_id(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req") as store:
        await store.save_checkpoint("T/1", attempt(3))
        path = store.run_dir / "tasks" / task_key("T/1") / "attempt-3" / "checkpoint.json"
        assert json.loads(path.read_text())["task_id"] == "T/1"


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


async def test_group_commit_shares_rounds_and_isolates_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_threads: None
) -> None:
    rounds: list[int] = []
    real_commit = _group_commit.GroupCommitter._commit_sync

    def counting_commit(self: _group_commit.GroupCommitter, batch: list) -> None:
        rounds.append(len(batch))
        real_commit(self, batch)

    monkeypatch.setattr(_group_commit.GroupCommitter, "_commit_sync", counting_commit)
    real_replace = os.replace

    def flaky_replace(src: object, dst: object) -> None:
        if str(dst).endswith("bad.json"):
            raise OSError(28, "simulated: no space left")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(_group_commit.os, "replace", flaky_replace)
    failures: list[str] = []

    async with open_run_store(tmp_path, "req") as store:
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(save_noting_failure, store, task(f"t{i:03d}"), failures)
            nursery.start_soon(save_noting_failure, store, task("bad"), failures)
        run_dir = store.run_dir
    assert failures == ["bad"]
    assert len(load_run(run_dir).details) == 200
    assert sum(rounds) == 201
    assert len(rounds) < 201  # records shared fsync rounds
    assert [n for n in os.listdir(run_dir / "details" / "normal") if n.startswith(".")] == []


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


async def test_progress_snapshot_is_throttled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: object
) -> None:
    # Progress writes run inline here: a worker thread would let the autojump
    # clock race ahead of the disk.
    written: list[tuple[float, dict | None]] = []

    async def inline(_threads: object, fn: Callable[..., object], *args: object) -> object:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    def record(self: object, lines: list[str], snapshot: dict | None) -> None:
        if snapshot is not None:
            written.append((trio.current_time(), snapshot))

    monkeypatch.setattr(StoreThreads, "run", inline)
    monkeypatch.setattr(_run_store.RunStore, "_write_progress_sync", record)
    async with open_run_store(tmp_path, "req") as store:
        start = trio.current_time()
        store.set_progress({"completed": 1})
        await trio.sleep(0.1)
        for i in range(2, 10):  # only the latest of a burst is written
            store.set_progress({"completed": i})
        await trio.sleep(1)
        store.set_progress({"completed": 10})  # written at close
        closing = trio.current_time()
    closed = trio.current_time()
    # Each write waits for a batch to gather (PROGRESS_BATCH_SECONDS), then
    # at most one per PROGRESS_INTERVAL; the last during close (whose length
    # under the autojump clock depends on the real writer process).
    batch = _run_store.PROGRESS_BATCH_SECONDS
    assert [(round(t - start, 3), s) for t, s in written[:2]] == [
        (batch, {"completed": 1}),
        (round(batch + 0.5, 3), {"completed": 9}),
    ]
    assert len(written) == 3 and written[2][1] == {"completed": 10}
    assert closing <= written[2][0] <= closed


async def test_fsync_fallback_without_syncfs(tmp_path: Path, in_threads: None) -> None:
    async with open_run_store(tmp_path, "req") as store:
        store._committer.disk.syncfs = None  # fsync file by file, as off Linux
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(store.save_checkpoint, f"T{i}", attempt(0))
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(store.save_task, task(f"T{i}"))
        await store.journal_session("opened", "s", "docker", {})
        run_dir = store.run_dir
    loaded = load_run(run_dir)
    assert len(loaded.details) == 20 and loaded.checkpoints == {}
    assert loaded.open_sessions == [("s", "docker", {})]


async def test_failed_flush_fails_the_whole_batch(tmp_path: Path, in_threads: None) -> None:
    def broken_syncfs(fd: int) -> None:
        raise OSError(5, "simulated: flush failed")

    async with open_run_store(tmp_path, "req") as store:
        run_dir = store.run_dir
        await store.save_checkpoint("t1", attempt(0))
        store._committer.disk.syncfs = broken_syncfs
        with pytest.raises(OSError, match="flush failed"):
            await store.save_task(task("t1"))
        # Nothing half-done: no record, the checkpoint is still there, no temp file.
        assert files_under(run_dir / "details") == []
        assert files_under(run_dir / "tasks") == ["t1/attempt-0/checkpoint.json"]
        store._committer.disk.syncfs = None
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


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_failed_cleanup_is_a_note_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    monkeypatch.setattr(_group_commit, "WRITER_PROCESS", writer == "process")
    async with open_run_store(tmp_path, "req") as store:
        await store._committer.writer_started.wait()
        assert (store._committer._writer is not None) == (writer == "process")
        await store.save_checkpoint("t1", attempt(0))
        # Something the round cannot unlink where the checkpoint was.
        checkpoint = store.run_dir / "tasks" / "t1" / "attempt-0" / "checkpoint.json"
        checkpoint.unlink()
        (checkpoint / "in-the-way").mkdir(parents=True)
        await store.save_task(task("t1"))  # durable, so no error
        assert len(store.notes) == 1
        assert "after writing" in store.notes[0] and "checkpoint.json" in store.notes[0]
        store.event("task_finished", t="caller's", event="caller's", extra=1)
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"t1"}
    last = json.loads((run_dir / "progress.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "task_finished" and isinstance(last["t"], float) and last["extra"] == 1


# -- the writer process ------------------------------------------------------------


async def test_rounds_go_to_a_writer_process_that_reports_each_failure(tmp_path: Path) -> None:
    failures: list[str] = []

    async with open_run_store(tmp_path, "req") as store:
        await store._committer.writer_started.wait()
        writer = store._committer._writer
        assert writer is not None, "no writer process started"
        # Not in this process group: a Ctrl-C at the terminal is ours alone.
        assert os.getpgid(writer.process.pid) != os.getpgid(0)
        run_dir = store.run_dir
        # A directory where the record of "bad" goes: its rename fails there.
        (run_dir / "details" / "normal" / f"{task_key('bad')}.json" / "x").mkdir(parents=True)
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(save_noting_failure, store, task(f"t{i:03d}"), failures)
            nursery.start_soon(save_noting_failure, store, task("bad"), failures)
            nursery.start_soon(store.journal_session, "opened", "s1", "docker", {"container": "c1"})
    assert failures == ["bad"]
    assert len(load_run(run_dir).details) == 200
    assert load_run(run_dir).open_sessions == [("s1", "docker", {"container": "c1"})]
    # It exited with its input, leaving no temporary file behind.
    assert writer.process.returncode == 0
    assert [n for n in os.listdir(run_dir / "details" / "normal") if n.startswith(".")] == []


async def test_a_writer_process_that_dies_leaves_the_rounds_to_threads(tmp_path: Path) -> None:
    async with open_run_store(tmp_path, "req") as store:
        await store._committer.writer_started.wait()
        writer = store._committer._writer
        assert writer is not None
        await store.save_task(task("before"))
        writer.process.kill()
        await writer.process.wait()
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(store.save_task, task(f"t{i}"))
        assert store._committer._writer is None
        await store.journal_session("opened", "s1", "docker", {})
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"before", *(f"t{i}" for i in range(20))}
    assert load_run(run_dir).open_sessions == [("s1", "docker", {})]


@pytest.mark.parametrize("why", ["asked for threads", "no python to start"])
async def test_rounds_run_in_threads_without_a_writer_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    if why == "asked for threads":
        monkeypatch.setattr(_group_commit, "WRITER_PROCESS", False)
    else:
        monkeypatch.setattr(_group_commit.sys, "executable", str(tmp_path / "no-such-python"))
    async with open_run_store(tmp_path, "req") as store:
        await store._committer.writer_started.wait()
        assert store._committer._writer is None
        await store.save_task(task("t1"))
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"t1"}


_KILLED_WITH_A_WRITER = """
import os, sys, trio
from agentcompass._store import open_run_store

async def main():
    async with open_run_store(sys.argv[1], "req") as store:
        await store.journal_session("opened", "s1", "docker", {})
        await store._committer.writer_started.wait()
        print(store._committer._writer.process.pid, flush=True)
        os._exit(9)  # no unwinding: as if killed

trio.run(main)
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits for the writer with a pidfd (Linux)")
def test_a_writer_process_exits_when_its_runtime_dies(tmp_path: Path) -> None:
    import select
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", _KILLED_WITH_A_WRITER, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert child.returncode == 9, child.stderr
    writer_pid = int(child.stdout.split()[0])
    try:
        pidfd = os.pidfd_open(writer_pid)
    except ProcessLookupError:
        pass  # already gone
    else:
        try:
            ready, _, _ = select.select([pidfd], [], [], 30)  # readable once it exited
            assert ready, "the writer process outlived its runtime"
        finally:
            os.close(pidfd)
    (run_dir,) = (tmp_path / "req").iterdir()
    assert load_run(run_dir).open_sessions == [("s1", "docker", {})]


async def test_a_writer_that_never_answers_is_killed_and_rounds_stay_in_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: object
) -> None:
    # An embedding application's sys.executable may be some other program:
    # this one takes any arguments and never reads its input.
    impostor = tmp_path / "not-python"
    impostor.write_text("#!/bin/sh\nexec sleep 3600\n")
    impostor.chmod(0o755)
    monkeypatch.setattr(_group_commit.sys, "executable", str(impostor))
    async with open_run_store(tmp_path, "req") as store:
        await store.save_task(task("t1"))  # does not wait for the writer
        await store._committer.writer_started.wait()  # its time ran out
        assert store._committer._writer is None
        await store.save_task(task("t2"))
        run_dir = store.run_dir
    assert set(load_run(run_dir).details) == {"t1", "t2"}


def test_a_writer_whose_runtime_is_gone_still_commits_what_it_received(tmp_path: Path) -> None:
    from agentcompass._store import _writer

    journal = os.open(tmp_path / "sessions.jsonl", os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    to_writer, answers = os.pipe(), os.pipe()
    try:
        init = {"journal_fd": journal, "dir_fds": {}, "known_dirs": [str(tmp_path)], "syncfs": True}
        rounds = [(0, [(str(tmp_path / "sub" / "a.json"), b"{}", ()), (None, b'{"event":"opened"}\n', ())])]
        os.write(to_writer[1], _writer.frame(init) + b"".join(_writer.frame(r) for r in rounds))
        os.close(to_writer[1])  # the runtime is gone: end of input ...
        os.close(answers[0])  # ... and nobody reads the answers
        _writer.serve(to_writer[0], answers[1])  # returns, no BrokenPipeError
    finally:
        for fd in (journal, to_writer[0], answers[1]):
            os.close(fd)
    assert (tmp_path / "sub" / "a.json").read_bytes() == b"{}"
    assert (tmp_path / "sessions.jsonl").read_bytes() == b'{"event":"opened"}\n'
