"""The executor seam (``agentcompass/_seam.py``): what crosses between the
orchestration and an executor, checked without Ray (SPEC section 11)."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _support import MemoryReporter, make_context, make_request

import agentcompass
from agentcompass._seam import (
    WORKER_LOST,
    Checkpoint,
    DiscardedTry,
    ForwardingReporter,
    LostTry,
    ProgressEvent,
    Report,
    SessionClosed,
    SessionOpened,
    after_loss,
    run_job,
)
from agentcompass.runtime import AttemptRecord, Issue, TaskJob, TaskRecord, TaskSpec

PACKAGE = Path(agentcompass.__file__).resolve().parent


def _record(index: int, code: str | None = None, retries: int = 0) -> AttemptRecord:
    issues = [Issue("error", "run", code, "failed")] if code else []
    return AttemptRecord(attempt=index, status="completed", values={"score": 1.0}, issues=issues, retries=retries)


# -- the reporter's calls, as messages -----------------------------------------------------


async def test_each_reporter_call_crosses_pickled_as_its_message_and_lands_as_the_same_call() -> None:
    sent: list[Report] = []
    asked: list[Report] = []

    async def ask(message: Report) -> None:
        await trio.lowlevel.checkpoint()
        asked.append(message)

    forwarding = ForwardingReporter("tag-1", sent.append, ask)
    direct = MemoryReporter()
    record = _record(0)
    for reporter in (forwarding, direct):
        reporter.event("attempt_started", task="t", attempt=0)
        await reporter.session_opened("s1", "local", {"path": "/x"}, "tag-1-s1")
        await reporter.checkpoint("t", record)
        await reporter.discarded_try("t", 1, 1, {"retry_number": 1})
        await reporter.session_closed("s1", "local", {"path": "/x"})

    # Fire and forget: events, checkpoints, closes; answered: opens and discarded tries.
    assert [type(m) for m in sent] == [ProgressEvent, Checkpoint, SessionClosed]
    assert [type(m) for m in asked] == [SessionOpened, DiscardedTry]
    assert all(not m.durable for m in sent + asked[:1]) and asked[1].durable

    # On the driver: the pickled message, applied, is the same call.
    landed = MemoryReporter()
    for message in sorted(sent + asked, key=lambda m: ORDER.index(type(m))):
        await pickle.loads(pickle.dumps(message)).apply(landed)
    assert landed == direct
    assert forwarding.tag == "tag-1"


ORDER = [ProgressEvent, SessionOpened, Checkpoint, DiscardedTry, SessionClosed]


# -- a try lost with its worker -----------------------------------------------------------


def _job(**execution: Any) -> TaskJob:
    request = make_request(k=3, **execution)
    return TaskJob(request, TaskSpec("t0", {}), [0, 1, 2])


async def test_a_lost_try_with_budget_left_is_saved_discarded_and_its_attempt_resumed_after_the_backoff(
    autojump_clock: trio.abc.Clock,
) -> None:
    job = _job(max_retries=1, retry_min_delay_seconds=4, retry_max_delay_seconds=60)
    reporter = MemoryReporter()
    before = trio.current_time()
    after = await after_loss(job, reporter, {0: _record(0)}, LostTry(1, 1, "run", "Ray worker 1 (pid 42)"))
    waited = trio.current_time() - before

    assert isinstance(after, TaskJob)
    assert after.attempts == [1, 2] and list(after.done) == [0]
    lost = after.resume[1]
    assert [(i.severity, i.phase, i.code) for i in lost.issues] == [("fatal", "run", WORKER_LOST)]
    assert lost.retries == 0
    assert "Ray worker 1 (pid 42) was lost while it ran attempt 1 of task 't0'" == lost.issues[0].message
    [discarded] = reporter.discarded
    assert (discarded["attempt"], discarded["try"], discarded["retry_number"]) == (1, 1, 1)
    assert (discarded["stage"], discarded["scope"]) == ("run", "attempt")
    # The backoff of a first retry: uniform in [min/2, min], waited in full.
    assert 2 <= discarded["retry_delay_seconds"] <= 4 and waited == pytest.approx(discarded["retry_delay_seconds"])
    assert [k for k, _ in reporter.events] == ["attempt_retry", "retry_wait"]


async def test_a_lost_try_with_no_budget_left_ends_the_task_fatal_worker_lost(autojump_clock: trio.abc.Clock) -> None:
    job = _job(max_retries=0)
    reporter = MemoryReporter()
    after = await after_loss(job, reporter, {0: _record(0)}, LostTry(1, 1, "evaluate", "Ray worker 0 (pid 7)"))
    assert isinstance(after, TaskRecord)
    assert [a.attempt for a in after.attempts] == [0, 1] and after.severity == "fatal"
    assert after.attempts[1].issues[0].phase == "evaluate"
    assert reporter.discarded == [] and reporter.events == []


async def test_a_worker_lost_before_it_started_an_attempt_only_keeps_the_checkpoints() -> None:
    job = _job(max_retries=1)
    reporter = MemoryReporter()
    after = await after_loss(job, reporter, {0: _record(0)}, LostTry(None, 1, "setup", "Ray worker 0 (pid 7)"))
    assert isinstance(after, TaskJob)
    assert after.attempts == [1, 2] and after.resume == {} and reporter.discarded == []


async def test_a_lost_try_of_a_resumed_attempt_counts_the_retry_the_resume_used(autojump_clock: trio.abc.Clock) -> None:
    job = _job(max_retries=2, retry_min_delay_seconds=0.1)
    failed_before = _record(1, "fake_run_error", retries=1)
    job = TaskJob(job.request, job.task, [1], resume={1: failed_before})
    reporter = MemoryReporter()
    after = await after_loss(job, reporter, {}, LostTry(1, 1, "setup", "Ray worker 0 (pid 7)"))
    assert isinstance(after, TaskJob)
    assert after.resume[1].retries == 1 and reporter.discarded[0]["retry_number"] == 2


async def test_a_resumed_lost_attempt_runs_again_from_its_own_budget_where_the_task_runs(
    autojump_clock: trio.abc.Clock,
) -> None:
    request = make_request(max_retries=2, retry_min_delay_seconds=0.1)
    ctx, reporter, _ = make_context(request)
    [task] = await ctx.benchmark.load_tasks(request)
    job = TaskJob(request, task, [0])
    after = await after_loss(job, reporter, {}, LostTry(0, 1, "run", "Ray worker 0 (pid 7)"))
    assert isinstance(after, TaskJob)

    record = await run_job(ctx, after)
    [attempt] = record.attempts
    assert attempt.status == "completed" and attempt.retries == 1
    # The try after the lost one is the attempt's second.
    assert [f["attempt_try"] for f in reporter.kinds("attempt_started")] == [2]


# -- executors by id, and the import layers ---------------------------------------------


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports, at any depth of its code."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_ray_takes_only_the_seam_from_the_orchestration() -> None:
    reached = {
        f"{path.name}: {name}"
        for path in sorted((PACKAGE / "_ray").glob("*.py"))
        for name in _imports(path)
        if name.startswith("agentcompass._orchestration")
    }
    assert reached == set()


def test_neither_launch_nor_preflight_nor_the_executor_table_imports_an_executor() -> None:
    below = [PACKAGE / "_executors.py", PACKAGE / "_preflight.py", *sorted((PACKAGE / "_orchestration").glob("*.py"))]
    reached = {f"{p.name}: {n}" for p in below for n in _imports(p) if n.startswith("agentcompass._ray")}
    assert reached == set()


CHECK_IN = """
import sys
from agentcompass import ComponentRef, Orchestration
from agentcompass._executors import check_executor
check_executor(Orchestration([], executor=ComponentRef(sys.argv[1])))
print(sorted(m for m in ("agentcompass._ray", "ray") if m in sys.modules))
"""


@pytest.mark.parametrize(("executor", "imported"), [("inprocess", "[]"), ("ray", "['agentcompass._ray']")])
def test_an_executor_module_is_imported_when_a_config_names_it_and_ray_itself_only_to_run(
    executor: str, imported: str
) -> None:
    if executor == "ray":
        pytest.importorskip("ray")
    done = subprocess.run([sys.executable, "-c", CHECK_IN, executor], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == imported
