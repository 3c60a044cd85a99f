"""Provider limits (SPEC section 7): per Environment provider, a capacity
limiter and an open-rate token bucket, shared by every orchestration that runs
in one Trio run.

Don't confuse the capacity limiter with a token bucket. They bound different
things:

* **capacity** bounds how many sessions of a provider exist *at once*. It is a
  :class:`trio.CapacityLimiter`: a permit is held for the life of a session and
  given back when the session closes. It says nothing about how fast sessions
  start.
* **open rate** (``open_qps``) bounds how many session opens may *start* per
  second, whatever their lifetime (a provider API's request rate). It is a
  :class:`TokenBucket`: starting an open spends a token that is never given
  back; tokens refill at ``open_qps`` per second up to ``burst``.

The token bucket is :mod:`._token_bucket`'s (its algorithm and cancellation
rules are described there).

Smallest wins
-------------
An orchestration configures its providers for as long as it runs
(:meth:`ProviderLimitRegistry.configured`). For each limit the smallest
non-zero value among the orchestrations running at that moment is in force: a
larger value never raises it and ``0`` (no limit) never lifts a configured one.
When an orchestration ends its values are withdrawn, and the limit becomes the
smallest of those still running (or none). Permits already held when a
capacity is lowered stay held; new acquisitions wait until the holders drop
below the new total. Configuring returns one note per conflict for the caller
to log.

Lifetime
--------
The registry lives in a :class:`trio.lowlevel.RunVar`, so every ``launch`` in
the same ``trio.run`` shares it and separate runs never do. Bucket actors are
system tasks (a provider's bucket is kept, unlimited, while no running
orchestration sets its open rate): the registry outlives any orchestration, and system tasks are
cancelled when the main task exits, so they never keep ``trio.run`` alive. A
crashing system task would become :exc:`trio.TrioInternalError` and tear down
the embedding application's whole run; instead a crashed actor hands its
failure to every current and future waiter as a :exc:`RuntimeError` chained
to the original exception.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping

import attrs
import trio

from ._logging import get_logger
from ._token_bucket import BucketStatistics as BucketStatistics
from ._token_bucket import TokenBucket as TokenBucket
from .runtime._values import ProviderLimits

__all__ = [
    "BucketStatistics",
    "ProviderLimitRegistry",
    "TokenBucket",
    "provider_limits",
]


@attrs.define(eq=False)
class _Provider:
    capacity: trio.CapacityLimiter = attrs.Factory(lambda: trio.CapacityLimiter(math.inf))
    bucket: TokenBucket | None = None
    # One value per running orchestration that configured the provider (0: no limit).
    capacities: list[int] = attrs.Factory(list)
    rates: list[float] = attrs.Factory(list)


def _smallest(values: list[int] | list[float]) -> float | None:
    limits = [v for v in values if v]
    return min(limits) if limits else None


def _check_limits(provider: str, capacity: int, open_qps: float) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"provider {provider!r}: capacity must be an int >= 0, not {capacity!r}")
    if (
        isinstance(open_qps, bool)
        or not isinstance(open_qps, int | float)
        or not math.isfinite(open_qps)
        or open_qps < 0
    ):
        raise ValueError(f"provider {provider!r}: open_qps must be a finite number >= 0, not {open_qps!r}")


def _overruled(provider: str, name: str, requested: float, in_force: float | None) -> str | None:
    """The note saying ``requested`` is not taken as given (None: it is)."""
    if in_force is None or requested == in_force:
        return None
    if requested and requested < in_force:
        return f"provider {provider!r}: {name} lowered from {_fmt(in_force)} to {_fmt(requested)} (smallest wins)"
    asked = _fmt(requested) if requested else "unlimited (0)"
    return f"provider {provider!r}: {name} {asked} requested but {_fmt(in_force)} is in force (smallest wins)"


def _fmt(value: float) -> str:
    # 10.0 -> "10", 2.5 -> "2.5", without the 6-digit rounding of ":g".
    return format(value, ".15g")


async def _serve_in_system_task(bucket: TokenBucket) -> None:
    try:
        await bucket.run()
    except Exception:
        # Logged here and handed by the bucket to every waiter. Raising it out
        # of a system task would instead become TrioInternalError and cancel
        # the embedding application's whole run.
        log = get_logger(__name__)
        log.exception("open-rate limiter crashed", provider=bucket.name)


@attrs.define(eq=False)
class ProviderLimitRegistry:
    """The provider limits in force in one Trio run; get it with :func:`provider_limits`.

    A provider never configured is unlimited: its capacity limiter has
    ``math.inf`` tokens and :meth:`acquire_open_token` returns at once. The
    limiter object of a provider never changes, so a limiter fetched before a
    later ``configure`` sees the new total.
    """

    _providers: dict[str, _Provider] = attrs.field(init=False, factory=dict)

    def _provider(self, provider: str) -> _Provider:
        entry = self._providers.get(provider)
        if entry is None:
            entry = self._providers[provider] = _Provider()
        return entry

    def configure(self, provider: str, capacity: int, open_qps: float) -> list[str]:
        """Add one orchestration's limits for ``provider``; the smallest non-zero wins.

        ``0`` disables a limit. The values stay until :meth:`withdraw` removes
        them (:meth:`configured` pairs the two). Returns human-readable notes,
        one per value that was not taken as given (lowered a limit in force,
        or was overruled by a smaller one); the caller logs them. Raises
        :exc:`ValueError` for a negative or non-numeric value. Must be called
        inside the Trio run.
        """
        _check_limits(provider, capacity, open_qps)
        entry = self._provider(provider)
        found = (
            _overruled(provider, "capacity", capacity, _smallest(entry.capacities)),
            _overruled(provider, "open_qps", open_qps, _smallest(entry.rates)),
        )
        notes = [note for note in found if note is not None]
        entry.capacities.append(capacity)
        entry.rates.append(open_qps)
        self._apply(provider, entry)
        return notes

    def withdraw(self, provider: str, capacity: int, open_qps: float) -> None:
        """Remove values an earlier :meth:`configure` added: the smallest of the rest is in force."""
        entry = self._provider(provider)
        entry.capacities.remove(capacity)
        entry.rates.remove(open_qps)
        self._apply(provider, entry)

    @contextlib.contextmanager
    def configured(self, providers: Mapping[str, ProviderLimits]) -> Iterator[list[str]]:
        """Apply one orchestration's limits while the block runs; yields the notes of :meth:`configure`."""
        applied: list[tuple[str, int, float]] = []
        notes: list[str] = []
        try:
            for provider, limits in providers.items():
                notes += self.configure(provider, limits.capacity, limits.open_qps)
                applied.append((provider, limits.capacity, limits.open_qps))
            yield notes
        finally:
            for values in applied:
                self.withdraw(*values)

    def _apply(self, provider: str, entry: _Provider) -> None:
        capacity = _smallest(entry.capacities)
        # Raising the total (or lifting it) wakes waiters; lowering keeps held permits.
        entry.capacity.total_tokens = math.inf if capacity is None else int(capacity)
        rate = _smallest(entry.rates)
        bucket = entry.bucket
        if rate is None:
            if bucket is not None:
                bucket.set_unlimited()
        elif bucket is None:
            entry.bucket = TokenBucket(rate, name=provider)
            trio.lowlevel.spawn_system_task(
                _serve_in_system_task, entry.bucket, name=f"agentcompass open-rate actor {provider!r}"
            )
        elif bucket.unlimited or rate != bucket.rate:
            bucket.set_rate(rate)

    def limits(self, provider: str) -> ProviderLimits:
        """The limits in force for ``provider`` (``0`` where there is none), e.g. for ``run_info``."""
        entry = self._providers.get(provider)
        if entry is None:
            return ProviderLimits()
        total = entry.capacity.total_tokens
        return ProviderLimits(
            capacity=0 if total == math.inf else int(total),
            open_qps=entry.bucket.rate if entry.bucket is not None and not entry.bucket.unlimited else 0,
        )

    def capacity(self, provider: str) -> trio.CapacityLimiter:
        """The provider's capacity limiter (``math.inf`` tokens until configured)."""
        return self._provider(provider).capacity

    def open_rate_bucket(self, provider: str) -> TokenBucket | None:
        """The provider's open-rate bucket, or None while its open rate is unlimited."""
        entry = self._providers.get(provider)
        if entry is None or entry.bucket is None or entry.bucket.unlimited:
            return None
        return entry.bucket

    async def acquire_open_token(self, provider: str) -> None:
        """Wait for the provider's next open-rate token (FIFO); a cancelled call consumes none.

        Returns at once (after a checkpoint) when the provider has no open rate.
        """
        bucket = self.open_rate_bucket(provider)
        if bucket is None:
            await trio.lowlevel.checkpoint()
            return
        await bucket.acquire()


_REGISTRY: trio.lowlevel.RunVar[ProviderLimitRegistry] = trio.lowlevel.RunVar("agentcompass.provider_limits")


def provider_limits() -> ProviderLimitRegistry:
    """The provider-limit registry of the current Trio run, created on first use."""
    try:
        return _REGISTRY.get()
    except LookupError:
        registry = ProviderLimitRegistry()
        _REGISTRY.set(registry)
        return registry
