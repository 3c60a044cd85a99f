"""``compass show`` and ``compass view`` through the real CLI: the latest run
at any depth, a run whose score is not final (killed, or stopped by Ctrl-C)
says so and prints the ``--reuse`` command that resumes it, and ``--json``
gives scripts one document."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _cli_support import REPO, compass, make_task, only_run_dir

HANG_GUARD = 60.0  # seconds; only reached when something is broken

CONFIG = """
requests:
  - name: shown
    benchmark: {id: terminal, config: {path: tasks}}
    harness: oracle
    environment: local
    output_root: runs/out
"""


def _project(tmp_path: Path, hang: bool = False) -> Path:
    """Two passing tasks and, with ``hang``, a third whose solution says so
    on a FIFO and then hangs (it runs last: one task at a time, in order)."""
    make_task(tmp_path / "tasks", "a-good")
    make_task(tmp_path / "tasks", "b-good")
    if hang:
        fifo = tmp_path / "hang.fifo"
        os.mkfifo(fifo)
        make_task(tmp_path / "tasks", "c-hang", solve_sh=f"echo started > {shlex.quote(str(fifo))}\nexec sleep 120\n")
    (tmp_path / "config.yaml").write_text(textwrap.dedent(CONFIG))
    return tmp_path


def _launch_until_hanging(tmp_path: Path) -> subprocess.Popen[bytes]:
    """``compass launch`` (one task at a time), returned once the hanging task runs."""
    fifo = os.open(tmp_path / "hang.fifo", os.O_RDWR | os.O_NONBLOCK)  # read-write: the writer never blocks
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("COMPASS_LOG_LEVEL", None)
    log = (tmp_path / "launch.err").open("wb")
    with log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentcompass._cli", "launch", "config.yaml", "--task-concurrency", "1"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log,
        )
    try:
        ready, _, _ = select.select([fifo], [], [], HANG_GUARD)
        assert ready, (tmp_path / "launch.err").read_text()
        assert os.read(fifo, 100) == b"started\n"
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        os.close(fifo)
    return proc


def _show_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    proc = compass(tmp_path, "show", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # one document, nothing else on stdout


def _resume(tmp_path: Path, shown: str) -> None:
    """Run the printed resume command (CONFIG is the config it was launched
    with) once the hanging task is fixed: it runs only the unfinished task."""
    [line] = [line for line in shown.splitlines() if line.startswith("Resume: ")]
    command = shlex.split(line.removeprefix("Resume: "))
    assert command[:3] == ["compass", "launch", "CONFIG"] and command[3] == "--reuse", command
    (tmp_path / "tasks" / "c-hang" / "solution" / "solve.sh").write_text("true\n")
    resumed = compass(tmp_path, "launch", "config.yaml", *command[3:])
    assert resumed.returncode == 0, resumed.stderr
    after = _show_json(tmp_path)  # the latest run: the resumed one
    assert (after["status"], after["final"], after["resume"]) == ("succeeded", True, None)
    assert after["tasks"] == {"total": 3, "finished": 3, "unfinished": 0, "invalidated": 0, "error": 0, "normal": 3}
    assert after["metrics"]["series"]["reward"]["value"] == 1.0


def test_show_of_a_killed_run_is_interrupted_partial_and_resumable(tmp_path: Path) -> None:
    _project(tmp_path, hang=True)
    proc = _launch_until_hanging(tmp_path)
    proc.kill()
    assert proc.wait(timeout=HANG_GUARD) == -signal.SIGKILL
    run_dir = only_run_dir(tmp_path / "runs" / "out", "shown").relative_to(tmp_path)

    shown = compass(tmp_path, "show")  # the latest run, found under runs/out/shown
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[:6] == [
        f"Run:    {run_dir}",
        "Status: interrupted (the process running it died before it ended)",
        "Tasks:  2 finished (0 invalidated, 0 with errors, 2 normal), 1 unfinished",
        "Partial: 1 of 3 task(s) unfinished; not a final score",
        f"Resume: compass launch CONFIG --reuse {run_dir}",
        "        (CONFIG: the config file it was launched with; only what is left runs)",
    ]
    assert "Metrics: none (the run did not finalize)" in lines

    document = _show_json(tmp_path, str(run_dir))
    assert document["run_dir"] == str(run_dir)
    assert (document["request"], document["status"], document["final"]) == ("shown", "interrupted", False)
    assert document["tasks"] == {"total": 3, "finished": 2, "unfinished": 1, "invalidated": 0, "error": 0, "normal": 2}
    assert document["metrics"] is None
    assert document["resume"] == f"compass launch CONFIG --reuse {run_dir}"
    assert document["open_sessions"] == 1  # the hanging task's sandbox, reaped by the resume
    assert document["paths"]["run_info"] == str(run_dir / "run_info.json")
    assert (tmp_path / document["paths"]["details"]).is_dir()

    _resume(tmp_path, shown.stdout)


def test_show_of_a_run_stopped_by_ctrl_c_does_not_present_its_score_as_final(tmp_path: Path) -> None:
    _project(tmp_path, hang=True)
    proc = _launch_until_hanging(tmp_path)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=HANG_GUARD) == 130
    run_dir = only_run_dir(tmp_path / "runs" / "out", "shown").relative_to(tmp_path)

    shown = compass(tmp_path, "show", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1] == "Status: cancelled"
    assert "Partial: 1 of 3 task(s) unfinished; not a final score" in lines
    assert f"Resume: compass launch CONFIG --reuse {run_dir}" in lines
    [header] = [line for line in lines if line.startswith("series")]
    assert header.split()[1:3] == ["partial", "value"]  # the metrics count only what finished

    document = _show_json(tmp_path, str(run_dir))
    assert (document["status"], document["final"]) == ("cancelled", False)
    assert document["tasks"]["unfinished"] == 1
    assert document["metrics"]["series"]["reward"]["evaluated"] == 2

    _resume(tmp_path, shown.stdout)


def test_show_and_view_find_the_latest_run_at_any_depth(tmp_path: Path) -> None:
    _project(tmp_path)
    # As `make demo` does: a run three levels down; then one two levels down.
    assert compass(tmp_path, "launch", "config.yaml", "--output-root", "runs/demo").returncode == 0
    assert compass(tmp_path, "launch", "config.yaml", "--output-root", "runs").returncode == 0
    deep = only_run_dir(tmp_path / "runs" / "demo", "shown").relative_to(tmp_path)
    shallow = only_run_dir(tmp_path / "runs", "shown").relative_to(tmp_path)

    latest = compass(tmp_path, "show")
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.splitlines()[0] == f"Run:    {shallow}"
    assert _show_json(tmp_path, "runs/demo")["run_dir"] == str(deep)  # the latest under a directory
    assert [r["run_dir"] for r in _show_json(tmp_path, "runs/demo/shown")["runs"]] == [str(deep)]

    pages = compass(tmp_path, "view", "--out", "pages")
    assert pages.returncode == 0, pages.stderr
    assert pages.stdout.startswith("wrote ") and "for 2 run(s)" in pages.stdout
    index = (tmp_path / "pages" / "data" / "runs.js").read_text()
    assert deep.name in index and shallow.name in index


def test_show_with_no_runs_names_the_directory(tmp_path: Path) -> None:
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    for args in ((), ("runs/empty",), ("--json",)):
        proc = compass(tmp_path, "show", *args)
        assert proc.returncode == 2
        where = args[0] if args and args[0] != "--json" else "runs"
        assert proc.stderr.strip() == f"error: no runs under {where} (give RUN_DIR or --output-root)"


@pytest.mark.parametrize("args", [(), ("runs",)])
def test_view_of_no_runs_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    (tmp_path / "runs").mkdir()
    proc = compass(tmp_path, "view", "--out", "pages", *args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: no run directory found under runs"
