"""Helpers for orchestration tests: :func:`launch` on a fake store disk, and a mock-time timeline.

Run stores write through a :class:`FakeDisk` (real files, no flushes, no
worker thread), passed to the orchestration explicitly. Under ``MockClock(autojump_threshold=0)`` every task blocked
on a thread counts as idle, so the clock would jump to the next timer while
a real disk works; the fake disk keeps mock time exact.

The :class:`Timeline` records, in one global order and with
``trio.current_time()``, every call the fake components log (from every call
log) and every progress event a run store emits (``task_started``,
``run_finished``, ...), so tests can assert on order and exact timings
across requests and across concurrent ``launch`` calls.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import agentcompass
import agentcompass.testing  # noqa: F401  (registers the fakes)
from agentcompass import Orchestration, OrchestrationResult, RequestResult, RunRequest
from agentcompass._orchestration._launch import orchestrate
from agentcompass._store import Disk, FakeDisk, _run_store
from agentcompass.testing import CallLog, fake_request


@attrs.frozen
class Mark:
    """One thing that happened, at mock time ``t``.

    ``source`` is the call log's name for a fake component call, or
    ``"store:<request name>"`` for a progress event. ``kind`` is the call's
    phase (``open``, ``opened``, ``close``, ``load_tasks``, ...) or the
    event kind (``task_started``, ``run_finished``, ...).
    """

    t: float
    source: str
    kind: str
    task_id: str | None = None
    session: int | None = None
    detail: dict[str, Any] = attrs.Factory(dict)


@attrs.define
class Timeline:
    marks: list[Mark] = attrs.Factory(list)

    def select(self, kind: str | None = None, source: str | None = None) -> list[Mark]:
        return [m for m in self.marks if (kind is None or m.kind == kind) and (source is None or m.source == source)]

    def events(self, request: str, kind: str | None = None) -> list[Mark]:
        """Progress events of request ``request``."""
        return self.select(kind, f"store:{request}")

    def first(self, kind: str, source: str) -> Mark:
        found = self.select(kind, source)
        assert found, f"no {kind!r} from {source!r}"
        return found[0]

    def index(self, mark: Mark) -> int:
        return next(i for i, m in enumerate(self.marks) if m is mark)

    def open_counts(self, sources: set[str] | None = None, *, start: str = "open") -> list[tuple[float, int, int]]:
        """``(t, sessions held, sessions started so far)`` after each start or
        ``close`` of a fake-env session (from the logs in ``sources``, default all).

        A session is held from its ``start`` call (``open``: the provider's
        ``open`` was called, after the capacity permit was granted; or
        ``opened``: the open succeeded) until its ``close`` call starts. The
        permit is held a little longer (until the close returns), so the count
        never exceeds the permits held.
        """
        counts = []
        live = started = 0
        for m in self.marks:
            if m.source.startswith("store:") or (sources is not None and m.source not in sources):
                continue
            if m.kind == start:
                live += 1
                started += 1
            elif m.kind == "close":
                live -= 1
            else:
                continue
            counts.append((m.t, live, started))
        return counts


@contextlib.contextmanager
def instrumented() -> Iterator[Timeline]:
    """Record a :class:`Timeline` while the block runs."""
    timeline = Timeline()
    record = CallLog.record
    event = _run_store.RunStore.event

    def timed_record(self: CallLog, *args: Any, **kwargs: Any) -> Any:
        call = record(self, *args, **kwargs)
        timeline.marks.append(
            Mark(trio.current_time(), self.name, call.phase, call.task_id, call.session, dict(call.detail))
        )
        return call

    def timed_event(self: Any, kind: str, **fields: Any) -> None:
        event(self, kind, **fields)
        timeline.marks.append(
            Mark(trio.current_time(), f"store:{self.run_dir.parent.name}", kind, fields.get("task"), None, fields)
        )

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CallLog, "record", timed_record)
        mp.setattr(_run_store.RunStore, "event", timed_event)
        yield timeline


async def launch(orchestration: Orchestration, *, disk: Disk | None = None, **kwargs: Any) -> OrchestrationResult:
    """``agentcompass.launch`` with every run store on ``disk`` (default: a fresh :class:`FakeDisk`)."""
    return await orchestrate(orchestration, disk=FakeDisk() if disk is None else disk, **kwargs)


async def run_evaluation(request: RunRequest, **kwargs: Any) -> RequestResult:
    """``agentcompass.run_evaluation`` with its run store on a fresh :class:`FakeDisk`
    (its keyword arguments reach the orchestration's ``disk=``)."""
    return await agentcompass.run_evaluation(request, disk=FakeDisk(), **kwargs)


def sleepy_request(
    name: str,
    durations: list[float],
    output_root: Path,
    *,
    phase: str = "run",
    **fields: Any,
) -> RunRequest:
    """A fake request logging to the log ``name`` (task ids ``<name>00``, ...)
    whose task ``i`` sleeps ``durations[i]`` mock seconds in ``phase``: a
    harness phase (``run``, the default, or ``start_session``) or the
    environment's ``open`` (holding the capacity permit, before the session exists)."""
    ids = [f"{name}{i:02d}" for i in range(len(durations))]
    script = {task_id: {phase: [f"sleep:{d}"]} for task_id, d in zip(ids, durations, strict=True)}
    component = "environment" if phase == "open" else "harness"
    return fake_request(
        name,
        log=name,
        benchmark={"tasks": ids},
        output_root=output_root,
        **{component: {"script": script}},
        **fields,
    )


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def only_run_dir(output_root: Path, name: str) -> Path:
    """The single run directory of request ``name`` under ``output_root``."""
    dirs = [d for d in (output_root / name).iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def detail_files(run_dir: Path) -> dict[str, set[str]]:
    """Severity -> task keys with a countable record."""
    return {sev.name: {p.stem for p in sev.glob("*.json")} for sev in (run_dir / "details").iterdir()}


def unclosed_sessions(run_dir: Path) -> set[str]:
    """Session ids journaled opened and never closed in ``sessions.jsonl``."""
    lines = read_jsonl(run_dir / "sessions.jsonl")
    closed = {line["session"] for line in lines if line["event"] == "closed"}
    return {line["session"] for line in lines if line["event"] == "opened"} - closed


def journaled_sessions(run_dir: Path) -> dict[str, list[str]]:
    """Session id -> its journal events, in order."""
    journal: dict[str, list[str]] = {}
    for line in read_jsonl(run_dir / "sessions.jsonl"):
        journal.setdefault(line["session"], []).append(line["event"])
    return journal


# -- fixtures (import them into a test module to use them) --------------------


@pytest.fixture(autouse=True)
def _instrumented() -> Iterator[Timeline]:
    """A timeline for every test of a module that imports this (the suite's
    ``conftest.py`` gives each test fresh call logs)."""
    with instrumented() as recorded:
        yield recorded


@pytest.fixture
def timeline(_instrumented: Timeline) -> Timeline:
    return _instrumented
