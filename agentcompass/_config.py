"""Config files in, a checked :class:`Orchestration` out.

A config is a YAML mapping with three keys, all optional but ``requests``::

    plugins: [my_plugins.py, some.module]     # file paths are relative to the config file
    orchestration: {task_concurrency: 4, timeout_seconds: 3600,
                    cleanup_grace_seconds: 30, providers: {local: {capacity: 8, open_qps: 2}}}
    requests: [{name: smoke, benchmark: {id: terminal, config: {path: tasks}}, ...}]

:func:`load_config` reads and structures it in this order:

0. The YAML is parsed within two limits, checked while it is composed so a
   bomb costs what its text costs: nesting at most :data:`MAX_NESTING` (100)
   mappings and lists deep, and aliases adding at most
   :data:`MAX_ALIAS_VALUES` (100,000) values when written out ("billion
   laughs"); a recursive alias is refused. ``--set`` values are parsed the
   same way, and data handed to :func:`build_orchestration` (JSON flags, SDK
   callers) is held to the same depth.
1. ``--set`` overrides edit the raw YAML data (see :func:`apply_override`).
2. ``${VAR}`` is replaced by the environment variable in every string
   (``$${VAR}`` keeps a literal ``${VAR}``); an unset variable is an error.
   Secret positions are the exception: ``model.api_key`` and, inside a
   component's ``config`` at any depth, the keys ``token``, ``api_key``,
   ``password`` and ``secret``. There a whole-value ``${VAR}`` is kept as a
   reference and becomes a ``Secret`` that reads the variable and
   serializes as ``${VAR}``; any other string becomes a ``Secret`` holding
   its (expanded) value. A component-config reference must be set at load;
   a ``model.api_key`` reference only when the request's harness (or
   harness-free benchmark) calls the model (``uses_model``), which
   preflight checks: the ``oracle`` demo needs no API key.
3. The converter structures the data; unknown keys and wrong types are
   errors naming the key path, e.g. ``unknown key 'max_retriez' @ requests[0].execution``.
4. Relative paths written in the file resolve against the file's directory:
   ``plugins`` entries, ``output_root``, ``reuse`` and every component config
   field typed ``pathlib.Path`` in the component's ``Config`` class (so the
   config's plugins are imported here, to know those classes). The default
   ``output_root`` (``runs``) and paths from the command line stay relative
   to the current directory.

What can be checked before any task runs (plugins, component ids and
configs, harness compatibility, value ranges, each benchmark's own check of
its data) is :func:`agentcompass._preflight.preflight`'s job.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from . import _registry
from ._config_keys import COMPONENT_FIELDS, COMPONENT_LISTS
from ._config_keys import REQUEST_FIELDS as REQUEST_FIELDS
from ._config_keys import TOP_LEVEL_KEYS as TOP_LEVEL_KEYS
from ._env_refs import expand_config
from ._overrides import apply_override as apply_override
from ._yaml_limits import MAX_ALIAS_VALUES as MAX_ALIAS_VALUES
from ._yaml_limits import MAX_NESTING as MAX_NESTING
from ._yaml_limits import check_nesting as check_nesting
from ._yaml_limits import one_line, yaml_where
from ._yaml_limits import one_line as _one_line  # noqa: F401 - imported from here by _preflight
from ._yaml_limits import safe_load as safe_load
from .runtime._convert import resolve_paths, structure
from .runtime._errors import ComponentError, ConfigError
from .runtime._values import (
    ComponentRef,
    Orchestration,
    RunRequest,
)

__all__ = [
    "apply_override",
    "build_orchestration",
    "load_config",
]

_SETTINGS_KEYS = frozenset(f.name for f in attrs.fields(Orchestration)) - {"requests", "plugins"}

# ---------------------------------------------------------------- reading


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Orchestration:
    """Read a YAML config file, apply ``--set`` overrides and structure it.

    Raises :class:`ConfigError` with one line naming the file, key or value.
    Component ids are not checked here; :func:`agentcompass._preflight.preflight` does that.
    """
    path = Path(path)
    data = _read_yaml(path)
    return build_orchestration(data, overrides, base_dir=path.parent)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {one_line(exc)}") from None
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML in {path}{yaml_where(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping with a 'requests' list, got {type(data).__name__}")
    return data


def build_orchestration(
    data: dict[str, Any], overrides: Sequence[str] = (), base_dir: Path | None = None
) -> Orchestration:
    """Structure config ``data`` (the parsed YAML) after overrides and ``${VAR}`` expansion.

    ``data`` nested deeper than :data:`MAX_NESTING` is refused first (YAML read
    by :func:`load_config` was bounded while parsing; this covers JSON and SDK data).
    """
    check_nesting(data)
    written = copy.deepcopy(data.get("requests"))  # as in the file: --set values are the command line's
    data = copy.deepcopy(data)
    for override in overrides:
        apply_override(data, override)
    given = copy.deepcopy(data.get("requests"))
    unknown = [k for k in data if k not in TOP_LEVEL_KEYS]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} @ top level (expected {', '.join(TOP_LEVEL_KEYS)})")
    data = expand_config(data)
    settings = data.get("orchestration") or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"expected a mapping, got {settings!r} @ orchestration")
    for key in settings:
        if key not in _SETTINGS_KEYS:
            raise ConfigError(f"unknown key {key!r} @ orchestration")
    orchestration = structure({**settings, "requests": []}, Orchestration, root="orchestration")
    if not data.get("requests"):
        raise ConfigError("no requests: the config needs a non-empty 'requests' list")
    requests = structure(data["requests"], list[RunRequest], root="requests")
    plugins = [_plugin_path(p, base_dir) for p in structure(data.get("plugins") or [], list[str], root="plugins")]
    if base_dir is not None:
        _registry.load_plugins(plugins, base_dir)  # their Config classes say which values are paths
        requests = [
            _resolve_request_paths(r, _FromFile(_item(written, i), _item(given, i)), base_dir)
            for i, r in enumerate(requests)
        ]
    return attrs.evolve(orchestration, requests=requests, plugins=plugins)


def _plugin_path(entry: str, base_dir: Path | None) -> str:
    # Same rule as the registry: a ``.py`` or a path with a slash is a file.
    if base_dir is None or not (entry.endswith(".py") or "/" in entry) or Path(entry).is_absolute():
        return entry
    return str((base_dir / entry).resolve())


def _relative_to(path: Path, base_dir: Path) -> Path:
    return path if path.is_absolute() else Path(os.path.abspath(base_dir / path))


def _item(items: Any, index: int) -> Any:
    return items[index] if isinstance(items, list) and index < len(items) else None


@attrs.frozen
class _FromFile:
    """One raw request as written in the file and as given (after ``--set``):
    a value is the file's when both agree, else the command line's."""

    written: Any
    given: Any

    def from_file(self, *keys: str | int) -> bool:
        value = _lookup(self.written, keys)
        return value is not _MISSING and value == _lookup(self.given, keys)


_MISSING = object()


def _lookup(node: Any, keys: tuple[str | int, ...]) -> Any:
    for key in keys:
        if isinstance(node, dict) and isinstance(key, str) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return _MISSING
    return node


def _resolve_request_paths(request: RunRequest, raw: _FromFile, base_dir: Path) -> RunRequest:
    """Resolve the paths ``request`` was given in the file against ``base_dir``
    (values given on the command line stay relative to the current directory)."""
    changes: dict[str, Any] = {}
    if raw.from_file("output_root"):  # the default ``runs`` stays cwd-relative
        changes["output_root"] = _relative_to(request.output_root, base_dir)
    if isinstance(request.reuse, Path) and raw.from_file("reuse"):
        changes["reuse"] = _relative_to(request.reuse, base_dir)
    for kind in COMPONENT_FIELDS:
        ref = getattr(request, kind)
        if ref.id != "none":
            changes[kind] = _resolve_ref_paths(kind, ref, base_dir, lambda key, k=kind: raw.from_file(k, "config", key))
    for field in COMPONENT_LISTS:
        kind = field[:-1]
        changes[field] = [
            _resolve_ref_paths(kind, ref, base_dir, lambda key, f=field, j=j: raw.from_file(f, j, "config", key))
            for j, ref in enumerate(getattr(request, field))
        ]
    return attrs.evolve(request, **changes)


def _resolve_ref_paths(kind: str, ref: ComponentRef, base_dir: Path, from_file: Any) -> ComponentRef:
    try:
        cls = _registry.resolve(kind, ref.id)
    except ComponentError:
        return ref  # preflight names the unknown id
    if cls.Config is None:
        return ref
    resolved = resolve_paths(ref.config, cls.Config, base_dir)
    config = {key: value if from_file(key) else ref.config[key] for key, value in resolved.items()}
    return attrs.evolve(ref, config=config)
