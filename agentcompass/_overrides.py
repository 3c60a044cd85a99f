"""``--set`` overrides (config step 1): ``dotted.key=value`` edits of the raw config data, the value parsed as bounded YAML."""

from __future__ import annotations

import re
from typing import Any

import yaml

from ._config_keys import COMPONENT_FIELDS, COMPONENT_LISTS, REQUEST_FIELDS, TOP_LEVEL_KEYS
from ._yaml_limits import MAX_NESTING, safe_load, yaml_where
from .runtime._errors import ConfigError

__all__ = ["apply_override"]

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
        raise ConfigError(f"invalid override {_shown(override)}: bad YAML value{yaml_where(exc)}") from None
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
    return tail[-1] in COMPONENT_FIELDS or (len(tail) == 2 and tail[0] in COMPONENT_LISTS and isinstance(tail[1], int))


def _dotted(path: list[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
