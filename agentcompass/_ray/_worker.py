"""The worker side of the ``ray`` executor: one Ray actor, its own ``trio.run``.

A :class:`Worker` runs in a Ray worker process. Its constructor loads the
config's plugins and starts a :class:`WorkerRun`, a thread running
``trio.run``; the actor's methods (Ray calls them from its own threads,
several at once) talk to that Trio run only through two thread-safe points:

* :meth:`Worker.deliver` hands a numbered batch of driver messages to the
  Trio thread (``trio.from_thread.run_sync``); batches are applied in their
  order whatever order Ray's threads run them in.
* :meth:`Worker.poll` is the driver's long poll of the outbox: it returns
  every message queued since the last poll, or waits up to ``wait`` seconds
  for one.

Tasks run with the ordinary task code (the seam's ``run_job``) on a
:class:`RequestContext` built here from the request's refs, with a
:class:`WorkerGrants` and a :class:`WorkerReporter` that turn the
``Grants`` and ``TaskReporter`` calls into outbox messages (and wait for
the driver's grant or acknowledgement where the protocol says the caller
waits). Nothing here writes the run directory.

The messages are ``_messages``' classes; :meth:`WorkerRun.deliver`
dispatches the driver's on their class.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from .. import _registry
from .._models import open_model_clients
from .._seam import ForwardingReporter, GraceClock, Report, RequestContext, run_job
from ..runtime._cleanup import using_cleanup_clock
from ..runtime._values import RunRequest
from ._messages import (
    Abandon,
    Acked,
    AcquireCapacity,
    CancelTask,
    Forget,
    Granted,
    OpenToken,
    Release,
    Reported,
    Shutdown,
    Stages,
    StartTask,
    Sweep,
    Swept,
    TaskCancelled,
    TaskDone,
    TaskFailed,
)

__all__ = ["Worker", "WorkerGrants", "WorkerReporter", "WorkerRun"]

#: Seconds without a poll after which the driver counts as gone.
DRIVER_SILENCE = 15.0
#: A poll that found fewer messages waits this long once more for others.
COALESCE_SECONDS = 0.003
COALESCE_MESSAGES = 64


def portable_error(exc: BaseException) -> bytes:
    """``exc`` pickled, or a ``RuntimeError`` with its line if it does not pickle."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 - any exception may fail to round-trip
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        data = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {text}" if text else type(exc).__name__))
    return data


class WorkerGrants:
    """``Grants`` over the driver exchange: ask, wait for the grant; a
    cancelled waiter tells the driver it left (the driver then gives back
    what it granted meanwhile, or stops waiting for it)."""

    def __init__(self, worker: WorkerRun):
        self._worker = worker
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.Event] = {}
        self._held: dict[int, int] = {}

    async def _ask(self, message: type[AcquireCapacity | OpenToken], provider: str) -> int:
        grant = next(self._ids)
        granted = self._waiting[grant] = trio.Event()
        self._worker.post(message(grant, provider))
        try:
            await granted.wait()
        except BaseException:
            self._waiting.pop(grant, None)
            self._worker.post(Abandon(grant))
            raise
        return grant

    def granted(self, grant: int) -> None:
        event = self._waiting.pop(grant, None)
        if event is not None:
            event.set()

    async def acquire_capacity(self, provider: str, holder: object) -> None:
        self._held[id(holder)] = await self._ask(AcquireCapacity, provider)

    def release_capacity(self, provider: str, holder: object) -> None:
        grant = self._held.pop(id(holder), None)
        if grant is not None:
            self._worker.post(Release(grant))

    async def open_token(self, provider: str) -> None:
        await self._ask(OpenToken, provider)


class WorkerReporter(ForwardingReporter):
    """``TaskReporter`` over the driver exchange, for one request: each call
    goes as the seam's message in a :class:`Reported`; an answered one
    returns once the driver applied it, as in process (a driver that exits
    at once, on a second signal, still has the journal line)."""

    def __init__(self, worker: WorkerRun, request_id: int, tag: str):
        super().__init__(tag, lambda report: worker.post(Reported(request_id, report)), partial(worker.ask, request_id))
        self._worker = worker
        self._request_id = request_id

    def event(self, kind: str, **fields: Any) -> None:
        if kind == "attempt_started":
            # A full try starts with setup; an evaluation-only one evaluates.
            stage = "setup" if fields.get("scope") == "attempt" else "evaluate"
            self._worker.stage(self._request_id, fields["task"], fields["attempt"], stage)
        super().event(kind, **fields)


class Worker:
    """One worker, the Ray actor: loads the plugins, then hands each call to
    the worker's Trio run (:class:`WorkerRun`).

    Its methods are all sync, and must stay so: Ray makes an actor with any
    ``async def`` method an asyncio actor, whose sync methods run one at a
    time on its event loop; a poll waiting for messages would then hold
    back every delivery, each grant and acknowledgement waiting out the
    poll (``tests/ray_executor/test_ray_worker_calls.py``)."""

    def __init__(
        self,
        index: int,
        plugins: list[str],
        config_dir: str | None,
        modules: list[tuple[str, str | None]],
        grace: float,
        connections: int,
    ):
        if threading.current_thread() is threading.main_thread():
            # A Ray worker may inherit SIGINT ignored; Ray's own cancellation
            # of a task relies on the default handler.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        # The config's plugins, then every module that registered a
        # component in the driver (an SDK user's own, the test fakes).
        _registry.load_plugins(list(plugins), Path(config_dir) if config_dir else None)
        _registry.import_modules(modules)
        self._trio = WorkerRun(index, grace, connections)

    def pid(self) -> int:
        return os.getpid()

    def deliver(self, number: int, messages: list[Any]) -> None:
        """Apply the driver's batch ``number`` (and any later one waiting for it)."""
        self._trio.deliver(number, messages)

    def poll(self, wait: float) -> list[Any]:
        """Every message queued since the last poll (waits up to ``wait`` seconds for one)."""
        return self._trio.poll(wait)


class WorkerRun:
    """The worker's Trio run, in a thread of the actor's process, and its outbox."""

    def __init__(self, index: int, grace: float, connections: int):
        self._index = index
        self._grace_seconds = grace
        self._connections = connections
        self._outbox: list[Any] = []
        #: (request id, task, attempt) -> the stage it entered since the last poll
        self._stages: dict[tuple[int, str, int], str] = {}
        self._changed = threading.Condition()
        self._next_batch = 0
        self._early: dict[int, list[Any]] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            StartTask: self._start,
            Granted: lambda message: self.grants.granted(message.grant),
            Acked: self._acked,
            Shutdown: lambda message: self._shut_down(message.remaining),
            CancelTask: self._cancel,
            Forget: self._forget,
            Sweep: lambda message: self._nursery.start_soon(self._sweep, message),
        }
        self._ready = threading.Event()
        self._polled = time.monotonic()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="agentcompass-worker", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    # -- what the actor calls, from Ray's threads ----------------------------------

    def deliver(self, number: int, messages: list[Any]) -> None:
        """Apply the driver's batch ``number`` (and any later one waiting for it)."""
        trio.from_thread.run_sync(self._inbox.send_nowait, (number, messages), trio_token=self._token)

    def poll(self, wait: float) -> list[Any]:
        """Every message queued since the last poll (waits up to ``wait`` seconds for one)."""
        self._polled = time.monotonic()
        with self._changed:
            if not self._outbox:
                self._changed.wait(wait)
            if 0 < len(self._outbox) < COALESCE_MESSAGES:
                # A moment more gathers what the same wake-up of the tasks
                # is about to post: one round trip for many messages.
                self._changed.wait(COALESCE_SECONDS)
            out, self._outbox = self._outbox, []
            if self._stages:
                # The latest stage of each attempt, once per poll however
                # many it went through: the driver needs it only if this
                # worker is lost.
                out.append(Stages(self._stages))
                self._stages = {}
        return out

    # -- the Trio side -------------------------------------------------------------

    def stage(self, request_id: int, task_id: str, attempt: int, stage: str) -> None:
        """Attempt ``attempt`` of ``task_id`` entered ``stage`` (goes with the next poll)."""
        with self._changed:
            self._stages[(request_id, task_id, attempt)] = stage

    def post(self, message: Any) -> None:
        with self._changed:
            self._outbox.append(message)
            self._changed.notify()

    async def ask(self, request_id: int, report: Report) -> None:
        """Post ``report`` with an acknowledgement number; wait for the driver's
        ack (``OSError`` when the driver says applying it failed)."""
        number = next(self._acks)
        acked = self._waiting_acks[number] = trio.Event()
        self.post(Reported(request_id, report, number))
        try:
            await acked.wait()
        finally:
            self._waiting_acks.pop(number, None)
        failed = self._failed_acks.pop(number, None)
        if failed is not None:
            raise OSError(failed)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor's caller
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.grace = GraceClock(self._grace_seconds)
        self.grants = WorkerGrants(self)
        self._acks = itertools.count(1)
        self._waiting_acks: dict[int, trio.Event] = {}
        #: Acks that carried the driver's failure (the plan could not be written).
        self._failed_acks: dict[int, str] = {}
        self._contexts: dict[int, RequestContext] = {}
        self._requests: dict[int, RunRequest] = {}
        self._scopes: dict[int, trio.CancelScope] = {}
        self._inbox, inbox = trio.open_memory_channel[tuple[int, list[Any]]](math.inf)
        with using_cleanup_clock(self.grace):
            async with open_model_clients(self._connections, close_deadline=self.grace.deadline):
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._watch_driver)
                    self._ready.set()
                    # Tasks start from this task, not from the Ray thread's
                    # call: they inherit the cleanup clock and model clients.
                    async for number, messages in inbox:
                        self._deliver(number, messages)

    async def _watch_driver(self) -> None:
        """A driver that stopped polling is gone (killed, its host lost): stop
        every task within the grace, so that no sandbox is opened behind the
        back of the run's next ``--reuse``, which reaps and sweeps by tag.
        Ray kills an actor whose owner died too; this bounds the wait."""
        while True:
            await trio.sleep(1)
            if time.monotonic() - self._polled > DRIVER_SILENCE:
                self._shut_down(self._grace_seconds)
                for scope in self._scopes.values():
                    scope.cancel()

    def _deliver(self, number: int, messages: list[Any]) -> None:
        self._early[number] = messages
        while self._next_batch in self._early:
            for message in self._early.pop(self._next_batch):
                self._handlers[type(message)](message)
            self._next_batch += 1

    def _start(self, message: StartTask) -> None:
        self._requests.setdefault(message.request_id, message.job.request)
        self._nursery.start_soon(self._run, message)

    def _acked(self, message: Acked) -> None:
        event = self._waiting_acks.get(message.number)
        if event is not None:
            if message.error is not None:
                self._failed_acks[message.number] = message.error
            event.set()

    def _cancel(self, message: CancelTask) -> None:
        self._shut_down(message.remaining)
        scope = self._scopes.get(message.key)
        if scope is not None:
            scope.cancel()

    def _forget(self, message: Forget) -> None:
        self._contexts.pop(message.request_id, None)
        self._requests.pop(message.request_id, None)

    def _shut_down(self, remaining: float) -> None:
        """The driver's shutdown began: every cleanup here ends within ``remaining`` seconds."""
        if self.grace.shutdown_at is None:
            self.grace.hard_deadline = min(self.grace.hard_deadline, trio.current_time() + remaining)
            self.grace.begin()

    async def _run(self, message: StartTask) -> None:
        key, request_id = message.key, message.request_id
        with trio.CancelScope() as scope:
            self._scopes[key] = scope
            try:
                ctx = self._contexts.get(request_id)
                if ctx is None:
                    request = self._requests[request_id]
                    reporter = WorkerReporter(self, request_id, message.tag)
                    ctx = RequestContext.build(request, self.grants, reporter, self.grace)
                    # Session names are unique across the run's workers.
                    ctx.name_prefix = f"w{self._index}-"
                    ctx.on_stage = partial(self.stage, request_id)
                    self._contexts[request_id] = ctx
                record = await run_job(ctx, message.job)
            except Exception as exc:  # noqa: BLE001 - the driver's run_task raises it
                self.post(TaskFailed(key, portable_error(exc)))
            else:
                self.post(TaskDone(key, record))
            finally:
                self._scopes.pop(key, None)
            return
        self.post(TaskCancelled(key))

    async def _sweep(self, message: Sweep) -> None:
        """Sweep each ``(provider, config, tag)`` on this node; report notes."""
        notes = []
        for provider, config, tag in message.targets:
            try:
                env = _registry.build("environment", provider, config)
                await env.sweep(tag)
            except Exception as exc:  # noqa: BLE001 - one failed sweep must not stop the others
                notes.append(f"sweep of {provider} sandboxes tagged {tag} failed: {type(exc).__name__}: {exc}")
        self.post(Swept(message.number, notes))
