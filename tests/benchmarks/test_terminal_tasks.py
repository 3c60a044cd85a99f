"""``terminal`` task directories as their authors wrote them (SPEC 10 "Terminal
tasks"): ``task.toml`` honoured, the older layout, literal paths, kept logs."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _common import only_run_dir, read_json
from _terminal_tasks import make_task

from agentcompass import ComponentRef, Planner, RunRequest, SandboxSpec
from agentcompass.benchmarks.terminal import TerminalBenchmark
from agentcompass.runtime import ComponentError

TOML = """version = "1.0"
[metadata]
category = "build"
difficulty = "hard"
[agent]
timeout_sec = 120
[verifier]
timeout_sec = 30
restart_environment = true
[verifier.env]
STRICT = "1"
[solution.env]
HINT = "yes"
[environment]
docker_image = "registry.example/t:1"
build_timeout_sec = 600
cpus = 2
memory = "2G"
storage = "10240M"
workdir = "/srv"
allow_internet = false
gpus = 0
[environment.env]
LANG = "C.UTF-8"
"""


def _request(path: Path, **config: object) -> RunRequest:
    return RunRequest(
        name="t",
        benchmark=ComponentRef("terminal", {"path": str(path), **config}),
        environment=ComponentRef("docker"),
        harness=ComponentRef("oracle"),
    )


async def _load(path: Path, **config: object) -> tuple[TerminalBenchmark, RunRequest, list]:
    request = _request(path, **config)
    benchmark = TerminalBenchmark(request.benchmark.config)
    return benchmark, request, await benchmark.load_tasks(request)


async def test_task_toml_makes_the_plan(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "t")
    (task_dir / "task.toml").write_text(TOML)
    benchmark, request, [task] = await _load(tmp_path)
    assert task.category == "build"
    assert task.metadata["metadata"] == {"category": "build", "difficulty": "hard"}
    assert task.metadata["unknown_keys"] == {"verifier.restart_environment": True, "environment.gpus": 0}
    plan = Planner(benchmark).plan(task, request, 0)
    assert plan.sandbox == SandboxSpec(
        image="registry.example/t:1",
        build_timeout_seconds=600.0,
        workdir="/srv",
        env={"LANG": "C.UTF-8"},
        cpus=2.0,
        memory_mb=2048,
        storage_mb=10240,
    )
    assert plan.run_network_policy.mode == "none"
    assert plan.baseline_network_policy.mode == "full"
    assert (plan.run_timeout_seconds, plan.evaluation_timeout_seconds) == (120.0, 30.0)
    assert task.data["verifier_env"] == {"STRICT": "1"} and task.data["solution_env"] == {"HINT": "yes"}


async def test_a_dockerfile_is_the_build_context_unless_host_userland(tmp_path: Path) -> None:
    make_task(tmp_path, "t", env_files={"Dockerfile": "FROM base\n", "data.txt": "x\n"})
    benchmark, request, [task] = await _load(tmp_path)
    plan = Planner(benchmark).plan(task, request, 0)
    assert plan.sandbox.build_context == tmp_path / "t" / "environment"
    assert plan.sandbox.features() == {"images"}
    benchmark, request, [task] = await _load(tmp_path, host_userland=True)
    assert Planner(benchmark).plan(task, request, 0).sandbox == SandboxSpec()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[environment]\nmemory = "lots"\n', "memory must be a size"),
        ("[environment]\ncpus = -1\n", "cpus must be a positive number"),
        ('[environment]\nallow_internet = "no"\n', "allow_internet must be true or false"),
        ('[environment]\nworkdir = "app"\n', "workdir must be an absolute path"),
        ('[environment.env]\n"A-B" = "1"\n', "is not a variable name"),
        ("environment = 3\n", r"\[environment\] in task.toml must be a table"),
    ],
)
async def test_a_bad_task_toml_names_the_task_and_key(tmp_path: Path, toml: str, message: str) -> None:
    (make_task(tmp_path, "bad") / "task.toml").write_text(toml)
    with pytest.raises(ComponentError, match=f"'bad'.*{message}"):
        await _load(tmp_path)


def test_unknown_keys_are_listed_once_per_request(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d", "e"):
        (make_task(tmp_path / "tasks", name) / "task.toml").write_text("[environment]\ngpus = 1\n[extra]\nx = 1\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        f"requests:\n  - name: r\n    benchmark: {{id: terminal, config: {{path: {tmp_path / 'tasks'}}}}}\n"
        "    harness: {id: oracle}\n    environment: {id: local}\n"
    )
    compass = str(Path(sys.executable).with_name("compass"))
    done = subprocess.run(
        [compass, "launch", str(config), "--output-root", str(tmp_path / "runs")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "does not use" in line]
    assert len(lines) == 1, done.stderr
    assert "environment.gpus (a, b, c and 2 more)" in lines[0] and "extra (a, b, c and 2 more)" in lines[0]


def _older_task(root: Path, name: str, tests_pass: bool) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text(
        "instruction: |-\n  Write /app/out.txt.\ncategory: files\ndifficulty: easy\n"
        "max_agent_timeout_sec: 100\nmax_test_timeout_sec: 50\nparser_name: pytest\n"
    )
    (task / "Dockerfile").write_text("FROM base\nWORKDIR /app\n")
    (task / "solution.sh").write_text('echo done > "${APP_DIR:-/app}/out.txt"\n')
    (task / "tests" / "expected.txt").write_text("done\n")
    check = 'cmp -s "$TEST_DIR/expected.txt" "${APP_DIR:-/app}/out.txt"' if tests_pass else "false"
    (task / "run-tests.sh").write_text(f"{check}\n")
    return task


async def test_the_older_layout_loads(tmp_path: Path) -> None:
    _older_task(tmp_path, "old", True)
    benchmark, request, [task] = await _load(tmp_path)
    assert task.data["layout"] == "terminal-bench"
    assert task.data["instruction"] == "Write /app/out.txt."
    assert task.category == "files"
    assert task.metadata["unknown_keys"] == {"parser_name": "pytest"}
    plan = Planner(benchmark).plan(task, request, 0)
    assert plan.sandbox.build_context == tmp_path / "old"
    assert (plan.run_timeout_seconds, plan.evaluation_timeout_seconds) == (100.0, 50.0)
    assert plan.benchmark_plan["required_features"] == ["literal_paths"]


async def test_an_alias_in_an_older_task_yaml_is_refused(tmp_path: Path) -> None:
    task = _older_task(tmp_path, "bomb", True)
    (task / "task.yaml").write_text("a: &a [x, x]\nb: [*a, *a]\ninstruction: hi\n")
    with pytest.raises(ComponentError, match="'bomb'.*aliases are not allowed"):
        await _load(tmp_path)


def _launch(tmp_path: Path, tasks: Path, environment: str = "local", benchmark: str = "") -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(
        "requests:\n  - name: r\n"
        f"    benchmark: {{id: terminal, config: {{path: {tasks}{benchmark}}}}}\n"
        f"    harness: {{id: oracle}}\n    environment: {{id: {environment}}}\n"
    )
    compass = str(Path(sys.executable).with_name("compass"))
    done = subprocess.run(
        [compass, "launch", str(config), "--output-root", str(tmp_path / "runs")], capture_output=True, text=True
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return only_run_dir(tmp_path / "runs", "r")


def test_literal_paths_under_local_are_refused_and_nothing_reaches_the_hosts_root(tmp_path: Path) -> None:
    marker = f"agentcompass-{uuid.uuid4().hex}"
    make_task(
        tmp_path / "tasks",
        "literal",
        test_sh=f"mkdir -p /logs/verifier && echo 1 > /logs/verifier/{marker}\n",
        solve_sh=f"mkdir -p /app && echo x > /app/{marker}\n",
    )
    run = _launch(tmp_path, tmp_path / "tasks")
    record = read_json(next((run / "details" / "fatal").glob("*.json")))
    issue = record["attempts"][0]["issues"][0]
    assert (issue["severity"], issue["code"]) == ("fatal", "environment_unsupported")
    assert "literal_paths" in issue["message"] and "'local'" in issue["message"]
    assert not Path("/app", marker).exists() and not Path("/logs/verifier", marker).exists()
    assert read_json(run / "metrics.json")["evaluation_failed"] is True


def test_the_verifiers_and_the_agents_logs_are_kept_and_every_reward_key_is_a_series(tmp_path: Path) -> None:
    make_task(
        tmp_path / "tasks",
        "logs",
        test_sh=(
            'v="${LOGS_DIR:-/logs}/verifier"; mkdir -p "$v/sub"\n'
            "echo '{\"reward\": 1, \"style\": 0.5}' > \"$v/reward.json\"\n"
            'echo detail > "$v/sub/report.txt"; mkfifo "$v/pipe"; ln -s /etc/passwd "$v/link"\n'
        ),
        solve_sh='a="${LOGS_DIR:-/logs}/agent"; mkdir -p "$a"; echo step1 > "$a/agent.log"\n',
    )
    run = _launch(tmp_path, tmp_path / "tasks")
    [attempt_dir] = (run / "tasks").glob("*/attempt-0")
    logs = attempt_dir / "logs"
    assert (logs / "verifier" / "sub" / "report.txt").read_text() == "detail\n"
    assert json.loads((logs / "verifier" / "reward.json").read_text()) == {"reward": 1, "style": 0.5}
    assert (logs / "agent" / "agent.log").read_text() == "step1\n"
    # Neither the FIFO nor the link was followed or kept.
    assert sorted(p.relative_to(logs).as_posix() for p in logs.rglob("*") if p.is_file()) == [
        "agent/agent.log",
        "verifier/reward.json",
        "verifier/sub/report.txt",
    ]
    record = read_json(next((run / "details" / "normal").glob("*.json")))
    attempt = record["attempts"][0]
    assert attempt["values"] == {"reward": 1.0, "style": 0.5, "passed": True}
    assert attempt["run_result"]["artifacts"]["logs"]["agent/agent.log"] == len("step1\n")
    series = read_json(run / "metrics.json")["series"]
    assert list(series) == ["reward", "passed", "style"]
    assert series["style"]["value"] == 0.5
