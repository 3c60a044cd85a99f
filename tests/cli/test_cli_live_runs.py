"""A live run's lock, and what ``compass show`` says of a run whose process
died (SPEC section 8), through real ``compass`` subprocesses.

The live run is the hanging run of ``test_cli_signals`` (its tasks hang in
``run_task`` and report ``running`` on a FIFO)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from test_cli_signals import HANG_GUARD, MARGIN, REPO, TASKS, Child, _sessions, _status

#: ``compass`` on a disk that stalls once a marker file exists.
STALLING_COMPASS = Path(__file__).resolve().parent / "cli_plugins" / "stalling_compass.py"


def _compass(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD,
    )


def test_reuse_of_a_live_run_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    with Child(tmp_path) as child:
        child.expect("running", TASKS)
        run_dir = child.run_dir()
        config = str(tmp_path / "config.yaml")
        for reuse in (["--reuse"], ["--reuse", str(run_dir)]):
            proc = _compass(tmp_path, "launch", config, "--output-root", str(child.output_root), *reuse)
            assert proc.returncode == 2, proc.stderr
            [line] = proc.stderr.strip().splitlines()
            assert line.startswith("error: cannot reuse") and "still alive" in line, line
        # Nothing touched: no new run directory, none of the live run's
        # sessions reaped, and the live run goes on to end normally.
        assert [p for p in (child.output_root / "signals").iterdir()] == [run_dir]
        opened, closed = _sessions(run_dir)
        assert len(opened) == TASKS and closed == []
        assert child.count("closing") == 0
        # While it lives, show says it runs.
        shown = _compass(tmp_path, "show", str(run_dir))
        assert "Status: running" in shown.stdout, shown.stdout
        child.interrupt()
        code, _ = child.wait(timeout=HANG_GUARD)
    assert code == 130, child.stderr
    assert _status(run_dir) == "cancelled"
    opened, closed = _sessions(run_dir)
    assert sorted(closed) == sorted(opened)


def test_show_of_a_killed_run_says_interrupted_and_counts_unfinished_tasks(tmp_path: Path) -> None:
    with Child(tmp_path) as child:
        child.expect("running", TASKS)
        child.proc.send_signal(signal.SIGKILL)
        assert child.proc.wait(timeout=HANG_GUARD) == -signal.SIGKILL
        run_dir = child.run_dir()
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "running"
    proc = _compass(tmp_path, "show", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "Status: interrupted" in proc.stdout, proc.stdout
    assert f"0 finished (0 invalidated, 0 with errors, 0 normal), {TASKS} unfinished" in proc.stdout
    assert "--reuse" in proc.stdout
    assert "Status: running" not in proc.stdout


def test_a_stalled_disk_does_not_hold_shutdown_past_the_grace(tmp_path: Path) -> None:
    # The store's disk stalls for good (every sync blocks in its thread). A
    # SIGTERM must still end the run within the grace: the directory is left
    # as a crash would leave it (the next --reuse or compass reap recovers).
    grace = 2.0
    marker = tmp_path / "stall"
    entry = (str(STALLING_COMPASS), str(marker), str(tmp_path / "events.fifo"))
    with Child(tmp_path, grace=grace, entry=entry) as child:
        child.expect("running", TASKS)
        marker.touch()
        sent = child.interrupt(signal.SIGTERM)
        code, exited = child.wait(timeout=HANG_GUARD)
        child._read_fifo()
        assert child.count("stalled") >= 1  # the shutdown's writes met the stalled disk
    assert code == 143, child.stderr
    assert exited - sent < grace + MARGIN, exited - sent
    assert "Traceback" not in child.stderr
