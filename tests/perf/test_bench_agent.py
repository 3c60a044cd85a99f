"""A smoke-sized run of the agent-bound bench scenario and its report rows
(what it reports and that the run was correct, never how fast it was)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._agent import agent_bound  # noqa: E402
from bench._report import render_table, targets  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash tool calls")


def test_agent_bound_runs_every_model_call(tmp_path: Path) -> None:
    result = agent_bound(tmp_path, tasks=4, concurrency=2, latency=0.01, steps=2)
    assert result["status"] == "succeeded"
    # Every episode made its two bash calls and its submission: 3 calls a task.
    assert result["model_calls"] == result["expected_calls"] == 12
    assert result["ideal_s"] == pytest.approx(2 * 3 * 0.01)
    assert result["wall_over_ideal"] > 1 and result["cpu_ms_per_call"] > 0
    assert result["noop_env_status"] == "succeeded" and result["noop_env_cpu_ms_per_call"] > 0


def test_agent_rows() -> None:
    rows = targets(
        {
            "agent": {
                "wall_over_ideal": 1.3,
                "cpu_ms_per_call": 1.4,
                "cpu_over_bare": 1.6,
                "bare_cpu_ms_per_call": 0.875,
                "children_cpu_ms_per_call": 0.9,
                "noop_env_cpu_ms_per_call": 0.8,
            },
            "inspect": {"agent": {"ratio_wall": 25.0, "wall_over_ideal": 32.5, "cpu_ms_per_call": 30.0}},
        }
    )
    met = {(r["scenario"], r["metric"]): r["ok"] for r in rows}
    # The targets are relative to what ran beside it; the absolute figures are context.
    assert met[("agent-bound", "runtime CPU per model call / bare loop's")] is False
    assert met[("agent-bound", "x Inspect AI wall")] is True
    assert met[("agent-bound", "wall / ideal")] is None
    assert met[("agent-bound", "runtime CPU ms per model call")] is None
    table = render_table(rows)
    assert "| agent-bound | x Inspect AI wall | 25.0 | >= 4 | yes |" in table
    assert "| agent-bound | runtime CPU per model call / bare loop's | 1.60 | <= 1.5 | **no** |" in table
    assert "| agent-bound | same, no-op environment: runtime CPU ms per model call | 0.80 | (context) |  |" in table
