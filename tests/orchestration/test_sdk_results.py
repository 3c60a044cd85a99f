"""What the SDK entry points return (SPEC sections 7 and 9): ``run_evaluation``
results and errors, ``OrchestrationResult`` status and exit codes, and no
signal handling outside the CLI."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio
from _orch_support import (  # noqa: F401  (fixtures)
    _instrumented,
    detail_files,
    launch,
    only_run_dir,
    read_json,
    run_evaluation,
    sleepy_request,
)

from agentcompass import Orchestration, RequestResult, RunFailedError
from agentcompass.testing import fake_request

OUTCOMES = {
    "ok": {},
    # One of the two tasks cannot open its sandbox: FATAL, no retry budget.
    "fatal": {"environment": {"script": {"t001": {"open": ["fatal"]}}}},
    # The agent ran out of time: an ERROR, still scored; not a failure.
    "error": {"harness": {"script": {"*": {"run": ["harness_timeout"]}}}},
}


def request(name: str, outcome: str, output_root: Path):
    return fake_request(name, log=name, benchmark={"tasks": 2}, output_root=output_root, **OUTCOMES[outcome])


async def test_run_evaluation_returns_the_request_result(autojump_clock, tmp_path: Path):
    result = await run_evaluation(request("a", "ok", tmp_path))
    assert isinstance(result, RequestResult)
    assert (result.name, result.status) == ("a", "succeeded")
    run_dir = only_run_dir(tmp_path, "a")
    assert result.run_dir == str(run_dir)
    assert result.metrics == read_json(run_dir / "metrics.json")
    assert result.metrics["series"]["score"]["value"] == 1.0
    assert read_json(run_dir / "run_info.json")["status"] == "succeeded"


async def test_run_evaluation_raises_naming_the_run_directory_when_a_task_ends_fatal(autojump_clock, tmp_path: Path):
    with pytest.raises(RuntimeError) as caught:
        await run_evaluation(request("a", "fatal", tmp_path))
    assert isinstance(caught.value, RunFailedError)
    run_dir = only_run_dir(tmp_path, "a")
    assert str(run_dir) in str(caught.value)
    assert "failed" in str(caught.value)
    assert detail_files(run_dir)["fatal"] == {"t001"}
    assert read_json(run_dir / "run_info.json")["status"] == "failed"
    assert read_json(run_dir / "metrics.json")["evaluation_failed"] is True


async def test_run_evaluation_raises_when_the_request_times_out(autojump_clock, tmp_path: Path):
    # A timed-out request is not a success either.
    with pytest.raises(RunFailedError, match="timed_out"):
        await run_evaluation(sleepy_request("a", [10], tmp_path), timeout_seconds=5)


@pytest.mark.parametrize(
    "outcomes,status,exit_code,request_statuses",
    [
        (["ok", "ok"], "succeeded", 0, ["succeeded", "succeeded"]),
        (["ok", "error"], "succeeded", 0, ["succeeded", "succeeded"]),
        (["ok", "fatal"], "partial_failure", 1, ["succeeded", "failed"]),
        (["fatal", "ok"], "partial_failure", 1, ["failed", "succeeded"]),
        (["fatal", "fatal"], "failed", 1, ["failed", "failed"]),
        (["fatal"], "failed", 1, ["failed"]),
    ],
)
async def test_orchestration_status_and_exit_code(
    autojump_clock, tmp_path: Path, outcomes, status, exit_code, request_statuses
):
    requests = [request(f"r{i}", outcome, tmp_path) for i, outcome in enumerate(outcomes)]
    result = await launch(Orchestration(requests, task_concurrency=2))
    assert (result.status, result.exit_code) == (status, exit_code)
    assert [r.status for r in result.requests] == request_statuses
    assert [r.name for r in result.requests] == [f"r{i}" for i in range(len(outcomes))]
    for r in result.requests:
        assert read_json(Path(r.run_dir) / "run_info.json")["status"] == r.status


async def test_a_request_whose_tasks_cannot_load_fails_and_the_others_run(autojump_clock, tmp_path: Path):
    broken = fake_request(
        "broken", log="broken", benchmark={"script": {"*": {"load_tasks": ["raise"]}}}, output_root=tmp_path
    )
    result = await launch(Orchestration([broken, request("ok", "ok", tmp_path)], task_concurrency=2))
    assert (result.status, result.exit_code) == ("partial_failure", 1)
    assert [r.status for r in result.requests] == ["failed", "succeeded"]
    info = read_json(only_run_dir(tmp_path, "broken") / "run_info.json")
    assert info["status"] == "failed" and "fake load_tasks crashed" in info["error"]


async def test_launch_installs_no_signal_handlers(autojump_clock, tmp_path: Path):
    watched = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in watched}
    during = {}

    async def look_while_running() -> None:
        await trio.sleep(5)  # tasks sleep 10 s: launch is mid-run
        during.update({sig: signal.getsignal(sig) for sig in watched})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(look_while_running)
        result = await launch(Orchestration([sleepy_request("a", [10, 10], tmp_path)]))
    assert result.status == "succeeded"
    assert during == before
    assert {sig: signal.getsignal(sig) for sig in watched} == before
