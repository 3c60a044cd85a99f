"""The cattrs converters: config in, JSON out, results read back.

Values never know how they are serialized; this module does. Two
converters share every hook, one per direction of trust: config in
(:data:`converter`) is strict, unknown keys are errors
(``forbid_extra_keys``), and structuring errors are turned into one line
naming the key path, e.g. ``unknown key 'max_retriez' @
$.requests[0].execution``; results on disk are read with
:func:`make_results_converter`'s, which ignores a key it does not know (a
newer version wrote it; the results store keeps it, see
``agentcompass._store._formats``).

Structuring is strict where YAML would otherwise be silently misread: a
string is not a list of characters, ``"3"`` is not a number, a literal
setting must be one of its values, and a class wants a mapping.

Paths: a component ``Config`` field typed ``pathlib.Path`` is a path. A
relative one written in a config file resolves against that file's
directory (:func:`resolve_paths`, applied when the file is loaded); one given
on the command line stays relative to the current directory.

Secrets: a ``Secret`` field structures ``"${VAR}"`` as a reference to the
environment variable (serialized back as ``"${VAR}"``) and any other string
as a clear value (serialized as ``**********``). Inside a component's
``config`` (at any depth) the string values of the keys in
:data:`SECRET_CONFIG_KEYS` become ``Secret`` values the same way, so a
component receives ``Secret`` there when its config came through the
converter and must call ``reveal()`` where it needs the clear value.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    list_structure_factory,
    mapping_structure_factory,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ._errors import ComponentError, ConfigError
from ._results import Issue
from ._values import ComponentRef, NetworkPolicy, RunRequest, Secret

__all__ = [
    "SECRET_CONFIG_KEYS",
    "converter",
    "error_line",
    "make_results_converter",
    "resolve_paths",
    "structure",
    "structure_config",
    "unstructure",
]

T = TypeVar("T")

_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")

#: Keys of a component config (at any depth) whose string values are secrets.
SECRET_CONFIG_KEYS = frozenset({"token", "api_key", "password", "secret"})


def _structure_secret(value: Any, _: type) -> Secret:
    if isinstance(value, Secret):
        return value
    if not isinstance(value, str):
        raise TypeError("a secret must be a string")
    match = _ENV_REF.match(value)
    if match:
        return Secret.from_env(match.group(1))
    return Secret(value)


def _structure_path(value: Any, _: type) -> Path:
    if not isinstance(value, (str, Path)) or not str(value):
        raise TypeError(f"expected a path, got {_short(value)}")
    return Path(value)


def _structure_any(value: Any, _: type) -> Any:
    return value


def _check_scalar(value: Any, kinds: tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) and bool not in kinds:
        raise ValueError(f"expected {what}, got {value!r}")
    if not isinstance(value, kinds):
        raise TypeError(f"expected {what}, got {value!r}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _literal_factory(type_: Any) -> Any:
    allowed = typing.get_args(type_)

    def structure_literal(value: Any, _: Any) -> Any:
        # ``True == 1``: compare types too, so ``k: true`` never passes for a number.
        if not any(value == a and type(value) is type(a) for a in allowed):
            choices = ", ".join(repr(a) for a in allowed)
            raise ValueError(f"expected one of {choices}, got {_short(value)}")
        return value

    return structure_literal


def _strict(kinds: tuple[type, ...], what: str, factory: Any) -> Any:
    def make(type_: Any, conv: cattrs.Converter) -> Any:
        inner = factory(type_, conv)

        def structure_checked(value: Any, t: Any) -> Any:
            if not isinstance(value, kinds):
                raise TypeError(f"expected {what}, got {_short(value)}")
            return inner(value, t)

        return structure_checked

    return make


def _origin_is(*origins: Any) -> Any:
    return lambda t: typing.get_origin(t) in origins


def _secretize(value: Any) -> Any:
    """Turn the string values of :data:`SECRET_CONFIG_KEYS` (at any depth) into secrets."""
    if isinstance(value, Mapping):
        return {
            k: _structure_secret(v, Secret) if k in SECRET_CONFIG_KEYS and isinstance(v, str) else _secretize(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_secretize(v) for v in value]
    return value




def _structure_reuse(value: Any, _: type) -> bool | Path:
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, Path)):
        return Path(value)
    raise ValueError(f"expected true, false or a run directory, got {value!r}")


def _unstructure_reuse(value: bool | Path) -> bool | str:
    return value if isinstance(value, bool) else str(value)


def _make_converter(*, strict: bool) -> cattrs.Converter:
    """A converter with every hook of this module; ``strict`` forbids unknown keys."""
    conv = cattrs.Converter(forbid_extra_keys=strict)

    def structure_component_ref(value: Any, _: type) -> ComponentRef:
        # ``harness: none`` and ``environment: local`` are shorthands for ``{id: ...}``.
        if isinstance(value, str):
            return ComponentRef(value)
        if isinstance(value, ComponentRef):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a component id or a mapping, got {_short(value)}")
        ref = component_ref_fn(value, ComponentRef)
        return attrs.evolve(ref, config=_secretize(ref.config))

    conv.register_structure_hook(Secret, _structure_secret)
    conv.register_unstructure_hook(Secret, str)
    conv.register_structure_hook(Path, _structure_path)
    # A policy is written as a mode string or {mode, allow}, in config and in stored plans alike.
    conv.register_structure_hook(NetworkPolicy, lambda v, _: NetworkPolicy.parse(v, "network policy"))
    conv.register_unstructure_hook(Path, str)
    conv.register_structure_hook(Any, _structure_any)
    conv.register_structure_hook(float | bool | None, _structure_any)
    # Strict scalars: YAML's ``k: "3"`` or ``k: true`` for a number is an error, not a cast.
    conv.register_structure_hook(int, lambda v, _: _check_scalar(v, (int,), "an integer"))
    conv.register_structure_hook(
        float, lambda v, _: float(_check_scalar(v, (int, float), "a number"))
    )
    conv.register_structure_hook(bool, lambda v, _: _check_scalar(v, (bool,), "true or false"))
    conv.register_structure_hook(str, lambda v, _: _check_scalar(v, (str,), "a string"))
    conv.register_structure_hook_factory(_origin_is(Literal), _literal_factory)
    conv.register_structure_hook_factory(
        _origin_is(list), _strict((list, tuple), "a list", list_structure_factory)
    )
    conv.register_structure_hook_factory(
        lambda t: _origin_is(tuple)(t) and typing.get_args(t)[-1:] == (...,),
        _strict((list, tuple), "a list", homogenous_tuple_structure_factory),
    )
    conv.register_structure_hook_factory(
        _origin_is(dict), _strict((Mapping,), "a mapping", mapping_structure_factory)
    )
    conv.register_structure_hook_factory(
        attrs.has,
        _strict((Mapping,), "a mapping", lambda t, c: make_dict_structure_fn(t, c, _cattrs_forbid_extra_keys=strict)),
    )
    component_ref_fn = make_dict_structure_fn(ComponentRef, conv, _cattrs_forbid_extra_keys=strict)
    conv.register_structure_hook(ComponentRef, structure_component_ref)
    conv.register_structure_hook(bool | Path, _structure_reuse)
    conv.register_unstructure_hook(bool | Path, _unstructure_reuse)
    # An issue's retry hint appears in JSON only when a service gave one.
    conv.register_unstructure_hook(
        Issue, make_dict_unstructure_fn(Issue, conv, retry_after_seconds=override(omit_if_default=True))
    )
    return conv


#: Config in: strict (an unknown key is an error).
converter = _make_converter(strict=True)


def make_results_converter() -> cattrs.Converter:
    """A fresh converter for results read back from disk: the same hooks,
    unknown keys ignored (the results store keeps them, see
    ``agentcompass._store._formats``)."""
    return _make_converter(strict=False)

_ = RunRequest  # RunRequest.reuse is the field the bool | Path hooks serve


def resolve_paths(config: Any, cls: Any, base_dir: Path) -> Any:
    """A copy of component ``config`` whose relative paths are joined to ``base_dir``.

    The fields typed ``pathlib.Path`` (also ``Path | None``, ``list[Path]``
    and inside nested attrs classes) of the ``Config`` class ``cls`` say
    which values are paths. Values stay strings (the config is JSON data);
    anything that is not a relative path string is left for structuring to judge.
    """
    if not isinstance(config, Mapping) or not attrs.has(cls):
        return config
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: no paths to find
        return config
    out = dict(config)
    for field in attrs.fields(cls):
        if field.name in out:
            # A field marked ``metadata={"path": True}`` is a path too (typed ``str``
            # where it may also hold a ``git+URL``, which is never joined).
            type_ = Path if field.metadata.get("path") else hints.get(field.name)
            out[field.name] = _resolve_value(out[field.name], type_, base_dir)
    return out


def _resolve_value(value: Any, type_: Any, base_dir: Path) -> Any:
    if type_ is Path:
        # A URL (``https://...``, ``git+file://...``) is never joined to the config's directory.
        if isinstance(value, str) and value and not Path(value).is_absolute() and not _is_url(value):
            return os.path.abspath(base_dir / value)
        return value
    origin = typing.get_origin(type_)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(type_):
            if arg is Path or attrs.has(arg):
                return _resolve_value(value, arg, base_dir)
        return value
    if origin in (list, tuple) and isinstance(value, list) and typing.get_args(type_)[:1] == (Path,):
        return [_resolve_value(v, Path, base_dir) for v in value]
    if attrs.has(type_):
        return resolve_paths(value, type_, base_dir)
    return value


def _is_url(value: str) -> bool:
    return value.startswith("git+") or "://" in value


def error_line(exc: BaseException, root: str = "$") -> str:
    """One line for a structuring error: the first problem, with its key path."""
    if isinstance(exc, (cattrs.ClassValidationError, cattrs.IterableValidationError)):
        messages = cattrs.transform_error(exc, path=root, format_exception=_format_exception)
        return messages[0] if messages else str(exc)
    return str(exc)


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        keys = ", ".join(repr(k) for k in sorted(exc.extra_fields))
        return f"unknown key {keys}"
    if isinstance(exc, KeyError):
        return "required key missing"
    if isinstance(exc, (ValueError, TypeError)) and exc.args and isinstance(exc.args[0], str) and len(exc.args) > 1:
        return exc.args[0].splitlines()[0]  # attrs' validators: (message, attribute, ...), the message alone
    if isinstance(exc, (ValueError, TypeError)) and str(exc):
        return str(exc).splitlines()[0]
    return cattrs.v.format_exception(exc, type_)


def structure(data: Any, cls: type[T], *, root: str = "$") -> T:
    """Structure ``data`` as ``cls``; raise :class:`ConfigError` with one line on failure."""
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(error_line(exc, root)) from None


def structure_config(config: dict[str, Any], cls: type[T], *, where: str) -> T:
    """Structure a component's config; errors name the component."""
    try:
        return converter.structure(config, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise ComponentError(f"{where}: {error_line(exc, 'config')}") from None


def unstructure(value: Any) -> Any:
    """JSON-ready data for ``value``; secrets appear masked or as ``${VAR}``."""
    return converter.unstructure(value)
