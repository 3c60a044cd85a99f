"""The benchmark scenarios, each a plain function returning a dict of measurements.

Every function runs the runtime in the calling process (``trio.run``) with the
no-op components of :mod:`agentcompass.testing` and persistence on (a real
run directory under ``root``); :func:`shutdown` and the split of
:func:`latency_bound` run it in processes of their own as well. ``python -m bench`` calls each one in a fresh
subprocess (see :mod:`bench._child`) so scenarios never share memory,
caches or a Trio run; the smoke tests call them in-process with small sizes.

Sizes are arguments so the same code serves the full run and the smoke run.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

import agentcompass
import agentcompass._gc
from agentcompass import (
    AttemptsSpec,
    ComponentRef,
    ExecutionSpec,
    Orchestration,
    ProviderLimits,
    RunRequest,
)
from agentcompass._store._layout import RunLayout

from ._agent import agent_bound
from ._docker import docker_open_close as docker_open_close
from ._images import images_side_by_side as images_side_by_side
from ._noop import NOOP_OPEN_TIMES, NOOP_SESSIONS  # importing it registers the noop-* components
from ._sandbox import sandbox_open_close as sandbox_open_close

__all__ = [
    "SCENARIOS",
    "agent_bound",
    "latency_bound",
    "memory",
    "open_rate",
    "overhead_bound",
    "reuse",
    "docker_open_close",
    "images_side_by_side",
    "sandbox_open_close",
    "shutdown",
]


def _request(
    root: Path,
    tasks: int,
    *,
    name: str = "bench",
    sleep: float = 0.0,
    reuse: bool | Path = False,
    k: int = 1,
    record_opens: bool = False,
    env_checkpoint: bool = False,
) -> RunRequest:
    env: dict[str, Any] = {"record_opens": True} if record_opens else {}
    if env_checkpoint:
        env["checkpoint"] = True
    return RunRequest(
        name=name,
        benchmark=ComponentRef("noop-bench", {"tasks": tasks}),
        harness=ComponentRef("noop-harness", {"sleep": sleep}),
        environment=ComponentRef("noop-env", env),
        execution=ExecutionSpec(attempts=AttemptsSpec(k=k)),
        output_root=Path(root),
        reuse=reuse,
    )


def _launch(orchestration: Orchestration) -> Any:
    agentcompass._gc.allow()  # the bench owns its process, as the CLI does (see agentcompass._gc)
    return trio.run(agentcompass.launch, orchestration)


def _cpu() -> float:
    """CPU seconds of this process (all threads) and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _events(run_dir: str, kind: str) -> list[dict[str, Any]]:
    out = []
    with open(RunLayout(run_dir).progress_lines, encoding="utf-8") as f:
        for line in f:
            if f'"event":"{kind}"' in line:
                out.append(json.loads(line))
    return out


def _warm_up(root: Path) -> None:
    """One tiny run first: imports, registry and caches are not what we measure."""
    _launch(Orchestration([_request(root / "warmup", 4)], task_concurrency=2))


# -- scenarios ------------------------------------------------------------------


def overhead_bound(root: Path, tasks: int = 10_000, concurrency: int = 500, k: int = 1) -> dict[str, Any]:
    """No-op components: what one attempt costs the runtime itself (with
    ``k`` > 1, every attempt but a task's last is checkpointed too)."""
    root = Path(root)
    _warm_up(root)
    cpu0, t0 = _cpu(), time.perf_counter()
    result = _launch(Orchestration([_request(root, tasks, k=k)], task_concurrency=concurrency))
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    attempts = tasks * k
    return {
        "status": result.status,
        "tasks": tasks,
        "k": k,
        "concurrency": concurrency,
        "wall_s": wall,
        "cpu_s": cpu,
        "attempts_per_s": attempts / wall,
        "cpu_us_per_attempt": cpu / attempts * 1e6,
    }


def latency_bound(
    root: Path, tasks: int = 2_000, concurrency: int = 200, latency: float = 0.05
) -> dict[str, Any]:
    """A harness that sleeps ``latency``: wall time against ceil(N/C) x L.

    The no-op environment and benchmark make no schedule point, so the
    harness's sleep is the attempt's only one besides the runtime's own;
    ``yielding_env_wall_over_ideal`` is the same run with an environment
    whose ``open`` yields once. Context beside it: the run's fixed part,
    the workload split over :data:`SPLIT_PROCESSES` processes, a bare Trio
    loop of the same shape and the attempt engine alone."""
    root = Path(root)
    _warm_up(root)
    ideal = math.ceil(tasks / concurrency) * latency
    cpu0, own0, t0, unix0 = _cpu(), time.thread_time(), time.perf_counter(), time.time()
    result = _launch(Orchestration([_request(root, tasks, sleep=latency)], task_concurrency=concurrency))
    wall, cpu, own = time.perf_counter() - t0, _cpu() - cpu0, time.thread_time() - own0
    # The fixed part of the wall time, from the progress lines' unix times:
    # the run's start (store, run info, tasks, plan) before any attempt, and
    # its end (metrics, summary, terminal run info, store close) after the
    # last record is durable (an attempt is reported finished only then).
    unix1 = time.time()
    run_dir = result.requests[0].run_dir
    first_start = min(e["t"] for e in _events(run_dir, "attempt_started"))
    last_finish = max(e["t"] for e in _events(run_dir, "attempt_finished"))
    # Context: the same with an environment whose open yields once (as any
    # real one does): the attempts then advance in lockstep under load.
    t1 = time.perf_counter()
    _launch(
        Orchestration(
            [_request(root, tasks, name="bench-yielding-env", sleep=latency, env_checkpoint=True)],
            task_concurrency=concurrency,
        )
    )
    yielding = time.perf_counter() - t1
    split_wall = _split_wall(root, tasks, concurrency, latency)
    floor = trio.run(_bare_trio, tasks, concurrency, latency)
    engine_wall, engine_cpu = trio.run(_engine_only, root, tasks, concurrency, latency)
    budget = _cpu_budget(tasks, concurrency, latency, ideal)
    return {
        "status": result.status,
        "tasks": tasks,
        "concurrency": concurrency,
        "latency_s": latency,
        "wall_s": wall,
        "ideal_s": ideal,
        "wall_over_ideal": wall / ideal,
        "cpu_us_per_attempt": cpu / tasks * 1e6,
        # The Trio thread runs every task's code: its CPU per attempt is
        # what bounds this scenario (the store's worker thread works beside it).
        "trio_thread_us_per_attempt": own / tasks * 1e6,
        "before_first_attempt_s": first_start - unix0,
        "after_last_record_s": unix1 - last_finish,
        "yielding_env_wall_over_ideal": yielding / ideal,
        "split_processes": SPLIT_PROCESSES,
        "split_wall_over_ideal": split_wall / ideal,
        "bare_trio_wall_s": floor,
        "bare_trio_wall_over_ideal": floor / ideal,
        "bare_trio_cpu_budget_us": budget,
        "engine_only_wall_over_ideal": engine_wall / ideal,
        "engine_only_us_per_attempt": engine_cpu / tasks * 1e6,
    }


#: Processes the latency-bound workload is split over in its context row
#: (as many as this machine's cores).
SPLIT_PROCESSES = 2


def _split_wall(root: Path, tasks: int, concurrency: int, latency: float) -> float:
    """The latency-bound workload split over :data:`SPLIT_PROCESSES`
    independent processes started together, each with its share of the
    tasks and of the concurrency, its own run and store: wall seconds from
    the first start to the last end. What tasks in several processes (SPEC
    11's ``Executor``) could reach at best on this machine, with nothing
    spent coordinating them."""
    from ._child import run_children_together

    n = SPLIT_PROCESSES
    shares = [
        {
            "root": str(Path(root) / f"split-{i}"),
            "tasks": tasks // n + (i < tasks % n),
            "concurrency": max(1, concurrency // n),
            "latency": latency,
        }
        for i in range(n)
    ]
    results = run_children_together("latency_share", shares)
    return max(r["end"] for r in results) - min(r["start"] for r in results)


def latency_share(root: Path, tasks: int, concurrency: int, latency: float) -> dict[str, Any]:
    """One process of :func:`_split_wall`: warm up, print ``ready``, wait for
    a line on stdin, then run ``tasks`` sleeping tasks (unix start and end)."""
    root = Path(root)
    _warm_up(root)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    result = _launch(Orchestration([_request(root, tasks, sleep=latency)], task_concurrency=concurrency))
    return {"status": result.status, "start": start, "end": time.time()}


#: CPU per attempt tried on the bare loop, to find what 1.10 x ideal allows.
_BUDGET_STEPS_US = (25, 50, 75, 100, 150, 200, 300)


def _cpu_budget(tasks: int, concurrency: int, latency: float, ideal: float) -> float:
    """The most CPU per attempt (microseconds, of :data:`_BUDGET_STEPS_US`)
    that the bare loop can spend in its task and still finish within 1.10 x
    ideal: what a whole runtime may cost per attempt on this machine to meet
    the latency-bound target. 0 if even the first step misses it."""
    allowed = 0.0
    for step in _BUDGET_STEPS_US:
        if trio.run(_bare_trio, tasks, concurrency, latency, step) > 1.10 * ideal:
            break
        allowed = float(step)
    return allowed


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def _pool(tasks: int, concurrency: int, item: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """``concurrency`` bare Trio tasks taking ``tasks`` items off one
    iterator and awaiting ``item()`` for each: (wall seconds, Trio-thread
    CPU seconds)."""
    items = iter(range(tasks))

    async def worker() -> None:
        for _ in items:
            await item()

    cpu0, t0 = time.thread_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return time.perf_counter() - t0, time.thread_time() - cpu0


async def _bare_trio(tasks: int, concurrency: int, latency: float, cpu_us: float = 0.0) -> float:
    """The floor of the latency-bound shape: a :func:`_pool` whose items
    sleep ``latency`` each, with no runtime at all (what Trio's own
    scheduling costs); ``cpu_us`` of CPU spent around each sleep stands in
    for a runtime's own work. Returns the wall seconds."""
    half = cpu_us / 2e6

    async def item() -> None:
        if half:
            _spin(half)
        await trio.sleep(latency)
        if half:
            _spin(half)

    wall, _ = await _pool(tasks, concurrency, item)
    return wall


class _DropReporter:
    """A task reporter that keeps nothing: no store, no progress, no journal."""

    def event(self, kind: str, **fields: Any) -> None:
        pass

    async def session_opened(self, session_id: str, provider: str, handle: dict[str, Any], name: str = "") -> None:
        pass

    async def session_closed(self, session_id: str, provider: str, handle: dict[str, Any]) -> None:
        pass

    async def checkpoint(self, task_id: str, record: Any) -> None:
        pass

    async def discarded_try(self, task_id: str, attempt: int, try_number: int, data: dict[str, Any]) -> None:
        pass

    async def attempt_plan(self, task_id: str, attempt: int, plan: Any) -> None:
        pass


async def _engine_only(root: Path, tasks: int, concurrency: int, latency: float) -> tuple[float, float]:
    """The attempt engine alone (``run_task`` of the task scope: plan, try,
    sessions, evaluation, records) with no scheduler, no store and no
    persistence: how much of the latency-bound gap the engine accounts
    for (a :func:`_pool` of ``run_task`` calls)."""
    from agentcompass._orchestration._context import GraceClock, RequestContext
    from agentcompass._orchestration._launch import _LocalGrants
    from agentcompass._orchestration._task import run_task

    request = _request(root, 1, name="bench-engine", sleep=latency)
    ctx = RequestContext.build(request, _LocalGrants(), _DropReporter(), GraceClock(30))
    (task,) = await ctx.benchmark.load_tasks(request)

    async def item() -> None:
        await run_task(ctx, task, [0])

    return await _pool(tasks, concurrency, item)


def memory(root: Path, tasks: int = 100_000, concurrency: int = 10, hold: float = 3.0) -> dict[str, Any]:
    """``tasks`` tasks queued behind ``concurrency`` workers whose harness
    never returns; the deadline (``hold`` seconds) ends the run. Peak RSS
    growth over a warmed-up baseline, per pending task. Run it in a fresh
    process: ``ru_maxrss`` is a high-water mark."""
    root = Path(root)
    _warm_up(root)
    before = _maxrss_bytes()
    t0 = time.perf_counter()
    result = _launch(
        Orchestration(
            [_request(root, tasks, sleep=3600)],
            task_concurrency=concurrency,
            timeout_seconds=hold,
            cleanup_grace_seconds=5,
        )
    )
    peak = _maxrss_bytes()
    return {
        "status": result.status,
        "tasks": tasks,
        "wall_s": time.perf_counter() - t0,
        "baseline_rss_bytes": before,
        "peak_rss_bytes": peak,
        "rss_bytes_per_pending_task": (peak - before) / tasks,
        "sessions_open_at_exit": NOOP_SESSIONS["opened"] - NOOP_SESSIONS["closed"],
    }


def shutdown_child(root: Path, active: int = 500, hold: float = 2.0, grace: float = 5.0) -> dict[str, Any]:
    """The measured process of :func:`shutdown`: ``active`` attempts whose
    harness never returns until the orchestration deadline ``hold`` passes.

    ``deadline_wall`` is taken *before* ``launch`` (before preflight), so it is
    no later than the real deadline and the measured shutdown errs long."""
    root = Path(root)
    _warm_up(root)
    opened0 = NOOP_SESSIONS["opened"]
    t0 = time.time()
    result = _launch(
        Orchestration(
            [_request(root, active, sleep=3600)],
            task_concurrency=active,
            timeout_seconds=hold,
            cleanup_grace_seconds=grace,
        )
    )
    returned = time.time()
    return {
        "status": result.status,
        "active": active,
        "grace_s": grace,
        "deadline_wall": t0 + hold,
        "returned_wall": returned,
        "opened": NOOP_SESSIONS["opened"] - opened0,
        "open_at_exit": NOOP_SESSIONS["opened"] - NOOP_SESSIONS["closed"],
        "journal_unclosed": _unclosed_in_journal(result.requests[0].run_dir),
    }


def _unclosed_in_journal(run_dir: str) -> int:
    opened: set[str] = set()
    closed: set[str] = set()
    with open(RunLayout(run_dir).sessions, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            (opened if entry["event"] == "opened" else closed).add(entry["session"])
    return len(opened - closed)


def shutdown(root: Path, active: int = 500, hold: float = 2.0, grace: float = 5.0) -> dict[str, Any]:
    """Seconds from the deadline until every session is closed and the
    process exited: :func:`shutdown_child` in a subprocess, timed to its exit."""
    from ._child import run_child

    child, exited = run_child("shutdown_child", root=str(root), active=active, hold=hold, grace=grace)
    seconds = exited - child["deadline_wall"]
    return {
        **child,
        "exited_wall": exited,
        "shutdown_s": seconds,
        "target_s": grace + 0.5,
        "all_closed": child["open_at_exit"] == 0 and child["journal_unclosed"] == 0,
    }


def reuse(root: Path, tasks: int = 10_000, concurrency: int = 500, new: int = 1) -> dict[str, Any]:
    """A finished ``tasks``-task run, then ``--reuse`` of it with ``new`` more
    tasks: seconds from ``launch`` until the first new attempt starts."""
    root = Path(root)
    _warm_up(root)
    # The same experiment (benchmark config included) with a wider selection:
    # the first run is limited to ``tasks`` of the ``tasks + new``.
    first = _launch(
        Orchestration([attrs.evolve(_request(root, tasks + new), limit=tasks)], task_concurrency=concurrency)
    )
    source = Path(first.requests[0].run_dir)
    t0 = time.time()
    result = _launch(
        Orchestration([_request(root, tasks + new, reuse=source)], task_concurrency=concurrency)
    )
    wall = time.time() - t0
    run_dir = result.requests[0].run_dir
    starts = _events(run_dir, "attempt_started")
    first_start = min(e["t"] for e in starts) if starts else math.nan
    return {
        "status": result.status,
        "tasks": tasks,
        "new_tasks": new,
        "attempts_run": len(starts),
        "first_attempt_s": first_start - t0,
        "wall_s": wall,
    }


def open_rate(root: Path, opens: int = 200, rate: float = 50.0) -> dict[str, Any]:
    """``opens`` sessions of a provider limited to ``rate`` opens a second,
    all wanted at once: the achieved rate, (opens - 1) / (last - first open),
    since the bucket starts with one token."""
    root = Path(root)
    _warm_up(root)
    times = NOOP_OPEN_TIMES
    times.clear()
    result = _launch(
        Orchestration(
            [_request(root, opens, record_opens=True)],
            task_concurrency=opens,
            providers={"noop-env": ProviderLimits(open_qps=rate)},
        )
    )
    span = max(times) - min(times) if len(times) > 1 else math.nan
    achieved = (len(times) - 1) / span if span else math.nan
    return {
        "status": result.status,
        "opens": len(times),
        "configured_rate": rate,
        "achieved_rate": achieved,
        "deviation": achieved / rate - 1,
        "span_s": span,
    }

# The remote provider's scenarios run real servers; they live in a module of their own.
from ._gateway import gateway_overhead  # noqa: E402
from ._ray import ray_scale  # noqa: E402
from ._remote import remote_exec, remote_sessions, remote_stream  # noqa: E402

SCENARIOS = {
    "agent": agent_bound,
    "gateway": gateway_overhead,
    "overhead": overhead_bound,
    "latency": latency_bound,
    "memory": memory,
    "shutdown": shutdown,
    "reuse": reuse,
    "open_rate": open_rate,
    "remote_exec": remote_exec,
    "remote_sessions": remote_sessions,
    "remote_stream": remote_stream,
    "sandbox": sandbox_open_close,
    "docker": docker_open_close,
    "images": images_side_by_side,
    "ray_scale": ray_scale,
}
