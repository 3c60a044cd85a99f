"""docs/agents.md lists every agent of the built-in table with its
distribution, pinned version and model API."""

from __future__ import annotations

from pathlib import Path

from agentcompass.agents import agent_table
from agentcompass.harnesses import installed  # noqa: F401  (registers the built-in agents)

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def test_every_built_in_agent_has_a_row_with_its_version_and_api():
    rows: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            rows.setdefault(line.split("|")[1].strip(" `"), line)  # the first table: the agents
    for agent_id, cls in agent_table().items():
        if not cls.__module__.startswith("agentcompass.harnesses."):
            continue  # registered by another test of this process, not built in
        assert agent_id in rows, f"docs/agents.md has no row for {agent_id}"
        row = rows[agent_id]
        assert f"`{cls.distribution}`" in row and f"| {cls.version} |" in row and f"`{cls.api}`" in row, row
