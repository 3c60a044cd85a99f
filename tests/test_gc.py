"""Cyclic GC thresholds while runs are in flight (agentcompass._gc)."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest
import trio
import trio.testing

import agentcompass
from agentcompass import ComponentRef, Orchestration, RunRequest, _gc, register
from agentcompass._gc import GEN0_THRESHOLD, relaxed_collection
from agentcompass.runtime import TaskRecord
from bench._noop import NoopBenchmark  # registers noop-*


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


@pytest.fixture
def allowed() -> Iterator[None]:
    """Opt in as the CLI does."""
    previous = _gc.allow(True)
    yield
    _gc.allow(previous)


@pytest.fixture
def not_allowed() -> Iterator[None]:
    previous = _gc.allow(False)
    yield
    _gc.allow(previous)


def test_import_changes_nothing() -> None:
    code = (
        "import gc; before = gc.get_threshold()\n"
        "import agentcompass, agentcompass._gc, agentcompass.testing\n"
        "print(before == gc.get_threshold())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


async def test_launch_leaves_the_thresholds_alone_unless_allowed(autojump_clock, tmp_path, not_allowed) -> None:
    seen = await _threshold_during_a_launch(tmp_path)
    assert seen == [700]
    with relaxed_collection():
        assert gc.get_threshold()[0] == 700


def test_raised_while_active_and_restored_after_the_last_one(allowed) -> None:
    with relaxed_collection():
        assert gc.get_threshold() == (GEN0_THRESHOLD, 10, 10)
        with relaxed_collection():
            assert gc.get_threshold()[0] == GEN0_THRESHOLD
        assert gc.get_threshold()[0] == GEN0_THRESHOLD  # the outer one still runs
    assert gc.get_threshold() == (700, 10, 10)


def test_never_lowered_and_never_enabled(allowed) -> None:
    higher = GEN0_THRESHOLD + 1
    gc.set_threshold(higher, 10, 10)
    with relaxed_collection():
        assert gc.get_threshold()[0] == higher
    gc.set_threshold(0, 10, 10)  # collection switched off by the application
    with relaxed_collection():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold()[0] == 0


def test_a_change_made_meanwhile_is_left_alone(allowed) -> None:
    with relaxed_collection():
        gc.set_threshold(2_000, 5, 5)
    assert gc.get_threshold() == (2_000, 5, 5)


async def test_launch_raises_it_for_the_run(autojump_clock, tmp_path, allowed) -> None:
    assert await _threshold_during_a_launch(tmp_path) == [GEN0_THRESHOLD]
    assert gc.get_threshold()[0] == 700


async def _threshold_during_a_launch(tmp_path) -> list[int]:
    request = RunRequest(
        name="gc",
        benchmark=ComponentRef("noop-bench", {"tasks": 2}),
        environment=ComponentRef("noop-env"),
        harness=ComponentRef("noop-harness", {"sleep": 5}),
        output_root=tmp_path,
    )
    seen = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agentcompass.launch, Orchestration([request], task_concurrency=2))
        await trio.sleep(1)  # the harness sleeps 5 mock seconds
        seen.append(gc.get_threshold()[0])
    return seen


deaths: list[int] = []  # the first threshold when each watched record was freed


@register
class RecordWatchingBenchmark(NoopBenchmark):
    """``noop-bench`` noting, for every record it aggregates, the threshold
    in force when the record is freed."""

    id: ClassVar[str] = "gc-watching-bench"

    def aggregate_metrics(self, records: Sequence[TaskRecord]) -> dict[str, Any] | None:
        for record in records:
            weakref.finalize(record, lambda: deaths.append(gc.get_threshold()[0]))
        return None


def test_launch_frees_the_records_before_restoring_the_thresholds(tmp_path, allowed) -> None:
    # The request's scheduler and reporters refer back to it (a cycle): its
    # records must not wait for a cyclic collection, which restoring the
    # thresholds would start at once, walking all of them. With collection
    # off, a record kept by a cycle is never freed, and one freed after the
    # restore sees the default threshold.
    request = RunRequest(
        name="gc-free",
        benchmark=ComponentRef("gc-watching-bench", {"tasks": 20}),
        environment=ComponentRef("noop-env"),
        harness=ComponentRef("noop-harness"),
        output_root=tmp_path,
    )
    deaths.clear()
    gc.collect()
    gc.disable()
    try:
        result = trio.run(agentcompass.launch, Orchestration([request], task_concurrency=4))
        assert gc.get_threshold()[0] == 700
    finally:
        gc.enable()
    assert result.status == "succeeded"
    assert result.requests[0].metrics["series"]  # the result keeps its metrics
    assert deaths == [GEN0_THRESHOLD] * 20
