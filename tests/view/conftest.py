"""Fixtures for the viewer: run directories written by hand in the store's
format (SPEC 8; trajectories and verifier output in the agreed formats), a
real demo run, the viewer served on a loopback port, and headless Chromium."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from view_helpers import (
    COMPASS,
    LEAKY_KEY,
    ROOT,
    agent_trajectory,
    attempt,
    issue,
    metrics_for,
    task,
    write_json,
    write_run,
)

from agentcompass._view import Site, find_runs, serve
from agentcompass._view._browser import Browser, browser_missing, open_browser


@pytest.fixture
def agent_run(tmp_path: Path) -> Path:
    """A react run of two tasks; the failing one has a retry and an ERROR."""
    trajectory = agent_trajectory(3, long_output=True)
    trajectory.append({"role": "assistant", "content": f"The answer is 3. (key {LEAKY_KEY}) <img src=x onerror=\"window.pwned=1\">", "tool_calls": [],
                       "step": 3, "usage": {"prompt_tokens": 140, "completion_tokens": 9}, "duration_seconds": 0.4})
    verifier = {"exit_code": 1, "stdout": "FAILED test_count: expected 3 got 2\n", "stderr": ""}
    tasks = [
        task("count-lines", attempt(values={"reward": 0.0, "passed": False}, status="run_error",
                                    issues=[issue("error", "run", "harness_max_iterations", "stopped after 4 steps")],
                                    trajectory=trajectory, usage={"prompt_tokens": 446, "completion_tokens": 69, "calls": 4},
                                    artifacts={"verifier": verifier}, retries=1),
             category="files", severity="error"),
        task("hello", attempt(trajectory=agent_trajectory(1), usage={"prompt_tokens": 100, "completion_tokens": 20, "calls": 1}),
             category="basics"),
    ]
    run_dir = write_run(tmp_path / "agent", "terminal-react", "20260101T000000.000Z-aaaa", tasks,
                        metrics=metrics_for({"count-lines": 0.0, "hello": 1.0}, {"count-lines": "files", "hello": "basics"}))
    write_json(run_dir / "tasks" / "count-lines" / "attempt-0" / "retries" / "1.json", {
        "task_id": "count-lines", "retry_number": 1, "stage": "run", "scope": "attempt", "matched_pattern": None, "delay_seconds": 5.2,
        "issues": [issue("fatal", "run", "model_server_error", "HTTP 503 from the model")],
    })
    return run_dir


@pytest.fixture
def demo_run(tmp_path: Path) -> Path:
    """A real ``make demo`` run (the oracle on the bundled terminal tasks)."""
    out = tmp_path / "demo"
    subprocess.run([COMPASS, "launch", str(ROOT / "examples" / "quickstart.yaml"), "--output-root", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=120)
    (run_dir,) = find_runs([out])
    return run_dir


@pytest.fixture
def agent_demo_run(tmp_path: Path) -> Path:
    """A real ``make demo-agent`` run: the react harness against the scripted model server."""
    out = tmp_path / "demo-agent"
    subprocess.run([sys.executable, "-m", "agentcompass.testing.model_server", "--script", str(ROOT / "examples" / "demo-agent.json"),
                    "--", COMPASS, "launch", str(ROOT / "examples" / "demo-agent.yaml"), "--output-root", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=120)
    (run_dir,) = find_runs([out])
    return run_dir


@pytest.fixture
async def viewer(nursery: trio.Nursery) -> Any:
    """``await viewer(run_dirs)`` serves them on a loopback port; its URL."""
    async def start(run_dirs: list[Path]) -> str:
        return await nursery.start(serve, Site(find_runs(run_dirs), live=True), 0)
    return start


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    missing = browser_missing()
    if missing:
        pytest.skip(f"headless Chromium unavailable: {missing}")
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with trio.CancelScope(deadline=trio.current_time() + 60) as startup:
        async with open_browser(profile) as b:
            startup.deadline = math.inf  # the start-up is bounded, the test has its own guard
            yield b
            assert await b.console_errors() == []
    if startup.cancelled_caught:
        pytest.fail("headless Chromium did not start within 60 s")


