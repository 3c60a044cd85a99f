"""Runs inside the Inspect AI virtual environment (not the project's).

``python _inspect_worker.py N CONCURRENCY LATENCY LOG_DIR`` evaluates N samples
with a custom model that sleeps LATENCY seconds and returns a fixed answer,
the exact-match scorer, no sandbox and ``max_samples`` = CONCURRENCY, with
its default log persistence on, and prints one JSON line of measurements.
Imports nothing from agentcompass.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelAPI, ModelOutput, modelapi
from inspect_ai.scorer import exact
from inspect_ai.solver import generate

LATENCY = float(sys.argv[3])


@modelapi(name="benchsleep")
class SleepModel(ModelAPI):
    def __init__(self, model_name, base_url=None, api_key=None, config=None, **kwargs):  # noqa: ANN001
        super().__init__(model_name, base_url, api_key, [], config) if config is not None else super().__init__(
            model_name, base_url, api_key
        )

    async def generate(self, input, tools, tool_choice, config):  # noqa: A002, ANN001
        if LATENCY:
            await asyncio.sleep(LATENCY)
        return ModelOutput.from_content(model=self.model_name, content="answer")

    def max_connections(self) -> int:
        return 100_000


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def main() -> None:
    n, concurrency, log_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
    task = Task(
        dataset=[Sample(id=i, input=f"question {i}", target="answer") for i in range(n)],
        solver=generate(),
        scorer=exact(),
    )
    cpu0, t0 = cpu(), time.perf_counter()
    logs = eval(
        task,
        model="benchsleep/fixed",
        max_samples=concurrency,
        max_connections=100_000,
        display="none",
        log_dir=log_dir,
        sandbox=None,
    )
    wall, used = time.perf_counter() - t0, cpu() - cpu0
    log = logs[0]
    print(
        json.dumps(
            {
                "status": log.status,
                "samples": n,
                "concurrency": concurrency,
                "latency_s": LATENCY,
                "wall_s": wall,
                "cpu_s": used,
                "samples_per_s": n / wall,
                "cpu_us_per_sample": used / n * 1e6,
            }
        )
    )


if __name__ == "__main__":
    main()
