"""Preflight: everything that can be checked before any task runs.

:func:`preflight` loads the config's plugins, then checks the orchestration
settings and every request: names, component ids and configs, harness
compatibility, value ranges, a ``${VAR}`` model key that will be used, and
each benchmark's own check of its data (``BaseBenchmark.preflight``). It
opens no environment and writes nothing; errors are one line naming the
request and key. Reading a config file is :mod:`agentcompass._config`'s job.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from . import _registry
from ._config import _one_line
from ._executors import check_executor
from ._redact import register_secret
from .runtime._components import BaseBenchmark, HarnessFreeBenchmark
from .runtime._errors import ComponentError, ConfigError
from .runtime._values import (
    ComponentRef,
    ExecutionPlan,
    ExecutionSpec,
    ModelSpec,
    NetworkOverrides,
    Orchestration,
    RunRequest,
    Secret,
)

__all__ = ["check_data", "has_data_checks", "preflight", "validate_request"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def preflight(orchestration: Orchestration, config_dir: Path | None = None, *, data: bool = True) -> None:
    """Check everything that can be checked before any task runs.

    Loads ``plugins``, then checks the orchestration settings and every
    request (names, component ids and configs, harness compatibility, value
    ranges, a ``${VAR}`` model key that will be used, and the benchmark's own
    :meth:`~agentcompass.BaseBenchmark.preflight`). Raises
    :class:`ConfigError` / :class:`ComponentError` with one line naming the
    request and key. Registers every secret of the requests for redaction.
    Opens no environment and writes nothing. ``data=False`` leaves out the
    benchmarks' own checks, which may read whole data sets (blocking):
    ``launch`` runs those with :func:`check_data` in a worker thread.
    """
    _registry.load_plugins(list(orchestration.plugins), config_dir)
    check_orchestration(orchestration)
    check_executor(orchestration)
    seen: set[str] = set()
    for i, request in enumerate(orchestration.requests):
        where = f"requests[{i}] {request.name!r}"
        validate_request(request, where, data=data)
        if request.name in seen:
            raise ConfigError(f"{where}: duplicate request name (names must be unique)")
        seen.add(request.name)
        _register_secrets(request)


def check_orchestration(orchestration: Orchestration) -> None:
    """Range checks of the orchestration-wide settings."""
    _check_int(orchestration.task_concurrency, "orchestration.task_concurrency", minimum=1)
    _check_timeout(orchestration.timeout_seconds, "orchestration.timeout_seconds")
    _check_number(orchestration.cleanup_grace_seconds, "orchestration.cleanup_grace_seconds", positive=False)
    for provider, limits in orchestration.providers.items():
        key = f"orchestration.providers[{provider!r}]"
        try:
            _registry.resolve("environment", provider)
        except ComponentError as exc:
            raise ComponentError(f"{key}: {exc}") from None
        _check_int(limits.capacity, f"{key}.capacity", minimum=0)
        _check_number(limits.open_qps, f"{key}.open_qps", positive=False)


def validate_request(request: RunRequest, where: str, *, data: bool = True) -> None:
    """Check one request; errors start with ``where`` (e.g. ``requests[1] 'smoke'``).
    ``data=False`` leaves out the benchmark's own check (see :func:`check_data`)."""
    try:
        _check_name(request.name)
        _check_execution(request.execution)
        _check_selection(request)
        if request.model is not None:
            _check_model(request.model)
        if isinstance(request.reuse, Path) and not request.reuse.is_dir():
            raise ConfigError(f"reuse: run directory not found: {request.reuse}")
        benchmark = _check_components(request)
        if data:
            _benchmark_preflight(benchmark, request)
    except ConfigError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def has_data_checks(orchestration: Orchestration) -> bool:
    """Whether a request's benchmark has a check of its own (``preflight`` overridden)."""
    for request in orchestration.requests:
        cls = _registry.resolve("benchmark", request.benchmark.id)
        if getattr(cls, "preflight", None) is not BaseBenchmark.preflight:
            return True
    return False


def check_data(orchestration: Orchestration) -> None:
    """Each benchmark's own check of its data (``BaseBenchmark.preflight``),
    after :func:`preflight` with ``data=False``. Blocking: it may read a
    whole data set, so ``launch`` calls it in a worker thread."""
    for i, request in enumerate(orchestration.requests):
        benchmark = _build("benchmark", request.benchmark, "")
        try:
            _benchmark_preflight(benchmark, request)
        except ConfigError as exc:
            raise type(exc)(f"requests[{i}] {request.name!r}: {exc}") from None


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ConfigError(
            f"name {name!r} must be 1-128 characters of letters, digits, '.', '_' or '-' "
            "starting with a letter or digit (it names the run directory)"
        )


def _check_execution(execution: ExecutionSpec) -> None:
    _check_int(execution.attempts.k, "execution.attempts.k", minimum=1)
    if execution.attempts.strategy not in ("avg", "pass"):
        raise ConfigError(f"execution.attempts.strategy must be 'avg' or 'pass', got {execution.attempts.strategy!r}")
    _check_int(execution.max_retries, "execution.max_retries", minimum=0)
    for j, pattern in enumerate(execution.retry_pattern_list or ()):
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise ConfigError(
                f"execution.retry_pattern_list[{j}]: invalid regex {pattern!r}: {exc}"
            ) from None
    low, high = execution.retry_min_delay_seconds, execution.retry_max_delay_seconds
    _check_number(low, "execution.retry_min_delay_seconds")
    _check_number(high, "execution.retry_max_delay_seconds")
    if high < low:
        raise ConfigError(
            f"execution.retry_max_delay_seconds ({high}) must be >= retry_min_delay_seconds ({low})"
        )
    for key in ("setup_timeout_seconds", "run_timeout_seconds", "evaluation_timeout_seconds"):
        _check_timeout(getattr(execution, key), f"execution.{key}")
    _check_number(execution.run_timer_compensation_seconds, "execution.run_timer_compensation_seconds", positive=False)


def _check_selection(request: RunRequest) -> None:
    if request.task_ids is not None:
        seen: set[str] = set()
        for task_id in request.task_ids:
            if not isinstance(task_id, str) or not task_id:
                raise ConfigError(f"task_ids: every task id must be a non-empty string, got {task_id!r}")
            if task_id in seen:
                raise ConfigError(f"task_ids: duplicate task id {task_id!r}")
            seen.add(task_id)
    if request.limit is not None:
        _check_int(request.limit, "limit", minimum=0)


_APIS = ("openai-chat", "openai-responses", "anthropic-messages", "google-generate-content", "none")


def _check_model(model: ModelSpec) -> None:
    if model.api not in _APIS:
        raise ConfigError(f"model.api must be one of {', '.join(map(repr, _APIS))}, got {model.api!r}")
    if not isinstance(model.name, str) or not model.name:
        raise ConfigError("model.name must be a non-empty string")
    if model.base_url is not None and not re.match(r"https?://", model.base_url):
        raise ConfigError(f"model.base_url must start with http:// or https://, got {model.base_url!r}")
    _check_timeout(model.timeout_seconds, "model.timeout_seconds")
    if model.max_connections is not None:
        _check_int(model.max_connections, "model.max_connections", minimum=1)


def _check_components(request: RunRequest) -> Any:
    benchmark = _build("benchmark", request.benchmark, "")
    harness: Any = None
    harness_free = isinstance(benchmark, HarnessFreeBenchmark)
    if request.harness.id == "none":
        if request.harness.config:
            raise ComponentError("harness 'none' takes no config")
        if not harness_free:
            raise ComponentError(
                f"harness 'none' needs a harness-free benchmark; benchmark {request.benchmark.id!r} "
                "needs a harness (see `compass list`)"
            )
    else:
        if harness_free:
            raise ComponentError(
                f"benchmark {request.benchmark.id!r} runs its own inference loop: set harness: none "
                f"(not {request.harness.id!r})"
            )
        harness = _build("harness", request.harness, "")
    environment = _build("environment", request.environment, "")
    try:
        environment.preflight()
    except ComponentError as exc:
        raise ComponentError(f"environment {request.environment.id!r}: {exc}") from None
    _check_network_overrides(request, environment)
    for kind, refs in (("recipe", request.recipes), ("analyzer", request.analyzers)):
        for j, ref in enumerate(refs):
            _build(kind, ref, f"{kind}s[{j}]: ")
    _check_model_key(request, harness if request.harness.id != "none" else benchmark)
    return benchmark


def _check_model_key(request: RunRequest, caller: Any) -> None:
    """A ``${VAR}`` model key must be set when the harness (or harness-free
    benchmark) calls the model; otherwise nothing will ever send it."""
    key = request.model.api_key if request.model is not None else None
    if key is None or key.env_var is None or not getattr(caller, "uses_model", True):
        return
    if os.environ.get(key.env_var) is None:
        raise ConfigError(f"environment variable {key.env_var} is not set @ model.api_key")


def _benchmark_preflight(benchmark: Any, request: RunRequest) -> None:
    where = f"benchmark {request.benchmark.id!r}"
    try:
        benchmark.preflight(request)
    except ConfigError as exc:
        raise ComponentError(f"{where}: {_one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - a failing check is a config error naming the benchmark
        raise ComponentError(f"{where}: preflight failed: {type(exc).__name__}: {_one_line(exc)}") from None


def _check_network_overrides(request: RunRequest, environment: Any) -> None:
    """A provider that cannot enforce the user's per-phase policies, or lacks
    a feature the user's ``execution.sandbox`` needs, says so before anything
    runs (a benchmark's own plan is checked per task)."""
    missing = request.execution.sandbox.features() - frozenset(environment.features)
    if missing:
        raise ComponentError(
            f"execution.sandbox: environment {request.environment.id!r} lacks {', '.join(sorted(missing))} "
            "(see compass list --verbose)"
        )
    network = request.execution.network
    if network == NetworkOverrides():
        return
    probe = ExecutionPlan(
        task_id="*",
        attempt=0,
        environment=request.environment,
        **{
            f"{phase}_network_policy": getattr(network, phase)
            for phase in ("baseline", "run", "evaluation")
            if getattr(network, phase) is not None
        },
    )
    try:
        environment.build_config(probe)
    except ComponentError as exc:
        raise ComponentError(f"execution.network: {exc}") from None


def _build(kind: str, ref: ComponentRef, prefix: str) -> Any:
    try:
        return _registry.build(kind, ref.id, ref.config)
    except ComponentError as exc:
        raise ComponentError(f"{prefix}{exc}") from None


def _register_secrets(request: RunRequest) -> None:
    if request.model is not None and request.model.api_key is not None:
        register_secret(request.model.api_key)
    refs = [request.benchmark, request.harness, request.environment, *request.recipes, *request.analyzers]
    for ref in refs:
        for secret in _secrets_in(ref.config):
            register_secret(secret)


def _secrets_in(value: Any) -> list[Secret]:
    if isinstance(value, Secret):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _secrets_in(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _secrets_in(v)]
    if isinstance(value, ModelSpec) and value.api_key is not None:
        return [value.api_key]
    return []


# ---------------------------------------------------------------- number checks


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(value: Any, key: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")


def _check_number(value: Any, key: str, positive: bool = True) -> None:
    """A finite number, > 0 when ``positive`` else >= 0."""
    ok = _is_number(value) and math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ConfigError(f"{key} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


def _check_timeout(value: Any, key: str) -> None:
    if value is not None:
        _check_number(value, key)
