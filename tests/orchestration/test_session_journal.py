"""The session journal (SPEC section 8): a session is journalled "closed"
only when the provider's close returned normally. A close that raised or
overran the cleanup grace leaves it "opened", so ``compass reap`` (or the
next ``--reuse``) destroys the sandbox it may have left."""

from __future__ import annotations

from pathlib import Path

import pytest
from _orch_support import (  # noqa: F401  (fixtures)
    _instrumented,
    journaled_sessions,
    launch,
    only_run_dir,
    read_jsonl,
)

from agentcompass import Orchestration
from agentcompass._cli import _reap_run
from agentcompass.testing import call_log, fake_request


@pytest.mark.parametrize("close", ["raise", "fatal", "hang"])
async def test_a_close_that_failed_is_not_journalled_closed_and_reap_destroys_its_sandbox(
    autojump_clock, tmp_path: Path, close: str
):
    request = fake_request(
        "journal",
        log="journal",
        benchmark={"tasks": ["a00", "a01"]},
        environment={"script": {"a00": {"close": [close]}}},
        output_root=tmp_path,
    )
    await launch(Orchestration([request], task_concurrency=2, cleanup_grace_seconds=5))

    log = call_log("journal")
    [leaked] = log.live_sessions()
    assert log.session_task(leaked) == "a00"
    assert set(log.closed_sessions()) == set(log.opened_sessions())  # both closes were attempted
    run_dir = only_run_dir(tmp_path, "journal")

    def events_by_task() -> dict[str, list[str]]:
        task_of = {
            line["session"]: log.session_task(line["handle"]["session"])
            for line in read_jsonl(run_dir / "sessions.jsonl")
        }
        return {task_of[session]: events for session, events in journaled_sessions(run_dir).items()}

    assert events_by_task() == {"a00": ["opened"], "a01": ["opened", "closed"]}

    # ``compass reap RUN_DIR``: the session still "opened" is reaped, and then journalled closed.
    assert await _reap_run(run_dir) == (1, 0)
    assert log.live_sessions() == set()
    assert [c.session for c in log.select("reap")] == [leaked]
    assert events_by_task() == {"a00": ["opened", "closed"], "a01": ["opened", "closed"]}
