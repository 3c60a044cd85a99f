"""The report ``compass launch`` prints when a run ends: every cause of the
tasks that did not pass in full (wrapped to 80 columns, never cut), the most
frequent first. Run for real: the ``qa`` benchmark against the scripted
model server, whose errors carry long messages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from _pty import plain_lines, run_on_pty

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]

DRAINING = (
    "the upstream inference pool is draining for maintenance and every replica in region west refused "
    "the request; retry after the window closes or route to another region"
)
QUOTA = (
    "quota exhausted for this organisation: the monthly budget of the project was spent, raise the limit "
    "in the billing console before running again"
)
# q1 hits the rarer cause: in task order it would come first.
QUESTIONS = [("q1", "beta one?"), ("q2", "alpha two?"), ("q3", "alpha three?"), ("q4", "plain four?")]
SCRIPT = {
    "episodes": [
        {"match": "alpha", "steps": [{"status": 500, "body": {"error": {"message": DRAINING}}}]},
        {"match": "beta", "steps": [{"status": 402, "body": {"error": {"message": QUOTA}}}]},
    ],
    "default": [{"text": "yes"}],
}
CONFIG = {
    "requests": [
        {
            "name": "causes",
            "benchmark": {"id": "qa", "config": {"path": "questions.jsonl"}},
            "harness": "none",
            "environment": "local",
            "model": {"name": "scripted", "base_url": "${MODEL_BASE_URL}"},
            "output_root": "runs",
        }
    ]
}


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _project(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The files, and the command: the model server running ``compass launch``."""
    (tmp_path / "questions.jsonl").write_text(
        "".join(json.dumps({"id": i, "question": q, "answer": "yes"}) + "\n" for i, q in QUESTIONS)
    )
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    (tmp_path / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    env = dict(os.environ, COLUMNS="80", TERM="xterm-256color")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name in ("COMPASS_LOG_LEVEL", "NO_COLOR", "FORCE_COLOR"):
        env.pop(name, None)
    server = [sys.executable, "-m", "agentcompass.testing.model_server", "--script", "script.json", "--"]
    return [*server, sys.executable, "-m", "agentcompass._cli", "launch", "config.yaml"], env


def _causes(tmp_path: Path) -> dict[str, str]:
    """Task id -> its cause as the record holds it, whole."""
    [run_dir] = (tmp_path / "runs" / "causes").iterdir()
    cause = {}
    for path in (run_dir / "details" / "fatal").glob("*.json"):
        record = json.loads(path.read_text())
        [issue] = [i for a in record["attempts"] for i in a["issues"]]
        cause[record["task_id"]] = f"{issue['severity'].upper()} {issue['code']}: {issue['message']}"
    assert set(cause) == {"q1", "q2", "q3"}
    assert DRAINING in cause["q2"] and cause["q2"] == cause["q3"] and QUOTA in cause["q1"]
    assert len(cause["q1"]) > 100  # the old report cut causes at 44 characters
    return cause


def test_every_cause_is_shown_whole_and_most_frequent_first(tmp_path: Path) -> None:
    command, env = _project(tmp_path)
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # invalidated tasks: exit 1
    cause = _causes(tmp_path)

    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), proc.stdout
    start = lines.index("  causes, most frequent first:") + 1
    block = lines[start : lines.index("", start)]
    text = _squeezed("\n".join(block))
    assert _squeezed(cause["q2"]) in text and _squeezed(cause["q1"]) in text, proc.stdout
    assert text.index(_squeezed(cause["q2"])) < text.index(_squeezed(cause["q1"])), proc.stdout
    assert block[0].startswith("    2 tasks  FATAL model_server_error: "), block
    [rare] = [line for line in block if "FATAL model_quota" in line]
    assert rare.startswith("    1 task   FATAL model_quota: "), block
    assert "…" not in proc.stdout


def test_a_terminal_gets_the_causes_whole_too(tmp_path: Path) -> None:
    command, env = _project(tmp_path)
    code, raw = run_on_pty(command, tmp_path, env)
    assert code == 1, raw
    cause = _causes(tmp_path)
    lines = plain_lines(raw)
    start = lines.index("causes, most frequent first") + 1
    block = lines[start : lines.index("", start)]
    assert all(len(line) <= 80 for line in block), block
    text = _squeezed("\n".join(block))
    assert text.index(_squeezed(cause["q2"])) < text.index(_squeezed(cause["q1"])), raw
    assert block[0].startswith("2 tasks  FATAL model_server_error: "), block


def test_causes_that_differ_only_in_the_task_name_are_one():
    from agentcompass import AttemptRecord, Issue, TaskRecord
    from agentcompass._report._format import causes

    def record(task_id: str, message: str) -> TaskRecord:
        issue = Issue("fatal", "setup", "image_build_failed", message)
        return TaskRecord(task_id, None, [AttemptRecord(0, "run_error", {}, [issue])], "fatal")

    records = [
        record(name, f"pulling 'alexgshaw/{name.lower()}:20251031' failed: connection refused")
        for name in ("Fix-Git", "build-cython", "chess-best-move")
    ]
    records.append(record("other", "pulling 'debian:13' failed: no such host"))
    assert causes(records) == [
        ("FATAL image_build_failed: pulling 'alexgshaw/<task>:20251031' failed: connection refused", 3),
        ("FATAL image_build_failed: pulling 'debian:13' failed: no such host", 1),
    ]
