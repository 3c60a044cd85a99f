"""The progress display renders with and without a TTY."""

from __future__ import annotations

import io

import structlog.testing
import trio

import agentcompass.testing  # noqa: F401
from agentcompass import ComponentRef, ExecutionSpec, Orchestration, RunRequest, TaskSpec
from agentcompass._orchestration._launch import orchestrate
from agentcompass._progress import ProgressDisplay
from agentcompass._store._fake_disk import FakeDisk


def _task(i: int) -> TaskSpec:
    return TaskSpec(f"t{i}")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_plain_lines_when_not_a_tty(autojump_clock, tmp_path, capsys):
    request = RunRequest(
        name="p",
        benchmark=ComponentRef("fake-bench", {"tasks": 4, "log": "progress"}),
        environment=ComponentRef("fake-env", {"log": "progress"}),
        harness=ComponentRef("fake-harness", {"log": "progress", "script": {"*": {"run": ["sleep:30"]}}}),
        output_root=tmp_path,
    )
    # A fake store disk: a worker thread's real time would let the mock clock
    # jump past a record's completion, and the counts below would race.
    # Log events captured: whatever configured structlog last in this process
    # (another test) must not decide where they print.
    with structlog.testing.capture_logs():
        result = await orchestrate(Orchestration([request], task_concurrency=2), show_progress=True, disk=FakeDisk())
    assert result.status == "succeeded"
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    # Every 10 s of (mock) time while tasks run, then a final line.
    assert any(line.startswith("[p] 0/4 done, 2 active") for line in lines)
    assert any(line.startswith("[p] 2/4 done, 2 active") for line in lines)
    assert lines[-1].startswith("[p] 4/4 done, 0 active") and "(succeeded)" in lines[-1]
    assert captured.out == ""


async def test_live_table_on_a_tty(autojump_clock, tmp_path):
    from agentcompass._orchestration._context import GraceClock
    from agentcompass._orchestration._request import RequestRun
    from agentcompass._orchestration._request_state import Prepared, Stage

    request = RunRequest(name="live", benchmark=ComponentRef("fake-bench"), environment=ComponentRef("fake-env"), output_root=tmp_path)
    run = RequestRun(request, GraceClock(1))
    run.life.stage, run.prepared = Stage.RUNNING, Prepared.of([_task(i) for i in range(10)], [])
    run.tasks.active, run.tally.retries = 3, 2
    stream = _Tty()
    display = ProgressDisplay([run], stream=stream)
    assert display.tty
    with trio.move_on_after(1):
        await display.run()
    text = stream.getvalue()
    assert "live" in text and "0/10" in text and "retry" in text


def test_rate_and_eta_count_only_tasks_run_in_this_process():
    from types import SimpleNamespace

    from agentcompass._progress import progress_line

    # 10 tasks: 6 reused from an earlier run, 2 run here in 4 s, 2 left.
    run = SimpleNamespace(
        request=SimpleNamespace(name="r"),
        prepared=SimpleNamespace(reused=[object()] * 6),
        life=SimpleNamespace(ready=True),
        started_clock=0.0,
        total=10,
        tasks=SimpleNamespace(active=2),
        tally=SimpleNamespace(records=[object()] * 8, retries=0, counts={"fatal": 1, "error": 0, "warning": 0}, status=None),
    )
    line = progress_line(run, now=4.0)
    assert line == "[r] 8/10 done, 2 active, 1 invalidated, 0.5 tasks/s, ETA 4s (running)"


async def test_live_table_and_report_fit_80_columns(tmp_path, monkeypatch):
    import re

    import rich.console

    from agentcompass._orchestration._context import GraceClock
    from agentcompass._orchestration._request import RequestRun
    from agentcompass._orchestration._request_state import Prepared, Stage
    from agentcompass._report import render_request_report

    request = RunRequest(
        name="terminal-smoke-oracle", benchmark=ComponentRef("fake-bench"), environment=ComponentRef("fake-env"),
        output_root=tmp_path,
    )
    run = RequestRun(request, GraceClock(1))
    run.life.stage, run.prepared = Stage.FINALIZED, Prepared.of([_task(i) for i in range(12)], [])
    run.tally.status = "succeeded"
    console = rich.console.Console(width=80, record=True, file=io.StringIO())
    console.print(ProgressDisplay([run])._table())
    table = console.export_text()
    assert "terminal-smoke-oracle" in table and "succeeded" in table and "…" not in table
    assert all(len(line.rstrip()) <= 80 for line in table.splitlines())

    # A run directory as `compass launch` makes it, under the current directory: the
    # report shows it relative (tmp_path's own length depends on the test runner).
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "terminal-smoke-oracle" / "20260101T000000.000Z-a1b2c3"
    run_dir.mkdir(parents=True)
    report = render_request_report("terminal-smoke-oracle", "succeeded", str(run_dir), None, tty=True)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", report)
    assert plain.splitlines()[0] == "terminal-smoke-oracle: succeeded"
    assert all(len(line.rstrip()) <= 80 for line in plain.splitlines())


def test_the_eta_comes_from_the_tasks_own_timeouts_then_their_durations():
    from agentcompass._progress import eta_seconds

    # Before any task finished: each task's own budget (600 s), spread over the 2 running.
    running = {"a": (0.0, 600.0), "b": (0.0, 600.0)}
    assert eta_seconds(100.0, running, [600.0] * 4, [], 2) == (500 + 500 + 4 * 600) / 2
    # Finished tasks took 60 s: the rest is expected to take as long.
    assert eta_seconds(100.0, {"a": (90.0, 600.0)}, [600.0, 600.0], [60.0, 60.0], 1) == 50 + 120
    # A verifier that has run 27 minutes of a 60-minute budget is not "2m away".
    assert eta_seconds(1620.0, {"a": (0.0, 3600.0)}, [], [60.0], 1) == (3600 - 1620) / 2
    # Nothing known (no timeouts, nothing finished): no figure at all.
    assert eta_seconds(10.0, {"a": (0.0, None)}, [], [], 1) is None


async def test_the_plain_lines_eta_follows_the_tasks(autojump_clock, tmp_path, capsys):
    request = RunRequest(
        name="eta",
        benchmark=ComponentRef("fake-bench", {"tasks": 4, "log": "eta"}),
        environment=ComponentRef("fake-env", {"log": "eta"}),
        harness=ComponentRef("fake-harness", {"log": "eta", "script": {"*": {"run": ["sleep:30"]}}}),
        execution=ExecutionSpec(run_timeout_seconds=100),
        output_root=tmp_path,
    )
    with structlog.testing.capture_logs():
        result = await orchestrate(Orchestration([request], task_concurrency=2), show_progress=True, disk=FakeDisk())
    assert result.status == "succeeded"
    lines = capsys.readouterr().err.splitlines()
    # Before any finished: two tasks into their 100 s and two queued, over 2 slots, (90 + 90 + 200) / 2
    # at 10 s (a rate-based figure would have nothing to say yet).
    assert any(line.startswith("[eta] 0/4 done, 2 active") and "ETA 3m" in line for line in lines), lines
    # Once two finished in 30 s, the others are expected to take as long.
    assert any(line.startswith("[eta] 2/4 done, 2 active") and "ETA 20s" in line for line in lines), lines
