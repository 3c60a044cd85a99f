"""The fake components: registration, call logging, sessions, config keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import agentcompass
from agentcompass import _registry
from agentcompass.runtime import (
    AttemptRecord,
    ComponentError,
    ExecutionPlan,
    FileRefusedError,
    IssueError,
    NetworkPolicy,
    RunBudget,
    RunResult,
    TaskSpec,
)
from agentcompass.testing import (
    Call,
    FakeAnalyzer,
    FakeBenchmark,
    FakeEnvironment,
    FakeHarness,
    FakeHarnessFreeBenchmark,
    FakeHarnessSession,
    FakeRecipe,
    FakeSession,
    call_log,
    fake_plan,
    fake_request,
    live_sandboxes,
    reset_logs,
)

NONE = NetworkPolicy("none")
FULL = NetworkPolicy("full")


async def open_session(
    env: FakeEnvironment | None = None, task_id: str = "t000", policy: NetworkPolicy = FULL
) -> FakeSession:
    env = env or FakeEnvironment({})
    return await env.open(env.build_config(fake_plan(task_id)), policy)


FAKES = [
    ("environment", "fake-env", FakeEnvironment),
    ("benchmark", "fake-bench", FakeBenchmark),
    ("benchmark", "fake-free-bench", FakeHarnessFreeBenchmark),
    ("harness", "fake-harness", FakeHarness),
    ("recipe", "fake-recipe", FakeRecipe),
    ("analyzer", "fake-analyzer", FakeAnalyzer),
]

#: In a fresh process: what importing ``agentcompass.testing`` registers
#: beyond the built-ins and the installed plugins.
REGISTERED_BY_IMPORT = """
from agentcompass import _registry

_registry.load_builtins()
before = {(r.kind, r.id) for r in _registry.registered()}
import agentcompass.testing
for r in _registry.registered():
    if (r.kind, r.id) not in before:
        print(r.kind, r.id, r.cls.__qualname__)
"""


def test_importing_registers_the_fakes() -> None:
    repo = Path(agentcompass.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", REGISTERED_BY_IMPORT], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    registered = {tuple(line.split()) for line in proc.stdout.splitlines()}
    assert {(kind, component_id, cls.__qualname__) for kind, component_id, cls in FAKES} <= registered


@pytest.mark.parametrize(("kind", "component_id", "cls"), FAKES)
def test_the_fakes_build_from_their_ids(kind: str, component_id: str, cls: type) -> None:
    assert _registry.resolve(kind, component_id) is cls
    assert isinstance(_registry.build(kind, component_id, {}), cls)


def test_unknown_config_key_names_the_component() -> None:
    with pytest.raises(ComponentError, match="fake-env.*unknown key 'polices'"):
        FakeEnvironment({"polices": ["full"]})


# -- call log and sessions ---------------------------------------------------


async def test_open_logs_before_and_after_and_hands_out_handles() -> None:
    first = await open_session(task_id="t000")
    second = await open_session(task_id="t001", policy=NONE)
    log = call_log()
    assert [(c.seq, c.phase, c.task_id, c.session) for c in log.calls] == [
        (0, "build_config", "t000", None),
        (1, "open", "t000", None),
        (2, "opened", "t000", 1),
        (3, "build_config", "t001", None),
        (4, "open", "t001", None),
        (5, "opened", "t001", 2),
    ]
    assert log.calls[4].detail == {"policy": "none", "action": "ok"}
    assert all(isinstance(c, Call) and c.component == "environment" for c in log.calls)
    assert first.handle == {"session": 1, "log": "default"}
    assert second.handle == {"session": 2, "log": "default"}
    assert log.opened_sessions() == [1, 2]
    assert log.live_sessions() == {1, 2}
    assert live_sandboxes() == {("default", 1), ("default", 2)}


async def test_failed_and_hung_opens_are_logged_and_leave_nothing(autojump_clock: trio.abc.Clock) -> None:
    env = FakeEnvironment({"script": {"*": {"open": ["fatal", "hang"]}}})
    with pytest.raises(IssueError):
        await open_session(env)
    with trio.move_on_after(10):
        await open_session(env)
    log = call_log()
    assert log.phases() == ["build_config", "open", "build_config", "open"]
    assert [c.detail["action"] for c in log.select("open")] == ["fatal", "hang"]
    assert log.opened_sessions() == []
    assert not log.live_sessions()


async def test_close_is_idempotent_and_counted() -> None:
    session = await open_session()
    await session.close()
    await session.close()
    await session.close()
    log = call_log()
    assert log.phases()[-3:] == ["close", "close_again", "close_again"]
    assert log.closed_sessions() == {1: 1}
    assert log.close_calls() == {1: 3}
    assert not log.live_sessions()


async def test_a_failed_close_leaks_until_reaped() -> None:
    env = FakeEnvironment({"script": {"*": {"close": ["fatal"]}}})
    session = await open_session(env)
    with pytest.raises(IssueError, match="fake close failed"):
        await session.close()
    await session.close()  # does not try again
    log = call_log()
    assert log.closed_sessions() == {1: 1}
    assert log.live_sessions() == {1}
    # Reaping from a fresh provider instance, as after a killed process.
    await FakeEnvironment({}).reap(session.handle)
    assert log.select("reap")[0].task_id == "t000"
    assert not log.live_sessions()
    await FakeEnvironment({}).reap(session.handle)  # idempotent


async def test_a_cancelled_close_leaks(autojump_clock: trio.abc.Clock) -> None:
    env = FakeEnvironment({"script": {"*": {"close": ["hang"]}}})
    session = await open_session(env)
    with trio.move_on_after(30, shield=True):
        await session.close()
    assert live_sandboxes() == {("default", 1)}


async def test_operations_after_close_raise_and_are_logged() -> None:
    session = await open_session()
    await session.close()
    with pytest.raises(IssueError, match="closed") as info:
        await session.exec("true")
    assert (info.value.severity, info.value.code) == ("fatal", "environment_failed")
    for call in (session.read_file("f"), session.write_file("f", b""), session.set_network_policy(FULL)):
        with pytest.raises(IssueError):
            await call
    assert call_log().select("exec")[0].detail["refused"] == "closed"


async def test_files_round_trip() -> None:
    session = await open_session()
    await session.write_file("a.txt", "h\u00e9")
    await session.write_file("b.bin", b"\x00")
    assert await session.read_file("a.txt") == "h\u00e9".encode()
    assert await session.read_file("b.bin") == b"\x00"
    with pytest.raises(FileNotFoundError):
        await session.read_file("missing")
    assert await session.read_file("a.txt", max_bytes=3) == "h\u00e9".encode()
    with pytest.raises(FileRefusedError, match="larger than 2 bytes"):
        await session.read_file("a.txt", max_bytes=2)
    assert call_log().select("read_file")[-1].detail["max_bytes"] == 2


async def test_set_network_policy_logs_and_refuses_what_it_cannot_enforce() -> None:
    env = FakeEnvironment({"policies": ["none", "full"]})
    session = await open_session(env)
    await session.set_network_policy(NONE)
    with pytest.raises(IssueError, match="cannot enforce") as info:
        await session.set_network_policy(NetworkPolicy("allowlist", ("pypi.org",)))
    assert (info.value.severity, info.value.code) == ("fatal", "environment_failed")
    await session.set_network_policy(FULL)
    assert call_log().policies_set(1) == ["none", "allowlist", "full"]
    assert call_log().select("set_network_policy")[1].detail["allow"] == ["pypi.org"]
    assert session.policy == FULL


async def test_unswitchable_session_keeps_its_policy() -> None:
    session = await open_session(FakeEnvironment({"switchable": False}))
    await session.set_network_policy(FULL)  # no change: fine
    with pytest.raises(IssueError, match="cannot switch"):
        await session.set_network_policy(NONE)


async def test_open_refuses_a_policy_it_cannot_enforce() -> None:
    env = FakeEnvironment({"policies": ["full"]})
    with pytest.raises(IssueError, match="cannot enforce"):
        await env.open({"task_id": "t000"}, NONE)
    assert not call_log().live_sessions()


# -- build_config --------------------------------------------------------------


def test_build_config_returns_the_task() -> None:
    assert FakeEnvironment({}).build_config(fake_plan("t007", 2)) == {"task_id": "t007", "attempt": 2}


@pytest.mark.parametrize(
    ("fields", "phase", "mode"),
    [
        ({"baseline_network_policy": "none"}, "baseline", "none"),
        ({"run_network_policy": {"mode": "allowlist", "allow": ["x.org"]}}, "run", "allowlist"),
        ({"evaluation_network_policy": "none"}, "evaluation", "none"),
    ],
)
def test_build_config_rejects_policies_it_cannot_enforce(
    fields: dict[str, Any], phase: str, mode: str
) -> None:
    env = FakeEnvironment({"policies": ["full"]})
    with pytest.raises(ComponentError) as info:
        env.build_config(fake_plan(**fields))
    message = str(info.value)
    assert "'fake-env'" in message
    assert f"{mode!r}" in message
    assert f"{phase} phase" in message


def test_build_config_rejects_switching_when_not_switchable() -> None:
    env = FakeEnvironment({"switchable": False})
    env.build_config(
        fake_plan(baseline_network_policy="none", run_network_policy="none", evaluation_network_policy="none")
    )
    with pytest.raises(ComponentError, match="'fake-env' cannot switch.*run=none"):
        env.build_config(fake_plan(run_network_policy="none"))


def test_evaluation_policy_is_ignored_without_an_evaluation_environment() -> None:
    env = FakeEnvironment({"switchable": False, "policies": ["full"]})
    plan = fake_plan(evaluation_environment_mode="none", evaluation_network_policy="none")
    assert env.build_config(plan) == {"task_id": "t000", "attempt": 0}
    with pytest.raises(ComponentError, match="evaluation phase"):
        env.build_config(attrs.evolve(plan, evaluation_environment_mode="fresh"))


# -- benchmarks ----------------------------------------------------------------


async def test_tasks_from_a_count_or_a_list() -> None:
    request = fake_request()
    assert [t.task_id for t in await FakeBenchmark({"tasks": 3}).load_tasks(request)] == [
        "t000",
        "t001",
        "t002",
    ]
    many = await FakeBenchmark({"tasks": 1001}).load_tasks(request)
    assert (many[0].task_id, many[-1].task_id) == ("t0000", "t1000")
    assert [t.task_id for t in await FakeBenchmark({"tasks": ["b", "a"]}).load_tasks(request)] == ["b", "a"]
    assert await FakeBenchmark({"tasks": 0}).load_tasks(request) == []
    assert call_log().count("load_tasks") == 4


async def test_categories() -> None:
    request = fake_request()
    tasks = await FakeBenchmark({"tasks": 5, "categories": "mod:2"}).load_tasks(request)
    assert [t.category for t in tasks] == ["c0", "c1", "c0", "c1", "c0"]
    tasks = await FakeBenchmark({"tasks": 2, "categories": {"t001": "hard"}}).load_tasks(request)
    assert [t.category for t in tasks] == [None, "hard"]


def test_metrics_and_timeout_values_shadow_the_class_vars() -> None:
    bench = FakeBenchmark({"metrics": ["reward", "passed"], "evaluation_timeout_values": {"reward": 0.0}})
    assert bench.metrics == ("reward", "passed")
    assert bench.evaluation_timeout_values == {"reward": 0.0}
    assert FakeBenchmark.metrics == ("score",)
    assert FakeBenchmark.evaluation_timeout_values == {}
    assert FakeBenchmark({}).metrics == ("score",)


def test_plan_converts_policies_and_fits_an_execution_plan() -> None:
    bench = FakeBenchmark(
        {
            "plan": {
                "evaluation_environment_mode": "fresh",
                "run_network_policy": {"mode": "allowlist", "allow": ["pypi.org"]},
                "difficulty": "hard",
            }
        }
    )
    task = TaskSpec("t000")
    part = bench.plan(task, fake_request())
    assert part["run_network_policy"] == NetworkPolicy("allowlist", ("pypi.org",))
    fields = {k: v for k, v in part.items() if k != "difficulty"}
    plan = attrs.evolve(fake_plan(), **fields)
    assert isinstance(plan, ExecutionPlan)
    assert plan.evaluation_environment_mode == "fresh"
    assert call_log().phases("t000") == ["plan"]


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"tasks": "3"}, "tasks"),
        ({"tasks": ["a", "a"]}, "unique"),
        ({"categories": "mod:x"}, "categories"),
        ({"values": {"*": {"score": "high"}}}, "values"),
        ({"plan": {"evaluation_environment_mode": "later"}}, "evaluation_environment_mode"),
        ({"plan": {"run_network_policy": {"mode": "some"}}}, "run_network_policy"),
        ({"metrics": []}, "metrics"),
    ],
)
def test_bad_benchmark_config(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ComponentError, match=match):
        FakeBenchmark(config)


async def test_evaluate_values_per_call_and_per_task() -> None:
    request = fake_request()
    bench = FakeBenchmark(
        {
            "tasks": 2,
            "metrics": ["score", "passed"],
            "values": {"*": {"score": [0.0, 0.5, 1.0], "passed": False}, "t001": {"passed": True}},
        }
    )
    t0, t1 = await bench.load_tasks(request)
    seen = []
    for _ in range(4):
        prepared = await bench.prepare_task(t0, None, request, {})  # type: ignore[arg-type]
        seen.append((await bench.evaluate(prepared, RunResult(), None, request)).values)
    assert seen == [
        {"score": 0.0, "passed": False},
        {"score": 0.5, "passed": False},
        {"score": 1.0, "passed": False},
        {"score": 1.0, "passed": False},  # the last entry repeats
    ]
    prepared = await bench.prepare_task(t1, None, request, {})  # type: ignore[arg-type]
    assert (await bench.evaluate(prepared, RunResult(), None, request)).values == {
        "score": 0.0,
        "passed": True,
    }


async def test_benchmark_phases_log_what_they_got() -> None:
    request = fake_request()
    bench = FakeBenchmark({})
    env = FakeEnvironment({})
    task = (await bench.load_tasks(request))[0]
    session = await open_session(env)
    prepared = await bench.prepare_task(task, session, request, {"difficulty": "hard"})
    assert prepared.task == task
    collected = await bench.collect_artifacts(prepared, RunResult(output="x"), session)
    assert collected.artifacts == {"collected": True}
    assert collected.output == "x"
    await bench.evaluate(prepared, collected, session, request)
    await bench.evaluate(prepared, collected, None, request)
    log = call_log()
    assert log.select("prepare")[0].detail["benchmark_plan"] == {"difficulty": "hard"}
    assert log.select("prepare")[0].session == 1
    assert [(c.session, c.detail["with_env"]) for c in log.select("evaluate")] == [(1, True), (None, False)]
    assert log.phases("t000", component="benchmark") == ["prepare", "collect", "evaluate", "evaluate"]


async def test_harness_free_run() -> None:
    request = fake_request(harness_free=True)
    bench = FakeHarnessFreeBenchmark({})
    task = (await bench.load_tasks(request))[0]
    session = await open_session()
    prepared = await bench.prepare_task(task, session, request, {})
    result = await bench.run_task(prepared, session, None, RunBudget(120))
    assert (result.output, result.usage) == ("answer", {"input_tokens": 10, "output_tokens": 5})
    run = call_log().select("run")[0]
    assert (run.component, run.session, run.detail["timeout_seconds"], run.detail["model"]) == (
        "benchmark",
        1,
        120,
        None,
    )


# -- harness, recipe, analyzer -------------------------------------------------


async def test_harness_logs_its_calls_with_the_env_session() -> None:
    request = fake_request()
    bench = FakeBenchmark({})
    harness = FakeHarness({})
    task = (await bench.load_tasks(request))[0]
    session = await open_session()
    prepared = await bench.prepare_task(task, session, request, {})
    harness_session = await harness.start_session(prepared, session, None, fake_plan(attempt=1))
    assert harness_session == FakeHarnessSession("t000", 1)
    result = await harness.run_task(harness_session, prepared, RunBudget(None))
    await harness.close_session(harness_session)
    assert (result.output, result.usage, result.issues) == (
        "answer",
        {"input_tokens": 10, "output_tokens": 5},
        [],
    )
    log = call_log()
    assert log.phases("t000", component="harness") == ["start_session", "run", "close_session"]
    assert {c.session for c in log.select(component="harness")} == {1}
    assert log.select("run")[0].detail["timeout_seconds"] is None
    assert log.select("start_session")[0].detail["attempt"] == 1


def test_recipe_sets_plan_fields() -> None:
    recipe = FakeRecipe({"set": {"run_network_policy": {"mode": "none"}, "run_timeout_seconds": 60}})
    plan = recipe.apply(fake_plan(), TaskSpec("t000"), fake_request())
    assert (plan.run_network_policy, plan.run_timeout_seconds) == (NONE, 60)
    with pytest.raises(ComponentError, match="'bogus' is not an ExecutionPlan field"):
        FakeRecipe({"set": {"bogus": 1}})


async def test_analyzer() -> None:
    record = AttemptRecord(0, "run_error")
    task = TaskSpec("t000")
    analyzer = FakeAnalyzer({})
    assert analyzer.applies_to(fake_request(), task)
    assert await analyzer.analyze(task, record) == {"seen_status": "run_error"}
    assert not FakeAnalyzer({"applies": False}).applies_to(fake_request(), task)
    with pytest.raises(RuntimeError, match="fake analyzer failed"):
        await FakeAnalyzer({"fail": True}).analyze(task, record)


async def test_reset_logs_forgets_everything() -> None:
    env = FakeEnvironment({"script": {"*": {"open": ["fatal"]}}})
    with pytest.raises(IssueError):
        await open_session(env)
    reset_logs()
    assert call_log().calls == []
    with pytest.raises(IssueError):  # the counter restarted too
        await open_session(env)
    reset_logs()
    await open_session(FakeEnvironment({}))
    assert call_log().opened_sessions() == [1]
