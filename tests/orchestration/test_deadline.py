"""The orchestration deadline and the cleanup grace (SPEC sections 5 and 7).

Mock time is exact here (see ``_orch_support``): a fake task's ``sleep:10``
takes exactly 10 s, cleanup that does not hang takes none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import trio
from _orch_support import (  # noqa: F401  (fixtures)
    Timeline,
    _instrumented,
    detail_files,
    journaled_sessions,
    launch,
    only_run_dir,
    read_json,
    read_jsonl,
    sleepy_request,
    timeline,
    unclosed_sessions,
)
from trio.testing import MockClock

import agentcompass
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, Orchestration
from agentcompass._store import RunStore
from agentcompass._store._fake_disk import FakeDisk
from agentcompass.testing import FakeEnvironment, call_log, fake_request
from agentcompass.testing._environment import FakeEnvironmentConfig


@attrs.frozen
class SlowPreflightConfig(FakeEnvironmentConfig):
    preflight_seconds: float = 0


@agentcompass.register
class SlowPreflightEnvironment(FakeEnvironment):
    """``fake-env`` whose first construction (preflight's) takes
    ``preflight_seconds`` (a config key) of Trio time.

    Preflight is synchronous (it builds every component once to check its
    config), so in a real run a slow one spends wall time that Trio's clock
    sees too. Under the mock clock nothing passes during sync code, so the
    constructor jumps the run's clock by hand, once (its call log says
    whether it did): later builds (one per request where tasks run) take no time.
    """

    id: ClassVar[str] = "orch-test-slow-preflight-env"
    Config: ClassVar[type | None] = SlowPreflightConfig
    options: SlowPreflightConfig

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        log = call_log(self.options.log)
        if not log.count("slow_build"):
            log.record("environment", "slow_build", None)
            clock = trio.lowlevel.current_clock()
            assert isinstance(clock, MockClock)
            clock.jump(self.options.preflight_seconds)


async def test_tasks_cut_by_the_deadline_leave_no_record(autojump_clock, tmp_path: Path, timeline: Timeline):
    # One worker, tasks of 10 s, a 25 s deadline: a00 and a01 finish at 10 and
    # 20, a02 is cancelled at 25; a03 and a04 never start.
    request = sleepy_request("a", [10] * 5, tmp_path)
    start = trio.current_time()
    result = await launch(Orchestration([request], task_concurrency=1, timeout_seconds=25))
    assert trio.current_time() - start == 25
    assert (result.status, result.exit_code) == ("timed_out", 1)
    assert [r.status for r in result.requests] == ["timed_out"]

    run_dir = only_run_dir(tmp_path, "a")
    assert result.requests[0].run_dir == str(run_dir)
    assert detail_files(run_dir) == {"normal": {"a00", "a01"}, "error": set(), "fatal": set()}
    info = read_json(run_dir / "run_info.json")
    assert info["status"] == "timed_out" and "ended_at" in info
    assert (run_dir / "summary.md").exists()
    assert read_json(run_dir / "metrics.json")["series"]["score"]["evaluated"] == 2
    assert [m.task_id for m in timeline.events("a", "task_started")] == ["a00", "a01", "a02"]
    assert [m.detail["status"] for m in timeline.events("a", "run_finished")] == ["timed_out"]
    # The cancelled task's session was closed and journaled closed.
    assert not call_log("a").live_sessions()
    assert not unclosed_sessions(run_dir)


async def test_the_deadline_starts_after_preflight(autojump_clock, tmp_path: Path):
    # Preflight takes 1000 s of Trio time; the 25 s budget is still whole
    # afterwards, so two 10 s tasks finish. Had the deadline started when
    # launch was called, it would have passed before any task started.
    request = attrs.evolve(
        sleepy_request("a", [10] * 5, tmp_path),
        environment=ComponentRef(SlowPreflightEnvironment.id, {"log": "a", "preflight_seconds": 1000}),
    )
    start = trio.current_time()
    result = await launch(Orchestration([request], task_concurrency=1, timeout_seconds=25))
    assert call_log("a").count("slow_build") == 1, "preflight did not build the environment"
    assert trio.current_time() - start == 1000 + 25
    assert (result.status, result.exit_code) == ("timed_out", 1)
    assert detail_files(only_run_dir(tmp_path, "a"))["normal"] == {"a00", "a01"}


async def test_a_request_not_started_by_the_deadline_reports_timed_out(autojump_clock, tmp_path: Path):
    # b is prepared only when a's pending queue is empty (one worker): never, here.
    a = sleepy_request("a", [10] * 4, tmp_path)
    b = sleepy_request("b", [1], tmp_path)
    result = await launch(Orchestration([a, b], task_concurrency=1, timeout_seconds=15))
    assert result.status == "timed_out"
    assert [(r.name, r.status) for r in result.requests] == [("a", "timed_out"), ("b", "timed_out")]
    # SPEC 7: the terminal state of every unfinished request is persisted,
    # also of one that never started.
    run_dir = Path(result.requests[1].run_dir)
    assert run_dir.parent == tmp_path / "b"
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "timed_out"
    assert "before this request started" in (run_dir / "summary.md").read_text()
    assert call_log("b").count("load_tasks") == 0


async def test_a_hanging_close_is_bounded_by_the_grace(autojump_clock, tmp_path: Path):
    # At the deadline (25 s) three sessions are open, every run hangs. a00's
    # harness close and its environment close both hang, a02's environment
    # close hangs, a01 closes normally. All cleanups share one grace window:
    # launch returns at deadline + grace, not later (a00's two hung closes do
    # not add up), and the sandboxes whose close never finished stay
    # "opened" in the journal for reap.
    script = {"*": {"run": ["hang"]}, "a00": {"run": ["hang"], "close_session": ["hang"]}}
    env_script = {"a00": {"close": ["hang"]}, "a02": {"close": ["hang"]}}
    request = fake_request(
        "a",
        log="a",
        benchmark={"tasks": ["a00", "a01", "a02"]},
        harness={"script": script},
        environment={"script": env_script},
        output_root=tmp_path,
    )
    orchestration = Orchestration([request], task_concurrency=3, timeout_seconds=25, cleanup_grace_seconds=7)
    start = trio.current_time()
    result = await launch(orchestration)
    assert trio.current_time() - start == 25 + 7
    assert (result.status, result.exit_code) == ("timed_out", 1)

    log = call_log("a")
    session_of = {log.session_task(s): s for s in log.opened_sessions()}
    assert log.live_sessions() == {session_of["a00"], session_of["a02"]}
    assert set(log.closed_sessions()) == set(session_of.values())  # every close was attempted

    run_dir = only_run_dir(tmp_path, "a")
    by_task = {
        log.session_task(line["handle"]["session"]): events
        for line in read_jsonl(run_dir / "sessions.jsonl")
        for session, events in journaled_sessions(run_dir).items()
        if line["session"] == session
    }
    assert by_task == {"a00": ["opened"], "a01": ["opened", "closed"], "a02": ["opened"]}
    assert read_json(run_dir / "run_info.json")["status"] == "timed_out"
    assert detail_files(run_dir) == {"normal": set(), "error": set(), "fatal": set()}


async def test_cleanup_without_hangs_takes_no_grace(autojump_clock, tmp_path: Path):
    request = fake_request(
        "a", log="a", benchmark={"tasks": 2}, harness={"script": {"*": {"run": ["hang"]}}}, output_root=tmp_path
    )
    orchestration = Orchestration([request], task_concurrency=2, timeout_seconds=25, cleanup_grace_seconds=7)
    start = trio.current_time()
    result = await launch(orchestration)
    assert trio.current_time() - start == 25
    assert result.status == "timed_out"
    assert not call_log("a").live_sessions()
    assert not unclosed_sessions(only_run_dir(tmp_path, "a"))


async def test_a_deadline_during_task_loading_persists_the_terminal_state(autojump_clock, tmp_path: Path):
    request = fake_request(
        "a", log="a", benchmark={"tasks": 2, "script": {"*": {"load_tasks": ["sleep:100"]}}}, output_root=tmp_path
    )
    start = trio.current_time()
    result = await launch(Orchestration([request], task_concurrency=1, timeout_seconds=10))
    assert trio.current_time() - start == 10
    assert [r.status for r in result.requests] == ["timed_out"]
    run_dir = only_run_dir(tmp_path, "a")
    assert read_json(run_dir / "run_info.json")["status"] == "timed_out"
    assert call_log("a").count("plan") == 0


async def test_a_deadline_while_the_run_store_opens(autojump_clock, tmp_path: Path):
    # Opening a run store cannot be cancelled (its disk work runs in a thread
    # that is never abandoned). Here it takes 3 s and the deadline passes at
    # 1 s: the request still records its terminal state, right after the
    # open. (A regression here is a hang: the store's holder task waiting
    # for a request scope that waits for it.)
    class SlowOpen(FakeDisk):
        async def run(self, fn: Any, *args: Any) -> Any:
            if fn == RunStore._open_sync:
                await trio.sleep(3)
            return await super().run(fn, *args)

    request = sleepy_request("a", [10], tmp_path)
    start = trio.current_time()
    result = await launch(Orchestration([request], task_concurrency=1, timeout_seconds=1), disk=SlowOpen())
    assert trio.current_time() - start == 3
    assert [r.status for r in result.requests] == ["timed_out"]
    assert read_json(only_run_dir(tmp_path, "a") / "run_info.json")["status"] == "timed_out"
    assert call_log("a").count("load_tasks") == 0


@pytest.mark.parametrize(("tasks", "k", "collect"), [(1, 1, "ok"), (1, 2, "ok"), (2, 1, "ok"), (1, 1, "fatal")])
async def test_an_attempt_that_ends_in_its_close_after_the_deadline(
    autojump_clock, tmp_path: Path, tasks: int, k: int, collect: str
):
    # a00's run ends at 1 s; its sandbox close (shielded cleanup) takes 3 s,
    # and the deadline passes at 2 s, in the middle of it. Nothing after the
    # close needs to await, so the attempt ends (at 4 s), after the request
    # finalized at the deadline. The store stays open until then: the close
    # is journalled and what finished is kept (a record, or a checkpoint),
    # and a task that finished is counted: metrics, summary and run info are
    # written again (within the grace). No further attempt, retry (of a
    # FATAL collect) or task starts.
    request = fake_request(
        "a",
        log="a",
        benchmark={"tasks": [f"a{i:02d}" for i in range(tasks)], "script": {"a00": {"collect": [collect]}}},
        harness={"script": {"a00": {"run": ["sleep:1"]}}},
        environment={"script": {"a00": {"close": ["sleep:3"]}}},
        output_root=tmp_path,
        execution=ExecutionSpec(attempts=AttemptsSpec(k=k), max_retries=1),
    )
    orchestration = Orchestration([request], task_concurrency=1, timeout_seconds=2, cleanup_grace_seconds=5)
    start = trio.current_time()
    result = await launch(orchestration)
    assert trio.current_time() - start == 4
    assert (result.status, result.exit_code) == ("timed_out", 1)
    run_dir = only_run_dir(tmp_path, "a")
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "timed_out"
    finished = k == 1 and collect == "ok"
    series = read_json(run_dir / "metrics.json")["series"]["score"]
    assert (series["evaluated"], series["total"]) == (int(finished), tasks)
    assert result.requests[0].metrics["series"]["score"] == series
    assert detail_files(run_dir)["normal"] == ({"a00"} if finished else set())
    unfinished = tasks - int(finished)
    notes = json.loads((run_dir / "run_info.json").read_text()).get("notes", [])
    assert [n for n in notes if "did not finish" in n] == (
        [
            f"{unfinished} of {tasks} task(s) did not finish before the run was timed_out; "
            "they count as unavailable (a --reuse run picks them up)"
        ]
        if unfinished
        else []
    )
    checkpoints = {p.parent.name for p in (run_dir / "tasks").glob("*/attempt-*/checkpoint.json")}
    assert checkpoints == ({"attempt-0"} if k == 2 else set())
    assert call_log("a").count("run") == 1
    assert not unclosed_sessions(run_dir)


@agentcompass.register
class UninterruptibleOpenEnvironment(FakeEnvironment):
    """``fake-env`` whose ``open`` takes 3 s and cannot be cancelled (like a
    provider call made in a thread)."""

    id: ClassVar[str] = "orch-test-uninterruptible-open-env"

    async def open(self, config: Any, policy: Any, name: str | None = None) -> Any:
        with trio.CancelScope(shield=True):
            await trio.sleep(3)
            return await super().open(config, policy, name)


async def test_a_sandbox_opened_after_the_deadline_is_journalled_and_closed(autojump_clock, tmp_path: Path):
    # The deadline passes at 2 s, during the open; the request finalizes.
    # The open returns at 3 s: the sandbox is journalled (the store waits for
    # the task to unwind), closed at once, and the run ends as timed out.
    request = attrs.evolve(
        fake_request("a", log="a", benchmark={"tasks": ["a00"]}, output_root=tmp_path),
        environment=ComponentRef(UninterruptibleOpenEnvironment.id, {"log": "a"}),
    )
    result = await launch(Orchestration([request], timeout_seconds=2, cleanup_grace_seconds=5))
    assert (result.status, result.exit_code) == ("timed_out", 1)
    log = call_log("a")
    assert log.count("close") == 1 and not log.live_sessions()
    assert log.count("run") == 0
    # The store stayed open for the task to unwind: journalled both ways.
    assert list(journaled_sessions(only_run_dir(tmp_path, "a")).values()) == [["opened", "closed"]]
