"""The ``docker`` Environment for AgentCompass (see ``docs/docker.md``).

Importing this module registers the provider; the ``agentcompass.plugins``
entry point does that for every installed copy. :mod:`agentcompass_docker.base`
makes the local base image; :mod:`agentcompass_docker.testing` starts a
private ``dockerd`` for tests.
"""

from ._provider import DockerEnvironment as DockerEnvironment
from ._session import DockerSession as DockerSession

__all__ = ["DockerEnvironment", "DockerSession"]
