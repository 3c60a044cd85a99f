"""What a ``--reuse`` run copies, retries and resumes (SPEC section 8, "Reuse").

Every test launches a request of the fakes twice (or more) into the same
``output_root``, the later launches with ``RunRequest.reuse`` set, and reads
the answer from two places: the fakes' call log (what ran again) and the new
run directory (what was copied, retried or resumed). Mock time is exact (see
``_reuse_support``).
"""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import pytest
import trio
from _reuse_support import (
    agent_calls,
    checkpoints,
    details,
    launch_one,
    notes,
    read_json,
    reuse_of,
    run_info,
    started_attempts,
)

import agentcompass
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec
from agentcompass.testing import FakeEnvironment, call_log, fake_request


def _execution(k: int = 1, **fields: object) -> ExecutionSpec:
    return ExecutionSpec(attempts=AttemptsSpec(k), **fields)  # type: ignore[arg-type]


def _attempts(record: dict) -> dict[int, dict]:
    return {a["attempt"]: a for a in record["attempts"]}


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "_dir"}


# -- (a) a clean run ----------------------------------------------------------


async def test_a_clean_run_is_reused_whole_and_nothing_runs_again(autojump_clock, tmp_path: Path):
    request = fake_request(
        "clean",
        log="clean",
        benchmark={"tasks": 3, "values": {"*": {"score": [0.5, 1.0]}}},
        execution=_execution(2),
        output_root=tmp_path,
    )
    first = await launch_one(request)
    assert first.status == "succeeded"
    assert agent_calls("clean")["run"] == 6
    before = agent_calls("clean")

    second = await launch_one(reuse_of(request))

    assert second.status == "succeeded"
    assert second.run_dir != first.run_dir
    assert Path(second.run_dir).parent == Path(first.run_dir).parent
    assert agent_calls("clean") == before, "a clean reused run must run nothing again"
    old, new = details(first.run_dir), details(second.run_dir)
    assert set(new) == {"t000", "t001", "t002"}
    assert new == old, "reused records are copied unchanged"
    assert {r["_dir"] for r in new.values()} == {"normal"}
    assert read_json(Path(second.run_dir) / "metrics.json") == read_json(Path(first.run_dir) / "metrics.json")
    assert second.metrics == first.metrics
    assert f"reuse: from {first.run_dir}" in notes(second.run_dir)
    assert checkpoints(second.run_dir) == {}
    assert run_info(second.run_dir)["status"] == "succeeded"


# -- (b) FATAL tasks without retry budget -------------------------------------


async def test_fatal_tasks_are_reused_unchanged_without_retry_budget(autojump_clock, tmp_path: Path):
    request = fake_request(
        "fatal0",
        log="fatal0",
        benchmark={"tasks": 3},
        harness={"script": {"t001": {"run": ["fatal"]}}},
        execution=_execution(2, max_retries=0),
        output_root=tmp_path,
    )
    first = await launch_one(request)
    assert first.status == "failed"
    old = details(first.run_dir)
    assert old["t001"]["_dir"] == "fatal"
    before = agent_calls("fatal0")

    second = await launch_one(reuse_of(request))

    assert agent_calls("fatal0") == before, "max_retries 0: a failed result is reused, not run again"
    new = details(second.run_dir)
    assert new == old
    assert new["t001"]["_dir"] == "fatal"
    assert second.status == "failed"
    metrics = read_json(Path(second.run_dir) / "metrics.json")
    assert metrics["evaluation_failed"] is True
    assert metrics == read_json(Path(first.run_dir) / "metrics.json")


# -- (c) FATAL tasks with retry budget ----------------------------------------


async def test_only_retryable_attempts_run_again_as_one_retry_of_the_budget(autojump_clock, tmp_path: Path):
    request = fake_request(
        "fatal2",
        log="fatal2",
        benchmark={"tasks": 4},
        harness={
            "script": {
                # attempt 0 fine, attempt 1 FATAL; its retry (the 3rd run call) succeeds
                "t001": {"run": ["ok", "fatal"]},
                # attempt 0 FATAL, so attempt 1 never ran (the task was settled)
                "t002": {"run": ["fatal"]},
                # FATAL every time: the reuse run spends the whole budget
                "t003": {"run": ["fatal", "fatal", "fatal", "fatal"]},
            }
        },
        execution=_execution(2, max_retries=0),
        output_root=tmp_path,
    )
    first = await launch_one(request)
    old = details(first.run_dir)
    assert {t: r["_dir"] for t, r in old.items()} == {
        "t000": "normal",
        "t001": "fatal",
        "t002": "fatal",
        "t003": "fatal",
    }
    assert sorted(_attempts(old["t002"])) == [0]
    since = len(call_log("fatal2").calls)

    retry_budget = attrs.evolve(request.execution, max_retries=2)
    second = await launch_one(reuse_of(request, execution=retry_budget))

    new = details(second.run_dir)
    # Untouched: a clean task and the clean attempt of a failed task.
    assert started_attempts("fatal2", "t000", since) == []
    assert new["t000"] == old["t000"]
    assert started_attempts("fatal2", "t001", since) == [1]
    assert _attempts(new["t001"])[0] == _attempts(old["t001"])[0]
    # The retried attempt used one retry of the current budget.
    assert _attempts(new["t001"])[1]["retries"] == 1
    assert _attempts(new["t001"])[1]["status"] == "completed"
    assert new["t001"]["_dir"] == "normal"
    # The FATAL attempt is retried; the attempt the FATAL stopped runs fresh.
    assert sorted(started_attempts("fatal2", "t002", since)) == [0, 1]
    assert _attempts(new["t002"])[0]["retries"] == 1
    assert _attempts(new["t002"])[1]["retries"] == 0
    assert new["t002"]["_dir"] == "normal"
    # Still FATAL: the resumed try was retry 1, so one more retry was left (of 2).
    assert started_attempts("fatal2", "t003", since) == [0, 0]
    assert _attempts(new["t003"])[0]["retries"] == 2
    assert new["t003"]["_dir"] == "fatal"
    assert (Path(second.run_dir) / "tasks" / "t003" / "attempt-0" / "retries").is_dir()
    assert not (Path(second.run_dir) / "details" / "fatal" / "t001.json").exists()


async def test_a_resumed_attempt_with_a_budget_of_one_is_not_retried_again(autojump_clock, tmp_path: Path):
    request = fake_request(
        "fatal1",
        log="fatal1",
        benchmark={"tasks": 1},
        harness={"script": {"t000": {"run": ["fatal", "fatal", "fatal"]}}},
        execution=_execution(1, max_retries=0),
        output_root=tmp_path,
    )
    await launch_one(request)
    since = len(call_log("fatal1").calls)
    second = await launch_one(reuse_of(request, execution=_execution(1, max_retries=1)))
    assert started_attempts("fatal1", "t000", since) == [0]
    record = details(second.run_dir)["t000"]
    assert record["_dir"] == "fatal"
    assert _attempts(record)[0]["retries"] == 1


# -- (d) ERROR and the current retry patterns ---------------------------------


async def test_errors_matching_the_current_patterns_rerun_and_others_are_reused(autojump_clock, tmp_path: Path):
    request = fake_request(
        "errors",
        log="errors",
        benchmark={"tasks": 3},
        harness={"script": {"t001": {"run": ["error:rate_limited"]}, "t002": {"run": ["error:bad_output"]}}},
        execution=_execution(1, max_retries=0),
        output_root=tmp_path,
    )
    first = await launch_one(request)
    old = details(first.run_dir)
    assert old["t001"]["_dir"] == old["t002"]["_dir"] == "error"
    since = len(call_log("errors").calls)

    execution = _execution(1, max_retries=1, retry_pattern_list=["rate_limit"])
    second = await launch_one(reuse_of(request, execution=execution))

    new = details(second.run_dir)
    assert started_attempts("errors", "t001", since) == [0]
    assert _attempts(new["t001"])[0]["retries"] == 1
    assert new["t001"]["_dir"] == "normal"
    assert started_attempts("errors", "t002", since) == []
    assert new["t002"] == old["t002"]
    assert started_attempts("errors", "t000", since) == []


async def test_errors_are_reused_when_no_pattern_is_set(autojump_clock, tmp_path: Path):
    request = fake_request(
        "nopattern",
        log="nopattern",
        benchmark={"tasks": 2},
        harness={"script": {"t001": {"run": ["error:rate_limited"]}}},
        execution=_execution(1, max_retries=0),
        output_root=tmp_path,
    )
    first = await launch_one(request)
    before = agent_calls("nopattern")
    second = await launch_one(reuse_of(request, execution=_execution(1, max_retries=3)))
    assert agent_calls("nopattern") == before
    assert details(second.run_dir) == details(first.run_dir)


# -- (e) evaluation-only restore ----------------------------------------------


@pytest.mark.parametrize("mode", ["none", "fresh"])
async def test_an_evaluation_failure_reuses_the_saved_run_result(autojump_clock, tmp_path: Path, mode: str):
    request = fake_request(
        "evalonly",
        log="evalonly",
        benchmark={
            "tasks": 2,
            "plan": {"evaluation_environment_mode": mode},
            "script": {"t001": {"evaluate": ["fatal:judge_failed"]}},
        },
        execution=_execution(1, max_retries=0),
        output_root=tmp_path,
    )
    first = await launch_one(request)
    old = details(first.run_dir)
    assert old["t001"]["_dir"] == "fatal"
    assert _attempts(old["t001"])[0]["status"] == "eval_error"
    log = call_log("evalonly")
    since = len(log.calls)
    opens_before = log.count("open", "t001")

    second = await launch_one(reuse_of(request, execution=_execution(1, max_retries=1)))

    new_calls = [c for c in log.calls[since:] if c.task_id == "t001"]
    phases = [c.phase for c in new_calls]
    # The agent did not run again: no prepare, no harness session, no run.
    for phase in ("prepare", "start_session", "run", "collect"):
        assert phase not in phases, f"{phase} ran again in mode {mode}: {phases}"
    evaluations = [c for c in new_calls if c.phase == "evaluate"]
    assert len(evaluations) == 1
    if mode == "none":
        assert evaluations[0].detail["with_env"] is False
        assert log.count("open", "t001") == opens_before
    else:  # fresh: only the evaluation Environment is reopened
        assert evaluations[0].detail["with_env"] is True
        assert log.count("open", "t001") == opens_before + 1
    new = details(second.run_dir)
    attempt = _attempts(new["t001"])[0]
    assert attempt["status"] == "completed"
    assert attempt["retries"] == 1
    assert attempt["values"] == {"score": 1.0}
    assert attempt["run_result"] == _attempts(old["t001"])[0]["run_result"]
    assert new["t001"]["_dir"] == "normal"
    assert new["t000"] == old["t000"]
    assert not log.live_sessions()


async def test_an_evaluation_failure_in_reuse_mode_reruns_the_whole_attempt(autojump_clock, tmp_path: Path):
    # The control for the test above: mode ``reuse`` evaluates in the task
    # Environment, so its retry (and its reuse) runs the agent again.
    request = fake_request(
        "evalreuse",
        log="evalreuse",
        benchmark={"tasks": 1, "script": {"t000": {"evaluate": ["fatal:judge_failed"]}}},
        execution=_execution(1, max_retries=0),
        output_root=tmp_path,
    )
    await launch_one(request)
    since = len(call_log("evalreuse").calls)
    second = await launch_one(reuse_of(request, execution=_execution(1, max_retries=1)))
    assert started_attempts("evalreuse", "t000", since) == [0]
    assert details(second.run_dir)["t000"]["_dir"] == "normal"


# -- (f) an interrupted run resumes only its missing attempts ------------------

# Mock seconds per attempt (the harness run sleeps that long), and what the
# first run has finished when it is cancelled at t=25: d all three attempts
# (a record), b two, c one, a none.
_DURATIONS = {"a": 30, "b": 12, "c": 20, "d": 5}
_CUT_AT = 25


def _interruptible(name: str, tmp_path: Path):
    script = {task: {"run": [f"sleep:{d}"] * 9} for task, d in _DURATIONS.items()}
    return fake_request(
        name,
        log=name,
        benchmark={"tasks": list(_DURATIONS)},
        harness={"script": script},
        execution=_execution(3),
        output_root=tmp_path,
    )


async def _cancelled_first_run(request, tmp_path: Path) -> Path:
    with trio.move_on_after(_CUT_AT) as scope:
        await launch_one(request)
    assert scope.cancelled_caught
    [run_dir] = (tmp_path / request.name).iterdir()
    assert run_info(run_dir)["status"] == "cancelled"
    assert checkpoints(run_dir) == {"b": {0, 1}, "c": {0}}
    assert set(details(run_dir)) == {"d"}
    assert not call_log(request.name).live_sessions()
    return run_dir


async def test_an_interrupted_run_resumes_only_the_missing_attempts(autojump_clock, tmp_path: Path):
    request = _interruptible("cut", tmp_path)
    first_dir = await _cancelled_first_run(request, tmp_path)
    saved = {
        (data["task_id"], data["record"]["attempt"]): data["record"]
        for data in map(read_json, first_dir.glob("tasks/*/attempt-*/checkpoint.json"))
    }
    since = len(call_log("cut").calls)

    second = await launch_one(reuse_of(request))

    assert second.status == "succeeded"
    new_starts = {t: sorted(started_attempts("cut", t, since)) for t in _DURATIONS}
    assert new_starts == {"a": [0, 1, 2], "b": [2], "c": [1, 2], "d": []}
    not_checkpointed = 3 * len(_DURATIONS) - len(saved) - 3  # d has a record of all 3
    new_runs = [c for c in call_log("cut").calls[since:] if c.phase == "run"]
    assert len(new_runs) == not_checkpointed == 6
    new = details(second.run_dir)
    for task in _DURATIONS:
        assert sorted(_attempts(new[task])) == [0, 1, 2], task
        assert new[task]["_dir"] == "normal"
    for (task, index), record in saved.items():
        assert _attempts(new[task])[index] == record, "a checkpointed attempt is kept as it was"
    assert checkpoints(second.run_dir) == {}


async def test_an_interrupted_reuse_run_keeps_what_it_reused(autojump_clock, tmp_path: Path):
    # Run 1 is cut with checkpoints; run 2 reuses them and is cut again before
    # any of those tasks finished. Run 3, reusing run 2, must still not run an
    # attempt that run 1 finished: run 2 has to carry what it reused.
    request = _interruptible("cut2", tmp_path)
    first_dir = await _cancelled_first_run(request, tmp_path)
    saved = {(t, i) for t, indices in checkpoints(first_dir).items() for i in indices}
    since = len(call_log("cut2").calls)

    def second_started() -> bool:
        return started_attempts("cut2", "b", since) == [2] and started_attempts("cut2", "c", since) == [1]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(launch_one, reuse_of(request))
        # Cut run 2 once it started its tasks. Checkpoints only: the clock does
        # not move meanwhile, so no task can finish, however long the run's
        # own work in threads takes in real time.
        real_deadline = time.monotonic() + 60
        while not second_started():
            assert time.monotonic() < real_deadline, "run 2 did not start b and c"
            await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    # Run 2 queued its tasks and started them (b on its attempt 2, c on its 1),
    # and finished none of them.
    [second_dir] = [d for d in (tmp_path / "cut2").iterdir() if d != first_dir]
    assert started_attempts("cut2", "b", since) == [2]
    assert started_attempts("cut2", "c", since) == [1]
    assert details(second_dir).keys() == {"d"}
    since = len(call_log("cut2").calls)

    third = await launch_one(reuse_of(request))

    assert third.status == "succeeded"
    for task, index in saved:
        assert index not in started_attempts("cut2", task, since), f"{task} attempt {index} ran twice"
    assert started_attempts("cut2", "d", since) == []
    new = details(third.run_dir)
    for task in _DURATIONS:
        assert sorted(_attempts(new[task])) == [0, 1, 2], task


async def test_a_reuse_run_stopped_while_it_prepared_is_skipped(autojump_clock, tmp_path: Path):
    # Run 2 is stopped before it queued any task (here: while its benchmark
    # loads tasks; a SIGKILL may also hit it while it copies what it reuses).
    # It ran nothing, so the next reuse takes run 1, not the empty run 2.
    request = fake_request("prep", log="prep", benchmark={"tasks": 3}, output_root=tmp_path)
    first = await launch_one(request)
    slow = attrs.evolve(
        request,
        benchmark=ComponentRef("fake-bench", {"log": "prep", "tasks": 3, "script": {"*": {"load_tasks": ["ok", "hang"]}}}),
    )
    with trio.move_on_after(1) as scope:
        # A script in its config makes it another experiment: reused anyway.
        await launch_one(reuse_of(slow, reuse_anyway=True))
    assert scope.cancelled_caught
    [second_dir] = [d for d in (tmp_path / "prep").iterdir() if str(d) != first.run_dir]
    assert run_info(second_dir)["status"] == "cancelled"
    before = agent_calls("prep")

    third = await launch_one(reuse_of(request))

    assert agent_calls("prep") == before
    assert details(third.run_dir) == details(first.run_dir)
    text = notes(third.run_dir)
    assert f"reuse: from {first.run_dir}" in text
    assert f"skipped {second_dir}" in text


# -- (g) another benchmark, another task set ----------------------------------


async def test_a_run_of_another_benchmark_is_not_reused(autojump_clock, tmp_path: Path):
    request = fake_request("other", log="other", benchmark={"tasks": 2}, output_root=tmp_path)
    first = await launch_one(request)
    free = fake_request("other", log="other", harness_free=True, benchmark={"tasks": 2}, output_root=tmp_path)
    before = call_log("other").count("run")

    with pytest.raises(agentcompass.ConfigError) as caught:
        await launch_one(reuse_of(free))

    assert call_log("other").count("run") == before, "nothing may run"
    text = str(caught.value)
    assert "'fake-bench'" in text and "'fake-free-bench'" in text and "--reuse-anyway" in text
    assert str(first.run_dir) in text
    assert [p.name for p in (tmp_path / "other").iterdir()] == [Path(first.run_dir).name]


async def test_a_changed_task_set_reuses_only_the_selected_tasks(autojump_clock, tmp_path: Path):
    request = fake_request("subset", log="subset", benchmark={"tasks": 4}, output_root=tmp_path)
    first = await launch_one(request)
    before = agent_calls("subset")

    second = await launch_one(reuse_of(request, task_ids=["t001", "t002"]))

    assert agent_calls("subset") == before
    new, old = details(second.run_dir), details(first.run_dir)
    assert set(new) == {"t001", "t002"}
    assert new["t001"] == old["t001"] and new["t002"] == old["t002"]
    assert "2 task(s)" in notes(second.run_dir) and "ignored" in notes(second.run_dir)
    assert read_json(Path(second.run_dir) / "metrics.json")["series"]["score"]["total"] == 2


async def test_a_grown_task_set_runs_only_the_new_tasks(autojump_clock, tmp_path: Path):
    request = fake_request("grow", log="grow", benchmark={"tasks": ["t000", "t001"]}, output_root=tmp_path)
    await launch_one(request)
    since = len(call_log("grow").calls)
    grown = attrs.evolve(
        request, benchmark=ComponentRef("fake-bench", {"log": "grow", "tasks": ["t000", "t001", "t002"]})
    )
    # The task list is benchmark config, so this is another experiment: reused anyway.
    second = await launch_one(reuse_of(grown, reuse_anyway=True))
    assert [c.task_id for c in call_log("grow").calls[since:] if c.phase == "run"] == ["t002"]
    assert set(details(second.run_dir)) == {"t000", "t001", "t002"}


# -- (h) an explicit RUN_DIR ---------------------------------------------------


async def test_reuse_of_an_explicit_run_dir(autojump_clock, tmp_path: Path):
    good = fake_request("explicit", log="explicit", benchmark={"tasks": 2}, output_root=tmp_path)
    bad = attrs.evolve(
        good, harness=ComponentRef("fake-harness", {"log": "explicit", "script": {"t001": {"run": ["fatal"] * 9}}})
    )
    run_a = await launch_one(good)
    run_b = await launch_one(bad)
    assert details(run_b.run_dir)["t001"]["_dir"] == "fatal"
    before = agent_calls("explicit")

    # The default source is the latest run (b; its scripted harness config
    # makes it another experiment, so reused anyway) ...
    latest = await launch_one(reuse_of(good, reuse_anyway=True))
    assert f"reuse: from {run_b.run_dir}" in notes(latest.run_dir)
    assert details(latest.run_dir)["t001"]["_dir"] == "fatal"
    # ... an explicit RUN_DIR picks another one (a), though later runs exist.
    chosen = await launch_one(reuse_of(good, Path(run_a.run_dir)))
    assert f"reuse: from {run_a.run_dir}" in notes(chosen.run_dir)
    assert chosen.status == "succeeded"
    assert details(chosen.run_dir) == details(run_a.run_dir)
    assert agent_calls("explicit") == before


# -- (i) sessions left open are reaped, with the Environment's config ----------

_reaped_by: list[str] = []


@agentcompass.register
class ConfigReapEnvironment(FakeEnvironment):
    """``fake-env`` that records the ``log`` config of the instance reaping:
    a provider may need its settings (a server URL, a root) to find a sandbox."""

    id = "reuse-config-reap-env"

    async def reap(self, handle: dict) -> None:
        _reaped_by.append(self.options.log)
        await super().reap(handle)


async def test_sessions_left_open_are_reaped_with_the_environment_config(autojump_clock, tmp_path: Path):
    _reaped_by.clear()
    request = attrs.evolve(
        fake_request("reap", log="reap", benchmark={"tasks": 2}, output_root=tmp_path),
        # A failed close leaves the session journalled as opened (a leak to reap).
        environment=ComponentRef("reuse-config-reap-env", {"log": "reap", "script": {"t001": {"close": ["raise"]}}}),
    )
    first = await launch_one(request)
    assert call_log("reap").live_sessions(), "the failed close should have left a sandbox"
    before = agent_calls("reap")

    second = await launch_one(reuse_of(request))

    assert _reaped_by == ["reap"]
    assert not call_log("reap").live_sessions()
    assert "reaped 1 session(s)" in notes(second.run_dir)
    assert agent_calls("reap") == before
    assert details(second.run_dir) == details(first.run_dir)
