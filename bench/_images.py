"""``sandbox`` with images beside ``docker``, in one run on one image.

On a private daemon (the base image imported), one build context is built
once; then, each provider in turn on that same image (policy ``full``):
``sessions`` opens + closes at concurrency ``concurrency``, and ``execs``
round trips of ``exec("true")`` on one session. ``sandbox`` makes its root
from the daemon's image (export + unpack, counted); a second ``sandbox``
provider on the same cache, with no daemon reachable, opens once and
counts its builds and unpacks, which must be 0. Overlay mounts over the
cache and containers left on the daemon are counted at the end.
"""

from __future__ import annotations

import secrets
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from agentcompass import ComponentRef, ExecutionPlan, NetworkPolicy, SandboxSpec

from ._docker import open_close_series, percentile


async def _series(env: Any, config: Any, tag: str, sessions: int, concurrency: int, execs: int) -> dict[str, float]:
    durations = await open_close_series(env, config, tag, sessions, concurrency)
    session = await env.open(config, NetworkPolicy("full"), f"{tag}-x")
    try:
        await session.exec("true")  # warm
        trips = []
        for _ in range(execs):
            started = time.perf_counter()
            done = await session.exec("true")
            trips.append(time.perf_counter() - started)
            assert done.exit_code == 0
    finally:
        await session.close()
    return {
        "open_close_median_ms": statistics.median(durations) * 1e3,
        "open_close_p95_ms": percentile(durations, 0.95) * 1e3,
        "exec_median_ms": statistics.median(trips) * 1e3,
    }


def _overlays(cache: str) -> int:
    with open("/proc/self/mounts") as mounts:
        return sum(1 for line in mounts if line.split()[2] == "overlay" and f"lowerdir={cache}/" in line)


def images_side_by_side(root: Path, sessions: int = 100, concurrency: int = 8, execs: int = 200) -> dict[str, Any]:
    from agentcompass_docker import DockerEnvironment
    from agentcompass_docker.base import BASE_IMAGE, import_base
    from agentcompass_docker.testing import PrivateDaemon, daemon_problem
    from agentcompass_sandbox import SandboxEnvironment

    problem = daemon_problem()
    if problem is not None:
        raise RuntimeError(problem)
    context = Path(root) / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo built > /opt/built\nWORKDIR /app\n")
    cache = str(Path(root) / "images")
    daemon = PrivateDaemon.start()
    try:
        import_base(daemon.host)
        result: dict[str, Any] = {"sessions": sessions, "concurrency": concurrency, "execs": execs}
        spec = SandboxSpec(build_context=context)
        tag = f"bench{secrets.token_hex(3)}"

        async def main() -> None:
            docker = DockerEnvironment({"host": daemon.host, "pull": "never"})
            plan = ExecutionPlan("bench-images", 0, ComponentRef("docker", {}), sandbox=spec)
            config = docker.build_config(plan)
            first = await docker.open(config, NetworkPolicy("full"), f"{tag}-d0")  # builds the image
            await first.close()
            result["docker"] = await _series(docker, config, f"{tag}-d", sessions, concurrency, execs)
            await docker.aclose()

            sandbox = SandboxEnvironment({"docker_host": daemon.host, "pull": "never", "image_cache": cache})
            plan = ExecutionPlan("bench-images", 0, ComponentRef("sandbox", {}), sandbox=spec)
            config = sandbox.build_config(plan)
            t0 = time.perf_counter()
            first = await sandbox.open(config, NetworkPolicy("full"), f"{tag}-s0")  # exports and unpacks it
            result["first_open_with_unpack_s"] = time.perf_counter() - t0
            await first.close()
            result["first_run_unpacks"] = sandbox.images.cache.unpacks
            result["sandbox"] = await _series(sandbox, config, f"{tag}-s", sessions, concurrency, execs)
            await sandbox.images.aclose()

            later = SandboxEnvironment({"docker_host": "unix:///nonexistent/docker.sock", "image_cache": cache})
            session = await later.open(later.build_config(plan), NetworkPolicy("full"), f"{tag}-later")
            await session.close()
            result["second_run_builds"] = later.images.builds
            result["second_run_unpacks"] = later.images.cache.unpacks

        trio.run(main)
        d, s = result["docker"], result["sandbox"]
        result["open_close_speedup"] = d["open_close_median_ms"] / s["open_close_median_ms"]
        result["exec_speedup"] = d["exec_median_ms"] / s["exec_median_ms"]
        result["leftover"] = len(daemon.leftovers()) + _overlays(cache)
        return result
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", str(context), cache], check=False)
