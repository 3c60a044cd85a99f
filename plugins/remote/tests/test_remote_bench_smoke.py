"""Smoke-sized runs of the ``remote`` bench scenarios: they run and report
what they measure (correctness only; timings belong to ``make bench``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _remote  # noqa: E402
from bench.__main__ import SMOKE  # noqa: E402
from bench._report import render_table, targets  # noqa: E402


def _kwargs(name: str) -> dict:
    return {k: v for k, v in SMOKE[name].items() if k != "fn"}


def test_remote_scenarios_run_and_report(tmp_path: Path) -> None:
    results = {}
    for name in ("remote_exec", "remote_sessions", "remote_stream"):
        scratch = tmp_path / name
        scratch.mkdir()
        results[name] = getattr(_remote, name)(scratch, **_kwargs(name))
    assert results["remote_exec"]["median_ms"] > 0
    sessions = results["remote_sessions"]
    assert sessions["failed"] == 0 and sum(sessions["spread"]) == sessions["sessions"] == 6
    assert min(sessions["spread"]) >= 1  # the pool spreads the sessions over its servers
    assert sessions["driver_cpu_us_per_session"] > 0
    assert results["remote_stream"]["received_bytes"] == 1024 * 1024
    table = render_table(targets(results))
    assert "| remote | ms exec('true') round trip, loopback (median) |" in table
    assert "| remote | 6 sessions across 3 servers: driver CPU us/session |" in table
    assert "| remote | MiB/s of 1 MiB out of one exec |" in table
    # Every server removed its sandboxes when it was stopped.
    assert not [p for p in tmp_path.glob("*/server-*/*")]
