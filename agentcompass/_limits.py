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

The token bucket
----------------
Known third-party Trio buckets were seen not to throttle, so this one is ours
and is proven under :class:`trio.testing.MockClock`. One actor task per bucket
serves every waiter. A waiter sends a request over an unbuffered memory
channel; the channel parks blocked senders in arrival order, so fairness (FIFO)
is the channel's. The actor takes one request at a time, waits until the
bucket holds a whole token, then grants it if the waiter still waits. Tokens
are refilled lazily from :func:`trio.current_time`, never by a ticking task,
so a mock clock drives the bucket exactly. The bucket starts full.

``burst`` (the bucket size) defaults to 1: N opens at rate r then take at least
(N - 1) / r seconds, and never two opens closer than 1 / r less the actor's
own wake-up lateness (credited, at most half an interval, so that timer
granularity does not lower the achieved rate; see ``_wait_for_token``). With ``burst = b``
the first b opens go at once and N opens take at least (N - b) / r.

A cancelled waiter consumes no token, at whatever point it is cancelled:

* still queued in ``send``: the actor never sees it;
* held by the actor while it waits for the next token: the waiter marks its
  request abandoned; the actor skips it and the token it was waiting for goes
  to the next waiter at the same instant, as if the cancelled one had never
  queued;
* the grant and the cancellation cross (the actor grants in the same
  scheduling batch in which the cancellation was delivered, before the waiter
  ran): the waiter gives the token back to the bucket (capped at ``burst``)
  and wakes the actor, so the next waiter gets it at once. This is also the
  rule a grant crossing a cancellation over the wire will follow once
  remote executors ask the driver for tokens (SPEC section 11).

A rate change (:meth:`TokenBucket.set_rate`) refills at the old rate up to now
and applies to every grant not yet made, including the one the actor is
waiting for.

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
import enum
import math
from collections.abc import Iterator, Mapping

import attrs
import trio

from ._logging import get_logger
from .runtime._values import ProviderLimits

__all__ = [
    "BucketStatistics",
    "ProviderLimitRegistry",
    "TokenBucket",
    "provider_limits",
]


class _State(enum.Enum):
    PENDING = "pending"
    GRANTED = "granted"
    ABANDONED = "abandoned"
    FAILED = "failed"


@attrs.define(eq=False)
class _Request:
    """One waiter's request; the actor and the waiter both read and write its state."""

    state: _State = _State.PENDING
    decided: trio.Event = attrs.Factory(trio.Event)

    def decide(self, state: _State) -> None:
        self.state = state
        self.decided.set()


@attrs.frozen
class BucketStatistics:
    """A snapshot of a :class:`TokenBucket` (like trio's ``statistics()``).

    ``granted`` counts tokens spent (grants given back are not counted);
    ``given_back`` counts grants that crossed their waiter's cancellation.
    """

    rate: float
    burst: int
    tokens: float
    waiting: int
    granted: int
    given_back: int


def _check_rate(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        raise TypeError(f"rate must be a number, not {rate!r}")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a finite number > 0, not {rate!r}")
    return float(rate)


@attrs.define(eq=False)
class TokenBucket:
    """A fair (FIFO) token bucket granting ``rate`` tokens a second, ``burst`` at most at once.

    :meth:`acquire` waits for one token. The bucket only grants while its actor
    :meth:`run` is running (``await nursery.start(bucket.run)``, or a system
    task as :class:`ProviderLimitRegistry` does); once the actor has stopped,
    :meth:`acquire` raises :exc:`RuntimeError`. See the module docstring for
    the algorithm and what cancellation does.
    """

    rate: float = attrs.field(converter=_check_rate)
    burst: int = attrs.field(default=1, kw_only=True)
    name: str = attrs.field(default="", kw_only=True)

    _tokens: float = attrs.field(init=False)
    # None until the first refill: the bucket may be built before its Trio run.
    _stamp: float | None = attrs.field(init=False, default=None)
    # Replaced after every set: waking the actor is "set the current one".
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)
    _send: trio.MemorySendChannel[_Request] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[_Request] = attrs.field(init=False)
    _held: _Request | None = attrs.field(init=False, default=None)
    _started: bool = attrs.field(init=False, default=False)
    _failure: BaseException | None = attrs.field(init=False, default=None)
    _granted: int = attrs.field(init=False, default=0)
    _given_back: int = attrs.field(init=False, default=0)
    # Set while no running orchestration limits the open rate: grants go at once.
    _unlimited: bool = attrs.field(init=False, default=False)

    @burst.validator
    def _check_burst(self, _attribute: object, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"burst must be an int >= 1, not {value!r}")

    def __attrs_post_init__(self) -> None:
        self._tokens = float(self.burst)
        # Unbuffered: a request is either still queued with its sender or
        # held by the actor, never sitting in a buffer nobody owns.
        self._send, self._receive = trio.open_memory_channel[_Request](0)

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self.rate!r}, burst={self.burst!r}, name={self.name!r})"

    # -- bucket arithmetic (synchronous; the actor and waiters share it) --

    def _refill(self) -> None:
        now = trio.current_time()
        if self._stamp is not None and now > self._stamp:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        if self._stamp is None or now > self._stamp:
            self._stamp = now

    def _wake_actor(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def set_rate(self, rate: float) -> None:
        """Change the rate; it applies to every grant not yet made."""
        rate = _check_rate(rate)
        # Tokens earned so far were earned at the old rate.
        self._refill()
        if self._unlimited:
            # Limited again: start full, like a new bucket.
            self._unlimited = False
            self._tokens = float(self.burst)
        self.rate = rate
        self._wake_actor()

    def set_unlimited(self) -> None:
        """Grant every waiter at once until the next :meth:`set_rate`."""
        self._unlimited = True
        self._wake_actor()

    @property
    def unlimited(self) -> bool:
        """Whether the bucket grants at once (see :meth:`set_unlimited`)."""
        return self._unlimited

    def _give_back(self) -> None:
        self._refill()
        self._tokens = min(float(self.burst), self._tokens + 1)
        self._granted -= 1
        self._given_back += 1
        self._wake_actor()

    def statistics(self) -> BucketStatistics:
        """``tokens`` is refilled to now; ``waiting`` counts queued and held waiters."""
        self._refill()
        held = self._held is not None and self._held.state is _State.PENDING
        return BucketStatistics(
            rate=self.rate,
            burst=self.burst,
            tokens=self._tokens,
            waiting=self._send.statistics().tasks_waiting_send + int(held),
            granted=self._granted,
            given_back=self._given_back,
        )

    # -- the waiter side --

    def _stopped_error(self) -> RuntimeError:
        what = f"open-rate limiter {self.name!r}" if self.name else "open-rate limiter"
        if self._failure is not None:
            return RuntimeError(f"{what} crashed: {self._failure!r}")
        return RuntimeError(f"{what} is not running")

    async def acquire(self) -> None:
        """Wait for one token, in arrival order; a cancelled call consumes none."""
        if self._failure is not None:
            await trio.lowlevel.checkpoint()
            raise self._stopped_error() from self._failure
        request = _Request()
        try:
            await self._send.send(request)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._stopped_error() from self._failure
        # From here the actor holds the request: whatever interrupts the wait
        # must leave the bucket as if this waiter had never queued.
        finished = False
        try:
            await request.decided.wait()
            finished = True
        finally:
            if not finished:
                if request.state is _State.GRANTED:
                    self._give_back()
                elif request.state is _State.PENDING:
                    request.state = _State.ABANDONED
        if request.state is _State.FAILED:
            raise self._stopped_error() from self._failure

    # -- the actor --

    async def _wait_for_token(self) -> None:
        while True:
            self._refill()
            if self._unlimited:
                self._tokens = max(self._tokens, 1.0)
            if self._tokens >= 1:
                return
            changed = self._changed
            ready_at = trio.current_time() + (1 - self._tokens) / self.rate
            with trio.move_on_at(ready_at) as timer:
                await changed.wait()
            if timer.cancelled_caught:
                # The computed instant has come: a shortfall left now is float
                # rounding, and waiting for it could spin without the clock
                # advancing (a mock clock only jumps when every task blocks).
                self._refill()
                # Credit the actor's wake-up lateness (at most half a token) so
                # grants keep to the rate's schedule (bench: ``open_rate``).
                late = trio.current_time() - ready_at
                self._tokens = max(self._tokens, 1.0 + min(max(late, 0.0) * self.rate, 0.5))
                return

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The actor: grant tokens until cancelled. Run exactly once per bucket.

        If it crashes, the failure is recorded and re-raised here, and every
        current and future waiter raises :exc:`RuntimeError` chained to it.
        """
        if self._started:
            raise RuntimeError("a TokenBucket is served by exactly one actor")
        self._started = True
        try:
            with self._receive:
                task_status.started()
                async for request in self._receive:
                    self._held = request
                    await self._wait_for_token()
                    # Only now, with the token due, is it taken: a waiter that
                    # left meanwhile leaves the token to the next one.
                    if request.state is _State.PENDING:
                        self._tokens -= 1
                        self._granted += 1
                        request.decide(_State.GRANTED)
                    self._held = None
        except Exception as exc:
            self._failure = exc
            raise
        finally:
            # Closing the receive side (above) fails queued senders; the held
            # waiter must be woken by hand.
            held, self._held = self._held, None
            if held is not None and held.state is _State.PENDING:
                held.decide(_State.FAILED)


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
