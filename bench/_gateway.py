"""The gateway scenario: the per-attempt cost of the model gateway and the
``installed`` harness, beside ``react``'s.

N tasks of ``noop-bench`` in the ``local`` environment, C at a time, twice:

- ``installed`` with ``noop-agent`` (:mod:`agentcompass.testing.noop_agent`):
  one agent process per attempt making 5 chat-completion calls through the
  attempt's gateway (a unix socket, the in-session forwarder, the shared
  client) to a scripted server answering each after L seconds;
- ``react`` with 5 model calls per attempt (4 ``bash true`` tool calls, then
  ``submit``) against the same kind of server.

Both make 5 model calls per attempt. Reported per attempt: the runtime's own
CPU (its process only: the agent's and the forwarder's Python processes, and
react's ``bash`` processes, are children, reported apart) and the wall time.
The difference of the runtime CPU per attempt is what a gateway costs the
runtime: serving a socket, starting and stopping it, relaying and recording
5 calls. The agent cache is built in the warm-up, outside the measurement.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

import agentcompass
import agentcompass._gc
from agentcompass import ComponentRef, ModelSpec, Orchestration, RunRequest

from . import _noop  # noqa: F401 - registers noop-bench
from ._agent import serve_script, start_model_server

__all__ = ["gateway_overhead"]

CALLS = 5


def _text_server(root: Path, latency: float) -> tuple[subprocess.Popen[str], str]:
    return serve_script(root / "gateway-script.json", {"delay": latency, "default": [{"text": "ok"}]})


def _request(root: Path, tasks: int, url: str, name: str, harness: ComponentRef) -> RunRequest:
    return RunRequest(
        name=name,
        benchmark=ComponentRef("noop-bench", {"tasks": tasks}),
        harness=harness,
        environment=ComponentRef("local", {"root": str(root / "sandboxes")}),
        model=ModelSpec("scripted", base_url=url),
        output_root=root,
    )


def _usage(kind: int) -> float:
    usage = resource.getrusage(kind)
    return usage.ru_utime + usage.ru_stime


def _measure(root: Path, tasks: int, concurrency: int, url: str, name: str, harness: ComponentRef) -> dict[str, Any]:
    trio.run(agentcompass.launch, Orchestration([_request(root, 2, url, f"{name}-warmup", harness)], task_concurrency=2))
    own0, kids0, t0 = _usage(resource.RUSAGE_SELF), _usage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = trio.run(
        agentcompass.launch, Orchestration([_request(root, tasks, url, name, harness)], task_concurrency=concurrency)
    )
    wall = time.perf_counter() - t0
    own, kids = _usage(resource.RUSAGE_SELF) - own0, _usage(resource.RUSAGE_CHILDREN) - kids0
    metrics = result.requests[0].metrics
    return {
        "status": result.status,
        "model_calls": int(metrics.get("usage", {}).get("calls", 0)),
        "cpu_ms_per_attempt": own / tasks * 1e3,
        "children_cpu_ms_per_attempt": kids / tasks * 1e3,
        "wall_ms_per_attempt": wall / tasks * concurrency * 1e3,
    }


def gateway_overhead(root: Path, tasks: int = 100, concurrency: int = 10, latency: float = 0.05) -> dict[str, Any]:
    """See the module docstring."""
    from agentcompass.testing import noop_agent  # noqa: F401 - registers noop-agent

    agentcompass._gc.allow()
    root = Path(root)
    (root / "sandboxes").mkdir(parents=True, exist_ok=True)
    os.environ["AGENTCOMPASS_AGENT_CACHE"] = str(root / "agents")
    text, text_url = _text_server(root, latency)
    react_server, react_url = start_model_server(root, CALLS - 1, latency)
    try:
        installed = _measure(
            root, tasks, concurrency, text_url, "gateway",
            ComponentRef("installed", {"agent": "noop-agent", "args": [str(CALLS)]}),
        )  # fmt: skip
        react = _measure(root, tasks, concurrency, react_url, "react", ComponentRef("react", {"max_steps": 20}))
    finally:
        for proc in (text, react_server):
            proc.terminate()
            proc.wait(timeout=10)
    flat = {f"installed_{k}": v for k, v in installed.items()} | {f"react_{k}": v for k, v in react.items()}
    return {
        "tasks": tasks,
        "concurrency": concurrency,
        "latency_s": latency,
        "calls_per_attempt": CALLS,
        **flat,
        "extra_cpu_ms_per_attempt": installed["cpu_ms_per_attempt"] - react["cpu_ms_per_attempt"],
        "cpu_over_react": installed["cpu_ms_per_attempt"] / react["cpu_ms_per_attempt"],
    }
