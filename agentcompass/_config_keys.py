"""Where things sit in a config: its top-level keys, the request fields, the component positions."""

from __future__ import annotations

import attrs

from .runtime._values import RunRequest

__all__ = ["COMPONENT_FIELDS", "COMPONENT_LISTS", "REQUEST_FIELDS", "TOP_LEVEL_KEYS"]

TOP_LEVEL_KEYS = ("plugins", "orchestration", "requests")
REQUEST_FIELDS = frozenset(f.name for f in attrs.fields(RunRequest))
COMPONENT_FIELDS = ("benchmark", "harness", "environment")
COMPONENT_LISTS = ("recipes", "analyzers")
