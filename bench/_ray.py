"""The ``ray`` scenario: the same workloads in process and on 2 local Ray workers.

Two workloads, each run in process and then with ``orchestration.executor``
``ray`` on a local cluster of ``workers`` worker actors, side by side in one
process:

* agent-bound: ``react`` against the scripted loopback model server (see
  ``_agent``) in the no-op environment. In process one core does all the
  model-path work; on Ray the workers share it. Reported: model calls per
  second and their ratio (target >= 1.6 on two cores), and the driver's
  CPU per attempt (this process: the exchange with the workers, the store).
* overhead-bound: the no-op components of ``overhead``: attempts per second
  and driver CPU per attempt, Ray beside in process.

Rates are taken over the work, from the first ``task_started`` to the last
``task_finished`` progress line, so the cluster's and the workers' start
(seconds, once per run) is left out; the driver CPU is the whole launch's.
The cluster runs in a network namespace with only loopback when this
process may make one (root and ``unshare``): Ray's servers listen on every
address.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

import agentcompass
import agentcompass._gc
from agentcompass import ComponentRef, Orchestration, RunRequest
from agentcompass._store._layout import RunLayout

from ._agent import _request as agent_request
from ._agent import start_model_server

__all__ = ["ray_scale", "ray_rows"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _work_seconds(run_dir: str) -> float:
    times = {"task_started": [], "task_finished": []}  # type: dict[str, list[float]]
    with open(RunLayout(run_dir).progress_lines, encoding="utf-8") as f:
        for line in f:
            event = json.loads(line)
            if event["event"] in times:
                times[event["event"]].append(event["t"])
    return max(times["task_finished"]) - min(times["task_started"])


def _overhead_request(root: Path, tasks: int, name: str) -> RunRequest:
    return RunRequest(
        name=name,
        benchmark=ComponentRef("noop-bench", {"tasks": tasks}),
        harness=ComponentRef("noop-harness", {}),
        environment=ComponentRef("noop-env", {}),
        output_root=root,
    )


async def _measure(request: RunRequest, concurrency: int, executor: ComponentRef, tasks: int) -> dict[str, Any]:
    cpu0 = _cpu()
    result = await agentcompass.launch(Orchestration([request], task_concurrency=concurrency, executor=executor))
    cpu = _cpu() - cpu0
    run = result.requests[0]
    work = _work_seconds(run.run_dir)
    calls = int((run.metrics or {}).get("usage", {}).get("calls", 0))
    return {
        "status": result.status,
        "work_s": work,
        "attempts_per_s": tasks / work,
        "calls_per_s": calls / work,
        "model_calls": calls,
        "driver_cpu_us_per_attempt": cpu / tasks * 1e6,
    }


async def _both(
    root: Path, url: str, tasks: int, concurrency: int, overhead_tasks: int, overhead_concurrency: int, workers: int
) -> dict[str, Any]:
    from agentcompass._ray._cluster import local_cluster

    inprocess = ComponentRef("inprocess")
    out: dict[str, Any] = {}
    # Warm-up: imports, registry, the first connections.
    await agentcompass.launch(Orchestration([agent_request(root, 4, url, "warmup", "noop-env")], task_concurrency=4))
    out["agent_inprocess"] = await _measure(
        agent_request(root, tasks, url, "agent-inprocess", "noop-env"), concurrency, inprocess, tasks
    )
    out["overhead_inprocess"] = await _measure(
        _overhead_request(root, overhead_tasks, "overhead-inprocess"), overhead_concurrency, inprocess, overhead_tasks
    )
    async with local_cluster(workers + 1, 30) as address:
        ray = ComponentRef("ray", {"address": address, "workers": workers, "worker_concurrency": concurrency})
        await agentcompass.launch(
            Orchestration([agent_request(root, 4, url, "warmup-ray", "noop-env")], task_concurrency=4, executor=ray)
        )
        out["agent_ray"] = await _measure(
            agent_request(root, tasks, url, "agent-ray", "noop-env"), concurrency, ray, tasks
        )
        ray_overhead = ComponentRef(
            "ray", {"address": address, "workers": workers, "worker_concurrency": overhead_concurrency}
        )
        out["overhead_ray"] = await _measure(
            _overhead_request(root, overhead_tasks, "overhead-ray"), overhead_concurrency, ray_overhead, overhead_tasks
        )
    out["calls_per_s_ratio"] = out["agent_ray"]["calls_per_s"] / out["agent_inprocess"]["calls_per_s"]
    return out


def ray_scale(
    root: Path,
    tasks: int = 600,
    concurrency: int = 200,
    latency: float = 0.1,
    steps: int = 4,
    overhead_tasks: int = 3_000,
    overhead_concurrency: int = 500,
    workers: int = 2,
) -> dict[str, Any]:
    """See the module docstring."""
    if importlib.util.find_spec("ray") is None:
        raise RuntimeError("Ray is not installed (pip install 'agentcompass[ray]')")
    kwargs = {
        "tasks": tasks,
        "concurrency": concurrency,
        "latency": latency,
        "steps": steps,
        "overhead_tasks": overhead_tasks,
        "overhead_concurrency": overhead_concurrency,
        "workers": workers,
    }
    if os.environ.get("BENCH_RAY_NETNS") != "1" and os.geteuid() == 0 and shutil.which("unshare"):
        return _in_netns(root, kwargs)
    agentcompass._gc.allow()
    root = Path(root)
    server, url = start_model_server(root, steps, latency)
    try:
        result = trio.run(_both, root, url, tasks, concurrency, overhead_tasks, overhead_concurrency, workers)
    finally:
        server.terminate()
        server.wait(timeout=10)
    result.update(kwargs)
    result["network_namespace"] = os.environ.get("BENCH_RAY_NETNS") == "1"
    return result


def _in_netns(root: Path, kwargs: dict[str, Any]) -> dict[str, Any]:
    """This scenario again, in a new network namespace with only loopback."""
    env = {**os.environ, "BENCH_RAY_NETNS": "1"}
    command = [
        "unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
        sys.executable, "-m", "bench._child", "ray_scale", json.dumps({"root": str(root), **kwargs}),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"ray scenario failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


def ray_rows(results: dict[str, Any], row: Any) -> list[dict[str, Any]]:
    """The report's rows for the ``ray`` scenario."""
    r = results.get("ray")
    if not r or "error" in r:
        return []
    ratio = r["calls_per_s_ratio"]
    a, b = r["agent_inprocess"], r["agent_ray"]
    o, p = r["overhead_inprocess"], r["overhead_ray"]
    workers = r["workers"]
    return [
        row("ray", f"agent-bound model calls/s, {workers} Ray workers / in process", ratio, ">= 1.6", ratio >= 1.6, "{:.2f}"),
        row("ray", "agent-bound model calls/s in process", a["calls_per_s"], "(context)", None, "{:.0f}"),
        row("ray", f"agent-bound model calls/s on {workers} Ray workers", b["calls_per_s"], "(context)", None, "{:.0f}"),
        row("ray", "agent-bound driver CPU us per attempt, Ray", b["driver_cpu_us_per_attempt"], "(context)", None, "{:.0f}"),
        row("ray", "agent-bound CPU us per attempt, in process", a["driver_cpu_us_per_attempt"], "(context)", None, "{:.0f}"),
        row("ray", "overhead-bound attempts/s in process", o["attempts_per_s"], "(context)", None, "{:.0f}"),
        row("ray", f"overhead-bound attempts/s on {workers} Ray workers", p["attempts_per_s"], "(context)", None, "{:.0f}"),
        row("ray", "overhead-bound driver CPU us per attempt, Ray", p["driver_cpu_us_per_attempt"], "(context)", None, "{:.0f}"),
        row("ray", "overhead-bound CPU us per attempt, in process", o["driver_cpu_us_per_attempt"], "(context)", None, "{:.0f}"),
    ]
