"""Provider limits through ``launch`` (SPEC section 7): capacity and open rate.

The capacity limiter of a provider lives in a ``RunVar``: it is shared by
every ``launch`` in one ``trio.run`` and "smallest wins". The property test
therefore gives every example a ``trio.run`` of its own.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import structlog
import trio
from _orch_support import (  # noqa: F401  (fixtures)
    Timeline,
    _instrumented,
    instrumented,
    launch,
    sleepy_request,
    timeline,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

import agentcompass
from agentcompass import Orchestration, ProviderLimits
from agentcompass.testing import call_log, reset_logs


def held(counts: list[tuple[float, int, int]]) -> list[int]:
    return [n for _, n, _ in counts]


def check_fully_used(counts: list[tuple[float, int, int]], tasks: int, expected: int) -> None:
    """Work conservation: over every stretch of mock time in which some task
    has not started its session yet, exactly ``expected`` sessions are held."""
    for (t, live, started), (t_next, _, _) in zip(counts, counts[1:], strict=False):
        if t_next > t and started < tasks:
            assert live == expected, f"only {live} of {expected} sessions held during [{t}, {t_next}]"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    durations=st.lists(st.integers(1, 30), min_size=1, max_size=10),
    capacity=st.integers(1, 4),
    concurrency=st.integers(1, 8),
    phase=st.sampled_from(["run", "open"]),
)
def test_capacity_is_never_exceeded_and_fully_used(tmp_path_factory, durations, capacity, concurrency, phase):
    # A sync test: each example is its own trio.run (the limiter registry is
    # per run) with its own logs, timeline and output directory.
    reset_logs()
    with instrumented() as timeline:
        request = sleepy_request("a", durations, tmp_path_factory.mktemp("capacity"), phase=phase)
        orchestration = Orchestration(
            [request], task_concurrency=concurrency, providers={"fake-env": ProviderLimits(capacity=capacity)}
        )
        result = trio.run(launch, orchestration, clock=MockClock(autojump_threshold=0))
    assert result.status == "succeeded"
    counts = timeline.open_counts()
    expected = min(capacity, concurrency, len(durations))
    assert max(held(counts)) == expected
    assert max(held(timeline.open_counts(start="opened"))) <= capacity
    check_fully_used(counts, len(durations), min(capacity, concurrency))
    assert not call_log("a").live_sessions()


async def test_open_rate_through_launch(autojump_clock, tmp_path: Path, timeline: Timeline):
    # 20 tasks, 20 workers, no capacity limit, 5 opens a second (burst 1):
    # one open every 0.2 s, the last 3.8 s after the first.
    request = sleepy_request("a", [0.9] * 20, tmp_path)
    orchestration = Orchestration([request], task_concurrency=20, providers={"fake-env": ProviderLimits(open_qps=5)})
    result = await launch(orchestration)
    assert result.status == "succeeded"
    opens = [m.t for m in timeline.select("open", "a")]
    assert len(opens) == 20
    gaps = [b - a for a, b in zip(opens, opens[1:], strict=False)]
    assert all(gap >= 0.2 - 1e-9 for gap in gaps), gaps
    assert opens[-1] - opens[0] == pytest.approx(3.8, abs=1e-6)  # and no slower than the rate
    # The limit throttles opens, not sessions: they overlap (each lives 0.9 s).
    assert max(held(timeline.open_counts())) == 5


async def test_open_rate_and_capacity_together(autojump_clock, tmp_path: Path, timeline: Timeline):
    # Capacity 2, 0.5 opens a second, tasks of 1 s: the rate binds (a
    # session is done before the next token), so opens are 2 s apart and
    # never two sessions at once.
    request = sleepy_request("a", [1] * 4, tmp_path)
    orchestration = Orchestration(
        [request], task_concurrency=4, providers={"fake-env": ProviderLimits(capacity=2, open_qps=0.5)}
    )
    await launch(orchestration)
    opens = [m.t for m in timeline.select("open", "a")]
    assert [t - opens[0] for t in opens] == pytest.approx([0, 2, 4, 6])
    assert max(held(timeline.open_counts())) == 1


async def test_concurrent_launches_share_the_provider_capacity(autojump_clock, tmp_path: Path, timeline: Timeline):
    # Two launches in one trio.run, each allowing 2 fake-env sessions and
    # running 3 workers: together they never hold more than 2.
    durations = {"x": [4, 7, 2, 5, 3], "y": [6, 1, 3, 8, 2]}
    results = {}

    async def run(name: str) -> None:
        orchestration = Orchestration(
            [sleepy_request(name, durations[name], tmp_path)],
            task_concurrency=3,
            providers={"fake-env": ProviderLimits(capacity=2)},
        )
        results[name] = await launch(orchestration)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "x")
        nursery.start_soon(run, "y")
    assert {name: r.status for name, r in results.items()} == {"x": "succeeded", "y": "succeeded"}

    counts = timeline.open_counts()
    assert max(held(counts)) == 2
    # They did run side by side: at some point each held a session.
    x_counts, y_counts = timeline.open_counts({"x"}), timeline.open_counts({"y"})
    assert max(held(x_counts)) >= 1 and max(held(y_counts)) >= 1
    overlap = any(_held_at(x_counts, t) and _held_at(y_counts, t) for t, _, _ in counts)
    assert overlap, "the two launches never held sessions at the same time"
    # With 2 sessions at a time the total work (46 s) needs at least 23 s.
    total = sum(sum(d) for d in durations.values())
    assert trio.current_time() - start >= total / 2
    check_fully_used(counts, sum(len(d) for d in durations.values()), 2)


def _held_at(counts: list[tuple[float, int, int]], t: float) -> int:
    """Sessions held just after every change at time ``t``."""
    live = 0
    for when, n, _ in counts:
        if when > t:
            break
        live = n
    return live


async def test_the_smallest_capacity_of_concurrent_launches_wins(autojump_clock, tmp_path: Path, timeline: Timeline):
    results = {}
    ended = {}

    async def run(name: str, capacity: int, tasks: int) -> None:
        orchestration = Orchestration(
            [sleepy_request(name, [3] * tasks, tmp_path)],
            task_concurrency=3,
            providers={"fake-env": ProviderLimits(capacity=capacity)},
        )
        results[name] = await launch(orchestration)
        ended[name] = trio.current_time()

    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "x", 3, 9)
            nursery.start_soon(run, "y", 1, 1)
    assert all(r.status == "succeeded" for r in results.values())
    counts = timeline.open_counts()
    # While both run, y's capacity is in force; once y ended, x's own.
    assert max(n for t, n, _ in counts if t < ended["y"]) == 1
    assert max(n for t, n, _ in counts if t >= ended["y"]) == 3
    notes = [entry["note"] for entry in logs if entry.get("event") == "provider_limits"]
    assert len(notes) == 1 and "smallest wins" in notes[0] and "'fake-env'" in notes[0]


async def test_unlimited_provider_uses_every_worker(autojump_clock, tmp_path: Path, timeline: Timeline):
    # No providers configured: capacity is unlimited (math.inf), the workers bound.
    request = sleepy_request("a", [2] * 7, tmp_path)
    await launch(Orchestration([request], task_concurrency=5))
    counts = timeline.open_counts()
    assert max(held(counts)) == 5
    check_fully_used(counts, 7, 5)
    assert math.isinf(agentcompass._limits.provider_limits().capacity("fake-env").total_tokens)
