"""The call log the fake components write to.

The runtime builds a new component instance per request (and a test may
build several), so nothing a test wants to inspect can live on an instance.
Every fake writes to a module-level :class:`CallLog` picked by the ``log``
key of its config instead. The same store keeps the per-task call counters
that drive scripts and the set of sandboxes a :class:`FakeEnvironment` has
opened and not yet closed or reaped.

State is per process: the fakes only work with the in-process executor.
Call :func:`reset_logs` between tests (an autouse fixture is the usual place).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import attrs
import trio

__all__ = ["Call", "CallLog", "all_calls", "call_log", "live_sandboxes", "reset_logs"]

ComponentKind = Literal["environment", "benchmark", "harness"]


@attrs.frozen
class Call:
    """One logged call of a fake component.

    ``seq`` is the call's index in its log (``log.calls[c.seq] is c``), so it
    orders calls across components and tasks; ``order`` is its index in
    :func:`all_calls`, so it orders calls across logs too. ``at`` is
    ``trio.current_time()`` when the call was recorded (None outside Trio):
    exact under ``MockClock``, so a test can assert on timings. ``phase`` is the script phase
    (``open``, ``exec``, ``prepare``, ``run``, ...) or a bookkeeping entry
    (``opened``, ``close_again``, ``plan``, ``build_config``). ``session`` is the
    Environment session involved, when there is one. ``detail`` holds the
    call's arguments worth asserting on and, for scripted calls, ``action``:
    the scripted action the call performed. A call refused because its
    session was closed has ``detail["refused"] = "closed"`` instead.
    """

    seq: int
    component: ComponentKind
    phase: str
    task_id: str | None
    session: int | None
    detail: dict[str, Any] = attrs.Factory(dict)
    at: float | None = None
    order: int = 0


@attrs.define(eq=False)
class CallLog:
    """Every call the fakes configured with ``log: <name>`` made, in order."""

    name: str
    calls: list[Call] = attrs.Factory(list)
    # (component, task_id, phase) -> calls so far; survives component instances
    # so that a retry in a new instance continues its script.
    _counters: Counter[tuple[str, str | None, str]] = attrs.Factory(Counter)
    _last_session: int = 0
    _live: set[int] = attrs.Factory(set)
    _session_tasks: dict[int, str | None] = attrs.Factory(dict)
    _session_names: dict[int, str] = attrs.Factory(dict)
    _swept: set[int] = attrs.Factory(set)

    # -- queries -----------------------------------------------------------

    def select(
        self,
        phase: str | None = None,
        *,
        task_id: str | None = None,
        component: str | None = None,
        session: int | None = None,
    ) -> list[Call]:
        """The calls matching every filter given (``None`` matches anything)."""
        return [
            c
            for c in self.calls
            if (phase is None or c.phase == phase)
            and (task_id is None or c.task_id == task_id)
            and (component is None or c.component == component)
            and (session is None or c.session == session)
        ]

    def phases(self, task_id: str | None = None, *, component: str | None = None) -> list[str]:
        """The phase of each call, in order; only ``task_id``'s when given."""
        return [c.phase for c in self.select(task_id=task_id, component=component)]

    def count(self, phase: str, task_id: str | None = None) -> int:
        return len(self.select(phase, task_id=task_id))

    def opened_sessions(self) -> list[int]:
        """Ids of the sessions opened successfully, in opening order."""
        return [c.session for c in self.calls if c.phase == "opened" and c.session is not None]

    def closed_sessions(self) -> dict[int, int]:
        """Session id -> number of ``close()`` calls that actually closed it.

        A fake session closes on its first ``close()`` only (later calls are
        logged as ``close_again``), so a correct runtime shows 1 for every
        opened session. A first close whose scripted action failed or hung
        still counts here; it leaves the sandbox live until reaped, see
        :meth:`live_sessions`.
        """
        return dict(Counter(c.session for c in self.calls if c.phase == "close" and c.session is not None))

    def close_calls(self) -> dict[int, int]:
        """Session id -> number of ``close()`` calls of any kind (first or repeated)."""
        return dict(
            Counter(
                c.session for c in self.calls if c.phase in ("close", "close_again") and c.session is not None
            )
        )

    def policies_set(self, session: int) -> list[str]:
        """Modes passed to ``set_network_policy`` on ``session``, in order,
        including calls that were refused or failed."""
        return [c.detail["mode"] for c in self.select("set_network_policy", session=session)]

    def live_sessions(self) -> set[int]:
        """Sessions opened and neither closed successfully, reaped nor swept: leaks."""
        return set(self._live)

    # -- used by the fakes -------------------------------------------------

    def record(
        self,
        component: ComponentKind,
        phase: str,
        task_id: str | None,
        session: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Call:
        try:
            at: float | None = trio.current_time()
        except RuntimeError:  # recorded outside Trio
            at = None
        call = Call(len(self.calls), component, phase, task_id, session, dict(detail or {}), at, len(_recorded))
        self.calls.append(call)
        _recorded.append((self.name, call))
        return call

    def next_index(self, component: str, task_id: str | None, phase: str) -> int:
        """0 for the first call of ``phase`` for ``task_id`` by ``component``, then 1, ..."""
        key = (component, task_id, phase)
        index = self._counters[key]
        self._counters[key] = index + 1
        return index

    def new_session(self, task_id: str | None, name: str | None = None) -> int:
        self._last_session += 1
        self._live.add(self._last_session)
        self._session_tasks[self._last_session] = task_id
        if name is not None:
            self._session_names[self._last_session] = name
        return self._last_session

    def session_name(self, session: int) -> str | None:
        """The name the runtime gave ``session`` when it opened it."""
        return self._session_names.get(session)

    def sweep(self, session: int) -> None:
        """The sandbox of ``session`` was destroyed by ``sweep``: released, and
        its session refuses every operation from now on."""
        self._swept.add(session)
        self.release(session)

    def swept(self, session: int) -> bool:
        return session in self._swept

    def sessions_named(self, tag: str) -> set[int]:
        """Live sessions whose name starts with ``tag``."""
        return {sid for sid in self._live if self._session_names.get(sid, "").startswith(tag)}

    def session_task(self, session: int) -> str | None:
        return self._session_tasks.get(session)

    def release(self, session: int) -> None:
        self._live.discard(session)


_logs: dict[str, CallLog] = {}
_recorded: list[tuple[str, Call]] = []


def call_log(name: str = "default") -> CallLog:
    """The log named ``name`` (the ``log`` config key of the fakes), created on first use."""
    log = _logs.get(name)
    if log is None:
        log = _logs[name] = CallLog(name)
    return log


def reset_logs() -> None:
    """Forget every log, counter, session id and live sandbox."""
    _logs.clear()
    _recorded.clear()


def all_calls() -> list[tuple[str, Call]]:
    """``(log name, call)`` of every call recorded since :func:`reset_logs`,
    across all logs, in the order they were made (``all_calls()[c.order]``)."""
    return list(_recorded)


def live_sandboxes() -> set[tuple[str, int]]:
    """``(log name, session id)`` of every fake sandbox still live, across all logs."""
    return {(name, session) for name, log in _logs.items() for session in log.live_sessions()}
