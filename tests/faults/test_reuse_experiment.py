"""Reuse only reuses the same experiment (SPEC section 8): benchmark (id and
config), harness (id and config), model (name, api, base_url, params),
environment id and attempts (k, strategy) must match the source run; another
is refused before anything runs (ConfigError, exit 2), unless reuse_anyway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import agentcompass
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, ModelSpec, Orchestration
from agentcompass._cli import _apply_cli
from agentcompass.testing import call_log, fake_request

REPO = Path(agentcompass.__file__).resolve().parents[1]
BASE_MODEL = ModelSpec("model-a", base_url="http://127.0.0.1:1/v1", params={"temperature": 0})


def _base(tmp_path: Path) -> agentcompass.RunRequest:
    return fake_request("exp", log="exp", benchmark={"tasks": 2}, model=BASE_MODEL, output_root=tmp_path)


async def _launch(request: agentcompass.RunRequest) -> Path:
    before = set((request.output_root / request.name).glob("*"))
    result = await agentcompass.launch(Orchestration([request], task_concurrency=2))
    assert result.status == "succeeded", result
    [run_dir] = set((request.output_root / request.name).glob("*")) - before
    return run_dir


def _runs() -> int:
    return call_log("exp").count("run")


DIFFERENT = [
    ("model.name", lambda r: attrs.evolve(r, model=attrs.evolve(BASE_MODEL, name="model-b"))),
    ("model.params", lambda r: attrs.evolve(r, model=attrs.evolve(BASE_MODEL, params={"temperature": 1}))),
    ("model.base_url", lambda r: attrs.evolve(r, model=attrs.evolve(BASE_MODEL, base_url="http://127.0.0.1:2/v1"))),
    (
        "harness.config",
        lambda r: attrs.evolve(
            r, harness=ComponentRef("fake-harness", {"log": "exp", "script": {"t9": {"run": ["ok"]}}})
        ),
    ),
    (
        "benchmark.config",
        lambda r: attrs.evolve(
            r,
            benchmark=ComponentRef("fake-bench", {"log": "exp", "tasks": 2, "categories": None, "metrics": ["score"]}),
        ),
    ),
    ("execution.attempts", lambda r: attrs.evolve(r, execution=ExecutionSpec(attempts=AttemptsSpec(k=2)))),
    ("execution.attempts", lambda r: attrs.evolve(r, execution=ExecutionSpec(attempts=AttemptsSpec(strategy="pass")))),
]


@pytest.mark.parametrize(("field", "change"), DIFFERENT)
async def test_another_experiment_is_refused_before_anything_runs(tmp_path: Path, field: str, change) -> None:
    base = _base(tmp_path)
    first = await _launch(base)
    ran = _runs()
    with pytest.raises(agentcompass.ConfigError) as caught:
        await agentcompass.launch(Orchestration([attrs.evolve(change(base), reuse=True)]))
    message = str(caught.value)
    assert f"another experiment ({field}: " in message and "--reuse-anyway" in message, message
    assert str(first) in message and "\n" not in message
    assert _runs() == ran  # nothing ran ...
    assert list((tmp_path / "exp").iterdir()) == [first]  # ... and no run directory was made


def test_the_cli_refuses_another_experiment_with_exit_2_and_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    request = {
        "name": "exp",
        "benchmark": {"id": "fake-bench", "config": {"tasks": 2}},
        "harness": {"id": "fake-harness"},
        "environment": {"id": "fake-env"},
        "model": {"name": "model-a", "base_url": "http://127.0.0.1:1/v1"},
        "output_root": "runs",
    }
    config.write_text(json.dumps({"plugins": ["agentcompass.testing"], "requests": [request]}))  # JSON is YAML
    first = _compass(tmp_path, "launch", "config.yaml")
    assert first.returncode == 0, first.stderr
    [source] = (tmp_path / "runs" / "exp").iterdir()

    second = _compass(tmp_path, "launch", "config.yaml", "--reuse", "--set", "model.name=model-b")

    assert second.returncode == 2, second.stdout + second.stderr
    assert second.stdout == ""
    [line] = second.stderr.splitlines()
    assert line.startswith("error: request 'exp': --reuse of ") and str(source.name) in line, line
    assert "(model.name: 'model-a' != 'model-b')" in line and "--reuse-anyway" in line, line
    assert list((tmp_path / "runs" / "exp").iterdir()) == [source]  # nothing written for it

    anyway = _compass(tmp_path, "launch", "config.yaml", "--reuse-anyway", "--set", "model.name=model-b")
    assert anyway.returncode == 0, anyway.stderr
    assert len(list((tmp_path / "runs" / "exp").iterdir())) == 2


def _compass(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("COMPASS_LOG_LEVEL", None)
    return subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=120, check=False,
    )


ALLOWED = [
    lambda r: attrs.evolve(
        r, execution=ExecutionSpec(max_retries=2, run_timeout_seconds=100, evaluation_timeout_seconds=9)
    ),
    lambda r: attrs.evolve(r, model=attrs.evolve(BASE_MODEL, timeout_seconds=5, max_connections=3)),
    lambda r: attrs.evolve(r, limit=1),
]


@pytest.mark.parametrize("change", ALLOWED)
async def test_the_same_experiment_with_other_settings_is_reused(tmp_path: Path, change) -> None:
    base = _base(tmp_path)
    await _launch(base)
    ran = _runs()
    run_dir = await _launch(attrs.evolve(change(base), reuse=True))
    info = json.loads((run_dir / "run_info.json").read_text())
    assert not [n for n in info.get("notes", []) if "another experiment" in n]
    assert _runs() == ran


async def test_reuse_anyway_reuses_another_experiment_and_records_it(tmp_path: Path) -> None:
    base = _base(tmp_path)
    await _launch(base)
    ran = _runs()
    other = attrs.evolve(base, model=attrs.evolve(BASE_MODEL, name="model-b"))
    [request] = _apply_cli(Orchestration([other]), None, None, None, None, reuse_anyway=True).requests
    assert request.reuse is True and request.reuse_anyway is True
    run_dir = await _launch(request)
    assert _runs() == ran
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["request"]["reuse_anyway"] is True
    [note] = [n for n in info["notes"] if "--reuse-anyway" in n]
    assert "model.name: 'model-a' != 'model-b'" in note
