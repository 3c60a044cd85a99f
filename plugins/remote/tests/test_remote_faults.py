"""Servers that die: sessions on a killed server fail FATAL
``environment_failed``, the runtime retries them on another server of the
pool and the run succeeds; a restarted server is used again."""

from __future__ import annotations

import fcntl
import json
import os
import signal
from pathlib import Path

import pytest
import trio
from _common import poll_until, processes_marked
from _remote_support import TOKEN
from agentcompass_remote import RemoteEnvironment

import agentcompass
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, IssueError, NetworkPolicy, Orchestration, RunRequest
from agentcompass.testing import hang_guard


async def test_a_killed_server_fails_its_sessions_and_is_used_again_once_restarted(spawn):
    servers = [await spawn(name) for name in "abc"]
    env = RemoteEnvironment({"url": [s.url for s in servers], "token": TOKEN, "retry_down_seconds": 0})
    sessions = [await env.open(None, NetworkPolicy()) for _ in servers]
    try:
        # The opens were spread: one per server (each had the most free capacity in turn).
        assert sorted(s.handle["url"] for s in sessions) == sorted(s.url for s in servers)
        victim = servers[0]
        on_victim = next(s for s in sessions if s.handle["url"] == victim.url)
        victim.process.send_signal(signal.SIGKILL)
        await victim.process.wait()
        with pytest.raises(IssueError) as lost:
            await on_victim.exec("echo hi")
        assert (lost.value.severity, lost.value.code) == ("fatal", "environment_failed")
        assert victim.url in lost.value.message
        # Its close cannot be confirmed: the runtime keeps such a session reapable.
        with pytest.raises(IssueError) as unconfirmed:
            await on_victim.close()
        assert (unconfirmed.value.severity, unconfirmed.value.code) == ("warning", "cleanup_failed")
        # Opens skip the dead server...
        for _ in range(3):
            session = await env.open(None, NetworkPolicy())
            sessions.append(session)
            assert session.handle["url"] != victim.url
        # ... and use it again once it answers.
        restarted = await spawn("a-again", victim.port)
        session = await env.open(None, NetworkPolicy())
        sessions.append(session)
        assert session.handle["url"] == restarted.url == victim.url
        assert (await session.exec("echo back")).stdout == "back\n"
    finally:
        for session in sessions:
            with trio.move_on_after(10, shield=True):
                await session.close()


SOLVE = """#!/bin/bash
touch "{shared}/started-$$-$RANDOM"
flock -s -w 60 "{shared}/go" true  # the test holds it until it lets every task go on
echo done > "${{APP_DIR:-/app}}/out.txt"
"""
TEST = """#!/bin/bash
if [ -f "${APP_DIR:-/app}/out.txt" ]; then echo 1; else echo 0; fi > "${LOGS_DIR:-/logs}/verifier/reward.txt"
"""


def _tasks(root: Path, shared: Path, count: int) -> Path:
    for i in range(count):
        task = root / f"task-{i}"
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "instruction.md").write_text("Wait for the signal.\n")
        (task / "tests" / "test.sh").write_text(TEST)
        (task / "solution" / "solve.sh").write_text(SOLVE.format(shared=shared))
    return root


async def test_a_server_killed_during_a_run_is_retried_on_another_and_the_run_succeeds(spawn, tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    tasks = _tasks(tmp_path / "tasks", shared, 6)
    servers = [await spawn(name) for name in "abc"]
    request = RunRequest(
        name="faults",
        benchmark=ComponentRef("terminal", {"path": str(tasks)}),
        harness=ComponentRef("oracle"),
        environment=ComponentRef("remote", {"url": [s.url for s in servers], "token": TOKEN}),
        execution=ExecutionSpec(
            attempts=AttemptsSpec(k=1), max_retries=2, retry_min_delay_seconds=0.01, retry_max_delay_seconds=0.05
        ),
        output_root=tmp_path / "runs",
    )
    result = None

    async def run() -> None:
        nonlocal result
        result = await agentcompass.launch(Orchestration([request], task_concurrency=6))

    victim = servers[0]
    go = os.open(shared / "go", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC)
    try:
        fcntl.flock(go, fcntl.LOCK_EX)
        with hang_guard(240):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await poll_until(lambda: len(list(shared.glob("started-*"))) >= 6, "every task to start")
                on_victim = len(list(victim.root.iterdir()))
                assert on_victim >= 1  # the pool spread the six sessions over its servers
                victim.process.send_signal(signal.SIGKILL)
                await victim.process.wait()
                fcntl.flock(go, fcntl.LOCK_UN)  # every task goes on, and a retried one does not wait
    finally:
        os.close(go)
    assert result is not None and result.status == "succeeded", result
    run_dir = Path(result.requests[0].run_dir)
    records = [json.loads(p.read_text()) for p in (run_dir / "details" / "normal").glob("*.json")]
    assert len(records) == 6 and not list((run_dir / "details" / "fatal").glob("*.json"))
    assert all(r["attempts"][0]["values"]["reward"] == 1.0 for r in records)
    retried = [r for r in records if r["attempts"][0]["retries"]]
    assert len(retried) == on_victim
    discarded = [json.loads(p.read_text()) for p in run_dir.glob("tasks/*/attempt-*/retries/*.json")]
    assert len(discarded) == on_victim
    for record in discarded:
        codes = {(i["severity"], i["code"]) for i in record["issues"]}
        assert ("fatal", "environment_failed") in codes, record


async def test_reap_destroys_what_a_killed_server_left_once_it_is_back(spawn):
    served = await spawn("crash")
    env = RemoteEnvironment({"url": served.url, "token": TOKEN})
    session = await env.open(None, NetworkPolicy(), "run-x-1")
    handle = json.loads(json.dumps(session.handle))
    sandbox = Path(handle["inner"]["path"])
    await session.exec("sleep 1000 > /dev/null 2>&1 & echo started")
    assert processes_marked(sandbox)
    served.process.send_signal(signal.SIGKILL)
    await served.process.wait()
    assert sandbox.exists() and processes_marked(sandbox)  # what a crash leaves behind
    with pytest.raises(IssueError) as unreachable:
        await env.reap(handle)
    assert (unreachable.value.severity, unreachable.value.code) == ("warning", "cleanup_failed")
    await spawn("crash-again", served.port)
    await env.reap(handle)
    await env.reap(handle)  # idempotent
    assert not sandbox.exists()
    await poll_until(lambda: processes_marked(sandbox) == [], "the sandbox's processes to be gone", seconds=5)
    with pytest.raises(IssueError) as unconfirmed:  # the killed server never confirmed it
        await session.close()
    assert unconfirmed.value.code == "cleanup_failed"
