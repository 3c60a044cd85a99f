"""Choosing the executor an orchestration's tasks run on (SPEC section 11).

``orchestration.executor`` names it: ``inprocess`` (the default, the
driver's own Trio run) or ``ray`` (a Ray cluster, ``agentcompass._ray``).
An executor's module is imported only when a config names it, so ``ray`` is
never imported otherwise. :func:`check_executor` is the preflight check;
:func:`open_executor` starts the executor before the orchestration
deadline starts and stops it after the run, within the cleanup grace.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .runtime._errors import ConfigError
from .runtime._values import Orchestration

__all__ = ["EXECUTORS", "check_executor", "open_executor"]

#: Executor ids a config may name.
EXECUTORS = ("inprocess", "ray")

RAY_INSTALL = "pip install 'agentcompass[ray]'"
RAY_CLIENT_INSTALL = "pip install 'ray[client]'"


def check_executor(orchestration: Orchestration) -> None:
    """Raise :class:`ConfigError` (one line) for an unknown executor id, its
    settings, or ``ray`` when Ray is not installed."""
    ref = orchestration.executor
    if ref.id not in EXECUTORS:
        raise ConfigError(
            f"orchestration.executor: unknown executor {ref.id!r} (expected one of {', '.join(EXECUTORS)})"
        )
    if ref.id == "inprocess":
        if ref.config:
            raise ConfigError(f"orchestration.executor: inprocess takes no config (got {sorted(ref.config)[0]!r})")
        return
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"orchestration.executor: ray is not installed here; install it with {RAY_INSTALL}")
    from ._ray._settings import RaySettings

    settings = RaySettings.parse(ref.config)
    if settings.address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise ConfigError(
            f"orchestration.executor.config.address: {settings.address} connects through Ray Client, "
            f"which is not installed here; install it with {RAY_CLIENT_INSTALL}"
        )


@contextlib.asynccontextmanager
async def open_executor(orchestration: Orchestration, config_dir: Path | None) -> AsyncIterator[Any]:
    """The executor of ``orchestration``, ready to run tasks (a Ray cluster
    started or joined, its workers up), stopped on the way out. Yields None
    for ``inprocess`` (``launch`` builds it on its grace clock)."""
    ref = orchestration.executor
    if ref.id == "inprocess":
        yield None
        return
    from ._ray import open_ray_executor

    async with open_ray_executor(orchestration, config_dir) as executor:
        yield executor
