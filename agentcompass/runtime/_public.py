"""Public names report the public module that exports them as their
``__module__`` (``agentcompass.RunRequest``, not ``agentcompass.runtime._values``),
as trio's and httpx's do: tracebacks, reprs of classes and the docs show
the name a user imports, and pickling finds them there.

The classes' string annotations (``from __future__ import annotations``) are
resolved first, in the module that wrote them: ``typing.get_type_hints``,
attrs and cattrs look names up in ``__module__``'s namespace, which after the
change is the public module, where a private alias such as ``Severity`` is
not defined. Nested classes (a component's ``Config``) keep their module.
"""

from __future__ import annotations

import contextlib
import sys
import types
import typing
from typing import Any

import attrs

__all__ = ["publish"]

_PACKAGE = "agentcompass"


def publish(module: str, namespace: dict[str, Any], names: typing.Iterable[str] | None = None) -> None:
    """Set ``__module__`` to ``module`` on the classes and functions of
    ``namespace`` (a public module's globals) named ``names`` (default: every
    name not starting with ``_``) that this package defines."""
    for name in list(namespace) if names is None else names:
        value = namespace[name]
        if name.startswith("_") or not isinstance(value, (type, types.FunctionType)):
            continue
        if value.__module__ == module or not value.__module__.startswith(_PACKAGE):
            continue
        if isinstance(value, type):
            _resolve_annotations(value)
        elif value.__qualname__ != name:  # a function exported under another name
            value.__name__ = value.__qualname__ = name
        value.__module__ = module


def _resolve_annotations(cls: type) -> None:
    """Replace ``cls``'s own string annotations by the objects they name
    (one that names what only a type checker imports stays a string)."""
    own = cls.__dict__.get("__annotations__", {})
    if not any(isinstance(a, str) for a in own.values()):
        return
    scope = vars(sys.modules[cls.__module__])
    resolved = {}
    for name, annotation in own.items():
        try:
            resolved[name] = eval(annotation, scope, dict(vars(cls))) if isinstance(annotation, str) else annotation
        except Exception:  # noqa: BLE001 - unresolvable where it was written, too
            resolved[name] = annotation
    cls.__annotations__ = resolved
    if attrs.has(cls):
        with contextlib.suppress(Exception):
            attrs.resolve_types(cls)
