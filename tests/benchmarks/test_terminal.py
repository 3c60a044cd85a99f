"""The ``terminal`` benchmark and the ``oracle`` harness, end to end on ``local``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from _terminal_tasks import make_task

from agentcompass.benchmarks.terminal import TerminalBenchmark
from agentcompass.environments.local import LocalEnvironment
from agentcompass.harnesses.oracle import OracleHarness
from agentcompass.runtime import (
    ComponentError,
    ComponentRef,
    Evaluation,
    ExecutionPlan,
    IssueError,
    NetworkPolicy,
    PreparedTask,
    RunBudget,
    RunRequest,
    RunResult,
    TaskSpec,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash tasks")

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "benchmarks_data" / "terminal-smoke"
SMOKE_IDS = sorted(d.name for d in SMOKE.iterdir() if d.is_dir())
WRONG_SOLUTION = "reverse-lines"  # solve.sh is deliberately wrong
NO_REWARD = "make-dirs"  # test.sh deliberately writes no reward
HANG_GUARD = 60
BUDGET = RunBudget(30)


def request_for(path: Path | str, harness: str = "oracle", **config: str) -> RunRequest:
    return RunRequest(
        name="t",
        benchmark=ComponentRef("terminal", {"path": str(path), **config}),
        environment=ComponentRef("local"),
        harness=ComponentRef(harness),
    )


def _plan(task: TaskSpec, request: RunRequest | None = None) -> ExecutionPlan:
    request = request or request_for(SMOKE)
    return ExecutionPlan(task_id=task.task_id, attempt=0, environment=request.environment, harness=request.harness)


async def run_oracle(
    task: TaskSpec, request: RunRequest, tmp_path: Path, budget: RunBudget = BUDGET, fresh: bool = False
) -> tuple[PreparedTask, RunResult, Evaluation]:
    """prepare, run the oracle and evaluate (in the same sandbox, or a fresh one), then close."""
    benchmark, harness = TerminalBenchmark(request.benchmark.config), OracleHarness({})
    provider = LocalEnvironment({"root": str(tmp_path / "sandboxes")})
    plan = _plan(task, request)
    with trio.fail_after(HANG_GUARD):
        env = await provider.open(provider.build_config(plan), NetworkPolicy())
        try:
            prepared = await benchmark.prepare_task(task, env, request, benchmark.plan(task, request))
            session = await harness.start_session(prepared, env, None, plan)
            try:
                run_result = await harness.run_task(session, prepared, budget)
            finally:
                await harness.close_session(session)
            if not fresh:
                return prepared, run_result, await benchmark.evaluate(prepared, run_result, env, request)
        finally:
            await env.close()
        eval_env = await provider.open(None, NetworkPolicy())
        try:
            return prepared, run_result, await benchmark.evaluate(prepared, run_result, eval_env, request)
        finally:
            await eval_env.close()


async def load(path: Path | str, **config: str) -> list[TaskSpec]:
    request = request_for(path, **config)
    return await TerminalBenchmark(request.benchmark.config).load_tasks(request)


# -- loading and planning -----------------------------------------------------


async def test_load_tasks_on_the_smoke_data(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)  # a relative path resolves against the working directory
    tasks = await load("benchmarks_data/terminal-smoke")
    ids = [t.task_id for t in tasks]
    assert len(ids) >= 10 and ids == sorted(ids) == SMOKE_IDS
    by_id = {t.task_id: t for t in tasks}
    assert by_id["word-count"].category == "text-processing"
    assert by_id["fix-off-by-one"].category == "debugging"
    assert by_id["hello-file"].category is None
    hello = by_id["hello-file"]
    assert hello.data["dir"] == str(SMOKE / "hello-file")
    assert hello.data["instruction"].startswith("# Create a greeting file")
    json.dumps([t.metadata for t in tasks])  # task specs must serialize


async def test_plan_takes_timeouts_from_task_toml(tmp_path: Path):
    make_task(tmp_path, "bare", "true\n", solve_sh=None)
    timed = make_task(tmp_path, "timed", "true\n", solve_sh=None)
    (timed / "task.toml").write_text("[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 15.5\n")
    request = request_for(tmp_path, eval_mode="fresh")
    benchmark = TerminalBenchmark(request.benchmark.config)
    bare, timed_task = await benchmark.load_tasks(request)
    assert benchmark.plan(bare, request) == {"evaluation_environment_mode": "fresh"}
    assert benchmark.plan(timed_task, request) == {
        "evaluation_environment_mode": "fresh",
        "run_timeout_seconds": 120.0,
        "evaluation_timeout_seconds": 15.5,
    }


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda task: (task / "tests" / "test.sh").unlink(), "no tests/test.sh"),
        (lambda task: (task / "instruction.md").unlink(), "no instruction.md"),
        (lambda task: (task / "task.toml").write_text("[agent\n"), "invalid task.toml"),
        (lambda task: (task / "task.toml").write_text("[agent]\ntimeout_sec = -1\n"), "positive number"),
    ],
)
async def test_load_tasks_rejects_a_broken_task(tmp_path: Path, damage, message: str):
    damage(make_task(tmp_path, "broken", "true\n", solve_sh=None))
    with pytest.raises(ComponentError, match=f"'broken'.*{message}"):
        await load(tmp_path)


async def test_load_tasks_rejects_a_missing_or_empty_directory(tmp_path: Path):
    with pytest.raises(ComponentError, match="does not exist"):
        await load(tmp_path / "missing")
    with pytest.raises(ComponentError, match="no task directories"):
        await load(tmp_path)


def test_config_is_checked():
    with pytest.raises(ComponentError, match="eval_mode"):
        TerminalBenchmark({"path": "x", "eval_mode": "sometimes"})
    with pytest.raises(ComponentError, match="path"):
        TerminalBenchmark({})
    with pytest.raises(ComponentError, match="unknown key 'steps'"):
        OracleHarness({"steps": 3})


# -- the oracle on every smoke task -------------------------------------------


@pytest.mark.parametrize("task_id", SMOKE_IDS)
async def test_oracle_on_smoke_task(task_id: str, tmp_path: Path):
    request = request_for(SMOKE)
    task = next(t for t in await load(SMOKE) if t.task_id == task_id)
    prepared, run_result, evaluation = await run_oracle(task, request, tmp_path)

    assert prepared.input == {"instruction": task.data["instruction"]}
    assert run_result.issues == [] and run_result.artifacts["harness_command"]["exit_code"] == 0
    verifier = run_result.artifacts["verifier"]
    assert verifier["exit_code"] is not None and isinstance(verifier["stdout"], str)
    if task_id == WRONG_SOLUTION:
        assert evaluation.values == {"reward": 0.0, "passed": False} and evaluation.issues == []
    elif task_id == NO_REWARD:
        assert evaluation.values == {"reward": 0.0, "passed": False}
        [issue] = evaluation.issues
        assert (issue.severity, issue.phase, issue.code) == ("warning", "evaluate", "reward_missing")
    else:
        assert evaluation.values == {"reward": 1.0, "passed": True} and evaluation.issues == []
    assert not list((tmp_path / "sandboxes").iterdir())  # every sandbox was removed


# -- what the agent sees, and how rewards are read ----------------------------


async def test_agent_sees_neither_tests_nor_solution(tmp_path: Path):
    request = request_for(SMOKE, harness="some-agent")
    task = next(t for t in await load(SMOKE) if t.task_id == "fix-off-by-one")
    benchmark = TerminalBenchmark(request.benchmark.config)
    env = await LocalEnvironment({"root": str(tmp_path)}).open(None, NetworkPolicy())
    try:
        prepared = await benchmark.prepare_task(task, env, request, {})
        listing = await env.exec('ls -A "$APP_DIR" "$TESTS_DIR" "$SOLUTION_DIR"')
        assert "sum_range.py" in listing.stdout and "test.sh" not in listing.stdout
        assert "solve.sh" not in listing.stdout
        # So the oracle, run against such a request anyway, finds no solution.
        oracle = OracleHarness({})
        run = await oracle.run_task(await oracle.start_session(prepared, env, None, _plan(task)), prepared, RunBudget())
    finally:
        await env.close()
    assert [i.code for i in run.issues] == ["harness_no_solution"]


async def test_a_planted_reward_and_tampered_tests_are_discarded(tmp_path: Path):
    request = request_for(SMOKE, harness="some-agent")
    task = next(t for t in await load(SMOKE) if t.task_id == "hello-file")
    benchmark = TerminalBenchmark(request.benchmark.config)
    env = await LocalEnvironment({"root": str(tmp_path)}).open(None, NetworkPolicy())
    try:
        prepared = await benchmark.prepare_task(task, env, request, {})
        # The "agent" does not solve the task but plants a reward and a fake verifier.
        await env.write_file("/logs/verifier/reward.txt", "1\n")
        await env.write_file("/tests/test.sh", 'echo 1 > "$LOGS_DIR/verifier/reward.txt"\n')
        evaluation = await benchmark.evaluate(prepared, RunResult(), env, request)
    finally:
        await env.close()
    assert evaluation.values == {"reward": 0.0, "passed": False}


@pytest.mark.parametrize(
    "writes, values, code",
    [
        (  # reward.txt wins over reward.json
            "echo 0.25 > \"$v/reward.txt\"; echo '{\"reward\": 1}' > \"$v/reward.json\"",
            {"reward": 0.25, "passed": False},
            None,
        ),
        (  # every numeric key is a value of its own; reward is its "reward" key
            "echo '{\"reward\": 1, \"style\": 0}' > \"$v/reward.json\"",
            {"reward": 1.0, "style": 0.0, "passed": True},
            None,
        ),
        (  # else the mean of the keys
            "echo '{\"a\": 1, \"b\": 0}' > \"$v/reward.json\"",
            {"a": 1.0, "b": 0.0, "reward": 0.5, "passed": False},
            None,
        ),
        ('echo 2 > "$v/reward.txt"', {"reward": 2.0, "passed": True}, None),
        ('echo pass > "$v/reward.txt"', {"reward": 0.0, "passed": False}, "reward_unparseable"),
        ('echo nan > "$v/reward.txt"', {"reward": 0.0, "passed": False}, "reward_unparseable"),
        ("echo '[1]' > \"$v/reward.json\"", {"reward": 0.0, "passed": False}, "reward_unparseable"),
        ("echo '{\"reward\": \"1\"}' > \"$v/reward.json\"", {"reward": 0.0, "passed": False}, "reward_unparseable"),
        ("exit 1", {"reward": 0.0, "passed": False}, "reward_missing"),
    ],
)
async def test_reward_files(tmp_path: Path, writes: str, values: dict, code: str | None):
    # Like many Harbor verifiers, this one expects /logs/verifier to exist already.
    make_task(tmp_path / "tasks", "t", f'v="${{LOGS_DIR:-/logs}}/verifier"\n{writes}\n', solve_sh="true\n")
    [task] = await load(tmp_path / "tasks")
    _, _, evaluation = await run_oracle(task, request_for(tmp_path / "tasks"), tmp_path)
    assert evaluation.values == values
    assert [(i.severity, i.code) for i in evaluation.issues] == ([("warning", code)] if code else [])


async def test_fresh_evaluation_has_environment_and_tests_but_not_the_agents_work(tmp_path: Path):
    test_sh = (
        'v="${LOGS_DIR:-/logs}/verifier"; cd "${APP_DIR:-/app}"\n'
        'if [ -f given.txt ] && [ ! -f made.txt ]; then echo 1; else echo 0; fi > "$v/reward.txt"\n'
    )
    make_task(tmp_path / "tasks", "t", test_sh, solve_sh="touch made.txt\n", env_files={"given.txt": "x"})
    request = request_for(tmp_path / "tasks", eval_mode="fresh")
    [task] = await load(tmp_path / "tasks", eval_mode="fresh")
    _, _, same = await run_oracle(task, request, tmp_path)
    _, _, fresh = await run_oracle(task, request, tmp_path, fresh=True)
    assert same.values["reward"] == 0.0 and not same.issues  # made.txt is there
    assert fresh.values == {"reward": 1.0, "passed": True}


async def test_eval_mode_none_cannot_score(tmp_path: Path):
    [task] = [t for t in await load(SMOKE) if t.task_id == "hello-file"]
    request = request_for(SMOKE, eval_mode="none")
    prepared = PreparedTask(task=task, input={})
    with pytest.raises(IssueError) as exc:
        await TerminalBenchmark(request.benchmark.config).evaluate(prepared, RunResult(), None, request)
    assert (exc.value.severity, exc.value.code) == ("error", "scoring_failed")


async def test_oracle_timeout_is_an_error(tmp_path: Path):
    test_sh = 'echo 1 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'
    make_task(tmp_path / "tasks", "slow", test_sh, solve_sh="echo working; sleep 1000\n")
    [task] = await load(tmp_path / "tasks")
    _, run_result, _ = await run_oracle(task, request_for(tmp_path / "tasks"), tmp_path, budget=RunBudget(0.5))
    assert [(i.severity, i.phase, i.code) for i in run_result.issues] == [("error", "run", "harness_timeout")]
    assert run_result.output == "working\n"
    assert run_result.artifacts["harness_command"] == {"exit_code": None, "stdout": "working\n", "stderr": ""}


# -- preflight and what an attempt keeps -----------------------------------------


async def test_launch_checks_the_task_directories_before_writing(tmp_path: Path):
    import attrs

    import agentcompass
    from agentcompass import ComponentError, Orchestration

    make_task(tmp_path / "tasks", "one", solve_sh=None)
    request = attrs.evolve(request_for(tmp_path / "tasks"), output_root=tmp_path / "out", task_ids=["one", "two"])
    with pytest.raises(ComponentError, match=r"^requests\[0\] 't': benchmark 'terminal': task_ids: no task 'two'"):
        await agentcompass.launch(Orchestration([request]))
    assert not (tmp_path / "out").exists()
