"""``${VAR}`` expansion (config step 2): environment variables in every string, references kept in secret positions."""

from __future__ import annotations

import os
import re
from typing import Any

from ._config_keys import COMPONENT_FIELDS, COMPONENT_LISTS
from .runtime._convert import _ENV_REF, SECRET_CONFIG_KEYS
from .runtime._errors import ConfigError

__all__ = ["expand_config"]

_VAR = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_config(data: dict[str, Any]) -> dict[str, Any]:
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
        elif key in COMPONENT_FIELDS:
            out[key] = _expand_component(value, path)
        elif key in COMPONENT_LISTS and isinstance(value, list):
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
