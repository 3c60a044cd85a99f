"""The open-rate limiter (``open_qps``, SPEC section 7): a token bucket of our own, exact under a mock clock.

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
"""

from __future__ import annotations

import enum
import math

import attrs
import trio

__all__ = ["BucketStatistics", "TokenBucket"]


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
