"""Secrets render as the README says: a ``${VAR}`` key is written as
``${VAR}``, never its value, and a request whose harness calls no model
does not need its key set."""

from __future__ import annotations

import textwrap
from pathlib import Path

from _cli_support import compass, make_task, only_run_dir

CONFIG = """
plugins: [model_harness.py]
requests:
  - name: keyed
    benchmark: {id: terminal, config: {path: tasks}}
    harness: oracle
    environment: local
    model: {name: gpt-x, base_url: "http://127.0.0.1:9/v1", api_key: "${MY_KEY}"}
    output_root: out
"""
# A harness that would call the model (uses_model keeps its default, True).
MODEL_HARNESS = """
from agentcompass import BaseHarness, register

@register
class ModelHarness(BaseHarness):
    id = "calls-model"
"""
SECRET = "sk-live-5f4e3d2c1b0a99887766"


def _project(tmp_path: Path) -> None:
    make_task(tmp_path / "tasks", "one")
    (tmp_path / "config.yaml").write_text(textwrap.dedent(CONFIG))
    (tmp_path / "model_harness.py").write_text(MODEL_HARNESS)


def test_env_reference_is_written_as_written(tmp_path: Path) -> None:
    _project(tmp_path)
    proc = compass(tmp_path, "launch", "config.yaml", env={"MY_KEY": SECRET})
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "out", "keyed")
    text = (run_dir / "run_info.json").read_text()
    assert '"api_key": "${MY_KEY}"' in text
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in proc.stdout + proc.stderr


def test_oracle_needs_no_key(tmp_path: Path) -> None:
    _project(tmp_path)
    validated = compass(tmp_path, "validate", "config.yaml", unset=("MY_KEY",))
    assert (validated.returncode, validated.stdout.strip()) == (0, "ok: 1 request(s)"), validated.stderr
    launched = compass(tmp_path, "launch", "config.yaml", unset=("MY_KEY",))
    assert launched.returncode == 0, launched.stderr


def test_a_model_calling_harness_needs_its_key(tmp_path: Path) -> None:
    _project(tmp_path)
    proc = compass(tmp_path, "validate", "config.yaml", "--set", "harness=calls-model", unset=("MY_KEY",))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: requests[0] 'keyed': environment variable MY_KEY is not set @ model.api_key"
