"""Helpers every part of the suite shares (``tests/`` is on ``sys.path``
through ``pytest.ini``, for the plugins' tests too): reading what a run
wrote, the processes a ``local`` sandbox left, and the one bounded poll for
what only another process shows.

Wait on the condition itself wherever the code gives a way (an event, a line
read from a pipe, a pidfd: :func:`wait_dead`). :func:`wait_until` and
:func:`poll_until` are for the rest, a file or a kernel object another
process makes, and fail with ``what`` once ``seconds`` have passed.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

__all__ = [
    "only_run_dir",
    "poll_until",
    "processes_marked",
    "read_json",
    "read_jsonl",
    "serving",
    "wait_dead",
    "wait_until",
]

#: How often a bounded poll looks again.
POLL_SECONDS = 0.02


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def only_run_dir(output_root: Path, name: str) -> Path:
    """The single run directory of request ``name`` under ``output_root``."""
    dirs = [d for d in (output_root / name).iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def wait_until(predicate: Callable[[], object], what: str, seconds: float = 60, *, every: float = POLL_SECONDS) -> None:
    """Block until ``predicate()`` is true (a file a subprocess writes, say),
    looking ``every`` seconds; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(every)


async def poll_until(
    predicate: Callable[[], object | Awaitable[object]], what: str, seconds: float = 30, *, every: float = POLL_SECONDS
) -> None:
    """:func:`wait_until` inside Trio; ``predicate`` may be async (a process
    in a sandbox, a kernel object a dead process held)."""
    with trio.move_on_after(seconds):
        while not await _truth(predicate()):  # noqa: ASYNC110 - another process's state: nothing to wait on
            await trio.sleep(every)
        return
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


async def _truth(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


async def wait_dead(pid: int, seconds: float = 20) -> None:
    """Return once ``pid`` has exited (a zombie counts as dead), waiting on
    its pidfd; fail after ``seconds``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with trio.fail_after(seconds):
            await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def processes_marked(root: Path) -> list[int]:
    """Live processes a ``local`` sandbox at or under ``root`` started: they carry
    ``AGENTCOMPASS_SANDBOX=<their sandbox>`` in their environment (a zombie has none).
    Read here on its own, not through the provider's scan the tests check.

    A process already killed (SIGKILL pending, on a busy host it may not have
    run its exit yet) runs no more of its code and is not counted."""
    needle = f"AGENTCOMPASS_SANDBOX={root}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                items = f.read().split(b"\0")
        except OSError:
            continue
        if any(item == needle or item.startswith(needle + b"/") for item in items) and not _being_killed(int(entry)):
            found.append(int(entry))
    return found


def _being_killed(pid: int) -> bool:
    """Whether ``pid`` has a SIGKILL pending (it is on its way out)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return True  # gone meanwhile
    sigkill = 1 << (signal.SIGKILL - 1)
    return any(int(fields.get(name, "0").strip(), 16) & sigkill for name in ("SigPnd", "ShdPnd"))


@asynccontextmanager
async def serving(script: Any) -> AsyncIterator[Any]:
    """A running scripted :class:`~agentcompass.testing.model_server.ModelServer`
    for ``script`` on 127.0.0.1 (stopped on the way out)."""
    from agentcompass.testing.model_server import ModelServer

    server = ModelServer(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
