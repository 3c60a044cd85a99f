"""The ``sandbox`` provider's scenario: open + close latency, and many sessions held at once.

Opens and closes ``sessions`` sandboxes at concurrency ``concurrency`` under
each policy in ``policies`` (one latency distribution per policy; and a
quarter as many one at a time under ``none``, for context; and how many
network namespaces the provider's pool made for them), then
holds ``held`` sessions open together, each running a background process,
checks every process is alive, and closes them all. Host resources are
counted before and after (network namespaces, veths, cgroups, processes,
state directories, leases): the difference must be zero.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from agentcompass import NetworkPolicy


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def census() -> dict[str, int]:
    """Counts of every kind of host resource a sandbox session makes."""
    from agentcompass_sandbox import _host

    namespaces = set()
    processes = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            namespaces.add(os.readlink(f"/proc/{entry}/ns/net"))
            if str(_host.STATE_ROOT).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                processes += 1
        except OSError:
            continue
    cgroups = sum(
        len([e for e in os.listdir(base) if (base / e).is_dir()])
        for base in set(_host.cgroup_bases().values())
        if base.is_dir()
    )
    state = [e for e in os.listdir(_host.STATE_ROOT) if not e.startswith(".")] if _host.STATE_ROOT.is_dir() else []
    leases = os.listdir(_host.LEASE_DIR) if _host.LEASE_DIR.is_dir() else []
    veths = [e for e in os.listdir("/sys/class/net") if e.startswith("ac") and len(e) == 14]
    return {
        "network_namespaces": len(namespaces),
        "veths": len(veths),
        "cgroups": cgroups,
        "processes": processes,
        "directories": len(state),
        "leases": len(leases),
    }


@contextlib.contextmanager
def _own_cgroup() -> Iterator[Path | None]:
    """Move this process into a new cgroup v2 below its own (``None`` where
    that cannot be done); on exit move every process in it back and remove it."""
    v2 = None
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                v2 = Path(parts[1])
    with open("/proc/self/cgroup") as f:
        own = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
    if v2 is None or own is None:
        yield None
        return
    parent = v2 / own.lstrip("/")
    path = parent / f"bench-sandbox-{os.getpid()}"
    try:
        path.mkdir()
        (path / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        yield None
        return
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(pid)
        for sub in sorted(path.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()


def _cpu_usec(cgroup: Path | None) -> int | None:
    if cgroup is None:
        return None
    for line in (cgroup / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    return None


def sandbox_open_close(
    root: Path,
    sessions: int = 200,
    concurrency: int = 8,
    held: int = 100,
    policies: tuple[str, ...] = ("none", "full"),
) -> dict[str, Any]:
    with _own_cgroup() as cgroup:
        return _open_close(cgroup, sessions, concurrency, held, policies)


def _open_close(
    cgroup: Path | None, sessions: int, concurrency: int, held: int, policies: tuple[str, ...]
) -> dict[str, Any]:
    from agentcompass_sandbox import SandboxEnvironment, _pool, host_problem

    problem = host_problem()
    if problem is not None:
        raise RuntimeError(problem)
    tag = f"bench-{secrets.token_hex(3)}"
    env = SandboxEnvironment({})
    result: dict[str, Any] = {"sessions": sessions, "concurrency": concurrency, "held": held}

    async def open_close(policy: str, concurrency: int = concurrency, sessions: int = sessions) -> list[float]:
        durations: list[float] = []
        limiter = trio.CapacityLimiter(concurrency)

        async def one(i: int) -> None:
            async with limiter:
                t0 = time.perf_counter()
                session = await env.open(None, NetworkPolicy(policy), f"{tag}-{policy}-{i}")
                await session.close()
                durations.append(time.perf_counter() - t0)

        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(one, i)
        return durations

    async def hold() -> dict[str, Any]:
        opened = []
        errors = 0
        limiter = trio.CapacityLimiter(concurrency)

        async def start(i: int) -> None:
            nonlocal errors
            async with limiter:
                session = await env.open(None, NetworkPolicy("full"), f"{tag}-held-{i}")
                opened.append(session)
                started = await session.exec("sleep 600 > /dev/null 2>&1 & echo $!")
                if started.exit_code != 0:
                    errors += 1

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(held):
                nursery.start_soon(start, i)
        opened_s = time.perf_counter() - t0

        async def check(session: Any) -> None:
            nonlocal errors
            async with limiter:
                if (await session.exec("pgrep -x sleep")).exit_code != 0:
                    errors += 1

        async with trio.open_nursery() as nursery:
            for session in opened:
                nursery.start_soon(check, session)
        alive = len(opened)
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for session in opened:
                nursery.start_soon(session.close)
        return {
            "held_alive": alive,
            "held_errors": errors,
            "held_open_s": opened_s,
            "held_close_s": time.perf_counter() - t0,
        }

    async def main() -> None:
        # Context: one session at a time, what a session costs without contention.
        serial = await open_close("none", concurrency=1, sessions=max(1, sessions // 4))
        result["none_serial_median_ms"] = statistics.median(serial) * 1e3
        for policy in policies:
            before = _cpu_usec(cgroup)
            durations = await open_close(policy)
            after = _cpu_usec(cgroup)
            if before is not None and after is not None:
                result[f"{policy}_cpu_ms_per_session"] = (after - before) / 1e3 / sessions
            # Network namespaces (with veths under full) made so far in the run: the pool reuses them.
            result[f"{policy}_namespaces_made"] = _pool.current(veth=policy != "none").made
            result[f"{policy}_median_ms"] = statistics.median(durations) * 1e3
            result[f"{policy}_p95_ms"] = _percentile(durations, 0.95) * 1e3
        result.update(await hold())
        await env.sweep(tag)  # finds nothing when every close worked

    before = census()
    trio.run(main)
    after = census()
    result["before"] = before
    result["after"] = after
    result["leftover"] = sum(max(0, after[k] - before[k]) for k in before)
    return result
