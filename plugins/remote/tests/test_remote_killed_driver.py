"""A driver killed mid-run (SIGKILL): the server closes its sessions on its
own, and ``compass reap RUN_DIR`` goes through the journal to the servers
with the token from ``${VAR}``, leaving nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio
from _common import poll_until, processes_marked
from _remote_support import TOKEN, start_in_process

SOLVE = 'touch "{shared}/started"; sleep 1000\n'
TEST = 'echo 0 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'


async def test_a_killed_driver_leaves_nothing_and_compass_reap_reaches_the_server(
    nursery: trio.Nursery, tmp_path: Path
):
    served = await start_in_process(nursery, tmp_path / "sandboxes", grace=3.0)
    shared = tmp_path / "shared"
    shared.mkdir()
    task = tmp_path / "tasks" / "hang"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Hang.\n")
    (task / "tests" / "test.sh").write_text(TEST)
    (task / "solution" / "solve.sh").write_text(SOLVE.format(shared=shared))
    config = tmp_path / "run.yaml"
    config.write_text(
        "requests:\n"
        "  - name: killed\n"
        f"    benchmark: {{id: terminal, config: {{path: {tmp_path / 'tasks'}}}}}\n"
        "    harness: {id: oracle}\n"
        f"    environment: {{id: remote, config: {{url: '{served.url}', token: '${{REMOTE_TOKEN}}'}}}}\n"
    )
    env = {**os.environ, "REMOTE_TOKEN": TOKEN}
    cli = [sys.executable, "-m", "agentcompass._cli"]
    driver = await trio.lowlevel.open_process(
        [*cli, "launch", str(config), "--output-root", str(tmp_path / "runs")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await poll_until(lambda: (shared / "started").exists(), "the task to start")
        assert served.server.load == 1
        driver.send_signal(signal.SIGKILL)
        await driver.wait()
        await poll_until(lambda: served.server.load == 0, "the server to close the orphaned session", seconds=3 + 1)
    finally:
        if driver.returncode is None:
            driver.kill()
        with trio.move_on_after(5, shield=True):
            await driver.wait()
    assert served.sandboxes() == [] and processes_marked(served.root) == []
    [run_dir] = (tmp_path / "runs" / "killed").iterdir()
    assert "remote" in (run_dir / "sessions.jsonl").read_text()
    reaped = await trio.run_process([*cli, "reap", str(run_dir)], env=env, capture_stdout=True, capture_stderr=True)
    assert b"reaped 1 session(s)" in reaped.stdout, reaped.stderr
    assert served.server.load == 0 and served.sandboxes() == []
