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

import math
import time
from pathlib import Path
from typing import Any

import trio

from .._config import check_data, has_data_checks, preflight
from .._gc import relaxed_collection
from .._limits import provider_limits
from .._logging import ensure_logging, get_logger
from .._models import open_model_clients
from .._store import open_run_store
from ..runtime._errors import RunFailedError
from ..runtime._results import OrchestrationResult, RequestResult
from ..runtime._values import Orchestration, RunRequest
from ._context import GraceClock
from ._request import RequestRun
from ._scheduler import Scheduler
from ._task import InProcessExecutor

__all__ = ["launch", "run_evaluation"]

log = get_logger("agentcompass.launch")


class _LocalGrants:
    """Driver-owned limits granted in-process (see ``runtime._executor.Grants``)."""

    def __init__(self) -> None:
        self.registry = provider_limits()

    async def acquire_capacity(self, provider: str, holder: object) -> None:
        # A free permit is taken without a schedule point: trio's own
        # ``acquire_on_behalf_of`` yields even then, and every attempt asks
        # for one. Under load that yield puts the attempt behind every other
        # runnable task, so the workers advance in lockstep: all of them
        # reach the harness only at the end of each wave (measured: a 50 ms
        # harness run took about 0.5 s + N x the per-attempt cost instead of
        # max(0.5 s, N x cost)). Cancellation is still checked first, and
        # ``acquire_on_behalf_of_nowait`` refuses while others wait (FIFO).
        limiter = self.registry.capacity(provider)
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            limiter.acquire_on_behalf_of_nowait(holder)
        except trio.WouldBlock:
            await limiter.acquire_on_behalf_of(holder)

    def release_capacity(self, provider: str, holder: object) -> None:
        self.registry.capacity(provider).release_on_behalf_of(holder)

    async def open_token(self, provider: str) -> None:
        bucket = self.registry.open_rate_bucket(provider)
        if bucket is not None:
            await bucket.acquire()
        # Else no checkpoint of its own: the try asks for a token right after
        # the capacity permit, whose acquisition checked for cancellation.


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
    rejects the configuration.
    """
    preflight(orchestration, config_dir, data=False)
    if has_data_checks(orchestration):
        # A benchmark's own check may read its whole data set: off the Trio thread.
        await trio.to_thread.run_sync(check_data, orchestration)
    # The runs' per-task state (every finished record, kept for metrics) is
    # freed before the thresholds come back (see RequestRun.release): with
    # it still alive, the first allocation after would walk it all in one
    # collection (7-13 ms at 2,000 tasks, on the way out of every launch).
    ensure_logging()
    # Smallest wins among the orchestrations running now; the limits go with this one.
    with relaxed_collection(), provider_limits().configured(orchestration.providers) as notes:
        for note in notes:
            log.warning("provider_limits", note=note)
        # The model endpoints' shared clients, closed within the grace once the run is done.
        async with open_model_clients(orchestration.task_concurrency, orchestration.cleanup_grace_seconds):
            return await _launch(orchestration, show_progress, stop)


async def _launch(orchestration: Orchestration, show_progress: bool, stop: trio.Event | None) -> OrchestrationResult:
    grants = _LocalGrants()

    timeout = orchestration.timeout_seconds
    deadline = trio.current_time() + timeout if timeout is not None else math.inf
    grace = GraceClock(orchestration.cleanup_grace_seconds, deadline + orchestration.cleanup_grace_seconds)
    runs = [RequestRun(i, request, grace) for i, request in enumerate(orchestration.requests)]

    def terminal_status() -> str:
        return "timed_out" if trio.current_time() >= deadline else "cancelled"

    scheduler = Scheduler(
        runs, orchestration.task_concurrency, InProcessExecutor(grace), grants, grace, terminal_status
    )
    work_scope = trio.CancelScope()
    timed_out = finished = False

    async def watch_for_shutdown() -> None:
        """Start the shutdown explicitly: fix the grace deadline, then cancel
        the work, at the orchestration deadline or on ``stop``; fix it too
        when the caller's cancel scope cancels us."""
        nonlocal timed_out
        try:
            with trio.move_on_at(deadline):
                if stop is None:
                    await trio.sleep_forever()
                await stop.wait()
            timed_out = not (stop is not None and stop.is_set())
            grace.begin()
            work_scope.cancel()
        except trio.Cancelled:
            if not work_scope.cancel_called and not finished:
                grace.begin()  # the caller's cancellation: shutdown starts now
            raise

    try:
        async with trio.open_nursery() as display_nursery:
            if show_progress:
                from .._progress import ProgressDisplay

                display_nursery.start_soon(ProgressDisplay(runs).run)
            display_nursery.start_soon(watch_for_shutdown)
            with work_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(scheduler.prepare_all, nursery)
                    for _ in range(orchestration.task_concurrency):
                        nursery.start_soon(scheduler.worker)
            finished = True
            display_nursery.cancel_scope.cancel()
    finally:
        # A request the deadline or a cancellation stopped before it started
        # still gets a run directory with its terminal state (SPEC 7).
        with trio.move_on_at(grace.deadline(), shield=True):
            for run in runs:
                if run.store is None and run.status is None:
                    try:
                        await _persist_unstarted(run, terminal_status())
                    except Exception as exc:  # noqa: BLE001 - one request's disk, not the others'
                        run.fail(exc, "could not create the run directory")
    results = [run.result() for run in runs]
    for run in runs:
        run.release()
    if stop is not None and stop.is_set() and not timed_out:
        status, exit_code = "cancelled", 130
    else:
        status, exit_code = _overall(results, timed_out and work_scope.cancelled_caught)
    return OrchestrationResult(status, results, exit_code)  # type: ignore[arg-type]


async def _persist_unstarted(run: RequestRun, status: str) -> None:
    request = run.request
    async with open_run_store(request.output_root, request.name, close_deadline=run.grace.deadline) as store:
        run.store = store
        run.started_at = time.time()
        run.started_clock = trio.current_time()
        run.notes.append(f"the run was {status} before this request started")
        await run.finalize(status)


async def run_evaluation(
    request: RunRequest,
    *,
    task_concurrency: int = 4,
    timeout_seconds: float | None = None,
    cleanup_grace_seconds: float = 30,
    **kwargs: Any,
) -> RequestResult:
    """Run one request; raise :class:`RunFailedError` (a ``RuntimeError``)
    naming the result paths unless it succeeded."""
    orchestration = Orchestration(
        [request],
        task_concurrency=task_concurrency,
        timeout_seconds=timeout_seconds,
        cleanup_grace_seconds=cleanup_grace_seconds,
    )
    result = await launch(orchestration, **kwargs)
    request_result = result.requests[0]
    if request_result.status != "succeeded":
        where = request_result.run_dir or str(request.output_root)
        raise RunFailedError(
            f"request {request.name!r} {request_result.status}; results in {where} "
            f"(see {Path(where) / 'summary.md'} and {Path(where) / 'details'})"
        )
    return request_result

