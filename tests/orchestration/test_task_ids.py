"""Task IDs are validated on everything ``load_tasks`` returns, before
``select_tasks`` (SPEC 7 preparation: load, validate, select): a bad ID is
bad input, one line naming it and exit code 2, and no task runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
from _orch_support import launch, only_run_dir, read_json

from agentcompass import Orchestration, register
from agentcompass.runtime import TaskSpec
from agentcompass.testing import call_log, fake_request
from agentcompass.testing._benchmark import FakeBenchmark, FakeBenchmarkConfig


@attrs.frozen
class _Config(FakeBenchmarkConfig):
    ids: list[Any] = attrs.Factory(list)


@register
class RawIdsBench(FakeBenchmark):
    """``fake-bench`` whose ``load_tasks`` returns ``ids`` as they are (unchecked)."""

    id: ClassVar[str] = "raw-ids-bench"
    Config: ClassVar[type | None] = _Config

    async def load_tasks(self, request: Any) -> list[TaskSpec]:
        await super().load_tasks(request)
        return [TaskSpec(task_id) for task_id in self.options.ids]


@pytest.mark.parametrize(
    ("ids", "problem"),
    [
        (["a", "b", "a"], "task id 'a' (task 2 of load_tasks) is a duplicate"),
        (["a", ""], "task id '' (task 1 of load_tasks) is empty"),
        (["a", "b\nc"], "task id 'b\\nc' (task 1 of load_tasks) holds a control character"),
        (["x" * 600], "is longer than 512 characters"),
    ],
)
async def test_a_bad_task_id_fails_the_request_with_exit_2_even_when_another_is_selected(
    autojump_clock: Any, tmp_path: Path, ids: list[str], problem: str
) -> None:
    request = fake_request("ids", log="ids", output_root=tmp_path, task_ids=["b"] if "b" in ids else None)
    request = attrs.evolve(request, benchmark=attrs.evolve(request.benchmark, id="raw-ids-bench", config={
        **request.benchmark.config, "ids": ids}))  # fmt: skip
    result = await launch(Orchestration([request]))
    assert result.exit_code == 2 and result.requests[0].status == "failed"
    info = read_json(only_run_dir(tmp_path, "ids") / "run_info.json")
    assert problem in info["error"] and "\n" not in info["error"]
    assert [c for c in call_log("ids").calls if c.component == "harness"] == []  # nothing ran


async def test_good_ids_are_selected_after_the_check(autojump_clock: Any, tmp_path: Path) -> None:
    request = fake_request("ids", log="ok-ids", output_root=tmp_path, task_ids=["b"])
    request = attrs.evolve(request, benchmark=attrs.evolve(request.benchmark, id="raw-ids-bench", config={
        **request.benchmark.config, "ids": ["a", "b", "c"]}))  # fmt: skip
    result = await launch(Orchestration([request]))
    assert result.exit_code == 0
    assert {c.task_id for c in call_log("ok-ids").calls if c.component == "harness"} == {"b"}
