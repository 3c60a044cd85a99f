"""The server's state directory: a server killed with SIGKILL leaves its
sessions' sandboxes, and a server started again on the same state directory
reaps them before it accepts a connection; live servers sharing a state
directory leave each other's sessions alone."""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

import pytest
import trio
from _common import poll_until, processes_marked
from _remote_support import TOKEN, start_in_process
from agentcompass_remote import RemoteEnvironment

import agentcompass
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, IssueError, NetworkPolicy, Orchestration, RunRequest
from agentcompass.environments.local import DIR_PREFIX
from agentcompass.testing import hang_guard


def _sandboxes(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(DIR_PREFIX)) if root.exists() else []


def _records(state: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in state.glob("*/*.json") if p.name != "server.json"]


async def test_a_restarted_server_reaps_what_its_killed_life_left_before_it_accepts(spawn, tmp_path: Path):
    first = await spawn("k")
    env = RemoteEnvironment({"url": first.url, "token": TOKEN, "retry_down_seconds": 0})
    sessions = [await env.open(None, NetworkPolicy(), f"run-k-{i}") for i in range(3)]
    for session in sessions:
        await session.exec("sleep 1000 > /dev/null 2>&1 & echo started")
    state = Path(f"{first.root}.state")
    assert sorted(r["name"] for r in _records(state)) == ["run-k-0", "run-k-1", "run-k-2"]

    first.process.send_signal(signal.SIGKILL)
    await first.process.wait()
    # What a SIGKILL leaves: three sandboxes, their processes still running.
    assert len(_sandboxes(first.root)) == 3 and processes_marked(first.root)
    for session in sessions:
        with pytest.raises(IssueError) as unconfirmed:
            await session.close()
        assert (unconfirmed.value.severity, unconfirmed.value.code) == ("warning", "cleanup_failed")

    # Same root, same state directory: spawn returns once the server listens.
    again = await spawn("k", first.port)
    assert again.root == first.root
    assert _sandboxes(again.root) == []
    assert processes_marked(again.root) == []
    assert _records(state) == []
    assert len([d for d in state.iterdir() if not d.name.startswith(".")]) == 1  # only its own
    # The driver's reap of the sessions it could not close finds nothing left (idempotent).
    for session in sessions:
        await env.reap(session.handle)


async def test_a_session_is_recorded_while_open_and_a_live_servers_sessions_are_left_alone(
    nursery: trio.Nursery, tmp_path: Path
):
    state = tmp_path / "state"
    one = await start_in_process(nursery, tmp_path / "one", state_dir=state)
    env = RemoteEnvironment({"url": one.url, "token": TOKEN})
    session = await env.open(None, NetworkPolicy(), "run-r-1")
    [record] = _records(state)
    assert record["name"] == "run-r-1" and record["handle"] == session.handle["inner"]
    assert record["config"]["root"] == str(one.root)  # what it was opened with, to reap it the same way

    # A second server on the same state directory: the first is alive, so nothing is reaped.
    two = await start_in_process(nursery, tmp_path / "one", state_dir=state)
    assert len(_sandboxes(one.root)) == 1
    assert (await session.exec("echo still")).stdout == "still\n"
    await session.close()
    assert _records(state) == []
    assert two.server.load == 0


SOLVE = 'touch "{shared}/started-$$"; sleep 1000\n'
TEST = 'echo 0 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'


async def test_a_run_on_a_server_killed_mid_run_journals_no_close_and_nothing_is_left(
    spawn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    shared = tmp_path / "shared"
    shared.mkdir()
    for i in range(3):
        task = tmp_path / "tasks" / f"hang-{i}"
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "instruction.md").write_text("Hang.\n")
        (task / "tests" / "test.sh").write_text(TEST)
        (task / "solution" / "solve.sh").write_text(SOLVE.format(shared=shared))
    served = await spawn("mid-run")
    monkeypatch.setenv("REMOTE_TOKEN", TOKEN)
    request = RunRequest(
        name="killed-server",
        benchmark=ComponentRef("terminal", {"path": str(tmp_path / "tasks")}),
        harness=ComponentRef("oracle"),
        environment=ComponentRef("remote", {"url": served.url, "token": "${REMOTE_TOKEN}"}),
        execution=ExecutionSpec(attempts=AttemptsSpec(k=1), max_retries=0),
        output_root=tmp_path / "runs",
    )
    with hang_guard(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agentcompass.launch, Orchestration([request], task_concurrency=3))
            await poll_until(lambda: len(list(shared.glob("started-*"))) == 3, "every task to start")
            served.process.send_signal(signal.SIGKILL)
            await served.process.wait()
    [run_dir] = (tmp_path / "runs" / "killed-server").iterdir()
    journal = [json.loads(line) for line in (run_dir / "sessions.jsonl").read_text().splitlines()]
    # The driver could not close them, so it did not journal them closed.
    assert [line["event"] for line in journal] == ["opened"] * 3
    assert len(_sandboxes(served.root)) == 3

    again = await spawn("mid-run", served.port)
    assert _sandboxes(again.root) == [] and processes_marked(again.root) == []
    cli = [sys.executable, "-m", "agentcompass._cli", "reap", str(run_dir)]
    reaped = await trio.run_process(cli, capture_stdout=True, capture_stderr=True, check=False)
    assert b"reaped 3 session(s)" in reaped.stdout, reaped.stderr


def _dead_server(state: Path, name: str, provider: str, records: dict[str, dict]) -> Path:
    """What a server killed with SIGKILL leaves in the state directory (its lock is free)."""
    directory = state / name
    directory.mkdir(parents=True)
    (directory / "lock").touch()
    (directory / "server.json").write_text(json.dumps({"provider": provider, "pid": 1}))
    for session, record in records.items():
        (directory / f"{session}.json").write_text(json.dumps(record))
    return directory


async def test_leftovers_of_another_provider_stay_and_a_failed_reap_is_kept_for_the_next_start(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    state = tmp_path / "state"
    other = _dead_server(state, "1-aaaa", "sandbox", {"s.1": {"name": "s", "config": {}, "handle": {"x": 1}}})
    # A handle local refuses to reap (no marker file there): the record stays.
    stranger = tmp_path / "not-a-sandbox"
    stranger.mkdir()
    (stranger / "precious").write_text("keep me")
    refused = {"name": "t", "config": {}, "handle": {"path": str(stranger)}}
    kept = _dead_server(state, "2-bbbb", "local", {"t.1": refused})
    with caplog.at_level(logging.WARNING, logger="agentcompass_remote.server"):
        served = await start_in_process(nursery, tmp_path / "sandboxes", state_dir=state)
    assert (other / "s.1.json").exists()
    assert (kept / "t.1.json").exists() and (stranger / "precious").exists()
    assert any("could not reap session t" in r.getMessage() for r in caplog.records)
    # The server serves all the same.
    env = RemoteEnvironment({"url": served.url, "token": TOKEN})
    session = await env.open(None, NetworkPolicy())
    await session.close()


async def test_a_restarted_server_removes_what_its_killed_life_copied_for_a_session(spawn, tmp_path: Path):
    first = await spawn("x")
    env = RemoteEnvironment({"url": first.url, "token": TOKEN, "retry_down_seconds": 0})
    session = await env.open(None, NetworkPolicy(), "run-x-0")
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "file.txt").write_text("copied")
    inside = await session.expose_directory(str(tmp_path / "small"))
    [record] = _records(Path(f"{first.root}.state"))
    scratch = Path(record["scratch"])  # recorded before anything was copied into it
    assert (scratch / "1" / "file.txt").read_text() == "copied" and inside.startswith(str(scratch))

    first.process.send_signal(signal.SIGKILL)
    await first.process.wait()
    assert scratch.is_dir()
    with pytest.raises(IssueError):
        await session.close()
    await spawn("x", first.port)
    assert not scratch.exists()
