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
from .harnesses._agent_table import node_platform as node_platform
from .harnesses._agent_table import register_agent as register_agent
from .runtime._public import publish as _publish

_publish(__name__, globals())


def _main(argv: list[str] | None = None) -> int:
    """``python -m agentcompass.agents install [ID ...]``: build the cache entries
    of the agents named (default: every built-in one) at their pinned versions."""
    import argparse

    import trio

    from .harnesses import installed  # noqa: F401  (registers the built-in agents)
    from .harnesses._agent_cache import ensure_installed

    parser = argparse.ArgumentParser(prog="python -m agentcompass.agents", description=_main.__doc__)
    parser.add_argument("command", choices=["install"])
    parser.add_argument("agents", nargs="*", metavar="ID")
    args = parser.parse_args(argv)
    table = agent_table()
    names = args.agents or sorted(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown agent(s) {', '.join(unknown)} (known: {', '.join(sorted(table))})")

    async def one(agent: InstalledAgent) -> None:
        key = f"{agent.id}-{agent.version}"
        entry = await ensure_installed(
            key, agent.requirements(agent.version), installer=agent.installer, binaries=agent.binaries()
        )
        how = f"built in {entry.install_seconds:.0f}s" if entry.built else "cached"
        print(f"{key}: {entry.path} ({how})", flush=True)

    async def install() -> None:
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(one, table[name]())

    trio.run(install)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main())
