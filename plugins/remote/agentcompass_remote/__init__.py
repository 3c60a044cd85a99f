"""Remote sandboxes for AgentCompass over WebSocket.

- ``compass sandbox serve`` (:func:`serve_sandboxes`, :class:`SandboxServer`)
  hosts sessions of a local provider (``local``, or ``sandbox`` where it is
  installed) for drivers on other machines.
- The ``remote`` Environment (:class:`RemoteEnvironment`) opens sessions on
  one server or a pool of them.

The protocol is described in ``docs/remote-protocol.md`` of the repository.
"""

from ._protocol import VERSION as PROTOCOL_VERSION
from ._provider import RemoteEnvironment
from ._server import SandboxServer, serve_sandboxes
from ._session import RemoteSession

__all__ = ["PROTOCOL_VERSION", "RemoteEnvironment", "RemoteSession", "SandboxServer", "serve_sandboxes"]
