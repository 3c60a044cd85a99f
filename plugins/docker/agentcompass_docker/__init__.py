"""The ``docker`` Environment for AgentCompass (see ``docs/docker.md``).

Importing this module registers the provider; the ``agentcompass.plugins``
entry point does that for every installed copy. :mod:`agentcompass_docker.base`
makes the local base image; :mod:`agentcompass_docker.testing` starts a
private ``dockerd`` for tests. :class:`Engine` (the Engine API client) and
:class:`ImageCache` (pull or build once per content) serve other providers
that make images through a daemon (``sandbox`` with images).
"""

from ._api import Engine as Engine
from ._api import EngineError as EngineError
from ._images import ImageCache as ImageCache
from ._provider import DockerEnvironment as DockerEnvironment
from ._session import DockerSession as DockerSession

__all__ = ["DockerEnvironment", "DockerSession", "Engine", "EngineError", "ImageCache"]
