"""A deadline at any instant of any schedule: ``launch`` always returns its
terminal state, on time, and leaves no sandbox behind that reap cannot find.

Each example is its own ``trio.run`` on a mock clock: tasks with random run
and close durations (a close is a shielded cleanup, bounded by the grace),
random FATAL collects (retried while budget remains) and ERROR ones, ``k``
attempts under either strategy, opens
that take a while and cannot be interrupted (a provider call made in a
thread), and a deadline that may fall anywhere, including inside the last
close of an attempt (the task code then goes on without a checkpoint).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import attrs
import trio
from _orch_support import launch, read_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

import agentcompass
from agentcompass import AttemptsSpec, ComponentRef, ExecutionSpec, Orchestration
from agentcompass._store import load_run
from agentcompass.testing import FakeEnvironment, call_log, fake_request, reset_logs
from agentcompass.testing._environment import FakeEnvironmentConfig


@attrs.frozen
class SlowOpenConfig(FakeEnvironmentConfig):
    open_seconds: int = 0


@agentcompass.register
class SlowOpenEnvironment(FakeEnvironment):
    """``fake-env`` whose ``open`` first takes ``open_seconds`` (a config
    key) that no cancellation interrupts."""

    id: ClassVar[str] = "orch-test-slow-open-env"
    Config: ClassVar[type | None] = SlowOpenConfig
    options: SlowOpenConfig

    async def open(self, config: Any, policy: Any, name: str | None = None) -> Any:
        with trio.CancelScope(shield=True):
            await trio.sleep(self.options.open_seconds)
            return await super().open(config, policy, name)


task_strategy = st.fixed_dictionaries(
    {
        "run": st.integers(0, 6),
        "close": st.integers(0, 6),
        "collect": st.sampled_from(["ok", "ok", "fatal", "error"]),
    }
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tasks=st.lists(task_strategy, min_size=1, max_size=5),
    k=st.integers(1, 3),
    strategy=st.sampled_from(["avg", "pass"]),
    retries=st.integers(0, 1),
    concurrency=st.integers(1, 3),
    deadline=st.integers(1, 30),
    grace=st.integers(1, 8),
    stop=st.sampled_from(["deadline", "caller"]),
    open_seconds=st.sampled_from([0, 0, 1, 3, 9]),
)
def test_a_deadline_anywhere_ends_the_run_cleanly(
    tmp_path_factory, tasks, k, strategy, retries, concurrency, deadline, grace, stop, open_seconds
):
    # ``stop``: the orchestration's own deadline, or the caller's cancel
    # scope at the same instant (launch then raises Cancelled into it).
    reset_logs()
    ids = [f"a{i:02d}" for i in range(len(tasks))]
    output_root = tmp_path_factory.mktemp("deadline")
    request = fake_request(
        "a",
        log="a",
        benchmark={"tasks": ids, "script": {i: {"collect": [t["collect"]]} for i, t in zip(ids, tasks, strict=True)}},
        harness={"script": {i: {"run": [f"sleep:{t['run']}"]} for i, t in zip(ids, tasks, strict=True)}},
        environment={"script": {i: {"close": [f"sleep:{t['close']}"]} for i, t in zip(ids, tasks, strict=True)}},
        output_root=output_root,
        execution=ExecutionSpec(attempts=AttemptsSpec(k=k, strategy=strategy), max_retries=retries, retry_min_delay_seconds=1),
    )
    request = attrs.evolve(
        request,
        environment=ComponentRef(SlowOpenEnvironment.id, {**request.environment.config, "open_seconds": open_seconds}),
    )
    orchestration = Orchestration(
        [request],
        task_concurrency=concurrency,
        timeout_seconds=deadline if stop == "deadline" else None,
        cleanup_grace_seconds=grace,
    )

    async def main() -> tuple[str | None, float]:
        start = trio.current_time()
        status = None
        with trio.move_on_after(deadline if stop == "caller" else float("inf")):
            status = (await launch(orchestration)).requests[0].status
        return status, trio.current_time() - start

    status, took = trio.run(main, clock=MockClock(autojump_threshold=0))

    # An open no cancellation interrupts may end past the grace (its sandbox
    # then gets no time to close, and stays journalled for reap).
    assert took <= deadline + max(grace, open_seconds)
    (run_dir,) = [d for d in (output_root / "a").iterdir() if d.is_dir()]
    info = read_json(run_dir / "run_info.json")
    if stop == "deadline":
        assert status in ("succeeded", "failed", "timed_out") and info["status"] == status
    else:  # cancelled: launch raised into the caller's scope, or it finished first
        assert info["status"] in ("succeeded", "failed", "cancelled") and status in (None, info["status"])
    assert (run_dir / "metrics.json").exists() and (run_dir / "summary.md").exists()
    (series,) = read_json(run_dir / "metrics.json")["series"].values() or [None]
    if series is not None:
        assert series["evaluated"] + series["unavailable"] + series["invalidated"] == series["total"] == len(tasks)
    loaded = load_run(run_dir)
    if info["status"] in ("succeeded", "failed"):  # it finished before the stop: every task has its record
        assert set(loaded.details) == set(ids)
        assert all(len(r.attempts) == k or r.severity == "fatal" or strategy == "pass" for r in loaded.details.values())
    # A sandbox left open (its close was cut by the grace) is journalled
    # opened and never closed, so the next --reuse or compass reap finds it;
    # one whose uninterruptible open outlived the grace (and the store) is
    # named with the run's tag, so their sweep finds it.
    journal = [json.loads(line) for line in (run_dir / "sessions.jsonl").read_text().splitlines()]
    closed = {line["session"] for line in journal if line["event"] == "closed"}
    unclosed = {line["handle"]["session"] for line in journal if line["event"] == "opened" and line["session"] not in closed}
    log = call_log("a")
    for sid in log.live_sessions():
        assert sid in unclosed or (log.session_name(sid) or "").startswith(info["tag"] + "-"), sid
