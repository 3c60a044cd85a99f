"""The ``compass`` command line, run as a real subprocess.

Commands that would start the engine run through a small driver script
that runs the CLI on a fake engine (``main(argv, engine=...)``), so these
tests pin the CLI's own behaviour: config errors, flag plumbing, exit codes and SIGINT handling.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from _common import wait_until

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]

COMPONENTS = """
import json, os
from agentcompass import register
from agentcompass.runtime._components import BaseBenchmark, BaseEnvironment, BaseHarness

@register
class CliBenchmark(BaseBenchmark):
    id = "cli-bench"

@register
class CliHarness(BaseHarness):
    id = "cli-harness"

@register
class CliEnvironment(BaseEnvironment):
    id = "cli-env"

    async def reap(self, handle):
        if handle.get("fail"):
            raise RuntimeError("cannot reach sandbox token=acgw-abc123abc123abc123abc123")
        with open(os.environ["CLI_REAP_LOG"], "a") as f:
            f.write(json.dumps({"handle": handle, "config": self.config}) + "\\n")
"""

CONFIG = """
plugins: [components.py]
requests:
  - name: smoke
    benchmark: cli-bench
    harness: cli-harness
    environment: cli-env
    execution: {max_retries: 1, retry_pattern_list: [timeout]}
  - name: second
    benchmark: cli-bench
    harness: cli-harness
    environment: cli-env
"""

DRIVER = """
import json, os, sys
from pathlib import Path
import trio
from agentcompass._cli import main
from agentcompass.runtime._convert import unstructure
from agentcompass.runtime._results import OrchestrationResult, RequestResult

async def fake_launch(orchestration, *, config_dir=None, show_progress=False, stop=None):
    out = Path(os.environ["FAKE_OUT"])
    out.write_text(json.dumps({"orchestration": unstructure(orchestration), "config_dir": str(config_dir)}))
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode != "ok":
        print("started", flush=True)  # the test waits for this line
        try:
            await stop.wait()  # the CLI's first signal
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(60 if mode == "slow-cleanup" else 0.1)
            Path(str(out) + ".cleaned").touch()
    results = []
    for request in orchestration.requests:
        run_dir = Path(request.output_root) / request.name / "run-1"
        run_dir.mkdir(parents=True)
        (run_dir / "summary.md").write_text(f"# {request.name}\\nreward: 1.0\\n")
        results.append(RequestResult(request.name, str(run_dir), "succeeded", {"reward": {"value": 1.0}}))
    code = int(os.environ.get("FAKE_EXIT", "0"))
    return OrchestrationResult("succeeded" if code == 0 else "failed", results, code)

main(sys.argv[1:], engine=fake_launch)
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "components.py").write_text(COMPONENTS)
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "driver.py").write_text(DRIVER)
    return tmp_path


def cli_env(workdir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["FAKE_OUT"] = str(workdir / "fake.json")
    env["CLI_REAP_LOG"] = str(workdir / "reaped.jsonl")
    env.update(extra)
    return env


def compass(workdir: Path, *args: str, fake: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(workdir / "driver.py")] if fake else [sys.executable, "-m", "agentcompass._cli"]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        cwd=workdir,
        env=cli_env(workdir, **env),
        timeout=120,
        check=False,
    )


def launched(workdir: Path) -> dict[str, Any]:
    return json.loads((workdir / "fake.json").read_text())


# ---------------------------------------------------------------- config errors: exit 2, one line, nothing created


BAD_CONFIGS = [
    (
        "unknown-key",
        CONFIG.replace("max_retries: 1", "max_retriez: 1"),
        (),
        "unknown key 'max_retriez' @ requests[0].execution",
    ),
    ("bad-regex", CONFIG.replace("[timeout]", "['(unclosed']"), (), "invalid regex '(unclosed'"),
    (
        "negative-delay",
        CONFIG,
        ("--set", "execution.retry_min_delay_seconds=-1"),
        "retry_min_delay_seconds must be a finite number > 0, got -1",
    ),
    (
        "unknown-id",
        CONFIG.replace("harness: cli-harness", "harness: cli-harnes", 1),
        (),
        "requests[0] 'smoke': unknown harness id 'cli-harnes'",
    ),
    ("broken-yaml", "requests:\n  - name: a\n\tbenchmark: b\n", (), "invalid YAML in config.yaml line 3"),
    ("non-mapping", "- a\n- b\n", (), "must be a mapping"),
    ("bad-set", CONFIG, ("--set", "execution.max_retries"), "invalid override 'execution.max_retries'"),
    (
        "unset-var",
        CONFIG.replace("name: smoke", "name: ${CLI_UNSET_VAR}"),
        (),
        "environment variable CLI_UNSET_VAR is not set @ requests[0].name",
    ),
    ("missing-file", None, (), "config file not found: config.yaml"),
]


@pytest.mark.parametrize("command", ["validate", "launch"])
@pytest.mark.parametrize(("case", "text", "args", "message"), BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_config_errors_exit_2_with_one_line(
    workdir: Path, command: str, case: str, text: str | None, args: tuple[str, ...], message: str
) -> None:
    config = workdir / "config.yaml"
    if text is None:
        config.unlink()
    else:
        config.write_text(text)
    extra = ("--output-root", "out") if command == "launch" else ()
    proc = compass(workdir, command, "config.yaml", *args, *extra)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (workdir / "out").exists()
    assert not (workdir / "runs").exists()


def test_validate_ok(workdir: Path) -> None:
    proc = compass(workdir, "validate", "config.yaml")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok: 2 request(s)"


def test_usage_error_exits_2(workdir: Path) -> None:
    proc = compass(workdir, "launch")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- launch flags and results


def test_launch_passes_flags_and_prints_results(workdir: Path) -> None:
    proc = compass(
        workdir,
        "launch",
        "config.yaml",
        "--output-root",
        "out",
        "--timeout-seconds",
        "90",
        "--task-concurrency",
        "3",
        "--set",
        "requests[1].limit=2",
        fake=True,
    )
    assert proc.returncode == 0, proc.stderr
    data = launched(workdir)
    orch = data["orchestration"]
    assert orch["timeout_seconds"] == 90
    assert orch["task_concurrency"] == 3
    assert [r["output_root"] for r in orch["requests"]] == ["out", "out"]
    assert [r["reuse"] for r in orch["requests"]] == [False, False]
    assert orch["requests"][1]["limit"] == 2
    assert orch["plugins"] == [str(workdir / "components.py")]
    assert data["config_dir"] == "."
    lines = proc.stdout.splitlines()
    assert lines[0] == "smoke: succeeded"
    assert "  run directory: out/smoke/run-1" in lines
    assert "second: succeeded" in lines and "  run directory: out/second/run-1" in lines
    assert "# second" not in proc.stdout  # the compact report, not summary.md


def test_launch_exit_code_is_the_result_s(workdir: Path) -> None:
    proc = compass(workdir, "launch", "config.yaml", fake=True, FAKE_EXIT="1")
    assert proc.returncode == 1


def test_reuse_without_a_value_means_latest(workdir: Path) -> None:
    proc = compass(workdir, "launch", "config.yaml", "--reuse", fake=True)
    assert proc.returncode == 0, proc.stderr
    assert [r["reuse"] for r in launched(workdir)["orchestration"]["requests"]] == [True, True]


def test_reuse_with_a_run_dir(workdir: Path) -> None:
    (workdir / "old-run").mkdir()
    proc = compass(workdir, "launch", "config.yaml", "--reuse", "old-run", "--task-concurrency", "1", fake=True)
    assert proc.returncode == 0, proc.stderr
    orch = launched(workdir)["orchestration"]
    assert [r["reuse"] for r in orch["requests"]] == ["old-run", "old-run"]
    assert orch["task_concurrency"] == 1


# ---------------------------------------------------------------- run


def test_run_builds_one_request(workdir: Path) -> None:
    proc = compass(
        workdir,
        "run",
        "--plugin",
        "components.py",
        "--benchmark",
        "cli-bench",
        "--benchmark-config",
        '{"path": "tasks"}',
        "--environment",
        "cli-env",
        "--harness",
        "cli-harness",
        "--model",
        "m1",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--api-key-env",
        "CLI_KEY",
        "--k",
        "2",
        "--max-retries",
        "3",
        "--task-id",
        "a",
        "--task-id",
        "b",
        "--limit",
        "1",
        "--output-root",
        "out",
        "--set",
        "execution.retry_min_delay_seconds=1",
        fake=True,
        CLI_KEY="sk-cli-secret-0123456789",
    )
    assert proc.returncode == 0, proc.stderr
    [request] = launched(workdir)["orchestration"]["requests"]
    assert request["name"] == "cli-bench-cli-harness"
    assert request["benchmark"] == {"id": "cli-bench", "config": {"path": "tasks"}}
    assert request["harness"]["id"] == "cli-harness"
    assert request["model"]["name"] == "m1"
    assert request["model"]["api_key"] == "${CLI_KEY}"
    assert request["execution"]["attempts"]["k"] == 2
    assert request["execution"]["max_retries"] == 3
    assert request["execution"]["retry_min_delay_seconds"] == 1
    assert request["task_ids"] == ["a", "b"]
    assert request["limit"] == 1
    assert "sk-cli-secret-0123456789" not in (workdir / "fake.json").read_text() + proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--api-key-env", "CLI_UNSET_KEY"), "environment variable CLI_UNSET_KEY is not set @ model.api_key"),
        (("--benchmark-config", "{oops"), "--benchmark-config is not valid JSON"),
        (("--harness", "none"), "harness 'none' needs a harness-free benchmark"),
        (("--k", "0"), "execution.attempts.k must be an integer >= 1, got 0"),
    ],
)
def test_run_errors(workdir: Path, args: tuple[str, ...], message: str) -> None:
    base = [
        "--plugin",
        "components.py",
        "--benchmark",
        "cli-bench",
        "--environment",
        "cli-env",
        "--harness",
        "cli-harness",
        "--model",
        "m",
        "--output-root",
        "out",
    ]
    proc = compass(workdir, "run", *base, *args)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert message in proc.stderr
    assert not (workdir / "out").exists()


# ---------------------------------------------------------------- SIGINT


def _start_hanging(workdir: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    stderr = workdir / "stderr.txt"
    proc = subprocess.Popen(
        [sys.executable, str(workdir / "driver.py"), "launch", "config.yaml"],
        cwd=workdir,
        env=cli_env(workdir, FAKE_MODE=mode),
        text=True,
        stdout=subprocess.PIPE,
        stderr=stderr.open("w"),
    )
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], 60)  # hang guard
    assert readable and proc.stdout.readline() == "started\n", stderr.read_text()
    return proc, stderr


def test_first_sigint_cancels_and_cleans_up(workdir: Path) -> None:
    proc, stderr = _start_hanging(workdir, "hang")
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130, stderr.read_text()
    assert "interrupted: cleaning up (Ctrl-C again to exit now)" in stderr.read_text()
    assert "Traceback" not in stderr.read_text()
    assert (workdir / "fake.json.cleaned").exists()


def test_second_sigint_exits_at_once(workdir: Path) -> None:
    proc, stderr = _start_hanging(workdir, "slow-cleanup")
    try:
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "interrupted" in stderr.read_text(), "the first SIGINT's line")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        assert time.monotonic() - started < 20
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130
    assert not (workdir / "fake.json.cleaned").exists()


# ---------------------------------------------------------------- show / reap


def _fake_run_dir(workdir: Path) -> Path:
    run_dir = workdir / "runs" / "smoke" / "run-1"
    (run_dir / "details" / "normal").mkdir(parents=True)
    (run_dir / "run_info.json").write_text(
        json.dumps(
            {
                "status": "succeeded",
                "request": {"name": "smoke", "environment": {"id": "cli-env", "config": {"root": "/sandboxes"}}},
            }
        )
    )
    (run_dir / "metrics.json").write_text(
        json.dumps({"series": {"reward": {"value": 0.25, "evaluated": 2, "total": 2}}, "evaluation_failed": False})
    )
    record = {
        "task_id": "task-alpha",
        "category": None,
        "severity": "normal",
        "attempts": [{"attempt": 0, "status": "completed", "values": {"reward": 0.5}}],
    }
    (run_dir / "details" / "normal" / "task-alpha.json").write_text(json.dumps(record))
    return run_dir


def test_show(workdir: Path) -> None:
    run_dir = _fake_run_dir(workdir)
    proc = compass(workdir, "show", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "succeeded" in proc.stdout
    assert "task-alpha" in proc.stdout
    assert "0.25" in proc.stdout  # the metric
    assert "0.5" in proc.stdout  # the attempt's value


def test_show_missing_run_dir(workdir: Path) -> None:
    proc = compass(workdir, "show", "nope")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: run directory not found: nope"


def test_reap_closes_sessions_left_open(workdir: Path) -> None:
    run_dir = _fake_run_dir(workdir)
    journal = run_dir / "sessions.jsonl"
    lines = [
        {"event": "opened", "session": "s1", "provider": "cli-env", "handle": {"dir": "/a"}},
        {"event": "opened", "session": "s2", "provider": "cli-env", "handle": {"dir": "/b"}},
        {"event": "closed", "session": "s1", "provider": "cli-env", "handle": {"dir": "/a"}},
        {"event": "opened", "session": "s3", "provider": "cli-env", "handle": {"dir": "/c"}},
    ]
    # The last line was cut short by the kill.
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"event": "clo')
    proc = compass(workdir, "reap", str(run_dir), "--plugin", "components.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "reaped 2 session(s)"
    reaped = [json.loads(line) for line in (workdir / "reaped.jsonl").read_text().splitlines()]
    assert [r["handle"] for r in reaped] == [{"dir": "/b"}, {"dir": "/c"}]
    assert reaped[0]["config"] == {"root": "/sandboxes"}  # the run's environment config
    again = compass(workdir, "reap", str(run_dir), "--plugin", "components.py")
    assert again.stdout.strip() == "reaped 0 session(s)"


def test_reap_failure_is_reported_and_kept_open(workdir: Path) -> None:
    run_dir = _fake_run_dir(workdir)
    (run_dir / "sessions.jsonl").write_text(
        json.dumps({"event": "opened", "session": "s1", "provider": "cli-env", "handle": {"fail": True}}) + "\n"
    )
    proc = compass(workdir, "reap", str(run_dir), "--plugin", "components.py")
    assert proc.returncode == 1
    assert "reaped 0 session(s), 1 failed" in proc.stdout
    assert "abc123" not in proc.stderr
    assert "closed" not in (run_dir / "sessions.jsonl").read_text()


def test_list_shows_builtins(workdir: Path) -> None:
    proc = compass(workdir, "list")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert rows[0] == ["KIND", "ID", "ORIGIN"]


def test_module_entry_point_is_the_console_script(workdir: Path) -> None:
    script = Path(sys.executable).with_name("compass")
    if not script.exists():
        pytest.skip("console script not installed")
    proc = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, env=cli_env(workdir), timeout=60, check=False
    )
    assert proc.returncode == 0
    assert textwrap.dedent("launch").strip() in proc.stdout


def test_importing_the_cli_loads_no_engine() -> None:
    # What makes ``compass --help`` slow: loaded only by the commands that need it.
    heavy = [
        "trio",
        "structlog",
        "httpx",
        "yaml",
        "rich",
        "agentcompass._orchestration",
        "agentcompass._store",
        "agentcompass._config",
        "agentcompass._registry",
        "importlib.metadata",
    ]
    code = f"import sys, agentcompass._cli; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_loads_no_engine_even_with_plugin_commands() -> None:
    # ``compass --help`` lists plugin command groups (``compass sandbox`` from the
    # remote plugin) by importing them: they must not pull in trio or their servers.
    pytest.importorskip("agentcompass_remote")
    heavy = ["trio", "trio_websocket", "httpx", "agentcompass._orchestration", "agentcompass_remote._server"]
    code = (
        "import sys, contextlib, io\n"
        "from agentcompass._cli import main\n"
        "sys.argv = ['compass', '--help']\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    main()\n"
        "assert 'sandbox' in out.getvalue(), out.getvalue()\n"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
