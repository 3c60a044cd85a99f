"""The executors an orchestration's tasks may run on, by id (SPEC section 11).

``orchestration.executor`` names one: ``inprocess`` (the default, the
driver's own Trio run) or ``ray`` (a Ray cluster). An executor registers an
:class:`ExecutorKind` under its id with :func:`register_executor`, as a
component registers its class; a built-in one's module is imported only
when a config names its id (:data:`BUILT_IN` names it by string, as the
component registry names the built-in components), so ``ray`` is never
imported otherwise, and this module stays below the orchestration and the
executors, which import it.

:func:`check_executor` is the preflight check; :func:`open_executor` starts
the executor before the orchestration deadline starts and stops it after
the run, within the cleanup grace. What crosses between the orchestration
and an executor is :mod:`agentcompass._seam`'s.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs

from .runtime._errors import ConfigError
from .runtime._values import Orchestration

__all__ = ["BUILT_IN", "ExecutorKind", "check_executor", "executor_ids", "open_executor", "register_executor"]

#: Built-in executor id -> the module that registers it (None: this one).
BUILT_IN: dict[str, str | None] = {"inprocess": None, "ray": "agentcompass._ray"}


@attrs.frozen
class ExecutorKind:
    """An executor as the orchestration knows it."""

    id: str
    #: Preflight of ``orchestration.executor``: raise :class:`ConfigError`
    #: (one line naming the key) for its config, or for what it needs and
    #: is not installed. Imports nothing heavy (``ray`` stays unimported).
    check: Callable[[Orchestration], None]
    #: ``open(orchestration, config_dir)``: an async context manager that
    #: yields the started executor (a cluster joined, its workers up) and
    #: stops it on the way out, within the cleanup grace; it yields None
    #: for the in-process executor, which ``launch`` builds on its grace clock.
    open: Callable[[Orchestration, Path | None], contextlib.AbstractAsyncContextManager[Any]]


_kinds: dict[str, ExecutorKind] = {}


def register_executor(kind: ExecutorKind) -> ExecutorKind:
    """Make ``kind`` available under its id (registering the same id again replaces it)."""
    _kinds[kind.id] = kind
    return kind


def executor_ids() -> list[str]:
    """Every id a config may name."""
    return sorted(set(BUILT_IN) | set(_kinds))


def _kind(orchestration: Orchestration) -> ExecutorKind:
    executor_id = orchestration.executor.id
    kind = _kinds.get(executor_id)
    if kind is None and BUILT_IN.get(executor_id):
        importlib.import_module(BUILT_IN[executor_id] or "")
        kind = _kinds.get(executor_id)
    if kind is None:
        raise ConfigError(
            f"orchestration.executor: unknown executor {executor_id!r} (expected one of {', '.join(executor_ids())})"
        )
    return kind


def check_executor(orchestration: Orchestration) -> None:
    """Raise :class:`ConfigError` (one line) for an unknown executor id, its
    settings, or what it needs and is not installed (``ray``)."""
    _kind(orchestration).check(orchestration)


@contextlib.asynccontextmanager
async def open_executor(orchestration: Orchestration, config_dir: Path | None) -> AsyncIterator[Any]:
    """The executor of ``orchestration``, ready to run tasks, stopped on the
    way out. Yields None for ``inprocess`` (``launch`` builds it on its grace clock)."""
    async with _kind(orchestration).open(orchestration, config_dir) as executor:
        yield executor


def _check_in_process(orchestration: Orchestration) -> None:
    config = orchestration.executor.config
    if config:
        raise ConfigError(f"orchestration.executor: inprocess takes no config (got {sorted(config)[0]!r})")


@contextlib.asynccontextmanager
async def _open_in_process(orchestration: Orchestration, config_dir: Path | None) -> AsyncIterator[None]:
    yield None


register_executor(ExecutorKind("inprocess", _check_in_process, _open_in_process))
