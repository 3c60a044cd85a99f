"""``launch`` and ``run_evaluation``: the SDK entry points (SPEC sections 7, 9).

Both are ordinary Trio functions. They never install signal handlers (only
the CLI does) and are cancellable by the caller's own cancel scope: on
cancellation every session still open is closed within the cleanup grace,
every unfinished request persists its terminal state (``cancelled``), and
``trio.Cancelled`` propagates to the caller as usual. The orchestration's
own deadline (``timeout_seconds``) starts after preflight; when it passes
the same cleanup runs and ``launch`` returns status ``timed_out``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from .._executors import open_executor
from .._gc import relaxed_collection
from .._limits import provider_limits
from .._logging import get_logger, launch_logging
from .._models import open_model_clients
from .._preflight import check_data, has_data_checks, preflight
from .._seam import InProcessExecutor
from .._store import Disk, open_run_store
from .._store._layout import RunLayout
from ..runtime._cleanup import using_cleanup_clock
from ..runtime._errors import RunFailedError
from ..runtime._results import OrchestrationResult, RequestResult
from ..runtime._values import Orchestration, RunRequest
from ._context import GraceClock
from ._request import RequestRun
from ._request_state import Stage
from ._reuse import refuse_other_experiments
from ._scheduler import Dispatcher

__all__ = ["launch", "orchestrate", "run_evaluation"]

log = get_logger("agentcompass.launch")


class _LocalGrants:
    """Driver-owned limits granted in-process (see ``runtime._executor.Grants``).

    Both acquisitions are Trio checkpoints whether or not they wait, as
    :meth:`trio.CapacityLimiter.acquire_on_behalf_of` is: a free permit and
    an unlimited open rate included (what that costs: docs/performance.md,
    bench ``latency``)."""

    def __init__(self) -> None:
        self.registry = provider_limits()

    async def acquire_capacity(self, provider: str, holder: object) -> None:
        await self.registry.capacity(provider).acquire_on_behalf_of(holder)

    def release_capacity(self, provider: str, holder: object) -> None:
        self.registry.capacity(provider).release_on_behalf_of(holder)

    async def open_token(self, provider: str) -> None:
        await self.registry.acquire_open_token(provider)


def _overall(results: list[RequestResult], timed_out: bool) -> tuple[str, int]:
    if timed_out:
        return "timed_out", 1
    statuses = {r.status for r in results}
    if statuses <= {"succeeded"}:
        return "succeeded", 0
    if "succeeded" in statuses:
        return "partial_failure", 1
    return "failed", 1


async def launch(
    orchestration: Orchestration,
    *,
    config_dir: Path | None = None,
    show_progress: bool = False,
    stop: trio.Event | None = None,
) -> OrchestrationResult:
    """Run every request of ``orchestration`` and return how it ended.

    ``show_progress`` renders progress on stderr: a live table on a TTY,
    plain periodic lines otherwise (``compass launch`` turns it on).
    Setting ``stop`` stops the run as a cancellation does (cleanup within
    the grace, unfinished requests ``cancelled``), but ``launch`` then
    returns the result instead of raising (``compass launch`` sets it on
    the first SIGINT, SIGTERM or SIGHUP).

    Raises :class:`~agentcompass.ConfigError` (nothing run) when preflight
    rejects the configuration, or when a request's ``reuse`` source is
    another experiment and ``reuse_anyway`` is not set.
    """
    return await orchestrate(orchestration, config_dir=config_dir, show_progress=show_progress, stop=stop)


async def orchestrate(
    orchestration: Orchestration,
    *,
    config_dir: Path | None = None,
    show_progress: bool = False,
    stop: trio.Event | None = None,
    disk: Disk | None = None,
) -> OrchestrationResult:
    """:func:`launch`, with the ``disk`` every run store writes through and
    reuse reads through (default: the real one; tests pass a ``FakeDisk``,
    to this or through :func:`run_evaluation`'s keyword arguments)."""
    preflight(orchestration, config_dir, data=False)
    if has_data_checks(orchestration):
        # A benchmark's own check may read its whole data set: off the Trio thread.
        await trio.to_thread.run_sync(check_data, orchestration)
    if any(request.reuse is not False for request in orchestration.requests):
        # A --reuse of another experiment is refused here, before any run
        # directory exists; read through the disk reuse reads through.
        await (disk if disk is not None else Disk()).run(refuse_other_experiments, orchestration.requests)
    # The runs' per-task state (every finished record, kept for metrics) is
    # freed before the thresholds come back (see RequestRun.release): with
    # it still alive, the first allocation after would walk it all in one
    # collection, on the way out of every launch (bench ``latency``).
    # Smallest wins among the orchestrations running now; the limits go with this one.
    with (
        launch_logging(),
        relaxed_collection(),
        provider_limits().configured(orchestration.providers) as notes,
    ):
        # A Ray cluster is started or joined before the deadline starts.
        async with open_executor(orchestration, config_dir) as remote:
            return await _run_with(orchestration, show_progress, stop, disk, notes, remote)


async def _run_with(
    orchestration: Orchestration,
    show_progress: bool,
    stop: trio.Event | None,
    disk: Disk | None,
    notes: list[str],
    remote: Any,
) -> OrchestrationResult:
    """The run itself, once its executor is up: the deadline starts here."""
    for note in notes:
        log.warning("provider_limits", note=note)
    timeout = orchestration.timeout_seconds
    deadline = trio.current_time() + timeout if timeout is not None else math.inf
    grace = GraceClock(orchestration.cleanup_grace_seconds, deadline + orchestration.cleanup_grace_seconds)
    # Every cleanup of the run, the model clients' close included, ends
    # by this one clock's deadline (components ask cleanup_deadline()).
    with using_cleanup_clock(grace):
        async with open_model_clients(orchestration.task_concurrency, close_deadline=grace.deadline):
            return await _launch(orchestration, show_progress, stop, deadline, grace, disk, remote)


async def _launch(
    orchestration: Orchestration,
    show_progress: bool,
    stop: trio.Event | None,
    deadline: float,
    grace: GraceClock,
    disk: Disk | None,
    remote: Any = None,
) -> OrchestrationResult:
    grants = _LocalGrants()
    executor = remote if remote is not None else InProcessExecutor(grace)
    runs = [RequestRun(request, grace, disk=disk) for request in orchestration.requests]

    def terminal_status() -> str:
        return "timed_out" if trio.current_time() >= deadline else "cancelled"

    work_scope = trio.CancelScope()
    dispatcher = Dispatcher(
        runs, orchestration.task_concurrency, executor, grants, terminal_status, work_scope
    )
    timed_out = finished = False

    def shut_down() -> None:
        grace.begin()
        work_scope.cancel()

    async def watch_for_shutdown() -> None:
        """Start the shutdown explicitly: fix the grace deadline, then cancel
        the work, at the orchestration deadline, on ``stop``, or when the
        caller's cancel scope cancels us (the work is shielded from that:
        this task is where it is first observed)."""
        nonlocal timed_out
        try:
            with trio.move_on_at(deadline):
                if stop is None:
                    await trio.sleep_forever()
                await stop.wait()
            timed_out = not (stop is not None and stop.is_set())
            shut_down()
        except trio.Cancelled:
            if not work_scope.cancel_called and not finished:
                shut_down()  # the caller's cancellation: shutdown starts now
            raise

    async with trio.open_nursery() as display_nursery:
        if show_progress:
            from .._progress import ProgressDisplay

            display_nursery.start_soon(ProgressDisplay(runs).run)
        display_nursery.start_soon(watch_for_shutdown)
        # Shielded from the caller's cancellation (the watcher turns it into
        # the shutdown) and ended by the one grace deadline. The stores are
        # opened outside the work's scope: the deadline never reaches them.
        with grace.bounded_shield() as shield:
            async with _open_stores(runs, grace), _running(remote, grace):
                await dispatcher.run()
                # A request the deadline or a cancellation stopped before it
                # started still gets its terminal state (SPEC 7).
                with trio.move_on_at(grace.deadline(), shield=True):
                    for run in runs:
                        if run.store is not None and run.life.stage is Stage.WAITING:
                            await _stop_unstarted(run, terminal_status())
        finished = True
        display_nursery.cancel_scope.cancel()
    results = [run.result() for run in runs]
    config_error = any(run.tally.config_error for run in runs)
    for run in runs:
        run.release()
    if stop is not None and stop.is_set() and not timed_out:
        status, exit_code = "cancelled", 130
    else:
        status, exit_code = _overall(results, timed_out and (work_scope.cancelled_caught or shield.cancelled_caught))
        if config_error and exit_code == 1:
            exit_code = 2  # bad input found while preparing (SPEC 9 exit codes)
    return OrchestrationResult(status, results, exit_code)  # type: ignore[arg-type]


def _running(remote: Any, grace: GraceClock) -> contextlib.AbstractAsyncContextManager[None]:
    """A remote executor's driver-side tasks, for as long as the stores are open."""
    return remote.running(grace) if remote is not None else contextlib.nullcontext()


@contextlib.asynccontextmanager
async def _open_stores(runs: list[RequestRun], grace: GraceClock) -> AsyncIterator[None]:
    """Every request's run store, open for the whole orchestration and closed
    by the grace deadline. A run directory that cannot be created fails its
    request only."""
    async with contextlib.AsyncExitStack() as stores:
        for run in runs:
            request = run.request
            try:
                run.store = await stores.enter_async_context(
                    open_run_store(request.output_root, request.name, close_deadline=grace.deadline, disk=run.disk)
                )
            except Exception as exc:  # noqa: BLE001 - no run directory: this request fails, no other
                run.fail(exc, "could not create the run directory")
        yield


async def _stop_unstarted(run: RequestRun, status: str) -> None:
    run.begin()
    run.tally.notes.append(f"the run was {status} before this request started")
    try:
        await run.finalize(status)
    except Exception as exc:  # noqa: BLE001 - one request's disk, not the others'
        run.fail(exc, "could not finalize")


async def run_evaluation(
    request: RunRequest,
    *,
    task_concurrency: int = 4,
    timeout_seconds: float | None = None,
    cleanup_grace_seconds: float = 30,
    **kwargs: Any,
) -> RequestResult:
    """Run one request; raise :class:`RunFailedError` (a ``RuntimeError``)
    naming the result paths unless it succeeded. ``kwargs`` go to :func:`launch`."""
    orchestration = Orchestration(
        [request],
        task_concurrency=task_concurrency,
        timeout_seconds=timeout_seconds,
        cleanup_grace_seconds=cleanup_grace_seconds,
    )
    result = await orchestrate(orchestration, **kwargs)
    request_result = result.requests[0]
    if request_result.status != "succeeded":
        where = request_result.run_dir or str(request.output_root)
        layout = RunLayout(where)
        raise RunFailedError(
            f"request {request.name!r} {request_result.status}; results in {where} "
            f"(see {layout.summary} and {layout.details})"
        )
    return request_result

