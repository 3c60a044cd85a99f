"""A real run end to end: terminal smoke tasks, the oracle, local sandboxes,
checked through the files the run writes (SPEC section 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _common import read_jsonl

import agentcompass
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, Orchestration, RunRequest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "benchmarks_data" / "terminal-smoke"


async def test_terminal_smoke_with_oracle_writes_the_documented_files(tmp_path):
    request = RunRequest(
        name="smoke",
        benchmark=ComponentRef("terminal", {"path": str(SMOKE)}),
        harness=ComponentRef("oracle"),
        environment=ComponentRef("local", {"root": str(tmp_path / "sandboxes")}),
        execution=ExecutionSpec(attempts=AttemptsSpec(k=2)),
        output_root=tmp_path / "runs",
    )
    result = await agentcompass.launch(Orchestration([request], task_concurrency=4))
    assert result.status == "succeeded" and result.exit_code == 0
    run_dir = Path(result.requests[0].run_dir)
    assert run_dir.parent == tmp_path / "runs" / "smoke"

    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "succeeded" and info["ended_at"] >= info["started_at"]
    assert info["request"]["benchmark"]["id"] == "terminal"

    tasks = sorted(p.name for p in SMOKE.iterdir() if (p / "task.toml").exists())
    details = {p.stem: json.loads(p.read_text()) for p in (run_dir / "details" / "normal").glob("*.json")}
    assert sorted(details) == tasks
    assert not list((run_dir / "details" / "fatal").glob("*.json"))
    for record in details.values():
        assert [a["attempt"] for a in record["attempts"]] == [0, 1]
    rewards = {tid: [a["values"]["reward"] for a in rec["attempts"]] for tid, rec in details.items()}
    assert rewards["reverse-lines"] == [0.0, 0.0]
    assert rewards["make-dirs"] == [0.0, 0.0]
    assert all(r == [1.0, 1.0] for tid, r in rewards.items() if tid not in ("reverse-lines", "make-dirs"))
    warning_codes = {i["code"] for a in details["make-dirs"]["attempts"] for i in a["issues"]}
    assert warning_codes == {"reward_missing"}
    # Checkpoints are removed once a task is terminal.
    assert not list((run_dir / "tasks").glob("*/attempt-*/checkpoint.json"))

    events = read_jsonl(run_dir / "progress.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.count("task_started") == kinds.count("task_finished") == len(tasks)
    assert kinds.count("attempt_finished") == 2 * len(tasks)
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["completed"] == progress["total"] == len(tasks) and progress["pending"] == 0

    sessions = read_jsonl(run_dir / "sessions.jsonl")
    opened = {s["session"] for s in sessions if s["event"] == "opened"}
    closed = {s["session"] for s in sessions if s["event"] == "closed"}
    assert len(opened) == 2 * len(tasks) and opened == closed
    assert not list((tmp_path / "sandboxes").iterdir())

    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["evaluation_failed"] is False
    reward = metrics["series"]["reward"]
    assert reward["total"] == len(tasks) and reward["evaluated"] == len(tasks)
    assert abs(reward["value"] - (len(tasks) - 2) / len(tasks)) < 1e-9
    summary = (run_dir / "summary.md").read_text()
    assert "reverse-lines" in summary and "reward_missing" in summary


def test_compass_launch_cli_prints_the_run_and_exits_0(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", "launch", "examples/quickstart.yaml", "--output-root", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "terminal-smoke-oracle") in proc.stdout
    assert "reverse-lines" in proc.stdout and "reward_missing" in proc.stdout
