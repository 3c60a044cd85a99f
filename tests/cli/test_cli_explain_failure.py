"""A failure can be explained from the run directory: the verifier's and the
reference solution's exit codes and output tails are kept, a failing
``solve.sh`` is a WARNING, and ``--log-level debug`` shows the attempt's
lifecycle on the console and in ``log.jsonl``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from _cli_support import compass, make_task, only_run_dir, read_json

FAILING_TEST = """echo "checking hello.txt"
echo "hello.txt is missing" >&2
echo 0 > "${LOGS_DIR:-/logs}/verifier/reward.txt"
exit 1
"""
FAILING_SOLVE = """echo "writing hello.txt"
echo "disk on fire" >&2
exit 3
"""
CONFIG = """
requests:
  - name: explain
    benchmark: {id: terminal, config: {path: tasks}}
    harness: oracle
    environment: local
    output_root: out
"""
LIFECYCLE = ["attempt_open", "attempt_prepare", "attempt_run", "attempt_collect", "attempt_evaluate", "attempt_close"]


def test_run_directory_explains_a_zero(tmp_path: Path) -> None:
    make_task(tmp_path / "tasks", "hello", test_sh=FAILING_TEST, solve_sh=FAILING_SOLVE)
    (tmp_path / "config.yaml").write_text(textwrap.dedent(CONFIG))
    proc = compass(tmp_path, "--log-level", "debug", "launch", "config.yaml")
    assert proc.returncode == 0, proc.stderr

    run_dir = only_run_dir(tmp_path / "out", "explain")
    [attempt] = read_json(run_dir / "details" / "normal" / "hello.json")["attempts"]
    assert attempt["values"] == {"reward": 0.0, "passed": False}
    artifacts = attempt["run_result"]["artifacts"]
    assert artifacts["verifier"] == {"exit_code": 1, "stdout": "checking hello.txt\n", "stderr": "hello.txt is missing\n"}
    assert artifacts["harness_command"] == {"exit_code": 3, "stdout": "writing hello.txt\n", "stderr": "disk on fire\n"}
    [issue] = attempt["issues"]
    assert (issue["severity"], issue["phase"], issue["code"]) == ("warning", "run", "solution_failed")
    assert "exited with 3" in issue["message"] and "disk on fire" in issue["message"]

    # The lifecycle, in order, with durations: on the console and in log.jsonl.
    console = [line for line in proc.stderr.splitlines() if line.startswith("debug: explain: attempt_")]
    assert [line.split()[2] for line in console] == LIFECYCLE
    assert all("seconds=" in line and "task_id=hello" in line for line in console)
    events = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    lifecycle = [e for e in events if e["event"].startswith("attempt_")]
    assert [e["event"] for e in lifecycle] == LIFECYCLE
    assert all(e["level"] == "debug" and e["seconds"] >= 0 and e["attempt"] == 0 for e in lifecycle)


def test_no_lifecycle_lines_at_the_default_level(tmp_path: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    (tmp_path / "config.yaml").write_text(textwrap.dedent(CONFIG))
    proc = compass(tmp_path, "launch", "config.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "attempt_open" not in proc.stderr
    run_dir = only_run_dir(tmp_path / "out", "explain")
    assert "attempt_open" not in (run_dir / "log.jsonl").read_text()
