"""What the ``remote`` provider knows about each server of its pool: its
advertised capacity and load, and when a failed one is tried again."""

from __future__ import annotations

import attrs
import trio

__all__ = ["PoolServer"]

#: The free capacity of a server without a limit (so ties break on load).
_UNLIMITED = 10**12


@attrs.define(eq=False)
class PoolServer:
    """What the provider knows about one server of its pool."""

    url: str
    capacity: int | None = None  # None: never heard from
    load: int = 0  # sessions open there, as last advertised plus our own since
    pending: int = 0  # our opens choosing it right now
    down_until: float = -1.0
    failures: int = 0

    def free(self) -> int:
        """Free capacity as far as we know: a server with no limit, or never
        heard from, counts as very large, less what is open and opening there."""
        capacity = self.capacity or _UNLIMITED
        return capacity - self.load - self.pending

    def mark_down(self, retry_seconds: float) -> None:
        self.failures += 1
        self.down_until = trio.current_time() + retry_seconds * min(2 ** (self.failures - 1), 8)

    def session_closed(self) -> None:
        """One of our sessions there closed."""
        self.load = max(0, self.load - 1)
