"""What the attempt engine leaves on disk through the store."""

from __future__ import annotations

import json

from _support import make_request

from agentcompass import Orchestration, launch
from agentcompass._store import task_key


async def test_discarded_tries_are_saved_outside_the_countable_results(autojump_clock, tmp_path):
    request = make_request(
        tasks=["a/b"],
        bench={"script": {"*": {"evaluate": ["error:judge_flaky", "ok"]}}},
        max_retries=3,
        retry_pattern_list=["flaky"],
        retry_min_delay_seconds=2,
        retry_max_delay_seconds=10,
        output_root=tmp_path,
    )
    result = await launch(Orchestration([request], task_concurrency=1))
    run_dir = tmp_path / "r"
    (run_dir,) = list(run_dir.iterdir())
    assert result.requests[0].status == "succeeded"
    key = task_key("a/b")
    retry_files = list((run_dir / "tasks" / key / "attempt-0" / "retries").glob("*.json"))
    assert len(retry_files) == 1
    saved = json.loads(retry_files[0].read_text())
    assert saved["retry_number"] == 1 and saved["stage"] == "evaluate" and saved["scope"] == "attempt"
    assert saved["matched_pattern"] == "flaky" and 1 <= saved["retry_delay_seconds"] <= 2
    assert saved["plan"]["task_id"] == "a/b"
    assert saved["issues"][0]["code"] == "judge_flaky"
    assert "diagnostics" in saved
    # The countable record holds only the final try, with its retry count.
    (details,) = list((run_dir / "details" / "normal").glob("*.json"))
    record = json.loads(details.read_text())
    assert record["attempts"][0]["retries"] == 1 and record["attempts"][0]["issues"] == []
    # The checkpoint is gone once the task is terminal; the retries stay.
    assert not (run_dir / "tasks" / key / "attempt-0" / "checkpoint.json").exists()
