"""The converter: JSON round-trips of every contract value, secrets, strictness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcompass.runtime import _convert
from agentcompass.runtime._errors import ConfigError
from agentcompass.runtime._results import (
    AttemptRecord,
    Evaluation,
    ExecResult,
    Issue,
    OrchestrationResult,
    RequestResult,
    RunBudget,
    RunResult,
    TaskRecord,
)
from agentcompass.runtime._values import (
    AttemptsSpec,
    ComponentRef,
    ExecutionPlan,
    ExecutionSpec,
    GatewaySpec,
    Limits,
    ModelSpec,
    NetworkOverrides,
    NetworkPolicy,
    Orchestration,
    PreparedTask,
    Pricing,
    ProviderLimits,
    RunRequest,
    SandboxSpec,
    Secret,
    TaskSpec,
)

CLEAR = "sk-live-abcdef123456"


def roundtrip(value: Any) -> Any:
    data = json.loads(json.dumps(_convert.unstructure(value)))
    return _convert.converter.structure(data, type(value))


MODEL = ModelSpec(
    name="gpt-test",
    api="openai-chat",
    base_url="http://127.0.0.1:8000/v1",
    api_key=Secret.from_env("COMPASS_TEST_KEY"),
    params={"temperature": 0.2, "stop": ["\n"]},
    timeout_seconds=30.5,
    max_connections=8,
)
EXECUTION = ExecutionSpec(
    attempts=AttemptsSpec(k=3, strategy="pass"),
    max_retries=2,
    retry_pattern_list=["timeout", r"HTTP 5\d\d"],
    retry_min_delay_seconds=1.5,
    retry_max_delay_seconds=10,
    setup_timeout_seconds=60,
    run_timeout_seconds=600,
    run_timer_compensation_seconds=0,
    evaluation_timeout_seconds=120,
    keep_environment=True,
    evaluation_environment_mode="fresh",
    network=NetworkOverrides(run=NetworkPolicy("none"), evaluation=NetworkPolicy("allowlist", ("a:1",))),
)
REQUEST = RunRequest(
    name="smoke",
    benchmark=ComponentRef("terminal", {"path": "tasks", "nested": {"a": [1, 2]}}),
    environment=ComponentRef("local", {"root": "/tmp"}),
    harness=ComponentRef("oracle"),
    model=MODEL,
    recipes=[ComponentRef("recipe-a", {"x": 1})],
    analyzers=[ComponentRef("analyzer-a")],
    execution=EXECUTION,
    task_ids=["t1", "t/2"],
    limit=5,
    output_root=Path("out/runs"),
    reuse=Path("out/runs/smoke/1"),
)
PLAN = ExecutionPlan(
    task_id="t1",
    attempt=2,
    environment=ComponentRef("local"),
    harness=ComponentRef("oracle", {"steps": 3}),
    benchmark_plan={"eval_mode": "fresh"},
    evaluation_environment_mode="fresh",
    baseline_network_policy=NetworkPolicy("none"),
    run_network_policy=NetworkPolicy("allowlist", ("pypi.org", "example.com")),
    evaluation_network_policy=NetworkPolicy("full"),
    run_timeout_seconds=10.0,
    evaluation_timeout_seconds=None,
)
TASK = TaskSpec("t1", {"instruction": "do it"}, "easy", {"source": "x"})
ISSUE = Issue("error", "run", "harness_timeout", "agent ran out of time")
RUN_RESULT = RunResult(
    output={"answer": 42},
    trajectory=[{"role": "user", "content": "hi"}],
    usage={"tokens": 10},
    artifacts={"execution_diagnostics": "trace"},
    issues=[ISSUE],
    timings={"run": 1.25},
)
ATTEMPT = AttemptRecord(
    attempt=0,
    status="run_error",
    values={"reward": 0.5, "passed": False, "other": None},
    issues=[ISSUE],
    run_result=RUN_RESULT,
    plan=PLAN,
    analysis={"note": "ok"},
    retries=1,
    timings={"total": 3.0},
)

EXAMPLES = [
    Secret.from_env("COMPASS_TEST_KEY"),
    ComponentRef("terminal", {"path": "x"}),
    MODEL,
    ModelSpec(name="none-model", api="none"),
    AttemptsSpec(k=2, strategy="avg"),
    EXECUTION,
    NetworkOverrides(baseline=NetworkPolicy("full")),
    ExecutionSpec(),
    REQUEST,
    RunRequest(name="minimal", benchmark=ComponentRef("b"), environment=ComponentRef("e"), reuse=True),
    ProviderLimits(capacity=4, open_qps=2.5),
    Limits(model_calls=20, tokens=100000, cost_usd=0.5),
    ExecutionSpec(limits=Limits(cost_usd=1.25)),
    Pricing(input=3.0, output=15.0, cached_input=0.3),
    ModelSpec("priced", base_url="http://x/v1", pricing=Pricing(input=0.5, output=1.5)),
    Orchestration(
        requests=[REQUEST],
        task_concurrency=8,
        timeout_seconds=3600.0,
        cleanup_grace_seconds=12.5,
        providers={"local": ProviderLimits(2, 0.5)},
        plugins=["my_plugin", "/abs/plugin.py"],
    ),
    TASK,
    NetworkPolicy("allowlist", ("a.example",)),
    PLAN,
    SandboxSpec(
        image="python:3.12",
        build_context=Path("tasks/t/environment"),
        build_timeout_seconds=600.0,
        workdir="/app",
        env={"A": "1"},
        cpus=1.5,
        memory_mb=2048,
        storage_mb=4096,
        user="root",
    ),
    attrs.evolve(PLAN, sandbox=SandboxSpec(workdir="/work")),
    GatewaySpec(max_body_bytes=1024, max_json_depth=8, record_attempt_bytes=4096),
    ExecutionSpec(gateway=GatewaySpec(record_request_bytes=100, record_reply_bytes=200)),
    PreparedTask(TASK, {"prompt": "p"}, {"m": 1}),
    RUN_RESULT,
    RunResult(),
    ISSUE,
    Evaluation({"reward": 1.0, "passed": True}, [Issue("warning", "evaluate", "reward_missing")]),
    ExecResult(exit_code=1, stdout="out", stderr="err", timed_out=True),
    RunBudget(timeout_seconds=12.0),
    RunBudget(timeout_seconds=12.0, limits=Limits(tokens=10), deadline=1.7e9),
    ATTEMPT,
    TaskRecord("t1", "easy", [ATTEMPT, attrs.evolve(ATTEMPT, attempt=1, status="completed", issues=[])], "error"),
    RequestResult("smoke", "runs/smoke/1", "succeeded", {"reward": {"value": 0.5}}),
    OrchestrationResult("partial_failure", [RequestResult("a", "runs/a/1", "failed")], 1),
]


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda v: type(v).__name__)
def test_json_roundtrip(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPASS_TEST_KEY", CLEAR)
    assert roundtrip(value) == value


def test_every_contract_class_has_an_example() -> None:
    from agentcompass.runtime import _results, _values

    classes = {
        getattr(module, name)
        for module in (_values, _results)
        for name in module.__all__
        if isinstance(getattr(module, name), type) and attrs.has(getattr(module, name))
    }
    assert classes <= {type(v) for v in EXAMPLES}


def test_env_secret_roundtrip_reads_the_variable_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPASS_TEST_KEY", CLEAR)
    model = roundtrip(MODEL)
    assert model.api_key.env_var == "COMPASS_TEST_KEY"
    assert model.api_key.reveal() == CLEAR


def _clear_secret_values() -> list[Any]:
    secret = Secret(CLEAR)
    model = ModelSpec(name="m", api_key=secret)
    request = attrs.evolve(REQUEST, model=model, environment=ComponentRef("remote", {"token": secret}))
    return [model, request, Orchestration(requests=[request])]


@pytest.mark.parametrize("value", _clear_secret_values(), ids=lambda v: type(v).__name__)
def test_secret_never_serializes_in_clear(value: Any) -> None:
    assert CLEAR not in json.dumps(_convert.unstructure(value))
    assert CLEAR not in repr(value)
    assert CLEAR not in str(value)


def test_env_secret_serializes_as_reference_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPASS_TEST_KEY", CLEAR)
    data = json.dumps(_convert.unstructure(MODEL))
    assert CLEAR not in data
    assert "${COMPASS_TEST_KEY}" in data
    assert CLEAR not in repr(MODEL)


def test_secret_named_config_keys_become_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPASS_TEST_TOKEN", CLEAR)
    ref = _convert.structure(
        {"id": "remote", "config": {"token": "${COMPASS_TEST_TOKEN}", "url": "ws://x", "judge": {"api_key": "lit"}}},
        ComponentRef,
    )
    assert isinstance(ref.config["token"], Secret)
    assert ref.config["token"].reveal() == CLEAR
    assert ref.config["url"] == "ws://x"
    assert isinstance(ref.config["judge"]["api_key"], Secret)
    assert ref.config["judge"]["api_key"].reveal() == "lit"
    assert CLEAR not in json.dumps(_convert.unstructure(ref))
    assert roundtrip(ref) == ref


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "a", "benchmark": "b", "environment": "e", "execution": {"max_retriez": 1}},
         "unknown key 'max_retriez' @ $.execution"),
        ({"name": "a", "benchmark": "b", "environment": "e", "task_ids": "abc"}, "expected a list, got 'abc' @ $.task_ids"),
        ({"name": "a", "benchmark": "b", "environment": "e", "limit": "3"}, "expected an integer, got '3' @ $.limit"),
        ({"name": "a", "benchmark": "b", "environment": "e", "limit": True}, "expected an integer, got True @ $.limit"),
        ({"name": "a", "benchmark": "b", "environment": "e", "execution": {"attempts": {"strategy": "max"}}},
         "expected one of 'avg', 'pass', got 'max' @ $.execution.attempts.strategy"),
        ({"name": "a", "benchmark": "b", "environment": "e", "execution": 3}, "expected a mapping, got 3 @ $.execution"),
        ({"name": "a", "benchmark": ["b"], "environment": "e"}, "expected a component id or a mapping"),
        ({"benchmark": "b", "environment": "e"}, "required key missing @ $.name"),
        ({"name": "a", "benchmark": "b", "environment": "e", "reuse": 3}, "expected true, false or a run directory"),
    ],
)
def test_structure_errors_are_one_line_with_a_path(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _convert.structure(data, RunRequest)
    assert str(info.value) == message or message in str(info.value)
    assert "\n" not in str(info.value)


def test_component_ref_shorthand() -> None:
    assert _convert.structure("local", ComponentRef) == ComponentRef("local")


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | names


@given(
    st.builds(
        TaskSpec,
        task_id=names,
        data=st.dictionaries(names, scalars, max_size=3),
        category=st.none() | names,
        metadata=st.dictionaries(names, scalars, max_size=3),
    ),
    st.builds(
        ExecutionSpec,
        attempts=st.builds(AttemptsSpec, k=st.integers(1, 10), strategy=st.sampled_from(["avg", "pass"])),
        max_retries=st.integers(0, 5),
        retry_pattern_list=st.none() | st.lists(names, max_size=3),
        retry_min_delay_seconds=st.floats(0.1, 100),
        run_timeout_seconds=st.none() | st.floats(0.1, 1e6),
    ),
)
def test_roundtrip_property(task: TaskSpec, execution: ExecutionSpec) -> None:
    assert roundtrip(task) == task
    assert roundtrip(execution) == execution
