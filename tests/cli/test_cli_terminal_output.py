"""What ``compass`` prints: a compact report that fits 80 columns, the run
directory and the exact ``--reuse`` command after Ctrl-C, ``show`` of the
latest run or of a request directory, ``--version`` and uncut ``--help``."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _cli_support import REPO, compass, make_task, only_run_dir
from _common import wait_until

import agentcompass

CONFIG = """
requests:
  - name: out80
    benchmark: {id: terminal, config: {path: tasks}}
    harness: oracle
    environment: local
    output_root: runs
"""
WRONG_TEST = 'echo 0 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'


def _project(tmp_path: Path, solve_sh: str = "true\n") -> Path:
    make_task(tmp_path / "tasks", "good", solve_sh=solve_sh)
    make_task(tmp_path / "tasks", "bad", test_sh=WRONG_TEST)
    (tmp_path / "config.yaml").write_text(textwrap.dedent(CONFIG))
    return tmp_path


def test_report_fits_80_columns_and_names_the_run(tmp_path: Path) -> None:
    _project(tmp_path)
    proc = compass(tmp_path, "launch", "config.yaml", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs", "out80")
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines + proc.stderr.splitlines()), proc.stdout + proc.stderr
    assert lines[0] == "out80: succeeded, 2 tasks (0 invalidated, 0 with errors)"
    assert "# out80" not in proc.stdout  # not the markdown summary
    assert any(line.split()[:2] == ["reward", "0.5000"] for line in lines)
    assert any(line.split()[:2] == ["bad", "0"] for line in lines)  # the task that did not pass
    assert not any(line.split()[:1] == ["good"] for line in lines)
    assert f"  run directory: {run_dir.relative_to(tmp_path)}" in lines
    assert lines[-1] == "succeeded (exit 0)"


def test_ctrl_c_prints_the_run_and_the_exact_reuse_command(tmp_path: Path) -> None:
    _project(tmp_path, solve_sh="sleep 60\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentcompass._cli", "launch", "config.yaml", "--task-concurrency", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        def started() -> bool:
            runs = list((tmp_path / "runs" / "out80").glob("*/progress.jsonl"))
            return bool(runs) and '"task":"good"' in runs[0].read_text()

        wait_until(started, "the run to start its slow task")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    run_dir = only_run_dir(tmp_path / "runs", "out80").relative_to(tmp_path)
    assert f"interrupted run: {run_dir}" in stderr.splitlines()
    [resume] = [line for line in stderr.splitlines() if line.startswith("resume with: ")]
    command = shlex.split(resume.removeprefix("resume with: "))
    assert command == ["compass", "launch", "config.yaml", "--task-concurrency", "1", "--reuse", str(run_dir)]

    # The command works as printed: the finished task is reused, the rest runs.
    (tmp_path / "tasks" / "good" / "solution" / "solve.sh").write_text("true\n")
    resumed = compass(tmp_path, *command[1:])
    assert resumed.returncode == 0, resumed.stderr
    assert len(list((tmp_path / "runs" / "out80").iterdir())) == 2


def test_show_latest_and_request_directory(tmp_path: Path) -> None:
    _project(tmp_path)
    for _ in range(2):
        assert compass(tmp_path, "launch", "config.yaml").returncode == 0
    runs = sorted((tmp_path / "runs" / "out80").iterdir())

    latest = compass(tmp_path, "show")
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.splitlines()[0] == f"Run:    {runs[-1].relative_to(tmp_path)}"
    tasks = [line.split() for line in latest.stdout.splitlines() if line.split()[:1] in (["bad"], ["good"])]
    assert [row[0] for row in tasks] == ["bad", "good"]  # the order of summary.md
    assert tasks[0][2:4] == ["1", "completed"]  # attempts as counts

    listing = compass(tmp_path, "show", "runs/out80")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()[3:]]
    assert rows == [[r.name, "succeeded", "2", "reward=0.5000"] for r in runs]

    nothing = compass(tmp_path / "tasks", "show")
    assert nothing.returncode == 2
    assert nothing.stderr.strip() == "error: no runs under runs (give RUN_DIR or --output-root)"


def test_version_and_help(tmp_path: Path) -> None:
    version = compass(tmp_path, "--version")
    assert version.stdout.strip() == f"compass {agentcompass.__version__}"
    helped = compass(tmp_path, "--help", env={"COLUMNS": "80"})
    commands = helped.stdout.split("Commands:")[1].splitlines()
    assert commands and not any(line.rstrip().endswith("...") for line in commands), helped.stdout
    assert all(len(line) <= 80 for line in helped.stdout.splitlines())


@pytest.mark.parametrize("command", ["launch", "validate", "show", "list", "describe", "reap", "run"])
def test_every_command_has_an_uncut_help_line(tmp_path: Path, command: str) -> None:
    helped = compass(tmp_path, "--help", env={"COLUMNS": "80"})
    [line] = [line for line in helped.stdout.splitlines() if line.split()[:1] == [command]]
    assert not line.endswith("...")
