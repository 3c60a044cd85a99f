"""Running ``compass launch`` on either executor, for the tests that state a
semantic once and check it in process and on Ray (the ``executor`` fixture).

The components of ``faults/fault_plugins.py`` report what they did as
journal lines (``<event> <session> <pid> ...``) in one file: a Ray worker
cannot reach the test's memory, but it can append to a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
from _ray_support import RayCluster

import agentcompass

__all__ = ["PLUGIN", "Finished", "journal", "launch", "rec_request"]

REPO = Path(agentcompass.__file__).resolve().parents[1]
PLUGIN = Path(__file__).resolve().parent / "faults" / "fault_plugins.py"
HANG_GUARD = 180.0


@attrs.frozen
class Finished:
    """A finished ``compass launch``: its exit code, output and pid."""

    returncode: int
    stdout: str
    stderr: str
    pid: int


def rec_request(tmp_path: Path, name: str, tasks: list[str], **parts: Any) -> dict[str, Any]:
    """A request of ``rec-bench``, ``rec-env`` and ``rec-harness`` that all
    journal to ``tmp_path/journal.txt``; ``parts`` add config keys to
    ``benchmark``, ``environment``, ``harness`` or set ``execution``."""
    journal_path = str(tmp_path / "journal.txt")
    return {
        "name": name,
        "benchmark": {"id": "rec-bench", "config": {"tasks": tasks, "journal": journal_path, **parts.get("benchmark", {})}},
        "environment": {
            "id": "rec-env",
            "config": {"log": journal_path, "root": str(tmp_path / "sandboxes"), **parts.get("environment", {})},
        },
        "harness": {
            "id": "rec-harness",
            "config": {"runs_log": str(tmp_path / "runs.txt"), "journal": journal_path, **parts.get("harness", {})},
        },
        "execution": parts.get("execution", {}),
    }


def launch(
    tmp_path: Path, config: dict[str, Any], executor: RayCluster | None, *args: str, name: str = "run"
) -> Finished:
    """Run ``compass launch`` on ``config`` (plugins: ``fault_plugins.py``;
    output under ``tmp_path/out``) in process, or on the Ray cluster."""
    config = {"plugins": [str(PLUGIN)], **config}
    config["orchestration"] = dict(config.get("orchestration", {}))
    prefix: list[str] = []
    if executor is not None:
        config["orchestration"]["executor"] = executor.executor()
        prefix = executor.prefix
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("COMPASS_LOG_LEVEL", None)
    command = [*prefix, sys.executable, "-m", "agentcompass._cli", "launch", str(path)]
    command += ["--output-root", str(tmp_path / "out"), *args]
    # ``ip netns exec`` execs the command: the pid is compass's own.
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Finished(proc.returncode, stdout, stderr, proc.pid)


def journal(tmp_path: Path) -> list[list[str]]:
    """The journal's lines, split into fields, in the order they were written."""
    path = tmp_path / "journal.txt"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []
