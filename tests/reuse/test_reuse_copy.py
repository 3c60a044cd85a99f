"""How a ``--reuse`` run copies the records it takes unchanged (``_reuse._copy_into``).

A record reused unchanged is not serialized again: its source file is
hard-linked into the new run, or, where that cannot be done (another
filesystem, a secret registered since that the file holds, a reopened run
directory), its bytes are written through the store. Either way the new
run holds the source's bytes (masked), durably, before anything runs.

Real store threads and disk here (no ``_reuse_support`` fixtures): links
and syncs are the subject.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import trio

import agentcompass
from agentcompass import AttemptsSpec, ExecutionSpec, Orchestration
from agentcompass._orchestration._launch import orchestrate
from agentcompass._orchestration._reuse import ReusePlan, _copy_into
from agentcompass._redact import MASK, register_secret
from agentcompass._store import Disk, load_run, open_run_store, task_key
from agentcompass._store._fake_disk import FakeDisk
from agentcompass._store._trajectories import TRAJECTORY_CHUNK
from agentcompass.runtime import AttemptRecord, RunResult, TaskRecord
from agentcompass.testing import fake_request


def _record_files(run_dir: str | Path) -> dict[str, Path]:
    """task id -> its record file."""
    return {json.loads(p.read_bytes())["task_id"]: p for p in Path(run_dir).glob("details/*/*.json")}


async def _launch(request: agentcompass.RunRequest, disk: Disk | None = None) -> agentcompass.RequestResult:
    result = await orchestrate(Orchestration([request], task_concurrency=4), disk=disk)
    [request_result] = result.requests
    return request_result


def _request(tmp_path: Path, k: int, **fields: object) -> agentcompass.RunRequest:
    return fake_request(
        "copy",
        log="copy",
        benchmark={"tasks": 3},
        execution=ExecutionSpec(attempts=AttemptsSpec(k)),
        output_root=tmp_path,
        **fields,  # type: ignore[arg-type]
    )


async def test_records_reused_unchanged_are_their_source_files(tmp_path: Path) -> None:
    first = await _launch(_request(tmp_path, 2))
    second = await _launch(_request(tmp_path, 2, reuse=True))
    old, new = _record_files(first.run_dir), _record_files(second.run_dir)
    assert set(new) == set(old) == {"t000", "t001", "t002"}
    for task_id, path in new.items():
        assert path.relative_to(second.run_dir) == old[task_id].relative_to(first.run_dir)
        assert path.read_bytes() == old[task_id].read_bytes()
        assert os.path.samefile(path, old[task_id]), "linked, not written again"

    # A reuse of the reuse run takes them from it just the same.
    third = await _launch(_request(tmp_path, 2, reuse=True))
    assert {t: p.read_bytes() for t, p in _record_files(third.run_dir).items()} == {
        t: p.read_bytes() for t, p in old.items()
    }
    assert load_run(Path(third.run_dir)).details == load_run(Path(first.run_dir)).details


async def test_a_record_reused_with_fewer_attempts_is_written_anew(tmp_path: Path) -> None:
    first = await _launch(_request(tmp_path, 2))
    # Fewer attempts is another experiment: reused anyway.
    second = await _launch(_request(tmp_path, 1, reuse=True, reuse_anyway=True))
    old, new = _record_files(first.run_dir), _record_files(second.run_dir)
    assert set(new) == set(old)
    for task_id, path in new.items():
        assert not os.path.samefile(path, old[task_id])
        assert [a["attempt"] for a in json.loads(path.read_bytes())["attempts"]] == [0]
        assert [a["attempt"] for a in json.loads(old[task_id].read_bytes())["attempts"]] == [0, 1]


async def test_a_record_that_cannot_be_linked_is_written(tmp_path: Path) -> None:
    first = await _launch(_request(tmp_path, 1))
    disk = FakeDisk()
    disk.fail("link", errno.EXDEV, times=None)
    second = await _launch(_request(tmp_path, 1, reuse=True), disk)
    old, new = _record_files(first.run_dir), _record_files(second.run_dir)
    assert set(new) == set(old)
    for task_id, path in new.items():
        assert path.read_bytes() == old[task_id].read_bytes()
        assert not os.path.samefile(path, old[task_id])


# -- _copy_into on its own --------------------------------------------------------


def _record(task_id: str, output: str = "answer") -> TaskRecord:
    attempt = AttemptRecord(attempt=0, status="completed", values={"score": 1.0}, run_result=RunResult(output=output))
    return TaskRecord(task_id, None, [attempt], "normal")


async def _source(tmp_path: Path, *records: TaskRecord) -> Path:
    async with open_run_store(tmp_path, "source") as store:
        for record in records:
            await store.save_task(record)
    return store.run_dir


def _verbatim(source: Path) -> tuple[list[TaskRecord], dict[str, tuple[str, bytes]]]:
    loaded = load_run(source, keep_files=True)
    return list(loaded.details.values()), loaded.files


async def test_a_record_holding_a_secret_registered_since_is_written_masked(tmp_path: Path) -> None:
    source = await _source(tmp_path, _record("t1", "the key is zq-secret-4711"), _record("t2"))
    records, verbatim = _verbatim(source)
    register_secret("zq-secret-4711")  # for the rest of the process: no other test holds it
    async with open_run_store(tmp_path, "new") as store:
        await _copy_into(store, ReusePlan([], reused=records), verbatim)
    masked = store.run_dir / "details" / "normal" / f"{task_key('t1')}.json"
    assert b"zq-secret-4711" not in masked.read_bytes()
    assert MASK in json.loads(masked.read_bytes())["attempts"][0]["run_result"]["output"]
    assert not os.path.samefile(masked, verbatim["t1"][0])
    clean = store.run_dir / "details" / "normal" / f"{task_key('t2')}.json"
    assert os.path.samefile(clean, verbatim["t2"][0])


async def test_into_a_reopened_run_directory_records_are_written_and_replace_older_ones(tmp_path: Path) -> None:
    source = await _source(tmp_path, _record("t1"))
    records, verbatim = _verbatim(source)
    async with open_run_store(tmp_path, "new", "existing") as store:
        older = TaskRecord("t1", None, [AttemptRecord(attempt=0, status="run_error")], "error")
        await store.save_task(older)
    assert (store.run_dir / "details" / "error" / f"{task_key('t1')}.json").exists()
    async with open_run_store(tmp_path, "new", "existing") as store:
        await _copy_into(store, ReusePlan([], reused=records), verbatim)
    copied = store.run_dir / "details" / "normal" / f"{task_key('t1')}.json"
    assert copied.read_bytes() == verbatim["t1"][1]
    # Not linked: the source's older modification time could lose the
    # "newest record wins" contest against a record the directory held.
    assert not os.path.samefile(copied, verbatim["t1"][0])
    assert not (store.run_dir / "details" / "error" / f"{task_key('t1')}.json").exists()
    assert load_run(store.run_dir).details == {"t1": records[0]}


async def test_links_not_known_durable_fail_the_copy(tmp_path: Path) -> None:
    source = await _source(tmp_path, _record("t1"), _record("t2"))
    records, verbatim = _verbatim(source)
    disk = FakeDisk()

    async with open_run_store(tmp_path, "new", disk=disk) as store:
        disk.fail("sync", errno.EIO)
        with pytest.raises(OSError, match="Input/output error"):
            await _copy_into(store, ReusePlan([], reused=records), verbatim)
        # The store's bookkeeping does not claim them.
        assert not any(store._records.written.values())


async def test_the_copy_waits_for_every_write(tmp_path: Path) -> None:
    # Linked records and one the store serializes: all on disk once
    # _copy_into returns.
    source = await _source(tmp_path, *(_record(f"t{i}") for i in range(20)))
    records, verbatim = _verbatim(source)
    del verbatim["t0"]  # serialized by the store
    with trio.fail_after(30):
        async with open_run_store(tmp_path, "new") as store:
            await _copy_into(store, ReusePlan([], reused=records), verbatim)
            assert load_run(store.run_dir).details == {r.task_id: r for r in records}


# -- RunStore.link_tasks ------------------------------------------------------------


async def _links(tmp_path: Path) -> list[tuple[TaskRecord, str, bytes]]:
    async with open_run_store(tmp_path, "source", disk=FakeDisk()) as store:
        for task_id in ("t1", "t2"):
            await store.save_task(_record(task_id))
    records, verbatim = _verbatim(store.run_dir)
    return [(record, *verbatim[record.task_id]) for record in records]


async def test_link_tasks_returns_once_the_record_it_writes_instead_is_durable(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    links = await _links(tmp_path)
    disk = FakeDisk(latency=1.0)
    disk.fail("link", errno.EXDEV, f"*{os.sep}{task_key('t2')}.json")  # another filesystem
    async with open_run_store(tmp_path, "new", disk=disk) as store:
        await store.link_tasks(links)
        linked, written = (store.run_dir / "details" / "normal" / f"{task_key(t)}.json" for t in ("t1", "t2"))
        assert os.path.samefile(linked, links[0][1])
        assert written.read_bytes() == links[1][2] and not os.path.samefile(written, links[1][1])
        # Renamed into place, then its directory synced: durable before link_tasks returned.
        ops = disk.ops
        assert ops.index(("replace", str(written))) < max(i for i, (op, _) in enumerate(ops) if op == "sync")


async def test_link_tasks_raises_when_a_record_it_writes_instead_fails(tmp_path: Path) -> None:
    links = await _links(tmp_path)
    disk = FakeDisk()
    disk.fail("link", errno.EXDEV, times=None)
    disk.fail("write", errno.ENOSPC, f"*{os.sep}.{task_key('t2')}.json.*")
    async with open_run_store(tmp_path, "new", disk=disk) as store:
        with pytest.raises(OSError, match="No space left on device"):
            await store.link_tasks(links)
        assert load_run(store.run_dir).details == {"t1": links[0][0]}
        # The failure left the store usable and the task's clean-up known.
        await store.save_task(links[1][0])
        assert set(load_run(store.run_dir).details) == {"t1", "t2"}


async def test_a_record_with_its_trajectory_beside_it_is_reused_whole(tmp_path: Path) -> None:
    trajectory = [{"role": "assistant", "content": f"m{i}"} for i in range(TRAJECTORY_CHUNK + 3)]
    long = AttemptRecord(attempt=0, status="completed", values={"score": 1.0}, run_result=RunResult(output="x", trajectory=trajectory))
    source = await _source(tmp_path, TaskRecord("long", None, [long], "normal"), _record("t2"))
    records, verbatim = _verbatim(source)
    assert set(verbatim) == {"t2"}
    async with open_run_store(tmp_path, "new") as store:
        await _copy_into(store, ReusePlan([], reused=records), verbatim)
    chunks = store.run_dir / "tasks" / task_key("long") / "attempt-0" / "trajectory"
    assert sorted(p.name for p in chunks.iterdir()) == ["0.json", "1.json"]
    assert load_run(store.run_dir).details == load_run(source).details
    assert load_run(store.run_dir).details["long"].attempts[0].run_result.trajectory == trajectory  # type: ignore[union-attr]


async def test_linked_and_written_records_get_index_lines(tmp_path: Path) -> None:
    links = await _links(tmp_path)
    disk = FakeDisk()
    disk.fail("link", errno.EXDEV, f"*{os.sep}{task_key('t2')}.json")  # written instead
    async with open_run_store(tmp_path, "new", disk=disk) as store:
        await store.link_tasks(links)
    lines = [json.loads(line) for line in (store.run_dir / "index.jsonl").read_text().splitlines()]
    assert sorted((line["task_id"], line["bytes"]) for line in lines) == [(r.task_id, len(data)) for r, _, data in links]
