"""Helpers for the in-process reuse tests: :func:`launch_one` on a fake disk, run-dir readers.

Run stores write, and reuse reads its source, through a :class:`FakeDisk`
given to the orchestration: no worker thread, no flushes. Under
``autojump_clock`` a task blocked on a worker thread counts as idle, so the
clock would jump to the next timer while the thread works; on the fake disk
mock time is exact: a fake ``sleep:10`` takes exactly 10 s and nothing else
takes any. Durability is the store tests' subject, not ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from _common import read_json as read_json

import agentcompass
import agentcompass.testing  # noqa: F401  (registers the fakes)
from agentcompass import Orchestration, RunRequest
from agentcompass._orchestration._launch import orchestrate
from agentcompass._store._fake_disk import FakeDisk
from agentcompass.testing import call_log


async def launch_one(request: RunRequest, *, concurrency: int = 4) -> agentcompass.RequestResult:
    result = await orchestrate(Orchestration([request], task_concurrency=concurrency), disk=FakeDisk())
    [request_result] = result.requests
    return request_result


def reuse_of(request: RunRequest, reuse: bool | Path = True, **changes: Any) -> RunRequest:
    return attrs.evolve(request, reuse=reuse, **changes)


def details(run_dir: Path | str) -> dict[str, dict[str, Any]]:
    """task id -> its countable record (JSON), with the severity directory
    it was found under as ``"_dir"``."""
    found: dict[str, dict[str, Any]] = {}
    for severity_dir in (Path(run_dir) / "details").iterdir():
        for path in severity_dir.glob("*.json"):
            record = read_json(path)
            assert record["task_id"] not in found, f"two records for {record['task_id']}"
            record["_dir"] = severity_dir.name
            found[record["task_id"]] = record
    return found


def checkpoints(run_dir: Path | str) -> dict[str, set[int]]:
    """task id -> attempt indices with a checkpoint."""
    found: dict[str, set[int]] = {}
    for path in (Path(run_dir) / "tasks").glob("*/attempt-*/checkpoint.json"):
        data = read_json(path)
        found.setdefault(data["task_id"], set()).add(data["record"]["attempt"])
    return found


def run_info(run_dir: Path | str) -> dict[str, Any]:
    return read_json(Path(run_dir) / "run_info.json")


def notes(run_dir: Path | str) -> str:
    """The run's notes, from ``run_info.json`` and ``summary.md`` (both must
    carry them; the text of the first is returned)."""
    info_notes = "\n".join(run_info(run_dir).get("notes", []))
    summary = (Path(run_dir) / "summary.md").read_text()
    for line in run_info(run_dir).get("notes", []):
        assert line in summary, f"note missing from summary.md: {line!r}"
    return info_notes


def calls(log: str, phase: str, task_id: str | None = None) -> int:
    return call_log(log).count(phase, task_id)


def agent_calls(log: str) -> dict[str, int]:
    """Calls that mean work was done for a task: phase -> count."""
    return {
        phase: calls(log, phase)
        for phase in ("open", "prepare", "start_session", "run", "collect", "evaluate", "plan")
    }


def started_attempts(log: str, task_id: str, since: int = 0) -> list[int]:
    """Attempt indices of the harness sessions started for ``task_id`` at or
    after call number ``since`` of the log (one per full try)."""
    return [
        c.detail["attempt"]
        for c in call_log(log).calls[since:]
        if c.phase == "start_session" and c.task_id == task_id
    ]
