"""Run directories written by hand in the store's format (SPEC 8; trajectories
and verifier output in the agreed formats), and small helpers for the viewer's tests."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentcompass._view._browser import Browser

ROOT = Path(__file__).resolve().parents[2]
COMPASS = str(Path(sys.executable).with_name("compass"))
#: Looks like a credential: must never reach a page.
LEAKY_KEY = "sk-live0123456789abcdefSECRET"


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def issue(severity: str, phase: str, code: str, message: str) -> dict[str, Any]:
    return {"severity": severity, "phase": phase, "code": code, "message": message}


def attempt(
    index: int = 0,
    *,
    values: dict[str, Any] | None = None,
    status: str = "completed",
    issues: list[dict[str, Any]] | None = None,
    trajectory: list[dict[str, Any]] | None = None,
    usage: dict[str, int] | None = None,
    artifacts: dict[str, Any] | None = None,
    retries: int = 0,
) -> dict[str, Any]:
    return {
        "attempt": index,
        "status": status,
        "values": values if values is not None else {"reward": 1.0, "passed": True},
        "issues": issues or [],
        "run_result": {
            "output": "done",
            "trajectory": trajectory or [],
            "usage": usage or {},
            "artifacts": artifacts or {},
            "issues": [],
            "timings": {},
        },
        "plan": {"task_id": "t", "attempt": index, "environment": {"id": "local", "config": {}}},
        "analysis": {},
        "retries": retries,
        "timings": {"setup": 0.01, "run": 0.5, "collect": 0.001, "evaluate": 0.02},
    }


def write_run(
    root: Path,
    name: str,
    run_id: str,
    tasks: list[dict[str, Any]],
    *,
    status: str = "succeeded",
    benchmark: str = "terminal",
    metrics: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
) -> Path:
    """A run directory as the store writes it: ``tasks`` are TaskRecord dicts."""
    run_dir = root / name / run_id
    write_json(run_dir / "run_info.json", {
        "request": {"name": name, "benchmark": {"id": benchmark, "config": {}}, "harness": {"id": "react", "config": {}},
                    "environment": {"id": "local", "config": {}}, "model": {"name": "fake-model", "api_key": "**********"},
                    "execution": {"attempts": {"k": 1, "strategy": "avg"}}},
        "status": status, "started_at": 1_790_000_000.0, "ended_at": None if status == "running" else 1_790_000_060.0,
    })
    for task in tasks:
        write_json(run_dir / "details" / task["severity"] / f"{task['task_id']}.json", task)
    if metrics is not None:
        write_json(run_dir / "metrics.json", metrics)
    lines = events if events is not None else [
        {"event": "run_started", "t": 1.0}, *({"event": "task_finished", "t": 2.0, "task": t["task_id"]} for t in tasks),
        {"event": "run_finished", "t": 3.0},
    ]
    (run_dir / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines), encoding="utf-8")
    return run_dir


@contextlib.contextmanager
def writer_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's writer lock, as the store does while its run is alive."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def append_events(run_dir: Path, events: list[dict[str, Any]]) -> None:
    """What the runtime does as a run goes on: new lines in ``progress.jsonl``."""
    with open(run_dir / "progress.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def task(task_id: str, *attempts: dict[str, Any], category: str | None = None, severity: str = "normal") -> dict[str, Any]:
    return {"task_id": task_id, "category": category, "attempts": list(attempts), "severity": severity}


def metrics_for(values: dict[str, float | None], categories: dict[str, str] | None = None) -> dict[str, Any]:
    """metrics.json of tasks with these reward values (no FATAL)."""
    def series(vals: list[float | None]) -> dict[str, Any]:
        ok = [v for v in vals if v is not None]
        mean = sum(ok) / len(ok) if ok else None
        return {"value": mean, "reference_value": mean, "evaluated": len(ok), "unavailable": len(vals) - len(ok),
                "invalidated": 0, "error": 0, "total": len(vals)}
    by_cat: dict[str, list[float | None]] = {}
    for task_id, value in values.items():
        cat = (categories or {}).get(task_id)
        if cat:
            by_cat.setdefault(cat, []).append(value)
    return {"evaluation_failed": False, "series": {"reward": series(list(values.values()))},
            "categories": {c: {"series": {"reward": series(v)}} for c, v in by_cat.items()}}


def agent_trajectory(steps: int, *, long_output: bool = False) -> list[dict[str, Any]]:
    """A react-style trajectory (system, user, then assistant/tool pairs)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Count the lines of /app/data.txt."},
    ]
    for step in range(steps):
        call_id = f"call_{step}"
        messages.append({
            "role": "assistant", "content": f"Step {step}: I will run a command.",
            "tool_calls": [{"id": call_id, "name": "bash", "arguments": json.dumps({"command": f"wc -l /app/data-{step}.txt"})}],
            "step": step, "usage": {"prompt_tokens": 100 + step, "completion_tokens": 20}, "duration_seconds": 0.5,
        })
        content = f"{step + 1} /app/data-{step}.txt"
        if long_output and step == 0:
            content = "\n".join(f"line {n} of a long listing" for n in range(400)) + f"\nAuthorization: Bearer {LEAKY_KEY}"
        messages.append({
            "role": "tool", "tool_call_id": call_id, "name": "bash", "content": content, "step": step,
            "exit_code": 0, "timed_out": False, "truncated": long_output and step == 0, "duration_seconds": 0.01,
        })
    return messages


def run_dir_state(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``run_dir`` with its size and mtime: to prove nothing changed."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(run_dir):
        for name in dirnames + filenames:
            st = os.stat(os.path.join(dirpath, name))
            state[os.path.relpath(os.path.join(dirpath, name), run_dir)] = (st.st_size, st.st_mtime_ns)
    return state


async def wait_ready(b: Browser, view: str) -> None:
    await b.wait_for(f"document.querySelector('#main[data-view={view}][data-ready]')")
