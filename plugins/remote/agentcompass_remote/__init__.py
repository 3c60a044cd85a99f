"""Remote sandboxes for AgentCompass over WebSocket.

- ``compass sandbox serve`` (:func:`serve_sandboxes`, :class:`SandboxServer`)
  hosts sessions of a local provider (``local``, or ``sandbox`` where it is
  installed) for drivers on other machines.
- The ``remote`` Environment (:class:`RemoteEnvironment`) opens sessions on
  one server or a pool of them.

The protocol is described in ``docs/remote-protocol.md`` of the repository.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._protocol import VERSION as PROTOCOL_VERSION
    from ._provider import RemoteEnvironment
    from ._server import SandboxServer, serve_sandboxes
    from ._session import RemoteSession

__all__ = ["PROTOCOL_VERSION", "RemoteEnvironment", "RemoteSession", "SandboxServer", "serve_sandboxes"]

# Names resolve on first use: ``compass --help`` imports this package to list
# ``compass sandbox`` and must not pay for trio-websocket and the server.
_HOMES = {
    "PROTOCOL_VERSION": ("._protocol", "VERSION"),
    "RemoteEnvironment": ("._provider", "RemoteEnvironment"),
    "RemoteSession": ("._session", "RemoteSession"),
    "SandboxServer": ("._server", "SandboxServer"),
    "serve_sandboxes": ("._server", "serve_sandboxes"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _HOMES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value
    return value
