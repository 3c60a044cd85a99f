"""Running the ``installed`` harness through ``agentcompass.launch`` against a
scripted model server, and reading back what the run wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

import agentcompass
from agentcompass import (
    AttemptsSpec,
    ComponentRef,
    ExecutionSpec,
    Limits,
    ModelSpec,
    NetworkOverrides,
    NetworkPolicy,
    Orchestration,
    Pricing,
    RunRequest,
    Secret,
)
from agentcompass.testing.model_server import ModelServer

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "benchmarks_data" / "terminal-smoke"
#: A distinctive fake key: no file, environment or message may ever hold it.
KEY = "sk-fake-REAL-KEY-d41d8cd98f00b204e980"


async def launch(
    tmp_path: Path,
    server: ModelServer,
    harness: dict[str, Any],
    *,
    tasks: list[str],
    environment: str = "sandbox",
    env_config: dict[str, Any] | None = None,
    run_network: str | None = "none",
    max_retries: int = 0,
    concurrency: int = 2,
    name: str = "installed",
    api: str = "openai-chat",
    limits: Limits | None = None,
    pricing: Pricing | None = None,
) -> tuple[Any, Path]:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        if env_config is None:
            env_config = {"root": str(tmp_path / "sandboxes")} if environment == "local" else {}
        (tmp_path / "sandboxes").mkdir(exist_ok=True)
        request = RunRequest(
            name=name,
            benchmark=ComponentRef("terminal", {"path": str(SMOKE)}),
            harness=ComponentRef("installed", harness),
            environment=ComponentRef(environment, env_config),
            model=ModelSpec(name="scripted", base_url=url, api_key=Secret(KEY), api=api, pricing=pricing),
            execution=ExecutionSpec(
                attempts=AttemptsSpec(k=1),
                max_retries=max_retries,
                retry_min_delay_seconds=0.1,
                retry_max_delay_seconds=0.2,
                network=NetworkOverrides(run=NetworkPolicy(run_network) if run_network else None),
                limits=limits or Limits(),
            ),
            task_ids=tasks,
            output_root=tmp_path / "runs",
        )
        result = await agentcompass.launch(Orchestration([request], task_concurrency=concurrency))
        nursery.cancel_scope.cancel()
    return result, Path(result.requests[0].run_dir)


def details(run_dir: Path) -> dict[str, dict[str, Any]]:
    """task id -> its task record, whichever severity folder holds it."""
    found = {}
    for path in (run_dir / "details").glob("*/*.json"):
        found[path.stem] = json.loads(path.read_text())
    return found


def message_texts(server: ModelServer) -> list[str]:
    """Every message text of every request the server got, in order."""
    texts = []
    for request in server.requests:
        body = request.json or {}
        for message in body.get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            texts.append(content or "")
    return texts


def assistant_turns(request: Any) -> int:
    body = request.json or {}
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
