"""Atomic writes: new content or old content, never a mix, no temp left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
import trio.testing

from agentcompass._store import _atomic, load_run, write_atomic
from agentcompass._store._atomic import is_temp_name, store_limiter, write_temp_sync


async def test_write_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    await write_atomic(target, b"first")
    await write_atomic(target, b"second")
    assert target.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["metrics.json"]


def test_crash_between_temp_and_rename_leaves_old_file(tmp_path: Path) -> None:
    # A SIGKILL after the temp file is written and before the rename: the old
    # content is intact and readers skip the leftover.
    details = tmp_path / "details" / "normal"
    details.mkdir(parents=True)
    target = details / "task-1.json"
    target.write_bytes(b"old")
    leftover = write_temp_sync(target, b"new")
    assert target.read_bytes() == b"old"
    assert leftover.parent == details and is_temp_name(leftover.name)
    assert leftover.read_bytes() == b"new"
    assert load_run(tmp_path).details == {}  # "old" is not a record, the temp is not read


async def test_failed_rename_keeps_old_file_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "run_info.json"
    target.write_bytes(b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(5, "simulated I/O error")

    monkeypatch.setattr(_atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="simulated"):
        await write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["run_info.json"]


async def test_cancelled_write_still_completes(tmp_path: Path) -> None:
    # Once the thread runs, cancellation waits for it: no half-done write.
    target = tmp_path / "f.json"
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_atomic, target, b"data")
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    if target.exists():
        assert target.read_bytes() == b"data"
    assert [n for n in os.listdir(tmp_path) if is_temp_name(n)] == []
    assert store_limiter().borrowed_tokens == 0
