"""Scenarios of the ``remote`` provider: real ``compass sandbox serve``
subprocesses on loopback, each backed by ``local``, and the provider driving
them from this process (the driver), whose CPU is what
``remote_sessions`` reports per session.

- ``remote_exec``: the round trip of ``exec("true")`` on one open session.
- ``remote_sessions``: ``sessions`` sessions at once across a pool of
  ``servers`` servers, each opened, running one command, closed.
- ``remote_stream``: ``mib`` MiB of output from one exec, end to end.

Each needs the ``agentcompass-remote`` plugin installed (``make`` installs it).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

__all__ = ["remote_exec", "remote_sessions", "remote_stream"]

_TOKEN = "bench-token"


@contextmanager
def _servers(root: Path, count: int, **provider_config: Any) -> Iterator[list[str]]:
    """``count`` server subprocesses; their URLs. SIGTERM and wait on the way out."""
    token_file = root / "token"
    token_file.write_text(_TOKEN)
    procs: list[subprocess.Popen[str]] = []
    try:
        urls = []
        for i in range(count):
            sandboxes = root / f"server-{i}"
            config = json.dumps({**provider_config, "root": str(sandboxes)})
            proc = subprocess.Popen(
                [sys.executable, "-m", "agentcompass._cli", "sandbox", "serve", "--port", "0"]
                + ["--token-file", str(token_file), "--provider-config", config],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"server {i} exited before listening")
            urls.append("ws://127.0.0.1:" + line.strip().rsplit(":", 1)[1])
        yield urls
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _env(urls: list[str], **provider_config: Any) -> Any:
    import agentcompass_remote

    return agentcompass_remote.RemoteEnvironment({"url": urls, "token": _TOKEN, "provider_config": provider_config})


def remote_exec(root: Path, execs: int = 300) -> dict[str, Any]:
    """Median and p90 wall milliseconds of ``exec("true")`` on one session."""
    from agentcompass import NetworkPolicy

    with _servers(Path(root), 1) as urls:

        async def main() -> list[float]:
            session = await _env(urls).open(None, NetworkPolicy())
            try:
                for _ in range(10):
                    await session.exec("true")
                times = []
                for _ in range(execs):
                    t0 = time.perf_counter()
                    await session.exec("true")
                    times.append(time.perf_counter() - t0)
                return times
            finally:
                await session.close()

        times = trio.run(main)
    times.sort()
    return {
        "execs": execs,
        "median_ms": statistics.median(times) * 1e3,
        "p90_ms": times[int(len(times) * 0.9)] * 1e3,
    }


def remote_sessions(root: Path, sessions: int = 1000, servers: int = 3) -> dict[str, Any]:
    """``sessions`` concurrent open / exec("true") / close across ``servers``
    servers: wall time, the driver's CPU per session, every command's success,
    and how the sessions spread over the servers."""
    from agentcompass import NetworkPolicy

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8 * sessions)), hard))
    with _servers(Path(root), servers) as urls:
        env = _env(urls)
        per_server = dict.fromkeys(urls, 0)
        failures: list[str] = []

        async def one() -> None:
            try:
                session = await env.open(None, NetworkPolicy())
            except Exception as exc:  # noqa: BLE001 - counted, reported
                failures.append(str(exc))
                return
            try:
                per_server[session.handle["url"]] += 1
                result = await session.exec("true")
                if result.exit_code != 0:
                    failures.append(f"exit {result.exit_code}")
            finally:
                await session.close()

        async def main() -> float:
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(sessions):
                    nursery.start_soon(one)
            return time.perf_counter() - t0

        cpu0 = time.process_time()
        wall = trio.run(main)
        cpu = time.process_time() - cpu0
    servers_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "sessions": sessions,
        "servers": servers,
        "wall_s": wall,
        "failed": len(failures),
        "first_failure": failures[0] if failures else None,
        "driver_cpu_us_per_session": cpu / sessions * 1e6,
        "servers_cpu_us_per_session": (servers_cpu.ru_utime + servers_cpu.ru_stime) / sessions * 1e6,
        "spread": sorted(per_server.values()),
    }


def remote_stream(root: Path, mib: int = 64) -> dict[str, Any]:
    """Throughput of ``mib`` MiB written to stdout by one exec and received
    whole by the driver (both sides' output limit set above that size)."""
    from agentcompass import NetworkPolicy

    size = mib * 1024 * 1024
    limit = size + 4096
    with _servers(Path(root), 1, max_output_bytes=limit) as urls:

        async def main() -> tuple[float, int]:
            session = await _env(urls, max_output_bytes=limit).open(None, NetworkPolicy())
            try:
                await session.exec("head -c 1048576 /dev/zero")
                t0 = time.perf_counter()
                result = await session.exec(f"head -c {size} /dev/zero")
                return time.perf_counter() - t0, len(result.stdout)
            finally:
                await session.close()

        cpu0 = time.process_time()
        wall, received = trio.run(main)
        driver_cpu = time.process_time() - cpu0
    server = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "mib": mib,
        "received_bytes": received,
        "wall_s": wall,
        "mib_per_s": mib / wall,
        # CPU seconds of each side (the server's includes its start and the warm-up exec).
        "driver_cpu_s": driver_cpu,
        "server_cpu_s": server.ru_utime + server.ru_stime,
    }


if __name__ == "__main__":  # a quick look: python -m bench._remote
    with tempfile.TemporaryDirectory() as tmp:
        for fn in (remote_exec, remote_stream):
            scratch = Path(tempfile.mkdtemp(dir=tmp))
            print(fn.__name__, fn(scratch), file=sys.stderr)
        print(remote_sessions(Path(tempfile.mkdtemp(dir=tmp)), sessions=int(os.environ.get("SESSIONS", "1000"))))
