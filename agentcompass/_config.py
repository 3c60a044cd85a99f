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
   :func:`preflight` checks: the ``oracle`` demo needs no API key.
3. The converter structures the data; unknown keys and wrong types are
   errors naming the key path, e.g. ``unknown key 'max_retriez' @ requests[0].execution``.
4. Relative paths written in the file resolve against the file's directory:
   ``plugins`` entries, ``output_root``, ``reuse`` and every component config
   field typed ``pathlib.Path`` in the component's ``Config`` class (so the
   config's plugins are imported here, to know those classes). The default
   ``output_root`` (``runs``) and paths from the command line stay relative
   to the current directory.

:func:`preflight` is everything that can be checked before any task runs:
plugins, component ids and configs, harness compatibility, value ranges and
each benchmark's own check of its data (``BaseBenchmark.preflight``). It
opens no environment and writes nothing.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs
import yaml

from . import _registry
from ._executors import check_executor
from ._redact import register_secret
from .runtime._components import BaseBenchmark, HarnessFreeBenchmark
from .runtime._convert import _ENV_REF, SECRET_CONFIG_KEYS, resolve_paths, structure
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

__all__ = [
    "apply_override",
    "build_orchestration",
    "check_data",
    "has_data_checks",
    "load_config",
    "preflight",
    "validate_request",
]

TOP_LEVEL_KEYS = ("plugins", "orchestration", "requests")
REQUEST_FIELDS = frozenset(f.name for f in attrs.fields(RunRequest))
_COMPONENT_FIELDS = ("benchmark", "harness", "environment")
_COMPONENT_LISTS = ("recipes", "analyzers")
_SETTINGS_KEYS = frozenset(f.name for f in attrs.fields(Orchestration)) - {"requests", "plugins"}

# ---------------------------------------------------------------- reading


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Orchestration:
    """Read a YAML config file, apply ``--set`` overrides and structure it.

    Raises :class:`ConfigError` with one line naming the file, key or value.
    Component ids are not checked here; :func:`preflight` does that.
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
        raise ConfigError(f"cannot read config file {path}: {_one_line(exc)}") from None
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML in {path}{_yaml_where(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping with a 'requests' list, got {type(data).__name__}")
    return data


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or _one_line(exc)
    if mark is None:
        return f": {problem}"
    return f" line {mark.line + 1}: {problem}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# ---------------------------------------------------------------- bounded YAML

#: The deepest nesting of mappings and lists a config may have, counting the
#: top-level mapping as 1 and a value reached through an alias as if written
#: out there. Deeper is refused while parsing, before the parser's own
#: recursion (or any later walk of the data) can overflow the stack.
MAX_NESTING = 100
#: How many values (scalars, lists and mappings) all the aliases of one
#: document may add when written out in full. A few anchors for a shared model
#: block add tens; a "billion laughs" document (aliases of aliases of lists)
#: would add ~10**9 from a few hundred bytes, and is refused while parsing.
MAX_ALIAS_VALUES = 100_000
_SHOWN_PATH_PARTS = 8


class _LimitError(yaml.MarkedYAMLError):
    """A document beyond :data:`MAX_NESTING` or :data:`MAX_ALIAS_VALUES`."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, while composing, nesting deeper than
    :data:`MAX_NESTING`, aliases that add more than :data:`MAX_ALIAS_VALUES`
    values, and recursive aliases (``&a [*a]``).

    Composition is where a document's size can explode: an alias is one event
    but stands for its whole anchored node. Each finished collection's height
    and written-out size are recorded (an alias only ever names a finished
    node, or an open one, which is recursion), so the check costs one pass
    over the nodes as written, never the expansion. Construction then builds
    the same shared objects ``yaml.safe_load`` would.
    """

    def __init__(self, stream: str, depth: int = 0, where: Sequence[str] = ()) -> None:
        super().__init__(stream)
        self._depth = depth  # collections open around the next node
        self._where = list(where)  # the key path to the next node, for messages
        self._shapes: dict[int, tuple[int, int]] = {}  # id(collection node): (height, written-out size)
        self._alias_values = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        label = _label(parent, index)
        if label:
            self._where.append(label)
        try:
            if self.check_event(yaml.AliasEvent):
                return self._compose_alias(parent, index)
            event = self.peek_event()
            if not isinstance(event, yaml.CollectionStartEvent):
                return super().compose_node(parent, index)
            if self._depth >= MAX_NESTING:
                self._refuse(f"nesting deeper than {MAX_NESTING} levels", event.start_mark)
            self._depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            self._shapes[id(node)] = _shape(node, self._shapes)
            return node
        finally:
            if label:
                self._where.pop()

    def _compose_alias(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        node = self.anchors.get(event.anchor)
        if isinstance(node, yaml.CollectionNode):
            shape = self._shapes.get(id(node))
            if shape is None:
                self._refuse(f"recursive alias *{event.anchor} (it is inside its own anchor)", event.start_mark)
            height, size = shape
            if self._depth + height > MAX_NESTING:
                self._refuse(
                    f"nesting deeper than {MAX_NESTING} levels through alias *{event.anchor}", event.start_mark
                )
        else:
            size = 1
        self._alias_values += size
        if self._alias_values > MAX_ALIAS_VALUES:
            self._refuse(f"aliases expand to more than {MAX_ALIAS_VALUES} values (alias-bomb limit)", event.start_mark)
        return super().compose_node(parent, index)  # undefined aliases: yaml's own error

    def _refuse(self, problem: str, mark: Any) -> NoReturn:
        where = "".join(self._where[:_SHOWN_PATH_PARTS]).lstrip(".")
        if len(self._where) > _SHOWN_PATH_PARTS:
            where += "..."
        raise _LimitError(problem=f"{problem} @ {where or 'top level'}", problem_mark=mark)


def _label(parent: yaml.Node | None, index: Any) -> str:
    if isinstance(parent, yaml.SequenceNode):
        return f"[{index}]"
    if isinstance(parent, yaml.MappingNode):
        return f".{index.value}" if isinstance(index, yaml.ScalarNode) else ".<key>"
    return ""


def _shape(node: yaml.Node, shapes: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(height, size) of a finished collection ``node`` with every alias written out."""
    children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
    height, size = 0, 1
    for child in children:
        child_height, child_size = shapes.get(id(child), (0, 1))  # a scalar: (0, 1)
        height = max(height, child_height)
        size += child_size
    return height + 1, size


def safe_load(text: str, *, depth: int = 0, where: Sequence[str] = ()) -> Any:
    """``yaml.safe_load`` within :data:`MAX_NESTING` and :data:`MAX_ALIAS_VALUES`.

    ``depth`` is the number of collections the text's value will sit in
    (for an override's value), ``where`` the key path labels to it
    (``["requests", "[0]", ".model"]``), for messages. Raises ``yaml.YAMLError``.
    """
    loader = _BoundedLoader(text, depth, where)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def check_nesting(data: Any, where: str = "") -> None:
    """Raise :class:`ConfigError` if ``data`` (parsed already, e.g. from JSON or
    given by the SDK) nests deeper than :data:`MAX_NESTING`, naming the path to a
    too-deep value. Shared and recursive containers are walked once per level,
    so this is linear in the distinct containers, never their expansion."""
    # Breadth first, one level at a time; an entry is (container, its parent entry, key).
    level: list[tuple[Any, Any, str]] = [(data, None, where)] if isinstance(data, (dict, list)) else []
    for _ in range(MAX_NESTING):
        seen: set[int] = set()
        deeper: list[tuple[Any, Any, str]] = []
        for entry in level:
            container = entry[0]
            items = container.items() if isinstance(container, dict) else enumerate(container)
            for key, value in items:
                if isinstance(value, (dict, list)) and id(value) not in seen:
                    seen.add(id(value))
                    deeper.append((value, entry, f"[{key}]" if isinstance(container, list) else f".{key}"))
        level = deeper
    if level:
        parts: list[str] = []
        entry = level[0]
        while entry is not None:
            parts.append(entry[2])
            entry = entry[1]
        parts.reverse()
        shown = "".join(parts[:_SHOWN_PATH_PARTS]).lstrip(".") + ("..." if len(parts) > _SHOWN_PATH_PARTS else "")
        raise ConfigError(f"config nested deeper than {MAX_NESTING} levels @ {shown or 'top level'}")


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
    data = _expand_config(data)
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
    for kind in _COMPONENT_FIELDS:
        ref = getattr(request, kind)
        if ref.id != "none":
            changes[kind] = _resolve_ref_paths(kind, ref, base_dir, lambda key, k=kind: raw.from_file(k, "config", key))
    for field in _COMPONENT_LISTS:
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


# ---------------------------------------------------------------- --set overrides

_KEY_PART = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one ``dotted.key=value`` override to raw config ``data`` in place.

    ``value`` is parsed as YAML (``=3`` is an int, ``=true`` a bool, ``=[a, b]``
    a list). Keys start with a top-level key (``orchestration.task_concurrency=8``,
    ``requests[0].execution.max_retries=2`` or ``requests.0.execution...``) or
    with a request field, which sets it in every request
    (``execution.max_retries=2``). Missing mappings on the way are created.
    """
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"invalid override {override!r}: expected key=value")
    path = _parse_key(key.strip(), override)
    # Collections around the value: one per key part, the last one's included
    # (the top-level mapping holds ``path[0]``); a request field is also inside
    # the requests list and a request.
    depth = len(path) if path[0] in TOP_LEVEL_KEYS else len(path) + 2
    if depth > MAX_NESTING:
        raise ConfigError(f"invalid override {_shown(override)}: key nested deeper than {MAX_NESTING} levels")
    try:
        value = safe_load(raw, depth=depth, where=[f"[{p}]" if isinstance(p, int) else f".{p}" for p in path])
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid override {_shown(override)}: bad YAML value{_yaml_where(exc)}") from None
    head = path[0]
    if head in TOP_LEVEL_KEYS:
        _set_path(data, path, value, override)
    elif head in REQUEST_FIELDS:
        requests = data.get("requests")
        if not isinstance(requests, list) or not requests:
            raise ConfigError(f"invalid override {override!r}: there are no requests to set it in")
        for request in requests:
            _set_path(request, path, value, override)
    else:
        raise ConfigError(
            f"invalid override {override!r}: unknown key {head!r} "
            f"(expected {', '.join(TOP_LEVEL_KEYS)} or a request field)"
        )


def _shown(override: str, limit: int = 80) -> str:
    # An override as messages quote it: a bomb given with --set stays one short line.
    return repr(override) if len(override) <= limit else repr(override[:limit]) + "..."


def _parse_key(key: str, override: str) -> list[str | int]:
    # Parts are ``name`` or ``name[0][1]``; an all-digit name after the first is an index.
    path: list[str | int] = []
    for part in key.split("."):
        match = _KEY_PART.fullmatch(part)
        if match is None:
            raise ConfigError(f"invalid override {override!r}: bad key {key!r}")
        name, indexes = match.groups()
        path.append(int(name) if name.isdigit() and path else name)
        path.extend(int(i) for i in re.findall(r"\d+", indexes))
    if isinstance(path[0], int):
        raise ConfigError(f"invalid override {override!r}: bad key {key!r}")
    return path


def _set_path(node: Any, path: list[str | int], value: Any, override: str) -> None:
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, dict) and isinstance(part, str):
            if last:
                node[part] = value
            elif node.get(part) is None:
                if isinstance(path[i + 1], int):
                    raise ConfigError(f"invalid override {override!r}: {_dotted(path[: i + 1])} is not a list")
                node[part] = {}
        elif isinstance(node, list) and isinstance(part, int):
            if part >= len(node):
                raise ConfigError(
                    f"invalid override {override!r}: index {part} out of range "
                    f"({_dotted(path[:i])} has {len(node)} item(s))"
                )
            if last:
                node[part] = value
        else:
            kind = "a list" if isinstance(part, int) else "a mapping"
            raise ConfigError(f"invalid override {override!r}: {_dotted(path[:i]) or 'the config'} is not {kind}")
        if not last and isinstance(node[part], str) and _is_component_position(path[: i + 1]):
            node[part] = {"id": node[part]}  # ``harness: oracle`` shorthand, now being edited
        node = node[part]


def _is_component_position(path: list[str | int]) -> bool:
    tail = path[-2:]
    return tail[-1] in _COMPONENT_FIELDS or (
        len(tail) == 2 and tail[0] in _COMPONENT_LISTS and isinstance(tail[1], int)
    )


def _dotted(path: list[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


# ---------------------------------------------------------------- ${VAR} expansion

_VAR = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_config(data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        if key == "requests" and isinstance(value, list):
            out[key] = [_expand_request(r, f"requests[{i}]") for i, r in enumerate(value)]
        else:
            out[key] = _expand(value, key)
    return out


def _expand_request(request: Any, where: str) -> Any:
    if not isinstance(request, dict):
        return request
    out = {}
    for key, value in request.items():
        path = f"{where}.{key}"
        if key == "model":
            out[key] = _expand_model(value, path)
        elif key in _COMPONENT_FIELDS:
            out[key] = _expand_component(value, path)
        elif key in _COMPONENT_LISTS and isinstance(value, list):
            out[key] = [_expand_component(v, f"{path}[{i}]") for i, v in enumerate(value)]
        else:
            out[key] = _expand(value, path)
    return out


def _expand_model(model: Any, where: str) -> Any:
    """Expand a model mapping, keeping a whole ``${VAR}`` api_key as a reference:
    preflight checks it is set, and only when the request calls a model."""
    if not isinstance(model, dict):
        return _expand(model, where)
    return {
        k: v if k == "api_key" and isinstance(v, str) and _ENV_REF.match(v) else _expand(v, f"{where}.{k}")
        for k, v in model.items()
    }


def _expand_component(ref: Any, where: str) -> Any:
    if not isinstance(ref, dict):
        return _expand(ref, where)
    return {
        key: _expand(value, f"{where}.{key}", SECRET_CONFIG_KEYS if key == "config" else frozenset())
        for key, value in ref.items()
    }


def _expand(value: Any, where: str, secret_keys: frozenset[str] = frozenset(), deep: bool = True) -> Any:
    """Expand strings under ``value``; keys in ``secret_keys`` are secret positions
    (at every depth when ``deep``, else only directly under ``value``)."""
    if isinstance(value, str):
        return _expand_string(value, where)
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", secret_keys, deep) for i, v in enumerate(value)]
    if isinstance(value, dict):
        inner = secret_keys if deep else frozenset()
        return {
            k: _expand_secret(v, f"{where}.{k}")
            if k in secret_keys and isinstance(v, str)
            else _expand(v, f"{where}.{k}", inner, deep)
            for k, v in value.items()
        }
    return value


def _expand_secret(value: str, where: str) -> str:
    match = _ENV_REF.match(value)
    if match is None:
        return _expand_string(value, where)
    _getenv(match.group(1), where)
    return value  # the converter turns the reference into Secret.from_env


def _expand_string(value: str, where: str) -> str:
    if "$" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        escaped, name = match.groups()
        return f"${{{name}}}" if escaped else _getenv(name, where)

    return _VAR.sub(substitute, value)


def _getenv(name: str, where: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"environment variable {name} is not set @ {where}")
    return value


# ---------------------------------------------------------------- preflight

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


def _check_model(model: ModelSpec) -> None:
    if model.api not in ("openai-chat", "none"):
        raise ConfigError(f"model.api must be 'openai-chat' or 'none', got {model.api!r}")
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
