"""summary.md and `compass show`."""

from __future__ import annotations

from pathlib import Path

from agentcompass._report import render_run_table, render_summary
from agentcompass._store import compute_metrics, load_run, open_run_store
from agentcompass.runtime import AttemptRecord, Issue, TaskRecord


def records() -> list[TaskRecord]:
    crash = Issue("fatal", "run", "harness_crashed", "exit 137 | killed\nsecond line")
    timeout = Issue("error", "run", "harness_timeout", "ran out of time")
    return [
        TaskRecord(
            "ok/1", "math",
            [AttemptRecord(0, "completed", {"acc": True}), AttemptRecord(1, "completed", {"acc": 0.5})],
            "normal",
        ),
        TaskRecord("slow|2", None, [AttemptRecord(0, "run_error", {"acc": False}, [timeout])], "error"),
        TaskRecord("`crash`", "math", [AttemptRecord(0, "run_error", {}, [timeout, crash])], "fatal"),
    ]


def test_summary_says_there_is_no_official_score() -> None:
    recs = records()
    metrics = compute_metrics(("acc",), recs, "avg")
    text = render_summary("gsm8k-run", Path("runs/gsm8k-run/x"), metrics, recs, "failed")
    assert text.startswith("# gsm8k-run\n")
    assert "**Status:** failed" in text
    assert (
        "No official score: 1 task(s) invalidated (a FATAL left: the infrastructure failed); "
        "reference values exclude them." in text
    )
    # No official value: the standard error goes with the reference value.
    assert "| acc | - | 0.3750 ± 0.3750 | 2 | 0 | 1 | 1 | 3 |" in text
    task_rows = text.split("## Tasks")[1].strip().splitlines()[2:]
    assert len(task_rows) == 3
    assert task_rows[0].startswith("| `` `crash` `` | math | fatal |")  # fatal first
    assert "FATAL harness_crashed: exit 137 \\| killed" in task_rows[0]
    assert "second line" in task_rows[0] and "\n" not in task_rows[0]
    assert "slow\\|2" in task_rows[1]
    assert "true, 0.5" in text.split("## Tasks")[1]


def test_summary_without_fatal_has_official_values() -> None:
    recs = [r for r in records() if r.severity != "fatal"]
    metrics = compute_metrics(("acc",), recs, "avg")
    text = render_summary("r", Path("d"), metrics, recs, "succeeded")
    assert "No official score" not in text
    assert "| acc | 0.3750 ± 0.3750 | 0.3750 | 2 | 0 | 0 | 1 | 2 |" in text


async def test_show_renders_a_run_directory(tmp_path: Path) -> None:
    recs = records()
    metrics = compute_metrics(("acc",), recs, "avg")
    async with open_run_store(tmp_path, "req") as store:
        await store.write_run_info({"status": "failed"})
        for record in recs:
            await store.save_task(record)
        await store.save_checkpoint("late", AttemptRecord(0, "completed", {"acc": 1.0}))
        await store.journal_session("opened", "s1", "docker", {"id": "s1"})
        await store.write_json("metrics.json", metrics)
        await store.write_text("summary.md", render_summary("req", store.run_dir, metrics, recs, "failed"))
    text = render_run_table(load_run(store.run_dir), metrics)
    assert "Status: failed" in text
    assert "No official score: 1 task(s)" in text
    assert "Open sessions: 1" in text
    assert "math / acc" in text
    late = [line for line in text.splitlines() if line.startswith("late ")]
    assert late and "unfinished" in late[0]
    assert "Metrics: none" in render_run_table(load_run(store.run_dir), None)
