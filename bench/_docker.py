"""The ``docker`` provider's scenario: open + close with a built image, the
``exec`` round trip beside the ``docker exec`` CLI's, and image reuse.

On a private daemon of its own (:class:`agentcompass_docker.testing.PrivateDaemon`,
the base image imported): builds a tiny image from a context, then opens and
closes ``sessions`` sessions of it at concurrency ``concurrency`` (policy
``full``); times ``execs`` round trips of ``exec("true")`` on one session and
``cli_execs`` runs of ``docker exec CONTAINER true`` on the same container;
then a second provider (a later run) opens the same context once and counts
its builds, which must be 0. What is left labelled on the daemon is counted.
"""

from __future__ import annotations

import secrets
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from agentcompass import ComponentRef, ExecutionPlan, NetworkPolicy, SandboxSpec


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def open_close_series(env: Any, config: Any, tag: str, sessions: int, concurrency: int) -> list[float]:
    """Seconds of each of ``sessions`` opens and closes of ``config``, ``concurrency`` at a time."""
    durations: list[float] = []
    limiter = trio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            started = time.perf_counter()
            session = await env.open(config, NetworkPolicy("full"), f"{tag}-{i}")
            await session.close()
            durations.append(time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        for i in range(sessions):
            nursery.start_soon(one, i)
    return durations


def docker_open_close(
    root: Path, sessions: int = 100, concurrency: int = 8, execs: int = 200, cli_execs: int = 30
) -> dict[str, Any]:
    from agentcompass_docker import DockerEnvironment
    from agentcompass_docker.base import BASE_IMAGE, import_base
    from agentcompass_docker.testing import PrivateDaemon, daemon_problem

    problem = daemon_problem()
    if problem is not None:
        raise RuntimeError(problem)
    context = Path(root) / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo built > /opt/built\nWORKDIR /app\n")
    daemon = PrivateDaemon.start()
    try:
        import_base(daemon.host)
        result: dict[str, Any] = {"sessions": sessions, "concurrency": concurrency, "execs": execs}
        plan = ExecutionPlan("bench-docker", 0, ComponentRef("docker", {}), sandbox=SandboxSpec(build_context=context))
        tag = f"bench{secrets.token_hex(3)}"

        async def main() -> None:
            env = DockerEnvironment({"host": daemon.host, "pull": "never"})
            config = env.build_config(plan)
            t0 = time.perf_counter()
            first = await env.open(config, NetworkPolicy("full"), f"{tag}-first")
            result["first_open_with_build_s"] = time.perf_counter() - t0
            result["first_run_builds"] = env.images.builds

            durations = await open_close_series(env, config, tag, sessions, concurrency)
            result["open_close_median_ms"] = statistics.median(durations) * 1e3
            result["open_close_p95_ms"] = percentile(durations, 0.95) * 1e3

            await first.exec("true")  # warm
            trips = []
            for _ in range(execs):
                started = time.perf_counter()
                done = await first.exec("true")
                trips.append(time.perf_counter() - started)
                assert done.exit_code == 0
            result["exec_median_ms"] = statistics.median(trips) * 1e3
            result["exec_p95_ms"] = percentile(trips, 0.95) * 1e3

            cli = shutil.which("docker")
            if cli is not None:
                argv = [cli, "-H", daemon.host, "exec", str(first.container), "true"]
                cli_trips = []
                for _ in range(cli_execs):
                    started = time.perf_counter()
                    await trio.run_process(argv, capture_stdout=True, capture_stderr=True)
                    cli_trips.append(time.perf_counter() - started)
                result["cli_exec_median_ms"] = statistics.median(cli_trips) * 1e3
            await first.close()

            later = DockerEnvironment({"host": daemon.host, "pull": "never"})
            session = await later.open(later.build_config(plan), NetworkPolicy("full"), f"{tag}-later")
            await session.close()
            result["second_run_builds"] = later.images.builds
            await env.aclose()
            await later.aclose()

        trio.run(main)
        result["leftover"] = len(daemon.leftovers())
        return result
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", str(context)], check=False)
