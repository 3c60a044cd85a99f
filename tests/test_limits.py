"""Provider limits: the open-rate token bucket and the shared capacity limiters.

Everything about time runs under a mock clock (``autojump_clock``), which is
exact, so elapsed times are checked to a tight tolerance, not just bounded.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable

import pytest
import structlog
import structlog.testing
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass._limits import ProviderLimitRegistry, TokenBucket, provider_limits
from agentcompass.runtime import ProviderLimits

# MockClock is exact; floats are not: rates like 5/s give intervals with no
# exact binary form.
TOLERANCE = 1e-6


async def grant_times(acquire: Callable[[], Awaitable[None]], n: int) -> list[float]:
    """Start ``n`` concurrent waiters at once; return their grant times relative to now."""
    start = trio.current_time()
    times: list[float] = []

    async def waiter() -> None:
        await acquire()
        times.append(trio.current_time() - start)

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(waiter)
    return sorted(times)


def assert_rate_respected(times: list[float], rate: float, burst: int) -> None:
    """In any window, at most ``burst + length * rate`` grants (the bucket's promise)."""
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + (times[j] - times[i]) * rate + TOLERANCE


# -- the open-rate bucket ---------------------------------------------------


@pytest.mark.parametrize(("n", "rate", "burst"), [(20, 5.0, 1), (20, 5.0, 4), (7, 0.5, 1), (3, 2.0, 5)])
async def test_n_opens_take_n_minus_burst_over_rate(autojump_clock, nursery, n, rate, burst):
    bucket = TokenBucket(rate, burst=burst)
    await nursery.start(bucket.run)

    times = await grant_times(bucket.acquire, n)

    expected = max(0, n - burst) / rate
    assert times[-1] >= expected - TOLERANCE
    assert times[-1] == pytest.approx(expected, abs=TOLERANCE)
    assert_rate_respected(times, rate, burst)
    assert bucket.statistics().granted == n


async def test_registry_open_rate_20_opens_at_5_per_second(autojump_clock):
    limits = provider_limits()
    assert limits.configure("local", 0, 5) == []

    times = await grant_times(lambda: limits.acquire_open_token("local"), 20)

    # burst 1: (20 - 1) / 5
    assert times[-1] >= 3.8 - TOLERANCE
    assert times[-1] == pytest.approx(3.8, abs=TOLERANCE)
    assert times[0] == 0
    assert_rate_respected(times, 5, 1)


async def test_achieved_rate_over_200_opens_is_within_2_percent(autojump_clock):
    limits = provider_limits()
    limits.configure("p", 0, 50)
    grants: list[float] = []

    # A few workers opening back to back, as the scheduler's workers would.
    async def worker(count: int) -> None:
        for _ in range(count):
            await limits.acquire_open_token("p")
            grants.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(worker, 50)

    assert len(grants) == 200
    achieved = (len(grants) - 1) / (max(grants) - min(grants))
    assert achieved == pytest.approx(50, rel=0.02)


async def test_waiters_are_granted_in_arrival_order(autojump_clock, nursery):
    bucket = TokenBucket(10)
    await nursery.start(bucket.run)
    arrival = list(range(12))
    random.Random(7).shuffle(arrival)
    granted: list[int] = []

    async def waiter(label: int) -> None:
        await bucket.acquire()
        granted.append(label)

    async with trio.open_nursery() as waiters:
        for label in arrival:
            waiters.start_soon(waiter, label)
            # Let this waiter queue before the next one arrives.
            await trio.testing.wait_all_tasks_blocked()

    assert granted == arrival


@pytest.mark.parametrize(
    "cancelled",
    [
        pytest.param(1, id="held-by-the-actor"),
        pytest.param(5, id="queued-in-the-middle"),
        pytest.param(9, id="queued-last"),
    ],
)
async def test_a_cancelled_waiter_frees_its_turn_and_consumes_no_token(autojump_clock, nursery, cancelled):
    rate, n = 4.0, 10
    bucket = TokenBucket(rate)
    await nursery.start(bucket.run)
    start = trio.current_time()
    scopes = [trio.CancelScope() for _ in range(n)]
    grants: dict[int, float] = {}

    async def waiter(i: int) -> None:
        with scopes[i]:
            await bucket.acquire()
            grants[i] = trio.current_time() - start

    async with trio.open_nursery() as waiters:
        for i in range(n):
            waiters.start_soon(waiter, i)
            await trio.testing.wait_all_tasks_blocked()
        # Waiter 0 is granted at once; the others wait, the first of them
        # held by the actor until t = 1 / rate.
        await trio.sleep(0.1)
        assert cancelled not in grants
        scopes[cancelled].cancel()

    assert cancelled not in grants
    assert scopes[cancelled].cancelled_caught
    survivors = [i for i in range(n) if i != cancelled]
    # Served as if the cancelled waiter had never queued: (N - 1 - 1) / r.
    assert [grants[i] for i in survivors] == [k / rate for k in range(n - 1)]
    stats = bucket.statistics()
    assert (stats.granted, stats.given_back, stats.waiting) == (n - 1, 0, 0)
    # No token left over either: the bucket is empty right after the last grant.
    assert stats.tokens == pytest.approx(0, abs=TOLERANCE)


async def test_a_grant_crossing_a_cancellation_is_given_back(autojump_clock, nursery):
    """The waiter's deadline and the grant fall in the same scheduling batch.

    Trio runs a batch in either order, so the actor sometimes grants before the
    cancelled waiter runs (the token must come back) and sometimes after (the
    request is abandoned). Either way the next waiter is served on time.
    """
    rate = 4.0  # intervals of 0.25 s: exact in binary, so both deadlines coincide
    outcomes: set[int] = set()

    async def waiter(bucket: TokenBucket, scope: trio.CancelScope, label: str, grants: dict[str, float]) -> None:
        with scope:
            await bucket.acquire()
            grants[label] = trio.current_time()

    for _ in range(64):
        bucket = TokenBucket(rate)
        await nursery.start(bucket.run)
        start = trio.current_time()
        grants: dict[str, float] = {}
        racing = trio.CancelScope(deadline=start + 1 / rate)
        async with trio.open_nursery() as waiters:
            for label, scope in [("a", trio.CancelScope()), ("b", racing), ("c", trio.CancelScope())]:
                waiters.start_soon(waiter, bucket, scope, label, grants)
                await trio.testing.wait_all_tasks_blocked()
        grants = {label: at - start for label, at in grants.items()}

        assert racing.cancelled_caught
        assert grants == {"a": 0, "c": 1 / rate}
        stats = bucket.statistics()
        assert stats.granted == 2
        outcomes.add(stats.given_back)
    # Both sides of the race were exercised (each has probability 1/2 a round).
    assert outcomes == {0, 1}


async def test_a_rate_change_applies_to_grants_not_yet_made(autojump_clock):
    limits = provider_limits()
    limits.configure("p", 0, 4)
    start = trio.current_time()
    grants: list[float] = []

    async def waiter() -> None:
        await limits.acquire_open_token("p")
        grants.append(trio.current_time() - start)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(waiter)
        await trio.sleep(0.375)
        # Grants so far at 0 and 0.25; 0.5 token earned at the old rate.
        notes = limits.configure("p", 0, 2)

    assert notes == ["provider 'p': open_qps lowered from 4 to 2 (smallest wins)"]
    assert grants == pytest.approx([0, 0.25, 0.625, 1.125, 1.625, 2.125], abs=TOLERANCE)


async def test_zero_disables_the_open_rate(autojump_clock):
    limits = provider_limits()
    assert limits.configure("free", 0, 0) == []
    start = trio.current_time()
    for _ in range(500):
        await limits.acquire_open_token("free")
        await limits.acquire_open_token("never-configured")
    assert trio.current_time() == start
    assert limits.open_rate_bucket("free") is None
    assert limits.limits("free") == ProviderLimits(capacity=0, open_qps=0)


async def test_open_qps_smallest_non_zero_wins_with_notes(autojump_clock):
    limits = provider_limits()
    assert limits.configure("p", 0, 10) == []
    assert limits.configure("p", 0, 10) == []
    assert limits.configure("p", 0, 20) == [
        "provider 'p': open_qps 20 requested but 10 is in force (smallest wins)"
    ]
    assert limits.configure("p", 0, 0) == [
        "provider 'p': open_qps unlimited (0) requested but 10 is in force (smallest wins)"
    ]
    assert limits.configure("p", 0, 2.5) == ["provider 'p': open_qps lowered from 10 to 2.5 (smallest wins)"]
    assert limits.limits("p").open_qps == 2.5


async def test_a_stopped_actor_fails_waiters_instead_of_hanging(autojump_clock):
    bucket = TokenBucket(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(bucket.run)
        await bucket.acquire()
        nursery.cancel_scope.cancel()
    with pytest.raises(RuntimeError, match="not running"):
        await bucket.acquire()


def test_bucket_rejects_bad_parameters():
    for rate in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="rate"):
            TokenBucket(rate)
    for burst in (0, 1.5, True):
        with pytest.raises(ValueError, match="burst"):
            TokenBucket(1, burst=burst)


# -- capacity ---------------------------------------------------------------


async def test_capacity_smallest_non_zero_wins_with_notes(autojump_clock):
    limits = provider_limits()
    limiter = limits.capacity("local")
    assert limiter.total_tokens == math.inf  # never configured: unlimited

    assert limits.configure("local", 4, 0) == []
    assert limits.capacity("local") is limiter
    assert limiter.total_tokens == 4
    assert limits.configure("local", 2, 0) == ["provider 'local': capacity lowered from 4 to 2 (smallest wins)"]
    assert limits.configure("local", 4, 0) == [
        "provider 'local': capacity 4 requested but 2 is in force (smallest wins)"
    ]
    assert limits.configure("local", 0, 0) == [
        "provider 'local': capacity unlimited (0) requested but 2 is in force (smallest wins)"
    ]
    assert limits.configure("local", 2, 0) == []
    assert limiter.total_tokens == 2
    assert limits.limits("local") == ProviderLimits(capacity=2, open_qps=0)


async def test_capacity_zero_is_unlimited(autojump_clock):
    limits = provider_limits()
    assert limits.configure("p", 0, 0) == []
    assert limits.capacity("p").total_tokens == math.inf
    assert limits.limits("p").capacity == 0


async def test_lowering_capacity_keeps_held_permits_and_gates_new_ones(autojump_clock):
    limits = provider_limits()
    limits.configure("p", 3, 0)
    limiter = limits.capacity("p")
    holders = [object() for _ in range(3)]
    for holder in holders:
        limiter.acquire_on_behalf_of_nowait(holder)
    limits.configure("p", 2, 0)
    assert limiter.borrowed_tokens == 3
    with pytest.raises(trio.WouldBlock):
        limiter.acquire_nowait()
    limiter.release_on_behalf_of(holders[0])
    with pytest.raises(trio.WouldBlock):
        limiter.acquire_nowait()  # 2 held, total 2
    limiter.release_on_behalf_of(holders[1])
    limiter.acquire_nowait()


@pytest.mark.parametrize("args", [(-1, 0), (1.5, 0), (True, 0), (0, -1), (0, math.inf), (0, math.nan), (0, "5")])
async def test_configure_rejects_bad_values(autojump_clock, args):
    with pytest.raises(ValueError, match="provider 'p'"):
        provider_limits().configure("p", *args)


durations = st.lists(st.integers(min_value=0, max_value=2000), min_size=20, max_size=20)


@settings(max_examples=100, deadline=None)
@given(
    capacities=st.tuples(st.integers(0, 6), st.integers(0, 6)),
    durations=st.tuples(durations, durations),
)
def test_orchestrations_in_one_run_share_the_capacity(capacities, durations):
    """Two concurrent ``launch`` calls never exceed the provider capacity together."""
    configured = [c for c in capacities if c]
    in_force = min(configured) if configured else math.inf
    holding = 0
    peak = 0
    limiters: list[trio.CapacityLimiter] = []

    async def hold(limiter: trio.CapacityLimiter, milliseconds: int) -> None:
        nonlocal holding, peak
        async with limiter:
            holding += 1
            peak = max(peak, holding)
            assert holding <= in_force
            await trio.sleep(milliseconds / 1000)
            holding -= 1

    async def orchestration(capacity: int, task_durations: list[int]) -> None:
        # Each orchestration finds the registry on its own, as `launch` does.
        limits = provider_limits()
        limits.configure("sandbox", capacity, 0)
        limiter = limits.capacity("sandbox")
        limiters.append(limiter)
        async with trio.open_nursery() as nursery:
            for milliseconds in task_durations:
                nursery.start_soon(hold, limiter, milliseconds)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for capacity, task_durations in zip(capacities, durations, strict=True):
                nursery.start_soon(orchestration, capacity, task_durations)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    assert limiters[0] is limiters[1]
    assert holding == 0
    # Reached, not just respected: 40 tasks start together.
    assert peak == min(in_force, 40)


async def test_orchestrations_share_one_registry_and_limiter(autojump_clock):
    async def orchestration(found: list[ProviderLimitRegistry]) -> None:
        found.append(provider_limits())

    found: list[ProviderLimitRegistry] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(orchestration, found)
        nursery.start_soon(orchestration, found)
    assert found[0] is found[1] is provider_limits()
    assert found[0].capacity("x") is found[1].capacity("x")


# -- lifetime ----------------------------------------------------------------


def test_each_trio_run_has_its_own_registry_and_its_actors_do_not_keep_it_alive():
    async def run_once(capacity: int) -> tuple[ProviderLimitRegistry, float]:
        limits = provider_limits()
        before = limits.capacity("p").total_tokens
        limits.configure("p", capacity, 5)
        for _ in range(3):
            await limits.acquire_open_token("p")
        return limits, before

    clock = trio.testing.MockClock(autojump_threshold=0)
    # trio.run returning at all shows the bucket actor (a system task) does
    # not keep the run alive.
    first, before_first = trio.run(run_once, 2, clock=clock)
    second, before_second = trio.run(run_once, 7, clock=trio.testing.MockClock(autojump_threshold=0))
    assert first is not second
    assert before_first == before_second == math.inf
    assert first.capacity("p").total_tokens == 2
    assert second.capacity("p").total_tokens == 7


# -- smallest wins among the orchestrations running now ------------------------


async def test_limits_last_only_while_their_orchestration_runs(autojump_clock):
    limits = provider_limits()
    limiter = limits.capacity("p")
    with limits.configured({"p": ProviderLimits(capacity=4, open_qps=10)}) as notes:
        assert notes == []
        with limits.configured({"p": ProviderLimits(capacity=2, open_qps=20)}) as notes:
            assert notes == [
                "provider 'p': capacity lowered from 4 to 2 (smallest wins)",
                "provider 'p': open_qps 20 requested but 10 is in force (smallest wins)",
            ]
            assert limits.limits("p") == ProviderLimits(capacity=2, open_qps=10)
        # The smaller capacity left with its orchestration; the rest stays.
        assert limits.limits("p") == ProviderLimits(capacity=4, open_qps=10)
    assert limits.limits("p") == ProviderLimits()
    assert limiter.total_tokens == math.inf
    assert limits.open_rate_bucket("p") is None
    # A later orchestration's larger values are taken as given.
    with limits.configured({"p": ProviderLimits(capacity=8, open_qps=40)}) as notes:
        assert notes == []
        assert limits.limits("p") == ProviderLimits(capacity=8, open_qps=40)
        assert limits.capacity("p") is limiter


async def test_withdrawing_a_rate_releases_its_waiters(autojump_clock):
    limits = provider_limits()
    start = trio.current_time()
    grants: list[float] = []

    async def waiter() -> None:
        await limits.acquire_open_token("p")
        grants.append(trio.current_time() - start)

    async with trio.open_nursery() as nursery:
        with limits.configured({"p": ProviderLimits(open_qps=1)}):
            for _ in range(4):
                nursery.start_soon(waiter)
            await trio.sleep(1.5)  # grants at 0 and 1
        # Withdrawn: nobody limits the rate any more.
    assert grants == pytest.approx([0, 1, 1.5, 1.5], abs=TOLERANCE)


async def test_a_raised_capacity_wakes_waiters_when_the_smaller_one_leaves(autojump_clock):
    limits = provider_limits()
    with limits.configured({"p": ProviderLimits(capacity=3)}):
        limiter = limits.capacity("p")
        holders = [object() for _ in range(3)]
        small = limits.configured({"p": ProviderLimits(capacity=1)})
        small.__enter__()
        limiter.acquire_on_behalf_of_nowait(holders[0])
        async with trio.open_nursery() as nursery:
            for holder in holders[1:]:
                nursery.start_soon(limiter.acquire_on_behalf_of, holder)
            await trio.testing.wait_all_tasks_blocked()
            assert limiter.borrowed_tokens == 1
            small.__exit__(None, None, None)
        assert limiter.borrowed_tokens == 3


async def test_sequential_launches_do_not_inherit_limits(autojump_clock, tmp_path):
    import agentcompass
    from agentcompass import Orchestration
    from agentcompass.testing import fake_request

    for capacity in (1, 3):
        orchestration = Orchestration(
            [fake_request(f"r{capacity}", log=f"limits-{capacity}", output_root=tmp_path)],
            task_concurrency=2,
            providers={"fake-env": ProviderLimits(capacity=capacity)},
        )
        with structlog.testing.capture_logs() as events:
            result = await agentcompass.launch(orchestration)
        assert result.status == "succeeded"
        # The second launch is not told that the first one's capacity is in force.
        assert [e for e in events if e["event"] == "provider_limits"] == []
        assert provider_limits().limits("fake-env") == ProviderLimits()
