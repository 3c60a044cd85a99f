"""The attempt engine (SPEC sections 5 and 6) driven by scripted fakes under a mock clock."""

from __future__ import annotations

import random

import attrs
import pytest
import trio
from _support import make_request, run_one

from agentcompass import ComponentRef, register
from agentcompass._orchestration._attempt import backoff_delay
from agentcompass.runtime._results import derive_status
from agentcompass.testing import FakeBenchmark, call_log, reset_logs


def only_failure(record):
    failures = [i for a in record.attempts for i in a.issues]
    assert len(failures) == 1, failures
    return failures[0]


# -- classification table ----------------------------------------------------

CLASSIFICATION = [
    # (component, phase, free, extra execution/bench, expected severity, issue phase, code)
    ("env", "open", False, {}, "fatal", "setup", "environment_failed"),
    ("env", "set_network_policy", False, {"bench": {"plan": {"run_network_policy": {"mode": "none"}}}}, "fatal", "setup", "environment_failed"),
    ("bench", "prepare", False, {}, "fatal", "setup", "setup_failed"),
    ("harness", "start_session", False, {}, "fatal", "setup", "setup_failed"),
    ("harness", "run", False, {}, "fatal", "run", "harness_crashed"),
    ("bench", "run", True, {}, "error", "run", "benchmark_run_failed"),
    ("bench", "collect", False, {}, "fatal", "collect", "collect_failed"),
    ("bench", "evaluate", False, {}, "error", "evaluate", "scoring_failed"),
    ("env", "close", False, {}, "warning", "cleanup", "cleanup_failed"),
    ("harness", "close_session", False, {}, "warning", "cleanup", "cleanup_failed"),
]


@pytest.mark.parametrize("component,phase,free,extra,severity,issue_phase,code", CLASSIFICATION)
async def test_unclassified_exceptions_follow_the_table(
    autojump_clock, component, phase, free, extra, severity, issue_phase, code
):
    script = {"*": {phase: ["raise"]}}
    kwargs = dict(extra)
    target = {"env": "env", "bench": "bench", "harness": "harness"}[component]
    kwargs[target] = {**kwargs.get(target, {}), "script": script}
    record, reporter, grants, _ = await run_one(make_request(free=free, **kwargs))
    issue = only_failure(record)
    assert (issue.severity, issue.phase, issue.code) == (severity, issue_phase, code)
    assert "\n" not in issue.message
    attempt = record.attempts[0]
    diagnostics = attempt.run_result.artifacts["execution_diagnostics"]
    assert "Traceback" in diagnostics[0]["traceback"] and "crashed" in diagnostics[0]["traceback"]
    assert record.severity == {"fatal": "fatal", "error": "error", "warning": "normal"}[severity]
    assert attempt.status == derive_status(attempt.issues)
    assert not grants.held
    if (component, phase) == ("env", "close"):
        # A failed close leaves the session "opened" in the journal, for reap.
        assert reporter.opened and not reporter.closed
    else:
        assert sorted(reporter.opened) == sorted(reporter.closed)


@register
class ExecInPrepare(FakeBenchmark):
    """prepare_task runs a command in the environment, as real benchmarks do."""

    id = "exec-in-prepare"

    async def prepare_task(self, task, env, request, benchmark_plan):
        await env.exec("true")
        return await super().prepare_task(task, env, request, benchmark_plan)


async def test_env_failure_inside_prepare_is_an_environment_failure(autojump_clock):
    request = attrs.evolve(
        make_request(env={"script": {"*": {"exec": ["raise"]}}}),
        benchmark=ComponentRef("exec-in-prepare", {"log": "t", "tasks": 1}),
    )
    record, *_ = await run_one(request)
    issue = only_failure(record)
    assert (issue.severity, issue.phase, issue.code) == ("fatal", "setup", "environment_failed")


async def test_issue_error_keeps_its_classification(autojump_clock):
    record, *_ = await run_one(make_request(harness={"script": {"*": {"run": ["error:model_refused"]}}}))
    issue = only_failure(record)
    assert (issue.severity, issue.phase, issue.code) == ("error", "run", "model_refused")
    # An ERROR does not stop the try: the output is still collected and scored.
    assert record.attempts[0].values == {"score": 1.0}
    assert record.attempts[0].status == "run_error"


async def test_analyzer_failure_is_recorded_and_changes_nothing(autojump_clock):
    request = make_request(analyzers=[ComponentRef("fake-analyzer", {"fail": True})])
    record, *_ = await run_one(request)
    attempt = record.attempts[0]
    assert attempt.issues == [] and attempt.status == "completed" and attempt.values == {"score": 1.0}
    assert "analyzer_failed" in attempt.analysis["fake-analyzer"]


async def test_analyzer_sees_the_evaluated_attempt(autojump_clock):
    record, *_ = await run_one(make_request(analyzers=[ComponentRef("fake-analyzer", {})]))
    assert record.attempts[0].analysis["fake-analyzer"] == {"seen_status": "completed"}


# -- timeouts ------------------------------------------------------------------


async def test_run_budget_and_hard_stop(autojump_clock):
    request = make_request(
        harness={"script": {"*": {"run": ["hang"]}}}, run_timeout_seconds=10, run_timer_compensation_seconds=5
    )
    start = trio.current_time()
    record, *_ = await run_one(request)
    issue = only_failure(record)
    assert (issue.severity, issue.code) == ("error", "run_failed")
    run_call = call_log("t").select("run")[0]
    assert run_call.detail["timeout_seconds"] == 10
    assert trio.current_time() - start == pytest.approx(15)
    # The agent's output may still be scored: collect and evaluate ran.
    assert call_log("t").count("evaluate") == 1


async def test_harness_timeout_is_an_error_that_is_scored(autojump_clock):
    record, *_ = await run_one(make_request(harness={"script": {"*": {"run": ["harness_timeout"]}}}))
    issue = only_failure(record)
    assert (issue.severity, issue.code) == ("error", "harness_timeout")
    assert record.attempts[0].values == {"score": 1.0}


async def test_evaluation_timeout_records_the_benchmark_values(autojump_clock):
    request = make_request(
        bench={"script": {"*": {"evaluate": ["hang"]}}, "evaluation_timeout_values": {"score": 0.0}},
        evaluation_timeout_seconds=7,
    )
    start = trio.current_time()
    record, *_ = await run_one(request)
    issue = only_failure(record)
    assert (issue.severity, issue.phase, issue.code) == ("error", "evaluate", "evaluation_timeout")
    assert record.attempts[0].values == {"score": 0.0}
    assert record.attempts[0].status == "eval_error"
    assert trio.current_time() - start == pytest.approx(7)


@pytest.mark.parametrize("hung", [("env", "open"), ("bench", "prepare"), ("harness", "start_session")])
async def test_setup_timeout(autojump_clock, hung):
    component, phase = hung
    request = make_request(**{component: {"script": {"*": {phase: ["hang"]}}}}, setup_timeout_seconds=3)
    start = trio.current_time()
    record, reporter, grants, _ = await run_one(request)
    issue = only_failure(record)
    assert (issue.severity, issue.code) == ("fatal", "setup_timeout")
    assert trio.current_time() - start == pytest.approx(3)
    assert call_log("t").count("run") == 0
    assert not grants.held and sorted(reporter.opened) == sorted(reporter.closed)


async def test_hanging_close_is_bounded_by_the_grace(autojump_clock):
    request = make_request(env={"script": {"*": {"close": ["hang"]}}})
    start = trio.current_time()
    record, reporter, grants, _ = await run_one(request, grace=4)
    issue = only_failure(record)
    assert (issue.severity, issue.phase, issue.code) == ("warning", "cleanup", "cleanup_failed")
    assert trio.current_time() - start == pytest.approx(4)
    assert record.attempts[0].status == "completed" and record.severity == "normal"
    assert not grants.held


async def test_cleanup_failure_never_replaces_the_original_failure(autojump_clock):
    request = make_request(
        harness={"script": {"*": {"run": ["raise"], "close_session": ["raise"]}}},
        env={"script": {"*": {"close": ["raise"]}}},
    )
    record, *_ = await run_one(request)
    codes = [(i.severity, i.code) for i in record.attempts[0].issues]
    assert codes[0] == ("fatal", "harness_crashed")
    assert codes.count(("warning", "cleanup_failed")) == 2
    assert record.severity == "fatal"


# -- network policies ------------------------------------------------------------


async def test_policy_switch_order_and_baseline_restore(autojump_clock):
    plan = {
        "run_network_policy": {"mode": "none"},
        "evaluation_network_policy": {"mode": "allowlist", "allow": ["judge.example"]},
    }
    record, *_ = await run_one(make_request(bench={"plan": plan}))
    assert record.attempts[0].status == "completed"
    log = call_log("t")
    (session,) = log.opened_sessions()
    assert log.select("open")[0].detail["policy"] == "full"
    assert log.policies_set(session) == ["none", "allowlist", "full"]
    order = [c.phase for c in log.calls if c.phase in ("set_network_policy", "run", "evaluate", "close", "close_session")]
    assert order == ["set_network_policy", "run", "close_session", "set_network_policy", "evaluate", "set_network_policy", "close"]


async def test_no_switch_when_the_run_policy_is_the_baseline(autojump_clock):
    await run_one(make_request())
    assert call_log("t").count("set_network_policy") == 0


@pytest.mark.parametrize("env", [{"switchable": False}, {"policies": ["full"]}])
async def test_a_provider_that_cannot_enforce_never_runs_the_phase(autojump_clock, env):
    request = make_request(env=env, bench={"plan": {"run_network_policy": {"mode": "none"}}})
    record, reporter, *_ = await run_one(request)
    issue = only_failure(record)
    assert issue.severity == "fatal" and issue.phase == "setup"
    log = call_log("t")
    assert log.count("open") == 0 and log.count("run") == 0 and not reporter.opened


# -- retries -----------------------------------------------------------------------


async def _retry_run(mode, fail_phase, component="bench", max_retries=1, **kwargs):
    bench = {"plan": {"evaluation_environment_mode": mode}}
    target = {"bench": bench, "env": {}, "harness": {}}
    target[component] = {**target[component], "script": {"*": {fail_phase: ["fatal"]}}}
    request = make_request(
        bench=target["bench"], env=target["env"], harness=target["harness"], max_retries=max_retries,
        retry_min_delay_seconds=1, retry_max_delay_seconds=2, **kwargs,
    )
    return await run_one(request)


@pytest.mark.parametrize(
    "mode,scope,opens,runs",
    [("reuse", "attempt", 2, 2), ("none", "evaluation", 1, 1), ("fresh", "evaluation_environment", 3, 1)],
)
async def test_evaluation_retry_scope_per_mode(autojump_clock, mode, scope, opens, runs):
    record, reporter, grants, _ = await _retry_run(mode, "evaluate")
    attempt = record.attempts[0]
    assert attempt.status == "completed" and attempt.retries == 1
    log = call_log("t")
    assert log.count("opened") == opens
    assert log.count("run") == runs
    assert log.count("evaluate") == 2
    assert [d["scope"] for d in reporter.discarded] == [scope]
    if mode == "none":
        assert [c.detail["with_env"] for c in log.select("evaluate")] == [False, False]
    assert sorted(reporter.opened) == sorted(reporter.closed) and not grants.held


@pytest.mark.parametrize("mode", ["reuse", "none", "fresh"])
async def test_setup_failure_reruns_the_whole_attempt_with_the_same_plan(autojump_clock, mode):
    record, reporter, *_ = await _retry_run(mode, "prepare")
    assert record.attempts[0].status == "completed"
    assert reporter.discarded[0]["scope"] == "attempt" and reporter.discarded[0]["stage"] == "setup"
    log = call_log("t")
    assert log.count("prepare") == 2 and log.count("plan") == 1
    # The discarded try keeps its redacted plan.
    assert reporter.discarded[0]["plan"]["evaluation_environment_mode"] == mode


async def test_error_retried_only_when_a_pattern_matches(autojump_clock):
    script = {"*": {"evaluate": ["error:judge_flaky"]}}
    record, reporter, *_ = await run_one(make_request(bench={"script": script}, max_retries=2))
    assert record.attempts[0].status == "eval_error" and not reporter.discarded
    reset_logs()
    record, reporter, *_ = await run_one(
        make_request(bench={"script": script}, max_retries=2, retry_pattern_list=["flaky"])
    )
    assert record.attempts[0].status == "completed"
    assert reporter.discarded[0]["matched_pattern"] == "flaky"


async def test_warnings_are_never_retried(autojump_clock):
    script = {"*": {"evaluate": ["warning"]}}
    record, reporter, *_ = await run_one(make_request(bench={"script": script}, max_retries=3, retry_pattern_list=[".*"]))
    assert record.attempts[0].status == "completed" and not reporter.discarded


async def test_retry_budget_is_shared_by_every_stage(autojump_clock):
    request = make_request(
        bench={"plan": {"evaluation_environment_mode": "fresh"}, "script": {"*": {"evaluate": ["fatal", "fatal", "ok"]}}},
        env={"script": {"*": {"open": ["fatal"]}}},
        max_retries=2, retry_min_delay_seconds=1, retry_max_delay_seconds=1,
    )
    record, reporter, *_ = await run_one(request)
    attempt = record.attempts[0]
    assert attempt.retries == 2
    assert [d["scope"] for d in reporter.discarded] == ["attempt", "evaluation_environment"]
    assert attempt.status == "eval_error" and record.severity == "fatal"
    assert call_log("t").count("evaluate") == 2


async def test_budget_resets_for_each_attempt(autojump_clock):
    request = make_request(
        k=3, harness={"script": {"*": {"run": ["raise", "ok", "raise", "ok", "raise", "ok"]}}},
        max_retries=1, retry_min_delay_seconds=1, retry_max_delay_seconds=1,
    )
    record, *_ = await run_one(request)
    assert [a.retries for a in record.attempts] == [1, 1, 1]
    assert all(a.status == "completed" for a in record.attempts)


def test_backoff_bounds_for_the_nth_retry():
    rng = random.Random(7)
    for n in range(1, 12):
        base = min(60, 5 * 2 ** (n - 1))
        delays = [backoff_delay(n, 5, 60, rng) for _ in range(200)]
        assert all(0.5 * base <= d <= base for d in delays)
        assert max(delays) > 0.9 * base and min(delays) < 0.6 * base


async def test_backoff_waits_after_cleanup_without_a_permit(autojump_clock):
    request = make_request(
        harness={"script": {"*": {"run": ["fatal", "fatal", "ok"]}}},
        max_retries=2, retry_min_delay_seconds=4, retry_max_delay_seconds=100,
    )
    from _support import make_context

    from agentcompass._orchestration._task import run_task

    ctx, reporter, grants = make_context(request)
    held_during_wait = []

    def on_event(kind, fields):
        if kind == "retry_wait":
            held_during_wait.append(len(grants.held))
            # the task environment of the discarded try is already closed
            assert sorted(reporter.opened) == sorted(reporter.closed)

    reporter.on_event = on_event
    (task,) = (await ctx.benchmark.load_tasks(request))[:1]
    start = trio.current_time()
    record = await run_task(ctx, task, [0])
    delays = [f["retry_delay_seconds"] for f in reporter.kinds("retry_wait")]
    assert delays == [f["retry_delay_seconds"] for f in reporter.kinds("attempt_retry")]
    assert held_during_wait == [0, 0]
    assert 2 <= delays[0] <= 4 and 4 <= delays[1] <= 8
    assert trio.current_time() - start == pytest.approx(sum(delays), abs=0.01)
    assert record.attempts[0].retries == 2


# -- attempts and strategies ---------------------------------------------------------


async def test_pass_stops_after_the_first_success(autojump_clock):
    request = make_request(k=5, strategy="pass", bench={"values": {"*": {"score": [0.0, False, 1.0, 1.0]}}})
    record, *_ = await run_one(request)
    assert [a.attempt for a in record.attempts] == [0, 1, 2]
    assert call_log("t").count("run") == 3


async def test_avg_runs_every_attempt(autojump_clock):
    request = make_request(k=4, bench={"values": {"*": {"score": [1.0, 0.0, 0.5, True]}}})
    record, reporter, *_ = await run_one(request)
    assert [a.values["score"] for a in record.attempts] == [1.0, 0.0, 0.5, True]
    # Every attempt but the last is checkpointed; the last goes straight
    # into the task record.
    assert [(t, r.attempt) for t, r in reporter.checkpoints] == [("t000", 0), ("t000", 1), ("t000", 2)]


async def test_a_fatal_left_invalidates_the_task(autojump_clock):
    request = make_request(k=3, env={"script": {"*": {"open": ["fatal"]}}})
    record, *_ = await run_one(request)
    assert record.severity == "fatal" and len(record.attempts) == 1


async def test_harness_free_path(autojump_clock):
    request = make_request(free=True, bench={"plan": {"run_network_policy": {"mode": "none"}}}, run_timeout_seconds=30)
    record, *_ = await run_one(request)
    assert record.attempts[0].status == "completed"
    log = call_log("t")
    assert log.count("start_session") == 0
    assert log.select("run")[0].detail["timeout_seconds"] == 30
    order = [c.phase for c in log.calls if c.phase in ("set_network_policy", "run")]
    assert order == ["set_network_policy", "run", "set_network_policy"]


async def test_recipes_fill_but_never_override_user_values(autojump_clock):
    recipe = ComponentRef("fake-recipe", {"set": {"run_timeout_seconds": 99, "evaluation_timeout_seconds": 42}})
    record, *_ = await run_one(make_request(recipes=[recipe], run_timeout_seconds=5))
    plan = record.attempts[0].plan
    assert plan.run_timeout_seconds == 5 and plan.evaluation_timeout_seconds == 42


async def test_keep_environment_skips_only_the_close(autojump_clock):
    record, reporter, grants, _ = await run_one(make_request(keep_environment=True))
    log = call_log("t")
    assert log.count("close") == 0 and len(log.live_sessions()) == 1
    assert not grants.held and record.attempts[0].status == "completed"


@register
class BrokenPlan(FakeBenchmark):
    id = "broken-plan"

    def plan(self, task, request):
        raise KeyError("no such setting")


async def test_a_plan_that_cannot_be_made_fails_the_attempt_not_the_run(autojump_clock):
    request = attrs.evolve(make_request(max_retries=2), benchmark=ComponentRef("broken-plan", {"log": "t", "tasks": 1}))
    record, reporter, *_ = await run_one(request)
    issue = only_failure(record)
    assert (issue.severity, issue.phase, issue.code) == ("fatal", "setup", "setup_failed")
    assert record.attempts[0].plan is None and not reporter.discarded
    assert call_log("t").count("open") == 0


async def test_an_attempt_that_failed_to_open_keeps_its_setup_timing(autojump_clock):
    record, *_ = await run_one(make_request(env={"script": {"*": {"open": ["fatal"]}}}))
    [attempt] = record.attempts
    assert record.severity == "fatal"
    assert "setup" in attempt.timings  # an invalidated task still says how long its setup ran
