"""What a run that ends by its deadline leaves behind for unfinished tasks."""

from __future__ import annotations

from pathlib import Path

from _orch_support import (  # noqa: F401  (fixtures)
    _instrumented,
    launch,
    only_run_dir,
    read_json,
    sleepy_request,
    timeline,
)

from agentcompass import Orchestration


async def test_unfinished_tasks_count_as_unavailable_and_progress_is_final(autojump_clock, tmp_path: Path):
    # One worker, 10 s a task, deadline 25 s: two tasks finish, one is cut
    # off while running, two never start.
    request = sleepy_request("a", [10] * 5, tmp_path)
    result = await launch(Orchestration([request], task_concurrency=1, timeout_seconds=25))
    assert result.status == "timed_out"
    run_dir = only_run_dir(tmp_path, "a")
    metrics = read_json(run_dir / "metrics.json")
    (series,) = metrics["series"].values()
    assert series["total"] == 5
    assert series["evaluated"] == 2 and series["unavailable"] == 3 and series["invalidated"] == 0
    progress = read_json(run_dir / "progress.json")
    assert progress["completed"] == 2 and progress["pending"] == 3 and progress["active"] == 0
    summary = (run_dir / "summary.md").read_text()
    assert "3 of 5 task(s) did not finish before the run was timed_out" in summary


async def test_a_record_that_cannot_be_written_fails_the_request_and_is_unavailable(autojump_clock, tmp_path: Path):
    """Workers do not wait for the disk; a record that then fails to be
    written is not reported finished, counts as unavailable, and fails the
    request (a --reuse run runs the task again)."""
    import errno

    from _orch_support import read_jsonl

    from agentcompass._store._fake_disk import FakeDisk

    disk = FakeDisk()
    disk.fail("write", errno.ENOSPC, "*/details/*a01*", times=None)
    request = sleepy_request("a", [1, 1, 1], tmp_path)
    result = await launch(Orchestration([request], task_concurrency=2), disk=disk)
    assert result.status == "failed" and result.exit_code == 1
    run_dir = only_run_dir(tmp_path, "a")
    info = read_json(run_dir / "run_info.json")
    assert info["status"] == "failed"
    assert "could not write the record of task 'a01'" in info["error"] and "No space left" in info["error"]
    finished = [e["task"] for e in read_jsonl(run_dir / "progress.jsonl") if e["event"] == "task_finished"]
    assert sorted(finished) == ["a00", "a02"]
    (series,) = read_json(run_dir / "metrics.json")["series"].values()
    assert series["total"] == 3 and series["evaluated"] == 2 and series["unavailable"] == 1
    assert not (run_dir / "details" / "normal" / "a01.json").exists()


async def test_a_task_waiting_to_retry_at_the_deadline_counts_as_unavailable(autojump_clock, tmp_path: Path):
    # a00's first try fails (FATAL collect) and it waits 20 s to retry; the
    # deadline passes at 5 s during the wait, which unwinds at once (nothing
    # to clean up), possibly before the request finalizes: Trio picks the
    # order at random, so the run is repeated. a00 still counts, as
    # unavailable: the run must not read like a full score of a01 alone.
    from agentcompass import ExecutionSpec
    from agentcompass.testing import fake_request, reset_logs

    for i in range(20):
        reset_logs()  # the fakes' scripts count calls per log
        request = fake_request(
            "a",
            log="a",
            benchmark={"tasks": ["a00", "a01"], "script": {"a00": {"collect": ["fatal"]}}},
            output_root=tmp_path / str(i),
            execution=ExecutionSpec(max_retries=1, retry_min_delay_seconds=20, retry_max_delay_seconds=20),
        )
        result = await launch(Orchestration([request], task_concurrency=2, timeout_seconds=5))
        assert result.status == "timed_out"
        run_dir = only_run_dir(tmp_path / str(i), "a")
        (series,) = read_json(run_dir / "metrics.json")["series"].values()
        assert (series["total"], series["evaluated"], series["unavailable"]) == (2, 1, 1), f"run {i}"
        assert "1 of 2 task(s) did not finish" in (run_dir / "summary.md").read_text()
        progress = read_json(run_dir / "progress.json")
        assert (progress["completed"], progress["pending"], progress["active"]) == (1, 1, 0)
