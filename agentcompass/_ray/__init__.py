"""The ``ray`` executor: an orchestration's tasks on a Ray cluster (SPEC section 11).

Imported only when a config names ``orchestration.executor: {id: ray}``
(:mod:`agentcompass._executors` imports it then, and it registers itself
there); ``ray`` itself is imported only by :func:`open_ray_executor`.
``_settings`` holds the config, ``_cluster`` the ``address: local``
cluster, ``_worker`` the worker actor, ``_driver`` the executor and its
exchange with the workers (its docstring describes the protocol; what it
follows of each worker is ``_link``, the provider grants ``_grants``) and
``_messages`` what that exchange carries. From the orchestration it takes
only the executor seam, :mod:`agentcompass._seam`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from .. import _registry
from .._executors import ExecutorKind, register_executor
from ..runtime._errors import ConfigError
from ..runtime._values import Orchestration
from ._cluster import SINGLE_MACHINE, local_cluster
from ._driver import RayExecutor
from ._settings import RaySettings

__all__ = ["RayExecutor", "RaySettings", "check_ray", "open_ray_executor"]

RAY_INSTALL = "pip install 'agentcompass[ray]'"
RAY_CLIENT_INSTALL = "pip install 'ray[client]'"

#: How long the workers may take to start (importing Ray and the plugins).
WORKER_START_SECONDS = 120
#: Connections tried through Ray Client when the cluster aborts them (see _connect).
CLIENT_CONNECT_TRIES = 3


def check_ray(orchestration: Orchestration) -> None:
    """Preflight: Ray (and Ray Client for a ``ray://`` address) installed, the settings valid."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"orchestration.executor: ray is not installed here; install it with {RAY_INSTALL}")
    settings = RaySettings.parse(orchestration.executor.config)
    if settings.address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise ConfigError(
            f"orchestration.executor.config.address: {settings.address} connects through Ray Client, "
            f"which is not installed here; install it with {RAY_CLIENT_INSTALL}"
        )


@contextlib.asynccontextmanager
async def open_ray_executor(orchestration: Orchestration, config_dir: Path | None) -> AsyncIterator[RayExecutor]:
    """Start (``local``) or join the cluster, start ``workers`` worker actors
    and yield the executor; on the way out kill the workers, disconnect and
    stop a ``local`` cluster, within ``cleanup_grace_seconds``."""
    settings = RaySettings.parse(orchestration.executor.config)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray's C++ failure-signal handler would take SIGTERM from the CLI's own
    # handling (first signal: clean up; second: exit) and abort the driver.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    if settings.address == "local":
        # The driver resolves the loopback cluster's address as 127.0.0.1
        # (else Ray would replace it with this host's reachable address,
        # where the cluster does not listen). Read when Ray is imported.
        os.environ.setdefault(SINGLE_MACHINE, "0")
    ray = await trio.to_thread.run_sync(_import_ray)
    grace = orchestration.cleanup_grace_seconds
    async with contextlib.AsyncExitStack() as stack:
        address = settings.address
        if address == "local":
            address = await stack.enter_async_context(local_cluster(settings.workers, grace))
        if not ray.is_initialized():
            await trio.to_thread.run_sync(_connect, ray, address)
            stack.push_async_callback(_bounded, grace, ray.shutdown)
        actors = await trio.to_thread.run_sync(_start_workers, ray, orchestration, settings, config_dir)
        stack.push_async_callback(_bounded, grace, _kill_workers, ray, actors)
        yield RayExecutor(ray, actors, settings.worker_concurrency)


def _import_ray() -> Any:
    import ray

    return ray


def _connect(ray: Any, address: str, pause: float = 1.0) -> None:
    """Join the cluster at ``address``; a failure is a config error naming it
    (nothing has run yet). Through Ray Client, a connection the cluster's
    proxy aborts is tried again: the proxy starts a server per connection,
    which a loaded head node can fail to start."""
    options: dict[str, Any] = {}
    if address.startswith("127.0.0.1:"):
        # A loopback cluster: this node is 127.0.0.1 too (Ray would otherwise
        # look for its address by connecting out).
        options["_node_ip_address"] = "127.0.0.1"
    for tries in itertools.count(1):
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False, configure_logging=False, **options)
            return
        except ConnectionAbortedError as exc:
            if not address.startswith("ray://") or tries == CLIENT_CONNECT_TRIES:
                raise _not_connected(address, exc, tries) from None
            ray.shutdown()
            time.sleep(pause * tries)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises, one line naming the address
            raise _not_connected(address, exc, tries) from None


def _not_connected(address: str, exc: BaseException, tries: int) -> ConfigError:
    reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    after = f" ({tries} tries)" if tries > 1 else ""
    return ConfigError(f"orchestration.executor.address: cannot connect to Ray at {address}{after}: {reason}")


def _start_workers(
    ray: Any, orchestration: Orchestration, settings: RaySettings, config_dir: Path | None
) -> list[tuple[Any, int]]:
    from ._worker import Worker

    options: dict[str, Any] = {
        # Ray's own restarts and retries would run an attempt twice behind
        # the driver's back: a lost worker is the driver's to handle.
        "max_restarts": 0,
        "max_task_retries": 0,
        # poll, deliver and the odd pid/sweep call, each in its own thread.
        "max_concurrency": 4,
        "scheduling_strategy": "SPREAD",
    }
    if settings.runtime_env:
        options["runtime_env"] = settings.runtime_env
    actor = ray.remote(Worker)
    plugins = list(orchestration.plugins)
    where = str(config_dir) if config_dir is not None else None
    modules = _registry.registering_modules()
    handles = [
        actor.options(**options).remote(
            index, plugins, where, modules, orchestration.cleanup_grace_seconds, settings.worker_concurrency
        )
        for index in range(settings.workers)
    ]
    try:
        pids = ray.get([handle.pid.remote() for handle in handles], timeout=WORKER_START_SECONDS)
    except BaseException:
        _kill_workers(ray, [(handle, 0) for handle in handles])
        raise
    return list(zip(handles, pids, strict=True))


def _kill_workers(ray: Any, actors: list[tuple[Any, int]]) -> None:
    for handle, _ in actors:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


async def _bounded(grace: float, fn: Any, *args: Any) -> None:
    """A blocking Ray call on the way out, given at most ``grace`` seconds."""
    with trio.move_on_after(grace, shield=True):
        await trio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)


register_executor(ExecutorKind("ray", check_ray, open_ray_executor))
