"""The agent table API: how a plugin adds a third-party agent to the
``installed`` harness (``docs/agents.md``).

Subclass :class:`InstalledAgent` (its distribution and pinned version, the
model API it speaks, its files, command line and log reading) and decorate
it with :func:`register_agent`; ``installed`` then runs it by id, installed
once per host into the agent cache and reaching the model through the
attempt's gateway (:mod:`agentcompass.gateway`).
"""

from .harnesses._agent_cache import cache_root as cache_root
from .harnesses._agent_table import AgentOutcome as AgentOutcome
from .harnesses._agent_table import AgentRun as AgentRun
from .harnesses._agent_table import InstalledAgent as InstalledAgent
from .harnesses._agent_table import agent_table as agent_table
from .harnesses._agent_table import register_agent as register_agent
from .runtime._public import publish as _publish

_publish(__name__, globals())
