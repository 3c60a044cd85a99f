"""What ``compass list --verbose`` and ``compass describe`` print about a component.

Everything comes from the component class: its docstring's first line, and
for each field of its ``Config`` attrs class the key, type, default and a
one-line doc (the field's ``metadata["doc"]``, as in
``path: Path = attrs.field(metadata={"doc": "..."})``).

``compass describe execution`` and ``compass describe orchestration`` read
the config blocks of the same name the same way, from the attrs values they
are structured into (:data:`BLOCKS`); a nested value's keys are listed under
its key with a dot (``attempts.k``), a mapping's under ``<id>``
(``providers.<id>.capacity``).
"""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Any

import attrs

from .runtime._values import ComponentRef, ExecutionSpec, Orchestration

__all__ = ["BLOCKS", "block_lines", "config_keys", "describe_lines", "summary_line"]

#: Config blocks that ``compass describe`` explains: name -> (value class,
#: where the block goes in a config file, keys that are not written there).
BLOCKS: dict[str, tuple[type, str, frozenset[str]]] = {
    "execution": (ExecutionSpec, "requests[].execution", frozenset()),
    "orchestration": (Orchestration, "orchestration", frozenset({"requests", "plugins"})),
}


def summary_line(cls: type) -> str:
    """The first sentence of the class docstring (empty when there is none)."""
    paragraph = (inspect.getdoc(cls) or "").strip().split("\n\n")[0]
    text = " ".join(paragraph.split()).replace("``", "`")
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _type_name(type_: Any) -> str:
    if type_ is None or type_ is type(None):
        return "null"
    if type_ is Path:
        return "path"
    if type_ is Any:
        return "any"
    origin = typing.get_origin(type_)
    args = typing.get_args(type_)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{name}[{inner}]" if inner else name
    if isinstance(type_, type):
        return type_.__name__
    return str(type_).replace("typing.", "")


def _default(field: Any) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory() if not default.takes_self else "..."
    if attrs.has(type(default)):  # a block's default, as a config writes it
        values = ", ".join(f"{k}: {v}" for k, v in attrs.asdict(default).items() if v not in ({}, [], None))
        return f"default {{{values}}}"
    return f"default {default!r}"


def config_keys(cls: type) -> list[tuple[str, str, str, str]]:
    """``(key, type, default, doc)`` for every field of ``cls.Config``; [] without one."""
    config = getattr(cls, "Config", None)
    if config is None or not attrs.has(config):
        return []
    return _keys(config, nest=False)


def _keys(
    cls: type, prefix: str = "", skip: frozenset[str] = frozenset(), *, nest: bool = True
) -> list[tuple[str, str, str, str]]:
    """The rows of :func:`config_keys` for the attrs class ``cls``; with
    ``nest``, a field whose type is an attrs class is listed by its own keys
    (``attempts.k``), and one that maps ids to one by those keys under
    ``<id>``, after its own row."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: show it as written
        hints = {}
    rows = []
    for field in attrs.fields(cls):
        if field.name in skip:
            continue
        type_ = hints.get(field.name, field.type)
        doc = " ".join(str(field.metadata.get("doc", "")).split())
        args = typing.get_args(type_)
        if type_ is ComponentRef:  # a component is named, not described key by key
            rows.append((f"{prefix}{field.name}", "{id, config}", _default(field), doc))
        elif nest and isinstance(type_, type) and attrs.has(type_):
            rows += _keys(type_, f"{prefix}{field.name}.")
        elif nest and typing.get_origin(type_) is dict and len(args) == 2 and attrs.has(args[1]):
            rows.append((f"{prefix}{field.name}", f"dict[str, {args[1].__name__}]", _default(field), doc))
            rows += _keys(args[1], f"{prefix}{field.name}.<id>.")
        else:
            # A str field marked as a path (it may also hold a git+URL) reads as one.
            name = _type_name(type_).replace("str", "path", 1) if field.metadata.get("path") else _type_name(type_)
            rows.append((f"{prefix}{field.name}", name, _default(field), doc))
    return rows


def block_lines(name: str, indent: str = "  ") -> list[str]:
    """What ``compass describe NAME`` prints for the config block ``name`` (a key of :data:`BLOCKS`)."""
    cls, where, skip = BLOCKS[name]
    lines = [f"{name}: the keys of the `{where}` block of a config", f"{indent}{summary_line(cls)}", f"{indent}keys:"]
    lines += _key_lines(_keys(cls, "", skip), indent + "  ")
    return lines


def _key_lines(keys: list[tuple[str, str, str, str]], indent: str) -> list[str]:
    lines = []
    for key, type_name, default, doc in keys:
        lines.append(f"{indent}{key}: {type_name} ({default})")
        if doc:
            lines.append(f"{indent}    {doc}")
    return lines


def describe_lines(kind: str, component_id: str, cls: type, origin: str, indent: str = "") -> list[str]:
    """The lines describing one component: summary, metrics (benchmarks), config keys."""
    lines = []
    summary = summary_line(cls)
    if summary:
        lines.append(f"{indent}{summary}")
    metrics = getattr(cls, "metrics", None) if kind == "benchmark" else None
    if metrics:
        lines.append(f"{indent}metrics: {', '.join(metrics)} (primary: {metrics[0]})")
    keys = config_keys(cls)
    if getattr(cls, "Config", None) is None:
        lines.append(f"{indent}config: not declared (any keys are passed through)")
    elif not keys:
        lines.append(f"{indent}config: no keys")
    else:
        lines.append(f"{indent}config keys:")
        lines += _key_lines(keys, indent + "  ")
    return lines
