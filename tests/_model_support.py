"""Running requests against a scripted loopback model server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import agentcompass
from agentcompass import ComponentRef, ExecutionSpec, ModelSpec, Orchestration, RunRequest, Secret
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import ModelServer

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "benchmarks_data" / "terminal-smoke"
QA = REPO / "benchmarks_data" / "qa" / "questions.jsonl"
KEY = "sk-test-model-key-0123456789"


def model(server: ModelServer, **kwargs: Any) -> ModelSpec:
    return ModelSpec("scripted-model", base_url=server.base_url, api_key=Secret(KEY), **kwargs)


def react_request(
    server: ModelServer,
    root: Path,
    task_ids: list[str],
    *,
    harness: dict[str, Any] | None = None,
    execution: ExecutionSpec | None = None,
    name: str = "react",
) -> RunRequest:
    return RunRequest(
        name=name,
        benchmark=ComponentRef("terminal", {"path": str(SMOKE)}),
        harness=ComponentRef("react", harness or {}),
        environment=ComponentRef("local", {"root": str(root / "sandboxes")}),
        model=model(server),
        execution=execution or ExecutionSpec(),
        task_ids=task_ids,
        output_root=root / "runs",
    )


async def launch(request: RunRequest, guard: float = 60, **orchestration: Any) -> tuple[Any, Path]:
    """Run ``request``; (the orchestration result, its run directory)."""
    with hang_guard(guard):
        result = await agentcompass.launch(Orchestration([request], **orchestration))
    return result, Path(result.requests[0].run_dir)


def details(run_dir: Path) -> dict[str, dict[str, Any]]:
    """task id -> its countable record, with its severity directory as ``"_dir"``."""
    found = {}
    for path in (run_dir / "details").glob("*/*.json"):
        record = json.loads(path.read_text())
        record["_dir"] = path.parent.name
        found[record["task_id"]] = record
    return found


def retries(run_dir: Path) -> list[dict[str, Any]]:
    """Every discarded try of the run."""
    return [json.loads(p.read_text()) for p in sorted((run_dir / "tasks").glob("*/attempt-*/retries/*.json"))]
