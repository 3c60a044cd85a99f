"""What the task code needs for one request: built components and settings."""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
import trio

from .. import _registry
from .._planner import Planner
from .._redact import register_secret
from ..runtime._components import (
    BaseAnalyzer,
    BaseBenchmark,
    BaseEnvironment,
    BaseHarness,
    BaseRecipe,
)
from ..runtime._executor import Grants, TaskReporter
from ..runtime._values import RunRequest, Secret

__all__ = ["GraceClock", "RequestContext", "Slots"]


class GraceClock:
    """The one cleanup deadline of an orchestration's way out.

    :meth:`begin` is called once, when shutdown starts: the orchestration
    deadline passing, a stop request (the CLI's first signal), or the
    caller's cancel scope. ``launch`` makes each of these explicit in its
    watcher task, which is the only task the caller's cancellation reaches
    (the work runs shielded from it): the watcher fixes the deadline, then
    cancels the work. So no cleanup infers shutdown from its own cancel
    status - a cleanup cancelled by a phase timeout is not a shutdown.
    From then on every cleanup - sandbox closes, journal lines, finalize,
    the store's close, the writer process, the model clients - ends by
    ``begin`` time + ``grace``: nested cleanups cannot add up to more than
    one grace window, and none is unbounded. Before shutdown a cleanup
    (closing a finished task's sandbox) gets ``grace`` seconds from when
    it starts. ``hard_deadline`` starts as the orchestration deadline plus
    the grace. ``launch`` makes it the clock of
    :func:`agentcompass.runtime.cleanup_deadline`.
    """

    def __init__(self, grace: float, hard_deadline: float = math.inf):
        self.grace = grace
        self.hard_deadline = hard_deadline
        #: When shutdown began (``trio.current_time()``), or None.
        self.shutdown_at: float | None = None
        # Shields opened before shutdown that must end by its deadline too.
        self._bounded: set[trio.CancelScope] = set()

    def begin(self) -> float:
        """Shutdown starts now (idempotent); returns the fixed deadline."""
        if self.shutdown_at is None:
            now = trio.current_time()
            self.shutdown_at = now
            self.hard_deadline = min(self.hard_deadline, now + self.grace)
            for scope in self._bounded:
                scope.deadline = min(scope.deadline, self.hard_deadline)
        return self.hard_deadline

    @contextlib.contextmanager
    def bounded_shield(self) -> Iterator[trio.CancelScope]:
        """A shield for work that must outlive a cancellation (a request's
        store) yet end by the one deadline: ``hard_deadline`` now, and the
        fixed deadline as soon as shutdown begins."""
        with trio.CancelScope(shield=True, deadline=self.hard_deadline) as scope:
            self._bounded.add(scope)
            try:
                yield scope
            finally:
                self._bounded.discard(scope)

    def deadline(self) -> float:
        """The deadline of a cleanup starting now."""
        if self.shutdown_at is not None:
            return self.hard_deadline
        return min(trio.current_time() + self.grace, self.hard_deadline)


class Slots(Protocol):
    """The ``task_concurrency`` limit as a task sees it (the dispatcher)."""

    def release(self) -> None:
        """The task's attempts are done: its slot is free."""

    def landed(self) -> None:
        """The task's record is durable (or given up)."""


def _register_secrets(value: Any) -> None:
    """Teach the redactor every secret the request carries."""
    if isinstance(value, Secret):
        if value.reveal():
            register_secret(value.reveal())
    elif isinstance(value, dict):
        for item in value.values():
            _register_secrets(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _register_secrets(item)
    elif attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            _register_secrets(getattr(value, field.name))


@attrs.define(eq=False)
class RequestContext:
    """Components of one request, built where its tasks run (one instance per request)."""

    request: RunRequest
    benchmark: BaseBenchmark
    harness: BaseHarness | None
    environment: BaseEnvironment
    recipes: list[BaseRecipe]
    analyzers: list[BaseAnalyzer]
    planner: Planner
    patterns: list[re.Pattern[str]]
    grants: Grants
    reporter: TaskReporter
    grace: GraceClock
    #: The run's tag: every session name starts with it (see :meth:`session_name`).
    tag: str = "run"
    #: Between the tag and the counter: tells apart the sessions of several
    #: processes running one request's tasks (a Ray worker's ``w<n>-``).
    name_prefix: str = ""
    _names: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    #: Told ``(task_id, attempt, stage)`` when a try enters ``run``,
    #: ``collect`` or ``evaluate`` (``setup`` starts with ``attempt_started``):
    #: a Ray worker streams it, so the driver knows the stage of an attempt
    #: lost with its worker. None in process (nothing to tell).
    on_stage: Callable[[str, int, str], None] | None = None
    #: ``trio.current_time`` without its lookups: the clock's own method.
    now: Callable[[], float] = attrs.field(factory=lambda: trio.lowlevel.current_clock().current_time)

    @classmethod
    def build(cls, request: RunRequest, grants: Grants, reporter: TaskReporter, grace: GraceClock) -> RequestContext:
        _register_secrets(request)
        benchmark = _registry.build("benchmark", request.benchmark.id, request.benchmark.config)
        harness = None
        if request.harness.id != "none":
            harness = _registry.build("harness", request.harness.id, request.harness.config)
        recipes = [_registry.build("recipe", r.id, r.config) for r in request.recipes]
        return cls(
            request=request,
            benchmark=benchmark,
            harness=harness,
            environment=_registry.build("environment", request.environment.id, request.environment.config),
            recipes=recipes,
            analyzers=[_registry.build("analyzer", a.id, a.config) for a in request.analyzers],
            planner=Planner(benchmark, recipes),
            patterns=[re.compile(p) for p in (request.execution.retry_pattern_list or [])],
            grants=grants,
            reporter=reporter,
            grace=grace,
            tag=getattr(reporter, "tag", "run"),
        )

    def session_name(self) -> str:
        """A new session name: the run's tag, ``-`` and a counter (``[a-z0-9-]``,
        at most 40 characters, unique within the run)."""
        return f"{self.tag}-{self.name_prefix}{next(self._names):x}"

    @property
    def provider(self) -> str:
        return self.environment.id
