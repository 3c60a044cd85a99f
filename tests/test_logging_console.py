"""Warnings on the console are lines for people: ``warning: REQUEST: what
happened``, the level in colour on a terminal, plain text when stderr is not
one; the run directory's ``log.jsonl`` keeps every field as JSON. Run for
real: ``compass launch`` on a pseudo-terminal, and on pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _pty import plain_lines, run_on_pty

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
CONFIG = {
    "plugins": ["agentcompass.testing"],
    "requests": [
        {
            "name": "logs",
            "benchmark": {"id": "fake-bench", "config": {"tasks": 2}},
            "harness": {"id": "fake-harness", "config": {"script": {"t000": {"run": ["fatal:agent_vanished"]}}}},
            "environment": {"id": "fake-env"},
            "output_root": "runs",
        }
    ],
}
WARNING = "warning: logs: task t000 invalidated: FATAL agent_vanished: agent_vanished happened"


def _setup(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    env = dict(os.environ, COLUMNS="100", TERM="xterm-256color")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name in ("COMPASS_LOG_LEVEL", "NO_COLOR", "FORCE_COLOR"):
        env.pop(name, None)
    return [sys.executable, "-m", "agentcompass._cli", "launch", "config.yaml"], env


def _json_log(tmp_path: Path) -> list[dict]:
    [run_dir] = (tmp_path / "runs" / "logs").iterdir()
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def _assert_json_log_unchanged(tmp_path: Path) -> None:
    [event] = [e for e in _json_log(tmp_path) if e["event"] == "task_invalidated"]
    assert set(event) == {"timestamp", "level", "event", "logger", "request", "task", "code", "message"}
    assert (event["level"], event["request"], event["task"], event["code"]) == (
        "warning", "logs", "t000", "agent_vanished"
    )
    assert event["message"] == "agent_vanished happened" and event["timestamp"].endswith("Z")


def test_a_terminal_gets_human_warning_lines(tmp_path: Path) -> None:
    command, env = _setup(tmp_path)
    code, raw = run_on_pty(command, tmp_path, env)
    assert code == 1, raw  # an invalidated task
    assert "\x1b[33mwarning\x1b[0m:" in raw  # the level, in colour
    lines = [line.strip() for line in plain_lines(raw)]
    assert WARNING in lines, raw
    assert not [line for line in lines if "event=" in line or "level=" in line or "timestamp=" in line], raw
    _assert_json_log_unchanged(tmp_path)


def test_pipes_get_the_same_line_in_plain_text(tmp_path: Path) -> None:
    command, env = _setup(tmp_path)
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    assert WARNING in proc.stderr.splitlines(), proc.stderr
    assert "\x1b" not in proc.stderr and "event=" not in proc.stderr and "timestamp=" not in proc.stderr
    _assert_json_log_unchanged(tmp_path)


def test_events_without_a_sentence_keep_their_name_and_fields(tmp_path: Path) -> None:
    command, env = _setup(tmp_path)
    proc = subprocess.run(
        [*command[:3], "--log-level", "info", *command[3:]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 1, proc.stderr
    [run_dir] = (tmp_path / "runs" / "logs").iterdir()
    assert f"info: logs: request_finished (status=failed, run_dir={run_dir})" in proc.stderr.splitlines(), proc.stderr
