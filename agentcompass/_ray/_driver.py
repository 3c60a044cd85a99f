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
carries the latest stage of the attempts that moved since the last), its permits go back, the sessions it journalled open are
reaped, and the attempt is retried per the retry budget on another worker
(the attempts already checkpointed are kept).
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio

from .. import _registry
from .._limits import provider_limits
from .._logging import debug_enabled, get_logger
from .._orchestration._attempt import backoff_delay
from .._orchestration._context import GraceClock
from ..runtime._convert import unstructure
from ..runtime._executor import Executor, Grants, TaskReporter
from ..runtime._results import AttemptRecord, Issue, Phase, TaskRecord, derive_status, worst_severity
from ..runtime._values import RunRequest, TaskSpec

__all__ = ["RayExecutor", "WORKER_LOST"]

log = get_logger("agentcompass.ray")

WORKER_LOST = "worker_lost"

#: How long one poll of a worker's outbox waits for a message.
POLL_WAIT = 0.5
#: How long the sender lets messages gather before a batch goes.
SEND_COALESCE = 0.002


@attrs.define(eq=False)
class _Link:
    """The driver's side of one worker."""

    index: int
    actor: Any
    pid: int
    alive: bool = True
    tasks: set[int] = attrs.Factory(set)
    outgoing: list[tuple[Any, ...]] = attrs.Factory(list)
    wake: trio.Event = attrs.Factory(trio.Event)
    batches: Any = attrs.Factory(itertools.count)
    known: set[int] = attrs.Factory(set)
    #: grant id -> (provider, holder) of a capacity permit held for the worker
    held: dict[int, tuple[str, tuple[int, int]]] = attrs.Factory(dict)
    #: grant id -> the scope of the driver task waiting for it
    granting: dict[int, trio.CancelScope] = attrs.Factory(dict)
    #: driver session id -> (request id, provider, handle) journalled open
    sessions: dict[str, tuple[int, str, dict[str, Any]]] = attrs.Factory(dict)


@attrs.define(eq=False)
class _Remote:
    """One task running on a worker, as the driver follows it."""

    key: int
    request_id: int
    task_id: str
    link: _Link
    finished: trio.Event = attrs.Factory(trio.Event)
    outcome: tuple[Any, ...] | None = None
    checkpoints: dict[int, AttemptRecord] = attrs.Factory(dict)
    #: attempt -> the try number of its latest ``attempt_started``
    tries: dict[int, int] = attrs.Factory(dict)
    #: attempt -> the stage its latest try is in (setup, run, collect, evaluate)
    stages: dict[int, Phase] = attrs.Factory(dict)
    current: int | None = None

    def end(self, *outcome: Any) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.finished.set()


@attrs.define(eq=False)
class _Request:
    request: RunRequest
    reporter: TaskReporter
    tasks: dict[str, _Remote] = attrs.Factory(dict)


class RayExecutor(Executor):
    """Runs tasks on Ray worker actors (see the module docstring)."""

    def __init__(self, ray: Any, actors: list[tuple[Any, int]], worker_concurrency: int):
        self._ray = ray
        self.links = [_Link(i, actor, pid) for i, (actor, pid) in enumerate(actors)]
        self.worker_concurrency = worker_concurrency
        self._keys = itertools.count(1)
        self._remotes: dict[int, _Remote] = {}
        self._requests: dict[int, _Request] = {}
        self._request_ids: dict[int, int] = {}
        # Never reused: a forgotten request's id in a worker's messages
        # must not name a request that started after it.
        self._request_numbers = itertools.count(1)
        self._room = trio.lowlevel.ParkingLot()
        self._grants: Grants | None = None
        self._grace: GraceClock | None = None
        self._nursery: trio.Nursery | None = None
        self._sweeps: dict[int, tuple[int, trio.Event, list[str]]] = {}
        self._closing = False

    # -- lifetime -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, grace: GraceClock) -> AsyncIterator[None]:
        """The links' pumps and senders, for the orchestration's work. On the
        way out what is still open is swept by each run's tag on every worker."""
        self._grace = grace
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
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

    async def run_task(
        self,
        request: RunRequest,
        task: TaskSpec,
        attempts: list[int],
        done: dict[int, AttemptRecord],
        resume: dict[int, AttemptRecord],
        grants: Grants,
        reporter: TaskReporter,
    ) -> TaskRecord:
        assert self._grace is not None, "RayExecutor.running() is not entered"
        self._grants = grants
        request_id = self._request_ids.get(id(request))
        if request_id is None:
            request_id = self._request_ids[id(request)] = next(self._request_numbers)
            self._requests[request_id] = _Request(request, reporter)
        done, resume, todo = dict(done), dict(resume), sorted(attempts)
        while True:
            # No attempt starts again once the run is stopping.
            await trio.lowlevel.checkpoint_if_cancelled()
            link = await self._pick()
            if link is None:
                raise RuntimeError("every Ray worker of the run was lost")
            remote = self._start(link, request_id, request, task, todo, done, resume, reporter.tag)
            try:
                outcome = await self._outcome(remote)
            finally:
                self._drop(remote)
            kind = outcome[0]
            if kind == "done":
                return outcome[1]  # type: ignore[no-any-return]
            if kind == "failed":
                raise pickle.loads(outcome[1])
            # The worker was lost: keep what it checkpointed, fail the attempt it ran.
            done.update(remote.checkpoints)
            todo = [i for i in todo if i not in done]
            index = remote.current
            if index is None or index in done:
                continue
            lost = self._lost_record(request, index, remote, resume.get(index))
            if lost.retries >= request.execution.max_retries:
                records = {**done, index: lost}
                ordered = [records[i] for i in sorted(records)]
                issues = [issue for record in ordered for issue in record.issues]
                return TaskRecord(task.task_id, task.category, ordered, worst_severity(issues))
            resume[index] = lost
            await self._retry_wait(request, reporter, task.task_id, index, remote.tries.get(index, 1), lost)

    def forget(self, request: RunRequest) -> None:
        request_id = self._request_ids.pop(id(request), None)
        if request_id is None:
            return
        for link in self.links:
            if request_id in link.known:
                link.known.discard(request_id)
                self._send(link, ("forget", request_id))

    # -- running one task ------------------------------------------------------------

    async def _pick(self) -> _Link | None:
        """The live worker with the fewest tasks (waits while all are full)."""
        while True:
            live = [link for link in self.links if link.alive]
            if not live:
                return None
            link = min(live, key=lambda link: len(link.tasks))
            if len(link.tasks) < self.worker_concurrency:
                return link
            await self._room.park()

    def _start(
        self,
        link: _Link,
        request_id: int,
        request: RunRequest,
        task: TaskSpec,
        todo: list[int],
        done: dict[int, AttemptRecord],
        resume: dict[int, AttemptRecord],
        tag: str,
    ) -> _Remote:
        key = next(self._keys)
        remote = _Remote(key, request_id, task.task_id, link)
        self._remotes[key] = remote
        self._requests[request_id].tasks[task.task_id] = remote
        link.tasks.add(key)
        sent = None if request_id in link.known else request
        link.known.add(request_id)
        self._send(link, ("start", key, request_id, sent, task, todo, done, resume, tag))
        return remote

    async def _outcome(self, remote: _Remote) -> tuple[Any, ...]:
        try:
            await remote.finished.wait()
        except trio.Cancelled:
            assert self._grace is not None
            deadline = self._grace.deadline()
            if remote.link.alive:
                self._send(remote.link, ("cancel", remote.key, max(0.0, deadline - trio.current_time())))
            # The worker closes the task's sessions within the grace; an
            # attempt finished in that cleanup is a result all the same.
            with trio.move_on_at(deadline, shield=True):
                await remote.finished.wait()
            if remote.outcome is not None and remote.outcome[0] == "done":
                return remote.outcome
            raise
        assert remote.outcome is not None
        return remote.outcome

    def _drop(self, remote: _Remote) -> None:
        self._remotes.pop(remote.key, None)
        request = self._requests.get(remote.request_id)
        if request is not None and request.tasks.get(remote.task_id) is remote:
            del request.tasks[remote.task_id]
        remote.link.tasks.discard(remote.key)
        self._room.unpark_all()

    def _lost_record(
        self, request: RunRequest, index: int, remote: _Remote, resumed: AttemptRecord | None
    ) -> AttemptRecord:
        """The FATAL ``worker_lost`` record of the attempt a lost worker was running,
        in the stage the worker last reported for it. Its ``retries`` are the
        retries the attempt had used before the lost try."""
        try_number = remote.tries.get(index, 1)
        retries = try_number - 1
        if resumed is not None and not any(issue.code == WORKER_LOST for issue in resumed.issues):
            retries += 1  # a reuse run's resumed attempt starts with one retry used
        link = remote.link
        issue = Issue(
            "fatal",
            remote.stages.get(index, "setup"),
            WORKER_LOST,
            f"Ray worker {link.index} (pid {link.pid}) was lost while it ran attempt {index} of task {remote.task_id!r}",
        )
        return AttemptRecord(
            attempt=index, status=derive_status([issue]), values={}, issues=[issue], plan=None, retries=retries
        )

    async def _retry_wait(
        self, request: RunRequest, reporter: TaskReporter, task_id: str, index: int, try_number: int, lost: AttemptRecord
    ) -> None:
        """Save the lost try as a discarded one and wait the backoff, as the attempt code does."""
        execution = request.execution
        retry = lost.retries + 1
        delay = backoff_delay(retry, execution.retry_min_delay_seconds, execution.retry_max_delay_seconds)
        data = {
            "retry_number": retry,
            "stage": lost.issues[0].phase,
            "scope": "attempt",
            "matched_pattern": None,
            "retry_delay_seconds": delay,
            "issues": unstructure(lost.issues),
            "diagnostics": [],
            "plan": None,
            "timings": {},
        }
        await reporter.discarded_try(task_id, index, try_number, data)
        waited = round(delay, 3)
        reporter.event("attempt_retry", task=task_id, attempt=index, retry=retry, scope="attempt", retry_delay_seconds=waited)
        reporter.event("retry_wait", task=task_id, attempt=index, retry=retry, retry_delay_seconds=waited)
        await trio.sleep(delay)

    # -- the exchange --------------------------------------------------------------------

    def _send(self, link: _Link, message: tuple[Any, ...]) -> None:
        link.outgoing.append(message)
        link.wake.set()

    async def _sender(self, link: _Link) -> None:
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

    async def _pump(self, link: _Link) -> None:
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
                await self._apply(link, message)

    async def _apply(self, link: _Link, message: tuple[Any, ...]) -> None:
        kind = message[0]
        assert self._nursery is not None
        if kind == "event":
            _, request_id, event, fields = message
            request = self._requests.get(request_id)
            if request is None:
                return
            if event == "attempt_started":
                remote = request.tasks.get(fields.get("task"))
                if remote is not None:
                    remote.current = fields["attempt"]
                    remote.tries[fields["attempt"]] = fields.get("attempt_try", 1)
            request.reporter.event(event, **fields)
        elif kind == "stages":
            for (request_id, task_id, attempt), stage in message[1].items():
                request = self._requests.get(request_id)
                remote = request.tasks.get(task_id) if request is not None else None
                if remote is not None:
                    self._stage(link, remote, attempt, stage)
        elif kind == "opened":
            _, request_id, session_id, provider, handle, name, ack = message
            session_id = f"w{link.index}.{session_id}"
            link.sessions[session_id] = (request_id, provider, handle)
            try:
                await self._requests[request_id].reporter.session_opened(session_id, provider, handle, name)
            finally:
                self._send(link, ("ack", ack))
        elif kind == "closed":
            _, request_id, session_id, provider, handle = message
            session_id = f"w{link.index}.{session_id}"
            link.sessions.pop(session_id, None)
            await self._requests[request_id].reporter.session_closed(session_id, provider, handle)
        elif kind == "checkpoint":
            _, request_id, task_id, record = message
            request = self._requests[request_id]
            remote = request.tasks.get(task_id)
            if remote is not None:
                remote.checkpoints[record.attempt] = record
            await request.reporter.checkpoint(task_id, record)
        elif kind == "discarded":
            self._nursery.start_soon(self._discarded, link, message)
        elif kind == "plan":
            self._nursery.start_soon(self._plan, link, message)
        elif kind in ("acquire", "token"):
            if not self._grant_now(link, kind, message[1], message[2]):
                self._nursery.start_soon(self._grant, link, kind, message[1], message[2])
        elif kind == "abandon":
            grant = message[1]
            if grant in link.granting:
                link.granting[grant].cancel()
            else:
                self._give_back(link, grant)
        elif kind == "release":
            self._give_back(link, message[1])
        elif kind in ("done", "failed", "cancelled"):
            remote = self._remotes.get(message[1])
            if remote is not None:
                remote.end(*((kind,) + message[2:]))
        elif kind == "swept":
            entry = self._sweeps.get(message[1])
            if entry is not None:
                entry[2].extend(message[2])
                entry[1].set()

    def _stage(self, link: _Link, remote: _Remote, attempt: int, stage: Phase) -> None:
        remote.stages[attempt] = stage
        if debug_enabled():
            log.debug("attempt_stage", worker=link.index, task_id=remote.task_id, attempt=attempt, stage=stage)

    async def _discarded(self, link: _Link, message: tuple[Any, ...]) -> None:
        _, request_id, task_id, attempt, try_number, data, ack = message
        try:
            await self._requests[request_id].reporter.discarded_try(task_id, attempt, try_number, data)
        finally:
            if link.alive:
                self._send(link, ("ack", ack))

    async def _plan(self, link: _Link, message: tuple[Any, ...]) -> None:
        _, request_id, task_id, attempt, plan, ack = message
        failed: str | None = None
        try:
            await self._requests[request_id].reporter.attempt_plan(task_id, attempt, plan)
        except OSError as exc:  # the attempt fails on it in the worker, as in process
            failed = str(exc)
        finally:
            if link.alive:
                self._send(link, ("ack", ack) if failed is None else ("ack", ack, failed))

    async def _grant(self, link: _Link, kind: str, grant: int, provider: str) -> None:
        grants = self._grants
        assert grants is not None
        holder = (link.index, grant)
        with trio.CancelScope() as scope:
            link.granting[grant] = scope
            try:
                if kind == "acquire":
                    await grants.acquire_capacity(provider, holder)
                    link.held[grant] = (provider, holder)
                else:
                    await grants.open_token(provider)
            finally:
                link.granting.pop(grant, None)
            if link.alive:
                self._send(link, ("grant", grant))
            else:
                self._give_back(link, grant)

    def _grant_now(self, link: _Link, kind: str, grant: int, provider: str) -> bool:
        """Grant at once what is free (a permit nobody queues for, a token of
        an unlimited open rate), without a task per grant; False: wait for it."""
        registry = provider_limits()
        if kind == "acquire":
            holder = (link.index, grant)
            try:
                registry.capacity(provider).acquire_on_behalf_of_nowait(holder)
            except trio.WouldBlock:
                return False
            link.held[grant] = (provider, holder)
        elif registry.open_rate_bucket(provider) is not None:
            return False
        self._send(link, ("grant", grant))
        return True

    def _give_back(self, link: _Link, grant: int) -> None:
        held = link.held.pop(grant, None)
        if held is not None and self._grants is not None:
            self._grants.release_capacity(*held)

    # -- a lost worker ----------------------------------------------------------------

    async def _lost(self, link: _Link, exc: BaseException) -> None:
        """The worker died: its permits go back, its tasks' running attempts
        end ``worker_lost``, the sessions it left open are reaped."""
        link.alive = False
        link.wake.set()
        log.warning("worker_lost", worker=link.index, pid=link.pid, error=f"{type(exc).__name__}")
        for scope in list(link.granting.values()):
            scope.cancel()
        for grant in list(link.held):
            self._give_back(link, grant)
        for key in list(link.tasks):
            remote = self._remotes.get(key)
            if remote is not None:
                remote.end("lost")
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
                    log.warning("reap_failed", session=session_id, error=f"{type(reap_failure).__name__}: {reap_failure}")
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
                self._send(link, ("shutdown", 0.0))
                self._send(link, ("sweep", number, items))
                waits.append(swept)
        for swept in waits:
            await swept.wait()
        for _, _, notes in self._sweeps.values():
            for note in notes:
                log.warning("sweep_failed", note=note)

