"""The driver side of the ``ray`` executor (SPEC section 11).

The driver keeps everything SPEC 7 gives the orchestrator: ordering, the
store, progress, the retry budget's bookkeeping and the provider limits.
:class:`RayExecutor` hands each task to a :class:`~._worker.Worker` actor
and plays, for that task, the ``Grants`` and ``TaskReporter`` the task code
calls on the worker.

The exchange
------------
Each worker has one *link* on the driver, served by two Trio tasks:

* a **pump** long-polls the worker's outbox (``Worker.poll``) and applies
  every message in order: progress events, session journal lines and
  checkpoints go straight to the request's reporter; a discarded try is
  made durable, then acknowledged; a capacity or open-token request starts
  a grant task that waits on the driver's own limiter and answers
  ``grant``; a result ends the task's ``run_task`` here. The Ray call
  (``ray.get`` of the poll) waits in a worker thread
  (``trio.to_thread.run_sync``), never on the Trio loop.
* a **sender** ships what the driver has for the worker (starts, grants,
  acknowledgements, cancels) as numbered batches (``Worker.deliver``);
  submitting a Ray call does not block, and the worker applies batches in
  their numbers' order.

Polling from the driver, rather than workers calling a driver actor, keeps
every limit and every write in the driver's one Trio run: nothing of the
driver runs in a Ray thread, and a worker never needs the driver's address.

Cancellation and loss
---------------------
When a task's ``run_task`` here is cancelled (the deadline, a signal, the
caller's cancel scope), the worker is told to cancel that task's scope and
that shutdown began, with the grace left: its cleanup closes its sessions
within the same deadline. ``run_task`` waits for the worker's answer until
the grace deadline. A worker whose poll fails (its process died, its node
was lost) fails only its tasks' running attempts: each gets FATAL
``worker_lost`` in the stage the worker last reported for it (each poll
carries the latest stage of the attempts that moved since the last), its
permits go back, the sessions it journalled open are reaped, and the
attempt is retried per the retry budget on another worker (the attempts
already checkpointed are kept): the seam's ``after_loss`` applies the
attempt scope's rule.

The messages are ``_messages``' classes, the reporter's calls the seam's
own; the pump dispatches each on its class (``RayExecutor._handlers``).
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import trio

from .. import _registry
from .._logging import debug_enabled, get_logger
from .._seam import (
    Checkpoint,
    GraceClock,
    LostTry,
    ProgressEvent,
    Report,
    SessionClosed,
    SessionOpened,
    TaskJob,
    after_loss,
)
from ..runtime._executor import Executor, Grants, TaskReporter
from ..runtime._results import Phase, TaskRecord
from ..runtime._values import RunRequest
from ._grants import GrantDesk
from ._link import LOST, DriverRequest, Link, Remote
from ._messages import (
    Abandon,
    Acked,
    AcquireCapacity,
    CancelTask,
    Forget,
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

__all__ = ["RayExecutor"]

log = get_logger("agentcompass.ray")

#: How long one poll of a worker's outbox waits for a message.
POLL_WAIT = 0.5
#: How long the sender lets messages gather before a batch goes.
SEND_COALESCE = 0.002


class RayExecutor(Executor):
    """Runs tasks on Ray worker actors (see the module docstring)."""

    def __init__(self, ray: Any, actors: list[tuple[Any, int]], worker_concurrency: int):
        self._ray = ray
        self.links = [Link(i, actor, pid) for i, (actor, pid) in enumerate(actors)]
        self.worker_concurrency = worker_concurrency
        self._keys = itertools.count(1)
        self._remotes: dict[int, Remote] = {}
        self._requests: dict[int, DriverRequest] = {}
        self._request_ids: dict[int, int] = {}
        # Never reused: a forgotten request's id in a worker's messages
        # must not name a request that started after it.
        self._request_numbers = itertools.count(1)
        self._room = trio.lowlevel.ParkingLot()
        self._desk = GrantDesk()
        self._grace: GraceClock | None = None
        self._nursery: trio.Nursery | None = None
        self._sweeps: dict[int, tuple[int, trio.Event, list[str]]] = {}
        self._closing = False
        self._handlers: dict[type, Callable[[Link, Any], Awaitable[None]]] = {
            Reported: self._on_reported,
            Stages: self._on_stages,
            AcquireCapacity: self._desk.ask,
            OpenToken: self._desk.ask,
            Abandon: self._desk.abandon,
            Release: self._desk.release,
            TaskDone: self._on_end,
            TaskFailed: self._on_end,
            TaskCancelled: self._on_end,
            Swept: self._on_swept,
        }
        # The driver's bookkeeping of a report, before it reaches the request's reporter.
        self._observers: dict[type, Callable[[Link, int, DriverRequest, Any], Report]] = {
            ProgressEvent: self._saw_event,
            SessionOpened: self._saw_opened,
            SessionClosed: self._saw_closed,
            Checkpoint: self._saw_checkpoint,
        }

    # -- lifetime -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, grace: GraceClock) -> AsyncIterator[None]:
        """The links' pumps and senders, for the orchestration's work. On the
        way out what is still open is swept by each run's tag on every worker."""
        self._grace = grace
        async with trio.open_nursery() as nursery:
            self._nursery = self._desk.nursery = nursery
            for link in self.links:
                nursery.start_soon(self._pump, link)
                nursery.start_soon(self._sender, link)
            try:
                yield
            finally:
                with trio.move_on_at(grace.deadline(), shield=True):
                    await self._sweep_leftovers()
                self._closing = True
                nursery.cancel_scope.cancel()

    # -- Executor -----------------------------------------------------------------

    async def run_task(self, job: TaskJob, grants: Grants, reporter: TaskReporter) -> TaskRecord:
        assert self._grace is not None, "RayExecutor.running() is not entered"
        self._desk.grants = grants
        request_id = self._request_ids.get(id(job.request))
        if request_id is None:
            request_id = self._request_ids[id(job.request)] = next(self._request_numbers)
            self._requests[request_id] = DriverRequest(job.request, reporter)
        while True:
            # No attempt starts again once the run is stopping.
            await trio.lowlevel.checkpoint_if_cancelled()
            link = await self._pick()
            if link is None:
                raise RuntimeError("every Ray worker of the run was lost")
            remote = self._start(link, request_id, job, reporter.tag)
            try:
                outcome = await self._outcome(remote)
            finally:
                self._drop(remote)
            if isinstance(outcome, TaskDone):
                return outcome.record
            if isinstance(outcome, TaskFailed):
                raise pickle.loads(outcome.error)
            index = remote.current
            lost = LostTry(
                index,
                remote.tries.get(index, 1) if index is not None else 1,
                remote.stages.get(index, "setup") if index is not None else "setup",
                f"Ray worker {link.index} (pid {link.pid})",
            )
            after = await after_loss(job, reporter, remote.checkpoints, lost)
            if isinstance(after, TaskRecord):
                return after
            job = after

    def forget(self, request: RunRequest) -> None:
        request_id = self._request_ids.pop(id(request), None)
        if request_id is None:
            return
        for link in self.links:
            if request_id in link.known:
                link.known.discard(request_id)
                link.send(Forget(request_id))

    # -- running one task ------------------------------------------------------------

    async def _pick(self) -> Link | None:
        """The live worker with the fewest tasks (waits while all are full)."""
        while True:
            live = [link for link in self.links if link.alive]
            if not live:
                return None
            link = min(live, key=lambda link: len(link.tasks))
            if len(link.tasks) < self.worker_concurrency:
                return link
            await self._room.park()

    def _start(self, link: Link, request_id: int, job: TaskJob, tag: str) -> Remote:
        key = next(self._keys)
        remote = Remote(key, request_id, job.task.task_id, link)
        self._remotes[key] = remote
        self._requests[request_id].tasks[job.task.task_id] = remote
        link.tasks.add(key)
        link.known.add(request_id)
        link.send(StartTask(key, request_id, tag, job))
        return remote

    async def _outcome(self, remote: Remote) -> Any:
        try:
            await remote.finished.wait()
        except trio.Cancelled:
            assert self._grace is not None
            deadline = self._grace.deadline()
            if remote.link.alive:
                remote.link.send(CancelTask(remote.key, max(0.0, deadline - trio.current_time())))
            # The worker closes the task's sessions within the grace; an
            # attempt finished in that cleanup is a result all the same.
            with trio.move_on_at(deadline, shield=True):
                await remote.finished.wait()
            if isinstance(remote.outcome, TaskDone):
                return remote.outcome
            raise
        assert remote.outcome is not None
        return remote.outcome

    def _drop(self, remote: Remote) -> None:
        self._remotes.pop(remote.key, None)
        request = self._requests.get(remote.request_id)
        if request is not None and request.tasks.get(remote.task_id) is remote:
            del request.tasks[remote.task_id]
        remote.link.tasks.discard(remote.key)
        self._room.unpark_all()

    # -- the exchange --------------------------------------------------------------------

    async def _sender(self, link: Link) -> None:
        while link.alive:
            await link.wake.wait()
            # Let this scheduling batch add its messages (grants, acks) too.
            await trio.sleep(SEND_COALESCE)
            link.wake = trio.Event()
            batch, link.outgoing = link.outgoing, []
            if batch and link.alive:
                # Submitting a Ray call queues it and returns; a lost worker
                # shows in the pump, not here.
                link.actor.deliver.remote(next(link.batches), batch)

    async def _pump(self, link: Link) -> None:
        ray = self._ray
        while True:
            ref = link.actor.poll.remote(POLL_WAIT)
            try:
                batch = await trio.to_thread.run_sync(ray.get, ref, abandon_on_cancel=True)
            except Exception as exc:  # noqa: BLE001 - Ray's actor errors: the worker is gone
                if self._closing:
                    return
                await self._lost(link, exc)
                return
            for message in batch:
                await self._handlers[type(message)](link, message)

    async def _on_reported(self, link: Link, message: Reported) -> None:
        """A reporter call: the driver's bookkeeping, then the same call on the
        request's reporter, then the answer if the worker waits for one."""
        request = self._requests.get(message.request_id)
        report = message.report
        if request is not None:
            observe = self._observers.get(type(report))
            if observe is not None:
                report = observe(link, message.request_id, request, report)
            if report.durable:
                # Its answer waits for the disk: the messages behind it do not.
                assert self._nursery is not None
                self._nursery.start_soon(self._report, link, request, report, message.ack)
                return
        await self._report(link, request, report, message.ack)

    async def _report(self, link: Link, request: DriverRequest | None, report: Report, ack: int | None) -> None:
        error: str | None = None
        try:
            if request is not None:
                await report.apply(request.reporter)
        except OSError as exc:  # the attempt fails on it in the worker, as in process
            if ack is None:
                raise
            error = str(exc)
        finally:
            if ack is not None and link.alive:
                link.send(Acked(ack, error))

    def _saw_event(self, link: Link, request_id: int, request: DriverRequest, report: ProgressEvent) -> Report:
        if report.kind == "attempt_started":
            remote = request.tasks.get(report.fields.get("task"))  # type: ignore[arg-type]
            if remote is not None:
                remote.current = report.fields["attempt"]
                remote.tries[report.fields["attempt"]] = report.fields.get("attempt_try", 1)
        return report

    def _saw_opened(self, link: Link, request_id: int, request: DriverRequest, report: SessionOpened) -> Report:
        # Session ids are unique per worker: the journal names the worker too.
        report = attrs.evolve(report, session_id=f"w{link.index}.{report.session_id}")
        link.sessions[report.session_id] = (request_id, report.provider, report.handle)
        return report

    def _saw_closed(self, link: Link, request_id: int, request: DriverRequest, report: SessionClosed) -> Report:
        report = attrs.evolve(report, session_id=f"w{link.index}.{report.session_id}")
        link.sessions.pop(report.session_id, None)
        return report

    def _saw_checkpoint(self, link: Link, request_id: int, request: DriverRequest, report: Checkpoint) -> Report:
        remote = request.tasks.get(report.task_id)
        if remote is not None:
            remote.checkpoints[report.record.attempt] = report.record
        return report

    async def _on_stages(self, link: Link, message: Stages) -> None:
        for (request_id, task_id, attempt), stage in message.stages.items():
            request = self._requests.get(request_id)
            remote = request.tasks.get(task_id) if request is not None else None
            if remote is not None:
                self._stage(link, remote, attempt, stage)  # type: ignore[arg-type]

    async def _on_end(self, link: Link, message: TaskDone | TaskFailed | TaskCancelled) -> None:
        remote = self._remotes.get(message.key)
        if remote is not None:
            remote.end(message)

    async def _on_swept(self, link: Link, message: Swept) -> None:
        entry = self._sweeps.get(message.number)
        if entry is not None:
            entry[2].extend(message.notes)
            entry[1].set()

    def _stage(self, link: Link, remote: Remote, attempt: int, stage: Phase) -> None:
        remote.stages[attempt] = stage
        if debug_enabled():
            log.debug("attempt_stage", worker=link.index, task_id=remote.task_id, attempt=attempt, stage=stage)

    # -- a lost worker ----------------------------------------------------------------

    async def _lost(self, link: Link, exc: BaseException) -> None:
        """The worker died: its permits go back, its tasks' running attempts
        end ``worker_lost``, the sessions it left open are reaped."""
        link.alive = False
        link.wake.set()
        log.warning("worker_lost", worker=link.index, pid=link.pid, error=f"{type(exc).__name__}")
        self._desk.give_back_all(link)
        for key in list(link.tasks):
            remote = self._remotes.get(key)
            if remote is not None:
                remote.end(LOST)
        self._room.unpark_all()
        assert self._grace is not None
        with trio.move_on_at(self._grace.deadline(), shield=True):
            for session_id, (request_id, provider, handle) in list(link.sessions.items()):
                request = self._requests.get(request_id)
                if request is None:
                    continue
                try:
                    env = _registry.build("environment", provider, request.request.environment.config)
                    await env.reap(handle)
                except Exception as reap_failure:  # noqa: BLE001 - the run's reuse or reap retries it
                    log.warning(
                        "reap_failed", session=session_id, error=f"{type(reap_failure).__name__}: {reap_failure}"
                    )
                    continue
                link.sessions.pop(session_id, None)
                await request.reporter.session_closed(session_id, provider, handle)

    async def _sweep_leftovers(self) -> None:
        """Sessions still journalled open once the run's work is over (the
        grace ended before their close): sweep every live worker's node by
        each such run's tag."""
        targets: dict[tuple[str, str], dict[str, Any]] = {}
        for link in self.links:
            for request_id, provider, _handle in link.sessions.values():
                request = self._requests.get(request_id)
                if request is not None:
                    targets[(provider, request.reporter.tag)] = request.request.environment.config
        if not targets:
            return
        items = [(provider, config, tag) for (provider, tag), config in targets.items()]
        waits = []
        for link in self.links:
            if link.alive:
                number = len(self._sweeps) + 1
                swept = trio.Event()
                self._sweeps[number] = (number, swept, [])
                link.send(Shutdown(0.0))
                link.send(Sweep(number, items))
                waits.append(swept)
        for swept in waits:
            await swept.wait()
        for _, _, notes in self._sweeps.values():
            for note in notes:
                log.warning("sweep_failed", note=note)
