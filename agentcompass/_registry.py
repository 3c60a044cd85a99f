"""The component registry.

Components are registered with the :func:`register` class decorator, which
runs when their module is imported. Modules come from three places, in this
order: the built-ins, the ``agentcompass.plugins`` entry-point group (each
entry point's value is a module path to import), and ``plugins:`` in a
config (module names or ``.py`` file paths). ``compass list`` shows each
component with its kind and the module (or ``.py`` file) it came from.

An id is unique within its kind; ``none`` is reserved (``harness: none``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

import attrs

from .runtime._components import (
    BaseAnalyzer,
    BaseBenchmark,
    BaseEnvironment,
    BaseHarness,
    BaseRecipe,
    Component,
)
from .runtime._errors import ComponentError

__all__ = ["build", "load_builtins", "load_plugins", "register", "registered", "registering_modules", "resolve"]

C = TypeVar("C", bound=type[Component])

KINDS: dict[str, type[Component]] = {
    "benchmark": BaseBenchmark,
    "harness": BaseHarness,
    "environment": BaseEnvironment,
    "recipe": BaseRecipe,
    "analyzer": BaseAnalyzer,
}

ENTRY_POINT_GROUP = "agentcompass.plugins"
_FILE_PLUGIN_PREFIX = "agentcompass_plugin_"


@attrs.frozen
class Registration:
    kind: str
    id: str
    cls: type[Component]
    origin: str


_registry: dict[tuple[str, str], Registration] = {}
_loaded_sources: set[str] = set()


def _kind_of(cls: type) -> str:
    for kind, base in KINDS.items():
        if issubclass(cls, base):
            return kind
    raise TypeError(f"{cls.__qualname__} is not a component: subclass one of the agentcompass base classes")


def register(cls: C) -> C:
    """Class decorator: make a component available under its ``id``.

    Registering a different class under an id already taken by its kind is an
    error; registering the same class again (a module imported twice) is not.
    """
    kind = _kind_of(cls)
    component_id = getattr(cls, "id", None)
    if not isinstance(component_id, str) or not component_id:
        raise TypeError(f"{cls.__qualname__} needs a non-empty string class attribute 'id'")
    if component_id == "none":
        raise TypeError(f"{cls.__qualname__}: the id 'none' is reserved")
    key = (kind, component_id)
    existing = _registry.get(key)
    # The same class defined again (its module imported twice) replaces itself.
    if existing is not None and _qualified(existing.cls) != _qualified(cls):
        raise ComponentError(
            f"{kind} id {component_id!r} is already registered by {existing.origin}; "
            f"{cls.__module__}.{cls.__qualname__} cannot take it"
        )
    _registry[key] = Registration(kind, component_id, cls, _origin(cls))
    return cls


def registering_modules() -> list[tuple[str, str | None]]:
    """``(module, sys.path entry it was imported from)`` for every module
    (not a ``.py`` file plugin) that registered a component here: what a
    remote worker imports to see the same components."""
    found: dict[str, str | None] = {}
    for registration in _registry.values():
        name = registration.cls.__module__
        if name.startswith(_FILE_PLUGIN_PREFIX) or name in found:
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        root = None
        if path:
            root = str(Path(path).resolve().parents[name.count(".") + (1 if path.endswith("__init__.py") else 0)])
        found[name] = root
    return sorted(found.items())


def import_modules(modules: list[tuple[str, str | None]]) -> None:
    """Import what :func:`registering_modules` listed elsewhere; a module
    that cannot be imported here is left out (its components then show as
    unknown ids, naming the registered ones)."""
    for name, root in modules:
        if name in sys.modules:
            continue
        if root and root not in sys.path and Path(root).is_dir():
            sys.path.append(root)
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - see the docstring
            continue


def _qualified(cls: type) -> tuple[str, str]:
    return (cls.__module__, cls.__qualname__)


def _origin(cls: type) -> str:
    # A ``.py`` plugin's module name is made up; its file is what users know.
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if cls.__module__.startswith(_FILE_PLUGIN_PREFIX) and path:
        return str(path)
    return cls.__module__


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def load_builtins() -> None:
    """Import the built-in components and the entry-point plugins (once)."""
    if "builtins" in _loaded_sources:
        return
    for module in (
        "agentcompass.environments.local",
        "agentcompass.benchmarks.terminal",
        "agentcompass.harnesses.oracle",
        "agentcompass.harnesses.react",
        "agentcompass.harnesses.installed",
        "agentcompass.benchmarks.qa",
    ):
        importlib.import_module(module)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            importlib.import_module(ep.value.split(":")[0])
        except Exception as exc:  # noqa: BLE001 - reported as a config error naming the plugin
            raise ComponentError(
                f"plugin entry point {ep.name!r} ({ep.value}) failed to import: {_one_line(exc)}"
            ) from None
    # Marked only once everything imported, so a failure is reported again next time.
    _loaded_sources.add("builtins")


def load_plugins(plugins: list[str], base_dir: Path | None = None) -> None:
    """Import ``plugins:`` entries of a config: module names or ``.py`` paths
    (relative paths resolve against ``base_dir``, the config's directory)."""
    load_builtins()
    for entry in plugins:
        if entry.endswith(".py") or "/" in entry:
            path = Path(entry)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            if not path.is_file():
                raise ComponentError(f"plugin file not found: {entry}")
            # Keyed by the file, so one file named two ways is imported once.
            source = str(path.resolve())
            if source in _loaded_sources:
                continue
            name = f"{_FILE_PLUGIN_PREFIX}{abs(hash(source))}"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001
                del sys.modules[name]
                raise ComponentError(f"plugin {entry} failed to import: {_one_line(exc)}") from None
        else:
            source = entry
            try:
                importlib.import_module(entry)
            except Exception as exc:  # noqa: BLE001
                raise ComponentError(f"plugin module {entry!r} failed to import: {_one_line(exc)}") from None
        _loaded_sources.add(source)


def resolve(kind: str, component_id: str) -> type[Component]:
    """The class registered as ``component_id`` of ``kind``, or a clear error."""
    load_builtins()
    reg = _registry.get((kind, component_id))
    if reg is None:
        known = ", ".join(sorted(i for k, i in _registry if k == kind)) or "none"
        other = sorted(k for k, i in _registry if i == component_id)
        if other:
            raise ComponentError(f"{component_id!r} is a {other[0]} id, not a {kind} id (registered {kind} ids: {known})")
        raise ComponentError(f"unknown {kind} id {component_id!r} (registered: {known})")
    return reg.cls


def build(kind: str, component_id: str, config: dict[str, Any]) -> Any:
    """Build the component registered as ``component_id`` of ``kind``
    (``"environment"``, ``"benchmark"``, ...) from ``config``, as the runtime
    does. Public as ``agentcompass.build_component`` for plugins that host
    other components (a sandbox server builds its provider by id). An
    unknown id or a bad config raises :class:`ComponentError` naming it."""
    cls = resolve(kind, component_id)
    try:
        return cls(config)
    except ComponentError:
        raise
    except Exception as exc:  # noqa: BLE001 - a constructor failure is a config error
        raise ComponentError(f"{kind} {component_id!r} could not be built: {_one_line(exc)}") from None


#: The public name of :func:`build`.
build_component = build


def registered() -> list[Registration]:
    """Every registration, sorted by kind then id."""
    load_builtins()
    return sorted(_registry.values(), key=lambda r: (r.kind, r.id))
