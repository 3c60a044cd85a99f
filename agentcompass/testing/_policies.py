"""Network policies written as plain config mappings, for the fakes' ``plan`` and ``set`` keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentcompass.runtime import NetworkPolicy

__all__ = ["POLICY_FIELDS", "to_policy", "with_policies"]

POLICY_FIELDS = ("baseline_network_policy", "run_network_policy", "evaluation_network_policy")
MODES = ("none", "allowlist", "full")


def to_policy(value: Any, where: str) -> NetworkPolicy:
    """``{"mode": ..., "allow": [...]}`` (or a mode string, or a NetworkPolicy) as a NetworkPolicy."""
    if not isinstance(value, (NetworkPolicy, str, Mapping)):
        raise TypeError(f"{where}: expected a mapping with 'mode' (and 'allow'), got {value!r}")
    return NetworkPolicy.parse(dict(value) if isinstance(value, Mapping) else value, where)


def with_policies(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``fields`` with every ``*_network_policy`` value converted by :func:`to_policy`."""
    return {
        key: to_policy(value, f"{where}.{key}") if key in POLICY_FIELDS else value
        for key, value in fields.items()
    }
