"""A :class:`~agentcompass._store._disk.Disk` for tests: real files, Trio-time latency, injected errors.

It lives beside the seam it implements: the disk is private to the store, and
no public API takes one, so the public test kit (:mod:`agentcompass.testing`)
has no use for it; the runtime's own tests import it from here.

``FakeDisk`` does the real disk's file operations in the Trio thread (so the
files are there for :func:`load_run` and for assertions), skips the flushes,
and makes every :meth:`~FakeDisk.run` take ``latency`` seconds of *Trio*
time. Nothing hops to a thread, so it works under
``MockClock(autojump_threshold=0)``: the clock cannot jump past a write.

Usage::

    disk = FakeDisk(latency=0.002)
    disk.fail("sync", errno.EIO)                      # the next flush fails
    disk.fail("write", errno.ENOSPC, "*/details/*", times=None)  # every record
    async with open_run_store(tmp_path, "req", disk=disk) as store: ...

    await orchestrate(orchestration, disk=disk)   # every store of a launch

    disk.stall()              # runs wait here (a stalled disk) ...
    disk.resume()             # ... until resumed

With ``latency=0`` (the default) a run is one schedule point no cancellation
interrupts, like a disk that takes no time; a latency or a stall is
cancellable, so the store's close deadline gives it up as it gives up a
real disk's thread. :attr:`~FakeDisk.ops` lists every operation done,
:attr:`~FakeDisk.appended` every line appended with the Trio time it reached
the file, and :attr:`~FakeDisk.runs` counts the worker calls (one per batch).
``clock`` replaces the wall clock the store stamps its lines with
(:meth:`Disk.now <agentcompass._store._disk.Disk.now>`), e.g. to map each stamped line back to
the instant it was stamped.
"""

from __future__ import annotations

import contextlib
import errno as errno_module
import fnmatch
import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
import trio

from ._disk import Disk

__all__ = ["FakeDisk", "Fault"]

T = TypeVar("T")

#: The operations a fault can target.
OPERATIONS = frozenset({"mkdir", "write", "append", "replace", "link", "unlink", "listdir", "sync", "lock"})


@attrs.define
class Fault:
    """Raise ``OSError(code)`` on ``operation`` for paths matching ``pattern``
    (``fnmatch``), ``times`` times (None: every time)."""

    operation: str
    code: int
    pattern: str = "*"
    times: int | None = 1


class FakeDisk(Disk):
    """See the module docstring. ``ops`` lists every ``(operation, path)`` done;
    ``appended`` every ``(Trio time, path, line)`` appended, in order."""

    def __init__(self, *, latency: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.latency = latency
        self.clock = clock
        self.faults: list[Fault] = []
        self.ops: list[tuple[str, str]] = []
        self.appended: list[tuple[float, str, bytes]] = []
        self.runs = 0
        self._go: trio.Event | None = None

    def fail(self, operation: str, code: int = errno_module.EIO, pattern: str = "*", *, times: int | None = 1) -> Fault:
        """Inject a failure; returns it (remove it from :attr:`faults` to heal)."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown disk operation {operation!r} (one of {sorted(OPERATIONS)})")
        fault = Fault(operation, code, pattern, times)
        self.faults.append(fault)
        return fault

    def stall(self) -> None:
        """Make every :meth:`run` wait (in Trio time) until :meth:`resume`."""
        if self._go is None:
            self._go = trio.Event()

    def resume(self) -> None:
        if self._go is not None:
            self._go.set()
            self._go = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        self.runs += 1
        while self._go is not None:
            await self._go.wait()
        if self.latency:
            await trio.sleep(self.latency)
        else:  # a disk that takes no time: a schedule point, never cancelled
            await trio.lowlevel.cancel_shielded_checkpoint()
        return fn(*args)

    def now(self) -> float:
        return self.clock()

    def _do(self, operation: str, path: str) -> None:
        self.ops.append((operation, path))
        for fault in self.faults:
            if fault.operation == operation and fnmatch.fnmatch(path, fault.pattern):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                raise OSError(fault.code, f"{os.strerror(fault.code)} (injected)", path)

    def mkdir(self, path: str) -> bool:
        self._do("mkdir", path)
        return super().mkdir(path)

    def makedirs(self, path: str) -> None:
        self._do("mkdir", path)
        super().makedirs(path)

    def write(self, path: str, data: bytes) -> None:
        self._do("write", path)
        super().write(path, data)

    def append(self, path: str, data: bytes) -> None:
        self._do("append", path)
        super().append(path, data)
        try:
            now = trio.current_time()
        except RuntimeError:  # a primitive called outside Trio
            now = math.nan
        self.appended.extend((now, path, line) for line in data.splitlines(keepends=True))

    def replace(self, source: str, target: str) -> None:
        self._do("replace", target)
        super().replace(source, target)

    def link(self, source: str, target: str) -> None:
        self._do("link", target)
        super().link(source, target)

    def unlink(self, path: str) -> bool:
        self._do("unlink", path)
        return super().unlink(path)

    def listdir(self, path: str) -> list[str]:
        self._do("listdir", path)
        return super().listdir(path)

    def sync(self, paths: Iterable[str]) -> None:
        for path in paths:
            self._do("sync", path)

    @contextlib.contextmanager
    def lock(self, path: str) -> Any:
        self._do("lock", path)
        with super().lock(path):
            yield
