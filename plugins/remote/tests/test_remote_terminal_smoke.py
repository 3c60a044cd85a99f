"""``terminal-smoke`` with the oracle through ``remote`` (one server, then a
pool of three) scores exactly as it does on ``local``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from _remote_support import TOKEN, InProcess, start_in_process

import agentcompass
from agentcompass import ComponentRef, Orchestration, ProviderLimits, RunRequest
from agentcompass.testing import hang_guard

SMOKE = Path(__file__).resolve().parents[3] / "benchmarks_data" / "terminal-smoke"


async def _run(tmp_path: Path, name: str, environment: ComponentRef, **limits: ProviderLimits) -> dict[str, Any]:
    request = RunRequest(
        name=name,
        benchmark=ComponentRef("terminal", {"path": str(SMOKE)}),
        harness=ComponentRef("oracle"),
        environment=environment,
        output_root=tmp_path / "runs",
    )
    with hang_guard(240):
        result = await agentcompass.launch(Orchestration([request], task_concurrency=4, providers=limits))
    assert result.status == "succeeded", result
    run_dir = Path(result.requests[0].run_dir)
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path
    details = {}
    for path in (run_dir / "details").glob("*/*.json"):
        record = json.loads(path.read_text())
        details[record["task_id"]] = (
            path.parent.name,
            [(a["status"], a["values"], sorted(i["code"] for i in a["issues"])) for a in record["attempts"]],
        )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"details": details, "series": {k: v["value"] for k, v in metrics["series"].items()}}


async def test_one_server_and_a_pool_of_three_score_like_local(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("REMOTE_TOKEN", TOKEN)  # the pool's config names the token as ${REMOTE_TOKEN}
    local = await _run(tmp_path, "local", ComponentRef("local", {"root": str(tmp_path / "local")}))
    assert len(local["details"]) == 12 and local["series"]["reward"] == 10 / 12

    one = await start_in_process(nursery, tmp_path / "one")
    remote = await _run(tmp_path, "remote-one", ComponentRef("remote", {"url": one.url, "token": TOKEN}))
    assert remote == local
    assert one.server.opened_total == 12 and await one.settled_count() == 0

    pool: list[InProcess] = [await start_in_process(nursery, tmp_path / f"pool-{i}") for i in range(3)]
    urls = [server.url for server in pool]
    pooled = await _run(tmp_path, "remote-pool", ComponentRef("remote", {"url": urls, "token": "${REMOTE_TOKEN}"}))
    assert pooled == local
    assert sum(s.server.opened_total for s in pool) == 12
    assert all(s.server.opened_total > 0 for s in pool)  # the opens were spread over the pool
    for server in pool:
        assert await server.settled_count() == 0


async def test_the_drivers_capacity_limit_applies_to_remote(nursery: trio.Nursery, tmp_path: Path):
    served = await start_in_process(nursery, tmp_path / "limited")
    environment = ComponentRef("remote", {"url": served.url, "token": TOKEN})
    result = await _run(tmp_path, "limited", environment, remote=ProviderLimits(capacity=2))
    assert len(result["details"]) == 12
    # Four tasks at once, but never more than two sessions open or opening on the server.
    assert served.server.opened_total == 12 and served.server.peak_load <= 2
