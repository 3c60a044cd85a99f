"""The ``sandbox`` Environment for AgentCompass (see ``docs/sandbox.md``).

Importing this module registers the provider; the ``agentcompass.plugins``
entry point does that for every installed copy.
"""

from ._images import sweep_images as sweep_images
from ._provider import SandboxEnvironment as SandboxEnvironment
from ._provider import host_problem as host_problem
from ._session import SandboxSession as SandboxSession

__all__ = ["SandboxEnvironment", "SandboxSession", "host_problem", "sweep_images"]
