"""The agent-bound scenario: ``react`` against a scripted loopback model server.

Each of N tasks is a ``react`` episode whose model answers every call after
L seconds: S ``bash`` tool calls running ``true`` in the ``local``
environment, then ``submit`` (S + 1 model calls per task). At concurrency C
the ideal wall time is ``ceil(N/C) x (S + 1) x L``; the run asks for
``C / L`` model calls per second, so the runtime's CPU per model call
(client, harness, engine, store, spawning the tool's process) decides how
close it gets. The server runs in a process of its own, so its CPU is not
counted; the tools' own ``bash`` processes are reported beside it.

The benchmark is ``noop-bench`` (no files to prepare or score), so what is
measured is the model path and the tool calls, not a verifier.
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

import agentcompass
import agentcompass.testing  # registers noop-bench
from agentcompass import ComponentRef, ModelSpec, Orchestration, RunRequest

__all__ = ["agent_bound", "start_model_server"]


def start_model_server(root: Path, steps: int, latency: float) -> tuple[subprocess.Popen[str], str]:
    """A model server process whose every conversation is ``steps`` bash
    calls of ``true`` then ``submit``, each reply after ``latency``; and its URL."""
    script = {
        "delay": latency,
        "default": [{"tool_call": {"name": "bash", "arguments": {"command": "true"}}}] * steps
        + [{"tool_call": {"name": "submit", "arguments": {"answer": "done"}}}],
    }
    path = Path(root) / "agent-script.json"
    path.write_text(json.dumps(script))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentcompass.testing.model_server", "--script", str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise RuntimeError("the model server did not start")
    return proc, url


def _request(root: Path, tasks: int, url: str, name: str) -> RunRequest:
    return RunRequest(
        name=name,
        benchmark=ComponentRef("noop-bench", {"tasks": tasks}),
        harness=ComponentRef("react", {"max_steps": 20}),
        environment=ComponentRef("local", {"root": str(root / "sandboxes")}),
        model=ModelSpec("scripted", base_url=url),
        output_root=root,
    )


def _usage(kind: int) -> float:
    usage = resource.getrusage(kind)
    return usage.ru_utime + usage.ru_stime


def agent_bound(
    root: Path, tasks: int = 500, concurrency: int = 100, latency: float = 0.1, steps: int = 4
) -> dict[str, Any]:
    """See the module docstring."""
    root = Path(root)
    (root / "sandboxes").mkdir(parents=True, exist_ok=True)
    server, url = start_model_server(root, steps, latency)
    try:
        # Warm-up: imports, registry, the first connections.
        trio.run(agentcompass.launch, Orchestration([_request(root, 4, url, "warmup")], task_concurrency=4))
        own0, kids0, t0 = _usage(resource.RUSAGE_SELF), _usage(resource.RUSAGE_CHILDREN), time.perf_counter()
        result = trio.run(
            agentcompass.launch, Orchestration([_request(root, tasks, url, "agent")], task_concurrency=concurrency)
        )
        wall = time.perf_counter() - t0
        own, kids = _usage(resource.RUSAGE_SELF) - own0, _usage(resource.RUSAGE_CHILDREN) - kids0
    finally:
        server.terminate()
        server.wait(timeout=10)
    metrics = result.requests[0].metrics
    calls = int(metrics.get("usage", {}).get("calls", 0))
    ideal = math.ceil(tasks / concurrency) * (steps + 1) * latency
    return {
        "status": result.status,
        "tasks": tasks,
        "concurrency": concurrency,
        "latency_s": latency,
        "steps": steps,
        "model_calls": calls,
        "expected_calls": tasks * (steps + 1),
        "wall_s": wall,
        "ideal_s": ideal,
        "wall_over_ideal": wall / ideal,
        "cpu_ms_per_call": own / max(calls, 1) * 1e3,
        "children_cpu_ms_per_call": kids / max(calls, 1) * 1e3,
    }
