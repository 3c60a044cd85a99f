"""No secret ever appears in any file (SPEC section 8), nor on the console.

A run whose model ``api_key`` is a ``Secret`` read from an environment
variable, whose harness fails with that key, a ``Bearer`` token (a JSON Web
Token) and an ``api_key=...`` pair (a GitHub token) in its messages
(``secret_plugins.py``: credentials of recognised shapes), and whose
analyzer fails with the key. Then every byte under the output root (every
run directory, hidden files included) and, for the CLI run, everything
printed, is scanned for the three credential strings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import secret_plugins
from _reuse_support import details, launch_one, reuse_of

import agentcompass
from agentcompass import ComponentRef, ExecutionSpec, ModelSpec, RunRequest, Secret

REPO = Path(agentcompass.__file__).resolve().parents[1]
SECRET = "sk-live-0123456789abcdef"
ENV_VAR = "AC_TEST_SECRET"
FORBIDDEN = [SECRET, secret_plugins.BEARER, secret_plugins.API_KEY_VALUE]
TASKS = ["t000", "t001", "t002", "t003", "t004"]


def _leaks(root: Path) -> list[tuple[str, str]]:
    """(file, credential) for every credential found in a file under ``root``."""
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            data = path.read_bytes()
            found.extend((str(path), s) for s in FORBIDDEN if s.encode() in data)
    return found


def _files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def _check_the_run_failed_as_scripted(run_dir: Path) -> None:
    """The credentials were on their way to these files: the test is not vacuous."""
    records = details(run_dir)
    assert {t: r["_dir"] for t, r in records.items()} == {
        "t000": "fatal",
        "t001": "fatal",
        "t002": "error",
        "t003": "error",
        "t004": "normal",
    }
    messages = {t: [i["message"] for a in r["attempts"] for i in a["issues"]] for t, r in records.items()}
    assert any("failed with key" in m for m in messages["t000"]), messages
    assert any("Authorization" in m for m in messages["t001"]), messages
    assert any("api_key=" in m for m in messages["t002"]), messages
    assert list(run_dir.glob("tasks/t000/attempt-0/retries/*.json")), "the retried FATAL left no discarded try"
    diagnostics = records["t003"]["attempts"][0]["run_result"]["artifacts"]["execution_diagnostics"]
    assert "while sending" in json.dumps(diagnostics)
    analysis = records["t004"]["attempts"][0]["analysis"]
    assert "analyzer saw" in json.dumps(analysis)


def _request(tmp_path: Path) -> RunRequest:
    return RunRequest(
        name="secrets",
        benchmark=ComponentRef("fake-bench", {"log": "secrets", "tasks": TASKS}),
        environment=ComponentRef("fake-env", {"log": "secrets"}),
        harness=ComponentRef("secret-leak-harness", {}),
        model=ModelSpec("m", base_url="http://127.0.0.1:9/v1", api_key=Secret.from_env(ENV_VAR)),
        analyzers=[ComponentRef("secret-leak-analyzer", {"env": ENV_VAR})],
        execution=ExecutionSpec(max_retries=1, retry_min_delay_seconds=1, retry_max_delay_seconds=1),
        output_root=tmp_path / "out",
    )


async def test_no_credential_in_any_file_of_a_run_and_its_reuse(
    autojump_clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, SECRET)
    request = _request(tmp_path)
    first = await launch_one(request)
    _check_the_run_failed_as_scripted(Path(first.run_dir))
    # A reuse run copies records and checkpoints and retries the FATAL ones.
    await launch_one(reuse_of(request))

    assert _files(tmp_path / "out") > 20
    assert _leaks(tmp_path / "out") == []


def test_no_credential_in_any_file_or_output_of_a_cli_run(tmp_path: Path) -> None:
    config = {
        "plugins": [str(Path(secret_plugins.__file__).resolve())],
        "orchestration": {"task_concurrency": 2},
        "requests": [
            {
                "name": "secrets",
                "benchmark": {"id": "fake-bench", "config": {"tasks": TASKS}},
                "environment": {"id": "fake-env"},
                "harness": {"id": "secret-leak-harness"},
                "model": {"name": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": "${" + ENV_VAR + "}"},
                "analyzers": [{"id": "secret-leak-analyzer", "config": {"env": ENV_VAR}}],
                "execution": {"max_retries": 1, "retry_min_delay_seconds": 0.01, "retry_max_delay_seconds": 0.02},
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[ENV_VAR] = SECRET
    env["COMPASS_LOG_LEVEL"] = "debug"  # everything the console can print
    output_root = tmp_path / "out"
    command = [sys.executable, "-m", "agentcompass._cli", "launch", str(path), "--output-root", str(output_root)]
    outputs = []
    for extra in ([], ["--reuse"]):
        proc = subprocess.run([*command, *extra], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        assert proc.returncode == 1, proc.stderr.decode()  # FATAL tasks left
        outputs.append(proc.stdout + proc.stderr)

    [first, _] = sorted((output_root / "secrets").iterdir())
    _check_the_run_failed_as_scripted(first)
    assert (first / "log.jsonl").stat().st_size > 0
    assert _leaks(output_root) == []
    for output in outputs:
        assert output, "the CLI printed nothing: the scan would be vacuous"
        assert [s for s in FORBIDDEN if s.encode() in output] == []
