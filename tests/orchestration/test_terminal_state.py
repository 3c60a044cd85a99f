"""What a run that ends by its deadline leaves behind for unfinished tasks."""

from __future__ import annotations

from pathlib import Path

from _orch_support import (  # noqa: F401  (fixtures)
    _instrumented,
    only_run_dir,
    read_json,
    sleepy_request,
    timeline,
)

import agentcompass
from agentcompass import Orchestration


async def test_unfinished_tasks_count_as_unavailable_and_progress_is_final(autojump_clock, tmp_path: Path):
    # One worker, 10 s a task, deadline 25 s: two tasks finish, one is cut
    # off while running, two never start.
    request = sleepy_request("a", [10] * 5, tmp_path)
    result = await agentcompass.launch(Orchestration([request], task_concurrency=1, timeout_seconds=25))
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
