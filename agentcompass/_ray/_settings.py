"""The ``ray`` executor's settings (``orchestration.executor.config``)."""

from __future__ import annotations

import re
from typing import Any

import attrs

from ..runtime._errors import ConfigError

__all__ = ["RaySettings"]

_WHERE = "orchestration.executor.config"


@attrs.frozen
class RaySettings:
    """``address``: ``local`` (a loopback cluster of ``workers`` processes
    started for the run and stopped after), ``auto`` (the cluster this node
    belongs to) or ``ray://host:port`` / ``host:port`` (an existing one).
    ``workers`` Ray actors run the tasks, each ``worker_concurrency`` at
    once. ``runtime_env`` is Ray's own (``pip``, ``py_modules``,
    ``env_vars``, ``working_dir``), applied to the workers."""

    address: str = "local"
    workers: int = 2
    worker_concurrency: int = 64
    runtime_env: dict[str, Any] = attrs.Factory(dict)

    @classmethod
    def parse(cls, config: dict[str, Any]) -> RaySettings:
        """Settings from a config mapping; :class:`ConfigError` names the key."""
        if not isinstance(config, dict):
            raise ConfigError(f"expected a mapping, got {config!r} @ {_WHERE}")
        known = {f.name for f in attrs.fields(cls)}
        for key in config:
            if key not in known:
                raise ConfigError(f"unknown key {key!r} @ {_WHERE} (expected {', '.join(sorted(known))})")
        address = config.get("address", "local")
        if not isinstance(address, str) or not (
            address in ("local", "auto") or re.fullmatch(r"(ray://)?[A-Za-z0-9.\-\[\]:]+:\d+", address)
        ):
            raise ConfigError(f"{_WHERE}.address: expected local, auto, ray://host:port or host:port, got {address!r}")
        for key in ("workers", "worker_concurrency"):
            value = config.get(key, getattr(cls(), key))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{_WHERE}.{key}: expected an integer >= 1, got {value!r}")
        runtime_env = config.get("runtime_env", {})
        if not isinstance(runtime_env, dict):
            raise ConfigError(f"{_WHERE}.runtime_env: expected a mapping, got {runtime_env!r}")
        return cls(
            address=address,
            workers=config.get("workers", 2),
            worker_concurrency=config.get("worker_concurrency", 64),
            runtime_env=runtime_env,
        )
