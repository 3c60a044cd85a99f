"""The deadline landing while a request finalizes (SPEC section 7): its
terminal status is still written, with ``run_finished``, and its JSON log is
detached from the process-wide logger."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

import attrs

import agentcompass
from agentcompass import Orchestration, register
from agentcompass._logging import _json_logs
from agentcompass.testing import call_log, fake_request
from agentcompass.testing._benchmark import FakeBenchmark


@register
class SlowAggregateBenchmark(FakeBenchmark):
    """``fake-bench`` whose ``aggregate_metrics`` blocks (a slow sync call)."""

    id: ClassVar[str] = "faults-slow-aggregate-bench"
    seconds: ClassVar[float] = 2.5

    def aggregate_metrics(self, records: Any) -> dict[str, Any] | None:
        call_log(self.options.log).record("benchmark", "aggregate_metrics", None)
        time.sleep(self.seconds)  # blocking on purpose: the deadline passes meanwhile
        return {"aggregated": len(records)}


async def test_a_deadline_during_finalize_still_writes_the_terminal_status(tmp_path: Path) -> None:
    request = fake_request("slow-finalize", log="slow-finalize", benchmark={"tasks": 2}, output_root=tmp_path)
    request = attrs.evolve(
        request, benchmark=attrs.evolve(request.benchmark, id=SlowAggregateBenchmark.id)
    )
    result = await agentcompass.launch(
        Orchestration([request], task_concurrency=2, timeout_seconds=1.5, cleanup_grace_seconds=5)
    )
    assert result.status == "timed_out" and result.exit_code == 1
    [run_dir] = (tmp_path / "slow-finalize").iterdir()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "timed_out"
    events = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert events[-1] == {**events[-1], "event": "run_finished", "status": "timed_out"}
    # Both tasks had finished: their results stand, aggregated once.
    assert json.loads((run_dir / "metrics.json").read_text()) == {"aggregated": 2}
    assert call_log("slow-finalize").count("aggregate_metrics") == 1
    assert run_dir / "log.jsonl" not in _json_logs
