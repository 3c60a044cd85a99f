"""SIGKILL of the runtime while a sandboxed task runs, then ``--reuse``:
nothing of the killed run's sandboxes is left (SPEC section 8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from _common import poll_until
from _sandbox_support import census, requires_sandbox, veths
from agentcompass_sandbox import _host, _pool

from agentcompass.testing import hang_guard

pytestmark = requires_sandbox

_TEST = """#!/usr/bin/env bash
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def _task(root: Path, solve: str) -> None:
    task = root / "hold"
    (task / "tests").mkdir(parents=True, exist_ok=True)
    (task / "solution").mkdir(exist_ok=True)
    (task / "instruction.md").write_text("Write done to /app/out.txt.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "tests" / "test.sh").write_text(_TEST)
    (task / "solution" / "solve.sh").write_text("#!/usr/bin/env bash\n" + solve)


def _lease_owners() -> list[str]:
    if not _host.LEASE_DIR.is_dir():
        return []
    return [(_host.LEASE_DIR / e).read_text() for e in os.listdir(_host.LEASE_DIR)]


def _sessions(output_root: Path) -> list[dict]:  # type: ignore[type-arg]
    lines = []
    for path in output_root.glob("*/*/sessions.jsonl"):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines


@pytest.mark.serial  # it counts every veth and pool lease on the host, another test's too
async def test_sigkill_during_a_run_then_reuse_leaves_nothing(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    # The agent starts a daemon and holds the run: the kill lands mid-run.
    _task(tasks, "setsid sleep 600 > /dev/null 2>&1 &\necho running > /app/started\nsleep 600\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        "requests:\n"
        "  - name: killed\n"
        f"    benchmark: {{id: terminal, config: {{path: {tasks}}}}}\n"
        "    harness: {id: oracle}\n"
        "    environment: {id: sandbox}\n"
        "    execution: {network: {run: none}}\n"
    )
    output_root = tmp_path / "runs"
    compass = [str(Path(sys.executable).with_name("compass"))]
    argv = [*compass, "launch", str(config), "--output-root", str(output_root)]
    veths_before = await trio.to_thread.run_sync(veths)
    with hang_guard(120):
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            name = ""

            async def daemon_started() -> bool:
                nonlocal name
                opened = [s for s in _sessions(output_root) if s.get("event") == "opened"]
                if not opened:
                    return False
                name = opened[0]["handle"]["name"]
                return await trio.to_thread.run_sync((_host.files_dir(name) / "app" / "started").exists)

            # The session journalled (by the runtime) and the agent's daemon running in it.
            await poll_until(daemon_started, "the session and its daemon", 60, every=0.05)
            assert await census(name), "the sandbox should exist while the task runs"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        left = await census(name)
        assert left, "a SIGKILL leaves resources for --reuse to reap"
        _task(tasks, "echo done > /app/out.txt\n")
        done = await trio.run_process([*argv, "--reuse"], capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert await census(name) == []
        assert await trio.to_thread.run_sync(veths) <= veths_before
        # Nor a lease of the killed runtime's pool of network namespaces.
        owners = await trio.to_thread.run_sync(_lease_owners)
        assert not [o for o in owners if o.startswith(f"{_pool.LEASE_OWNER_PREFIX}{proc.pid}-")], owners
        # The rerun itself left nothing either.
        names = {s["handle"]["name"] for s in _sessions(output_root) if s.get("event") == "opened"}
        for other in names:
            assert await census(other) == []
