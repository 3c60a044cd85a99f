"""The base every component class shares: its ``id``, its ``kind`` and its
config, checked when it is built (so both contract modules build on it)."""

from __future__ import annotations

from typing import Any, ClassVar

from ._convert import structure_config

__all__ = ["Component"]


class Component:
    """Common base: ``id``, ``kind`` and config checking."""

    id: ClassVar[str]
    kind: ClassVar[str] = "component"
    #: Optional attrs class describing the accepted config keys and defaults.
    Config: ClassVar[type | None] = None

    def __init__(self, config: dict[str, Any] | None = None):
        self.config: dict[str, Any] = dict(config or {})
        self.options: Any = self.config
        if self.Config is not None:
            self.options = structure_config(
                self.config, self.Config, where=f"{self.kind} {getattr(self, 'id', type(self).__name__)!r}"
            )
