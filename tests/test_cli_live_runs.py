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
import time
from pathlib import Path

from test_cli_signals import HANG_GUARD, REPO, TASKS, Child, _sessions, _status


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


def _writer_pids(parent: int) -> list[int]:
    """The run store's writer processes started by ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"_writer.py" in cmdline:
            found.append(int(entry))
    return found


def _writes(pid: int) -> int:
    """How many write system calls process ``pid`` made."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    return 0


def test_a_stalled_disk_does_not_hold_shutdown_past_the_grace(tmp_path: Path) -> None:
    # The store's writer process stands still (SIGSTOP: to the runtime, a
    # disk that stalled). A SIGTERM must still end the run within the grace:
    # the directory is left as a crash would leave it (the next --reuse or
    # compass reap recovers from that).
    grace = 2.0
    with Child(tmp_path, grace=grace) as child:
        child.expect("running", TASKS)
        writers = _writer_pids(child.proc.pid)
        assert writers, "no writer process"
        # Until the writer answered its first frame the store commits in
        # threads: wait (bounded, a real process) for that answer, a write.
        deadline = time.monotonic() + HANG_GUARD
        while not all(_writes(pid) for pid in writers):
            assert time.monotonic() < deadline, "the writer never answered"
            time.sleep(0.01)
        for pid in writers:
            os.kill(pid, signal.SIGSTOP)
        try:
            sent = child.interrupt(signal.SIGTERM)
            code, exited = child.wait(timeout=HANG_GUARD)
        finally:
            for pid in writers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert code == 143, child.stderr
    assert exited - sent < grace + 3.0, exited - sent
    assert "Traceback" not in child.stderr
