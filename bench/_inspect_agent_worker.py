"""Runs inside the Inspect AI virtual environment (not the project's).

``python _inspect_agent_worker.py N CONCURRENCY BASE_URL LOG_DIR`` evaluates N
samples with Inspect's ``react`` agent and its ``bash`` tool in its ``local``
sandbox, against the scripted model server at BASE_URL through Inspect's
generic OpenAI-compatible provider (``openai-api/bench/scripted``), with
``max_samples`` = ``max_connections`` = CONCURRENCY and its default log on;
it prints one JSON line of measurements. Imports nothing from agentcompass.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from inspect_ai import Task, eval
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.tool import bash


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def main() -> None:
    n, concurrency, base_url, log_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ["BENCH_BASE_URL"] = base_url
    os.environ["BENCH_API_KEY"] = "unused"
    task = Task(
        dataset=[Sample(id=i, input=f"task {i}: run true four times, then submit", target="done") for i in range(n)],
        solver=react(tools=[bash(timeout=60)]),
        scorer=includes(),
        sandbox="local",
    )
    cpu0, kids0, t0 = cpu(), children_cpu(), time.perf_counter()
    logs = eval(
        task,
        model="openai-api/bench/scripted",
        max_samples=concurrency,
        max_connections=concurrency,
        display="none",
        log_dir=log_dir,
    )
    wall, used, kids = time.perf_counter() - t0, cpu() - cpu0, children_cpu() - kids0
    log = logs[0]
    print(
        json.dumps(
            {
                "status": log.status,
                "samples": n,
                "concurrency": concurrency,
                "wall_s": wall,
                "cpu_s": used,
                "children_cpu_s": kids,
                "error": str(log.error.message)[:300] if log.error else None,
            }
        )
    )


if __name__ == "__main__":
    main()
