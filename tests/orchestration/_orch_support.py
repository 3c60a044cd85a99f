"""Helpers for orchestration tests: :func:`launch` on a fake store disk, and a mock-time timeline.

Run stores write through a :class:`FakeDisk` (real files, no flushes, no
worker thread), passed to the orchestration explicitly. Under ``MockClock(autojump_threshold=0)`` every task blocked
on a thread counts as idle, so the clock would jump to the next timer while
a real disk works; the fake disk keeps mock time exact.

The :class:`Timeline` holds, in one global order and with their Trio times,
every call the fake components logged (from every call log) and every
progress event (``task_started``, ``run_finished``, ...) a run store wrote
to one of the timeline's fake disks, so tests can assert on order and exact
timings across requests and across concurrent ``launch`` calls.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _common import only_run_dir as only_run_dir
from _common import read_json as read_json
from _common import read_jsonl as read_jsonl

import agentcompass
import agentcompass.testing  # noqa: F401  (registers the fakes)
from agentcompass import Orchestration, OrchestrationResult, RequestResult, RunRequest
from agentcompass._orchestration._launch import orchestrate
from agentcompass._store import Disk
from agentcompass._store._fake_disk import FakeDisk
from agentcompass.testing import Call, all_calls, fake_request


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
    """Every call the fake components made (``agentcompass.testing.all_calls``,
    each with its Trio time) and every progress event the run stores on this
    timeline's disks (:meth:`disk`) wrote, in one order.

    A disk's clock stamps each ``progress.jsonl`` line with a distinct Unix
    time the timeline remembers with the Trio time and the number of calls
    made so far, so a line read back from the disk takes its place among the
    calls even though the store writes lines in batches, later.
    """

    disks: list[FakeDisk] = attrs.Factory(list)
    # stamp -> (Trio time, calls made before it, stamps before it)
    _stamps: dict[float, tuple[float, int, int]] = attrs.Factory(dict)
    _epoch: float = attrs.Factory(time.time)
    _built: tuple[tuple[int, int], list[Mark]] | None = None

    def disk(self, *, latency: float = 0.0) -> FakeDisk:
        """A :class:`FakeDisk` whose progress events join this timeline."""
        disk = FakeDisk(latency=latency, clock=self._stamp)
        self.disks.append(disk)
        return disk

    def _stamp(self) -> float:
        stamp = self._epoch + len(self._stamps) * 1e-3
        self._stamps[stamp] = (trio.current_time(), len(all_calls()), len(self._stamps))
        return stamp

    @property
    def marks(self) -> list[Mark]:
        calls = all_calls()
        lines = [(path, line) for disk in self.disks for _, path, line in disk.appended]
        size = (len(calls), len(lines))
        if self._built is None or self._built[0] != size:  # the same Marks until something new happened
            self._built = (size, self._build(calls, lines))
        return self._built[1]

    def _build(self, calls: list[tuple[str, Call]], lines: list[tuple[str, bytes]]) -> list[Mark]:
        keyed = [
            ((c.order, 1, 0), Mark(c.at, log, c.phase, c.task_id, c.session, dict(c.detail)))
            for log, c in calls
            if c.at is not None
        ]
        for path, line in lines:
            run_dir = Path(path).parent
            if Path(path).name != "progress.jsonl":
                continue
            fields = json.loads(line)
            kind = fields.pop("event")
            t, calls_before, index = self._stamps[fields.pop("t")]
            mark = Mark(t, f"store:{run_dir.parent.name}", kind, fields.get("task"), None, fields)
            keyed.append(((calls_before, 0, index), mark))
        keyed.sort(key=lambda pair: pair[0])
        return [mark for _, mark in keyed]

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


_active: list[Timeline] = []


@contextlib.contextmanager
def instrumented() -> Iterator[Timeline]:
    """Record a :class:`Timeline` while the block runs: :func:`launch` and
    :func:`run_evaluation` write on its disks."""
    timeline = Timeline()
    _active.append(timeline)
    try:
        yield timeline
    finally:
        _active.remove(timeline)


def _disk() -> FakeDisk:
    return _active[-1].disk() if _active else FakeDisk()


async def launch(orchestration: Orchestration, *, disk: Disk | None = None, **kwargs: Any) -> OrchestrationResult:
    """``agentcompass.launch`` with every run store on ``disk`` (default: a fresh
    :class:`FakeDisk`, on the timeline if one is recording)."""
    return await orchestrate(orchestration, disk=_disk() if disk is None else disk, **kwargs)


async def run_evaluation(request: RunRequest, **kwargs: Any) -> RequestResult:
    """``agentcompass.run_evaluation`` with its run store on a fresh :class:`FakeDisk`
    (its keyword arguments reach the orchestration's ``disk=``)."""
    return await agentcompass.run_evaluation(request, disk=_disk(), **kwargs)


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
